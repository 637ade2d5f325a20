-- Stats: one consistent, read-only snapshot of a queue's sizes (ZCOUNT/ZCARD/HLEN only).
-- KEYS: source, inflight, dead, control, attempts
-- Reply: {now, due, total, inflight, dead, oldest_due_score or "", paused (0 or 1),
--         earliest lease deadline or "", attempt entries, dead letters not refused}
local now = now_ms()
local due = redis.call('ZCOUNT', KEYS[1], '-inf', now)
-- The head's score: read only when something is due (it copies the head member, which
-- inline is a whole message).
local oldest = ''
if due > 0 then
  oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or ''
end
local paused = 0
if is_paused(KEYS[4]) then
  paused = 1
end
local lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2] or ''
local attempts = 0
if redis.call('TYPE', KEYS[5])['ok'] == 'hash' then
  attempts = redis.call('HLEN', KEYS[5])
end
return {now, due, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  oldest, paused, lease, attempts, redis.call('ZCOUNT', KEYS[3], '-inf', '(+inf')}
