-- Shared by the scripts that write or read follow-on jobs (after prelude.lua),
-- run once when the library loads.
--
-- A job lives on the slot of the record it follows (the shard's hash tag), so
-- the completion and its jobs are one script even on a Cluster. With `B` the
-- shard's key prefix `P:{SS}:` and the job's member `REF:TENANT:NAME` (the
-- reference and the tenant in hex, then the name):
--   B .. 'j:' .. member   hash: the job
--   B .. 'jd:' .. name    sorted set: the live jobs of one name, scored by
--                         next_run_at (µs), which for a leased job is the end
--                         of its lease (so "due" and "lease free" are one
--                         comparison); dead jobs are in no such set
--   B .. 'jobs'           sorted set: every job of the shard, live or dead,
--                         scored by created_at, for listings
--   B .. 'jobnames'       set: the names with live jobs in the shard, for
--                         counting due jobs by name
--   B .. 'delivered'      sorted set: the shard's delivered jobs, scored by
--                         kept_until (µs), for the purge
-- The job's hash fields: t tenant, r reference (16 bytes: the operation's;
-- 8 for a job written before references had tags), n name, p payload,
-- a runs, k token (decimal; absent when no lease holds it), d
-- next_run_at, e last_error, z '1' when dead, c created_at, u updated_at,
-- v delivered_at and w kept_until (both absent until a run finishes it), b
-- the runs before the last re-drive and f the last error then (both absent
-- until a re-drive).
-- A job has no TTL until it is delivered, however long that takes; a
-- delivered job lives as long as its record (PEXPIREAT kept_until, the
-- record's retain_until), and the purge drops its set entries.

local JOB_FIELDS = {'t', 'r', 'n', 'p', 'a', 'k', 'd', 'e', 'z', 'c', 'u', 'v', 'w', 'b', 'f'}

-- Writes the jobs given as (name, payload) pairs from ARGV[from] on, for the
-- record `r` (its tenant and its operation's reference), due at `now`, under
-- `base`. A job's identity is its operation's reference and its name: one
-- completion per operation writes jobs, and a job already there is never
-- replaced, live or dead.
local function write_jobs(base, r, now, from)
  local tenant, reference = r.t, reference_of(r)
  local id_prefix = tohex(reference) .. ':' .. tohex(tenant) .. ':'
  for i = from, #ARGV, 2 do
    local name, payload = ARGV[i], ARGV[i + 1]
    local member = id_prefix .. name
    local job = base .. 'j:' .. member
    if redis.call('EXISTS', job) == 0 then
      redis.call('HSET', job, 't', tenant, 'r', reference, 'n', name, 'p', payload,
        'a', '0', 'd', int(now), 'z', '0', 'c', int(now), 'u', int(now))
      redis.call('ZADD', base .. 'jd:' .. name, int(now), member)
      redis.call('ZADD', base .. 'jobs', int(now), member)
      redis.call('SADD', base .. 'jobnames', name)
    end
  end
end

-- The live jobs due at `now` of the names ARGV[first..], the longest due
-- first (then by member), at most `count`: {score, member, name} each.
local function due_jobs(base, first, count, now)
  local found = {}
  for i = first, #ARGV do
    local name = ARGV[i]
    local m = redis.call('ZRANGEBYSCORE', base .. 'jd:' .. name, '-inf', int(now),
      'WITHSCORES', 'LIMIT', 0, count)
    for j = 1, #m, 2 do
      found[#found + 1] = {tonumber(m[j + 1]), m[j], name}
    end
  end
  table.sort(found, function(a, b)
    if a[1] ~= b[1] then
      return a[1] < b[1]
    end
    return a[2] < b[2]
  end)
  while #found > count do
    found[#found] = nil
  end
  return found
end

-- The job's fields (JOB_FIELDS order) appended to `out`.
local function push_job(out, job)
  local f = redis.call('HMGET', job, unpack(JOB_FIELDS))
  for i = 1, #JOB_FIELDS do
    out[#out + 1] = f[i]
  end
end
