-- bury_job. KEYS[1] the job, KEYS[2] its name's due set; ARGV[1] the job's
-- member, ARGV[2] the token, ARGV[3] the error. Fenced by the token as
-- finish_job; the job goes to the dead letter: out of its due set (no lease
-- finds it), still in the shard's job list (listed).
if redis.call('HGET', KEYS[1], 'k') ~= ARGV[2] then
  return {FENCED}
end
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'z', '1', 'e', ARGV[3], 'u', int(clock()))
redis.call('ZREM', KEYS[2], ARGV[1])
return {OK}
