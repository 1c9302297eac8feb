-- claim. ARGV[4] fingerprint, ARGV[5] tenant, ARGV[6] tool, ARGV[7] attempt,
-- ARGV[8] lease, ARGV[9] window, ARGV[10] retention (µs, at least the window).
local now = clock()
local rec, member = KEYS[1], ARGV[2]
local f = redis.call('HMGET', rec, 'k', 's', 'a', 'l', 'e', 'r')
if not f[1] and redis.call('EXISTS', KEYS[2]) == 1 then
  -- Its record outlived the other operation's that held its reference.
  rec, member = KEYS[2], ARGV[3]
  f = redis.call('HMGET', rec, 'k', 's', 'a', 'l', 'e', 'r')
elseif f[1] and f[1] ~= ARGV[1] then
  -- Another operation holds this reference: this one lives under its full
  -- key, and lookups find it through the reference's collision set.
  rec, member = KEYS[2], ARGV[3]
  f = redis.call('HMGET', rec, 'k', 's', 'a', 'l', 'e', 'r')
  redis.call('SADD', KEYS[5], member)
end
local state = f[2]
if state then
  local live
  if state == NOT_PERFORMED then
    live = false
  elseif state == COMPLETED then
    live = tonumber(f[5]) > now
  else
    live = tonumber(f[6]) > now or tonumber(f[4]) > now
  end
  if live then
    -- This very claim, sent again after its answer was lost: it owns the record.
    if state == IN_PROGRESS and f[3] == ARGV[7] then
      return {CLAIMED}
    end
    return found(rec, now)
  end
  -- Past its life (Redis has not deleted it yet), or resolved as not
  -- performed: the claim replaces it whole.
  redis.call('DEL', rec)
  redis.call('ZREM', KEYS[4], member)
end
local lease, expires, retain = now + ARGV[8], now + ARGV[9], now + ARGV[10]
redis.call('HSET', rec, 'k', ARGV[1], 'f', ARGV[4], 't', ARGV[5], 'o', ARGV[6],
  's', IN_PROGRESS, 'a', ARGV[7], 'c', int(now), 'u', int(now), 'l', int(lease),
  'e', int(expires), 'r', int(retain), 'n', int(now), 'x', '0')
expire_at(rec, IN_PROGRESS, expires, retain, lease)
redis.call('ZADD', KEYS[3], int(lease), member)
return {CLAIMED}
