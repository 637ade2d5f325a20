//! Process-level faults: SIGKILL mid-drain loses nothing; SIGTERM drains and exits 0.

use crate::common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_then_restart_loses_nothing() {
    let (mut r, capture, key) = amqp_scene("kill", "delay", "kill").await;
    let n = 5000;
    schedule(&mut r, &key, n, 0).await;
    let options = "workers = 2\nbatch = 20\nlease = \"2s\"\npublish_timeout = \"1s\"";
    let bridge = amqp_bridge("kill", &key, &capture, options);
    let bridge = sigkill_mid_drain(bridge, &capture, n, "sigkill").await;
    let seen = capture.tally();
    assert_eq!(seen.len(), n, "zero lost");
    assert_none_lost(&seen, n);
    assert_eq!(queue_sizes(&mut r, &key).await.0, 0);
    stop_and_clean(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_leaves_nothing_in_flight() {
    let (mut r, capture, key) = amqp_scene("term", "delay", "term").await;
    let n = 3000;
    schedule(&mut r, &key, n, 0).await;
    let mut bridge = amqp_bridge("term", &key, &capture, "workers = 4\nbatch = 50");
    bridge
        .expect_arrivals(200, Duration::from_secs(30), || capture.count())
        .await;
    bridge.terminate(Duration::from_secs(15)).await;
    let (left, inflight, _) = queue_sizes(&mut r, &key).await;
    assert_eq!(inflight, 0, "in-flight set empty after SIGTERM");
    // Everything confirmed before exit reaches the consumer; the rest is still queued.
    let delivered = || capture.tally().len();
    assert!(
        wait_until(Duration::from_secs(30), || delivered() + left as usize == n).await,
        "every message is either delivered or still queued: {} delivered, {left} queued, {n} scheduled",
        delivered()
    );
    cleanup_keys(&mut r, &key).await;
}
