//! The ingress phase on Kafka: the backlog produced to the ingress topic before the bridge starts, and the ceiling: the same topic read by a plain rdkafka consumer in a group of its own, storing each offset as it goes like the bridge.

use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::time::Instant;

use super::super::amqp::toml_str;
use super::super::kafka::KafkaBench;
use super::super::process::free_port;
use super::super::report::IngressRun;
use super::super::{redis_ops, tally, Bench};
use super::{due_after_ms, due_of, Backlog, Rate};

const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Records the producer keeps in flight.
const WINDOW: usize = 1_000;

impl Bench {
    /// The Kafka ingress: a backlog in the ingress topic taken in by the bridge, next to the
    /// same topic read by a plain consumer.
    pub(super) async fn kafka_ingress(&self, kafka: &KafkaBench) -> anyhow::Result<IngressRun> {
        let n = self.args.ingress_messages;
        eprintln!("bench: ingress (Kafka), {n} delayed records waiting in the ingress topic");
        let key = self.new_key("ingress");
        let topic = format!("delay-bridge-bench-{}.ingress", self.run_id);
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", kafka.brokers())
            .create()
            .context("creating a Kafka admin client")?;
        let opts = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1));
        for r in admin.create_topics([&new], &opts).await? {
            if let Err((t, code)) = r {
                bail!("creating topic {t}: {code}");
            }
        }
        let result = self.kafka_backlog(kafka, &key, &topic, n).await;
        let _ = admin.delete_topics(&[&topic], &opts).await;
        redis_ops::unlink_queue(&mut self.conn.clone(), &key).await?;
        result
    }

    async fn kafka_backlog(
        &self,
        kafka: &KafkaBench,
        key: &str,
        topic: &str,
        n: u64,
    ) -> anyhow::Result<IngressRun> {
        let base = self.next_base();
        let due = tally::now_us() / 1000 + due_after_ms(n);
        self.tally.reset(base, n);
        let publish_msg_per_s = produce(
            kafka.brokers(),
            topic,
            base,
            n,
            due,
            self.args.payload_bytes,
        )
        .await?;
        let ceiling_msg_per_s = read(kafka.brokers(), topic, n).await?;
        let port = free_port()?;
        let group = format!("{topic}.bridge");
        let lines = format!(
            "topic = {}\ngroup = {}\n",
            toml_str(topic),
            toml_str(&group)
        );
        let toml = self.ingress_toml(key, &lines, port);
        let backlog = Backlog {
            publish_msg_per_s,
            ceiling_msg_per_s,
            ceiling_client: "rdkafka consumer, offsets stored per record",
        };
        self.take_in(&toml, port, n, backlog, "Kafka").await
    }
}

/// Produces `n` records (sequence numbers from `base`, the first due at `due` epoch ms, the
/// rest as [`due_of`] says) to `topic`,
/// [`WINDOW`] in flight; returns records/s.
async fn produce(
    brokers: &str,
    topic: &str,
    base: u64,
    n: u64,
    due: i64,
    size: usize,
) -> anyhow::Result<f64> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .context("creating a Kafka producer")?;
    let start = Instant::now();
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    for seq in 0..n {
        let body = tally::payload(base + seq, size);
        let until = due_of(due, seq).to_string();
        let headers = OwnedHeaders::new().insert(Header {
            key: "x-delay-until",
            value: Some(until.as_str()),
        });
        let record = FutureRecord::<(), _>::to(topic)
            .payload(&body)
            .headers(headers);
        let delivery = producer
            .send_result(record)
            .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        in_flight.push(delivery);
        if in_flight.len() >= WINDOW {
            delivered(in_flight.next().await)?;
        }
    }
    while let Some(d) = in_flight.next().await {
        delivered(Some(d))?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

/// What a record's delivery future said: delivered, or why not.
fn delivered<E>(d: Option<Result<OwnedDeliveryResult, E>>) -> anyhow::Result<()> {
    match d {
        Some(Ok(Ok(_))) => Ok(()),
        Some(Ok(Err((e, _)))) => bail!("a record was not delivered: {e}"),
        Some(Err(_)) | None => bail!("the producer went away"),
    }
}

/// Reads `n` records of `topic` from the beginning in a group of its own, storing each
/// offset as it is read (committed every 500 ms, like the bridge): records/s from the first
/// record to the last.
async fn read(brokers: &str, topic: &str, n: u64) -> anyhow::Result<f64> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{topic}.ceiling"))
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "500")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .context("creating the ceiling's Kafka consumer")?;
    consumer.subscribe(&[topic])?;
    let mut stream = consumer.stream();
    let mut rate = Rate::new();
    let mut taken = 0;
    let deadline = Instant::now() + Duration::from_secs(60 + n / 1_000);
    while taken < n {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .with_context(|| format!("the ceiling consumer read {taken} of {n}"))?;
        let record = next.context("the ceiling consumer stopped")??;
        consumer.store_offset_from_message(&record)?;
        taken += 1;
        rate.saw(Instant::now(), taken);
    }
    Ok(rate.per_second(Instant::now(), taken))
}
