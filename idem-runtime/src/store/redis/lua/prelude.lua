-- Shared by every script (after library.lua), run once when the library
-- loads.
--
-- Times are microseconds since the epoch on the server's clock (TIME): the
-- store is the clock, so processes with skewed clocks agree on leases and
-- expiry. They stay below 2^53, so Lua's doubles hold them exactly.
--
-- A record is one string, packed with Redis's `struct` library in the layout
-- REC (little-endian, no padding): k key (32 bytes), f fingerprint (32
-- bytes), s state code (1 byte), then c claimed_at, u updated_at, l
-- lease_until, e expires_at, r retain_until, n next_check_at and x checks
-- (7 doubles), then a attempt (decimal), t tenant and o tool (each a 4-byte
-- length and the bytes), then b response or note and v resolution (each a
-- presence byte, a 4-byte length and the bytes), then g the operation's tag
-- (8 bytes, big-endian; absent from a record written before references had
-- tags, whose reference is the key's first 8 bytes alone). `scripts.rs` reads
-- the same layout. One string costs a script one GET and one SET, where a hash of 15
-- fields cost an HMGET, an HSET and a PEXPIREAT: each call from a script is
-- most of a script's time on the server.
--
-- A script over one record takes one KEY, the record under its reference
-- (`P:{SS}:r:REF`), and in ARGV[1] its arguments packed the same way (`over`
-- below): the key (32 bytes) and the key in hex, then the script's own. The
-- shard's other names come from those: the record under its full key
-- (`P:{SS}:k:KEY`), the shard's lapsed and unknown sets and the reference's
-- collision set, all on the KEY's slot. Each KEY and each ARGV costs a
-- script about as much as a call inside it does.

local REC = '<c32c32c1dddddddi4c0i4c0i4c0Bi4c0Bi4c0'

-- Set by `over`: the key, and the key in hex.
local KEY, KEYHEX

-- Reads the values of ARGV[1] of a script over one record, unpacked: the key
-- and the key in hex, which it keeps, then the script's own, which it
-- returns (and struct.unpack's position after them, which callers drop).
local function over(key, keyhex, ...)
  KEY, KEYHEX = key, keyhex
  return ...
end

-- The shard's names, from KEYS[1] (`P:{SS}:r:REF`), made when needed.
local function base()
  return string.sub(KEYS[1], 1, -19)
end

-- The record's member in the shard's sets, under its reference.
local function m1()
  return string.sub(KEYS[1], -18)
end

-- The record's member in the shard's sets, under its full key.
local function m2()
  return 'k:' .. KEYHEX
end

-- The reference's collision set.
local function collisions()
  return base() .. 'x:' .. string.sub(KEYS[1], -16)
end

-- An integer as Redis should store it (never in exponent form).
local function int(x)
  return string.format('%d', x)
end

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function packed(r)
  local b, v = r.b or '', r.v or ''
  return struct.pack(REC, r.k, r.f, r.s, r.c, r.u, r.l, r.e, r.r, r.n, r.x,
    #r.a, r.a, #r.t, r.t, #r.o, r.o, r.b and 1 or 0, #b, b, r.v and 1 or 0, #v, v) .. (r.g or '')
end

-- The tag of a record written before references had tags. A literal: while
-- a library loads, Redis 7.0 gives it no `string` library.
local NO_TAG = '\0\0\0\0\0\0\0\0'

-- The operation's reference as a job keeps it: the key's first 8 bytes and
-- the tag (none for a record written before tags).
local function reference_of(r)
  return string.sub(r.k, 1, 8) .. (r.g or '')
end

local function tohex(s)
  return (string.gsub(s, '.', function(c)
    return string.format('%02x', string.byte(c))
  end))
end

-- Where a superseded operation is kept (its key taken over by a later
-- operation while its retention had not ended: Record::outlives_takeover),
-- under `base`, the shard's key prefix: named by its whole reference in hex
-- (16 bytes; 8 for a record written before references had tags), so a
-- lookup by reference names it directly.
local function superseded(base, reference)
  return base .. 'o:' .. tohex(reference)
end

-- The record stored at `rec`, as a table of the fields above (and `raw`, the
-- string it was read from), or nil if there is none.
local function load(rec)
  local raw = redis.pcall('GET', rec)
  if type(raw) == 'string' then
    local k, f, s, c, u, l, e, rt, n, x, a, t, o, hb, b, hv, v, at = struct.unpack(REC, raw)
    local g = string.sub(raw, at, at + 7)
    -- One constructor: the table is made at its size, not grown field by field.
    return {raw = raw, k = k, f = f, s = s, c = c, u = u, l = l, e = e, r = rt, n = n, x = x,
      a = a, t = t, o = o, b = hb ~= 0 and b or nil, v = hv ~= 0 and v or nil,
      g = #g == 8 and g or nil}
  end
  if not raw then
    return nil
  end
  -- Not a string: a record an earlier version of the store wrote as a hash
  -- with these fields. It is read as such, and written back as a string by
  -- the next change, so an upgrade neither loses nor repeats an operation.
  local f = redis.call('HMGET', rec, 'k', 'f', 't', 'o', 's', 'a', 'c', 'u', 'l', 'e', 'r',
    'n', 'x', 'b', 'v')
  if not f[1] then
    return nil
  end
  local r = {k = f[1], f = f[2], t = f[3], o = f[4], s = f[5], a = f[6], b = f[14] or nil,
    v = f[15] or nil}
  r.c, r.u, r.l, r.e = tonumber(f[7]), tonumber(f[8]), tonumber(f[9]), tonumber(f[10])
  r.r, r.n, r.x = tonumber(f[11]), tonumber(f[12]), tonumber(f[13])
  r.raw = packed(r)
  return r
end

-- An operation's record, current or superseded, found by its reference:
-- the record at `first` (under the reference's first 8 bytes), else one of
-- the members of the collision set `others` (under `base`, the shard's key
-- prefix), else the superseded operation kept under `reference`; the first
-- that `is` accepts, or nil. lookup.lua and finish_job.lua find it so.
local function by_reference(first, others, base, reference, is)
  local r = load(first)
  if is(r) then
    return r
  end
  for _, m in ipairs(redis.call('SMEMBERS', others)) do
    r = load(base .. m)
    if is(r) then
      return r
    end
  end
  r = load(superseded(base, reference))
  if is(r) then
    return r
  end
  return nil
end

-- When Redis deletes the record `r`, in ms (PXAT), rounded up: never before
-- the end of its life (Record::is_expired). A settled one (COMPLETED or
-- NOT_PERFORMED) at retain_until, whatever its window (expires_at, which
-- only ends the key's hold); any other once its retention and its lease are
-- both over.
local function ends_at(r)
  local ends = r.r
  if r.s ~= COMPLETED and r.s ~= NOT_PERFORMED then
    ends = math.max(r.r, r.l)
  end
  return int(math.ceil(ends / 1000))
end

-- Writes `r` at `rec`, with its native expiry (ends_at).
local function save(rec, r, collided)
  local at = ends_at(r)
  redis.call('SET', rec, packed(r), 'PXAT', at)
  if collided then
    -- The collision set that lookups find this record through lives as long
    -- as the longest-lived record in it.
    redis.call('PEXPIREAT', collisions(), at, 'NX')
    redis.call('PEXPIREAT', collisions(), at, 'GT')
  end
end

-- For a fenced change, whose ARGV[1] packs the key, the key in hex and the
-- attempt: the record, its set member, its fields and whether it lives under
-- its full key, if the attempt owns it; nil otherwise. The attempt is the
-- fence: a worker whose claim was taken over must not touch the new owner's
-- record.
--
-- An operation's record lives under its reference, unless a record of another
-- operation held that reference when it was claimed (the reference is 64 bits
-- of the key): then under its full key. Never under both, so the second look
-- is needed only when the first finds another operation's record, or none.
local function owned()
  local attempt = over(struct.unpack('<c32c64i4c0', ARGV[1]))
  local rec, member, collided = KEYS[1], nil, false
  local r = load(rec)
  if not r or r.k ~= KEY then
    member, collided = m2(), true
    rec = base() .. member
    r = load(rec)
    if not r or r.k ~= KEY then
      return nil
    end
  end
  if r.a ~= attempt then
    return nil
  end
  return rec, member or m1(), r, collided
end

-- `owned`, for a change made only from `state`: first the refusal to return
-- (FENCED, or WRONG_STATE and the state found: `store/fence.rs`'s rule), nil
-- when the change may go on, then what `owned` found.
local function owned_in(state)
  local rec, member, r, collided = owned()
  if not rec then
    return {FENCED}
  end
  if r.s ~= state then
    return {WRONG_STATE, r.s}
  end
  return nil, rec, member, r, collided
end

-- The shard's lapsed and unknown sets.
local function lapsed()
  return base() .. 'lapsed'
end

local function unknown()
  return base() .. 'unknown'
end

local function found(r, now)
  return {FOUND, int(now), r.raw}
end
