-- list_records and count_records, one SCAN step over one shard. KEYS[1] the
-- shard's lapsed set, not read: it names the shard's slot, so a Cluster runs
-- the script on the node that holds the shard. ARGV[1] the shard's key
-- prefix, ARGV[2] the cursor, ARGV[3] the COUNT hint, ARGV[4] '1' to answer
-- each record's name and state only. Returns the time, the next cursor ('0'
-- when done), then for each record (`r:` and `k:` keys, and the superseded
-- operations' `o:` keys) either the record (packed, as prelude.lua says) or
-- its Redis key's name and its state. SCAN may name a record twice; the
-- caller drops the repeat by its name (a count) or by its key, reference and
-- attempt (a listing).
local now = clock()
local step = redis.call('SCAN', ARGV[2], 'MATCH', ARGV[1] .. '[rko]:*', 'COUNT', ARGV[3])
local out = {int(now), step[1]}
for _, rec in ipairs(step[2]) do
  local r = load(rec)
  if r then
    if ARGV[4] == '1' then
      out[#out + 1] = rec
      out[#out + 1] = r.s
    else
      out[#out + 1] = r.raw
    end
  end
end
return out
