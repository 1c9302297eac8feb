-- defer_check and take_check. After the key: the attempt. ARGV[2] the delay
-- (µs), ARGV[3] '1' for the take, which changes only a check that is due
-- (so of the replicas that listed the record one asks the processor), does
-- not count it, and replies the hold's end. For a deferral, ARGV[4] the
-- hold's end of the check it answers (µs), or '' for any: once the hold ran
-- out and another replica took the check, it is held back.
local refused, rec, member, r, collided = owned_in(UNKNOWN)
if refused then
  return refused
end
local now = clock()
local take = ARGV[3] == '1'
if take then
  if r.n > now then
    return {HELD_BACK}
  end
else
  if ARGV[4] ~= '' and r.n ~= tonumber(ARGV[4]) then
    return {HELD_BACK}
  end
  r.x = r.x + 1
end
r.n = now + ARGV[2]
save(rec, r, collided)
redis.call('ZADD', unknown(), int(r.n), member)
if take then
  return {TAKEN, int(r.n)}
end
return {OK}
