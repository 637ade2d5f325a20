-- Claim dead letters to forward to the trigger's dead-letter destination: up to ARGV[1] of
-- the oldest dead letters that no forward holds (never leased, or the lease expired), each
-- leased until now + ARGV[2] ms in the dead_inflight set. Nothing else moves: a dead letter
-- stays in the dead-letter set, with its reason and body, until its forward is confirmed.
-- A dead letter the broker refused has the dead-letter score +inf (its time stays in its
-- reason): it is never looked at again (requeue or purge it).
-- While the queue is paused nothing is claimed.
-- KEYS: the queue's eight keys (see prelude)
-- ARGV: limit (at most 1,000), lease ms, hash 0|1, largest body to read (0: any)
-- Reply: {now, deadline, member, dead-lettered at (score), reason JSON or "", [body], ...}
--   body (hash mode only): the body; 0 where the id has none; its size where it is too large.
local now, args, bad = begin_with({{1, 'dead-letter claim limit'}, {2, 'dead-letter lease'}})
if bad then
  return bad
end
local limit, lease = math.min(args[1], 1000), args[2]
-- At least 1 ms: a new lease must end after any expired one, or two claims in one
-- millisecond would share a deadline (the settle's ownership token).
local deadline = now + math.max(lease, 1)
local out = {now, deadline}
if limit < 1 or is_paused(CONTROL) then
  return out
end
-- Every leased member is a dead letter not refused, so the claimable ones number
-- `total - held`, and the first `limit + held` of them hold as many as one claim may take:
-- the work is bounded by the leases of the forwards in progress, whatever was refused.
local total = redis.call('ZCOUNT', DEAD, '-inf', '(+inf')
local held = redis.call('ZCOUNT', DEAD_INFLIGHT, '(' .. now, '+inf')
if total <= held then
  return out
end
local window = redis.call('ZRANGEBYSCORE', DEAD, '-inf', '(+inf', 'WITHSCORES', 'LIMIT', 0,
  limit + held)
local names = {}
for i = 1, #window, 2 do
  names[#names + 1] = window[i]
end
local leases = presence(DEAD_INFLIGHT, names)
local picked, ats = {}, {}
for i, member in ipairs(names) do
  if #picked >= limit then
    break
  end
  local until_ms = leases[i] and tonumber(leases[i])
  if not until_ms or until_ms <= now then
    picked[#picked + 1] = member
    ats[#ats + 1] = window[2 * i]
  end
end
if #picked == 0 then
  return out
end
local reasons = hmget(DEAD_REASONS, picked)
local hash = ARGV[3] == '1'
local largest = tonumber(ARGV[4]) or 0
for i, member in ipairs(picked) do
  redis.call('ZADD', DEAD_INFLIGHT, deadline, member)
  out[#out + 1] = member
  out[#out + 1] = ats[i]
  out[#out + 1] = reasons[i] or ''
  if hash then
    local size = redis.call('HSTRLEN', BODIES, member)
    if size == 0 and redis.call('HEXISTS', BODIES, member) == 0 then
      out[#out + 1] = 0
    elseif largest > 0 and size > largest then
      out[#out + 1] = size
    else
      out[#out + 1] = redis.call('HGET', BODIES, member)
    end
  end
end
return out
