#!/usr/bin/env bash
# Producing for delay-bridge with redis-cli: copy the functions, or run it as a command.
# Redis is REDIS_URL, redis://127.0.0.1:6379/0 by default.

USAGE='usage: redis-cli.sh schedule KEY ID BODY DUE_MS   # hash payload mode: the body under an id
       redis-cli.sh reschedule KEY ID DUE_MS      # prints 1 if the id was scheduled (now due then), else 0
       redis-cli.sh cancel KEY ID                 # prints 1 if the id was scheduled, else 0
       redis-cli.sh add KEY MEMBER DUE_MS         # inline mode: the member is the message
DUE_MS is a Unix epoch time in milliseconds (a past one means now).'

# src/scripts/cancel.lua, verbatim (tests/producers.rs checks that it still is).
CANCEL_LUA=$(cat <<'LUA'
-- Cancel a message scheduled by id (hash payload mode): the producers' script, also run by
-- `delay-bridge cancel --id`. Removes the id from the source set, and its body unless a copy
-- of the id is in flight or dead-lettered (that copy may still be delivered or requeued and
-- needs the body). A copy already claimed may still be delivered. The keys' types are
-- checked and both copies looked up before the one write that can fail, so an error
-- changes nothing.
-- KEYS: source, inflight, dead, bodies   ARGV: id
-- Reply: 1 if the id was scheduled, else 0
local want = {'zset', 'zset', 'zset', 'hash'}
for i = 1, 4 do
  local got = redis.call('TYPE', KEYS[i])['ok']
  if got ~= 'none' and got ~= want[i] then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. got ..
      ' where delay-bridge needs a ' .. want[i] .. '; rename or delete it')
  end
end
local held = redis.call('ZSCORE', KEYS[2], ARGV[1]) or redis.call('ZSCORE', KEYS[3], ARGV[1])
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 and not held then
  redis.call('HDEL', KEYS[4], ARGV[1])
end
return removed
LUA
)

# -e: an error reply is a failure (exit 1), not just printed.
rcli() { redis-cli -e -u "${REDIS_URL:-redis://127.0.0.1:6379/0}" "$@"; }

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

# One argument for redis-cli's command reader: every byte as \xHH inside double quotes, so
# spaces, quotes and newlines in a body survive.
quoted() { printf '"%s"' "$(printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n' | sed 's/../\\x&/g')"; }

# Hash payload mode: body and id in one transaction, so the bridge never sees one alone. A
# transaction needs one connection, so the commands go through redis-cli's standard input;
# it prints each reply and always exits 0, so the replies are checked here.
schedule() {
  local key=$1 id=$2 body=$3 due_ms=$4 bodies replies
  bodies=$(derived "$key" bodies) || return 1
  replies=$(rcli --no-raw <<EOF
MULTI
HSET $(quoted "$bodies") $(quoted "$id") $(quoted "$body")
ZADD $(quoted "$key") $(quoted "$due_ms") $(quoted "$id")
EXEC
EOF
  ) || return 1
  if [[ $replies != $'OK\nQUEUED\nQUEUED\n1) (integer) '[01]$'\n2) (integer) '[01] ]]; then
    echo "schedule failed: $replies" >&2
    return 1
  fi
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
  "$@"
}

# Run as a command, not when sourced for its functions.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  main "$@"
fi
