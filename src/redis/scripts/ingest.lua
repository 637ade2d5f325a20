-- Stores one message an ingress took from a broker (hash payload mode): its body under its id
-- and the id in the source set at its due time, or, for a message the ingress refuses, the id
-- as a dead letter with its reason. Idempotent: an id already scheduled, in flight or dead
-- changes nothing, so a delivery the broker hands out again (the bridge died between this
-- write and its ack, or another replica had it) is stored once. Every check comes before the
-- first write.
-- KEYS: the queue's eight keys (see prelude)
-- ARGV: id, body, mode, ms, reason, detail
--   mode 'in': due ARGV[4] ms from now on the Redis clock (0 or less: now);
--   mode 'at': due at ARGV[4] (epoch ms);
--   mode 'dead': a dead letter with reason ARGV[5] and detail ARGV[6] ('' for none).
-- Reply: {1 if stored, 0 if the id was already there; the due time, or the dead letter's time,
-- as a score string}
local id, body, mode = ARGV[1], ARGV[2], ARGV[3]
if mode ~= 'in' and mode ~= 'at' and mode ~= 'dead' then
  return redis.error_reply('ERR malformed ingest mode')
end
local ms = 0
if mode ~= 'dead' then
  local err
  ms, err = number_arg(4, 'due time')
  if not ms then
    return err
  end
  if not finite(ms) or math.abs(ms) > 9007199254740992 then
    return redis.error_reply('ERR malformed due time')
  end
end
local now, bad = begin()
if bad then
  return bad
end
for _, key in ipairs({SOURCE, INFLIGHT, DEAD}) do
  local score = redis.call('ZSCORE', key, id)
  if score then
    return {0, score}
  end
end
redis.call('HSET', BODIES, id, body)
-- An entry left by an earlier copy of this id counts for nothing here.
redis.call('HDEL', ATTEMPTS, id)
if mode == 'dead' then
  redis.call('ZADD', DEAD, now, id)
  redis.call('ZREM', DEAD_INFLIGHT, id)
  local why = {reason = ARGV[5], attempts = 0, at = now}
  if ARGV[6] ~= '' then
    why.detail = ARGV[6]
  end
  redis.call('HSET', DEAD_REASONS, id, cjson.encode(why))
  return {1, string.format('%.17g', now)}
end
local due = ms
if mode == 'in' then
  due = now + math.max(ms, 0)
end
redis.call('ZADD', SOURCE, due, id)
return {1, string.format('%.17g', due)}
