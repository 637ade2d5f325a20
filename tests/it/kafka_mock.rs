//! The Kafka sink under broker faults, against librdkafka's in-process mock cluster: produce
//! errors, a fatal idempotence error, a full producer queue, outages and shutdown during one.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use delay_bridge::bridge::Shutdown;
use delay_bridge::metrics::Metrics;
use figment::providers::{Format, Toml};
use figment::Figment;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use tokio_util::sync::CancellationToken;

use common::kafka::*;
use common::*;

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

    /// Runs the bridge on [`Case::config`] and waits until its sink is up.
    async fn start(&self, properties: &[(&str, &str)], trigger_extra: &str) -> InProcess {
        InProcess::start(&self.config(properties, trigger_extra))
            .up()
            .await
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
        let config = delay_bridge::config::load_from(Figment::from(Toml::file_exact(&path)), &path)
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = Metrics::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(delay_bridge::bridge::run(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_produce_errors_are_retried_without_loss() {
    let mut r = redis().await;
    let case = Case::new("transient");
    let (mock, key) = (&case.mock, &case.key);
    let capture = case.capture();
    // librdkafka gives up on a record after 1.5 s of failed attempts; the bridge then retries
    // it itself, so both layers of retry are exercised.
    let bridge = case
        .start(
            &[("message.timeout.ms", "1500")],
            "workers = 2\nbatch = 10\nmax_attempts = 100\npublish_timeout = \"5s\"\n\
             backoff_initial = \"100ms\"\nbackoff_max = \"200ms\"",
        )
        .await;

    let errors: Vec<RDKafkaRespErr> = (0..40)
        .map(|i| match i % 3 {
            0 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            1 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            _ => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        })
        .collect();
    mock.request_errors(RDKafkaApiKey::Produce, &errors);
    let expected = members("t", 200);
    schedule_now(&mut r, key, &expected).await;

    let end = wait_for(&mut r, key, (0, 0, 0), Duration::from_secs(90)).await;
    assert_eq!(
        end,
        (0, 0, 0),
        "everything forwarded, nothing dead-lettered"
    );
    let retried = bridge.retried("transient", "kafka_message_timed_out");
    assert!(
        retried > 0,
        "some records outlived message.timeout.ms and were retried by the bridge"
    );
    bridge
        .expect_forwarded("transient", expected.len(), Duration::from_secs(5))
        .await;
    let duplicates = stop_and_tally(bridge, &capture, &expected).await;
    let late_attempts = capture
        .snapshot()
        .iter()
        .filter(|m| m.attempt() > Some(1))
        .count();
    println!(
        "transient errors: {} messages, 40 produce errors, lost 0, bridge retries {retried}, \
         records with attempt > 1: {late_attempts}, duplicates {duplicates}",
        expected.len()
    );
    assert!(
        late_attempts > 0,
        "x-delay-attempt counts the bridge's retries"
    );
    cleanup_keys(&mut r, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_dead_letters_with_its_reason_and_the_producer_goes_on() {
    let mut r = redis().await;
    let case = Case::new("permanent");
    let (mock, key) = (&case.mock, &case.key);
    let capture = case.capture();
    let bridge = case.start(&[], "workers = 1\nbatch = 1").await;

    // The broker rejects the next produce request as too large: retrying cannot help.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    schedule_now(&mut r, key, &["victim".to_string()]).await;
    assert_eq!(
        wait_for(&mut r, key, (0, 0, 1), Duration::from_secs(20)).await,
        (0, 0, 1)
    );
    let reason = dead_reason(&mut r, key, "victim").await.unwrap();
    assert_eq!(reason["reason"], "kafka_message_size_too_large");
    assert_eq!(reason["attempts"], 1, "dead-lettered at the first failure");
    assert_eq!(
        bridge
            .metrics
            .triggers
            .cells("permanent", SINK)
            .dead_lettered
            .get("kafka_message_size_too_large"),
        1
    );

    // The idempotent producer bumps its epoch and carries on with the next messages.
    let expected = members("after", 20);
    schedule_now(&mut r, key, &expected).await;
    assert_eq!(
        wait_for(&mut r, key, (0, 0, 1), Duration::from_secs(20)).await,
        (0, 0, 1)
    );
    bridge
        .expect_forwarded("permanent", 20, Duration::from_secs(10))
        .await;
    finish_without_duplicates(bridge, &capture, &expected, &mut r, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_idempotence_error_replaces_the_producer_without_loss() {
    let mut r = redis().await;
    let case = Case::new("fatal");
    let (mock, key) = (&case.mock, &case.key);
    let capture = case.capture();
    let bridge = case
        .start(&[], "workers = 2\nbatch = 10\nmax_attempts = 2")
        .await;

    // A sequence error on the head-of-line request is fatal for an idempotent producer: from
    // then on it refuses every record. Without a new producer the queue would stall (or, with
    // retries counted, be dead-lettered).
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
    );
    let expected = members("f", 100);
    schedule_now(&mut r, key, &expected).await;
    let end = wait_for(&mut r, key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0), "delivered after the producer was replaced");
    let put_back = put_back_of(&bridge, "fatal");
    assert!(put_back > 0, "the fatal error hit a batch, which went back");
    let duplicates = stop_and_tally(bridge, &capture, &expected).await;
    let retried: usize = capture
        .snapshot()
        .iter()
        .filter(|m| m.attempt() != Some(1))
        .count();
    println!(
        "fatal error: {} messages, lost 0, duplicates {duplicates}, put back {put_back}, \
         attempt > 1: {retried}",
        expected.len()
    );
    assert_eq!(
        retried, 0,
        "the producer failed, not the messages: no attempt counted"
    );
    cleanup_keys(&mut r, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_producer_queue_waits_for_room_and_loses_nothing() {
    let mut r = redis().await;
    let case = Case::new("queuefull");
    let key = &case.key;
    // Slow acknowledgements keep records queued, so batches run into the queue limit.
    case.mock
        .broker_round_trip_time(-1, Duration::from_millis(50))
        .unwrap();
    let capture = case.capture();
    // Timeouts far beyond the test's length: a duplicate could then only come from the queue
    // handling itself.
    let properties = [
        ("queue.buffering.max.messages", "8"),
        ("message.timeout.ms", "120000"),
    ];
    let bridge = case
        .start(
            &properties,
            "workers = 3\nbatch = 50\npublish_timeout = \"120s\"\nlease = \"240s\"",
        )
        .await;
    let expected = members("q", 600);
    schedule_now(&mut r, key, &expected).await;
    let end = wait_for(&mut r, key, (0, 0, 0), Duration::from_secs(60)).await;
    assert_eq!(end, (0, 0, 0));
    bridge
        .expect_forwarded("queuefull", expected.len(), Duration::from_secs(5))
        .await;
    finish_without_duplicates(bridge, &capture, &expected, &mut r, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_stops_claiming_and_recovery_resumes_forwarding() {
    let mut r = redis().await;
    let case = Case::new("outage");
    let (mock, key) = (&case.mock, &case.key);
    let capture = case.capture();
    let bridge = case
        .start(&[], "workers = 3\nbatch = 20\nguard_interval = \"200ms\"")
        .await;
    let first = members("before", 10);
    schedule_now(&mut r, key, &first).await;
    bridge
        .expect_forwarded("outage", 10, Duration::from_secs(15))
        .await;

    mock.broker_down(-1).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || !bridge.sink_up()).await,
        "the sink noticed the outage"
    );
    let claims = bridge.claims("outage");
    let during = members("during", 50);
    schedule_now(&mut r, key, &during).await;
    // Watch for a while: nothing may be claimed while no broker is up.
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        let (source, inflight, dead) = queue_sizes(&mut r, key).await;
        assert_eq!(
            (source, inflight, dead),
            (50, 0, 0),
            "members stay in the source set during the outage"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        bridge.claims("outage"),
        claims,
        "no member claimed while the broker is down"
    );

    mock.broker_up(-1).unwrap();
    let end = wait_for(&mut r, key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0), "forwarding resumed");
    bridge
        .expect_forwarded("outage", 60, Duration::from_secs(5))
        .await;
    let mut all = first.clone();
    all.extend(during);
    finish_without_duplicates(bridge, &capture, &all, &mut r, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_an_outage_puts_claimed_messages_back() {
    let mut r = redis().await;
    let case = Case::new("shutdown");
    let (mock, key) = (&case.mock, &case.key);
    let toml = case.config(
        &[("message.timeout.ms", "30000")],
        "workers = 2\nbatch = 25\npublish_timeout = \"30s\"\nlease = \"60s\"",
    );
    let bridge = InProcess::start(&toml).up().await;

    // Acknowledgements take longer than the test: claimed batches wait on their records ...
    mock.broker_round_trip_time(-1, Duration::from_secs(60))
        .unwrap();
    let expected = members("s", 100);
    schedule_now(&mut r, key, &expected).await;
    // Each worker keeps several batches in flight: all 100 members end up claimed.
    let (_, claimed) = poll(
        Duration::from_secs(4),
        Duration::from_millis(20),
        async || queue_sizes(&mut r, key).await,
        |s| s.1 == 100,
    )
    .await;
    assert_eq!(claimed, (0, 100, 0), "four batches in flight");
    // ... when the broker goes away altogether.
    mock.broker_down(-1).unwrap();
    assert!(wait_until(Duration::from_secs(10), || !bridge.sink_up()).await);

    let cells = bridge
        .metrics
        .triggers
        .find("shutdown")
        .expect("the trigger's series");
    let took = bridge.stop(Duration::from_secs(4 + 3)).await;
    println!("shutdown during an outage took {took:?} (shutdown.timeout 4s)");
    assert_eq!(
        queue_sizes(&mut r, key).await,
        (100, 0, 0),
        "in-flight set empty, every member back in the source set"
    );
    assert_eq!(cells.put_back.load(Ordering::Relaxed), 100);
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    assert_eq!(
        hlen(&mut r, &keys.attempts).await,
        0,
        "put back unattempted"
    );

    // The same queue drains once a broker is back.
    mock.broker_round_trip_time(-1, Duration::ZERO).unwrap();
    mock.broker_up(-1).unwrap();
    let capture = case.capture();
    let bridge = InProcess::start(&toml);
    let end = wait_for(&mut r, key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0));
    let duplicates = stop_and_tally(bridge, &capture, &expected).await;
    println!(
        "after the outage: {} messages, lost 0, duplicates {duplicates}",
        expected.len()
    );
    cleanup_keys(&mut r, key).await;
}

/// Messages trigger `trigger` put back so far.
fn put_back_of(bridge: &InProcess, trigger: &str) -> u64 {
    bridge
        .metrics
        .triggers
        .find(trigger)
        .map_or(0, |c| c.put_back.load(Ordering::Relaxed))
}
