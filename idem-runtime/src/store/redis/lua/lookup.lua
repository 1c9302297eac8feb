-- lookup. KEYS[1] the record under the reference, KEYS[2] the reference's
-- collision set, ARGV[1] the tenant, ARGV[2] the shard's key prefix. Another
-- tenant's record is never returned.
local r = load(KEYS[1])
if not r or r.t ~= ARGV[1] then
  r = nil
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    local other = load(ARGV[2] .. m)
    if other and other.t == ARGV[1] then
      r = other
      break
    end
  end
  if not r then
    return {}
  end
end
return found(r, clock())
