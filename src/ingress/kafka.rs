//! The Kafka ingress: reads the ingress topic in a consumer group, stores each record, and lets the group commit an offset only once Redis has every record before it; stops reading while Redis does not take writes.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio_util::sync::CancellationToken;

use super::record::{self, At};
use super::{wait_unless_stopped, Ended, Ingress};
use crate::config::IngressConfig;
use crate::redis::store::StoreError;
use crate::repeat::Repeated;
use crate::sink::kafka::KafkaSink;

/// Records being stored at once (each one Redis call).
const STORES_AT_ONCE: usize = 64;
/// How often the consumer lag is read.
const LAG_EVERY: Duration = Duration::from_secs(5);
/// How often the offsets of stored records are committed unless the sink's properties say
/// (`auto.commit.interval.ms`): what a crash makes the group read again is at most this much
/// of the topic, and a record read again that was already delivered is delivered twice.
const COMMIT_EVERY_MS: &str = "500";

/// Reads `ingress.topic` on `sink`'s brokers until `stop`; waits out a Redis failure with the
/// records left uncommitted (the group reads them again).
pub(super) async fn run(
    ctx: &Ingress,
    sink: &KafkaSink,
    ingress: &IngressConfig,
    stop: &CancellationToken,
) {
    let name = ctx.config.name();
    let Some(topic) = ingress.topic.as_deref() else {
        return;
    };
    let mut failures = Repeated::default();
    while !stop.is_cancelled() {
        let mut cc = sink.consumer_config();
        if cc.get("auto.commit.interval.ms").is_none() {
            cc.set("auto.commit.interval.ms", COMMIT_EVERY_MS);
        }
        cc.set("group.id", ingress.group_name(name))
            .set(
                "client.id",
                format!("delay-bridge-{}-ingress-{name}", sink.name()),
            )
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set_log_level(RDKafkaLogLevel::Warning);
        let consumer: StreamConsumer = match cc.create() {
            Ok(c) => c,
            Err(e) => {
                if let Some(unlogged) = failures.failed() {
                    tracing::error!(trigger = name, error = %e, unlogged, "ingress: cannot create the Kafka consumer");
                }
                ctx.broker_failed();
                if wait_unless_stopped(stop, Duration::from_secs(5)).await {
                    continue;
                }
                return;
            }
        };
        let consumer = Arc::new(consumer);
        let ended = session(ctx, &consumer, topic, stop).await;
        ctx.consuming(false);
        // What was stored is committed now, not at the next auto-commit tick.
        let _ = consumer.commit_consumer_state(CommitMode::Sync);
        consumer.unsubscribe();
        let again = ctx.session_ended(ended, stop, |e| {
            tracing::warn!(trigger = name, error = %e, "ingress: Kafka consumer failed, starting again");
            Duration::from_secs(1)
        })
        .await;
        if !again {
            return;
        }
    }
}

/// One consumer's life: subscribes, then stores each record and marks its offset for the
/// next commit, one record at a time (so an offset is committed only after every record
/// before it in its partition was stored), until `stop` or a Redis failure.
async fn session(
    ctx: &Ingress,
    consumer: &Arc<StreamConsumer>,
    topic: &str,
    stop: &CancellationToken,
) -> Result<(), Ended> {
    let name = ctx.config.name();
    consumer
        .subscribe(&[topic])
        .map_err(|e| Ended::Broker(e.to_string()))?;
    ctx.consuming(true);
    tracing::info!(trigger = name, topic, "ingress: reading");
    let mut errors = Repeated::default();
    let mut lag = tokio::time::interval(LAG_EVERY);
    // Records being stored, in the order they were read: an offset is stored only once every
    // record read before it is in Redis too. Those still storing when the session ends are
    // read again by the group, and stored once (their id is topic/partition/offset).
    let mut storing = FuturesOrdered::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            Some(stored) = storing.next(), if !storing.is_empty() => {
                let stored: Result<BorrowedMessage<'_>, StoreError> = stored;
                let m = stored.map_err(Ended::Redis)?;
                if let Err(e) = consumer.store_offset_from_message(&m) {
                    // Revoked meanwhile: the next owner reads it again, and finds it stored.
                    tracing::debug!(trigger = name, error = %e, "ingress: offset not stored");
                }
            }
            _ = lag.tick() => read_lag(ctx, consumer).await,
            m = consumer.recv(), if storing.len() < STORES_AT_ONCE => match m {
                Ok(m) => {
                    errors.recovered();
                    storing.push_back(async move {
                        ctx.store(&incoming(&m)).await.map(|()| m)
                    });
                }
                Err(e) => {
                    if let Some(unlogged) = errors.failed() {
                        tracing::warn!(trigger = name, error = %e, unlogged, "ingress: Kafka consumer error");
                    }
                }
            },
        }
    }
}

/// The record as the store takes it.
fn incoming(m: &BorrowedMessage<'_>) -> super::message::Incoming {
    let headers: Vec<(&str, Option<&[u8]>)> = m
        .headers()
        .map(|h| h.iter().map(|h| (h.key, h.value)).collect())
        .unwrap_or_default();
    let at = At {
        topic: m.topic(),
        partition: m.partition(),
        offset: m.offset(),
    };
    record::incoming(at, m.key(), m.payload(), &headers)
}

/// Sums, over the partitions assigned, the records past the consumer's position into the lag
/// gauge (the watermarks are asked of the broker off the async threads).
async fn read_lag(ctx: &Ingress, consumer: &Arc<StreamConsumer>) {
    let consumer = consumer.clone();
    let lag = tokio::task::spawn_blocking(move || {
        let positions = consumer.position().ok()?;
        let mut lag = 0;
        for e in positions.elements() {
            let (_, high) = consumer
                .fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(1))
                .ok()?;
            let at = e.offset().to_raw().filter(|o| *o >= 0).unwrap_or(0);
            lag += (high - at).max(0);
        }
        Some(lag)
    })
    .await
    .ok()
    .flatten();
    if let Some(lag) = lag {
        ctx.metrics
            .ingress
            .lag
            .with_label_values(&[ctx.config.name()])
            .set(lag);
    }
}
