//! Waking on time: keyspace notifications, one idle claimer per trigger, bounded batches.

mod common;

use std::time::Duration;

use common::*;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_wakes_the_idle_worker_long_before_the_guard() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("wake").await;
    let key = format!("{}:{{wake}}", unique("delay"));
    let port = free_port();
    let cfg = base_config(port) + &amqp_trigger("wake", &key, &capture, "guard_interval = \"60s\"");
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    let labels = [("trigger", "wake")];
    // Every worker has made its first (empty) claim and the idle one sleeps on a 60 s guard.
    let (settled, _) = bridge
        .wait_scrape(Duration::from_secs(5), |b| {
            metric_value(b, "delay_bridge_empty_claims_total", &labels) >= 4.0
        })
        .await;
    assert!(settled, "{}", bridge.log());
    let woken_before = bridge
        .metric("delay_bridge_notify_wakeups_total", &labels)
        .await;
    schedule_now(&mut r, &key, ["wake up"]).await;
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() == 1).await,
        "not delivered before the 60 s guard: {}",
        bridge.log()
    );
    let woken = bridge
        .metric("delay_bridge_notify_wakeups_total", &labels)
        .await;
    assert!(
        woken > woken_before,
        "delivered because a notification woke the worker"
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_trigger_claims_once_per_guard_tick_not_once_per_worker() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("idle").await;
    let key = format!("{}:{{idle}}", unique("delay"));
    let port = free_port();
    let cfg = base_config(port)
        + &amqp_trigger(
            "idle",
            &key,
            &capture,
            "workers = 8\nguard_interval = \"1s\"",
        );
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    let labels = [("trigger", "idle")];
    // Let the start-up claims (one per worker) pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = bridge
        .metric("delay_bridge_empty_claims_total", &labels)
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = bridge
        .metric("delay_bridge_empty_claims_total", &labels)
        .await
        - before;
    // Guard ticks are jittered into [0.75 s, 1 s]: at most 8 in 6 s, however many workers.
    assert!(
        (5.0..=9.0).contains(&during),
        "{during} empty claims in 6 s with 8 workers"
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_never_exceed_the_batch_and_a_backlog_drains_fully() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("batch").await;
    let key = format!("{}:{{batch}}", unique("delay"));
    let now = redis_now(&mut r).await;
    zadd_all(&mut r, &key, (0..500).map(|i| (now - 10, format!("m{i}")))).await;
    let port = free_port();
    let cfg = base_config(port) + &amqp_trigger("batch", &key, &capture, "workers = 3\nbatch = 8");
    let bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || capture.count() >= 500).await,
        "{}",
        bridge.log()
    );
    let labels = [("trigger", "batch")];
    let claims = bridge
        .metric("delay_bridge_claim_batch_size_count", &labels)
        .await;
    let at_most_8 = bridge
        .metric(
            "delay_bridge_claim_batch_size_bucket",
            &[("trigger", "batch"), ("le", "8")],
        )
        .await;
    assert!(
        claims >= 500.0 / 8.0,
        "{claims} claims for 500 members in batches of 8"
    );
    assert_eq!(
        at_most_8, claims,
        "every claim took at most `batch` members"
    );
    assert_eq!(
        bridge
            .metric("delay_bridge_messages_forwarded_total", &labels)
            .await,
        500.0
    );
    cleanup_keys(&mut r, &key).await;
}
