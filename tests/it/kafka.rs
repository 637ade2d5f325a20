//! End-to-end forwarding to a real Kafka-protocol broker (tansu in CI): due times, cancel and
//! reschedule, record keys and partitions, headers, exact bytes, size limits, SIGKILL.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::kafka::*;
use common::*;

const PARTITIONS: i32 = 3;

/// A fresh 3-partition topic and a consumer reading all of it from the beginning.
async fn topic(prefix: &str) -> (String, KafkaCapture) {
    new_topic(prefix, PARTITIONS).await
}

/// A test bridge producing to the Kafka broker through sink `kafka`, with librdkafka
/// `properties`, and `trigger`.
fn config(port: u16, properties: &[(&str, &str)], trigger: &str) -> String {
    let settings = ConfigToml::base(port).kafka_sink("kafka", &kafka_brokers(), properties);
    settings.to_string() + trigger
}

/// Starts a bridge on [`config`] and waits until it is ready.
async fn start(properties: &[(&str, &str)], trigger: &str) -> Bridge {
    let port = free_port();
    Bridge::start(&config(port, properties, trigger), port)
        .ready(Duration::from_secs(20))
        .await
}

/// Deletes the test's queue keys and, once `capture` stopped reading it, its topic.
async fn cleanup(r: &mut Conn, key: &str, capture: KafkaCapture) {
    cleanup_keys(r, key).await;
    capture.delete().await;
}

/// Stops the bridge with SIGTERM (exit 0), then waits until the consumer has read every record
/// in the topic; returns how many that is. Nothing can be written after the bridge exited, so
/// the count is final: a duplicate cannot hide in consumer lag.
async fn stop_and_count(bridge: &mut Bridge, capture: &KafkaCapture) -> usize {
    bridge.terminate(Duration::from_secs(20)).await;
    capture.fence().await;
    capture.count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_members_arrive_once_never_early_with_headers_and_exact_bytes() {
    let mut r = redis().await;
    let (topic, capture) = topic("due").await;
    let key = format!("{}:{{orders}}", unique("delay"));
    let trigger = kafka_trigger("orders", &key, "kafka", &topic, "workers = 3\nbatch = 4");
    let mut bridge = start(&[], &trigger).await;

    let expected = schedule_orders(&mut r, &key).await;

    capture
        .expect_arrivals(expected.len(), Duration::from_secs(30), &bridge)
        .await;
    assert!(
        forwarded(&bridge, "orders", expected.len()).await,
        "{}",
        bridge.log()
    );
    assert_eq!(
        queue_sizes(&mut r, &key).await,
        (0, 0, 0),
        "forwarded members leave Redis"
    );
    assert_eq!(
        stop_and_count(&mut bridge, &capture).await,
        expected.len(),
        "each message exactly once"
    );
    let got = capture.snapshot();
    assert_eq!(got.len(), expected.len());
    for m in &got {
        let due = expected
            .get(&m.body)
            .unwrap_or_else(|| panic!("unexpected body {:?}", m.body));
        assert!(
            m.at_ms >= *due,
            "arrived {} ms before its due time",
            due - m.at_ms
        );
        assert_eq!(m.header("x-delay-due-ms"), Some(due.to_string()));
        assert_eq!(m.header("x-delay-attempt").as_deref(), Some("1"));
        assert_eq!(m.header("x-delay-trigger").as_deref(), Some("orders"));
        let id = m.header("x-delay-id").expect("x-delay-id header");
        assert_eq!(
            id,
            delay_bridge::parts::sink::MessageId::new(&key, &m.body).as_str()
        );
        assert_eq!(m.key, None, "kafka_key defaults to none");
    }
    cleanup(&mut r, &key, capture).await;
}

/// Waits until the bridge's metrics say `n` messages of `trigger` were forwarded.
async fn forwarded(bridge: &Bridge, trigger: &str, n: usize) -> bool {
    let labels = [("trigger", trigger)];
    bridge
        .wait_scrape(Duration::from_secs(10), |body| {
            metric_value(body, "delay_bridge_messages_forwarded_total", &labels) >= n as f64
        })
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reschedule_are_honoured() {
    let mut r = redis().await;
    let (topic, capture) = topic("cr").await;
    let key = unique("delay-plain");
    let trigger = kafka_trigger("cr", &key, "kafka", &topic, "");
    let mut bridge = start(&[], &trigger).await;

    let now = redis_now(&mut r).await;
    for (due, m) in [
        (now + 1500, "cancelled"),
        (now + 1000, "later"),
        (now + 6000, "sooner"),
        (now + 1600, "marker"),
    ] {
        zadd(&mut r, &key, due, m.as_bytes()).await;
    }
    // Cancel one, push one back, pull one forward.
    let _: () = redis::pipe()
        .cmd("ZREM")
        .arg(&key)
        .arg("cancelled")
        .cmd("ZADD")
        .arg(&key)
        .arg(now + 2500)
        .arg("later")
        .cmd("ZADD")
        .arg(&key)
        .arg(now + 300)
        .arg("sooner")
        .query_async(&mut r)
        .await
        .unwrap();

    capture
        .expect_arrivals(3, Duration::from_secs(20), &bridge)
        .await;
    assert!(forwarded(&bridge, "cr", 3).await, "{}", bridge.log());
    assert_eq!(
        queue_sizes(&mut r, &key).await,
        (0, 0, 0),
        "nothing left, the cancelled one included"
    );
    assert_eq!(
        stop_and_count(&mut bridge, &capture).await,
        3,
        "the cancelled member never went out"
    );
    let mut got = capture.snapshot();
    got.sort_by_key(|m| m.at_ms);
    let by_body: HashMap<&[u8], &Record> = got.iter().map(|m| (m.body.as_slice(), m)).collect();
    assert!(!by_body.contains_key(&b"cancelled"[..]));
    let sooner = by_body[&b"sooner"[..]];
    let later = by_body[&b"later"[..]];
    assert!(
        sooner.at_ms < now + 6000,
        "the earlier reschedule was honoured"
    );
    assert_eq!(
        sooner.header("x-delay-due-ms"),
        Some((now + 300).to_string())
    );
    assert!(
        later.at_ms >= now + 2500,
        "the later reschedule was honoured"
    );
    assert_eq!(
        later.header("x-delay-due-ms"),
        Some((now + 2500).to_string())
    );
    cleanup(&mut r, &key, capture).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_key_member_puts_every_copy_of_a_member_on_one_partition() {
    let mut r = redis().await;
    let (topic, capture) = topic("key").await;
    let key = format!("{}:{{k}}", unique("delay"));
    let trigger = kafka_trigger(
        "keyed",
        &key,
        "kafka",
        &topic,
        "kafka_key = \"member\"\nworkers = 2\nbatch = 3",
    );
    let mut bridge = start(&[], &trigger).await;
    let members: Vec<Vec<u8>> = (0..12u8)
        .map(|i| {
            let mut m = format!("member-{i}-").into_bytes();
            m.extend_from_slice(&[0xc3, i, 0xff]);
            m
        })
        .collect();
    // The same members scheduled again after each delivery: separate copies of one message.
    let rounds = 3;
    for round in 1..=rounds {
        schedule_now(&mut r, &key, &members).await;
        let want = members.len() * round;
        assert!(
            wait_until(Duration::from_secs(20), || capture.count() >= want).await,
            "round {round}: {} of {want}\n{}",
            capture.count(),
            bridge.log()
        );
        assert!(forwarded(&bridge, "keyed", want).await, "{}", bridge.log());
    }
    assert_eq!(
        stop_and_count(&mut bridge, &capture).await,
        members.len() * rounds,
        "one record per scheduled copy"
    );
    let mut partitions: HashMap<Vec<u8>, HashSet<i32>> = HashMap::new();
    for m in capture.snapshot() {
        assert_eq!(
            m.key.as_deref(),
            Some(m.body.as_slice()),
            "the key is the member bytes"
        );
        partitions.entry(m.body).or_default().insert(m.partition);
    }
    assert_eq!(partitions.len(), members.len());
    for (m, ps) in &partitions {
        assert_eq!(ps.len(), 1, "{m:?} landed on partitions {ps:?}");
    }
    let used: HashSet<i32> = partitions.values().flatten().copied().collect();
    println!(
        "kafka_key=member: {} members x {rounds} copies over partitions {used:?}",
        members.len()
    );
    cleanup(&mut r, &key, capture).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_size_limit_is_dead_lettered_and_the_rest_flow() {
    let mut r = redis().await;
    let (topic, capture) = topic("big").await;
    let key = format!("{}:{{big}}", unique("delay"));
    let trigger = kafka_trigger(
        "big",
        &key,
        "kafka",
        &topic,
        "batch = 10\nmax_attempts = 2\nbackoff_initial = \"100ms\"",
    );
    // librdkafka refuses records over message.max.bytes before they leave the process.
    let mut bridge = start(&[("message.max.bytes", "2000")], &trigger).await;
    let now = redis_now(&mut r).await;
    let big = vec![b'x'; 5000];
    zadd(&mut r, &key, now, &big).await;
    zadd_all(&mut r, &key, (0..5).map(|i| (now, format!("small-{i}")))).await;
    let dead = wait_sizes(&mut r, &key, Duration::from_secs(15), |s| *s == (0, 0, 1)).await;
    assert_eq!(dead, (0, 0, 1), "{}", bridge.log());
    let reason = dead_reason(&mut r, &key, &big).await.unwrap();
    assert_eq!(reason["reason"], "kafka_message_size_too_large");
    assert_eq!(
        reason["attempts"], 2,
        "the record's own fault: counted, then dead-lettered"
    );
    capture
        .expect_arrivals(5, Duration::from_secs(10), &bridge)
        .await;
    assert_eq!(stop_and_count(&mut bridge, &capture).await, 5);
    assert!(capture.snapshot().iter().all(|m| m.body != big));
    cleanup(&mut r, &key, capture).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_then_restart_loses_nothing() {
    let mut r = redis().await;
    let (topic, capture) = topic("kill").await;
    let key = format!("{}:{{kill}}", unique("delay"));
    let n = 4000;
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let trigger = kafka_trigger(
        "kill",
        &key,
        "kafka",
        &topic,
        "workers = 2\nbatch = 20\nlease = \"2s\"\npublish_timeout = \"1500ms\"",
    );
    let mut bridge = Bridge::start(&config(port, &[], &trigger), port);
    // Kill once a few hundred are out of the source set (Redis is ahead of the consumer).
    let _ = poll(
        Duration::from_secs(30),
        Duration::from_millis(10),
        async || queue_sizes(&mut r, &key).await.0,
        |left| *left <= n as i64 - 300,
    )
    .await;
    bridge.signal(9);
    assert!(bridge.wait_exit(Duration::from_secs(5)).await.is_some());
    let (left, inflight, _) = queue_sizes(&mut r, &key).await;
    assert!(
        left > 0 && left <= n as i64 - 300,
        "the kill must land mid-drain ({left} of {n} left)\n{}",
        bridge.log()
    );
    let mut bridge = bridge.restart();
    let end = wait_sizes(&mut r, &key, Duration::from_secs(90), |s| *s == (0, 0, 0)).await;
    assert_eq!(
        end,
        (0, 0, 0),
        "drained after the restart\n{}",
        bridge.log()
    );
    let records = stop_and_count(&mut bridge, &capture).await;
    let seen = capture.tally();
    let lost: Vec<usize> = (0..n)
        .filter(|i| !seen.contains_key(&body(*i, 0)))
        .collect();
    let duplicates = records - seen.len();
    println!(
        "kafka sigkill: {n} messages, lost {}, duplicates {duplicates} \
         (killed with {left} queued and {inflight} in flight)",
        lost.len()
    );
    assert!(lost.is_empty(), "lost {lost:?}");
    assert_eq!(seen.len(), n, "nothing but the scheduled messages");
    drop(bridge);
    cleanup(&mut r, &key, capture).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_go_to_the_dead_letter_topic_with_their_reason() {
    let mut r = redis().await;
    let (topic, dead_topic) = (unique("env"), unique("env-dead"));
    create_topic(&kafka_brokers(), &topic, PARTITIONS).await;
    create_topic(&kafka_brokers(), &dead_topic, 1).await;
    let capture = KafkaCapture::start(&kafka_brokers(), &topic, PARTITIONS);
    let dead = KafkaCapture::start(&kafka_brokers(), &dead_topic, 1);
    let key = format!("{}:{{kdlx}}", unique("delay"));
    let trigger = kafka_trigger(
        "kdlx",
        &key,
        "kafka",
        &topic,
        &format!("format = \"envelope\"\ndead_letter_topic = \"{dead_topic}\""),
    );
    let mut bridge = start(&[], &trigger).await;
    let good: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"body":"good {i}"}}"#))
        .collect();
    let bad: Vec<String> = (0..5).map(|i| format!("not an envelope {i}")).collect();
    schedule_now(&mut r, &key, good.iter().chain(&bad)).await;
    dead.expect_arrivals(bad.len(), Duration::from_secs(20), &bridge)
        .await;
    let drained = wait_sizes(&mut r, &key, Duration::from_secs(10), |s| *s == (0, 0, 0)).await;
    assert_eq!(drained, (0, 0, 0), "forwarded dead letters left Redis");
    assert_eq!(stop_and_count(&mut bridge, &capture).await, good.len());
    dead.fence().await;
    let got = dead.snapshot();
    assert_eq!(got.len(), bad.len(), "each dead letter once");
    for m in &got {
        assert!(bad.iter().any(|b| b.as_bytes() == m.body), "{m:?}");
        assert_eq!(
            m.header("x-delay-dead-reason").as_deref(),
            Some("bad_envelope")
        );
        assert_eq!(m.header("x-delay-dead-attempts").as_deref(), Some("1"));
        assert!(m.header("x-delay-dead-detail").is_some(), "{m:?}");
        assert_eq!(m.header("x-delay-trigger").as_deref(), Some("kdlx"));
    }
    // Every consumer stops before its topic goes (see `KafkaCapture::delete`).
    drop(bridge);
    dead.delete().await;
    cleanup(&mut r, &key, capture).await;
}
