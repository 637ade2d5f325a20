//! Cost per message: the bridge's CPU per 100k forwarded messages next to what an independent
//! publisher (amqprs, a plain rdkafka producer, the HTTP client alone) and the claim/settle
//! client alone spend on as many messages, each in a child process, with the Redis server's CPU
//! beside the bridge's and the scripts'.

use delay_bridge::parts::config::SinkConfig;
use delay_bridge::parts::sink::kafka::DEFAULT_PROPERTIES;

use super::*;
use crate::child::{self, ChildRun};
use crate::report::Cost;

/// An independent publisher as a child process: what it is, and its arguments.
pub(super) struct Publisher {
    pub name: &'static str,
    pub args: Vec<String>,
}

impl Bench {
    /// Measures the sink's independent publisher and the claim/settle client on `--messages`
    /// each; `bridge` is the forwarding phase of the same run.
    pub(super) async fn cost(&self, bridge: &Forward) -> anyhow::Result<Cost> {
        let n = self.args.messages;
        let publisher = self.publisher(n)?;
        eprintln!("bench: cost, the {}, {n} messages", publisher.name);
        let producer = child::spawn(&[], publisher.args)
            .await
            .context(publisher.name)?;
        eprintln!("bench: cost, the claim/settle client, {n} messages");
        let (claim_settle, redis) = self.claim_settle_child(n, &[]).await?;
        Ok(Cost {
            publisher_name: publisher.name,
            bridge_cpu_per_100k: bridge.cpu_seconds_per_100k,
            bridge_redis_cpu_per_100k: bridge.redis_cpu_per_100k,
            bridge_msg_per_s: bridge.rate.msg_per_s,
            producer,
            claim_settle,
            claim_settle_redis_cpu_per_100k: redis,
        })
    }

    /// The sink's independent publisher sending `n` messages like the bridge's: the raw amqprs
    /// publisher into the consumed queue, a plain rdkafka producer with the bridge's settings,
    /// or the HTTP ceiling's client POSTing to the bench's endpoint.
    pub(super) fn publisher(&self, n: u64) -> anyhow::Result<Publisher> {
        let sent = [
            format!("--messages={n}"),
            format!("--payload-bytes={}", self.args.payload_bytes),
            format!("--base={}", self.next_base()),
        ];
        let (name, mut args) = match &self.broker {
            crate::Broker::Amqp(b) => {
                let (url, exchange, routing_key) = b.target(false);
                let u = self.unconfirmed();
                let args = vec![
                    "amqprs-publisher".to_string(),
                    format!("--url={url}"),
                    format!("--exchange={exchange}"),
                    format!("--routing-key={routing_key}"),
                    format!("--channels={}", u.channels),
                    format!("--window={}", u.window),
                    format!("--batch={}", self.trigger.batch()),
                ];
                ("amqprs publisher", args)
            }
            crate::Broker::Kafka(kafka) => {
                let SinkConfig::Kafka(sink) = self.sink.settings() else {
                    bail!("the bench sink is not Kafka");
                };
                // As many records awaiting their report as the bridge's workers can hold.
                let window =
                    self.trigger.workers() * delay_bridge::MAX_IN_FLIGHT * self.trigger.batch();
                let mut args = vec![
                    "kafka-producer".to_string(),
                    format!("--brokers={}", self.args.kafka_brokers),
                    format!("--topic={}", kafka.topic()),
                    format!("--window={window}"),
                ];
                // The bridge's settings, then the sink's own properties (`--sink-set`).
                let properties = DEFAULT_PROPERTIES
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .chain(sink.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
                args.extend(properties.map(|(k, v)| format!("--property={k}={v}")));
                ("plain rdkafka producer", args)
            }
            crate::Broker::Http(http) => {
                let args = vec!["http-client".to_string(), format!("--url={}", http.url())];
                ("HTTP client alone", args)
            }
        };
        args.extend(sent);
        Ok(Publisher { name, args })
    }

    /// The claim and settle scripts alone draining `n` members due now, in a child process run
    /// under `wrapper` (nothing, or a profiler's command line), with the Redis server's CPU
    /// per 100k meanwhile.
    pub(super) async fn claim_settle_child(
        &self,
        n: u64,
        wrapper: &[String],
    ) -> anyhow::Result<(ChildRun, Option<f64>)> {
        let key = self.new_key("cost-claim");
        let mut conn = self.conn.clone();
        let due = now_ms() - 1000;
        let shape = self.args.shape();
        redis_ops::load(&mut conn, &shape, &key, &key, self.next_base(), n, |_| due).await?;
        let mut args = vec![
            "claim-settle".to_string(),
            format!("--redis-url={}", self.args.redis_url),
            format!("--key={key}"),
            format!("--workers={}", self.trigger.workers()),
            format!("--batch={}", self.trigger.batch()),
            format!("--messages={n}"),
        ];
        if shape.payload == crate::shape::PayloadArg::Hash {
            args.push("--hash".into());
        }
        let before = redis_ops::server_cpu_seconds(&mut conn).await?;
        let run = child::spawn(wrapper, args)
            .await
            .context("the claim/settle client");
        let after = redis_ops::server_cpu_seconds(&mut conn).await?;
        redis_ops::unlink_queue(&mut conn, &key).await?;
        let redis = before
            .zip(after)
            .map(|(a, b)| (b - a) * 100_000.0 / n as f64);
        Ok((run?, redis))
    }
}
