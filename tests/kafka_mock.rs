//! The Kafka sink under broker faults, against librdkafka's in-process mock cluster: produce
//! errors, a fatal idempotence error, a full producer queue, outages and shutdown during one.

mod common;
#[path = "common/kafka.rs"]
mod kafka_common;

use std::time::{Duration, Instant};

use delay_bridge::bridge::Shutdown;
use delay_bridge::metrics::Metrics;
use figment::providers::{Format, Toml};
use figment::Figment;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use tokio_util::sync::CancellationToken;

use common::*;
use kafka_common::*;

const PARTITIONS: i32 = 3;
const SINK: &str = "mock";

type Mock = MockCluster<'static, DefaultProducerContext>;

/// A one-broker mock cluster with a 3-partition topic.
fn mock_cluster(topic: &str) -> Mock {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic(topic, PARTITIONS, 1).unwrap();
    mock
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
        // Extracted straight from the file: `config::load` also reads DELAY_BRIDGE_* variables,
        // and the test harness sets some of its own.
        let config: delay_bridge::config::Config = Figment::from(Toml::file_exact(&path))
            .extract()
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = Metrics::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(delay_bridge::bridge::run(
            config,
            metrics.clone(),
            Shutdown { stop: stop.clone() },
        ));
        Self {
            stop,
            task: Some(task),
            metrics,
            _dir: dir,
        }
    }

    fn sink_up(&self) -> bool {
        self.metrics.sink_up.with_label_values(&[SINK]).get() == 1
    }

    fn forwarded(&self, trigger: &str) -> u64 {
        self.metrics
            .forwarded
            .with_label_values(&[trigger, SINK])
            .get()
    }

    fn retried(&self, trigger: &str, reason: &str) -> u64 {
        self.metrics
            .retried
            .with_label_values(&[trigger, reason])
            .get()
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

/// A config producing to the mock cluster: fast reconnects and health updates.
fn config(port: u16, bootstrap: &str, properties: &[(&str, &str)], trigger: &str) -> String {
    let mut props = vec![
        ("reconnect.backoff.ms", "20"),
        ("reconnect.backoff.max.ms", "200"),
        ("statistics.interval.ms", "200"),
    ];
    props.extend_from_slice(properties);
    format!(
        r#"
[redis]
url = "{redis}"
enable_keyspace_events = true

[metrics]
listen = "127.0.0.1:{port}"
backlog_interval = "200ms"

[shutdown]
timeout = "4s"
"#,
        redis = redis_url(),
    ) + &kafka_sink(SINK, bootstrap, &props)
        + trigger
}

async fn schedule_now(r: &mut redis::aio::MultiplexedConnection, key: &str, members: &[String]) {
    let now = redis_now(r).await;
    let mut cmd = redis::cmd("ZADD");
    cmd.arg(key);
    for m in members {
        cmd.arg(now).arg(m);
    }
    let _: i64 = cmd.query_async(r).await.unwrap();
}

/// (source, in-flight, dead) sizes of a queue.
async fn sizes(r: &mut redis::aio::MultiplexedConnection, key: &str) -> (i64, i64, i64) {
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    redis::pipe()
        .zcard(&keys.source)
        .zcard(&keys.inflight)
        .zcard(&keys.dead)
        .query_async(r)
        .await
        .unwrap()
}

/// Polls the queue sizes until they equal `want`; returns the last ones seen.
async fn wait_sizes(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    want: (i64, i64, i64),
    timeout: Duration,
) -> (i64, i64, i64) {
    let end = Instant::now() + timeout;
    loop {
        let got = sizes(r, key).await;
        if got == want || Instant::now() >= end {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_produce_errors_are_retried_without_loss() {
    let mut r = redis().await;
    let topic = unique("transient");
    let mock = mock_cluster(&topic);
    let capture = KafkaCapture::start(&mock.bootstrap_servers(), &topic, PARTITIONS);
    let key = format!("{}:{{t}}", unique("delay"));
    let port = free_port();
    // librdkafka gives up on a record after 1.5 s of failed attempts; the bridge then retries
    // it itself, so both layers of retry are exercised.
    let trigger = kafka_trigger(
        "transient",
        &key,
        SINK,
        &topic,
        "workers = 2\nbatch = 10\nmax_attempts = 100\npublish_timeout = \"5s\"\n\
         backoff_initial = \"100ms\"\nbackoff_max = \"200ms\"",
    );
    let bridge = InProcess::start(&config(
        port,
        &mock.bootstrap_servers(),
        &[("message.timeout.ms", "1500")],
        &trigger,
    ));
    assert!(wait_until(Duration::from_secs(15), || bridge.sink_up()).await);

    let errors: Vec<RDKafkaRespErr> = (0..40)
        .map(|i| match i % 3 {
            0 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            1 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            _ => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        })
        .collect();
    mock.request_errors(RDKafkaApiKey::Produce, &errors);
    let expected = members("t", 200);
    schedule_now(&mut r, &key, &expected).await;

    let end = wait_sizes(&mut r, &key, (0, 0, 0), Duration::from_secs(90)).await;
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
    assert!(
        wait_until(Duration::from_secs(5), || bridge.forwarded("transient")
            == expected.len() as u64)
        .await
    );
    bridge.stop(Duration::from_secs(10)).await;
    capture.fence().await;
    let duplicates = assert_all_delivered(&capture, &expected);
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
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_dead_letters_with_its_reason_and_the_producer_goes_on() {
    let mut r = redis().await;
    let topic = unique("permanent");
    let mock = mock_cluster(&topic);
    let capture = KafkaCapture::start(&mock.bootstrap_servers(), &topic, PARTITIONS);
    let key = format!("{}:{{p}}", unique("delay"));
    let port = free_port();
    let trigger = kafka_trigger("permanent", &key, SINK, &topic, "workers = 1\nbatch = 1");
    let bridge = InProcess::start(&config(port, &mock.bootstrap_servers(), &[], &trigger));
    assert!(wait_until(Duration::from_secs(15), || bridge.sink_up()).await);

    // The broker rejects the next produce request as too large: retrying cannot help.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    schedule_now(&mut r, &key, &["victim".to_string()]).await;
    assert_eq!(
        wait_sizes(&mut r, &key, (0, 0, 1), Duration::from_secs(20)).await,
        (0, 0, 1)
    );
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let reason: String = redis::cmd("HGET")
        .arg(&keys.dead_reasons)
        .arg("victim")
        .query_async(&mut r)
        .await
        .unwrap();
    let reason: serde_json::Value = serde_json::from_str(&reason).unwrap();
    assert_eq!(reason["reason"], "kafka_message_size_too_large");
    assert_eq!(reason["attempts"], 1, "dead-lettered at the first failure");
    assert_eq!(
        bridge
            .metrics
            .dead_lettered
            .with_label_values(&["permanent", "kafka_message_size_too_large"])
            .get(),
        1
    );

    // The idempotent producer bumps its epoch and carries on with the next messages.
    let expected = members("after", 20);
    schedule_now(&mut r, &key, &expected).await;
    assert_eq!(
        wait_sizes(&mut r, &key, (0, 0, 1), Duration::from_secs(20)).await,
        (0, 0, 1)
    );
    assert!(
        wait_until(Duration::from_secs(10), || bridge.forwarded("permanent")
            == 20)
        .await
    );
    bridge.stop(Duration::from_secs(10)).await;
    capture.fence().await;
    assert_eq!(
        assert_all_delivered(&capture, &expected),
        0,
        "no duplicates"
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_idempotence_error_replaces_the_producer_without_loss() {
    let mut r = redis().await;
    let topic = unique("fatal");
    let mock = mock_cluster(&topic);
    let capture = KafkaCapture::start(&mock.bootstrap_servers(), &topic, PARTITIONS);
    let key = format!("{}:{{f}}", unique("delay"));
    let port = free_port();
    let trigger = kafka_trigger(
        "fatal",
        &key,
        SINK,
        &topic,
        "workers = 2\nbatch = 10\nmax_attempts = 2",
    );
    let bridge = InProcess::start(&config(port, &mock.bootstrap_servers(), &[], &trigger));
    assert!(wait_until(Duration::from_secs(15), || bridge.sink_up()).await);

    // A sequence error on the head-of-line request is fatal for an idempotent producer: from
    // then on it refuses every record. Without a new producer the queue would stall (or, with
    // retries counted, be dead-lettered).
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
    );
    let expected = members("f", 100);
    schedule_now(&mut r, &key, &expected).await;
    let end = wait_sizes(&mut r, &key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0), "delivered after the producer was replaced");
    let put_back = bridge.metrics.put_back.with_label_values(&["fatal"]).get();
    assert!(put_back > 0, "the fatal error hit a batch, which went back");
    bridge.stop(Duration::from_secs(10)).await;
    capture.fence().await;
    let duplicates = assert_all_delivered(&capture, &expected);
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
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_producer_queue_waits_for_room_and_loses_nothing() {
    let mut r = redis().await;
    let topic = unique("queuefull");
    let mock = mock_cluster(&topic);
    // Slow acknowledgements keep records queued, so batches run into the queue limit.
    mock.broker_round_trip_time(-1, Duration::from_millis(50))
        .unwrap();
    let capture = KafkaCapture::start(&mock.bootstrap_servers(), &topic, PARTITIONS);
    let key = format!("{}:{{q}}", unique("delay"));
    let port = free_port();
    // Timeouts far beyond the test's length: a duplicate could then only come from the queue
    // handling itself.
    let trigger = kafka_trigger(
        "queuefull",
        &key,
        SINK,
        &topic,
        "workers = 3\nbatch = 50\npublish_timeout = \"120s\"\nlease = \"240s\"",
    );
    let bridge = InProcess::start(&config(
        port,
        &mock.bootstrap_servers(),
        &[
            ("queue.buffering.max.messages", "8"),
            ("message.timeout.ms", "120000"),
        ],
        &trigger,
    ));
    assert!(wait_until(Duration::from_secs(15), || bridge.sink_up()).await);
    let expected = members("q", 600);
    schedule_now(&mut r, &key, &expected).await;
    let end = wait_sizes(&mut r, &key, (0, 0, 0), Duration::from_secs(60)).await;
    assert_eq!(end, (0, 0, 0));
    assert!(
        wait_until(Duration::from_secs(5), || bridge.forwarded("queuefull")
            == expected.len() as u64)
        .await
    );
    bridge.stop(Duration::from_secs(10)).await;
    capture.fence().await;
    assert_eq!(
        assert_all_delivered(&capture, &expected),
        0,
        "no duplicates"
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_stops_claiming_and_recovery_resumes_forwarding() {
    let mut r = redis().await;
    let topic = unique("outage");
    let mock = mock_cluster(&topic);
    let capture = KafkaCapture::start(&mock.bootstrap_servers(), &topic, PARTITIONS);
    let key = format!("{}:{{o}}", unique("delay"));
    let port = free_port();
    let trigger = kafka_trigger(
        "outage",
        &key,
        SINK,
        &topic,
        "workers = 3\nbatch = 20\nguard_interval = \"200ms\"",
    );
    let bridge = InProcess::start(&config(port, &mock.bootstrap_servers(), &[], &trigger));
    assert!(wait_until(Duration::from_secs(15), || bridge.sink_up()).await);
    let first = members("before", 10);
    schedule_now(&mut r, &key, &first).await;
    assert!(wait_until(Duration::from_secs(15), || bridge.forwarded("outage") == 10).await);

    mock.broker_down(-1).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || !bridge.sink_up()).await,
        "the sink noticed the outage"
    );
    let claims = bridge.claims("outage");
    let during = members("during", 50);
    schedule_now(&mut r, &key, &during).await;
    // Watch for a while: nothing may be claimed while no broker is up.
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        let (source, inflight, dead) = sizes(&mut r, &key).await;
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
    let end = wait_sizes(&mut r, &key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0), "forwarding resumed");
    assert!(wait_until(Duration::from_secs(5), || bridge.forwarded("outage") == 60).await);
    bridge.stop(Duration::from_secs(10)).await;
    capture.fence().await;
    let mut all = first.clone();
    all.extend(during);
    assert_eq!(assert_all_delivered(&capture, &all), 0, "no duplicates");
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_an_outage_puts_claimed_messages_back() {
    let mut r = redis().await;
    let topic = unique("shutdown");
    let mock = mock_cluster(&topic);
    let key = format!("{}:{{s}}", unique("delay"));
    let port = free_port();
    let trigger = kafka_trigger(
        "shutdown",
        &key,
        SINK,
        &topic,
        "workers = 2\nbatch = 25\npublish_timeout = \"30s\"\nlease = \"60s\"",
    );
    let toml = config(
        port,
        &mock.bootstrap_servers(),
        &[("message.timeout.ms", "30000")],
        &trigger,
    );
    let bridge = InProcess::start(&toml);
    assert!(wait_until(Duration::from_secs(15), || bridge.sink_up()).await);

    // Acknowledgements take longer than the test: claimed batches wait on their records ...
    mock.broker_round_trip_time(-1, Duration::from_secs(60))
        .unwrap();
    let expected = members("s", 100);
    schedule_now(&mut r, &key, &expected).await;
    // Each worker keeps several batches in flight: all 100 members end up claimed.
    let mut claimed = (0, 0, 0);
    for _ in 0..200 {
        claimed = sizes(&mut r, &key).await;
        if claimed.1 == 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(claimed, (0, 100, 0), "four batches in flight");
    // ... when the broker goes away altogether.
    mock.broker_down(-1).unwrap();
    assert!(wait_until(Duration::from_secs(10), || !bridge.sink_up()).await);

    let put_back = bridge.metrics.put_back.with_label_values(&["shutdown"]);
    let took = bridge.stop(Duration::from_secs(4 + 3)).await;
    println!("shutdown during an outage took {took:?} (shutdown.timeout 4s)");
    assert_eq!(
        sizes(&mut r, &key).await,
        (100, 0, 0),
        "in-flight set empty, every member back in the source set"
    );
    assert_eq!(put_back.get(), 100);
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let attempts: i64 = redis::cmd("HLEN")
        .arg(&keys.attempts)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(attempts, 0, "put back unattempted");

    // The same queue drains once a broker is back.
    mock.broker_round_trip_time(-1, Duration::ZERO).unwrap();
    mock.broker_up(-1).unwrap();
    let capture = KafkaCapture::start(&mock.bootstrap_servers(), &topic, PARTITIONS);
    let bridge = InProcess::start(&toml);
    let end = wait_sizes(&mut r, &key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0));
    bridge.stop(Duration::from_secs(10)).await;
    capture.fence().await;
    let duplicates = assert_all_delivered(&capture, &expected);
    println!(
        "after the outage: {} messages, lost 0, duplicates {duplicates}",
        expected.len()
    );
    cleanup_keys(&mut r, &key).await;
}
