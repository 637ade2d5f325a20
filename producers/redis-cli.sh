#!/usr/bin/env bash
# Producing for delay-bridge with redis-cli: copy the functions, or run it as a command.
# Redis is REDIS_URL, redis://127.0.0.1:6379/0 by default, or with
# REDIS_CLUSTER=redis://host:port[,...] a Redis Cluster. For a trigger with `shards = N`, set
# SHARDS=N: KEY is then the trigger's key and each command goes to the member's shard.
# Needs bash, redis-cli, gzip and GNU od.

USAGE='usage: redis-cli.sh schedule KEY ID BODY DUE_MS   # hash payload mode: the body under an id
       redis-cli.sh reschedule KEY ID DUE_MS      # prints 1 if the id was scheduled (now due then), else 0
       redis-cli.sh cancel KEY ID                 # prints 1 if the id was scheduled, else 0
       redis-cli.sh add KEY MEMBER DUE_MS         # inline mode: the member is the message
DUE_MS is a Unix epoch time in milliseconds (a past one means now).'

# src/redis/scripts/cancel.lua, verbatim (tests/it/producers.rs checks that it still is).
CANCEL_LUA=$(cat <<'LUA'
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
)

# -e: an error reply is a failure (exit 1), not just printed. -c: follow a cluster's redirections.
rcli() {
  if [[ -n ${REDIS_CLUSTER:-} ]]; then
    redis-cli -e -c -u "${REDIS_CLUSTER%%,*}" "$@"
  else
    redis-cli -e -u "${REDIS_URL:-redis://127.0.0.1:6379/0}" "$@"
  fi
}

# CRC32 (IEEE, as zlib's) of the bytes of $1: the first four bytes of gzip's trailer.
crc32() { printf '%s' "$1" | gzip -c | tail -c8 | od --endian=little -An -tu4 -N4 | tr -d ' '; }

# The key of MEMBER's shard (src/keys.rs) when the trigger has SHARDS shards: CRC32 of the
# member's bytes (the id in hash payload mode) modulo SHARDS, written inside the key's
# {hash tag}: shard 3 of `delay:{orders}` is `delay:{orders:3}`.
shard_key() {
  local key=$1 member=$2 shards=$3
  if ((shards <= 1)); then
    printf '%s' "$key"
    return
  fi
  local head=${key%%\{*} after_open=${key#*\{}
  if [[ $key != *\{* || $after_open != *\}* || ${after_open%%\}*} == "" ]]; then
    echo "a sharded key needs a {hash tag}: '$key'" >&2
    return 1
  fi
  local crc
  crc=$(crc32 "$member") || return 1
  printf '%s{%s:%s}%s' "$head" "${after_open%%\}*}" "$((crc % shards))" "${after_open#*\}}"
}

# The bridge's key SUFFIX of KEY (src/keys.rs): `K:bodies` when K has a non-empty {hash tag},
# `{K}:bodies` when it has no braces, so every key stays in K's cluster slot.
derived() {
  local key=$1 suffix=$2
  local after_open=${key#*\{} # what follows the first `{`
  if [[ $key == *\{* && $after_open == *\}* && ${after_open%%\}*} != "" ]]; then
    printf '%s:%s' "$key" "$suffix"
  elif [[ $key == *[{}]* ]]; then
    echo "key '$key' has braces but no usable {tag}" >&2
    return 1
  else
    printf '{%s}:%s' "$key" "$suffix"
  fi
}

# Hash payload mode: body and id in one script call, atomic, so the bridge never sees one
# alone; one command, so that it also goes through a cluster's redirections (both keys share
# the key's hash tag, so they are in one slot).
SCHEDULE_LUA="redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])"
schedule() {
  local key=$1 id=$2 body=$3 due_ms=$4 bodies
  bodies=$(derived "$key" bodies) || return 1
  rcli EVAL "$SCHEDULE_LUA" 2 "$bodies" "$key" "$id" "$body" "$due_ms" >/dev/null
}

# XX: only moves an id still scheduled; a cancelled or delivered one is not revived.
reschedule() { rcli ZADD "$1" XX CH "$3" "$2"; }

# Prints 1 if the id was scheduled, else 0. A copy the bridge has already claimed may still arrive.
cancel() {
  local key=$1 id=$2 inflight dead bodies
  inflight=$(derived "$key" inflight) && dead=$(derived "$key" dead) &&
    bodies=$(derived "$key" bodies) || return 1
  rcli EVAL "$CANCEL_LUA" 4 "$key" "$inflight" "$dead" "$bodies" "$id"
}

# Inline mode: the member is the message itself.
add() { rcli ZADD "$1" "$3" "$2" >/dev/null; }

main() {
  case "${1:-}:$(($# - 1))" in
    schedule:4 | reschedule:3 | add:3) [[ ${!#} =~ ^-?[0-9]+$ ]] || set -- usage ;;
    cancel:2) ;;
    *) set -- usage ;;
  esac
  if [[ $1 == usage ]]; then
    echo "$USAGE" >&2
    return 2
  fi
  local key
  key=$(shard_key "$2" "$3" "${SHARDS:-1}") || return 1
  "$1" "$key" "${@:3}"
}

# Run as a command, not when sourced for its functions.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
