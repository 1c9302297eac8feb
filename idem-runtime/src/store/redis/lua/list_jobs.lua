-- list_jobs, one shard. KEYS[1] the shard's job list (scored by created_at).
-- ARGV[1] the shard's key prefix, ARGV[2] the most jobs, then the filter:
-- ARGV[3] tenant, ARGV[4] reference (8 bytes), ARGV[5] name, ARGV[6] dead
-- ('1' or '0'), each '' for "any" or '=' and the value. Returns the time, then
-- the fields of each matching job, the oldest first. A snapshot read; an
-- entry whose job is gone is dropped on the way.
local now = clock()
local out = {int(now)}
local limit, kept, from = tonumber(ARGV[2]), 0, 0
local want = {}
for i, field in ipairs({1, 2, 3, 9}) do
  local arg = ARGV[i + 2]
  if arg ~= '' then
    want[#want + 1] = {field, string.sub(arg, 2)}
  end
end
local CHUNK = 256
while kept < limit do
  local members = redis.call('ZRANGE', KEYS[1], from, from + CHUNK - 1)
  if #members == 0 then
    break
  end
  from = from + CHUNK
  for _, m in ipairs(members) do
    local f = redis.call('HMGET', ARGV[1] .. 'j:' .. m, unpack(JOB_FIELDS))
    if f[1] then
      local match = true
      for _, w in ipairs(want) do
        if f[w[1]] ~= w[2] then
          match = false
        end
      end
      if match and kept < limit then
        for i = 1, #JOB_FIELDS do
          out[#out + 1] = f[i]
        end
        kept = kept + 1
      end
    else
      redis.call('ZREM', KEYS[1], m)
      from = from - 1
    end
  end
end
return out
