#!/usr/bin/env node
// Producing for delay-bridge with node-redis v4: copy the functions, or run it as a command.
// Redis is REDIS_URL, redis://127.0.0.1:6379/0 by default, or with
// REDIS_CLUSTER=redis://host:port[,...] a Redis Cluster. For a trigger with `shards = N`, set
// SHARDS=N: KEY is then the trigger's key and each command goes to the member's shard.
// Needs Node.js 20.15 or later (zlib.crc32) and `npm install redis@4` (here: `npm install
// --prefix producers`, from package.json).
'use strict';

const USAGE = `usage: node producer.js schedule KEY ID BODY DUE_MS   # hash payload mode: the body under an id
       node producer.js reschedule KEY ID DUE_MS      # prints 1 if the id was scheduled (now due then), else 0
       node producer.js cancel KEY ID                 # prints 1 if the id was scheduled, else 0
       node producer.js add KEY MEMBER DUE_MS         # inline mode: the member is the message
DUE_MS is a Unix epoch time in milliseconds (a past one means now).`;

const zlib = require('zlib');
const { createClient, createCluster } = require('redis');

// src/redis/scripts/cancel.lua, verbatim (tests/it/producers.rs checks that it still is).
const CANCEL_LUA = `-- Cancel a message scheduled by id (hash payload mode): the producers' script, also run by
-- \`delay-bridge cancel --id\`. Removes the id from the source set, and its body unless a copy
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
`;

// The bridge's key `suffix` of `key` (src/keys.rs): `K:bodies` when K has a non-empty
// {hash tag}, `{K}:bodies` when it has no braces, so every key stays in K's cluster slot.
function derived(key, suffix) {
  const open = key.indexOf('{');
  if (open !== -1 && key.indexOf('}', open + 1) > open + 1) return `${key}:${suffix}`;
  if (/[{}]/.test(key)) throw new Error(`key '${key}' has braces but no usable {tag}`);
  return `{${key}}:${suffix}`;
}

// The key of `member`'s shard (src/keys.rs) when the trigger has `shards` shards: CRC32 (IEEE,
// as zlib's) of the member's UTF-8 bytes (the id in hash payload mode) modulo `shards`, written
// inside the key's {hash tag}: shard 3 of `delay:{orders}` is `delay:{orders:3}`.
function shardKey(key, member, shards) {
  if (shards <= 1) return key;
  const open = key.indexOf('{');
  const close = open === -1 ? -1 : key.indexOf('}', open + 1);
  if (close <= open + 1) throw new Error(`a sharded key needs a {hash tag}: '${key}'`);
  const shard = zlib.crc32(Buffer.from(member, 'utf8')) % shards;
  return `${key.slice(0, close)}:${shard}${key.slice(close)}`;
}

// Hash payload mode: body and id in one transaction, so the bridge never sees one alone.
async function schedule(client, key, id, body, dueMs) {
  await client
    .multi()
    .hSet(derived(key, 'bodies'), id, body)
    .zAdd(key, { score: dueMs, value: id })
    .exec();
}

// XX: only moves an id still scheduled; a cancelled or delivered one is not revived.
// True if the id was scheduled and now has the new due time. XX: only an id still scheduled
// moves; a cancelled, delivered or only claimed one is not revived (false).
async function reschedule(client, key, id, dueMs) {
  return (await client.zAdd(key, { score: dueMs, value: id }, { XX: true, CH: true })) === 1;
}

// True if the id was scheduled. A copy the bridge has already claimed may still arrive.
async function cancel(client, key, id) {
  const keys = [key, derived(key, 'inflight'), derived(key, 'dead'), derived(key, 'bodies')];
  return (await client.eval(CANCEL_LUA, { keys, arguments: [id] })) === 1;
}

// Inline mode: the member is the message itself.
async function add(client, key, member, dueMs) {
  await client.zAdd(key, { score: dueMs, value: member });
}

// Each command is idempotent. A cluster client that still answers MOVED after following the
// redirections itself (its slot map read from a node that had not caught up with a change)
// is given one more try a moment later.
async function movedOnceMore(run) {
  try {
    return await run();
  } catch (e) {
    if (!String(e.message).startsWith('MOVED')) throw e;
    await new Promise((resolve) => setTimeout(resolve, 500));
    return run();
  }
}

async function main(argv) {
  const [command, ...args] = argv;
  const arity = { schedule: 4, reschedule: 3, cancel: 2, add: 3 };
  const due = Number(args[args.length - 1]);
  if (arity[command] !== args.length || (command !== 'cancel' && !/^-?\d+$/.test(args.at(-1)))) {
    console.error(USAGE);
    return 2;
  }
  // A one-shot command: fail at once rather than reconnect forever.
  const client = process.env.REDIS_CLUSTER
    ? createCluster({
        rootNodes: process.env.REDIS_CLUSTER.split(',').map((url) => ({ url: url.trim() })),
        defaults: { socket: { reconnectStrategy: false } },
      })
    : createClient({
        url: process.env.REDIS_URL || 'redis://127.0.0.1:6379/0',
        socket: { reconnectStrategy: false },
      });
  client.on('error', () => {}); // the failing command reports it
  try {
    await client.connect();
    args[0] = shardKey(args[0], args[1], Number(process.env.SHARDS || 1));
    const run = () => {
      if (command === 'schedule') return schedule(client, args[0], args[1], args[2], due);
      if (command === 'reschedule') return reschedule(client, args[0], args[1], due);
      if (command === 'cancel') return cancel(client, args[0], args[1]);
      return add(client, args[0], args[1], due);
    };
    const done = await movedOnceMore(run);
    if (command === 'reschedule' || command === 'cancel') console.log(done ? 1 : 0);
  } catch (e) {
    console.error(`producer.js ${command}: ${e.message}`);
    return 1;
  } finally {
    if (client.isOpen !== false) await client.quit().catch(() => {});
  }
  return 0;
}

module.exports = { CANCEL_LUA, derived, shardKey, schedule, reschedule, cancel, add };

if (require.main === module) main(process.argv.slice(2)).then((code) => (process.exitCode = code));
