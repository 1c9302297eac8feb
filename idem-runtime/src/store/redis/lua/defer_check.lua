-- defer_check. After the key: the attempt. ARGV[2] the delay (µs).
local refused, rec, member, r, collided = owned_in(UNKNOWN)
if refused then
  return refused
end
r.n = clock() + ARGV[2]
r.x = r.x + 1
save(rec, r, collided)
redis.call('ZADD', unknown(), int(r.n), member)
return {OK}
