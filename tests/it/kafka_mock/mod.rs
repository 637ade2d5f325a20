//! The Kafka sink under broker faults, against librdkafka's in-process mock cluster: produce
//! errors, a fatal idempotence error, a full producer queue, outages and shutdown during one.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use delay_bridge::parts::bridge::Shutdown;
use delay_bridge::parts::metrics::Metrics;
use figment::providers::{Format, Toml};
use figment::Figment;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use tokio_util::sync::CancellationToken;

use common::kafka::*;
use common::*;

mod errors;
mod outages;

const PARTITIONS: i32 = 3;
const SINK: &str = "mock";

type Mock = MockCluster<'static, DefaultProducerContext>;

/// One test's world: trigger `name` draining a fresh queue key into a fresh 3-partition topic
/// of its own one-broker mock cluster, through sink `mock`.
struct Case {
    name: &'static str,
    key: String,
    topic: String,
    mock: Mock,
}

impl Case {
    /// A connection to the shared Redis, and the case.
    async fn open(name: &'static str) -> (Conn, Self) {
        (redis().await, Self::new(name))
    }

    fn new(name: &'static str) -> Self {
        let topic = unique(name);
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic(&topic, PARTITIONS, 1).unwrap();
        Self {
            name,
            key: format!("{}:{{{name}}}", unique("delay")),
            topic,
            mock,
        }
    }

    /// A consumer reading the whole topic from the start.
    fn capture(&self) -> KafkaCapture {
        KafkaCapture::start(&self.mock.bootstrap_servers(), &self.topic, PARTITIONS)
    }

    /// The bridge's config: the trigger with `trigger_extra` lines; librdkafka `properties`
    /// on top of fast reconnects and health updates.
    fn config(&self, properties: &[(&str, &str)], trigger_extra: &str) -> String {
        let mut props = vec![
            ("reconnect.backoff.ms", "20"),
            ("reconnect.backoff.max.ms", "200"),
            ("statistics.interval.ms", "200"),
        ];
        props.extend_from_slice(properties);
        let settings = ConfigToml::base(free_port())
            .without("log")
            .without("sinks.rabbit")
            .set_str("shutdown", "timeout", "4s")
            .kafka_sink(SINK, &self.mock.bootstrap_servers(), &props);
        let trigger = kafka_trigger(self.name, &self.key, SINK, &self.topic, trigger_extra);
        settings.to_string() + &trigger
    }

    /// A consumer of the topic, then the bridge on [`Case::config`] once its sink is up.
    async fn start(
        &self,
        properties: &[(&str, &str)],
        trigger_extra: &str,
    ) -> (KafkaCapture, InProcess) {
        let capture = self.capture();
        let bridge = InProcess::start(&self.config(properties, trigger_extra));
        (capture, bridge.up().await)
    }
}

/// The library's daemon running in a task of this test, with its metrics at hand.
struct InProcess {
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    metrics: Metrics,
    _dir: tempfile::TempDir,
}

impl InProcess {
    /// Runs the bridge on the config `toml`.
    fn start(toml: &str) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info,delay_bridge=debug")
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bridge.toml");
        std::fs::write(&path, toml).unwrap();
        // Loaded from the file alone (validated, routes resolved): `config::load` also reads
        // DELAY_BRIDGE_* variables, and the test harness sets some of its own.
        let config =
            delay_bridge::parts::config::load_from(Figment::from(Toml::file_exact(&path)), &path)
                .unwrap_or_else(|e| panic!("{e}"));
        let metrics = Metrics::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(delay_bridge::parts::bridge::run(
            config,
            metrics.clone(),
            Shutdown {
                stop: stop.clone(),
                reload: None,
            },
        ));
        Self {
            stop,
            task: Some(task),
            metrics,
            _dir: dir,
        }
    }

    /// Waits until the sink is up (asserting it is within 15 s) and returns the bridge.
    async fn up(self) -> Self {
        assert!(
            wait_until(Duration::from_secs(15), || self.sink_up()).await,
            "the sink never came up"
        );
        self
    }

    fn sink_up(&self) -> bool {
        self.metrics.sink_up.with_label_values(&[SINK]).get() == 1
    }

    fn forwarded(&self, trigger: &str) -> u64 {
        self.metrics
            .triggers
            .cells(trigger, SINK)
            .forwarded
            .load(Ordering::Relaxed)
    }

    /// Asserts that exactly `n` messages of `trigger` are counted as forwarded within `timeout`.
    async fn expect_forwarded(&self, trigger: &str, n: usize, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.forwarded(trigger) == n as u64).await,
            "{trigger}: {} forwarded, expected {n}",
            self.forwarded(trigger)
        );
    }

    fn retried(&self, trigger: &str, reason: &str) -> u64 {
        self.metrics
            .triggers
            .cells(trigger, SINK)
            .retried
            .get(reason)
    }

    /// Claims that took at least one member.
    fn claims(&self, trigger: &str) -> u64 {
        self.metrics
            .claim_batch_size
            .with_label_values(&[trigger])
            .get_sample_count()
    }

    /// Stops the bridge and returns how long `run` took to return (panics past `limit`).
    async fn stop(mut self, limit: Duration) -> Duration {
        let started = Instant::now();
        self.stop.cancel();
        let task = self.task.take().unwrap();
        let result = tokio::time::timeout(limit, task)
            .await
            .unwrap_or_else(|_| panic!("the bridge did not stop within {limit:?}"));
        result.unwrap().unwrap();
        started.elapsed()
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Polls the queue sizes until they equal `want`; returns the last ones seen.
async fn wait_for(r: &mut Conn, key: &str, want: Sizes, timeout: Duration) -> Sizes {
    wait_sizes(r, key, timeout, |got| *got == want).await
}

fn members(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// Every scheduled member read at least once: returns the duplicates.
fn assert_all_delivered(capture: &KafkaCapture, expected: &[String]) -> usize {
    let seen = capture.tally();
    let lost: Vec<&String> = expected
        .iter()
        .filter(|m| !seen.contains_key(m.as_bytes()))
        .collect();
    assert!(lost.is_empty(), "lost {} members: {lost:?}", lost.len());
    assert_eq!(seen.len(), expected.len(), "only the scheduled members");
    seen.values().map(|c| c - 1).sum()
}

/// Stops the bridge, lets the consumer read everything and asserts every scheduled member was
/// read: returns the duplicates.
async fn stop_and_tally(bridge: InProcess, capture: &KafkaCapture, expected: &[String]) -> usize {
    bridge.stop(Duration::from_secs(10)).await;
    capture.fence().await;
    assert_all_delivered(capture, expected)
}

/// Stops the bridge, asserts every scheduled member was read exactly once, and removes the
/// queue.
async fn finish_without_duplicates(
    bridge: InProcess,
    capture: &KafkaCapture,
    expected: &[String],
    r: &mut Conn,
    key: &str,
) {
    assert_eq!(
        stop_and_tally(bridge, capture, expected).await,
        0,
        "no duplicates"
    );
    cleanup_keys(r, key).await;
}

/// Messages trigger `trigger` put back so far.
fn put_back_of(bridge: &InProcess, trigger: &str) -> u64 {
    bridge
        .metrics
        .triggers
        .find(trigger)
        .map_or(0, |c| c.put_back.load(Ordering::Relaxed))
}
