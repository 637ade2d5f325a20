//! Fault injection on the Redis side: a private Redis restarted mid-drain, and the Redis connection cut and stalled.

use crate::common;

use std::time::{Duration, Instant};

use common::proxy::{Mode, Proxy};
use common::servers::RedisServer;
use common::tally::{report, Tally};
use common::*;

const NAME: [(&str, &str); 1] = [("trigger", "faults")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_drain() {
    let n = 20_000;
    let mut redis_server = RedisServer::append_only().await;
    let mut r = redis_server.conn().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = format!("{}:{{faults}}", unique("redis-restart"));
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 100")
        .redis(&redis_server.url())
        .to_string();
    let mut bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(n / 5, Duration::from_secs(30), &bridge)
        .await;
    redis_server.shutdown().await;
    let down_at = Instant::now();
    bridge.expect_readyz(503, Duration::from_secs(10)).await;
    let detected = down_at.elapsed();
    let frozen = tally.distinct();
    assert!(frozen < n, "the restart must land mid-drain");
    redis_server.restart().await;
    let mut r = redis_server.conn().await;
    let restarted_at = Instant::now();
    bridge.expect_readyz(200, Duration::from_secs(20)).await;
    let reconnected = restarted_at.elapsed();
    tally
        .expect_distinct(n, Duration::from_secs(120), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    let redelivered = bridge
        .metric("delay_bridge_messages_redelivered_total", &NAME)
        .await;
    let errors = bridge
        .metric("delay_bridge_redis_errors_total", &NAME)
        .await;
    report(
        "redis_restart",
        n,
        0,
        &tally,
        &format!(
            "redelivered={redelivered} redis_errors={errors} down_detected_ms={} reconnected_ms={}",
            detected.as_millis(),
            reconnected.as_millis()
        ),
    );
    assert_eq!(sizes, (0, 0, 0), "nothing may stay leased");
    bridge.assert_alive();
    drop(bridge);
    tally.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_connection_cut_then_stalled() {
    let n = 20_000;
    let proxy = Proxy::start(shared_redis_addr()).await;
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = format!("{}:{{faults}}", unique("redis-cut"));
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 100")
        .redis(&proxy.url(&redis_url(), ""))
        .to_string();
    let mut bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(n / 5, Duration::from_secs(30), &bridge)
        .await;

    proxy.set(Mode::Drop);
    let cut_at = Instant::now();
    bridge.expect_readyz(503, Duration::from_secs(10)).await;
    let cut_detected = cut_at.elapsed();
    proxy.set(Mode::Pass);
    bridge.expect_readyz(200, Duration::from_secs(20)).await;
    let resumed_from = tally.distinct();
    assert!(resumed_from < n, "the cut must land mid-drain");
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct()
            >= resumed_from + n / 10)
        .await,
        "no progress after the cut healed\n{}",
        bridge.log()
    );

    // A stall longer than response_timeout: the bridge gives up on replies whose commands
    // Redis runs later, when the stall ends; their leases expire and are recovered.
    proxy.set(Mode::Stall);
    bridge.expect_readyz(503, Duration::from_secs(10)).await;
    let frozen = tally.distinct();
    assert!(frozen < n, "the stall must land mid-drain");
    proxy.set(Mode::Pass);
    bridge.expect_readyz(200, Duration::from_secs(20)).await;

    tally
        .expect_distinct(n, Duration::from_secs(120), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    let redelivered = bridge
        .metric("delay_bridge_messages_redelivered_total", &NAME)
        .await;
    let errors = bridge
        .metric("delay_bridge_redis_errors_total", &NAME)
        .await;
    report(
        "redis_cut_and_stall",
        n,
        0,
        &tally,
        &format!(
            "redelivered={redelivered} redis_errors={errors} cut_detected_ms={} reconnects={}",
            cut_detected.as_millis(),
            proxy.accepted()
        ),
    );
    assert_eq!(sizes, (0, 0, 0), "nothing may stay leased");
    bridge.assert_alive();
    stop_and_clean(bridge, &mut r, &key).await;
    tally.cleanup().await;
}
