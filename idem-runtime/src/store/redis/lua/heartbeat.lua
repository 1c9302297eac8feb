-- heartbeat. After the key: the attempt. ARGV[2] the lease (µs).
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
if r.s ~= IN_PROGRESS then
  return {WRONG_STATE, r.s}
end
local now = clock()
r.l, r.u = now + ARGV[2], now
save(rec, r, collided)
redis.call('ZADD', lapsed(), int(r.l), member)
return {OK}
