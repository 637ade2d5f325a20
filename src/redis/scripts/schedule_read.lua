-- Reads schedule marks (read only): the Redis clock and, for each schedule named, its mark
-- (`tick|member`, or '' for none) and whether the mark's message still waits unclaimed.
-- KEYS: the queue's eight keys (see prelude), then the hash of the trigger's schedule marks
-- ARGV: schedule names
-- Reply: {now, then per name: mark, 1 if waiting else 0}
local MARKS = KEYS[9]
local marks_type = redis.call('TYPE', MARKS)['ok']
if marks_type ~= 'none' and marks_type ~= 'hash' then
  return redis.error_reply('WRONGTYPE key ' .. MARKS .. ' holds a ' .. marks_type ..
    ' where delay-bridge needs a hash; rename or delete it')
end
local out = {now_ms()}
for _, name in ipairs(ARGV) do
  local stored = redis.call('HGET', MARKS, name) or ''
  local waiting = 0
  local bar = string.find(stored, '|', 1, true)
  if bar and redis.call('TYPE', SOURCE)['ok'] == 'zset' then
    local score = redis.call('ZSCORE', SOURCE, string.sub(stored, bar + 1))
    if score and tonumber(score) == tonumber(string.sub(stored, 1, bar - 1)) then
      waiting = 1
    end
  end
  out[#out + 1] = stored
  out[#out + 1] = waiting
end
return out
