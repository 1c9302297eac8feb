-- defer_check. After the key: the attempt. ARGV[2] the delay (µs).
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
if r.s ~= UNKNOWN then
  return {WRONG_STATE, r.s}
end
r.n = clock() + ARGV[2]
r.x = r.x + 1
save(rec, r, collided)
redis.call('ZADD', unknown(), int(r.n), member)
return {OK}
