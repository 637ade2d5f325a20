-- Shared by every script (prepended by store.rs): the Redis clock, key type checks before
-- any write, chunked multi-member commands, and failed-attempt entries.
--
-- A failed-attempt entry is `count:stamp` in the attempts hash, where `stamp` is the score
-- of the copy it belongs to: the due score of a scheduled member, or the lease deadline of
-- one in flight. An entry whose stamp matches neither is stale: it counts for nothing (so a
-- payload the producer removed and added again starts afresh) and the recover script sweeps it.

-- The Redis clock: epoch ms, and the microseconds past that millisecond.
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us % 1000
end

local function now_ms()
  return (clock())
end

-- Every script takes the queue's eight keys in this one order (`QueueKeys::all`), and names
-- them only through these locals: no script reads `KEYS[n]` itself.
local SOURCE = KEYS[1]        -- zset: scheduled members by due time
local INFLIGHT = KEYS[2]      -- zset: claimed members by lease deadline
local ATTEMPTS = KEYS[3]      -- hash: member -> `count:stamp` of failed attempts
local DEAD = KEYS[4]          -- zset: dead letters by time of death (+inf: kept)
local DEAD_REASONS = KEYS[5]  -- hash: member -> the dead letter's reason (JSON)
local BODIES = KEYS[6]        -- hash: id -> body (hash payload mode only)
local CONTROL = KEYS[7]       -- hash: the operator's pause and the rate limit's state
local DEAD_INFLIGHT = KEYS[8] -- zset: dead letters being forwarded, by lease deadline
local QUEUE_KEYS = {SOURCE, INFLIGHT, ATTEMPTS, DEAD, DEAD_REASONS, BODIES, CONTROL, DEAD_INFLIGHT}
local KEY_TYPES = {'zset', 'zset', 'hash', 'zset', 'hash', 'hash', 'hash', 'zset'}

-- Redis does not roll a script back: every script checks the types of the queue's keys
-- before its first write, so a wrong-typed key fails the call with nothing changed.
local function wrong_type()
  for i, want in ipairs(KEY_TYPES) do
    local got = redis.call('TYPE', QUEUE_KEYS[i])['ok']
    if got ~= 'none' and got ~= want then
      return redis.error_reply('WRONGTYPE key ' .. QUEUE_KEYS[i] .. ' holds a ' .. got ..
        ' where delay-bridge needs a ' .. want .. '; rename or delete it')
    end
  end
  return nil
end

-- The start of every writing script, once its arguments are parsed: the type checks, then
-- the clock. Returns `now`, nil and the microseconds past `now`, or nil and the error to
-- return.
local function begin()
  local bad = wrong_type()
  if bad then
    return nil, bad
  end
  local now, us = clock()
  return now, nil, us
end

-- ARGV[i] as a number, or nil and an error naming `what`.
local function number_arg(i, what)
  local n = tonumber(ARGV[i])
  if n then
    return n, nil
  end
  return nil, redis.error_reply('ERR malformed ' .. what)
end

-- The start of a script that takes numbers: each ARGV[i] of `args` ({i, what} pairs)
-- parsed, then `begin()`. Returns `now` and the numbers in `args`' order, or nil and the
-- error (a malformed number is named before the keys are looked at).
local function begin_with(args)
  local numbers = {}
  for k, a in ipairs(args) do
    local n, malformed = number_arg(a[1], a[2])
    if malformed then
      return nil, nil, malformed
    end
    numbers[k] = n
  end
  local now, bad = begin()
  return now, numbers, bad
end

-- The replies of `cmd key items...` (one per item: a value, or false), 1,000 items per call.
local function per_item(cmd, key, items)
  local out = {}
  for i = 1, #items, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #items) do
      chunk[#chunk + 1] = items[j]
    end
    for _, v in ipairs(redis.call(cmd, key, unpack(chunk))) do
      out[#out + 1] = v
    end
  end
  return out
end

-- Whether each of `members` is in the sorted set `key` (its score string, or false).
-- Scores stay strings: converting them costs more than the lookup.
local function presence(key, members)
  return per_item('ZMSCORE', key, members)
end

-- The value of each of `fields` in the hash `key`, or false.
local function hmget(key, fields)
  return per_item('HMGET', key, fields)
end

-- Runs `cmd key members...` 1,000 members at a time.
local function each_chunk(cmd, key, members)
  for i = 1, #members, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #members) do
      chunk[#chunk + 1] = members[j]
    end
    redis.call(cmd, key, unpack(chunk))
  end
end

-- ARGV[first .. last] as a list (to the end when `last` is nil).
local function argv_list(first, last)
  local list = {}
  for i = first, last or #ARGV do
    list[#list + 1] = ARGV[i]
  end
  return list
end

-- The members of `members` that none of `found` holds: each of `found` is a `presence()`
-- reply for `members`, in their order.
local function absent(members, ...)
  local found = {...}
  local out = {}
  for i, member in ipairs(members) do
    local anywhere = false
    for _, where in ipairs(found) do
      anywhere = anywhere or where[i]
    end
    if not anywhere then
      out[#out + 1] = member
    end
  end
  return out
end

-- Failed attempts recorded for the copy of `member` whose score is `stamp`.
local function failures(attempts, member, stamp)
  local v = redis.call('HGET', attempts, member)
  if not v then
    return 0
  end
  local count, at = string.match(v, '^(%d+):(.+)$')
  if count and tonumber(at) == tonumber(stamp) then
    return tonumber(count)
  end
  return 0
end

-- Records `count` failed attempts for the copy of `member` whose score is `stamp`.
local function set_failures(attempts, member, count, stamp)
  if count > 0 then
    redis.call('HSET', attempts, member, string.format('%d:%.17g', count, tonumber(stamp)))
  else
    redis.call('HDEL', attempts, member)
  end
end


-- The control hash's fields (see README, "Control fields"). `paused`: `1` (what `delay-bridge
-- pause` writes) pauses; `0`, `false`, `no` and an empty value do not; any other value pauses
-- (someone meant to stop the queue). The claim script repairs a value that is not canonical:
-- one that pauses becomes `1`, one that does not is deleted.
local function pause_value(v)
  if not v then
    return false, false
  end
  local lower = string.lower(v)
  if lower == '0' or lower == 'false' or lower == 'no' or lower == '' then
    return false, true
  end
  return true, v ~= '1'
end

-- Whether the control hash `key` pauses the queue (read only: for scripts that do not repair).
local function is_paused(key)
  if redis.call('TYPE', key)['ok'] ~= 'hash' then
    return false
  end
  return (pause_value(redis.call('HGET', key, 'paused')))
end

-- A finite number, or nil (NaN, infinities, anything that is not a number).
local function finite(v)
  local n = tonumber(v)
  if n and n == n and n ~= math.huge and n ~= -math.huge then
    return n
  end
  return nil
end
