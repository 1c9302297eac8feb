-- mark_unknown and mark_lapsed. ARGV[4] attempt, ARGV[5] note, ARGV[6] '1'
-- for the sweep's mark, which re-checks the lease here, so that a heartbeat
-- that landed after the sweep listed the record keeps it alive.
local rec, member, f = owned('l')
if not rec then
  return {FENCED}
end
if f[3] ~= IN_PROGRESS then
  return {WRONG_STATE, f[3]}
end
local now = clock()
if ARGV[6] == '1' and tonumber(f[4]) > now then
  return {LEASE_LIVE}
end
redis.call('HSET', rec, 's', UNKNOWN, 'b', ARGV[5], 'u', int(now), 'n', int(now), 'x', '0')
redis.call('ZREM', KEYS[3], member)
redis.call('ZADD', KEYS[4], int(now), member)
return {OK}
