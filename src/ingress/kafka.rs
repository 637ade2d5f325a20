//! The Kafka ingress: reads the ingress topic in a consumer group, stores each record, and lets the group commit an offset only once Redis has every record before it; stops reading while Redis does not take writes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio_util::sync::CancellationToken;

use super::record::{self, At};
use super::{wait_unless_stopped, Ended, Ingress};
use crate::config::IngressConfig;
use crate::repeat::Repeated;
use crate::sink::kafka::KafkaSink;

/// Records read and stored as one batch (each one Redis call, all at once).
const STORES_AT_ONCE: usize = 64;

/// The ingress's consumer, with its [`Revocations`].
type IngressConsumer = StreamConsumer<Revocations>;
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
        let consumer: IngressConsumer = match cc.create_with_context(Revocations::default()) {
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

/// One consumer's life: subscribes, then reads and stores records a batch at a time until
/// `stop` or a Redis failure (see [`store_batch`]).
///
/// A rebalance is handled while the consumer is polled, so reading only between batches
/// means that one never lands while records are being stored: every record read before it
/// is in Redis and has its offset marked, and the group commits those offsets as it takes
/// the partitions away. Records read in the same poll as a revocation are left to the
/// partition's next reader, which reads them from the committed offset. A record stored by
/// two members would be delivered twice once the first copy had gone out.
async fn session(
    ctx: &Ingress,
    consumer: &Arc<IngressConsumer>,
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
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = lag.tick() => {
                read_lag(ctx, consumer).await;
                continue;
            }
            m = consumer.recv() => m,
        };
        // A rebalance handled while waiting for the first record came before it: that record,
        // and those fetched after it, are of the partitions this member has now. One handled
        // while taking those ends the batch (a poll that handles an event yields no record).
        consumer.context().forget();
        // The first record, and those already fetched after it.
        let mut batch = Vec::with_capacity(STORES_AT_ONCE);
        let mut next = Some(first);
        while let Some(m) = next {
            match m {
                Ok(m) => {
                    errors.recovered();
                    batch.push(m);
                }
                Err(e) => {
                    if let Some(unlogged) = errors.failed() {
                        tracing::warn!(trigger = name, error = %e, unlogged, "ingress: Kafka consumer error");
                    }
                }
            }
            next = if batch.len() < STORES_AT_ONCE {
                consumer.recv().now_or_never()
            } else {
                None
            };
        }
        consumer.context().leave_revoked(&mut batch);
        store_batch(ctx, consumer, batch).await?;
    }
}

/// Stores a batch's records at once, and marks each one's offset for the next commit in the
/// order they were read, once it and every record before it are in Redis. Runs to its end
/// whatever `stop` says (each store is one Redis call, bounded by its timeout): what was read
/// is stored and marked before the session ends.
async fn store_batch(
    ctx: &Ingress,
    consumer: &IngressConsumer,
    batch: Vec<BorrowedMessage<'_>>,
) -> Result<(), Ended> {
    let mut storing: FuturesOrdered<_> = batch
        .into_iter()
        .map(|m| async move { ctx.store(&incoming(&m)).await.map(|()| m) })
        .collect();
    while let Some(stored) = storing.next().await {
        let m = stored.map_err(Ended::Redis)?;
        if let Err(e) = consumer.store_offset_from_message(&m) {
            tracing::debug!(trigger = ctx.config.name(), error = %e, "ingress: offset not stored");
        }
    }
    Ok(())
}

/// The consumer's context: remembers the partitions a rebalance took from this member since
/// the last [`Revocations::forget`], so that the records of theirs read before it are left to
/// their next reader (see [`session`]).
#[derive(Default)]
struct Revocations(Mutex<Vec<(String, i32)>>);

impl Revocations {
    /// Starts a batch at its first record: no partition revoked since.
    fn forget(&self) {
        self.revoked().clear();
    }

    /// Drops from `batch` the records of the partitions revoked since [`Revocations::forget`].
    fn leave_revoked(&self, batch: &mut Vec<BorrowedMessage<'_>>) {
        let revoked = self.revoked();
        if !revoked.is_empty() {
            batch.retain(|m| {
                !revoked
                    .iter()
                    .any(|(t, p)| t == m.topic() && *p == m.partition())
            });
        }
    }

    fn revoked(&self) -> std::sync::MutexGuard<'_, Vec<(String, i32)>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ClientContext for Revocations {}

impl ConsumerContext for Revocations {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let gone = partitions.elements();
            let gone = gone.iter().map(|e| (e.topic().to_owned(), e.partition()));
            self.revoked().extend(gone);
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
async fn read_lag(ctx: &Ingress, consumer: &Arc<IngressConsumer>) {
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
