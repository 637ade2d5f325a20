-- Enqueues a schedule's next ticks, once across every bridge: the schedule's mark (the last
-- tick enqueued and its member) moves only here, and only from the mark the caller planned
-- from, so two bridges, a restart or a reload never enqueue a tick twice. Missed ticks (a tick
-- whose time plus the grace is before now, on the Redis clock) follow the misfire policy. Every
-- check comes before the first write.
-- KEYS: the queue's eight keys (see prelude), then the hash of the trigger's schedule marks
-- ARGV: name, mark as planned from ('' for none), grace ms, policy (skip, once, all),
--   catch-up limit, body for hash payload mode ('' inline), missed ticks the caller left out,
--   then pairs of tick (epoch ms, ascending, after the mark) and member
-- Reply: {status ('ok', 'stale': the mark moved, 'paused': nothing new enqueued), the mark's
--   tick (-1 for none), ticks enqueued, ticks missed (skipped or dropped), 1 if the mark's
--   tick is still waiting unclaimed}
local MARKS = KEYS[9]
local name, planned, policy, body = ARGV[1], ARGV[2], ARGV[4], ARGV[6]
if policy ~= 'skip' and policy ~= 'once' and policy ~= 'all' then
  return redis.error_reply('ERR malformed misfire policy')
end
local grace, limit, left_out = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[7])
if not (grace and limit and left_out) or (#ARGV - 7) % 2 ~= 0 then
  return redis.error_reply('ERR malformed schedule arguments')
end
local ticks, members = {}, {}
for i = 8, #ARGV, 2 do
  local t = tonumber(ARGV[i])
  if not finite(t) or (#ticks > 0 and t <= ticks[#ticks]) then
    return redis.error_reply('ERR malformed tick')
  end
  ticks[#ticks + 1] = t
  members[#members + 1] = ARGV[i + 1]
end
local now, bad = begin()
if bad then
  return bad
end
local marks_type = redis.call('TYPE', MARKS)['ok']
if marks_type ~= 'none' and marks_type ~= 'hash' then
  return redis.error_reply('WRONGTYPE key ' .. MARKS .. ' holds a ' .. marks_type ..
    ' where delay-bridge needs a hash; rename or delete it')
end
local stored = redis.call('HGET', MARKS, name) or ''
if stored ~= planned then
  return {'stale', -1, 0, 0, 0}
end
-- The mark: its tick, and whether its message still waits unclaimed with its first score (a
-- copy that failed or was recovered has another score and is left to its retries).
local mark, mark_member, waiting = -1, nil, false
if stored ~= '' then
  local bar = string.find(stored, '|', 1, true)
  if bar then
    mark = tonumber(string.sub(stored, 1, bar - 1)) or -1
    mark_member = string.sub(stored, bar + 1)
    local score = redis.call('ZSCORE', SOURCE, mark_member)
    waiting = score ~= false and tonumber(score) == mark
  end
end
local function missed(t)
  return t + grace < now
end
-- Ticks skipped or dropped: the new ones (counted once the mark moves past them), and the
-- mark's own message when it is taken back.
local dropped, mark_dropped = left_out, 0
local function drop_mark()
  redis.call('ZREM', SOURCE, mark_member)
  if body ~= '' then
    redis.call('HDEL', BODIES, mark_member)
  end
  waiting = false
  mark_dropped = 1
end
-- The new ticks this call may enqueue: missed ones as the policy says, then the rest.
local late, keep = {}, {}
for i, t in ipairs(ticks) do
  if missed(t) then
    late[#late + 1] = i
  else
    keep[#keep + 1] = i
  end
end
local fire = {}
if policy == 'skip' then
  dropped = dropped + #late
  if waiting and missed(mark) then
    drop_mark()
  end
elseif policy == 'once' then
  if #late > 0 then
    dropped = dropped + #late - 1
    fire[1] = late[#late]
    if waiting and missed(mark) then
      drop_mark()
    end
  end
else
  local first = math.max(1, #late - limit + 1)
  dropped = dropped + first - 1
  for j = first, #late do
    fire[#fire + 1] = late[j]
  end
end
-- A paused trigger's ticks wait: nothing new is enqueued and the mark stays, so that the
-- ticks of the pause are judged by the policy once it ends.
if is_paused(CONTROL) then
  return {'paused', mark, 0, mark_dropped, waiting and 1 or 0}
end
for _, i in ipairs(keep) do
  fire[#fire + 1] = i
end
for _, i in ipairs(fire) do
  redis.call('ZADD', SOURCE, ticks[i], members[i])
  if body ~= '' then
    redis.call('HSET', BODIES, members[i], body)
  end
end
local last = #ticks
if last > 0 then
  redis.call('HSET', MARKS, name, string.format('%d|', ticks[last]) .. members[last])
  mark = ticks[last]
  waiting = #fire > 0 and fire[#fire] == last
end
return {'ok', mark, #fire, dropped + mark_dropped, waiting and 1 or 0}
