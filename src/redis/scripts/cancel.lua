-- Cancel a message scheduled by id (hash payload mode): the producers' script, also run by
-- `delay-bridge cancel --id`. Removes the id from the source set, and its body unless a copy
-- of the id is in flight or dead-lettered (that copy may still be delivered or requeued and
-- needs the body). A copy already claimed may still be delivered. The keys' types are
-- checked and both copies looked up before the one write that can fail, so an error
-- changes nothing.
-- KEYS: source, inflight, dead, bodies   ARGV: id
-- Reply: 1 if the id was scheduled, else 0
-- Its own four keys (producers pass them; it has no prelude), named once here.
local SOURCE, INFLIGHT, DEAD, BODIES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local want = {'zset', 'zset', 'zset', 'hash'}
for i = 1, 4 do
  local got = redis.call('TYPE', KEYS[i])['ok']
  if got ~= 'none' and got ~= want[i] then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. got ..
      ' where delay-bridge needs a ' .. want[i] .. '; rename or delete it')
  end
end
local held = redis.call('ZSCORE', INFLIGHT, ARGV[1]) or redis.call('ZSCORE', DEAD, ARGV[1])
local removed = redis.call('ZREM', SOURCE, ARGV[1])
if removed == 1 and not held then
  redis.call('HDEL', BODIES, ARGV[1])
end
return removed
