#!lua name=idem_3361f961c720d8d3
local LIBRARY = 'idem_3361f961c720d8d3'
local IN_PROGRESS = '0'
local COMPLETED = '1'
local UNKNOWN = '2'
local NOT_PERFORMED = '3'
local OK, FENCED, WRONG_STATE, NOT_SETTLED, LEASE_LIVE, CLAIMED, FOUND = 0, 1, 2, 3, 4, 5, 6
-- The library's frame (after the constants the store writes above it, and
-- before prelude.lua, jobs.lua and the scripts).
--
-- The store's scripts are one Redis Functions library: the server runs this
-- code once, when the library loads (`FUNCTION LOAD`), and keeps the
-- functions it registers; a call (`FCALL`) runs one function only. Each
-- script is the body of one function, registered as LIBRARY .. '_' .. its
-- name (function names are global on a server: the library's versioned name
-- keeps two versions of the store apart).

-- The calling function's keys and arguments: the scripts and the shared code
-- read them as they read KEYS and ARGV under EVAL. Set on every call, before
-- anything else runs (a server runs one function at a time).
local KEYS, ARGV

local function register(name, flags, body)
  redis.register_function{
    function_name = LIBRARY .. '_' .. name,
    callback = function(keys, args)
      KEYS, ARGV = keys, args
      return body()
    end,
    flags = flags,
  }
end
-- Shared by every script (after library.lua), run once when the library
-- loads.
--
-- Times are microseconds since the epoch on the server's clock (TIME): the
-- store is the clock, so processes with skewed clocks agree on leases and
-- expiry. They stay below 2^53, so Lua's doubles hold them exactly.
--
-- A record is one string, packed with Redis's `struct` library in the layout
-- REC (little-endian, no padding): k key (32 bytes), f fingerprint (32
-- bytes), s state code (1 byte), then c claimed_at, u updated_at, l
-- lease_until, e expires_at, r retain_until, n next_check_at and x checks
-- (7 doubles), then a attempt (decimal), t tenant and o tool (each a 4-byte
-- length and the bytes), then b response or note and v resolution (each a
-- presence byte, a 4-byte length and the bytes), then g the operation's tag
-- (8 bytes, big-endian; absent from a record written before references had
-- tags, whose reference is the key's first 8 bytes alone). `scripts.rs` reads
-- the same layout. One string costs a script one GET and one SET, where a hash of 15
-- fields cost an HMGET, an HSET and a PEXPIREAT: each call from a script is
-- most of a script's time on the server.
--
-- A script over one record takes one KEY, the record under its reference
-- (`P:{SS}:r:REF`), and in ARGV[1] its arguments packed the same way (`over`
-- below): the key (32 bytes) and the key in hex, then the script's own. The
-- shard's other names come from those: the record under its full key
-- (`P:{SS}:k:KEY`), the shard's lapsed and unknown sets and the reference's
-- collision set, all on the KEY's slot. Each KEY and each ARGV costs a
-- script about as much as a call inside it does.

local REC = '<c32c32c1dddddddi4c0i4c0i4c0Bi4c0Bi4c0'

-- Set by `over`: the key, and the key in hex.
local KEY, KEYHEX

-- Reads the values of ARGV[1] of a script over one record, unpacked: the key
-- and the key in hex, which it keeps, then the script's own, which it
-- returns (and struct.unpack's position after them, which callers drop).
local function over(key, keyhex, ...)
  KEY, KEYHEX = key, keyhex
  return ...
end

-- The shard's names, from KEYS[1] (`P:{SS}:r:REF`), made when needed.
local function base()
  return string.sub(KEYS[1], 1, -19)
end

-- The record's member in the shard's sets, under its reference.
local function m1()
  return string.sub(KEYS[1], -18)
end

-- The record's member in the shard's sets, under its full key.
local function m2()
  return 'k:' .. KEYHEX
end

-- The reference's collision set.
local function collisions()
  return base() .. 'x:' .. string.sub(KEYS[1], -16)
end

-- An integer as Redis should store it (never in exponent form).
local function int(x)
  return string.format('%d', x)
end

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function packed(r)
  local b, v = r.b or '', r.v or ''
  return struct.pack(REC, r.k, r.f, r.s, r.c, r.u, r.l, r.e, r.r, r.n, r.x,
    #r.a, r.a, #r.t, r.t, #r.o, r.o, r.b and 1 or 0, #b, b, r.v and 1 or 0, #v, v) .. (r.g or '')
end

-- The tag of a record written before references had tags. A literal: while
-- a library loads, Redis 7.0 gives it no `string` library.
local NO_TAG = '\0\0\0\0\0\0\0\0'

-- The operation's reference as a job keeps it: the key's first 8 bytes and
-- the tag (none for a record written before tags).
local function reference_of(r)
  return string.sub(r.k, 1, 8) .. (r.g or '')
end

-- The record stored at `rec`, as a table of the fields above (and `raw`, the
-- string it was read from), or nil if there is none.
local function load(rec)
  local raw = redis.pcall('GET', rec)
  if type(raw) == 'string' then
    local k, f, s, c, u, l, e, rt, n, x, a, t, o, hb, b, hv, v, at = struct.unpack(REC, raw)
    local g = string.sub(raw, at, at + 7)
    -- One constructor: the table is made at its size, not grown field by field.
    return {raw = raw, k = k, f = f, s = s, c = c, u = u, l = l, e = e, r = rt, n = n, x = x,
      a = a, t = t, o = o, b = hb ~= 0 and b or nil, v = hv ~= 0 and v or nil,
      g = #g == 8 and g or nil}
  end
  if not raw then
    return nil
  end
  -- Not a string: a record an earlier version of the store wrote as a hash
  -- with these fields. It is read as such, and written back as a string by
  -- the next change, so an upgrade neither loses nor repeats an operation.
  local f = redis.call('HMGET', rec, 'k', 'f', 't', 'o', 's', 'a', 'c', 'u', 'l', 'e', 'r',
    'n', 'x', 'b', 'v')
  if not f[1] then
    return nil
  end
  local r = {k = f[1], f = f[2], t = f[3], o = f[4], s = f[5], a = f[6], b = f[14] or nil,
    v = f[15] or nil}
  r.c, r.u, r.l, r.e = tonumber(f[7]), tonumber(f[8]), tonumber(f[9]), tonumber(f[10])
  r.r, r.n, r.x = tonumber(f[11]), tonumber(f[12]), tonumber(f[13])
  r.raw = packed(r)
  return r
end

-- Writes `r` at `rec`. Redis deletes the record when its life ends
-- (Record::is_expired): a COMPLETED one at expires_at, any other once its
-- retention and its lease are both over. Rounded up to the millisecond:
-- never before its end.
local function save(rec, r, collided)
  local ends = r.e
  if r.s ~= COMPLETED then
    ends = math.max(r.r, r.l)
  end
  local at = int(math.ceil(ends / 1000))
  redis.call('SET', rec, packed(r), 'PXAT', at)
  if collided then
    -- The collision set that lookups find this record through lives as long
    -- as the longest-lived record in it.
    redis.call('PEXPIREAT', collisions(), at, 'NX')
    redis.call('PEXPIREAT', collisions(), at, 'GT')
  end
end

-- For a fenced change, whose ARGV[1] packs the key, the key in hex and the
-- attempt: the record, its set member, its fields and whether it lives under
-- its full key, if the attempt owns it; nil otherwise. The attempt is the
-- fence: a worker whose claim was taken over must not touch the new owner's
-- record.
--
-- An operation's record lives under its reference, unless a record of another
-- operation held that reference when it was claimed (the reference is 64 bits
-- of the key): then under its full key. Never under both, so the second look
-- is needed only when the first finds another operation's record, or none.
local function owned()
  local attempt = over(struct.unpack('<c32c64i4c0', ARGV[1]))
  local rec, member, collided = KEYS[1], nil, false
  local r = load(rec)
  if not r or r.k ~= KEY then
    member, collided = m2(), true
    rec = base() .. member
    r = load(rec)
    if not r or r.k ~= KEY then
      return nil
    end
  end
  if r.a ~= attempt then
    return nil
  end
  return rec, member or m1(), r, collided
end

-- The shard's lapsed and unknown sets.
local function lapsed()
  return base() .. 'lapsed'
end

local function unknown()
  return base() .. 'unknown'
end

local function found(r, now)
  return {FOUND, int(now), r.raw}
end
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
-- a attempts, k token (decimal; absent when no lease holds it), d
-- next_run_at, e last_error, z '1' when dead, c created_at, u updated_at,
-- v delivered_at and w kept_until (both absent until a run finishes it).
-- A job has no TTL until it is delivered, however long that takes; a
-- delivered job lives as long as its record (PEXPIREAT kept_until, the
-- record's expiry), and the purge drops its set entries.

local JOB_FIELDS = {'t', 'r', 'n', 'p', 'a', 'k', 'd', 'e', 'z', 'c', 'u', 'v', 'w'}

local function tohex(s)
  return (string.gsub(s, '.', function(c)
    return string.format('%02x', string.byte(c))
  end))
end

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
register('claim', {}, function()
-- claim. After the key: the fingerprint, the tenant, the tool, the attempt,
-- the lease, the window and the retention (µs, at least the window), and the
-- tag of the reference a new operation gets (8 bytes). Answers CLAIMED and
-- the tag the operation runs under, or the record found.
local fingerprint, tenant, tool, attempt, lease, window, retention, tag =
  over(struct.unpack('<c32c64c32i4c0i4c0i4c0dddc8', ARGV[1]))
local now = clock()
local rec, member, r, collided = KEYS[1], nil, nil, false
local member2 = m2()
local rec2 = base() .. member2
-- One EXISTS for both names: a first call (the usual claim) finds neither
-- and goes straight to the write.
if redis.call('EXISTS', KEYS[1], rec2) > 0 then
  r = load(rec)
  if not r then
    -- Its record outlived the other operation's that held its reference.
    rec, member, collided = rec2, member2, true
    r = load(rec)
  elseif r.k ~= KEY then
    -- Another operation holds this reference: this one lives under its full
    -- key, and lookups find it through the reference's collision set.
    rec, member, collided = rec2, member2, true
    r = load(rec)
    redis.call('SADD', collisions(), member)
  end
end
member = member or m1()
if r then
  local state, live = r.s, nil
  if state == NOT_PERFORMED then
    live = false
  elseif state == COMPLETED then
    live = r.e > now
  else
    live = r.r > now or r.l > now
  end
  if live then
    -- This very claim, sent again after its answer was lost: it owns the record.
    if state == IN_PROGRESS and r.a == attempt then
      return {CLAIMED, r.g or NO_TAG}
    end
    return found(r, now)
  end
  -- Record::takeover_reference: a NOT_PERFORMED record within its window is
  -- the same operation, tried again, and keeps its reference.
  if state == NOT_PERFORMED and r.e > now then
    tag = r.g or NO_TAG
  end
  -- Past its life (Redis has not deleted it yet), or resolved as not
  -- performed: the claim replaces it whole (the SET below).
  redis.call('ZREM', unknown(), member)
end
local lease_until = now + lease
save(rec, {k = KEY, f = fingerprint, t = tenant, o = tool, s = IN_PROGRESS, a = attempt,
  c = now, u = now, l = lease_until, e = now + window, r = now + retention, n = now, x = 0,
  g = tag ~= NO_TAG and tag or nil}, collided)
redis.call('ZADD', lapsed(), int(lease_until), member)
return {CLAIMED, tag}
end)
register('complete', {}, function()
-- complete. After the key: the attempt. ARGV[2] the response; with follow-on
-- jobs, ARGV[3] the shard's key prefix and ARGV[4..] (name, payload) pairs,
-- written in this script with the completion (jobs.lua), or not at all.
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
local state = r.s
if state == COMPLETED then
  return {WRONG_STATE, state}
end
-- A completion that arrives after the sweep or a reconciler gave up on the
-- record answers repeats until its retention ends, not only its window: a
-- late truth must not expire the moment it is written.
if state ~= IN_PROGRESS then
  r.e = math.max(r.e, r.r)
end
local now = clock()
r.s, r.b, r.u = COMPLETED, ARGV[2], now
save(rec, r, collided)
if state == IN_PROGRESS then
  redis.call('ZREM', lapsed(), member)
elseif state == UNKNOWN then
  redis.call('ZREM', unknown(), member)
end
if ARGV[3] then
  write_jobs(ARGV[3], r, now, 4)
end
return {OK}
end)
register('release', {}, function()
-- release. After the key: the attempt.
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
local state = r.s
if state ~= IN_PROGRESS and state ~= UNKNOWN then
  return {WRONG_STATE, state}
end
redis.call('DEL', rec)
redis.call('ZREM', state == IN_PROGRESS and lapsed() or unknown(), member)
return {OK}
end)
register('mark_unknown', {}, function()
-- mark_unknown and mark_lapsed. After the key: the attempt. ARGV[2] the
-- note, ARGV[3] '1' for the sweep's mark, which re-checks the lease here, so
-- that a heartbeat that landed after the sweep listed the record keeps it
-- alive.
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
if r.s ~= IN_PROGRESS then
  return {WRONG_STATE, r.s}
end
local now = clock()
if ARGV[3] == '1' and r.l > now then
  return {LEASE_LIVE}
end
r.s, r.b, r.u, r.n, r.x = UNKNOWN, ARGV[2], now, now, 0
save(rec, r, collided)
redis.call('ZREM', lapsed(), member)
redis.call('ZADD', unknown(), int(now), member)
return {OK}
end)
register('resolve', {}, function()
-- resolve. After the key: the attempt. ARGV[2] the new state (COMPLETED or
-- NOT_PERFORMED), ARGV[3] response or note, ARGV[4] settle (µs), ARGV[5] '1'
-- when ARGV[6] says who resolved it and why ('0': nobody said); for a
-- COMPLETED resolution with follow-on jobs, ARGV[7] the shard's key prefix
-- and ARGV[8..] (name, payload) pairs, written with the resolution
-- (jobs.lua).
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
if r.s ~= UNKNOWN then
  return {WRONG_STATE, r.s}
end
local now = clock()
if ARGV[2] == NOT_PERFORMED then
  -- "Not performed" is trusted only for a record unchanged for the settle
  -- period: a request still in flight may not show at the processor yet.
  local settled = r.u + tonumber(ARGV[4])
  if now < settled then
    return {NOT_SETTLED, int(settled)}
  end
end
r.s, r.b, r.u = ARGV[2], ARGV[3], now
if ARGV[5] == '1' then
  r.v = ARGV[6]
else
  r.v = nil
end
if ARGV[2] == COMPLETED then
  -- Resolved after its window, it still answers repeats until its retention
  -- ends: it must not expire the moment it is written.
  r.e = math.max(r.e, r.r)
end
save(rec, r, collided)
redis.call('ZREM', unknown(), member)
if ARGV[2] == COMPLETED and ARGV[7] then
  write_jobs(ARGV[7], r, now, 8)
end
return {OK}
end)
register('defer_check', {}, function()
-- defer_check. After the key: the attempt. ARGV[2] the delay (µs).
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
if r.s ~= UNKNOWN then
  return {WRONG_STATE, r.s}
end
r.n = clock() + ARGV[2]
r.x = r.x + 1
save(rec, r, collided)
redis.call('ZADD', unknown(), int(r.n), member)
return {OK}
end)
register('heartbeat', {}, function()
-- heartbeat. After the key: the attempt. ARGV[2] the lease (µs).
local rec, member, r, collided = owned()
if not rec then
  return {FENCED}
end
if r.s ~= IN_PROGRESS then
  return {WRONG_STATE, r.s}
end
local now = clock()
r.l, r.u = now + ARGV[2], now
save(rec, r, collided)
redis.call('ZADD', lapsed(), int(r.l), member)
return {OK}
end)
register('lookup', {'no-writes'}, function()
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
end)
register('list', {}, function()
-- list_lapsed and list_unknown, one shard. KEYS[1] the shard's set (scored by
-- lease_until or next_check_at), ARGV[1] the shard's key prefix, ARGV[2] the
-- limit, ARGV[3] the state its records are in. Returns the time, then each
-- due record (packed, as prelude.lua says). An entry whose record is gone
-- (Redis deleted it at the end of its life) or moved on is dropped on the
-- way.
local now = clock()
local out = {int(now)}
local limit, kept = tonumber(ARGV[2]), 0
while kept < limit do
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', kept, limit - kept)
  if #members == 0 then
    break
  end
  for _, m in ipairs(members) do
    local r = load(ARGV[1] .. m)
    if r and r.s == ARGV[3] then
      out[#out + 1] = r.raw
      kept = kept + 1
    else
      redis.call('ZREM', KEYS[1], m)
    end
  end
end
return out
end)
register('purge', {}, function()
-- purge_expired, one shard. KEYS[1] the lapsed set, KEYS[2] the unknown set,
-- KEYS[3] the delivered jobs, KEYS[4] the shard's job list, ARGV[1] the
-- shard's key prefix, ARGV[2] the most entries to drop, ARGV[3] the most
-- entries to look at in each set. Redis deletes records itself at the end of
-- their life (native TTL); what is left is their entries in the two sets,
-- dropped here. Delivered jobs are kept until their record's expiry
-- (kept_until, their score; Redis deletes them then too): their entries,
-- and the job if it is still there, go in the same pass, within the same
-- budget. Returns how many entries and jobs it dropped.
local now = clock()
local budget, dropped = tonumber(ARGV[2]), 0
for i, state in ipairs({IN_PROGRESS, UNKNOWN}) do
  local members = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', int(now), 'LIMIT', 0, ARGV[3])
  for _, m in ipairs(members) do
    if dropped >= budget then
      break
    end
    local r = load(ARGV[1] .. m)
    if not r or r.s ~= state then
      redis.call('ZREM', KEYS[i], m)
      dropped = dropped + 1
    end
  end
end
if dropped >= budget then
  return dropped
end
local delivered = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int(now), 'LIMIT', 0,
  budget - dropped)
for _, m in ipairs(delivered) do
  redis.call('DEL', ARGV[1] .. 'j:' .. m)
  redis.call('ZREM', KEYS[3], m)
  redis.call('ZREM', KEYS[4], m)
end
return dropped + #delivered
end)
register('scan', {'no-writes'}, function()
-- list_records and count_records, one SCAN step over one shard. KEYS[1] the
-- shard's lapsed set, not read: it names the shard's slot, so a Cluster runs
-- the script on the node that holds the shard. ARGV[1] the shard's key
-- prefix, ARGV[2] the cursor, ARGV[3] the COUNT hint, ARGV[4] '1' to answer
-- each record's key and state only. Returns the time, the next cursor ('0'
-- when done), then for each record (`r:` and `k:` keys) either the record
-- (packed, as prelude.lua says) or its key and state. SCAN may name a record
-- twice; the caller drops the repeat by its key.
local now = clock()
local step = redis.call('SCAN', ARGV[2], 'MATCH', ARGV[1] .. '[rk]:*', 'COUNT', ARGV[3])
local out = {int(now), step[1]}
for _, rec in ipairs(step[2]) do
  local r = load(rec)
  if r then
    if ARGV[4] == '1' then
      out[#out + 1] = r.k
      out[#out + 1] = r.s
    else
      out[#out + 1] = r.raw
    end
  end
end
return out
end)
register('peek_jobs', {'no-writes'}, function()
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
end)
register('lease_jobs', {}, function()
-- lease_jobs, one shard. KEYS[1] the shard's job list, not read: it names the
-- shard's slot. ARGV[1] the shard's key prefix, ARGV[2] the most jobs, ARGV[3]
-- the lease (µs), ARGV[4] the token, ARGV[5..] the names. Leases the longest
-- due live jobs of those names: each gets the token, one more attempt, and
-- next_run_at = now + lease, which is also its score in its name's due set,
-- so no other lease finds it until the lease runs out. One script: of two
-- dispatchers leasing at once, one runs first and the other finds the job
-- not due. Returns the time, then each leased job's fields.
local now = clock()
local base = ARGV[1]
local out = {int(now)}
local ends = int(now + tonumber(ARGV[3]))
for _, due in ipairs(due_jobs(base, 5, tonumber(ARGV[2]), now)) do
  local member, name = due[2], due[3]
  local job = base .. 'j:' .. member
  if redis.call('EXISTS', job) == 1 then
    redis.call('HINCRBY', job, 'a', 1)
    redis.call('HSET', job, 'k', ARGV[4], 'd', ends, 'u', int(now))
    redis.call('ZADD', base .. 'jd:' .. name, ends, member)
    push_job(out, job)
  else
    redis.call('ZREM', base .. 'jd:' .. name, member)
  end
end
return out
end)
register('finish_job', {}, function()
-- finish_job. KEYS[1] the job, KEYS[2] its name's due set, KEYS[3] the
-- shard's job list; ARGV[1] the job's member, ARGV[2] the token. Delivers the
-- job only if the token holds its lease (or held the last one and nobody
-- leased it since): a dispatcher whose lease ran out and was taken over must
-- not finish the new holder's run. A delivered job gives its lease up, leaves
-- its due set (no lease finds it again) and is kept as long as its
-- operation's record: until the record's expiry (found as lookup.lua finds
-- it), or until the next purge when the record is gone.
if redis.call('HGET', KEYS[1], 'k') ~= ARGV[2] then
  return {FENCED}
end
local now = clock()
local base = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1] - 2)
local f = redis.call('HMGET', KEYS[1], 't', 'r')
local tenant, reference = f[1], f[2]
local function is(r)
  return r and r.t == tenant and reference_of(r) == reference
end
local prefix = tohex(string.sub(reference, 1, 8))
local r = load(base .. 'r:' .. prefix)
if not is(r) then
  r = nil
  for _, m in ipairs(redis.call('SMEMBERS', base .. 'x:' .. prefix)) do
    local other = load(base .. m)
    if is(other) then
      r = other
      break
    end
  end
end
local kept = now
if r and r.s == COMPLETED then
  kept = math.max(r.e, now)
end
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'v', int(now), 'w', int(kept), 'u', int(now))
redis.call('PEXPIREAT', KEYS[1], int(math.ceil(kept / 1000)))
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', base .. 'delivered', int(kept), ARGV[1])
return {OK}
end)
register('retry_job', {}, function()
-- retry_job. KEYS[1] the job, KEYS[2] its name's due set; ARGV[1] the job's
-- member, ARGV[2] the token, ARGV[3] the delay (µs), ARGV[4] the error.
-- Fenced by the token as finish_job; gives the lease up and makes the job due
-- after the delay.
if redis.call('HGET', KEYS[1], 'k') ~= ARGV[2] then
  return {FENCED}
end
local now = clock()
local at = int(now + tonumber(ARGV[3]))
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'd', at, 'e', ARGV[4], 'u', int(now))
redis.call('ZADD', KEYS[2], at, ARGV[1])
return {OK}
end)
register('bury_job', {}, function()
-- bury_job. KEYS[1] the job, KEYS[2] its name's due set; ARGV[1] the job's
-- member, ARGV[2] the token, ARGV[3] the error. Fenced by the token as
-- finish_job; the job goes to the dead letter: out of its due set (no lease
-- finds it), still in the shard's job list (listed).
if redis.call('HGET', KEYS[1], 'k') ~= ARGV[2] then
  return {FENCED}
end
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'z', '1', 'e', ARGV[3], 'u', int(clock()))
redis.call('ZREM', KEYS[2], ARGV[1])
return {OK}
end)
register('redrive_job', {}, function()
-- redrive_job. KEYS[1] the job, KEYS[2] its name's due set, KEYS[3] the
-- shard's job names; ARGV[1] the job's member, ARGV[2] its name. A dead job
-- becomes live, due now, with no attempts (its last error kept). Returns 1,
-- or 0 when no dead job has this id (a live one is left as it is).
if redis.call('HGET', KEYS[1], 'z') ~= '1' then
  return 0
end
local now = int(clock())
redis.call('HDEL', KEYS[1], 'k')
redis.call('HSET', KEYS[1], 'z', '0', 'a', '0', 'd', now, 'u', now)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
return 1
end)
register('list_jobs', {}, function()
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
end)
register('count_due_jobs', {}, function()
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
end)
