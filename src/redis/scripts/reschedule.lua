-- Reschedule: give scheduled members a new due time (ARGV[1] ms, or "" for now), only
-- members already in the source set (`ZADD XX`). With ARGV[2] = "earlier" a member only
-- moves earlier (promote: due now unless it already is). A failed-attempt entry of the
-- member's copy moves with it, so its attempts still count.
-- KEYS: the queue's eight keys (see prelude)   ARGV: due ms or "", "earlier" or "", member...
-- Reply: {members whose due time changed, now}
local now, bad = begin()
if bad then
  return bad
end
local due = now
if ARGV[1] ~= '' then
  local n, malformed = number_arg(1, 'due time')
  if malformed then
    return malformed
  end
  due = n
end
local changed = 0
for i = 3, #ARGV do
  local member = ARGV[i]
  local old = redis.call('ZSCORE', SOURCE, member)
  if old and (ARGV[2] ~= 'earlier' or tonumber(old) > due) and tonumber(old) ~= due then
    local failed = failures(ATTEMPTS, member, old)
    redis.call('ZADD', SOURCE, 'XX', due, member)
    if failed > 0 then
      set_failures(ATTEMPTS, member, failed, due)
    end
    changed = changed + 1
  end
end
return {changed, now}
