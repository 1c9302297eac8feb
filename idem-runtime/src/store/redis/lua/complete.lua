-- complete. ARGV[4] attempt, ARGV[5] response; with follow-on jobs, ARGV[6]
-- the shard's key prefix and ARGV[7..] (name, payload) pairs, written in this
-- script with the completion (jobs.lua), or not at all.
local rec, member, f = owned('e', 'r', 't')
if not rec then
  return {FENCED}
end
local state = f[3]
if state == COMPLETED then
  return {WRONG_STATE, state}
end
-- A completion that arrives after the sweep or a reconciler gave up on the
-- record answers repeats until its retention ends, not only its window: a
-- late truth must not expire the moment it is written.
local expires = tonumber(f[4])
if state ~= IN_PROGRESS then
  expires = math.max(expires, tonumber(f[5]))
end
local now = clock()
redis.call('HSET', rec, 's', COMPLETED, 'b', ARGV[5], 'u', int(now), 'e', int(expires))
if state == IN_PROGRESS then
  redis.call('ZREM', KEYS[3], member)
elseif state == UNKNOWN then
  redis.call('ZREM', KEYS[4], member)
end
expire_at(rec, COMPLETED, expires)
if ARGV[6] then
  write_jobs(ARGV[6], f[6], now, 7)
end
return {OK}
