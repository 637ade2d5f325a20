//! Fault injection on the Redis side: a private Redis restarted mid-drain, and the Redis connection cut and stalled.

use crate::common;

use std::fmt::Display;
use std::time::Duration;

use common::outage::*;
use common::proxy::{Mode, Proxy};
use common::servers::RedisServer;
use common::tally::Tally;
use common::*;

const NAME: [(&str, &str); 1] = [("trigger", "faults")];

/// What each test reports: members whose lease expired, and failed Redis calls.
const COUNTERS: [&str; 2] = [
    "delay_bridge_messages_redelivered_total",
    "delay_bridge_redis_errors_total",
];

/// The config both tests run: the shared tally's trigger, Redis reached at `redis_url`.
fn config(tally: &Tally, port: u16, key: &str, redis_url: &str) -> String {
    tally
        .config(port, key, "workers = 2\nbatch = 100")
        .redis(redis_url)
        .to_string()
}

/// Once the queue drained (to `sizes`): reports the run, the [`COUNTERS`] first, then
/// `figures`; asserts that nothing stayed leased and that the bridge lives on.
async fn conclude(
    fault: &str,
    n: usize,
    tally: &Tally,
    bridge: &mut Bridge,
    sizes: (i64, i64, i64),
    figures: &[(&str, &dyn Display)],
) {
    let [redelivered, errors] = bridge.metrics(COUNTERS, &NAME).await;
    let counters: [(&str, &dyn Display); 2] =
        [("redelivered", &redelivered), ("redis_errors", &errors)];
    report_figures(fault, n, tally, &[&counters[..], figures].concat());
    assert_eq!(sizes, (0, 0, 0), "nothing may stay leased");
    bridge.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_drain() {
    let n = 20_000;
    let mut redis_server = RedisServer::append_only().await;
    let mut r = redis_server.conn().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = fault_key("redis-restart");
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = config(&tally, port, &key, &redis_server.url());
    let mut bridge = start_draining(&tally, &cfg, port, n / 5).await;
    redis_server.shutdown().await;
    let detected = time_readyz(&bridge, 503, Duration::from_secs(10)).await;
    let frozen = tally.distinct();
    assert!(frozen < n, "the restart must land mid-drain");
    redis_server.restart().await;
    let mut r = redis_server.conn().await;
    let reconnected = time_readyz(&bridge, 200, Duration::from_secs(20)).await;
    let sizes = delivered_and_drained(&tally, n, &bridge, &mut r, &key).await;
    let figures: [(&str, &dyn Display); 2] = [
        ("down_detected_ms", &detected.as_millis()),
        ("reconnected_ms", &reconnected.as_millis()),
    ];
    conclude("redis_restart", n, &tally, &mut bridge, sizes, &figures).await;
    drop(bridge);
    tally.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_connection_cut_then_stalled() {
    let n = 20_000;
    let proxy = Proxy::start(shared_redis_addr()).await;
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = fault_key("redis-cut");
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = config(&tally, port, &key, &proxy.url(&redis_url(), ""));
    let mut bridge = start_draining(&tally, &cfg, port, n / 5).await;

    proxy.set(Mode::Drop);
    let cut_detected = time_readyz(&bridge, 503, Duration::from_secs(10)).await;
    proxy.set(Mode::Pass);
    bridge.expect_readyz(200, Duration::from_secs(20)).await;
    let resumed_from = tally.distinct();
    assert!(resumed_from < n, "the cut must land mid-drain");
    expect_progress(&tally, resumed_from, n / 10, &bridge).await;

    // A stall longer than response_timeout: the bridge gives up on replies whose commands
    // Redis runs later, when the stall ends; their leases expire and are recovered.
    proxy.set(Mode::Stall);
    bridge.expect_readyz(503, Duration::from_secs(10)).await;
    let frozen = tally.distinct();
    assert!(frozen < n, "the stall must land mid-drain");
    proxy.set(Mode::Pass);
    bridge.expect_readyz(200, Duration::from_secs(20)).await;

    let sizes = delivered_and_drained(&tally, n, &bridge, &mut r, &key).await;
    let figures: [(&str, &dyn Display); 2] = [
        ("cut_detected_ms", &cut_detected.as_millis()),
        ("reconnects", &proxy.accepted()),
    ];
    conclude(
        "redis_cut_and_stall",
        n,
        &tally,
        &mut bridge,
        sizes,
        &figures,
    )
    .await;
    stop_and_clean(bridge, &mut r, &key).await;
    tally.cleanup().await;
}
