//! Process faults on the RabbitMQ path: repeated SIGKILL mid-drain, two bridges on one trigger, SIGTERM during a broker outage.

use crate::common;

use std::time::{Duration, Instant};

use common::outage::*;
use common::proxy::{Mode, Proxy};
use common::tally::*;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_ten_times_while_100k_drain() {
    let n = 100_000;
    let (mut r, tally, key) = fault_scene("kill").await;
    // Due over 30 s, so that the tenth kill still lands mid-drain however fast it goes.
    schedule_over(&mut r, &key, n, Duration::from_secs(30)).await;
    let port = free_port();
    let cfg = tally
        .config(port, &key, "workers = 4\nbatch = 200")
        .to_string();
    let mut bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(1, Duration::from_secs(30), &bridge)
        .await;
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
    // Liveness, not speed: the killed bridges' leases expire first (30 s).
    tally
        .expect_distinct(n, Duration::from_secs(300), &bridge)
        .await;
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
    stop_and_clean(bridge, &mut r, &key).await;
    tally.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_on_one_trigger_deliver_once_unless_a_lease_expired() {
    let n = 30_000;
    let (mut r, tally, key) = fault_scene("two").await;
    schedule(&mut r, &key, n, 0).await;
    let (port_a, port_b) = (free_port(), free_port());
    // A generous publish timeout: a loaded shared broker should not turn slow confirms into
    // retries (which may deliver twice, legitimately, and are counted below anyway).
    let cfg = |port| {
        let cfg = tally.config(port, &key, "workers = 4\nbatch = 100");
        cfg.lease("10s", "5s").to_string()
    };
    let a = Bridge::start(&cfg(port_a), port_a);
    let b = Bridge::start(&cfg(port_b), port_b);
    assert!(
        wait_until(Duration::from_secs(120), || tally.distinct() >= n).await,
        "{} of {n} delivered\nA:\n{}\nB:\n{}",
        tally.distinct(),
        a.log(),
        b.log()
    );
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    let name = [("trigger", "faults")];
    let total = |metric: &'static str| {
        let (a, b) = (&a, &b);
        async move { (a.metric(metric, &name).await, b.metric(metric, &name).await) }
    };
    let (forwarded_a, forwarded_b) = total("delay_bridge_messages_forwarded_total").await;
    let (redelivered_a, redelivered_b) = total("delay_bridge_messages_redelivered_total").await;
    let (retried_a, retried_b) = total("delay_bridge_messages_retried_total").await;
    let (put_back_a, put_back_b) = total("delay_bridge_messages_put_back_total").await;
    let (redelivered, retried) = (redelivered_a + redelivered_b, retried_a + retried_b);
    let put_back = put_back_a + put_back_b;
    report(
        "two_bridges",
        n,
        0,
        &tally,
        &format!(
            "forwarded_a={forwarded_a} forwarded_b={forwarded_b} redelivered={redelivered} \
             retried={retried} put_back={put_back}"
        ),
    );
    assert!(
        forwarded_a > 0.0 && forwarded_b > 0.0,
        "both bridges must have worked"
    );
    // Atomic claims: a second copy only ever comes from a lease that expired, a publish
    // whose confirmation did not come in time, or a message put back because its channel
    // closed with the confirmation owed, and all are counted.
    assert!(
        tally.duplicates() as f64 <= redelivered + retried + put_back,
        "{} duplicates, but only {redelivered} redelivered, {retried} retried and {put_back} put back",
        tally.duplicates()
    );
    assert_eq!(sizes, (0, 0, 0));
    drop((a, b));
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
    let (mut r, tally, key) = fault_scene("term").await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
    let port = free_port();
    let cfg = big_batches_through(&mut r, &tally, &key, n, port, &proxy)
        .await
        .shutdown("3s")
        // publish_timeout longer than the shutdown: only the abort can end a held batch.
        .lease("20s", "10s")
        .to_string();
    // The fault lands once a tenth of the payloads went through the proxy.
    let mut bridge = start_until_fault(&tally, &cfg, port, &proxy, (mode, n / 10 * BIG)).await;
    match mode {
        Mode::Drop => assert!(bridge.wait_readyz(503, Duration::from_secs(5)).await),
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
                    "the stall never held a batch ({} of {n} delivered, {inflight} in flight)\n{}",
                    tally.distinct(),
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
    let queued = members_in_redis(&mut r, &key).await;
    // What was confirmed before the exit reaches the consumer (it may lag behind the
    // bridge); a leased member is not lost (any bridge recovers it), but a clean shutdown
    // must not leave one. A lost message never shows up, so the wait is bounded.
    let mut missing = tally.missing_except(n, BIG, &queued);
    let catch_up = Instant::now() + Duration::from_secs(30);
    while !missing.is_empty() && Instant::now() < catch_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
        missing = tally.missing_except(n, BIG, &queued);
    }
    let delivered_before = tally.distinct();
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
    if !missing.is_empty() {
        // A consumer that lags leaves them in the queue; a loss leaves them nowhere.
        let mut places = Vec::new();
        for &i in missing.iter().take(5) {
            places.push(format!(
                "msg-{i:07}: {}",
                whereabouts(&mut r, &key, &body(i, BIG)).await
            ));
        }
        panic!(
            "{} neither delivered nor in Redis ({} delivered; {}):\n{}\n{}",
            missing.len(),
            tally.distinct(),
            tally.depth().await,
            places.join("\n"),
            bridge.log()
        );
    }
    // The broker comes back and the next bridge delivers the rest.
    proxy.set(Mode::Pass);
    let bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(n, Duration::from_secs(60), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    report(
        fault,
        n,
        BIG,
        &tally,
        &format!(
            "exit_code=0 exit_ms={} delivered_before_exit={delivered_before} \
             back_in_source={source} inflight_after_exit={inflight}",
            took.as_millis()
        ),
    );
    assert_eq!(sizes, (0, 0, 0));
    drop(bridge);
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
