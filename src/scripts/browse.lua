-- Browse: one page of scheduled members by due time, read-only. A page starts after the
-- cursor (the score and member of the previous page's last entry): by rank when that member
-- is still there with that score, else after its score. Work is bounded by the page size.
-- KEYS: the queue's seven keys (see prelude)
-- ARGV: from (ms or "-inf"), to (ms or "+inf"), limit, cursor score ("" for the first page),
--       cursor member, preview (most body bytes returned per entry, hash mode; 0: inline)
-- Reply: {member, due_score, attempt_entry or "", body_size, body_preview, ...}
--   body_size: -1 inline (the member is the body) or in hash mode when the id has no body;
--   body_preview: its first bytes, "" over 1 MiB.
for i, want in ipairs({'zset', 'zset', 'hash', 'zset', 'hash', 'hash', 'hash'}) do
  local got = redis.call('TYPE', KEYS[i])['ok']
  if got ~= 'none' and got ~= want then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. got)
  end
end
local limit = tonumber(ARGV[3])
local preview = tonumber(ARGV[6])
local to = tonumber(ARGV[2])
if ARGV[2] == '+inf' then
  to = math.huge
end
local page
local rank = nil
if ARGV[4] ~= '' then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[5])
  if score and tonumber(score) == tonumber(ARGV[4]) then
    rank = redis.call('ZRANK', KEYS[1], ARGV[5])
  end
end
if rank then
  page = redis.call('ZRANGE', KEYS[1], rank + 1, rank + limit, 'WITHSCORES')
else
  local from = ARGV[1]
  if ARGV[4] ~= '' then
    from = '(' .. ARGV[4]
  end
  page = redis.call('ZRANGEBYSCORE', KEYS[1], from, ARGV[2], 'WITHSCORES', 'LIMIT', 0, limit)
end
local out = {}
for j = 1, #page / 2 do
  local member, score = page[2 * j - 1], page[2 * j]
  if tonumber(score) > to then
    break
  end
  out[#out + 1] = member
  out[#out + 1] = score
  out[#out + 1] = redis.call('HGET', KEYS[3], member) or ''
  if preview > 0 and redis.call('HEXISTS', KEYS[6], member) == 1 then
    local size = redis.call('HSTRLEN', KEYS[6], member)
    out[#out + 1] = size
    if size <= 1048576 then
      out[#out + 1] = string.sub(redis.call('HGET', KEYS[6], member), 1, preview)
    else
      -- Reading a huge body to show its first bytes would block Redis for nothing.
      out[#out + 1] = ''
    end
  else
    out[#out + 1] = -1
    out[#out + 1] = ''
  end
end
return out
