//! The HTTP sink when its endpoint goes away: nothing dead-lettered, nothing lost.

use crate::common;

use std::time::{Duration, Instant};

use common::webhook::*;
use common::*;
use delay_bridge::keys::QueueKeys;

use super::{expect_settled, http_bridge, http_config, new_key, FAST_RETRY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_down_for_10s_dead_letters_nothing_and_gets_everything_after() {
    let mut r = redis().await;
    let mut hook = Webhook::ok().await;
    let key = new_key("down");
    // Two attempts: a failure counted against the messages would dead-letter them.
    let lines = format!(
        "url = {}\nmax_attempts = 2\n{FAST_RETRY}",
        quoted(&hook.url("/"))
    );
    let bridge = http_bridge(&key, &lines)
        .ready(Duration::from_secs(20))
        .await;
    schedule(&mut r, &key, 20, 0).await;
    expect_settled(&mut r, &key, 0, &bridge).await;

    hook.stop().await;
    let down_at = Instant::now();
    let now = redis_now(&mut r).await;
    zadd_all(&mut r, &key, (20..50).map(|i| (now + i as i64, body(i, 0)))).await;
    let (said, answer) = bridge
        .wait_http("/readyz", Duration::from_secs(10), |status, body| {
            status == 503 && body.contains("unreachable")
        })
        .await;
    assert!(said, "readiness says why: {answer:?}\n{}", bridge.log());
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(down_at.elapsed())).await;
    let (waiting, inflight, dead) = queue_sizes(&mut r, &key).await;
    assert_eq!(dead, 0, "nothing dead-lettered while the endpoint is down");
    assert_eq!(waiting + inflight, 30, "every message still in Redis");
    let keys = QueueKeys::derive(&key).unwrap();
    assert_eq!(hlen(&mut r, &keys.attempts).await, 0, "no attempt counted");

    hook.resume().await;
    expect_settled(&mut r, &key, 0, &bridge).await;
    let tally = hook.tally();
    for i in 0..50 {
        assert!(tally.contains_key(&body(i, 0)), "message {i} delivered");
    }
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, _| Answer::status(200).after(Duration::from_millis(2))).await;
    let key = new_key("kill");
    let n = 2000;
    schedule(&mut r, &key, n, 0).await;
    let lines = format!(
        "url = {}\nworkers = 2\nbatch = 20\nlease = \"2s\"\npublish_timeout = \"1s\"",
        quoted(&hook.url("/"))
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
    expect_settled(&mut r, &key, 0, &bridge).await;
    let tally = hook.tally();
    for i in 0..n {
        assert!(tally.contains_key(&body(i, 0)), "message {i} lost");
    }
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
    let (said, answer) = bridge
        .wait_http("/readyz", Duration::from_secs(20), |status, body| {
            status == 503 && body.contains("no-such-host.invalid")
        })
        .await;
    assert!(said, "{answer:?}\n{}", bridge.log());
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
    let key = new_key("term");
    let n = 400;
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    // One worker: what it holds claimed is answered well within the shutdown timeout.
    let lines = format!("url = {}\nbatch = 20\nworkers = 1", quoted(&hook.url("/")));
    let settings = [("max_concurrency", "8")];
    let mut bridge = Bridge::start(&http_config(port, &settings, &key, &lines), port);
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
