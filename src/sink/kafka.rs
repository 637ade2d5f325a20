//! Kafka sink: an idempotent `acks=all` producer; a record counts only once its delivery report is in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::statistics::Statistics;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{await_confirms, OutMessage, PublishError, Route};
use crate::config::{KafkaKey, KafkaSinkConfig};
use crate::metrics::Metrics;

/// Properties the bridge sets unless the sink's `properties` override them.
///
/// `message.timeout.ms` stays below the default `publish_timeout` (10 s) so that librdkafka's own
/// verdict on every record arrives before the worker stops waiting for it: a record the worker
/// gave up on while librdkafka still held it could be delivered in addition to its retry.
pub const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("acks", "all"),
    ("enable.idempotence", "true"),
    ("message.timeout.ms", "8000"),
    ("linger.ms", "5"),
    ("batch.num.messages", "10000"),
    ("queue.buffering.max.messages", "100000"),
    ("compression.type", "lz4"),
    ("statistics.interval.ms", "1000"),
    ("reconnect.backoff.max.ms", "5000"),
];

/// How often the supervisor looks at the producer's health.
const SUPERVISE_TICK: Duration = Duration::from_millis(250);
/// Time a reachability probe (a metadata request) may take while no broker is up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Shortest time between two producer rebuilds after fatal errors.
const REBUILD_BACKOFF: Duration = Duration::from_secs(2);

/// The state of one producer instance, fed by librdkafka's statistics and error callbacks.
#[derive(Default)]
struct Health {
    /// At least one broker connection is up.
    up: AtomicBool,
    /// The idempotent producer hit a fatal error and must be replaced.
    fatal: AtomicBool,
}

impl Health {
    fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed) && !self.fatal.load(Ordering::Relaxed)
    }

    fn set_up(&self, sink: &str, up: bool) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if was != up {
            if up {
                tracing::info!(sink, "connected to Kafka");
            } else {
                tracing::warn!(sink, "no Kafka broker is up");
            }
        }
    }
}

/// Tracks broker reachability and fatal errors of one producer.
pub struct HealthContext {
    health: Arc<Health>,
    name: String,
}

impl ClientContext for HealthContext {
    fn stats(&self, stats: Statistics) {
        // Brokers learned from metadata have a node id; the bootstrap entry has -1.
        self.health.set_up(
            &self.name,
            stats
                .brokers
                .values()
                .any(|b| b.state == "UP" && b.nodeid >= 0),
        );
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => self.health.set_up(&self.name, false),
            Some(RDKafkaErrorCode::Fatal) => self.health.fatal.store(true, Ordering::Relaxed),
            _ => {}
        }
        tracing::warn!(sink = %self.name, error = %error, reason, "kafka client error");
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => {
                tracing::warn!(sink = %self.name, facility = fac, "{log_message}")
            }
            _ => tracing::debug!(sink = %self.name, facility = fac, "{log_message}"),
        }
    }
}

type KafkaProducer = FutureProducer<HealthContext>;

/// The producer in use and the health of that very instance.
#[derive(Clone)]
struct Current {
    producer: KafkaProducer,
    health: Arc<Health>,
}

/// What the sink and its publishers share.
struct Shared {
    name: String,
    config: ClientConfig,
    current: RwLock<Current>,
    /// Woken whenever a delivery report frees a slot in librdkafka's queue.
    room: Notify,
}

impl Shared {
    fn current(&self) -> Current {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn build(name: &str, config: &ClientConfig) -> anyhow::Result<Current> {
        let health = Arc::new(Health::default());
        let producer = config.create_with_context(HealthContext {
            health: health.clone(),
            name: name.to_string(),
        })?;
        Ok(Current { producer, health })
    }
}

/// One producer per sink, shared by every worker (librdkafka batches internally).
pub struct KafkaSink {
    shared: Arc<Shared>,
}

impl KafkaSink {
    /// Creates the producer (librdkafka connects in the background).
    pub fn new(name: &str, config: &KafkaSinkConfig) -> anyhow::Result<Self> {
        let mut cc = client_config(config)?;
        cc.set("client.id", format!("delay-bridge-{name}"));
        let current = Shared::build(name, &cc)?;
        Ok(Self {
            shared: Arc::new(Shared {
                name: name.to_string(),
                config: cc,
                current: RwLock::new(current),
                room: Notify::new(),
            }),
        })
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// True while at least one broker connection is up and the producer is usable.
    pub fn is_up(&self) -> bool {
        self.shared.current().health.is_up()
    }

    /// Mirrors the connection state into `sink_up`, probes the cluster while no broker is up
    /// (a producer with nothing to send may not connect by itself), and replaces the producer
    /// after a fatal error (an idempotent producer refuses every record after one).
    pub async fn supervise(&self, metrics: Metrics, cancel: CancellationToken) {
        let gauge = metrics.sink_up.with_label_values(&[&self.shared.name]);
        let mut last_rebuild: Option<tokio::time::Instant> = None;
        loop {
            let current = self.shared.current();
            // The error callback carries the underlying code of a fatal error, not the fact
            // that it is fatal: ask the client.
            if let Some((code, reason)) = current.producer.client().fatal_error() {
                if !current.health.fatal.swap(true, Ordering::Relaxed) {
                    tracing::warn!(sink = %self.shared.name, ?code, reason, "fatal Kafka producer error; replacing the producer");
                }
            }
            if current.health.fatal.load(Ordering::Relaxed)
                && last_rebuild.is_none_or(|t| t.elapsed() >= REBUILD_BACKOFF)
            {
                last_rebuild = Some(tokio::time::Instant::now());
                self.rebuild().await;
                continue;
            }
            if !current.health.is_up() && !current.health.fatal.load(Ordering::Relaxed) {
                let producer = current.producer.clone();
                let probe = tokio::task::spawn_blocking(move || {
                    producer
                        .client()
                        .fetch_metadata(None, PROBE_TIMEOUT)
                        .is_ok()
                });
                let reachable = tokio::select! {
                    r = probe => r.unwrap_or(false),
                    _ = cancel.cancelled() => return,
                };
                if reachable {
                    current.health.set_up(&self.shared.name, true);
                }
            }
            gauge.set(i64::from(self.is_up()));
            tokio::select! {
                _ = tokio::time::sleep(SUPERVISE_TICK) => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// Swaps in a fresh producer; records still held by the old one fail and are put back.
    async fn rebuild(&self) {
        let fresh = match Shared::build(&self.shared.name, &self.shared.config) {
            Ok(fresh) => fresh,
            Err(e) => {
                tracing::warn!(sink = %self.shared.name, error = %e, "could not create a new Kafka producer");
                return;
            }
        };
        let old = std::mem::replace(
            &mut *self
                .shared
                .current
                .write()
                .unwrap_or_else(|e| e.into_inner()),
            fresh,
        );
        tracing::warn!(sink = %self.shared.name, "replaced the Kafka producer after a fatal error");
        // Dropping a producer purges and briefly flushes it: keep that off the runtime threads.
        let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        self.shared.room.notify_waiters();
    }

    /// A handle for one worker; fails while no broker is up, so workers do not claim.
    pub fn publisher(&self) -> Result<KafkaPublisher, PublishError> {
        if !self.is_up() {
            return Err(down());
        }
        Ok(KafkaPublisher {
            shared: self.shared.clone(),
        })
    }

    /// Waits up to `timeout` for queued records to be delivered, then drops what is left:
    /// the workers have already put those members back, so sending them later would only
    /// make duplicates.
    pub async fn flush(&self, timeout: Duration) {
        let producer = self.shared.current().producer;
        let _ = tokio::task::spawn_blocking(move || {
            if producer.flush(timeout).is_err() {
                let left = producer.in_flight_count();
                producer.purge(PurgeConfig::default().queue());
                tracing::warn!(
                    records = left,
                    "Kafka records unconfirmed at exit; the queued ones were dropped (their members are back in Redis)"
                );
            }
        })
        .await;
    }
}

fn down() -> PublishError {
    PublishError::Connection("no Kafka broker is up".into())
}

/// The librdkafka configuration: the bridge's defaults, then the user's properties.
pub fn client_config(config: &KafkaSinkConfig) -> anyhow::Result<ClientConfig> {
    let mut cc = ClientConfig::new();
    for (k, v) in DEFAULT_PROPERTIES {
        cc.set(*k, *v);
    }
    cc.set("bootstrap.servers", &config.brokers);
    for (k, v) in &config.properties {
        cc.set(k, v);
    }
    if let Some(file) = &config.sasl_password_file {
        cc.set("sasl.password", crate::secret::read_file(file)?);
    }
    Ok(cc)
}

/// A worker's handle on the sink's producer (whichever instance is current).
#[derive(Clone)]
pub struct KafkaPublisher {
    shared: Arc<Shared>,
}

impl KafkaPublisher {
    /// False while no broker is up: the worker should stop claiming and ask the sink again.
    pub fn is_usable(&self) -> bool {
        self.shared.current().health.is_up()
    }

    /// Enqueues every record (waiting for room on `QueueFull`), then awaits the delivery reports.
    pub async fn publish_batch(
        &mut self,
        trigger: &str,
        route: &Route,
        messages: &[OutMessage<'_>],
        timeout: Duration,
        abort: &CancellationToken,
    ) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Result<(), PublishError>> =
            vec![Err(PublishError::Timeout); messages.len()];
        let Route::Kafka { topic, key } = route else {
            results.fill(Err(PublishError::BadPayload(
                "route is not a Kafka route".into(),
            )));
            return results;
        };
        let Current { producer, health } = self.shared.current();
        if !health.is_up() {
            // Claimed while the broker went away: hand the batch back untouched.
            results.fill(Err(down()));
            return results;
        }
        let room = &self.shared.room;
        let mut pending = FuturesUnordered::new();
        let deadline = tokio::time::Instant::now() + timeout;
        'messages: for (i, m) in messages.iter().enumerate() {
            let due = m.due_ms.to_string();
            let attempt = m.attempt.to_string();
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: "x-delay-trigger",
                    value: Some(trigger),
                })
                .insert(Header {
                    key: "x-delay-due-ms",
                    value: Some(&due),
                })
                .insert(Header {
                    key: "x-delay-attempt",
                    value: Some(&attempt),
                })
                .insert(Header {
                    key: "x-delay-id",
                    value: Some(m.id),
                });
            let mut record = FutureRecord::<[u8], [u8]>::to(topic)
                .payload(m.payload)
                .headers(headers);
            if *key == KafkaKey::Member {
                // Inline payloads are the member itself: every copy hashes to one partition.
                record = record.key(m.payload);
            }
            loop {
                // Registered before the attempt so a report arriving in between is not missed.
                let freed = room.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                match producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(async move {
                            let r = match delivery.await {
                                Ok(Ok(_)) => Ok(()),
                                Ok(Err((e, _))) => Err(classify(&e)),
                                Err(_) => Err(PublishError::Connection(
                                    "the producer dropped the record".into(),
                                )),
                            };
                            room.notify_waiters();
                            (i, r)
                        });
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        // librdkafka's queue is full (shared by every worker): wait until a
                        // delivery report, ours or another worker's, frees a slot.
                        tokio::select! {
                            Some((j, r)) = pending.next() => results[j] = r,
                            _ = &mut freed => {}
                            _ = tokio::time::sleep_until(deadline) => break 'messages,
                            _ = abort.cancelled() => break 'messages,
                        }
                    }
                    Err((e, _)) => {
                        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                            health.fatal.store(true, Ordering::Relaxed);
                        }
                        results[i] = Err(classify(&e));
                        break;
                    }
                }
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        await_confirms(&mut results, pending, left, abort).await;
        if producer.client().fatal_error().is_some() {
            health.fatal.store(true, Ordering::Relaxed);
        }
        if !health.is_up() {
            // The sink failed, not the messages: no attempt is counted, and the worker stops
            // claiming until a broker is back.
            for r in &mut results {
                let transient = match r {
                    Err(PublishError::Timeout) => true,
                    Err(e @ PublishError::Kafka { .. }) => {
                        e.disposition() == super::Disposition::Retry
                    }
                    _ => false,
                };
                if transient {
                    *r = Err(down());
                }
            }
        }
        results
    }
}

/// Maps a Kafka error to a publish error.
///
/// Only errors about the message itself are permanent (dead-lettered at once). A missing topic
/// or a denied authorization is retried with backoff, like an unroutable AMQP message, so an
/// operator has `max_attempts` worth of backoff to fix the cluster before messages are
/// dead-lettered. Errors of the producer itself put the message back unattempted.
fn classify(e: &KafkaError) -> PublishError {
    let code = e.rdkafka_error_code();
    if matches!(
        code,
        Some(
            RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::PurgeQueue
                | RDKafkaErrorCode::PurgeInflight
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
        )
    ) {
        return PublishError::Connection(e.to_string());
    }
    let permanent = matches!(
        code,
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord
        )
    );
    PublishError::Kafka {
        code: code.map_or_else(|| "other".to_string(), snake_case),
        message: e.to_string(),
        permanent,
    }
}

/// `MessageSizeTooLarge` -> `message_size_too_large`: a bounded label from the error enum.
fn snake_case(code: RDKafkaErrorCode) -> String {
    let name = format!("{code:?}");
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::Disposition;
    use super::*;

    fn produce_error(code: RDKafkaErrorCode) -> PublishError {
        classify(&KafkaError::MessageProduction(code))
    }

    #[test]
    fn error_codes_become_bounded_labels() {
        assert_eq!(
            snake_case(RDKafkaErrorCode::MessageSizeTooLarge),
            "message_size_too_large"
        );
        let e = produce_error(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(e.reason(), "kafka_message_size_too_large");
        assert_eq!(e.disposition(), Disposition::DeadLetter);
    }

    #[test]
    fn only_message_errors_dead_letter_at_once() {
        for code in [
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::InvalidMessage,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert_eq!(
                produce_error(code).disposition(),
                Disposition::Retry,
                "{code:?}"
            );
        }
        for code in [
            RDKafkaErrorCode::Fatal,
            RDKafkaErrorCode::PurgeQueue,
            RDKafkaErrorCode::AllBrokersDown,
        ] {
            let e = produce_error(code);
            assert_eq!(e.disposition(), Disposition::PutBack, "{code:?}");
            assert!(e.breaks_sink());
        }
    }

    #[test]
    fn user_properties_override_the_defaults() {
        let mut config = KafkaSinkConfig {
            brokers: "b:9092".into(),
            properties: Default::default(),
            sasl_password_file: None,
        };
        config.properties.insert("linger.ms".into(), "50".into());
        let cc = client_config(&config).unwrap();
        assert_eq!(cc.get("linger.ms"), Some("50"));
        assert_eq!(cc.get("acks"), Some("all"));
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("bootstrap.servers"), Some("b:9092"));
    }
}
