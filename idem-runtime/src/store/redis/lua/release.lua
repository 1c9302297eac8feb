-- release. ARGV[4] attempt.
local rec, member, f = owned()
if not rec then
  return {FENCED}
end
local state = f[3]
if state ~= IN_PROGRESS and state ~= UNKNOWN then
  return {WRONG_STATE, state}
end
redis.call('DEL', rec)
redis.call('ZREM', state == IN_PROGRESS and KEYS[3] or KEYS[4], member)
return {OK}
