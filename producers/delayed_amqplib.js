#!/usr/bin/env node
// Publishing a delayed message to delay-bridge's RabbitMQ ingress with amqplib: copy the
// function, or run it as a command:
//
//   node delayed_amqplib.js EXCHANGE ROUTING_KEY BODY DELAY_MS [MESSAGE_ID]
//
// EXCHANGE is a trigger's `[triggers.ingress] exchange` (the bridge declares it). The message
// is due DELAY_MS milliseconds after the bridge takes it in, as with the delayed-message
// plugin's `x-delay`, and is then published to the trigger's exchange with ROUTING_KEY and
// these properties. With a MESSAGE_ID, `delay-bridge cancel -t TRIGGER MESSAGE_ID` cancels it,
// and publishing it twice stores it once. RabbitMQ is AMQP_URL,
// amqp://guest:guest@127.0.0.1:5672/%2f by default. Needs `npm install amqplib` (here:
// `npm install --prefix producers`, from package.json).
'use strict';

const amqp = require('amqplib');

// Publishes `body` to be delivered `delayMs` milliseconds later on a confirm channel
// (`connection.createConfirmChannel()`); resolves once the broker has the message.
async function publishDelayed(channel, exchange, routingKey, body, delayMs, messageId, headers = {}) {
  const options = {
    persistent: true,
    mandatory: true,
    messageId,
    headers: { ...headers, 'x-delay': delayMs },
  };
  await new Promise((resolve, reject) => {
    channel.publish(exchange, routingKey, Buffer.from(body), options, (err) => (err ? reject(err) : resolve()));
  });
}

async function main(argv) {
  if (argv.length < 4 || argv.length > 5) {
    console.error('usage: node delayed_amqplib.js EXCHANGE ROUTING_KEY BODY DELAY_MS [MESSAGE_ID]');
    process.exit(2);
  }
  const [exchange, routingKey, body, delay, messageId] = argv;
  const connection = await amqp.connect(process.env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672/%2f');
  try {
    const channel = await connection.createConfirmChannel();
    // A mandatory message no queue takes comes back: fail rather than lose it.
    channel.on('return', () => {
      console.error(`no queue is bound to ${exchange}: is the bridge running with this ingress?`);
      process.exitCode = 1;
    });
    await publishDelayed(channel, exchange, routingKey, body, Number(delay), messageId);
    await channel.close();
  } finally {
    await connection.close();
  }
}

module.exports = { publishDelayed };

if (require.main === module) {
  main(process.argv.slice(2)).catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
