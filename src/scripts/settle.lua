-- Settle one claimed batch in one call: ack the confirmed members, fail the rejected
-- ones (retry later or dead-letter), and put back the ones that were never tried.
-- Fail and put-back act only on members still leased with this batch's deadline, so a
-- worker whose lease expired cannot undo another worker's claim.
-- KEYS: source, inflight, attempts, dead, dead_reasons
-- ARGV: deadline, max_attempts, n_ack, n_fail, n_back,
--       n_ack x member, n_fail x (member, delay_ms, reason, permanent 0|1), n_back x (member, due_score)
-- Reply: {acked, put_back, outcome per failed member: 0 not ours, 1 retried, 2 dead-lettered}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[2])
local n_ack, n_fail, n_back = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local i = 6

local acked = 0
local chunk = {}
local function flush_acks()
  if #chunk > 0 then
    acked = acked + redis.call('ZREM', KEYS[2], unpack(chunk))
    redis.call('HDEL', KEYS[3], unpack(chunk))
    chunk = {}
  end
end
for _ = 1, n_ack do
  chunk[#chunk + 1] = ARGV[i]
  i = i + 1
  if #chunk >= 1000 then
    flush_acks()
  end
end
flush_acks()

local function owned(member)
  local score = redis.call('ZSCORE', KEYS[2], member)
  return score and tonumber(score) == deadline
end

local out = {acked, 0}
for _ = 1, n_fail do
  local member, delay, reason, permanent = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3] == '1'
  i = i + 4
  if owned(member) then
    redis.call('ZREM', KEYS[2], member)
    local failures = redis.call('HINCRBY', KEYS[3], member, 1)
    if permanent or failures >= max_attempts then
      redis.call('HDEL', KEYS[3], member)
      redis.call('ZADD', KEYS[4], now, member)
      redis.call('HSET', KEYS[5], member, cjson.encode({reason = reason, attempts = failures, at = now}))
      out[#out + 1] = 2
    else
      redis.call('ZADD', KEYS[1], 'NX', now + delay, member)
      out[#out + 1] = 1
    end
  else
    out[#out + 1] = 0
  end
end

for _ = 1, n_back do
  local member, due = ARGV[i], ARGV[i + 1]
  i = i + 2
  if owned(member) then
    redis.call('ZREM', KEYS[2], member)
    redis.call('ZADD', KEYS[1], 'NX', due, member)
    out[2] = out[2] + 1
  end
end
return out
