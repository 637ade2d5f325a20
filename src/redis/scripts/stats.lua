-- Stats: one consistent, read-only snapshot of a queue's sizes (ZCOUNT/ZCARD/HLEN only).
-- KEYS: the queue's eight keys (see prelude)
-- Reply: {now, due, total, inflight, dead, oldest_due_score or "", paused (0 or 1),
--         earliest lease deadline or "", attempt entries, dead letters not refused}
local now = now_ms()
local due = redis.call('ZCOUNT', SOURCE, '-inf', now)
-- The head's score: read only when something is due (it copies the head member, which
-- inline is a whole message).
local oldest = ''
if due > 0 then
  oldest = redis.call('ZRANGE', SOURCE, 0, 0, 'WITHSCORES')[2] or ''
end
local paused = 0
if is_paused(CONTROL) then
  paused = 1
end
local lease = redis.call('ZRANGE', INFLIGHT, 0, 0, 'WITHSCORES')[2] or ''
local attempts = 0
if redis.call('TYPE', ATTEMPTS)['ok'] == 'hash' then
  attempts = redis.call('HLEN', ATTEMPTS)
end
return {now, due, redis.call('ZCARD', SOURCE), redis.call('ZCARD', INFLIGHT), redis.call('ZCARD', DEAD),
  oldest, paused, lease, attempts, redis.call('ZCOUNT', DEAD, '-inf', '(+inf')}
