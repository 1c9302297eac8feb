-- heartbeat. ARGV[4] attempt, ARGV[5] lease (µs).
local rec, member, f = owned('r')
if not rec then
  return {FENCED}
end
if f[3] ~= IN_PROGRESS then
  return {WRONG_STATE, f[3]}
end
local now = clock()
local lease = now + ARGV[5]
redis.call('HSET', rec, 'l', int(lease), 'u', int(now))
redis.call('ZADD', KEYS[3], int(lease), member)
expire_at(rec, IN_PROGRESS, 0, tonumber(f[4]), lease)
return {OK}
