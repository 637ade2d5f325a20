//! Kafka sink: an idempotent `acks=all` producer; a record counts only once its delivery report is in.

mod context;
mod delivery;
mod errors;
mod poller;
mod publisher;
mod room;

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{Producer, PurgeConfig};
use tokio_util::sync::CancellationToken;

use super::PublishError;
use crate::config::{KafkaRoute, KafkaSinkConfig};
use crate::metrics::Metrics;
use context::{Health, HealthContext};
pub use publisher::KafkaPublisher;
use room::Room;

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

type KafkaProducer = poller::Polled;

/// The producer in use and the health of that very instance.
#[derive(Clone)]
struct Instance {
    producer: KafkaProducer,
    health: Arc<Health>,
}

/// What the sink and its publishers share.
struct SinkState {
    name: String,
    config: ClientConfig,
    current: RwLock<Instance>,
    /// Room in librdkafka's queue, freed by delivery reports.
    room: Arc<Room>,
}

impl SinkState {
    fn current(&self) -> Instance {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn build(name: &str, config: &ClientConfig, room: &Arc<Room>) -> anyhow::Result<Instance> {
        let health = Arc::new(Health::default());
        let producer = poller::Polled::create(
            config,
            HealthContext {
                health: health.clone(),
                name: name.to_string(),
                room: room.clone(),
            },
        )?;
        Ok(Instance { producer, health })
    }
}

/// One producer per sink, shared by every worker (librdkafka batches internally).
pub struct KafkaSink {
    shared: Arc<SinkState>,
}

impl KafkaSink {
    /// Creates the producer (librdkafka connects in the background).
    pub fn new(name: &str, config: &KafkaSinkConfig) -> anyhow::Result<Self> {
        let mut cc = client_config(config)?;
        cc.set("client.id", format!("delay-bridge-{name}"));
        let room = Arc::new(Room::default());
        let current = SinkState::build(name, &cc, &room)?;
        Ok(Self {
            shared: Arc::new(SinkState {
                name: name.to_string(),
                config: cc,
                current: RwLock::new(current),
                room,
            }),
        })
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The sink's librdkafka settings (brokers, security, the user's properties) without the
    /// bridge's producer defaults, for a consumer on the same brokers (an ingress).
    pub fn consumer_config(&self) -> ClientConfig {
        let mut cc = self.shared.config.clone();
        for (k, _) in DEFAULT_PROPERTIES {
            if !matches!(*k, "reconnect.backoff.max.ms") {
                cc.remove(k);
            }
        }
        cc
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
        let fresh = match SinkState::build(
            &self.shared.name,
            &self.shared.config,
            &self.shared.room,
        ) {
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
        // Its event thread destroys it (purging what it holds) once no batch uses it.
        drop(old);
        self.shared.room.reset();
    }

    /// A handle for one worker producing to `route`; fails while no broker is up, so
    /// workers do not claim.
    pub fn publisher(&self, route: &KafkaRoute) -> Result<KafkaPublisher, PublishError> {
        if !self.is_up() {
            return Err(down());
        }
        Ok(KafkaPublisher {
            shared: self.shared.clone(),
            route: route.clone(),
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
