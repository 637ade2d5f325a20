//! The HTTP sink when its endpoint goes away: nothing dead-lettered, nothing lost.

use crate::common;

use std::time::{Duration, Instant};

use common::webhook::*;
use common::*;

use super::{
    expect_all_delivered, expect_kept, expect_settled, hook_lines, http_bridge, http_bridge_with,
    new_key, scheduled, FAST_RETRY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_down_for_10s_dead_letters_nothing_and_gets_everything_after() {
    let mut r = redis().await;
    let mut hook = Webhook::ok().await;
    let key = new_key("down");
    // Two attempts: a failure counted against the messages would dead-letter them.
    let lines = hook_lines(&hook, &format!("max_attempts = 2\n{FAST_RETRY}"));
    let bridge = http_bridge(&key, &lines)
        .ready(Duration::from_secs(20))
        .await;
    schedule(&mut r, &key, 20, 0).await;
    expect_settled(&mut r, &key, 0, &bridge).await;

    hook.stop().await;
    let down_at = Instant::now();
    let now = redis_now(&mut r).await;
    zadd_all(&mut r, &key, (20..50).map(|i| (now + i as i64, body(i, 0)))).await;
    bridge
        .expect_readyz_saying(503, "unreachable", Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(down_at.elapsed())).await;
    expect_kept(&mut r, &key, 30).await;

    hook.resume().await;
    expect_all_delivered(&mut r, &key, 50, &hook, &bridge).await;
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, _| Answer::status(200).after(Duration::from_millis(2))).await;
    let n = 2000;
    let key = scheduled(&mut r, "kill", n).await;
    let lines = hook_lines(
        &hook,
        "workers = 2\nbatch = 20\nlease = \"2s\"\npublish_timeout = \"1s\"",
    );
    let mut bridge = http_bridge(&key, &lines);
    assert!(
        wait_until(Duration::from_secs(30), || hook.count() >= 300).await,
        "{}",
        bridge.log()
    );
    bridge.signal(9);
    assert!(bridge.wait_exit(Duration::from_secs(5)).await.is_some());
    let before = hook.tally().len();
    assert!(before < n, "killed mid-stream ({before} of {n} delivered)");
    let bridge = bridge.restart();
    expect_all_delivered(&mut r, &key, n, &hook, &bridge).await;
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_whose_name_does_not_resolve_is_the_sinks_failure() {
    let mut r = redis().await;
    let key = new_key("nxdomain");
    schedule_now(&mut r, &key, ["a", "b", "c"]).await;
    let lines =
        format!("url = \"http://no-such-host.invalid/hook\"\nmax_attempts = 1\n{FAST_RETRY}");
    let bridge = http_bridge(&key, &lines);
    bridge
        .expect_readyz_saying(503, "no-such-host.invalid", Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (waiting, inflight, dead) = queue_sizes(&mut r, &key).await;
    assert_eq!(dead, 0, "nothing dead-lettered");
    assert_eq!(waiting + inflight, 3);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_the_answers_and_leaves_nothing_in_flight() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, _| Answer::status(200).after(Duration::from_millis(300))).await;
    let n = 400;
    let key = scheduled(&mut r, "term", n).await;
    // One worker: what it holds claimed is answered well within the shutdown timeout.
    let lines = hook_lines(&hook, "batch = 20\nworkers = 1");
    let settings = [("max_concurrency", "8")];
    let mut bridge = http_bridge_with(&settings, &key, &lines);
    assert!(
        wait_until(Duration::from_secs(30), || hook.count() >= 40).await,
        "{}",
        bridge.log()
    );
    bridge.terminate(Duration::from_secs(15)).await;
    let (left, inflight, dead) = queue_sizes(&mut r, &key).await;
    assert_eq!((inflight, dead), (0, 0), "nothing in flight after SIGTERM");
    let delivered = hook.tally().len();
    assert!(delivered < n, "stopped mid-stream");
    assert_eq!(
        delivered + left as usize,
        n,
        "every message delivered or still queued"
    );
    cleanup_keys(&mut r, &key).await;
}
