//! Kafka for the bench: a fresh topic and a consumer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use delay_bridge::wire::HEADER_DUE_MS;
use futures_util::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::amqp::toml_str;
use super::tally::{now_us, Tally};
use super::ConsumerTask;

const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The bench's topic and consumer.
pub struct KafkaBench {
    brokers: String,
    topic: String,
    admin: AdminClient<DefaultClientContext>,
    consumer: ConsumerTask,
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
                        .find(|h| h.key == HEADER_DUE_MS)
                        .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
                });
                tally.record(m.payload().unwrap_or_default(), due, at);
            }
        });
        Ok(Self {
            brokers: brokers.to_string(),
            topic: name.to_string(),
            admin,
            consumer: ConsumerTask::new(consumer),
        })
    }

    /// The brokers' bootstrap list.
    pub fn brokers(&self) -> &str {
        &self.brokers
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

    /// Deletes the topic and stops consuming.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        self.consumer.stop().await;
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
