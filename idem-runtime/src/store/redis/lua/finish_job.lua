-- finish_job. KEYS[1] the job, KEYS[2] its name's due set, KEYS[3] the
-- shard's job list; ARGV[1] the job's member, ARGV[2] the token. Delivers the
-- job only if the token holds its lease (or held the last one and nobody
-- leased it since): a dispatcher whose lease ran out and was taken over must
-- not finish the new holder's run. A delivered job gives its lease up, leaves
-- its due set (no lease finds it again) and is kept as long as its
-- operation's record, current or superseded (found as lookup.lua finds it):
-- until the record's retain_until, or until the next purge when the record
-- is gone.
if redis.call('HGET', KEYS[1], 'k') ~= ARGV[2] then
  return {FENCED}
end
local now = clock()
local base = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1] - 2)
local f = redis.call('HMGET', KEYS[1], 't', 'r')
local tenant, reference = f[1], f[2]
local function is(r)
  return r and r.t == tenant and reference_of(r) == reference
end
local prefix = tohex(string.sub(reference, 1, 8))
local r = by_reference(base .. 'r:' .. prefix, base .. 'x:' .. prefix, base, reference, is)
local kept = now
if r then
  kept = math.max(r.r, now)
end
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'v', int(now), 'w', int(kept), 'u', int(now))
redis.call('PEXPIREAT', KEYS[1], int(math.ceil(kept / 1000)))
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', base .. 'delivered', int(kept), ARGV[1])
return {OK}
