//! Kafka for the bench: a fresh topic, a consumer, and the plain-producer ceiling.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::amqp::toml_str;
use super::tally::{now_us, payload, Tally};
use super::Window;
use crate::config::KafkaSinkConfig;
use crate::sink::MessageId;

const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The bench's topic and consumer.
pub struct KafkaBench {
    brokers: String,
    topic: String,
    admin: AdminClient<DefaultClientContext>,
    consumer: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl KafkaBench {
    /// Creates topic `name` with `partitions` partitions and consumes it from the beginning.
    pub async fn setup(
        brokers: &str,
        name: &str,
        partitions: i32,
        tally: Arc<Tally>,
    ) -> anyhow::Result<Self> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .context("creating a Kafka admin client")?;
        let opts = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let created = tokio::time::timeout(ADMIN_TIMEOUT, admin.create_topics([&topic], &opts))
            .await
            .with_context(|| format!("Kafka at {brokers} did not answer CreateTopics"))?
            .with_context(|| format!("creating topic {name} on {brokers}"))?;
        for r in created {
            if let Err((t, code)) = r {
                bail!("creating topic {t}: {code}");
            }
        }
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", name)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            // The consumer's own batching would add to the measured lateness.
            .set("fetch.wait.max.ms", "10")
            .set("fetch.error.backoff.ms", "10")
            .create()
            .context("creating a Kafka consumer")?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(name, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let consumer = tokio::spawn(async move {
            let mut stream = consumer.stream();
            while let Some(m) = stream.next().await {
                let Ok(m) = m else { continue };
                let at = now_us();
                let due = m.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "x-delay-due-ms")
                        .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
                });
                tally.record(m.payload().unwrap_or_default(), due, at);
            }
        });
        Ok(Self {
            brokers: brokers.to_string(),
            topic: name.to_string(),
            admin,
            consumer: std::sync::Mutex::new(Some(consumer)),
        })
    }

    /// The `[sinks.bench]` section for a bridge producing here.
    pub fn sink_toml(&self) -> String {
        format!(
            "[sinks.bench]\ntype = \"kafka\"\nbrokers = {}\n",
            toml_str(&self.brokers)
        )
    }

    /// The route lines of a `[[triggers]]` entry producing to the bench topic.
    pub fn route_toml(&self) -> String {
        format!("topic = {}\nkafka_key = \"none\"\n", toml_str(&self.topic))
    }

    /// Produces `w.count` records with the bridge's producer settings and headers: one shared
    /// producer, each worker enqueueing a window and awaiting its delivery reports.
    /// Returns when producing started (after connecting).
    pub async fn publish_ceiling(&self, w: &Window) -> anyhow::Result<Instant> {
        let sink = KafkaSinkConfig {
            brokers: self.brokers.clone(),
            properties: BTreeMap::new(),
            sasl_password_file: None,
        };
        let producer: FutureProducer = crate::sink::kafka::client_config(&sink)?
            .set("client.id", "delay-bridge-bench")
            .create()?;
        let (p, topic) = (producer.clone(), self.topic.clone());
        tokio::task::spawn_blocking(move || p.client().fetch_metadata(Some(&topic), ADMIN_TIMEOUT))
            .await?
            .context("connecting the producer")?;
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        // As many windows at once as the bridge's workers keep batches in flight.
        for _ in 0..w.workers * crate::worker::MAX_IN_FLIGHT {
            let (producer, next, w, topic) = (
                producer.clone(),
                next.clone(),
                w.clone(),
                self.topic.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let due = w.due_ms.to_string();
                loop {
                    let start = next.fetch_add(w.batch as u64, Ordering::Relaxed);
                    if start >= w.count {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let end = (start + w.batch as u64).min(w.count);
                    let mut pending = FuturesUnordered::new();
                    let mut done = Vec::new();
                    for i in start..end {
                        let body = payload(w.base + i, w.payload_bytes);
                        let id = MessageId::new(&w.key, &body);
                        let headers = OwnedHeaders::new_with_capacity(4)
                            .insert(header("x-delay-trigger", "bench"))
                            .insert(header("x-delay-due-ms", &due))
                            .insert(header("x-delay-attempt", "1"))
                            .insert(header("x-delay-id", id.as_str()));
                        let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
                            .payload(&body)
                            .headers(headers);
                        loop {
                            match producer.send_result(record) {
                                Ok(delivery) => {
                                    pending.push(delivery);
                                    break;
                                }
                                Err((
                                    KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                                    back,
                                )) => {
                                    record = back;
                                    match pending.next().await {
                                        Some(r) => done.push(r),
                                        None => tokio::time::sleep(Duration::from_millis(1)).await,
                                    }
                                }
                                Err((e, _)) => return Err(e.into()),
                            }
                        }
                    }
                    done.extend(pending.collect::<Vec<_>>().await);
                    for r in done {
                        if let Err((e, _)) = r? {
                            bail!("a record was not delivered: {e}");
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok(started)
    }

    /// Deletes the topic and stops consuming.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        // Awaited so the client is gone before the process exits (librdkafka's threads
        // must not outlive the runtime).
        let consumer = self
            .consumer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(c) = consumer {
            c.abort();
            let _ = c.await;
        }
        let opts = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let deleted = tokio::time::timeout(
            ADMIN_TIMEOUT,
            self.admin.delete_topics(&[&self.topic], &opts),
        )
        .await
        .context("Kafka did not answer DeleteTopics")??;
        for r in deleted {
            if let Err((t, code)) = r {
                bail!("deleting topic {t}: {code}");
            }
        }
        Ok(())
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}
