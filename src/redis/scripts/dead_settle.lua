-- Settle forwarded dead letters: each action applies only to a member still leased with this
-- claim's deadline in the dead_inflight set, so a forward whose lease expired, or whose dead
-- letter was requeued, purged or dead-lettered again meanwhile, changes nothing.
--   confirmed: the broker has it: out of the dead-letter set with its reason and lease; in
--     hash mode its body too, unless the id is scheduled again or in flight.
--   kept: the broker has it, but the forwarded message could not carry what a remedy needs
--     (hash mode, `missing_body`: the id alone, which an operator completes in Redis): kept as
--     a dead letter with the score +inf and without a lease, like a refused one.
--   refused: the broker will never take it: kept as a dead letter with the score +inf, which
--     claims never look at (its time stays in its reason), and without a lease.
--   released: not forwarded (shutdown): the lease goes, the next claim takes it again.
-- KEYS: the queue's eight keys (see prelude)
-- ARGV: deadline, hash 0|1, n_confirmed, n_kept, n_refused, n_released, member...
-- Reply: {confirmed, kept, refused, released}
local deadline, malformed = number_arg(1, 'dead-letter deadline')
if malformed then
  return malformed
end
local n_ok, n_kept = tonumber(ARGV[3]), tonumber(ARGV[4])
local n_refused, n_released = tonumber(ARGV[5]), tonumber(ARGV[6])
if not (n_ok and n_kept and n_refused and n_released)
  or #ARGV ~= 6 + n_ok + n_kept + n_refused + n_released then
  return redis.error_reply('ERR dead-letter settle: malformed arguments')
end
local _, bad = begin()
if bad then
  return bad
end
local hash = ARGV[2] == '1'

-- The members of ARGV[first .. first + n - 1] still leased by this claim.
local function owned(first, n)
  local names = argv_list(first, first + n - 1)
  local mine = {}
  for i, score in ipairs(presence(DEAD_INFLIGHT, names)) do
    if score and tonumber(score) == deadline then
      mine[#mine + 1] = names[i]
    end
  end
  return mine
end

local confirmed = owned(7, n_ok)
local kept = owned(7 + n_ok, n_kept)
local refused = owned(7 + n_ok + n_kept, n_refused)
local released = owned(7 + n_ok + n_kept + n_refused, n_released)
if #confirmed > 0 then
  each_chunk('ZREM', DEAD, confirmed)
  each_chunk('HDEL', DEAD_REASONS, confirmed)
  each_chunk('ZREM', DEAD_INFLIGHT, confirmed)
  if hash then
    local scheduled, leased = presence(SOURCE, confirmed), presence(INFLIGHT, confirmed)
    each_chunk('HDEL', BODIES, absent(confirmed, scheduled, leased))
  end
end
for _, set in ipairs({kept, refused}) do
  for _, member in ipairs(set) do
    redis.call('ZADD', DEAD, 'XX', '+inf', member)
  end
  each_chunk('ZREM', DEAD_INFLIGHT, set)
end
each_chunk('ZREM', DEAD_INFLIGHT, released)
return {#confirmed, #kept, #refused, #released}
