-- lookup. KEYS[1] the record under the reference's first 8 bytes, KEYS[2]
-- their collision set, ARGV[1] the tenant, ARGV[2] the shard's key prefix,
-- ARGV[3] the reference's tag (8 bytes). Another tenant's record is never
-- returned, nor a later operation of the same key (another tag).
local function is(r)
  return r and r.t == ARGV[1] and (r.g or NO_TAG) == ARGV[3]
end
local r = load(KEYS[1])
if not is(r) then
  r = nil
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    local other = load(ARGV[2] .. m)
    if is(other) then
      r = other
      break
    end
  end
  if not r then
    return {}
  end
end
return found(r, clock())
