-- complete. ARGV[4] attempt, ARGV[5] response.
local rec, member, f = owned('e')
if not rec then
  return {FENCED}
end
local state = f[3]
if state == COMPLETED then
  return {WRONG_STATE, state}
end
redis.call('HSET', rec, 's', COMPLETED, 'b', ARGV[5], 'u', int(clock()))
if state == IN_PROGRESS then
  redis.call('ZREM', KEYS[3], member)
elseif state == UNKNOWN then
  redis.call('ZREM', KEYS[4], member)
end
expire_at(rec, COMPLETED, tonumber(f[4]))
return {OK}
