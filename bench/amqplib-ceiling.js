#!/usr/bin/env node
// RabbitMQ's ceiling measured by a Node client, for `delay-bridge bench`: amqplib publishing
// the bridge's messages (persistent, mandatory, the same size, id and headers) on confirm
// channels of one connection, at most WINDOW of them unconfirmed on all channels together.
//
//   node amqplib-ceiling.js URL EXCHANGE ROUTING_KEY CHANNELS WINDOW PAYLOAD_BYTES
//
// Prints `ready` once its channels are open. Then each line `BASE COUNT DUE_MS` on its input
// publishes COUNT messages whose payloads start with BASE, BASE+1, ... in 16 decimal digits,
// and answers one line once the broker confirmed every one of them: `ok` or `failed WHY` (a
// nack, a returned message, a closed channel). It ends at the end of its input. amqplib is
// found through NODE_PATH (the bench points it at producers/node_modules).
'use strict';

const amqp = require('amqplib');
const readline = require('readline');

const SEQ_DIGITS = 16;
const TRIGGER = 'bench';

function payload(seq, bytes) {
  return Buffer.from(String(seq).padStart(SEQ_DIGITS, '0').padEnd(Math.max(bytes, SEQ_DIGITS), '.'));
}

// Publishes COUNT messages from BASE, keeping at most WINDOW unconfirmed; resolves with
// null once every one is confirmed, or with why not.
function publishAll(ctx, base, count, dueMs) {
  return new Promise((resolve) => {
    let sent = 0;
    let settled = 0;
    let inFlight = 0;
    let turn = 0;
    const finish = () => {
      const why = ctx.failure || (ctx.returned > 0 ? `the broker returned ${ctx.returned} messages` : null);
      resolve(why);
    };
    const onConfirm = (err) => {
      inFlight--;
      settled++;
      if (err && !ctx.failure) ctx.failure = `the broker nacked a message: ${err.message || err}`;
      if (ctx.failure) {
        // No more publishes: done once the ones out are answered.
        if (inFlight === 0) finish();
      } else if (settled === count) {
        finish();
      } else {
        pump();
      }
    };
    const pump = () => {
      while (inFlight < ctx.window && sent < count) {
        const seq = base + sent;
        sent++;
        inFlight++;
        const channel = ctx.channels[turn++ % ctx.channels.length];
        channel.publish(ctx.exchange, ctx.routingKey, payload(seq, ctx.bytes), {
          persistent: true,
          mandatory: true,
          // The bridge's ids are 16 hex digits: the same size on the wire.
          messageId: seq.toString(16).padStart(16, '0'),
          headers: {
            'x-delay-trigger': TRIGGER,
            'x-delay-due-ms': { '!': 'int64', value: dueMs },
            'x-delay-attempt': { '!': 'int64', value: 1 },
          },
        }, onConfirm);
      }
    };
    if (count === 0) {
      finish();
    } else {
      pump();
    }
  });
}

async function main(argv) {
  if (argv.length !== 6) {
    console.error('usage: node amqplib-ceiling.js URL EXCHANGE ROUTING_KEY CHANNELS WINDOW PAYLOAD_BYTES');
    process.exit(2);
  }
  const [url, exchange, routingKey, channels, window, bytes] = argv;
  const connection = await amqp.connect(url, { clientProperties: { connection_name: 'delay-bridge-bench/amqplib-ceiling' } });
  const ctx = { exchange, routingKey, window: Number(window), bytes: Number(bytes), channels: [], returned: 0, failure: null };
  for (let i = 0; i < Math.max(1, Number(channels)); i++) {
    const channel = await connection.createConfirmChannel();
    channel.on('return', () => { ctx.returned++; });
    channel.on('error', (err) => { ctx.failure = ctx.failure || `a channel closed: ${err.message}`; });
    ctx.channels.push(channel);
  }
  console.log('ready');
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [base, count, dueMs] = line.trim().split(/\s+/).map(Number);
    ctx.returned = 0;
    const why = await publishAll(ctx, base, count, dueMs);
    console.log(why ? `failed ${why}` : 'ok');
  }
  for (const channel of ctx.channels) await channel.close().catch(() => {});
  await connection.close();
}

main(process.argv.slice(2)).catch((err) => {
  console.error(err);
  process.exit(1);
});
