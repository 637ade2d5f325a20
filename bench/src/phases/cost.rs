//! Cost per message: the bridge's CPU per 100k forwarded messages next to what an independent
//! publisher (a plain rdkafka producer, the HTTP client alone) and the claim/settle client alone
//! spend on as many messages, each in a child process.

use delay_bridge::parts::config::SinkConfig;
use delay_bridge::parts::sink::kafka::DEFAULT_PROPERTIES;

use super::*;
use crate::child::{self, ChildRun};
use crate::report::Cost;

impl Bench {
    /// Measures the plain producer and the claim/settle client on `--messages` each; `bridge`
    /// is the forwarding phase of the same run.
    pub(super) async fn kafka_cost(&self, bridge: &Forward) -> anyhow::Result<Cost> {
        let crate::Broker::Kafka(kafka) = &self.broker else {
            bail!("Kafka only");
        };
        let SinkConfig::Kafka(sink) = self.sink.settings() else {
            bail!("the bench sink is not Kafka");
        };
        let n = self.args.messages;
        eprintln!("bench: kafka cost, a plain rdkafka producer, {n} messages");
        // The bridge's settings, then the sink's own properties (`--sink-set`), as the bridge.
        let mut properties: Vec<String> = DEFAULT_PROPERTIES
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        properties.extend(sink.properties.iter().map(|(k, v)| format!("{k}={v}")));
        // As many records awaiting their report as the bridge's workers can hold.
        let window = self.trigger.workers() * delay_bridge::MAX_IN_FLIGHT * self.trigger.batch();
        let mut args = vec![
            "kafka-producer".to_string(),
            format!("--brokers={}", self.args.kafka_brokers),
            format!("--topic={}", kafka.topic()),
            format!("--messages={n}"),
            format!("--payload-bytes={}", self.args.payload_bytes),
            format!("--base={}", self.next_base()),
            format!("--window={window}"),
        ];
        args.extend(properties.iter().map(|p| format!("--property={p}")));
        self.cost("plain rdkafka producer", args, bridge).await
    }

    /// Measures the HTTP client alone (the ceiling's, in a child process, POSTing to the bench's
    /// endpoint) and the claim/settle client on `--messages` each; `bridge` is the forwarding
    /// phase of the same run.
    pub(super) async fn http_cost(&self, bridge: &Forward) -> anyhow::Result<Cost> {
        let crate::Broker::Http(http) = &self.broker else {
            bail!("HTTP only");
        };
        let n = self.args.messages;
        eprintln!("bench: http cost, the HTTP client alone, {n} messages");
        let args = vec![
            "http-client".to_string(),
            format!("--url={}", http.url()),
            format!("--messages={n}"),
            format!("--payload-bytes={}", self.args.payload_bytes),
            format!("--base={}", self.next_base()),
        ];
        self.cost("HTTP client alone", args, bridge).await
    }

    /// Runs the independent publisher `publisher_name` as a child with `args`, then the
    /// claim/settle client on as many messages, next to the bridge's forwarding phase.
    async fn cost(
        &self,
        publisher_name: &'static str,
        args: Vec<String>,
        bridge: &Forward,
    ) -> anyhow::Result<Cost> {
        let producer = child::spawn(args).await.context(publisher_name)?;
        let n = self.args.messages;
        eprintln!("bench: cost, the claim/settle client, {n} messages");
        Ok(Cost {
            publisher_name,
            bridge_cpu_per_100k: bridge.cpu_seconds_per_100k,
            bridge_msg_per_s: bridge.rate.msg_per_s,
            producer,
            claim_settle: self.claim_settle_child(n).await?,
        })
    }

    /// The claim and settle scripts alone draining `n` members due now, in a child process.
    async fn claim_settle_child(&self, n: u64) -> anyhow::Result<ChildRun> {
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
        let run = child::spawn(args).await.context("the claim/settle client");
        redis_ops::unlink_queue(&mut conn, &key).await?;
        run
    }
}
