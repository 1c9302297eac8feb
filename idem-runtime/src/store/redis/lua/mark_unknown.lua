-- mark_unknown and mark_lapsed. After the key: the attempt. ARGV[2] the
-- note, ARGV[3] '1' for the sweep's mark, which re-checks the lease here, so
-- that a heartbeat that landed after the sweep listed the record keeps it
-- alive.
local refused, rec, member, r, collided = owned_in(IN_PROGRESS)
if refused then
  return refused
end
local now = clock()
if ARGV[3] == '1' and r.l > now then
  return {HELD_BACK}
end
r.s, r.b, r.u, r.n, r.x = UNKNOWN, ARGV[2], now, now, 0
save(rec, r, collided)
redis.call('ZREM', lapsed(), member)
redis.call('ZADD', unknown(), int(now), member)
return {OK}
