-- Recover: members whose lease expired (their worker died or lost its reply) go back to
-- the source set as due now, and the unfinished attempt is counted.
-- A member the producer re-added meanwhile keeps the producer's due time.
-- KEYS: source, inflight, attempts   ARGV: most members to recover
-- Reply: number of members recovered
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local items = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - 1, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(items) do
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZADD', KEYS[1], 'NX', now, member)
  redis.call('HINCRBY', KEYS[3], member, 1)
end
return #items
