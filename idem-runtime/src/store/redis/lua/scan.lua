-- list_records and count_records, one SCAN step over one shard. KEYS[1] the
-- shard's lapsed set, not read: it names the shard's slot, so a Cluster runs
-- the script on the node that holds the shard. ARGV[1] the shard's key
-- prefix, ARGV[2] the cursor, ARGV[3] the COUNT hint, ARGV[4] '1' to answer
-- each record's key and state only. Returns the time, the next cursor ('0'
-- when done), then for each record (`r:` and `k:` hashes) either its fields
-- or its key and state. SCAN may name a record twice; the caller drops the
-- repeat by its key.
local now = clock()
local step = redis.call('SCAN', ARGV[2], 'MATCH', ARGV[1] .. '[rk]:*', 'COUNT', ARGV[3])
local out = {int(now), step[1]}
for _, rec in ipairs(step[2]) do
  if ARGV[4] == '1' then
    local f = redis.call('HMGET', rec, 'k', 's')
    if f[1] then
      out[#out + 1] = f[1]
      out[#out + 1] = f[2]
    end
  else
    local f = redis.call('HMGET', rec, unpack(FIELDS))
    if f[1] then
      for i = 1, #FIELDS do
        out[#out + 1] = f[i]
      end
    end
  end
end
return out
