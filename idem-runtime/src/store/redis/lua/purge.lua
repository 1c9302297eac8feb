-- purge_expired, one shard. KEYS[1] the lapsed set, KEYS[2] the unknown set,
-- KEYS[3] the delivered jobs, KEYS[4] the shard's job list, ARGV[1] the
-- shard's key prefix, ARGV[2] the most entries to drop, ARGV[3] the most
-- entries to look at in each set, ARGV[4] the COUNT hint of the migration's
-- SCAN step. Redis deletes records itself at the end of their life (native
-- TTL), current and superseded alike; what is left is their entries in the
-- two sets, dropped here. Delivered jobs are kept until their record's
-- retention (kept_until, their score; Redis deletes them then too): their
-- entries, and the job if it is still there, go in the same pass, within the
-- same budget. Returns how many entries and jobs it dropped.
local now = clock()
local budget, dropped = tonumber(ARGV[2]), 0

-- The migration of a shard that an earlier version of the store wrote: it
-- gave a COMPLETED record the native expiry of its window (expires_at),
-- where one now lives until its retention ends (retain_until), to read by
-- its reference. One SCAN step per purge of the shard moves those expiries
-- (GT: never earlier), from the cursor kept in `P:{SS}:retained`, until the
-- shard is done ('done', kept for good: one GET per purge after that).
local mark = ARGV[1] .. 'retained'
local cursor = redis.call('GET', mark)
if cursor ~= 'done' then
  local step = redis.call('SCAN', cursor or '0', 'MATCH', ARGV[1] .. '[rk]:*', 'COUNT', ARGV[4])
  for _, rec in ipairs(step[2]) do
    local r = load(rec)
    if r and r.s == COMPLETED then
      redis.call('PEXPIREAT', rec, ends_at(r), 'GT')
    end
  end
  redis.call('SET', mark, step[1] == '0' and 'done' or step[1])
end
for i, state in ipairs({IN_PROGRESS, UNKNOWN}) do
  local members = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', int(now), 'LIMIT', 0, ARGV[3])
  for _, m in ipairs(members) do
    if dropped >= budget then
      break
    end
    local r = load(ARGV[1] .. m)
    if not r or r.s ~= state then
      redis.call('ZREM', KEYS[i], m)
      dropped = dropped + 1
    end
  end
end
if dropped >= budget then
  return dropped
end
local delivered = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int(now), 'LIMIT', 0,
  budget - dropped)
for _, m in ipairs(delivered) do
  redis.call('DEL', ARGV[1] .. 'j:' .. m)
  redis.call('ZREM', KEYS[3], m)
  redis.call('ZREM', KEYS[4], m)
end
return dropped + #delivered
