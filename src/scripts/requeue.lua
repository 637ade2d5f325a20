-- Requeue dead letters: move the named members (or, with no names, up to ARGV[1] of the
-- oldest) from the dead-letter set back to the source set, due now, with a fresh count.
-- KEYS: source, attempts, dead, dead_reasons   ARGV: limit, member...
-- Reply: number of members requeued
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local members = {}
if #ARGV > 1 then
  for i = 2, #ARGV do
    members[#members + 1] = ARGV[i]
  end
elseif tonumber(ARGV[1]) > 0 then
  -- A limit of 0 must move nothing: ZRANGE 0 -1 would mean the whole set.
  members = redis.call('ZRANGE', KEYS[3], 0, tonumber(ARGV[1]) - 1)
end
local moved = 0
for _, member in ipairs(members) do
  if redis.call('ZREM', KEYS[3], member) == 1 then
    redis.call('HDEL', KEYS[4], member)
    redis.call('HDEL', KEYS[2], member)
    redis.call('ZADD', KEYS[1], 'NX', now, member)
    moved = moved + 1
  end
end
return moved
