-- lease_jobs, one shard. KEYS[1] the shard's job list, not read: it names the
-- shard's slot. ARGV[1] the shard's key prefix, ARGV[2] the most jobs, ARGV[3]
-- the lease (µs), ARGV[4] the token, ARGV[5..] the names. Leases the longest
-- due live jobs of those names: each gets the token, one more attempt, and
-- next_run_at = now + lease, which is also its score in its name's due set,
-- so no other lease finds it until the lease runs out. One script: of two
-- dispatchers leasing at once, one runs first and the other finds the job
-- not due. Returns the time, then each leased job's fields.
local now = clock()
local base = ARGV[1]
local out = {int(now)}
local ends = int(now + tonumber(ARGV[3]))
for _, due in ipairs(due_jobs(base, 5, tonumber(ARGV[2]), now)) do
  local member, name = due[2], due[3]
  local job = base .. 'j:' .. member
  if redis.call('EXISTS', job) == 1 then
    redis.call('HINCRBY', job, 'a', 1)
    redis.call('HSET', job, 'k', ARGV[4], 'd', ends, 'u', int(now))
    redis.call('ZADD', base .. 'jd:' .. name, ends, member)
    push_job(out, job)
  else
    redis.call('ZREM', base .. 'jd:' .. name, member)
  end
end
return out
