-- Browse: one page of scheduled members by due time, read-only. A page starts right after
-- the cursor (the score and member of the previous page's last entry) in the set's order,
-- found by rank even if that member has left meanwhile: work is bounded by the page size
-- and the log of the set's size, never by how far into the set the page is.
-- KEYS: the queue's eight keys (see prelude)
-- A page also ends once the members and previews it returns reach a byte budget (after its
-- first entry), and no body over the largest readable size is read: what a call copies and
-- returns is bounded by the budget and one member, whatever is stored.
-- A cursor names its member, or (after a large member, which would make a cursor as large)
-- its place among the members of its score.
-- ARGV: from (ms or "-inf"), to (ms or "+inf"), limit, cursor score ("" for the first page),
--       cursor member, preview (most body bytes returned per entry, hash mode; 0: inline),
--       largest body read for a preview, byte budget, cursor place ("": by member)
-- Reply: {cut (1 if the budget ended the page, else 0), the last entry's place among the
--         members of its score (0 for none), member, due_score, attempt_entry or "",
--         body_size, body_preview, ...}
--   body_size: -1 inline (the member is the body) or in hash mode when the id has no body;
--   body_preview: its first bytes, "" over the largest readable size.
local bad = wrong_type()
if bad then
  return bad
end
local limit = tonumber(ARGV[3])
local preview = tonumber(ARGV[6])
local readable = tonumber(ARGV[7]) or 0
local budget = tonumber(ARGV[8]) or 0
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

-- The page's first rank: after the cursor, or the first member due from `from` on.
local first
if ARGV[4] == '' then
  first = redis.call('ZCOUNT', SOURCE, '-inf', '(' .. ARGV[1])
elseif (ARGV[9] or '') ~= '' then
  first = redis.call('ZCOUNT', SOURCE, '-inf', '(' .. ARGV[4]) + tonumber(ARGV[9]) + 1
else
  -- The first rank after the cursor, whether or not its member is still there: members of
  -- the cursor's score sit at ranks [lo, hi), in byte order; binary search among them.
  local score, member = ARGV[4], ARGV[5]
  local lo = redis.call('ZCOUNT', SOURCE, '-inf', '(' .. score)
  local hi = lo + redis.call('ZCOUNT', SOURCE, score, score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if before(member, redis.call('ZRANGE', SOURCE, mid, mid)[1]) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  first = lo
end
-- One member at a time, so that the budget stops the page before the next member is read.
local out = {0, 0}
local spent = 0
local last_rank, last_score
for rank = first, first + limit - 1 do
  if #out > 2 and spent >= budget then
    out[1] = 1
    break
  end
  local entry = redis.call('ZRANGE', SOURCE, rank, rank, 'WITHSCORES')
  local member, score = entry[1], entry[2]
  if not member or tonumber(score) > to then
    break
  end
  spent = spent + #member
  last_rank, last_score = rank, score
  out[#out + 1] = member
  out[#out + 1] = score
  out[#out + 1] = redis.call('HGET', ATTEMPTS, member) or ''
  if preview > 0 and redis.call('HEXISTS', BODIES, member) == 1 then
    local size = redis.call('HSTRLEN', BODIES, member)
    out[#out + 1] = size
    if size <= readable then
      out[#out + 1] = string.sub(redis.call('HGET', BODIES, member), 1, preview)
      spent = spent + preview
    else
      -- Reading a large body to show its first bytes would block Redis for nothing.
      out[#out + 1] = ''
    end
  else
    out[#out + 1] = -1
    out[#out + 1] = ''
  end
end
if last_rank then
  out[2] = last_rank - redis.call('ZCOUNT', SOURCE, '-inf', '(' .. last_score)
end
return out
