//! RabbitMQ for the bench: a durable exchange and queue, a consumer, and the plain-publisher ceiling.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::tally::{now_us, payload, Tally};
use super::Window;
use crate::secret::redact_url;
use crate::sink::MessageId;

/// Unacknowledged deliveries the consumer may hold; acks go out `multiple` every `ACK_EVERY`.
const PREFETCH: u16 = 2000;
const ACK_EVERY: u32 = 500;

/// The bench's exchange, queue and consumer.
pub struct AmqpBench {
    url: String,
    conn: Connection,
    exchange: String,
    queue: String,
    consumer: std::sync::Mutex<Option<JoinHandle<()>>>,
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
        ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
        let mut deliveries = ch
            .basic_consume(
                name,
                "delay-bridge-bench",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let consumer = tokio::spawn(async move {
            let mut unacked = 0u32;
            while let Some(Ok(d)) = deliveries.next().await {
                let at = now_us();
                let due = d.properties.headers().as_ref().and_then(|h| {
                    match h.inner().get("x-delay-due-ms") {
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
            consumer: std::sync::Mutex::new(Some(consumer)),
        })
    }

    /// The `[sinks.bench]` section for a bridge publishing here.
    pub fn sink_toml(&self) -> String {
        format!(
            "[sinks.bench]\ntype = \"amqp\"\nurl = {}\n",
            toml_str(&self.url)
        )
    }

    /// The route lines of a `[[triggers]]` entry publishing to the bench queue.
    pub fn route_toml(&self) -> String {
        format!(
            "exchange = {}\nrouting_key = {}\n",
            toml_str(&self.exchange),
            toml_str(&self.queue)
        )
    }

    /// Publishes `w.count` messages the way the bridge does: persistent, mandatory, in confirm
    /// mode, one channel per worker, each publishing a window then awaiting its confirms.
    /// Returns when publishing started (after connecting).
    pub async fn publish_ceiling(&self, w: &Window) -> anyhow::Result<Instant> {
        let conn = Arc::new(
            Connection::connect(
                &self.url,
                connection_properties("delay-bridge-bench/publisher"),
            )
            .await?,
        );
        let mut channels = Vec::new();
        for _ in 0..w.workers {
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            channels.push(ch);
        }
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        // Each channel carries as many windows at once as a worker keeps batches in flight.
        let lanes = channels
            .iter()
            .flat_map(|ch| std::iter::repeat_n(ch.clone(), crate::worker::MAX_IN_FLIGHT));
        for ch in lanes {
            let (next, w, exchange) = (next.clone(), w.clone(), self.exchange.clone());
            tasks.push(tokio::spawn(async move {
                let options = BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                };
                let trigger = AMQPValue::LongString("bench".into());
                loop {
                    let start = next.fetch_add(w.batch as u64, Ordering::Relaxed);
                    if start >= w.count {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let end = (start + w.batch as u64).min(w.count);
                    let pending = FuturesUnordered::new();
                    for i in start..end {
                        let body = payload(w.base + i, w.payload_bytes);
                        let mut headers = FieldTable::default();
                        headers.insert(ShortString::from("x-delay-trigger"), trigger.clone());
                        headers.insert(
                            ShortString::from("x-delay-due-ms"),
                            AMQPValue::LongLongInt(w.due_ms),
                        );
                        headers.insert(
                            ShortString::from("x-delay-attempt"),
                            AMQPValue::LongLongInt(1),
                        );
                        let id = MessageId::new(&w.key, &body);
                        let props = BasicProperties::default()
                            .with_delivery_mode(2)
                            .with_message_id(id.as_str().into())
                            .with_headers(headers);
                        pending.push(
                            ch.basic_publish(&exchange, &exchange, options, &body, props)
                                .await?,
                        );
                    }
                    for confirm in pending.collect::<Vec<_>>().await {
                        match confirm? {
                            Confirmation::Ack(None) => {}
                            other => bail!("the broker did not confirm a message: {other:?}"),
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        let _ = conn.close(200, "done").await;
        Ok(started)
    }

    /// Deletes the queue and the exchange and stops consuming.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        let consumer = self
            .consumer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(c) = consumer {
            c.abort();
            let _ = c.await;
        }
        let ch = self.conn.create_channel().await?;
        ch.queue_delete(&self.queue, QueueDeleteOptions::default())
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
