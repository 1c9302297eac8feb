-- Shared by every script (after the constants the store writes above it).
--
-- Times are microseconds since the epoch on the server's clock (TIME): the
-- store is the clock, so processes with skewed clocks agree on leases and
-- expiry. They stay below 2^53, so Lua's doubles hold them exactly.
--
-- The record's hash fields: k key (32 bytes), f fingerprint (32 bytes),
-- t tenant, o tool, s state code, a attempt (decimal), c claimed_at,
-- u updated_at, l lease_until, e expires_at, r retain_until, n next_check_at,
-- x checks, b response or note, v resolution.
--
-- The scripts over one record take KEYS[1], the record under its reference,
-- KEYS[2], the record under its full key, KEYS[3] and KEYS[4], the shard's
-- lapsed and unknown sets, and KEYS[5], the reference's collision set, all on
-- one slot; ARGV[1] is the key, ARGV[2] and ARGV[3] the members that name
-- KEYS[1] and KEYS[2] in the sets.

local FIELDS = {'k', 'f', 't', 'o', 's', 'a', 'c', 'u', 'l', 'e', 'r', 'n', 'x', 'b', 'v'}

-- An integer as Redis should store it (never in exponent form).
local function int(x)
  return string.format('%d', x)
end

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The record, its set member and the fields k, a, s and `...`, if ARGV[4]
-- (the attempt) owns it; nil otherwise. The attempt is the fence: a worker
-- whose claim was taken over must not touch the new owner's record.
--
-- An operation's record lives under its reference, unless a record of another
-- operation held that reference when it was claimed (the reference is 64 bits
-- of the key): then under its full key. Never under both, so the second look
-- is needed only when the first finds another operation's record, or none.
local function owned(...)
  local rec, member = KEYS[1], ARGV[2]
  local f = redis.call('HMGET', rec, 'k', 'a', 's', ...)
  if f[1] ~= ARGV[1] then
    rec, member = KEYS[2], ARGV[3]
    f = redis.call('HMGET', rec, 'k', 'a', 's', ...)
    if f[1] ~= ARGV[1] then
      return nil
    end
  end
  if f[2] ~= ARGV[4] then
    return nil
  end
  return rec, member, f
end

-- Redis deletes the record when its life ends (Record::is_expired): a
-- COMPLETED one at expires_at, any other once its retention and its lease are
-- both over. Rounded up to the millisecond: never before its end.
local function expire_at(rec, state, expires, retain, lease)
  local ends = expires
  if state ~= COMPLETED then
    ends = math.max(retain, lease)
  end
  local at = int(math.ceil(ends / 1000))
  redis.call('PEXPIREAT', rec, at)
  if rec == KEYS[2] then
    -- The collision set that lookups find this record through lives as long
    -- as the longest-lived record in it.
    redis.call('PEXPIREAT', KEYS[5], at, 'NX')
    redis.call('PEXPIREAT', KEYS[5], at, 'GT')
  end
end

local function found(rec, now)
  return {FOUND, int(now), unpack(redis.call('HMGET', rec, unpack(FIELDS)))}
end

