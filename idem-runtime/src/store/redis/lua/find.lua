-- find_by_reference. KEYS[1] the record under the reference's first 8
-- bytes, KEYS[2] their collision set, ARGV[1] the shard's key prefix,
-- ARGV[2] the reference's tag (8 bytes), ARGV[3] the whole reference (8 or
-- 16 bytes). Every record with this reference, whatever its tenant, as
-- lookup.lua finds one (the keys' current records, then the superseded
-- operation kept under the reference): no SCAN. Returns the time, then each
-- record, packed.
local out = {int(clock())}
local function add(r)
  if r and (r.g or NO_TAG) == ARGV[2] then
    out[#out + 1] = r.raw
  end
end
add(load(KEYS[1]))
for _, m in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  add(load(ARGV[1] .. m))
end
add(load(superseded(ARGV[1], ARGV[3])))
return out
