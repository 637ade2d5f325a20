//! The Kafka ingress: reads the ingress topic in a consumer group, stores each record, and lets the group commit an offset only once Redis has every record before it; stops reading while Redis does not take writes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::TopicPartitionList;
use tokio_util::sync::CancellationToken;

use super::record::{self, At};
use super::{wait_unless_stopped, Ended, Ingress};
use crate::config::IngressConfig;
use crate::redis::store::StoreError;
use crate::repeat::Repeated;
use crate::sink::kafka::KafkaSink;

/// Records being stored at once (each one Redis call).
const STORES_AT_ONCE: usize = 64;

/// The ingress's consumer, with its [`Rebalances`].
type IngressConsumer = StreamConsumer<Rebalances>;
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
        let consumer: IngressConsumer = match cc.create_with_context(Rebalances::default()) {
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
        // A revocation that waited for stores a Redis failure cut short is carried out now.
        consumer.context().storing(0);
        consumer.context().give_up(&*consumer);
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
/// next commit, in the order they were read (so an offset is committed only after every
/// record before it in its partition was stored), until `stop` (what is being stored is
/// stored first) or a Redis failure.
///
/// A rebalance that takes partitions while records are being stored waits for them (see
/// [`Rebalances`]): the group commits their offsets as the partitions leave, so the next
/// owner does not read them again. Read again, a record whose first copy had gone out
/// meanwhile would go out twice.
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
    // Records being stored, in the order they were read: an offset is stored only once every
    // record read before it is in Redis too.
    let mut storing = FuturesOrdered::new();
    let mut stopping = false;
    let rebalances = consumer.context();
    loop {
        rebalances.storing(storing.len());
        if storing.is_empty() {
            rebalances.give_up(&**consumer);
            if stopping {
                return Ok(());
            }
        }
        let reading = !stopping && !rebalances.revoking() && storing.len() < STORES_AT_ONCE;
        tokio::select! {
            _ = stop.cancelled(), if !stopping => stopping = true,
            Some(stored) = storing.next(), if !storing.is_empty() => {
                let stored: Result<BorrowedMessage<'_>, StoreError> = stored;
                let m = stored.map_err(Ended::Redis)?;
                if let Err(e) = consumer.store_offset_from_message(&m) {
                    tracing::debug!(trigger = name, error = %e, "ingress: offset not stored");
                }
            }
            _ = lag.tick() => read_lag(ctx, consumer).await,
            m = consumer.recv(), if reading => match m {
                // Read after its partition was revoked: the next owner reads it.
                Ok(m) if rebalances.revoked(&m) => {}
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

/// The consumer's context. A revocation that comes while records are being stored is kept,
/// not carried out, and the session gives the partitions up once those records are stored
/// and their offsets marked ([`Rebalances::give_up`]); librdkafka lets the application do so
/// after its callback, and the group waits for it (at most `max.poll.interval.ms`).
#[derive(Default)]
struct Rebalances {
    /// Records being stored, as the session last said.
    storing: AtomicUsize,
    /// Partitions revoked while records were being stored, not given up yet.
    pending: Mutex<Option<TopicPartitionList>>,
}

impl Rebalances {
    /// The session's count of records being stored.
    fn storing(&self, n: usize) {
        self.storing.store(n, Ordering::Relaxed);
    }

    /// Whether a revocation waits for the records being stored.
    fn revoking(&self) -> bool {
        self.pending().is_some()
    }

    /// Whether `m` is of a partition whose revocation waits.
    fn revoked(&self, m: &BorrowedMessage<'_>) -> bool {
        self.pending()
            .as_ref()
            .is_some_and(|revoked| revoked.find_partition(m.topic(), m.partition()).is_some())
    }

    /// Gives up the partitions of a revocation that waited, if one did.
    fn give_up(&self, consumer: &impl Consumer<Self>) {
        if let Some(revoked) = self.pending().take() {
            unassign(consumer, &revoked);
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Option<TopicPartitionList>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ClientContext for Rebalances {}

impl ConsumerContext for Rebalances {
    /// librdkafka's own handling, except that a revocation waits while records are being
    /// stored.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let assigned = match consumer.rebalance_protocol() {
                    RebalanceProtocol::Cooperative => consumer.incremental_assign(partitions),
                    _ => consumer.assign(partitions),
                };
                if let Err(e) = assigned {
                    tracing::warn!(error = %e, "ingress: partitions not taken");
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS
                if self.storing.load(Ordering::Relaxed) > 0 =>
            {
                *self.pending() = Some(partitions.clone());
            }
            _ => unassign(consumer, partitions),
        }
    }
}

/// Gives up `revoked` (all partitions, unless the group rebalances cooperatively).
fn unassign(consumer: &impl Consumer<Rebalances>, revoked: &TopicPartitionList) {
    let given_up = match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => consumer.incremental_unassign(revoked),
        _ => consumer.unassign(),
    };
    if let Err(e) = given_up {
        tracing::warn!(error = %e, "ingress: partitions not given up");
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
