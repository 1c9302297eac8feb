-- lookup. KEYS[1] the record under the reference's first 8 bytes, KEYS[2]
-- their collision set, ARGV[1] the tenant, ARGV[2] the shard's key prefix,
-- ARGV[3] the reference's tag (8 bytes), ARGV[4] the whole reference (8 or
-- 16 bytes). The key's current record first, then the superseded operation
-- kept under the reference (claim.lua). Another tenant's record is never
-- returned, nor another operation of the same key (another tag).
local function is(r)
  return r and r.t == ARGV[1] and (r.g or NO_TAG) == ARGV[3]
end
local r = by_reference(KEYS[1], KEYS[2], ARGV[2], ARGV[4], is)
if not r then
  return {}
end
return found(r, clock())
