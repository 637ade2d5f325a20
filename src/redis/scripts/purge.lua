-- Purge: delete up to ARGV[2] (at most 1,000) scheduled members due within [ARGV[3], ARGV[4]]
-- (ARGV[1] = "scheduled"), or the oldest dead letters (ARGV[1] = "dead") with their reasons
-- and forwarding leases.
-- A scheduled member's attempt entry goes with it; in hash mode (ARGV[5] = "1") so does each id's body, unless a
-- copy of the id is still scheduled, in flight or dead. In-flight members are never touched:
-- their batches settle them. The caller repeats until the reply is 0.
-- With ARGV[1] = "dead_reason", the dead letters among the members named from ARGV[7] on whose
-- reason JSON's `reason` is ARGV[6] (the caller read them; each is checked again here).
-- KEYS: the queue's eight keys (see prelude)
-- ARGV: "scheduled", "dead" or "dead_reason", limit, from (ms or "-inf"), to (ms or "+inf"),
-- hash flag, reason, member...
-- Reply: members deleted
local now, args, bad = begin_with({{2, 'purge limit'}})
if bad then
  return bad
end
local limit = math.min(args[1], 1000)
if limit < 1 then
  return 0
end
local members
local from_set
if ARGV[1] == 'dead' then
  from_set = DEAD
  members = redis.call('ZRANGE', DEAD, 0, limit - 1)
elseif ARGV[1] == 'dead_reason' then
  from_set = DEAD
  members = {}
  for i = 7, #ARGV do
    local member = ARGV[i]
    if #members < limit and redis.call('ZSCORE', DEAD, member) then
      local ok, reason = pcall(cjson.decode, redis.call('HGET', DEAD_REASONS, member) or '')
      if ok and type(reason) == 'table' and reason.reason == ARGV[6] then
        members[#members + 1] = member
      end
    end
  end
elseif ARGV[1] == 'scheduled' then
  from_set = SOURCE
  members = redis.call('ZRANGEBYSCORE', SOURCE, ARGV[3], ARGV[4], 'LIMIT', 0, limit)
else
  return redis.error_reply('ERR purge what: scheduled or dead')
end
if #members == 0 then
  return 0
end
each_chunk('ZREM', from_set, members)
if from_set == DEAD then
  each_chunk('HDEL', DEAD_REASONS, members)
  each_chunk('ZREM', DEAD_INFLIGHT, members)
end
-- A purged scheduled copy's attempt entry goes too; a copy in flight keeps its own (an
-- entry belongs to the copy whose score it names). Dead letters keep their count in their
-- reason, not in an entry.
local leased = presence(INFLIGHT, members)
if from_set == SOURCE then
  each_chunk('HDEL', ATTEMPTS, absent(members, leased))
end
if ARGV[5] == '1' then
  local other = SOURCE
  if from_set == SOURCE then
    other = DEAD
  end
  each_chunk('HDEL', BODIES, absent(members, leased, presence(other, members)))
end
return #members
