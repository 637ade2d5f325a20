//! Waking on time: keyspace notifications, one idle claimer per trigger, bounded batches.

use crate::common;

use std::time::Duration;

use common::*;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(15);

/// Claims that found nothing due.
const EMPTY_CLAIMS: &str = "delay_bridge_empty_claims_total";
/// Workers woken by a keyspace notification.
const WAKEUPS: &str = "delay_bridge_notify_wakeups_total";
/// 1 while keyspace notifications are subscribed.
const SUBSCRIBED: &str = "delay_bridge_keyspace_notifications_enabled";

/// Trigger `name` (with `options`) on a fresh key, and a bridge ready to drain it: Redis, the
/// capture, the key and the bridge.
async fn started(name: &str, options: &str) -> (Conn, AmqpCapture, String, Bridge) {
    let (r, capture, key) = amqp_scene(name, "delay", name).await;
    let bridge = ready_amqp_bridge(name, &key, &capture, options, READY).await;
    (r, capture, key, bridge)
}

/// Trigger lines: eight workers, the guard intervals without and with notifications.
fn eight_workers(guard: &str, notified_guard: &str) -> String {
    format!(
        "workers = 8\nguard_interval = \"{guard}\"\nnotified_guard_interval = \"{notified_guard}\""
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_wakes_the_idle_worker_long_before_the_guard() {
    let (mut r, capture, key, bridge) = started("wake", "guard_interval = \"60s\"").await;
    let labels = [("trigger", "wake")];
    // Subscribed, the first (empty) claims made: the idle worker sleeps on a 60 s guard.
    let (settled, _) = bridge
        .wait_scrape(Duration::from_secs(5), |b| {
            metric_value(b, SUBSCRIBED, &[]) == 1.0 && metric_value(b, EMPTY_CLAIMS, &labels) >= 1.0
        })
        .await;
    assert!(settled, "{}", bridge.log());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let woken_before = bridge.metric(WAKEUPS, &labels).await;
    schedule_now(&mut r, &key, ["wake up"]).await;
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() == 1).await,
        "not delivered before the 60 s guard: {}",
        bridge.log()
    );
    let woken = bridge.metric(WAKEUPS, &labels).await;
    assert!(
        woken > woken_before,
        "delivered because a notification woke the worker"
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_trigger_claims_once_per_guard_tick_not_once_per_worker() {
    let (mut r, _capture, key, bridge) = started("idle", &eight_workers("1s", "1s")).await;
    let labels = [("trigger", "idle")];
    // Let the start-up claims pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = bridge.metric(EMPTY_CLAIMS, &labels).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = bridge.metric(EMPTY_CLAIMS, &labels).await - before;
    // Guard ticks are jittered into [0.75 s, 1 s]: at most 8 in 6 s, however many workers.
    assert!(
        (5.0..=9.0).contains(&during),
        "{during} empty claims in 6 s with 8 workers"
    );
    cleanup_keys(&mut r, &key).await;
}

/// While keyspace notifications are subscribed they are the wake-up: an idle trigger sleeps
/// its `notified_guard_interval`, not its `guard_interval`, and starts with one claim, not
/// one per worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_idle_trigger_sleeps_the_notified_guard() {
    let (mut r, capture, key, bridge) = started("notified", &eight_workers("500ms", "60s")).await;
    let labels = [("trigger", "notified")];
    let (subscribed, _) = bridge
        .wait_scrape(Duration::from_secs(5), |b| {
            metric_value(b, SUBSCRIBED, &[]) == 1.0
        })
        .await;
    assert!(subscribed, "{}", bridge.log());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = bridge.metric(EMPTY_CLAIMS, &labels).await;
    // The first worker's claim, and one more once subscribed (a write may have been missed).
    assert!(
        (1.0..=3.0).contains(&start),
        "{start} empty claims at the start of 8 workers"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let idle = bridge.metric(EMPTY_CLAIMS, &labels).await - start;
    assert_eq!(idle, 0.0, "empty claims in 4 s on a 500 ms guard_interval");
    // A notification still wakes it at once.
    schedule_now(&mut r, &key, ["after a quiet spell"]).await;
    assert!(
        wait_until(Duration::from_secs(10), || capture.count() == 1).await,
        "not delivered before the 60 s guard: {}",
        bridge.log()
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_never_exceed_the_batch_and_a_backlog_drains_fully() {
    let (mut r, capture, key) = amqp_scene("batch", "delay", "batch").await;
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

/// A trickle on a trigger whose four workers all run (a backlog started them): each write
/// wakes one worker, which reads the head; a head due later is left to the head's timer with
/// no claim, and a claim that takes the members due does not claim again. The empty claims
/// stay far below one per message, let alone one per worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_on_four_workers_claims_only_what_is_due() {
    let (mut r, capture, key) = amqp_scene("trickle", "delay", "trickle").await;
    let now = redis_now(&mut r).await;
    // A backlog first: more than a batch due, so the other three workers start.
    zadd_all(&mut r, &key, (0..400).map(|i| (now - 10, format!("b{i}")))).await;
    let port = free_port();
    let cfg =
        base_config(port) + &amqp_trigger("trickle", &key, &capture, "workers = 4\nbatch = 16");
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    assert!(
        wait_until(Duration::from_secs(30), || capture.count() == 400).await,
        "{}",
        bridge.log()
    );
    let labels = [("trigger", "trickle")];
    let (subscribed, _) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, "delay_bridge_keyspace_notifications_enabled", &[]) == 1.0
                && metric_value(b, "delay_bridge_messages_forwarded_total", &labels) == 400.0
        })
        .await;
    assert!(subscribed, "{}", bridge.log());
    let before = bridge
        .metric("delay_bridge_empty_claims_total", &labels)
        .await;
    let reads_before = bridge
        .metric("delay_bridge_head_reads_total", &labels)
        .await;
    // 40 messages at about 10 a second, one write each: half due at once, half 50-250 ms
    // after their write (their claim comes from the head's timer).
    let n = 40;
    for i in 0..n {
        let now = redis_now(&mut r).await;
        let due = if i % 2 == 0 { now } else { now + 50 + 5 * i };
        zadd(&mut r, &key, due, format!("t{i}")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        wait_until(Duration::from_secs(20), || capture.count()
            == 400 + n as usize)
        .await,
        "{}",
        bridge.log()
    );
    let (settled, _) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, "delay_bridge_messages_forwarded_total", &labels) == 400.0 + n as f64
        })
        .await;
    assert!(settled, "{}", bridge.log());
    let empty = bridge
        .metric("delay_bridge_empty_claims_total", &labels)
        .await
        - before;
    let reads = bridge
        .metric("delay_bridge_head_reads_total", &labels)
        .await
        - reads_before;
    // Each write was read as the head; the 20 due later were claimed by the head's timer
    // alone. Claiming on every wake-up made one empty claim per message due later (0.5 per
    // message); four workers woken by each write made several per message.
    assert!(reads >= n as f64 / 2.0, "{reads} head reads for {n} writes");
    assert!(
        empty <= n as f64 / 4.0,
        "{empty} empty claims for {n} messages on 4 workers ({reads} head reads)"
    );
    cleanup_keys(&mut r, &key).await;
}

/// More shards than workers: one worker serves all four. Each shard a producer writes to is
/// claimed at once, not at the 60 s guard, and a shard written to while another drains a
/// backlog is served in turn, not after the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_over_four_shards_serves_each_woken_shard_in_turn() {
    const SHARDS: u32 = 4;
    let name = "shards-one-worker";
    let options = format!(
        "shards = {SHARDS}\nworkers = 1\nbatch = 5\nguard_interval = \"60s\"\nnotified_guard_interval = \"60s\""
    );
    let (mut r, capture, key, bridge) = started(name, &options).await;
    let labels = [("trigger", name)];
    // Subscribed, and every shard claimed from once: the worker sleeps on all four.
    let (settled, _) = bridge
        .wait_scrape(Duration::from_secs(5), |b| {
            metric_value(b, SUBSCRIBED, &[]) == 1.0
                && metric_value(b, EMPTY_CLAIMS, &labels) >= f64::from(SHARDS)
        })
        .await;
    assert!(settled, "{}", bridge.log());
    let shards: Vec<String> = (0..SHARDS)
        .map(|i| delay_bridge::keys::shard_key(&key, i, SHARDS).unwrap())
        .collect();
    for (i, shard) in shards.iter().enumerate() {
        schedule_now(&mut r, shard, [format!("lone-{i}")]).await;
        assert!(
            wait_until(Duration::from_secs(10), || capture.count() == i + 1).await,
            "shard {i} not claimed before the 60 s guard: {}",
            bridge.log()
        );
    }
    let backlog = 2000;
    schedule_now(
        &mut r,
        &shards[0],
        (0..backlog).map(|i| format!("backlog-{i}")),
    )
    .await;
    schedule_now(&mut r, &shards[2], ["woken-meanwhile"]).await;
    let all = shards.len() + backlog + 1;
    assert!(
        wait_until(Duration::from_secs(60), || capture.count() >= all).await,
        "{} of {all}: {}",
        capture.count(),
        bridge.log()
    );
    let order: Vec<Vec<u8>> = capture.snapshot().into_iter().map(|m| m.body).collect();
    let at = order
        .iter()
        .position(|b| b == b"woken-meanwhile")
        .expect("delivered");
    assert!(
        at < shards.len() + backlog / 2,
        "served after {} of the other shard's backlog of {backlog}",
        at - shards.len()
    );
    for shard in &shards {
        cleanup_keys(&mut r, shard).await;
    }
    cleanup_keys(&mut r, &key).await;
}
