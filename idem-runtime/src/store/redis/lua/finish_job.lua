-- finish_job. KEYS[1] the job, KEYS[2] its name's due set, KEYS[3] the
-- shard's job list; ARGV[1] the job's member, ARGV[2] the token. Deletes the
-- job only if the token holds its lease (or held the last one and nobody
-- leased it since): a dispatcher whose lease ran out and was taken over must
-- not finish the new holder's run.
if redis.call('HGET', KEYS[1], 'k') ~= ARGV[2] then
  return {FENCED}
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return {OK}
