-- purge_expired, one shard. KEYS[1] the lapsed set, KEYS[2] the unknown set,
-- ARGV[1] the shard's key prefix, ARGV[2] the most entries to drop, ARGV[3]
-- the most entries to look at in each set. Redis deletes records itself at the
-- end of their life (native TTL); what is left is their entries in the two
-- sets, dropped here. Returns how many.
local now = clock()
local budget, dropped = tonumber(ARGV[2]), 0
for i, state in ipairs({IN_PROGRESS, UNKNOWN}) do
  local members = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', int(now), 'LIMIT', 0, ARGV[3])
  for _, m in ipairs(members) do
    if dropped >= budget then
      return dropped
    end
    local r = load(ARGV[1] .. m)
    if not r or r.s ~= state then
      redis.call('ZREM', KEYS[i], m)
      dropped = dropped + 1
    end
  end
end
return dropped
