#!/usr/bin/env node
// Writing a delayed record to delay-bridge's Kafka ingress with KafkaJS: copy the function,
// or run it as a command:
//
//   node delayed_kafkajs.js TOPIC KEY VALUE DELAY_MS
//
// TOPIC is a trigger's `[triggers.ingress] topic`. The record is due DELAY_MS milliseconds
// after the bridge reads it (an `x-delay` header, as text), and is then produced to the
// trigger's topic with KEY, VALUE and its other headers; `delay-bridge cancel -t TRIGGER
// TOPIC/PARTITION/OFFSET` cancels it (the command prints where the record landed). The
// brokers are KAFKA_BROKERS, 127.0.0.1:9092 by default. Needs `npm install kafkajs` (here:
// `npm install --prefix producers`, from package.json).
'use strict';

const { Kafka, Partitioners } = require('kafkajs');

// Writes one record to be delivered `delayMs` milliseconds later; resolves once every
// in-sync replica has it (acks -1), with where it landed.
async function produceDelayed(producer, topic, key, value, delayMs, headers = {}) {
  const [landed] = await producer.send({
    topic,
    acks: -1,
    messages: [{ key, value, headers: { ...headers, 'x-delay': String(delayMs) } }],
  });
  return landed;
}

async function main(argv) {
  if (argv.length !== 4) {
    console.error('usage: node delayed_kafkajs.js TOPIC KEY VALUE DELAY_MS');
    process.exit(2);
  }
  const [topic, key, value, delay] = argv;
  const brokers = (process.env.KAFKA_BROKERS || '127.0.0.1:9092').split(',');
  const kafka = new Kafka({ clientId: 'delayed-kafkajs', brokers });
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  try {
    const landed = await produceDelayed(producer, topic, key, value, Number(delay));
    console.log(`${topic}/${landed.partition}/${landed.baseOffset}`);
  } finally {
    await producer.disconnect();
  }
}

module.exports = { produceDelayed };

if (require.main === module) {
  main(process.argv.slice(2)).catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
