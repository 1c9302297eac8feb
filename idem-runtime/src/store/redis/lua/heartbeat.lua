-- heartbeat. After the key: the attempt. ARGV[2] the lease (µs).
local refused, rec, member, r, collided = owned_in(IN_PROGRESS)
if refused then
  return refused
end
local now = clock()
r.l, r.u = now + ARGV[2], now
save(rec, r, collided)
redis.call('ZADD', lapsed(), int(r.l), member)
return {OK}
