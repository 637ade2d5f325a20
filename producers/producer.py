#!/usr/bin/env python3
"""Producing for delay-bridge with redis-py: copy the functions, or run it as a command.

    producer.py schedule KEY ID BODY DUE_MS   # hash payload mode: the body under an id
    producer.py reschedule KEY ID DUE_MS      # prints 1 if the id was scheduled (now due then), else 0
    producer.py cancel KEY ID                 # prints 1 if the id was scheduled, else 0
    producer.py add KEY MEMBER DUE_MS         # inline mode: the member is the message

DUE_MS is a Unix epoch time in milliseconds (a past one means now). Redis is REDIS_URL,
redis://127.0.0.1:6379/0 by default, or with REDIS_CLUSTER=redis://host:port[,...] a Redis
Cluster. For a trigger with `shards = N`, set SHARDS=N: KEY is then the trigger's key and each
command goes to the member's shard. Needs `pip install redis`.
"""

import os
import sys
import zlib

import redis

# src/redis/scripts/cancel.lua, verbatim (tests/it/producers.rs checks that it still is).
CANCEL_LUA = r"""-- Cancel a message scheduled by id (hash payload mode): the producers' script, also run by
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
"""


def derived(key, suffix):
    """The bridge's key `suffix` of `key` (src/keys.rs): `K:bodies` when K has a non-empty
    {hash tag}, `{K}:bodies` when it has no braces, so every key stays in K's cluster slot."""
    open_ = key.find("{")
    if open_ != -1 and key.find("}", open_ + 1) > open_ + 1:
        return f"{key}:{suffix}"
    if "{" in key or "}" in key:
        raise ValueError(f"key {key!r} has braces but no usable {{tag}}")
    return f"{{{key}}}:{suffix}"


def shard_key(key, member, shards):
    """The key of `member`'s shard (src/keys.rs) when the trigger has `shards` shards: CRC32
    (zlib's, IEEE) of the member's bytes (the id in hash payload mode) modulo `shards`, written
    inside the key's {hash tag}: shard 3 of `delay:{orders}` is `delay:{orders:3}`."""
    if shards <= 1:
        return key
    open_ = key.find("{")
    close = key.find("}", open_ + 1) if open_ != -1 else -1
    if close <= open_ + 1:
        raise ValueError(f"a sharded key needs a {{hash tag}}: {key!r}")
    data = member.encode() if isinstance(member, str) else member
    return f"{key[:close]}:{zlib.crc32(data) % shards}{key[close:]}"


def schedule(r, key, job_id, body, due_ms):
    """Hash payload mode: body and id in one transaction, so the bridge never sees one alone."""
    with r.pipeline(transaction=True) as tx:
        tx.hset(derived(key, "bodies"), job_id, body)
        tx.zadd(key, {job_id: due_ms})
        tx.execute()


def reschedule(r, key, job_id, due_ms):
    """True if the id was scheduled and now has the new due time. XX: only an id still
    scheduled moves; a cancelled, delivered or only claimed one is not revived (False)."""
    return r.zadd(key, {job_id: due_ms}, xx=True, ch=True) == 1


def cancel(r, key, job_id):
    """True if the id was scheduled. A copy the bridge has already claimed may still arrive."""
    keys = [key] + [derived(key, s) for s in ("inflight", "dead", "bodies")]
    return r.eval(CANCEL_LUA, len(keys), *keys, job_id) == 1


def add(r, key, member, due_ms):
    """Inline mode: the member is the message itself."""
    r.zadd(key, {member: due_ms})


def main(argv):
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    arity = {"schedule": 4, "reschedule": 3, "cancel": 2, "add": 3}
    if arity.get(command) != len(args) or (command != "cancel" and not is_int(args[-1])):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        r = connect()
        args[0] = shard_key(args[0], args[1], int(os.environ.get("SHARDS", "1")))
        if command == "schedule":
            key, job_id, body, due_ms = args
            schedule(r, key, job_id, body, int(due_ms))
        elif command == "reschedule":
            key, job_id, due_ms = args
            print(1 if reschedule(r, key, job_id, int(due_ms)) else 0)
        elif command == "cancel":
            key, job_id = args
            print(1 if cancel(r, key, job_id) else 0)
        else:
            key, member, due_ms = args
            add(r, key, member, int(due_ms))
    except (ValueError, redis.RedisError) as e:
        print(f"producer.py {command}: {e}", file=sys.stderr)
        return 1
    return 0


def connect():
    """REDIS_CLUSTER's cluster, else REDIS_URL's server."""
    cluster = os.environ.get("REDIS_CLUSTER")
    if cluster:
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [redis.connection.parse_url(u.strip()) for u in cluster.split(",")]
        return RedisCluster(startup_nodes=[ClusterNode(n["host"], n.get("port", 6379)) for n in nodes])
    return redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))


def is_int(text):
    return text.lstrip("-").isdigit()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
