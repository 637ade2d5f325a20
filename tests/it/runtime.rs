//! The bridge's async runtime: one worker thread on a host of two cores or fewer, as many as `TOKIO_WORKER_THREADS` says when it is set.

use crate::common;

use std::time::Duration;

use redis::AsyncCommands;

use common::*;

/// The worker count a bridge's start line reports.
fn reported(bridge: &Bridge) -> usize {
    let log = bridge.log();
    let start = log
        .lines()
        .find(|l| l.contains("starting"))
        .unwrap_or_else(|| panic!("no start line: {log}"));
    let (_, rest) = start
        .split_once("worker_threads=")
        .unwrap_or_else(|| panic!("the start line names no worker count: {start}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_hosts_run_one_worker_thread_and_the_variable_overrides_it() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let expected = match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(n) => n.parse().unwrap(),
        Err(_) if cores <= 2 => 1,
        Err(_) => cores,
    };
    let capture = AmqpCapture::start("runtime").await;
    let key = format!("{}:{{runtime}}", unique("delay"));
    let port = free_port();
    let config = base_config(port) + &amqp_trigger("runtime", &key, &capture, "");
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(15))
        .await;
    assert_eq!(reported(&bridge), expected, "{cores} cores");
    // It delivers on that runtime.
    let mut r = redis().await;
    let _: i64 = r.zadd(&key, "on-time", now_ms()).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || capture.count() == 1).await,
        "delivered: {}",
        bridge.log()
    );
    bridge.assert_no_panic();
    drop(bridge);

    let port = free_port();
    let config = base_config(port) + &amqp_trigger("runtime", &key, &capture, "");
    let bridge = Bridge::start_with_env(&config, port, &[("TOKIO_WORKER_THREADS", "3")])
        .ready(Duration::from_secs(15))
        .await;
    assert_eq!(reported(&bridge), 3, "the variable wins");
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}
