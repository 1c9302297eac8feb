-- resolve. ARGV[4] attempt, ARGV[5] the new state (COMPLETED or
-- NOT_PERFORMED), ARGV[6] response or note, ARGV[7] settle (µs), ARGV[8] '1'
-- when ARGV[9] says who resolved it and why ('0': nobody said); for a
-- COMPLETED resolution with follow-on jobs, ARGV[10] the shard's key prefix
-- and ARGV[11..] (name, payload) pairs, written with the resolution
-- (jobs.lua).
local rec, member, f = owned('u', 'e', 'r', 't')
if not rec then
  return {FENCED}
end
if f[3] ~= UNKNOWN then
  return {WRONG_STATE, f[3]}
end
local now = clock()
if ARGV[5] == NOT_PERFORMED then
  -- "Not performed" is trusted only for a record unchanged for the settle
  -- period: a request still in flight may not show at the processor yet.
  local settled = tonumber(f[4]) + tonumber(ARGV[7])
  if now < settled then
    return {NOT_SETTLED, int(settled)}
  end
end
redis.call('HSET', rec, 's', ARGV[5], 'b', ARGV[6], 'u', int(now))
if ARGV[8] == '1' then
  redis.call('HSET', rec, 'v', ARGV[9])
else
  redis.call('HDEL', rec, 'v')
end
redis.call('ZREM', KEYS[4], member)
if ARGV[5] == COMPLETED then
  -- Resolved after its window, it still answers repeats until its retention
  -- ends: it must not expire the moment it is written.
  local expires = math.max(tonumber(f[5]), tonumber(f[6]))
  redis.call('HSET', rec, 'e', int(expires))
  expire_at(rec, COMPLETED, expires)
  if ARGV[10] then
    write_jobs(ARGV[10], f[7], now, 11)
  end
end
return {OK}
