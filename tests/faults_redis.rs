//! Fault injection on the Redis side: a private Redis restarted mid-drain, and the Redis connection cut and stalled.

mod common;
#[path = "common/private.rs"]
mod private;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "common/tally.rs"]
mod tally;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use proxy::{Mode, Proxy};
use tally::{config, report, schedule, wait_drained, wait_readyz, Tally};

const NAME: [(&str, &str); 1] = [("trigger", "faults")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_drain() {
    let n = 20_000;
    let mut redis_server = private::PrivateRedis::start().await;
    let mut r = redis_server.conn().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = format!("{}:{{faults}}", unique("redis-restart"));
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = config(
        port,
        &redis_server.url(),
        &amqp_url(),
        &key,
        &tally,
        "workers = 2\nbatch = 100",
        "5s",
    );
    let mut bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() >= n / 5).await,
        "{}",
        bridge.log()
    );
    redis_server.shutdown().await;
    let down_at = Instant::now();
    assert!(
        wait_readyz(&bridge, 503, Duration::from_secs(10)).await,
        "{}",
        bridge.log()
    );
    let detected = down_at.elapsed();
    let frozen = tally.distinct();
    assert!(frozen < n, "the restart must land mid-drain");
    redis_server.restart().await;
    let mut r = redis_server.conn().await;
    let restarted_at = Instant::now();
    assert!(
        wait_readyz(&bridge, 200, Duration::from_secs(20)).await,
        "{}",
        bridge.log()
    );
    let reconnected = restarted_at.elapsed();
    assert!(
        wait_until(Duration::from_secs(120), || tally.distinct() >= n).await,
        "{} of {n} delivered\n{}",
        tally.distinct(),
        bridge.log()
    );
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
    assert!(
        bridge.wait_exit(Duration::ZERO).await.is_none(),
        "the bridge died"
    );
    assert!(!bridge.log().contains("panicked"), "{}", bridge.log());
    drop(bridge);
    tally.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_connection_cut_then_stalled() {
    let n = 20_000;
    let shared: SocketAddr = {
        let url = url::Url::parse(&redis_url()).unwrap();
        let host = match url.host_str() {
            Some("localhost") | None => "127.0.0.1",
            Some(h) => h,
        };
        SocketAddr::new(host.parse().unwrap(), url.port().unwrap_or(6379))
    };
    let proxy = Proxy::start(shared).await;
    let proxied = {
        let mut url = url::Url::parse(&redis_url()).unwrap();
        url.set_port(Some(proxy.port())).unwrap();
        url.to_string()
    };
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = format!("{}:{{faults}}", unique("redis-cut"));
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = config(
        port,
        &proxied,
        &amqp_url(),
        &key,
        &tally,
        "workers = 2\nbatch = 100",
        "5s",
    );
    let mut bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() >= n / 5).await,
        "{}",
        bridge.log()
    );

    proxy.set(Mode::Drop);
    let cut_at = Instant::now();
    assert!(
        wait_readyz(&bridge, 503, Duration::from_secs(10)).await,
        "{}",
        bridge.log()
    );
    let cut_detected = cut_at.elapsed();
    proxy.set(Mode::Pass);
    assert!(
        wait_readyz(&bridge, 200, Duration::from_secs(20)).await,
        "{}",
        bridge.log()
    );
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
    assert!(
        wait_readyz(&bridge, 503, Duration::from_secs(10)).await,
        "{}",
        bridge.log()
    );
    let frozen = tally.distinct();
    assert!(frozen < n, "the stall must land mid-drain");
    proxy.set(Mode::Pass);
    assert!(
        wait_readyz(&bridge, 200, Duration::from_secs(20)).await,
        "{}",
        bridge.log()
    );

    assert!(
        wait_until(Duration::from_secs(120), || tally.distinct() >= n).await,
        "{} of {n} delivered\n{}",
        tally.distinct(),
        bridge.log()
    );
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
    assert!(
        bridge.wait_exit(Duration::ZERO).await.is_none(),
        "the bridge died"
    );
    assert!(!bridge.log().contains("panicked"), "{}", bridge.log());
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
}
