-- list_lapsed and list_unknown, one shard. KEYS[1] the shard's set (scored by
-- lease_until or next_check_at), ARGV[1] the shard's key prefix, ARGV[2] the
-- limit, ARGV[3] the state its records are in. Returns the time, then each
-- due record (packed, as prelude.lua says). An entry whose record is gone
-- (Redis deleted it at the end of its life) or moved on is dropped on the
-- way.
local now = clock()
local out = {int(now)}
local limit, kept = tonumber(ARGV[2]), 0
while kept < limit do
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', kept, limit - kept)
  if #members == 0 then
    break
  end
  for _, m in ipairs(members) do
    local r = load(ARGV[1] .. m)
    if r and r.s == ARGV[3] then
      out[#out + 1] = r.raw
      kept = kept + 1
    else
      redis.call('ZREM', KEYS[1], m)
    end
  end
end
return out
