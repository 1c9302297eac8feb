-- defer_check. ARGV[4] attempt, ARGV[5] delay (µs).
local rec, member, f = owned()
if not rec then
  return {FENCED}
end
if f[3] ~= UNKNOWN then
  return {WRONG_STATE, f[3]}
end
local next_check = int(clock() + ARGV[5])
redis.call('HSET', rec, 'n', next_check)
redis.call('HINCRBY', rec, 'x', 1)
redis.call('ZADD', KEYS[4], next_check, member)
return {OK}
