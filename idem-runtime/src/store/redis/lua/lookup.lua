-- lookup. KEYS[1] the record under the reference, KEYS[2] the reference's
-- collision set, ARGV[1] the tenant, ARGV[2] the shard's key prefix. Another
-- tenant's record is never returned.
local rec = KEYS[1]
if redis.call('HGET', rec, 't') ~= ARGV[1] then
  rec = nil
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    if redis.call('HGET', ARGV[2] .. m, 't') == ARGV[1] then
      rec = ARGV[2] .. m
      break
    end
  end
  if not rec then
    return {}
  end
end
return found(rec, clock())
