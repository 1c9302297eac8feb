-- The first step of lease_jobs, one shard: which due jobs it has. KEYS[1] the
-- shard's job list, not read: it names the shard's slot. ARGV[1] the shard's
-- key prefix, ARGV[2] the most jobs, ARGV[3..] the names. Returns the time,
-- then the score (next_run_at, µs) of each due job, the longest due first.
-- Changes nothing.
local now = clock()
local out = {int(now)}
for _, job in ipairs(due_jobs(ARGV[1], 3, tonumber(ARGV[2]), now)) do
  out[#out + 1] = int(job[1])
end
return out
