-- list_jobs, one shard. KEYS[1] the shard's job list (scored by created_at).
-- ARGV[1] the shard's key prefix, ARGV[2] the most jobs, then the filter:
-- ARGV[3] tenant, ARGV[4] reference (8 or 16 bytes), ARGV[5] name, each ''
-- for "any" or '=' and the value, ARGV[6] the states ('' for any, or a mask:
-- waiting 1, running 2, dead 4, delivered 8). Returns the time, then
-- the fields of each matching job, the oldest first. A snapshot read; an
-- entry whose job is gone is dropped on the way.
local now = clock()
local out = {int(now)}
local limit, kept, from = tonumber(ARGV[2]), 0, 0
local want = {}
for i, field in ipairs({1, 2, 3}) do
  local arg = ARGV[i + 2]
  if arg ~= '' then
    want[#want + 1] = {field, string.sub(arg, 2)}
  end
end
local states = tonumber(ARGV[6])
-- A job's state bit, from its fields (JOB_FIELDS order).
local function state_bit(f)
  if f[12] then
    return 8
  elseif f[9] == '1' then
    return 4
  elseif f[6] then
    return 2
  end
  return 1
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
      local match = not states or math.floor(states / state_bit(f)) % 2 == 1
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
