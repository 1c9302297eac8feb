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
  -- Record::holds_key: a COMPLETED record until its window ends, a
  -- NOT_PERFORMED one never, an IN_PROGRESS or UNKNOWN one until its
  -- retention and its lease are both over.
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
  -- Record::outlives_takeover: a new operation (another reference) takes the
  -- key while this one's retention has not ended. This one is kept, in this
  -- same script, under its reference, as it is, until its retention ends
  -- (Redis deletes it then: only a settled record gets here before its
  -- retention ends, and one lives until retain_until). Nothing changes it
  -- again: a fenced change finds the key's current record only.
  if (r.g or NO_TAG) ~= tag and r.r > now then
    redis.call('SET', superseded(base(), reference_of(r)), r.raw, 'PXAT', ends_at(r))
  end
  -- Otherwise past its life (Redis has not deleted it yet), or resolved as
  -- not performed within its window: the claim replaces it whole (the SET
  -- below).
  redis.call('ZREM', unknown(), member)
end
local lease_until = now + lease
save(rec, {k = KEY, f = fingerprint, t = tenant, o = tool, s = IN_PROGRESS, a = attempt,
  c = now, u = now, l = lease_until, e = now + window, r = now + retention, n = now, x = 0,
  g = tag ~= NO_TAG and tag or nil}, collided)
redis.call('ZADD', lapsed(), int(lease_until), member)
return {CLAIMED, tag}
