-- Settle one claimed batch in one call: ack the confirmed members, fail the rejected ones
-- (retry later or dead-letter), and put back the ones that were never tried. Every action
-- applies only to members still leased with this batch's deadline: a batch whose lease
-- expired cannot undo the claim of another.
-- A retried or put-back member that the producer added again meanwhile keeps the
-- producer's schedule (identical members de-duplicate; the fresh schedule restarts the count).
-- KEYS: the queue's eight keys (see prelude)
-- In hash payload mode (ARGV[6] = 1) an acked id's body is deleted too, unless the id is
-- scheduled again or dead-lettered (a newer copy needs it); every other action keeps it.
-- ARGV: deadline, max_attempts, n_ack, n_fail, n_back, hash 0|1,
--       n_ack x member, n_fail x (member, delay_ms, reason, permanent 0|1, detail or ""),
--       n_back x (member, due_score)
-- Reply: {acked, put_back, released, outcome per failed member: 0 not ours, 1 retried, 2 dead-lettered}
--   released: failed or put-back members whose scheduled copy (added again by the producer)
--   became claimable when this batch let go of them. Acks do not look (it would cost a
--   lookup per message): a claim that skipped a member in flight says so instead.
local deadline = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[2])
local n_ack, n_fail, n_back = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local hash = ARGV[6] == '1'
if not (deadline and max_attempts and n_ack and n_fail and n_back)
  or #ARGV ~= 6 + n_ack + 5 * n_fail + 2 * n_back then
  return redis.error_reply('ERR settle: malformed arguments')
end
local acks, fails, backs = {}, {}, {}
local i = 7
for k = 1, n_ack do
  acks[k] = ARGV[i]
  i = i + 1
end
for k = 1, n_fail do
  local delay = tonumber(ARGV[i + 1])
  if not delay then
    return redis.error_reply('ERR settle: malformed retry delay')
  end
  fails[k] = {ARGV[i], delay, ARGV[i + 2], ARGV[i + 3] == '1', ARGV[i + 4]}
  i = i + 5
end
for k = 1, n_back do
  if not tonumber(ARGV[i + 1]) then
    return redis.error_reply('ERR settle: malformed score')
  end
  backs[k] = {ARGV[i], ARGV[i + 1]}
  i = i + 2
end
local now, bad = begin()
if bad then
  return bad
end

local function owned(member)
  local score = redis.call('ZSCORE', INFLIGHT, member)
  return score and tonumber(score) == deadline
end

local out = {0, 0, 0}

-- Acks: only members still leased by this batch; a copy the producer added again stays.
-- Their lease scores are read one by one (ZMSCORE), not the whole batch's lease: a batch is
-- acked in several calls while the broker confirms it, and each call costs what it acks.
if n_ack > 0 then
  local scores = presence(INFLIGHT, acks)
  local mine = {}
  for k = 1, n_ack do
    if scores[k] and tonumber(scores[k]) == deadline then
      mine[#mine + 1] = acks[k]
    end
  end
  if #mine > 0 then
    each_chunk('ZREM', INFLIGHT, mine)
  end
  if #mine > 0 and redis.call('EXISTS', ATTEMPTS) == 1 then
    each_chunk('HDEL', ATTEMPTS, mine)
  end
  if hash and #mine > 0 then
    local scheduled, dead = presence(SOURCE, mine), presence(DEAD, mine)
    local done = {}
    for k = 1, #mine do
      if not scheduled[k] and not dead[k] then
        done[#done + 1] = mine[k]
      end
    end
    each_chunk('HDEL', BODIES, done)
  end
  out[1] = #mine
end

for _, f in ipairs(fails) do
  local member, delay, reason, permanent, detail = f[1], f[2], f[3], f[4], f[5]
  if owned(member) then
    local count = failures(ATTEMPTS, member, deadline) + 1
    redis.call('ZREM', INFLIGHT, member)
    if permanent or count >= max_attempts then
      redis.call('HDEL', ATTEMPTS, member)
      redis.call('ZADD', DEAD, now, member)
      -- A forward of an earlier dead copy must not delete this one when it is confirmed.
      redis.call('ZREM', DEAD_INFLIGHT, member)
      local why = {reason = reason, attempts = count, at = now}
      if detail ~= '' then
        why.detail = detail
      end
      redis.call('HSET', DEAD_REASONS, member, cjson.encode(why))
      if redis.call('ZSCORE', SOURCE, member) then
        out[3] = out[3] + 1
      end
      out[#out + 1] = 2
    else
      if redis.call('ZADD', SOURCE, 'NX', now + delay, member) == 1 then
        set_failures(ATTEMPTS, member, count, now + delay)
      else
        redis.call('HDEL', ATTEMPTS, member)
        out[3] = out[3] + 1
      end
      out[#out + 1] = 1
    end
  else
    out[#out + 1] = 0
  end
end

for _, b in ipairs(backs) do
  local member, due = b[1], b[2]
  if owned(member) then
    local count = failures(ATTEMPTS, member, deadline)
    redis.call('ZREM', INFLIGHT, member)
    if redis.call('ZADD', SOURCE, 'NX', due, member) == 1 then
      set_failures(ATTEMPTS, member, count, due)
    else
      redis.call('HDEL', ATTEMPTS, member)
      out[3] = out[3] + 1
    end
    out[2] = out[2] + 1
  end
end
return out
