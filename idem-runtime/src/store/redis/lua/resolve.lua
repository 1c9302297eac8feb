-- resolve. After the key: the attempt. ARGV[2] the new state (COMPLETED or
-- NOT_PERFORMED), ARGV[3] response or note, ARGV[4] settle (µs), ARGV[5] '1'
-- when ARGV[6] says who resolved it and why ('0': nobody said); for a
-- COMPLETED resolution with follow-on jobs, ARGV[7] the shard's key prefix
-- and ARGV[8..] (name, payload) pairs, written with the resolution
-- (jobs.lua).
local refused, rec, member, r, collided = owned_in(UNKNOWN)
if refused then
  return refused
end
local now = clock()
if ARGV[2] == NOT_PERFORMED then
  -- "Not performed" is trusted only for a record unchanged for the settle
  -- period: a request still in flight may not show at the processor yet.
  local settled = r.u + tonumber(ARGV[4])
  if now < settled then
    return {NOT_SETTLED, int(settled)}
  end
end
r.s, r.b, r.u = ARGV[2], ARGV[3], now
if ARGV[5] == '1' then
  r.v = ARGV[6]
else
  r.v = nil
end
-- The window (expires_at) stays where the claim set it, however late the
-- resolution: resolved after it, the key is free at once, and the record
-- reads by its reference until its retention ends (Record::holds_key).
save(rec, r, collided)
redis.call('ZREM', unknown(), member)
if ARGV[2] == COMPLETED and ARGV[7] then
  write_jobs(ARGV[7], r, now, 8)
end
return {OK}
