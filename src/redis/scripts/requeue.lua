-- Requeue dead letters: move the named members (or, with no names, up to ARGV[1] of the
-- oldest) from the dead-letter set back to the source set, due now. A member the producer
-- scheduled again keeps the earlier of its two due times (`ZADD LT`), so one parked at
-- +inf fires now. The failure count starts afresh.
-- KEYS: the queue's eight keys (see prelude)   ARGV: limit, member...
-- Reply: number of members requeued
local now, args, bad = begin_with({{1, 'requeue limit'}})
if bad then
  return bad
end
local limit = args[1]
local members = argv_list(2)
if #members == 0 and limit > 0 then
  -- No names: the oldest. A limit of 0 must move nothing: ZRANGE 0 -1 would mean the whole set.
  members = redis.call('ZRANGE', DEAD, 0, limit - 1)
end
local moved = 0
for _, member in ipairs(members) do
  -- Back in the source set first, then out of the dead-letter set: a Redis too old for
  -- `ZADD LT` fails the call before its first write instead of after a ZREM.
  if redis.call('ZSCORE', DEAD, member) then
    redis.call('ZADD', SOURCE, 'LT', now, member)
    redis.call('ZREM', DEAD, member)
    redis.call('HDEL', DEAD_REASONS, member)
    -- A forward in progress no longer owns it: its confirmation will not delete anything.
    redis.call('ZREM', DEAD_INFLIGHT, member)
    moved = moved + 1
  end
end
return moved
