//! Fault injection on the RabbitMQ path: kills, cut and blackholed connections, broker restarts, two bridges, slow broker, shutdown mid-outage.

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
use tally::{config, queue_sizes, report, schedule, Tally};

fn shared_amqp_addr() -> SocketAddr {
    let url = url::Url::parse(&amqp_url()).unwrap();
    let host = url.host_str().unwrap_or("127.0.0.1");
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    SocketAddr::new(host.parse().unwrap(), url.port().unwrap_or(5672))
}

/// The shared broker's URL with the host and port replaced by a proxy's.
fn via_proxy(proxy: &Proxy, query: &str) -> String {
    let mut url = url::Url::parse(&amqp_url()).unwrap();
    url.set_port(Some(proxy.port())).unwrap();
    url.set_query(if query.is_empty() { None } else { Some(query) });
    url.to_string()
}

/// Waits until the key's source and in-flight sets are both empty.
async fn wait_drained(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    timeout: Duration,
) -> (u64, u64, u64) {
    let end = Instant::now() + timeout;
    loop {
        let sizes = queue_sizes(r, key).await;
        if (sizes.0, sizes.1) == (0, 0) || Instant::now() >= end {
            return sizes;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn ready_status(bridge: &Bridge) -> Option<u16> {
    bridge.get("/readyz").await.map(|(status, _)| status)
}

/// Polls `/readyz` until it answers `status`.
async fn wait_readyz(bridge: &Bridge, status: u16, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if ready_status(bridge).await == Some(status) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_ten_times_while_100k_drain() {
    let n = 100_000;
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = format!("{}:{{faults}}", unique("kill"));
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let cfg = config(
        port,
        &redis_url(),
        &amqp_url(),
        &key,
        &tally,
        "workers = 4\nbatch = 200",
        "5s",
    );
    let mut bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() > 0).await,
        "{}",
        bridge.log()
    );
    let started = Instant::now();
    let mut kills_mid_drain = 0;
    for _ in 0..10 {
        // The fault schedule itself: one kill about every second.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        bridge.signal(9);
        assert!(bridge.wait_exit(Duration::from_secs(5)).await.is_some());
        if tally.distinct() < n {
            kills_mid_drain += 1;
        }
        bridge = bridge.restart();
    }
    assert_eq!(kills_mid_drain, 10, "every kill must land mid-drain");
    assert!(
        wait_until(Duration::from_secs(180), || tally.distinct() >= n).await,
        "{} of {n} delivered\n{}",
        tally.distinct(),
        bridge.log()
    );
    let elapsed = started.elapsed();
    let (left, inflight, dead) = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    report(
        "sigkill_x10",
        n,
        0,
        &tally,
        &format!("kills=10 seconds={:.1}", elapsed.as_secs_f64()),
    );
    assert_eq!((left, inflight, dead), (0, 0, 0));
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
}

/// Samples for `window` that nothing is claimed: in-flight stays empty and the source set
/// keeps its size. Returns the source size seen.
async fn assert_not_claiming(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    window: Duration,
    bridge: &Bridge,
) -> u64 {
    let end = Instant::now() + window;
    let (first, _, _) = queue_sizes(r, key).await;
    while Instant::now() < end {
        let (source, inflight, _) = queue_sizes(r, key).await;
        assert_eq!(
            inflight,
            0,
            "claimed while the sink is down\n{}",
            bridge.log()
        );
        assert_eq!(
            source, first,
            "members left the source set while the sink is down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first
}

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

/// Waits until the in-flight set is empty.
async fn wait_drained_inflight(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    timeout: Duration,
) -> (u64, u64, u64) {
    let end = Instant::now() + timeout;
    loop {
        let sizes = queue_sizes(r, key).await;
        if sizes.1 == 0 || Instant::now() >= end {
            return sizes;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    report(
        "rabbitmq_restart",
        n,
        0,
        &tally,
        &format!(
            "outage_ms={} consumer_side_redeliveries={}",
            outage.as_millis(),
            tally.broker_redeliveries()
        ),
    );
    assert_eq!(sizes, (0, 0, 0));
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_on_one_trigger_deliver_once_unless_a_lease_expired() {
    let n = 30_000;
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let key = format!("{}:{{faults}}", unique("two"));
    schedule(&mut r, &key, n, 0).await;
    let (port_a, port_b) = (free_port(), free_port());
    let extra = "workers = 4\nbatch = 100";
    let a = Bridge::start(
        &config(port_a, &redis_url(), &amqp_url(), &key, &tally, extra, "5s"),
        port_a,
    );
    let b = Bridge::start(
        &config(port_b, &redis_url(), &amqp_url(), &key, &tally, extra, "5s"),
        port_b,
    );
    assert!(
        wait_until(Duration::from_secs(120), || tally.distinct() >= n).await,
        "{} of {n} delivered\nA:\n{}\nB:\n{}",
        tally.distinct(),
        a.log(),
        b.log()
    );
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    let name = [("trigger", "faults")];
    let forwarded_a = a
        .metric("delay_bridge_messages_forwarded_total", &name)
        .await;
    let forwarded_b = b
        .metric("delay_bridge_messages_forwarded_total", &name)
        .await;
    let redelivered = a
        .metric("delay_bridge_messages_redelivered_total", &name)
        .await
        + b.metric("delay_bridge_messages_redelivered_total", &name)
            .await;
    report(
        "two_bridges",
        n,
        0,
        &tally,
        &format!("forwarded_a={forwarded_a} forwarded_b={forwarded_b} redelivered={redelivered}"),
    );
    assert!(
        forwarded_a > 0.0 && forwarded_b > 0.0,
        "both bridges must have worked"
    );
    assert!(
        tally.duplicates() as f64 <= redelivered,
        "a message was delivered twice without a lease expiry"
    );
    assert_eq!(sizes, (0, 0, 0));
    drop((a, b));
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
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

/// SIGTERM while the broker is unreachable (`Mode::Drop`) or blackholed (`Mode::Stall`, with
/// publishes blocked on full socket buffers): exit 0 within `shutdown.timeout` plus a margin,
/// in-flight set empty, every message delivered or back in the source set.
async fn shutdown_during_outage(mode: Mode, fault: &str) {
    let n = 5_000;
    let shutdown_timeout = Duration::from_secs(3);
    let margin = Duration::from_secs(2);
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
    let key = format!("{}:{{faults}}", unique("term"));
    schedule(&mut r, &key, n, BIG).await;
    let port = free_port();
    let cfg = tally::config_with_lease(
        port,
        &redis_url(),
        &via_proxy(&proxy, ""),
        &key,
        &tally,
        "workers = 2\nbatch = 500",
        "3s",
        // publish_timeout longer than the shutdown: only the abort can end a held batch.
        ("20s", "10s"),
    );
    let mut bridge = Bridge::start(&cfg, port);
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() >= n / 10).await,
        "{}",
        bridge.log()
    );
    proxy.set(mode);
    match mode {
        Mode::Drop => assert!(wait_readyz(&bridge, 503, Duration::from_secs(5)).await),
        _ => {
            // SIGTERM while batches are held by the blackhole (their 4 MB per worker fill
            // the socket buffers, so the publish itself is blocked), before publish_timeout.
            let end = Instant::now() + Duration::from_secs(20);
            let mut held_since = None;
            loop {
                let (_, inflight, _) = queue_sizes(&mut r, &key).await;
                held_since = match (inflight > 0, held_since) {
                    (true, None) => Some(Instant::now()),
                    (true, since) => since,
                    (false, _) => None,
                };
                if held_since.is_some_and(|t| t.elapsed() >= Duration::from_millis(300)) {
                    break;
                }
                assert!(
                    Instant::now() < end,
                    "the stall never held a batch\n{}",
                    bridge.log()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    bridge.signal(15);
    let asked = Instant::now();
    let code = bridge.wait_exit(Duration::from_secs(30)).await;
    let took = asked.elapsed();
    let (source, inflight, dead) = queue_sizes(&mut r, &key).await;
    let queued = tally::members_in_redis(&mut r, &key).await;
    // Whatever the consumer has by now was confirmed before the exit; a leased member is
    // not lost (any bridge recovers it), but a clean shutdown must not leave one.
    let missing = tally.missing_except(n, BIG, &queued);
    println!(
        "fault={fault} messages={n} lost={} duplicates={} exit_code={code:?} exit_ms={} delivered={} back_in_source={source} inflight={inflight}",
        missing.len(),
        tally.duplicates(),
        took.as_millis(),
        tally.distinct(),
    );
    assert_eq!(code, Some(0), "{}", bridge.log());
    assert!(
        took <= shutdown_timeout + margin,
        "took {took:?}\n{}",
        bridge.log()
    );
    assert_eq!(
        inflight,
        0,
        "unconfirmed messages must be back in the source set\n{}",
        bridge.log()
    );
    assert_eq!(dead, 0);
    assert!(
        missing.is_empty(),
        "{} lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    drop(proxy);
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_rabbitmq_unreachable() {
    shutdown_during_outage(Mode::Drop, "shutdown_broker_down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_rabbitmq_blackholed() {
    shutdown_during_outage(Mode::Stall, "shutdown_broker_blackholed").await;
}
