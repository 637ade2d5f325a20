//! RabbitMQ for the bench: a durable exchange and queue, and a consumer.

use std::sync::Arc;

use anyhow::Context;
use delay_bridge::parts::secret::redact_url;
use delay_bridge::wire::HEADER_DUE_MS;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};

use super::tally::{now_us, Tally};
use super::ConsumerTask;

/// Unacknowledged deliveries the consumer may hold; acks go out `multiple` every `ACK_EVERY`.
const PREFETCH: u16 = 2000;
const ACK_EVERY: u32 = 500;

/// The bench's exchange, queue and consumer.
pub struct AmqpBench {
    url: String,
    conn: Connection,
    exchange: String,
    queue: String,
    consumer: ConsumerTask,
}

/// Consumes `queue` on `ch` with manual acks, at most `prefetch` deliveries unacknowledged.
pub(crate) async fn consume(
    ch: &Channel,
    queue: &str,
    tag: &str,
    prefetch: u16,
) -> lapin::Result<Consumer> {
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    ch.basic_consume(
        queue,
        tag,
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
}

fn connection_properties(name: &str) -> ConnectionProperties {
    ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio)
        .with_connection_name(name.into())
}

impl AmqpBench {
    /// Declares a durable direct exchange and a durable queue named `name`, and starts consuming.
    pub async fn setup(url: &str, name: &str, tally: Arc<Tally>) -> anyhow::Result<Self> {
        let conn = Connection::connect(url, connection_properties("delay-bridge-bench/consumer"))
            .await
            .with_context(|| format!("connecting to RabbitMQ at {}", redact_url(url)))?;
        let ch = conn.create_channel().await?;
        let durable_exchange = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(
            name,
            ExchangeKind::Direct,
            durable_exchange,
            FieldTable::default(),
        )
        .await?;
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(name, durable_queue, FieldTable::default())
            .await?;
        ch.queue_bind(
            name,
            name,
            name,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        // The backlog queue: bound beside the consumed one, never consumed, purged after use.
        let backlog = format!("{name}.backlog");
        ch.queue_declare(&backlog, durable_queue, FieldTable::default())
            .await?;
        ch.queue_bind(
            &backlog,
            name,
            &backlog,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        let mut deliveries = consume(&ch, name, "delay-bridge-bench", PREFETCH).await?;
        let consumer = tokio::spawn(async move {
            let mut unacked = 0u32;
            while let Some(Ok(d)) = deliveries.next().await {
                let at = now_us();
                let due = d.properties.headers().as_ref().and_then(|h| {
                    match h.inner().get(HEADER_DUE_MS) {
                        Some(AMQPValue::LongLongInt(n)) => Some(*n),
                        Some(AMQPValue::LongInt(n)) => Some(i64::from(*n)),
                        _ => None,
                    }
                });
                tally.record(&d.data, due, at);
                unacked += 1;
                if unacked >= ACK_EVERY {
                    let multiple = BasicAckOptions { multiple: true };
                    if d.acker.ack(multiple).await.is_err() {
                        break;
                    }
                    unacked = 0;
                }
            }
        });
        Ok(Self {
            url: url.to_string(),
            conn,
            exchange: name.to_string(),
            queue: name.to_string(),
            consumer: ConsumerTask::new(consumer),
        })
    }

    /// The `[sinks.bench]` section for a bridge publishing here.
    pub fn sink_toml(&self) -> String {
        format!(
            "[sinks.bench]\ntype = \"amqp\"\nurl = {}\n",
            toml_str(&self.url)
        )
    }

    /// The route lines of a `[[triggers]]` entry publishing to the bench queue, or with
    /// `backlog` to the queue nobody consumes.
    pub fn route_toml(&self, backlog: bool) -> String {
        let queue = if backlog {
            self.backlog_queue()
        } else {
            self.queue.clone()
        };
        format!(
            "exchange = {}\nrouting_key = {}\n",
            toml_str(&self.exchange),
            toml_str(&queue)
        )
    }

    /// The URL, exchange and routing key a publisher uses to reach the bench queue, or with
    /// `backlog` the queue nobody consumes (the bridge's route, for the ceilings).
    pub fn target(&self, backlog: bool) -> (&str, &str, String) {
        let key = if backlog {
            self.backlog_queue()
        } else {
            self.queue.clone()
        };
        (&self.url, &self.exchange, key)
    }

    /// The queue nobody consumes (bound with its own name as the routing key).
    fn backlog_queue(&self) -> String {
        format!("{}.backlog", self.queue)
    }

    /// Empties the queue nobody consumes; returns how many messages it held.
    pub async fn purge_backlog(&self) -> anyhow::Result<u32> {
        let ch = self.conn.create_channel().await?;
        let n = ch
            .queue_purge(&self.backlog_queue(), QueuePurgeOptions::default())
            .await?;
        let _ = ch.close(200, "purged").await;
        Ok(n)
    }

    /// Deletes the queue and the exchange and stops consuming.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        self.consumer.stop().await;
        let ch = self.conn.create_channel().await?;
        ch.queue_delete(&self.queue, QueueDeleteOptions::default())
            .await?;
        ch.queue_delete(&self.backlog_queue(), QueueDeleteOptions::default())
            .await?;
        ch.exchange_delete(&self.exchange, ExchangeDeleteOptions::default())
            .await?;
        let _ = self.conn.close(200, "done").await;
        Ok(())
    }
}

/// A TOML basic string (JSON string escapes are valid TOML).
pub fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}
