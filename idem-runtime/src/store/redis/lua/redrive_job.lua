-- redrive_job. KEYS[1] the job, KEYS[2] its name's due set, KEYS[3] the
-- shard's job names; ARGV[1] the job's member, ARGV[2] its name. A dead job
-- becomes live, due now, with no attempts (its last error kept). Returns 1,
-- or 0 when no dead job has this id (a live one is left as it is).
if redis.call('HGET', KEYS[1], 'z') ~= '1' then
  return 0
end
local now = int(clock())
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'z', '0', 'a', '0', 'd', now, 'u', now)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
return 1
