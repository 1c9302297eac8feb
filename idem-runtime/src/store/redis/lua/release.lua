-- release. After the key: the attempt.
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
local state = r.s
if state ~= IN_PROGRESS and state ~= UNKNOWN then
  return {WRONG_STATE, state}
end
redis.call('DEL', rec)
redis.call('ZREM', state == IN_PROGRESS and lapsed() or unknown(), member)
return {OK}
