-- defer_check and take_check. After the key: the attempt. ARGV[2] the delay
-- (µs), ARGV[3] '1' for the take, which changes only a check that is due
-- (so of the replicas that listed the record one asks the processor) and
-- does not count it.
local refused, rec, member, r, collided = owned_in(UNKNOWN)
if refused then
  return refused
end
local now = clock()
if ARGV[3] == '1' then
  if r.n > now then
    return {HELD_BACK}
  end
else
  r.x = r.x + 1
end
r.n = now + ARGV[2]
save(rec, r, collided)
redis.call('ZADD', unknown(), int(r.n), member)
return {OK}
