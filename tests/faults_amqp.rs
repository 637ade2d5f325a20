//! RabbitMQ faults: the connection cut and blackholed through a proxy, the broker restarted, a broker slower than the lease.

mod common;
#[path = "common/private.rs"]
mod private;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "common/tally.rs"]
mod tally;

use std::time::{Duration, Instant};

use common::*;
use proxy::{Mode, Proxy};
use tally::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_connection_cut_then_blackholed() {
    let n = 40_000;
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
    let key = format!("{}:{{faults}}", unique("cut"));
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    // A 2 s heartbeat is what detects a blackhole (no RST, no FIN) in about 4 s.
    let cfg = config(
        port,
        &redis_url(),
        &via_proxy(&proxy, "heartbeat=2"),
        &key,
        &tally,
        "workers = 2\nbatch = 100",
        "5s",
    );
    let bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() >= n / 10).await,
        "{}",
        bridge.log()
    );

    // Cut: every connection reset, new ones refused.
    proxy.set(Mode::Drop);
    let cut_at = Instant::now();
    assert!(
        wait_readyz(&bridge, 503, Duration::from_secs(5)).await,
        "{}",
        bridge.log()
    );
    let detected = cut_at.elapsed();
    let (_, inflight, _) = wait_drained_inflight(&mut r, &key, Duration::from_secs(10)).await;
    assert_eq!(inflight, 0, "unconfirmed batches go back to the source set");
    let attempts_before = proxy.accepted();
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(3), &bridge).await;
    assert!(queued > 0, "the cut must land mid-stream");
    let reconnects = proxy.accepted() - attempts_before;
    // Capped backoff (reconnect_max = 1s): a few attempts in 3 s, not a storm, not silence.
    assert!(
        (1..=20).contains(&reconnects),
        "{reconnects} reconnect attempts in 3 s"
    );
    proxy.set(Mode::Pass);
    let healed_at = Instant::now();
    assert!(
        wait_readyz(&bridge, 200, Duration::from_secs(10)).await,
        "{}",
        bridge.log()
    );
    let recovered = healed_at.elapsed();
    // reconnect_max = 1s caps the wait between attempts, however long the outage was.
    assert!(
        recovered < Duration::from_secs(5),
        "reconnected after {recovered:?}"
    );
    let resumed_from = tally.distinct();
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct()
            >= resumed_from + n / 10)
        .await,
        "no progress after the cut healed\n{}",
        bridge.log()
    );

    // Blackhole: connections stay open but nothing moves either way.
    proxy.set(Mode::Stall);
    let stalled_at = Instant::now();
    assert!(
        wait_readyz(&bridge, 503, Duration::from_secs(15)).await,
        "{}",
        bridge.log()
    );
    let blackhole_detected = stalled_at.elapsed();
    let (_, inflight, _) = wait_drained_inflight(&mut r, &key, Duration::from_secs(10)).await;
    assert_eq!(
        inflight,
        0,
        "unconfirmed batches go back to the source set\n{}",
        bridge.log()
    );
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(2), &bridge).await;
    assert!(queued > 0, "the blackhole must land mid-stream");
    proxy.set(Mode::Pass);
    assert!(
        wait_readyz(&bridge, 200, Duration::from_secs(10)).await,
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
    let put_back = bridge
        .metric("delay_bridge_messages_put_back_total", &[])
        .await;
    report(
        "amqp_cut_and_blackhole",
        n,
        0,
        &tally,
        &format!(
            "put_back={put_back} cut_detected_ms={} reconnected_ms={} blackhole_detected_ms={}",
            detected.as_millis(),
            recovered.as_millis(),
            blackhole_detected.as_millis()
        ),
    );
    assert_eq!(sizes, (0, 0, 0));
    assert!(!bridge.log().contains("panicked"), "{}", bridge.log());
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_restarted_mid_drain() {
    let n = 20_000;
    let mut rabbit = private::PrivateRabbit::start().await;
    let mut r = redis().await;
    let tally = Tally::start(&rabbit.url()).await;
    let key = format!("{}:{{faults}}", unique("rmq-restart"));
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = config(
        port,
        &redis_url(),
        &rabbit.url(),
        &key,
        &tally,
        "workers = 2\nbatch = 100",
        "5s",
    );
    let bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() >= n / 5).await,
        "{}",
        bridge.log()
    );
    rabbit.stop().await;
    let stopped_at = Instant::now();
    assert!(
        wait_readyz(&bridge, 503, Duration::from_secs(5)).await,
        "{}",
        bridge.log()
    );
    let (_, inflight, _) = wait_drained_inflight(&mut r, &key, Duration::from_secs(10)).await;
    assert_eq!(inflight, 0, "unconfirmed batches go back to the source set");
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(1), &bridge).await;
    assert!(queued > 0, "the restart must land mid-drain");
    rabbit.restart().await;
    assert!(
        wait_readyz(&bridge, 200, Duration::from_secs(15)).await,
        "{}",
        bridge.log()
    );
    let outage = stopped_at.elapsed();
    assert!(
        wait_until(Duration::from_secs(120), || tally.distinct() >= n).await,
        "{} of {n} delivered\n{}",
        tally.distinct(),
        bridge.log()
    );
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    let put_back = bridge
        .metric("delay_bridge_messages_put_back_total", &[])
        .await;
    report(
        "rabbitmq_restart",
        n,
        0,
        &tally,
        &format!(
            "put_back={put_back} outage_ms={} consumer_side_redeliveries={}",
            outage.as_millis(),
            tally.broker_redeliveries()
        ),
    );
    assert_eq!(sizes, (0, 0, 0));
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

/// Bodies padded to 8 KiB: two batches of 500 (8 MB) overflow the socket buffers of a
/// stalled connection (4 MB at most on Linux), so the publish itself blocks, not only its
/// confirmation.
const BIG: usize = 8192;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_shorter_than_a_stalled_publish() {
    let n = 5_000;
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
    let key = format!("{}:{{faults}}", unique("slow"));
    schedule(&mut r, &key, n, BIG).await;
    let port = free_port();
    // No heartbeat: the broker looks alive, only slow.
    let cfg = config(
        port,
        &redis_url(),
        &via_proxy(&proxy, ""),
        &key,
        &tally,
        "workers = 2\nbatch = 500",
        "5s",
    );
    let bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() >= n / 10).await,
        "{}",
        bridge.log()
    );
    proxy.set(Mode::Stall);
    let stalled_at = Instant::now();
    // Hold the broker until the stall outlasts the 2 s lease and leases start expiring
    // (or publishes start timing out, whichever the bridge does first).
    let end = Instant::now() + Duration::from_secs(30);
    let name = [("trigger", "faults")];
    let mut redelivered = 0.0;
    let mut retried = 0.0;
    while Instant::now() < end
        && (stalled_at.elapsed() < Duration::from_secs(3) || redelivered + retried == 0.0)
    {
        redelivered = bridge
            .metric("delay_bridge_messages_redelivered_total", &name)
            .await;
        retried = bridge
            .metric("delay_bridge_messages_retried_total", &name)
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stall = stalled_at.elapsed();
    proxy.set(Mode::Pass);
    assert!(
        wait_until(Duration::from_secs(120), || tally.distinct() >= n).await,
        "{} of {n} delivered\n{}",
        tally.distinct(),
        bridge.log()
    );
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    let redelivered = bridge
        .metric("delay_bridge_messages_redelivered_total", &name)
        .await;
    let retried = bridge
        .metric("delay_bridge_messages_retried_total", &name)
        .await;
    report(
        "lease_shorter_than_publish",
        n,
        BIG,
        &tally,
        &format!(
            "stall_ms={} redelivered={redelivered} retried={retried}",
            stall.as_millis()
        ),
    );
    assert!(
        redelivered + retried > 0.0,
        "the stall must have outlasted a lease or a publish timeout"
    );
    assert!(
        tally.duplicates() as f64 <= redelivered + retried,
        "duplicates must come from expired leases or timed-out publishes"
    );
    assert_eq!(sizes, (0, 0, 0));
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
}
