-- Recover: members whose lease expired (their worker died or lost its reply) go back to the
-- source set as due now, and the unfinished attempt is counted. A member the producer added
-- again meanwhile keeps the producer's schedule. Then one page of the attempts hash is swept
-- of stale entries (members the producer removed), so no count outlives its member.
-- KEYS: the queue's eight keys (see prelude)   ARGV: most members to recover, sweep cursor ("" for none)
-- Reply: {recovered, next sweep cursor ("0" when a pass ended), entries swept}
local now, args, bad = begin_with({{1, 'recover limit'}})
if bad then
  return bad
end
local limit = args[1]
local items = {}
if limit > 0 then
  items = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now - 1, 'WITHSCORES', 'LIMIT', 0, limit)
end
for j = 1, #items / 2 do
  local member, lease = items[2 * j - 1], items[2 * j]
  local count = failures(ATTEMPTS, member, lease) + 1
  redis.call('ZREM', INFLIGHT, member)
  if redis.call('ZADD', SOURCE, 'NX', now, member) == 1 then
    set_failures(ATTEMPTS, member, count, now)
  else
    redis.call('HDEL', ATTEMPTS, member)
  end
end

local cursor, swept = '0', 0
if ARGV[2] ~= '' then
  local page = redis.call('HSCAN', ATTEMPTS, ARGV[2], 'COUNT', 200)
  cursor = page[1]
  local fields = page[2]
  for j = 1, #fields / 2 do
    local member, v = fields[2 * j - 1], fields[2 * j]
    local at = tonumber(string.match(v, '^%d+:(.+)$'))
    local live = false
    if at then
      local s = redis.call('ZSCORE', SOURCE, member)
      local l = redis.call('ZSCORE', INFLIGHT, member)
      live = (s and tonumber(s) == at) or (l and tonumber(l) == at)
    end
    if not live then
      redis.call('HDEL', ATTEMPTS, member)
      swept = swept + 1
    end
  end
end
return {#items / 2, cursor, swept}
