#!/usr/bin/env ruby
# frozen_string_literal: true

# Producing for delay-bridge with redis-rb (Debian: ruby-redis): copy the methods, or run it
# as a command. Redis is REDIS_URL, redis://127.0.0.1:6379/0 by default, or with
# REDIS_CLUSTER=redis://host:port[,...] a Redis Cluster. For a trigger with `shards = N`, set
# SHARDS=N: KEY is then the trigger's key and each command goes to the member's shard.

require 'redis'
require 'zlib'

USAGE = <<~TEXT
  usage: ruby producer.rb schedule KEY ID BODY DUE_MS   # hash payload mode: the body under an id
         ruby producer.rb reschedule KEY ID DUE_MS      # prints 1 if the id was scheduled (now due then), else 0
         ruby producer.rb cancel KEY ID                 # prints 1 if the id was scheduled, else 0
         ruby producer.rb add KEY MEMBER DUE_MS         # inline mode: the member is the message
  DUE_MS is a Unix epoch time in milliseconds (a past one means now).
TEXT

# src/redis/scripts/cancel.lua, verbatim (tests/it/producers.rs checks that it still is).
CANCEL_LUA = <<'LUA'
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
LUA

# The bridge's key `suffix` of `key` (src/keys.rs): `K:bodies` when K has a non-empty
# {hash tag}, `{K}:bodies` when it has no braces, so every key stays in K's cluster slot.
def derived(key, suffix)
  open = key.index('{')
  close = open && key.index('}', open + 1)
  return "#{key}:#{suffix}" if close && close > open + 1
  raise ArgumentError, "key '#{key}' has braces but no usable {tag}" if key.match?(/[{}]/)

  "{#{key}}:#{suffix}"
end

# The key of `member`'s shard (src/keys.rs) when the trigger has `shards` shards: CRC32 (zlib's,
# IEEE) of the member's bytes (the id in hash payload mode) modulo `shards`, written inside the
# key's {hash tag}: shard 3 of `delay:{orders}` is `delay:{orders:3}`.
def shard_key(key, member, shards)
  return key if shards <= 1

  open = key.index('{')
  close = open && key.index('}', open + 1)
  raise ArgumentError, "a sharded key needs a {hash tag}: '#{key}'" unless close && close > open + 1

  "#{key[0...close]}:#{Zlib.crc32(member.b) % shards}#{key[close..]}"
end

# Hash payload mode: body and id in one transaction, so the bridge never sees one alone.
def schedule(redis, key, id, body, due_ms)
  redis.multi do |tx|
    tx.hset(derived(key, 'bodies'), id, body)
    tx.zadd(key, due_ms, id)
  end
end

# XX: only moves an id still scheduled; a cancelled or delivered one is not revived.
# True if the id was scheduled and now has the new due time. XX: only an id still scheduled
# moves; a cancelled, delivered or only claimed one is not revived (false).
def reschedule(redis, key, id, due_ms)
  redis.zadd(key, due_ms, id, xx: true, ch: true) ? true : false
end

# True if the id was scheduled. A copy the bridge has already claimed may still arrive.
def cancel(redis, key, id)
  keys = [key, derived(key, 'inflight'), derived(key, 'dead'), derived(key, 'bodies')]
  redis.eval(CANCEL_LUA, keys: keys, argv: [id]) == 1
end

# Inline mode: the member is the message itself.
def add(redis, key, member, due_ms)
  redis.zadd(key, due_ms, member)
end

def main(argv)
  command, *args = argv
  arity = { 'schedule' => 4, 'reschedule' => 3, 'cancel' => 2, 'add' => 3 }
  if arity[command] != args.length || (command != 'cancel' && !args.last.match?(/\A-?\d+\z/))
    warn USAGE
    return 2
  end
  cluster = ENV.fetch('REDIS_CLUSTER', '')
  redis = if cluster.empty?
            Redis.new(url: ENV.fetch('REDIS_URL', 'redis://127.0.0.1:6379/0'))
          else
            Redis.new(cluster: cluster.split(',').map(&:strip))
          end
  args[0] = shard_key(args[0], args[1], Integer(ENV.fetch('SHARDS', '1'), 10))
  case command
  when 'schedule' then schedule(redis, args[0], args[1], args[2], Integer(args[3], 10))
  when 'reschedule' then puts(reschedule(redis, args[0], args[1], Integer(args[2], 10)) ? 1 : 0)
  when 'cancel' then puts(cancel(redis, args[0], args[1]) ? 1 : 0)
  when 'add' then add(redis, args[0], args[1], Integer(args[2], 10))
  end
  0
rescue ArgumentError, Redis::BaseError => e
  warn "producer.rb #{command}: #{e.message}"
  1
end

exit(main(ARGV)) if $PROGRAM_NAME == __FILE__
