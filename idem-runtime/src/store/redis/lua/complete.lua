-- complete. After the key: the attempt. ARGV[2] the response; with follow-on
-- jobs, ARGV[3] the shard's key prefix and ARGV[4..] (name, payload) pairs,
-- written in this script with the completion (jobs.lua), or not at all.
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
local state = r.s
if state == COMPLETED then
  return {WRONG_STATE, state}
end
-- A completion that arrives after the sweep or a reconciler gave up on the
-- record leaves its window (expires_at) where the claim set it: after it the
-- key is free, and the record reads by its reference until its retention
-- ends (Record::holds_key).
local now = clock()
r.s, r.b, r.u = COMPLETED, ARGV[2], now
save(rec, r, collided)
if state == IN_PROGRESS then
  redis.call('ZREM', lapsed(), member)
elseif state == UNKNOWN then
  redis.call('ZREM', unknown(), member)
end
if ARGV[3] then
  write_jobs(ARGV[3], r, now, 4)
end
return {OK}
