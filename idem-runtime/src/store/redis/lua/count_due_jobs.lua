-- count_due_jobs, one shard. KEYS[1] the shard's job names; ARGV[1] the
-- shard's key prefix. Returns the time, then (name, count) for each name with
-- live jobs due now. A name whose due set is empty (its jobs finished or
-- buried) is dropped from the names; writing or re-driving one adds it back.
local now = clock()
local out = {int(now)}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local set = ARGV[1] .. 'jd:' .. name
  if redis.call('ZCARD', set) == 0 then
    redis.call('SREM', KEYS[1], name)
  else
    local n = redis.call('ZCOUNT', set, '-inf', int(now))
    if n > 0 then
      out[#out + 1] = name
      out[#out + 1] = n
    end
  end
end
return out
