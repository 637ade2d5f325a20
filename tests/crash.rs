//! Process-level faults: SIGKILL mid-drain loses nothing; SIGTERM drains and exits 0.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

async fn schedule_now(r: &mut redis::aio::MultiplexedConnection, key: &str, n: usize) -> i64 {
    let now = redis_now(r).await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(key);
        for i in chunk {
            cmd.arg(now - 1000 + (*i as i64 % 1000))
                .arg(format!("msg-{i:06}"));
        }
        let _: i64 = cmd.query_async(r).await.unwrap();
    }
    now
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_then_restart_loses_nothing() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("kill").await;
    let key = format!("{}:{{kill}}", unique("delay"));
    let n = 5000;
    schedule_now(&mut r, &key, n).await;
    let port = free_port();
    let cfg = base_config(port)
        + &amqp_trigger(
            "kill",
            &key,
            &capture,
            "workers = 2\nbatch = 20\nlease = \"2s\"\npublish_timeout = \"1s\"",
        );
    let mut bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || capture.count() >= 300).await,
        "{}",
        bridge.log()
    );
    bridge.signal(9);
    assert!(bridge.wait_exit(Duration::from_secs(5)).await.is_some());
    let before = capture.count();
    assert!(before < n, "the kill must land mid-drain");
    let bridge = bridge.restart();
    let distinct = || {
        let got = capture.snapshot();
        let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
        for m in &got {
            *seen.entry(m.body.clone()).or_default() += 1;
        }
        seen
    };
    assert!(
        wait_until(Duration::from_secs(60), || distinct().len() >= n).await,
        "only {} of {n} delivered\n{}",
        distinct().len(),
        bridge.log()
    );
    let seen = distinct();
    let duplicates: usize = seen.values().map(|c| c - 1).sum();
    println!("sigkill: {n} messages, lost 0, duplicates {duplicates} (killed after {before})");
    assert_eq!(seen.len(), n, "zero lost");
    for i in 0..n {
        assert!(seen.contains_key(format!("msg-{i:06}").as_bytes()));
    }
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let left: i64 = redis::cmd("ZCARD")
        .arg(&keys.source)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(left, 0);
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_leaves_nothing_in_flight() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("term").await;
    let key = format!("{}:{{term}}", unique("delay"));
    let n = 3000;
    schedule_now(&mut r, &key, n).await;
    let port = free_port();
    let cfg = base_config(port) + &amqp_trigger("term", &key, &capture, "workers = 4\nbatch = 50");
    let mut bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || capture.count() >= 200).await,
        "{}",
        bridge.log()
    );
    bridge.signal(15);
    let code = bridge.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(code, Some(0), "{}", bridge.log());
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let (left, inflight): (i64, i64) = redis::pipe()
        .zcard(&keys.source)
        .zcard(&keys.inflight)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(inflight, 0, "in-flight set empty after SIGTERM");
    // Everything confirmed before exit reaches the consumer; the rest is still queued.
    let delivered = || {
        capture
            .snapshot()
            .into_iter()
            .map(|m| m.body)
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    assert!(
        wait_until(Duration::from_secs(30), || delivered() + left as usize == n).await,
        "every message is either delivered or still queued: {} delivered, {left} queued, {n} scheduled",
        delivered()
    );
    cleanup_keys(&mut r, &key).await;
}
