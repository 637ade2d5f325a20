-- Claim: move up to ARGV[1] due members of the source set into the in-flight set,
-- leased until now + ARGV[2] ms. "Now" is the Redis server clock.
-- KEYS: source, inflight, attempts
-- Reply: {now, lease_deadline, next_head_score or "", member, due_score, attempt, ...}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[2])
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local n = #items / 2
local out = {now, deadline, ''}
if n > 0 then
  -- The deadline is the batch's ownership token for settle. A member the producer re-added
  -- while in flight may still be leased by an unsettled batch that claimed it in this same
  -- millisecond: move this batch's deadline past such a lease so the two stay distinct.
  local held = {}
  for i = 1, n, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, n) do
      chunk[#chunk + 1] = items[2 * j - 1]
    end
    for _, score in ipairs(redis.call('ZMSCORE', KEYS[2], unpack(chunk))) do
      if score then
        held[tonumber(score)] = true
      end
    end
  end
  while held[deadline] do
    deadline = deadline + 1
  end
  out[2] = deadline
  -- The claimed members are exactly the lowest n ranks.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
  local args = {}
  for i = 1, n do
    args[#args + 1] = deadline
    args[#args + 1] = items[2 * i - 1]
    if #args >= 1000 then
      redis.call('ZADD', KEYS[2], unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', KEYS[2], unpack(args))
  end
  local counted = redis.call('EXISTS', KEYS[3]) == 1
  for i = 1, n do
    local member = items[2 * i - 1]
    local attempt = 1
    if counted then
      local failed = redis.call('HGET', KEYS[3], member)
      if failed then
        attempt = tonumber(failed) + 1
      end
    end
    out[#out + 1] = member
    out[#out + 1] = items[2 * i]
    out[#out + 1] = attempt
  end
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then
  out[3] = head[2]
end
return out
