-- Claim: move up to ARGV[1] due members of the source set into the in-flight set, leased
-- until now + ARGV[2] ms. "Now" is the Redis server clock. A due member that is still in
-- flight (the producer added it again while an earlier copy is being delivered) is left
-- where it is until that copy settles, so a member has at most one lease at a time and
-- every settle can tell its own lease from a newer one.
-- With ARGV[3] > 0 (hash payload mode) each member is an id whose body is read from the
-- bodies hash, in this same call; nothing is deleted from it. The sizes are looked at first
-- (HSTRLEN) and only the chosen bodies read: the claim stops before the bodies would pass
-- ARGV[3] bytes in all, but always takes at least one member, and a body over ARGV[4] bytes
-- (0: no limit) is not read at all.
-- While the control hash's `paused` field pauses (see prelude), nothing is claimed: every
-- replica stops at its next claim, and producers keep writing.
-- With a rate (ARGV[5] > 0, messages per ms) a token bucket in the control hash (fields
-- `tokens` and `at`, on the Redis clock) holds up to ARGV[6] tokens: a claim takes at most
-- as many members as there are whole tokens, and spends one per member, so every replica
-- together stays within the rate. The bucket is written when members are claimed, and when
-- it is repaired.
-- Control fields are checked on every claim and repaired, never obeyed when out of range: a
-- `paused` value that is not canonical is rewritten (see prelude); a `tokens` or `at` that
-- is not a finite number, tokens below 0 or `at` after now empty the bucket as of now (it
-- refills at the rate). The repairs are counted in the reply.
-- KEYS: the queue's eight keys (see prelude)
-- ARGV: limit, lease ms, body byte budget (0: inline), largest body to read (0: any),
--       rate (messages per ms, 0: none), burst (most tokens)
-- Reply: {now_us, deadline, next_head_score or "", skipped, paused, wait, repaired, scores,
--         took_us, member, [body], ...}
--   now_us: the Redis clock in epoch microseconds (`now` is its whole milliseconds), so
--     that the worker times the next head to the microsecond, not up to a millisecond late.
--   skipped: due members left in place because an earlier copy of them is still in flight.
--   paused: 1 when the queue is paused (then nothing is claimed and the head is "").
--   wait: ms until the rate allows the next member (then nothing is claimed); else 0.
--   repaired: control fields this call repaired (0 almost always).
--   scores: each claimed member's due score and attempt, in the members' order, in one
--     string separated by spaces (`due attempt due attempt ...`; "" when nothing was
--     claimed): one value for the batch instead of two per member, which a client parses
--     far more cheaply.
--   took_us: how long this call ran in Redis, in microseconds, by the Redis clock: what it
--     held the server for, which a worker sizes its next claim by (the time it waited for
--     the reply also holds its own scheduling, which says nothing of Redis's load).
--   body (hash mode only): the body; 0 where the id has none; its size where it is too large.
local now, bad, us = begin()
if bad then
  return bad
end
local now_us = now * 1000 + us
local function took_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]) - now_us
end
local limit = tonumber(ARGV[1])
local deadline = now + tonumber(ARGV[2])
local control = redis.call('HMGET', CONTROL, 'paused', 'tokens', 'at')
local repaired = 0
local paused, odd = pause_value(control[1])
if odd then
  repaired = 1
  if paused then
    redis.call('HSET', CONTROL, 'paused', '1')
  else
    redis.call('HDEL', CONTROL, 'paused')
  end
end
if paused then
  return {now_us, deadline, '', 0, 1, 0, repaired, '', took_us()}
end
local rate = tonumber(ARGV[5]) or 0
local tokens
if rate > 0 then
  local burst = tonumber(ARGV[6]) or 1
  local held, at = finite(control[2]), finite(control[3])
  local bad = 0
  if control[2] and not (held and held >= 0) then
    bad = bad + 1
  end
  if control[3] and not (at and at <= now) then
    bad = bad + 1
  end
  tokens = burst
  if bad > 0 then
    repaired = repaired + bad
    tokens = 0
    redis.call('HSET', CONTROL, 'tokens', '0', 'at', now)
  elseif held and at then
    tokens = math.min(burst, held + (now - at) * rate)
  end
  if tokens < 1 then
    return {now_us, deadline, '', 0, 0, math.ceil((1 - tokens) / rate), repaired, '', took_us()}
  end
  limit = math.min(limit, math.floor(tokens))
end
local budget = tonumber(ARGV[3]) or 0
local largest = tonumber(ARGV[4]) or 0
local hash = budget > 0

-- Pick the due members, skipping those in flight; at most `limit` + 1,000 are looked at.
local members, dues, bodies = {}, {}, {}
local skipped, offset, bytes, full = 0, 0, 0, false
while #members < limit and skipped < 1000 and not full do
  local want = limit - #members
  local page = redis.call('ZRANGEBYSCORE', SOURCE, '-inf', now, 'WITHSCORES', 'LIMIT', offset, want)
  local n = #page / 2
  if n == 0 then
    break
  end
  local names = {}
  for j = 1, n do
    names[j] = page[2 * j - 1]
  end
  local held = presence(INFLIGHT, names)
  for j = 1, n do
    if held[j] then
      skipped = skipped + 1
    else
      if hash then
        -- What the body would cost: false (none), its size (to read), or a size marker
        -- (too large to read: the worker dead-letters it as too_large).
        local size = redis.call('HSTRLEN', BODIES, names[j])
        local body, cost = size, size
        if size == 0 and redis.call('HEXISTS', BODIES, names[j]) == 0 then
          body = false
        elseif largest > 0 and size > largest then
          cost = 0
        else
          body = true
        end
        if #members > 0 and bytes + cost > budget then
          full = true
          break
        end
        bytes = bytes + cost
        bodies[#members + 1] = body
      end
      members[#members + 1] = names[j]
      dues[#dues + 1] = page[2 * j]
    end
  end
  offset = offset + n
  if n < want then
    break
  end
end

-- Read the chosen bodies: false stays 0 (none), a number is the size of one too large.
if hash then
  local wanted, at = {}, {}
  for i = 1, #members do
    if bodies[i] == true then
      wanted[#wanted + 1] = members[i]
      at[#at + 1] = i
    elseif bodies[i] == false then
      bodies[i] = 0
    end
  end
  local read = hmget(BODIES, wanted)
  for k = 1, #wanted do
    bodies[at[k]] = read[k] or 0
  end
end

local out = {now_us, deadline, '', skipped, 0, 0, repaired, '', 0}
local n = #members
if n > 0 then
  -- A deadline of its own (another batch may have claimed in this millisecond with the same
  -- lease), so that settle tells this batch's leases from any other's by their score alone.
  while redis.call('ZCOUNT', INFLIGHT, deadline, deadline) > 0 do
    deadline = deadline + 1
  end
  out[2] = deadline
  if skipped == 0 then
    -- The claimed members are exactly the lowest n ranks.
    redis.call('ZREMRANGEBYRANK', SOURCE, 0, n - 1)
  else
    each_chunk('ZREM', SOURCE, members)
  end
  -- Formatted once: a number argument would be formatted again for every member.
  local score = tostring(deadline)
  local args = {}
  for i = 1, n do
    args[#args + 1] = score
    args[#args + 1] = members[i]
    if #args >= 1000 then
      redis.call('ZADD', INFLIGHT, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', INFLIGHT, unpack(args))
  end
  if tokens then
    redis.call('HSET', CONTROL, 'tokens', string.format('%.17g', tokens - n), 'at', now)
  end
  local counted = redis.call('EXISTS', ATTEMPTS) == 1
  local scores = {}
  for i = 1, n do
    local attempt = 1
    if counted then
      local failed = failures(ATTEMPTS, members[i], dues[i])
      if failed > 0 then
        -- The count moves with the member to its lease.
        set_failures(ATTEMPTS, members[i], failed, deadline)
        attempt = failed + 1
      end
    end
    scores[#scores + 1] = dues[i]
    -- A literal for the first attempt: formatting a number costs more than the rest.
    scores[#scores + 1] = attempt == 1 and '1' or tostring(attempt)
    out[#out + 1] = members[i]
    if hash then
      out[#out + 1] = bodies[i]
    end
  end
  out[8] = table.concat(scores, ' ')
end

-- The next head is the earliest member a claim could take: one still in flight is not.
local head = redis.call('ZRANGE', SOURCE, 0, 0, 'WITHSCORES')
if head[1] and not redis.call('ZSCORE', INFLIGHT, head[1]) then
  out[3] = head[2]
elseif head[1] then
  local probe = redis.call('ZRANGE', SOURCE, 1, skipped + 8, 'WITHSCORES')
  local names = {}
  for j = 1, #probe / 2 do
    names[j] = probe[2 * j - 1]
  end
  local held = presence(INFLIGHT, names)
  for j = 1, #names do
    if not held[j] then
      out[3] = probe[2 * j]
      break
    end
  end
end
out[9] = took_us()
return out
