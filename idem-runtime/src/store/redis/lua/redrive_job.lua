-- redrive_job. KEYS[1] the job, KEYS[2] its name's due set, KEYS[3] the
-- shard's job names; ARGV[1] the job's member, ARGV[2] its name. A dead job
-- becomes live, due now, unleased, its runs counted from 0 again and added to
-- its earlier runs (b), its last error kept as the error before the re-drive
-- (f). Returns 1, or 0 when no dead job has this id (a live one is left as it
-- is).
if redis.call('HGET', KEYS[1], 'z') ~= '1' then
  return 0
end
local now = int(clock())
local runs = tonumber(redis.call('HGET', KEYS[1], 'a') or '0') or 0
local earlier = tonumber(redis.call('HGET', KEYS[1], 'b') or '0') or 0
local error = redis.call('HGET', KEYS[1], 'e')
redis.call('HDEL', KEYS[1], 'k', 'e', 'f')
redis.call('HSET', KEYS[1], 'z', '0', 'a', '0', 'b', int(earlier + runs), 'd', now, 'u', now)
if error then
  redis.call('HSET', KEYS[1], 'f', error)
end
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
return 1
