-- Browse: one page of scheduled members by due time, read-only. A page starts right after
-- the cursor (the score and member of the previous page's last entry) in the set's order,
-- found by rank even if that member has left meanwhile: work is bounded by the page size
-- and the log of the set's size, never by how far into the set the page is.
-- KEYS: the queue's eight keys (see prelude)
-- ARGV: from (ms or "-inf"), to (ms or "+inf"), limit, cursor score ("" for the first page),
--       cursor member, preview (most body bytes returned per entry, hash mode; 0: inline)
-- Reply: {member, due_score, attempt_entry or "", body_size, body_preview, ...}
--   body_size: -1 inline (the member is the body) or in hash mode when the id has no body;
--   body_preview: its first bytes, "" over 1 MiB.
local bad = wrong_type()
if bad then
  return bad
end
local limit = tonumber(ARGV[3])
local preview = tonumber(ARGV[6])
local to = tonumber(ARGV[2])
if ARGV[2] == '+inf' then
  to = math.huge
end
-- Bytewise order, as Redis orders members of equal score (Lua's `<` follows the locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

local page
if ARGV[4] == '' then
  page = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2], 'WITHSCORES', 'LIMIT', 0, limit)
else
  -- The first rank after the cursor, whether or not its member is still there: members of
  -- the cursor's score sit at ranks [lo, hi), in byte order; binary search among them.
  local score, member = ARGV[4], ARGV[5]
  local lo = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. score)
  local hi = lo + redis.call('ZCOUNT', KEYS[1], score, score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if before(member, redis.call('ZRANGE', KEYS[1], mid, mid)[1]) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  page = redis.call('ZRANGE', KEYS[1], lo, lo + limit - 1, 'WITHSCORES')
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
