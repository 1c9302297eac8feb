-- retry_job. KEYS[1] the job, KEYS[2] its name's due set; ARGV[1] the job's
-- member, ARGV[2] the token, ARGV[3] the delay (µs), ARGV[4] the error.
-- Fenced by the token as finish_job; gives the lease up and makes the job due
-- after the delay.
if redis.call('HGET', KEYS[1], 'k') ~= ARGV[2] then
  return {FENCED}
end
local now = clock()
local at = int(now + tonumber(ARGV[3]))
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'd', at, 'e', ARGV[4], 'u', int(now))
redis.call('ZADD', KEYS[2], at, ARGV[1])
return {OK}
