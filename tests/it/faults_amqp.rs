//! RabbitMQ faults: the connection cut and blackholed through a proxy, the broker restarted, a broker slower than the lease.

use crate::common;

use std::time::{Duration, Instant};

use common::proxy::{Mode, Proxy};
use common::servers::RabbitServer;
use common::tally::*;
use common::*;

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
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 100")
        .amqp(&proxy.url(&amqp_url(), "heartbeat=2"))
        .to_string();
    let bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(n / 10, Duration::from_secs(30), &bridge)
        .await;

    // Cut: every connection reset, new ones refused.
    proxy.set(Mode::Drop);
    let cut_at = Instant::now();
    bridge.expect_readyz(503, Duration::from_secs(5)).await;
    let detected = cut_at.elapsed();
    let (_, inflight, _) = wait_sizes(&mut r, &key, Duration::from_secs(10), |s| s.1 == 0).await;
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
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
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
    bridge.expect_readyz(503, Duration::from_secs(15)).await;
    let blackhole_detected = stalled_at.elapsed();
    let (_, inflight, _) = wait_sizes(&mut r, &key, Duration::from_secs(10), |s| s.1 == 0).await;
    assert_eq!(
        inflight,
        0,
        "unconfirmed batches go back to the source set\n{}",
        bridge.log()
    );
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(2), &bridge).await;
    assert!(queued > 0, "the blackhole must land mid-stream");
    proxy.set(Mode::Pass);
    bridge.expect_readyz(200, Duration::from_secs(10)).await;

    tally
        .expect_distinct(n, Duration::from_secs(120), &bridge)
        .await;
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
    finish(bridge, &mut r, &key).await;
    tally.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_restarted_mid_drain() {
    let n = 20_000;
    let mut rabbit = RabbitServer::start().await;
    let mut r = redis().await;
    let tally = Tally::start(&rabbit.url()).await;
    let key = format!("{}:{{faults}}", unique("rmq-restart"));
    // Due over 20 s: `rabbitmqctl stop` takes a second or two, long enough for the bridge
    // to forward a backlog that is all due at once.
    schedule_over(&mut r, &key, n, Duration::from_secs(20)).await;
    let port = free_port();
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 100")
        .amqp(&rabbit.url())
        .to_string();
    let bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(n / 5, Duration::from_secs(30), &bridge)
        .await;
    rabbit.stop().await;
    let stopped_at = Instant::now();
    bridge.expect_readyz(503, Duration::from_secs(5)).await;
    let (_, inflight, _) = wait_sizes(&mut r, &key, Duration::from_secs(10), |s| s.1 == 0).await;
    assert_eq!(inflight, 0, "unconfirmed batches go back to the source set");
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(1), &bridge).await;
    assert!(queued > 0, "the restart must land mid-drain");
    rabbit.restart().await;
    bridge.expect_readyz(200, Duration::from_secs(15)).await;
    let outage = stopped_at.elapsed();
    tally
        .expect_distinct(n, Duration::from_secs(120), &bridge)
        .await;
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
    stop_and_clean(bridge, &mut r, &key).await;
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
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 500")
        .amqp(&proxy.url(&amqp_url(), ""))
        .to_string();
    let bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(n / 10, Duration::from_secs(30), &bridge)
        .await;
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
    tally
        .expect_distinct(n, Duration::from_secs(120), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    let redelivered = bridge
        .metric("delay_bridge_messages_redelivered_total", &name)
        .await;
    let retried = bridge
        .metric("delay_bridge_messages_retried_total", &name)
        .await;
    // Messages whose confirmation was still owed when their channel closed go back without
    // an attempt: the broker may have them too.
    let put_back = bridge
        .metric("delay_bridge_messages_put_back_total", &name)
        .await;
    report(
        "lease_shorter_than_publish",
        n,
        BIG,
        &tally,
        &format!(
            "stall_ms={} redelivered={redelivered} retried={retried} put_back={put_back}",
            stall.as_millis()
        ),
    );
    assert!(
        redelivered + retried > 0.0,
        "the stall must have outlasted a lease or a publish timeout"
    );
    assert!(
        tally.duplicates() as f64 <= redelivered + retried + put_back,
        "duplicates must come from expired leases, timed-out publishes or messages put back unconfirmed"
    );
    assert_eq!(sizes, (0, 0, 0));
    stop_and_clean(bridge, &mut r, &key).await;
    tally.cleanup().await;
}

/// A body over the broker's `max_message_size` makes RabbitMQ close the channel (406), which
/// fails every confirmation pending on it. Only that message may pay for it: published alone
/// it is refused while the others go through, so it pays its attempts and is dead-lettered
/// as `broker_refused` with the broker's reply, and the rest of its batch and of the queue is
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_broker_refuses_is_dead_lettered_and_the_rest_flows() {
    let n = 300;
    let rabbit = RabbitServer::start_with("max_message_size = 4096").await;
    let mut r = redis().await;
    let tally = Tally::start(&rabbit.url()).await;
    let key = format!("{}:{{faults}}", unique("refused"));
    schedule(&mut r, &key, n, 0).await;
    // Due in the middle of the backlog, so that it shares a batch with small messages.
    let big = body(999_999, 5000);
    let (s, _): (i64, i64) = redis::cmd("TIME").query_async(&mut r).await.unwrap();
    zadd(&mut r, &key, s * 1000 - 60_000 + (n / 2) as i64, &big).await;
    let port = free_port();
    // A generous publish timeout: on a loaded machine the one-at-a-time republishing of the
    // neighbours must not time out, or an innocent one is retried for the wrong reason.
    let cfg = tally
        .config(port, &key, "workers = 1\nbatch = 100")
        .lease("30s", "10s")
        .amqp(&rabbit.url())
        .max_attempts(2)
        .to_string();
    let bridge = Bridge::start(&cfg, port);
    tally
        .expect_distinct(n, Duration::from_secs(60), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    assert_eq!(sizes, (0, 0, 1), "only the big one is dead-lettered");
    let reason = dead_reason(&mut r, &key, &big).await.unwrap();
    assert_eq!(reason["reason"], "broker_refused", "{reason}");
    assert_eq!(reason["attempts"], 2, "{reason}");
    let detail = reason["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("406 "), "the broker's reply: {reason}");
    let name = [("trigger", "faults")];
    let scraped = bridge.scrape().await;
    let retries: Vec<&str> = scraped
        .lines()
        .filter(|l| l.starts_with("delay_bridge_messages_retried_total") && !l.ends_with(" 0"))
        .collect();
    assert_eq!(
        metric_value(&scraped, "delay_bridge_messages_retried_total", &name),
        1.0,
        "only the big one paid an attempt (its first): {retries:?}\n{}",
        bridge.log()
    );
    assert!(tally.missing(n, 0).is_empty());
    report("amqp_406", n, 0, &tally, "");
    stop_and_clean(bridge, &mut r, &key).await;
}

/// A RabbitMQ memory alarm blocks publishing connections (`connection.blocked`): the sink is
/// down, nothing is claimed and no attempt is burnt, and delivery resumes once it clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_alarm_pauses_the_sink_without_burning_attempts() {
    let n = 200;
    let rabbit = RabbitServer::start().await;
    let mut r = redis().await;
    let tally = Tally::start(&rabbit.url()).await;
    let key = format!("{}:{{faults}}", unique("alarm"));
    let port = free_port();
    // One attempt is all a message gets: a timeout counted as an attempt would dead-letter it.
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 50")
        .amqp(&rabbit.url())
        .max_attempts(1)
        .to_string();
    let bridge = Bridge::start(&cfg, port);
    bridge.expect_readyz(200, Duration::from_secs(30)).await;
    schedule(&mut r, &key, n / 2, 0).await;
    tally
        .expect_distinct(n / 2, Duration::from_secs(30), &bridge)
        .await;

    rabbit
        .ctl(&["set_vm_memory_high_watermark", "0.000001"])
        .await;
    // The alarm blocks a connection once it publishes: the next messages trigger it.
    let (s, _): (i64, i64) = redis::cmd("TIME").query_async(&mut r).await.unwrap();
    let members = (n / 2..n).map(|i| (s * 1000 + i as i64, body(i, 0)));
    zadd_all(&mut r, &key, members).await;
    assert!(
        bridge.wait_readyz(503, Duration::from_secs(30)).await,
        "a blocked connection is a sink that is down\n{}",
        bridge.log()
    );
    let (_, inflight, _) = wait_sizes(&mut r, &key, Duration::from_secs(15), |s| s.1 == 0).await;
    assert_eq!(
        inflight,
        0,
        "unconfirmed messages went back\n{}",
        bridge.log()
    );
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(2), &bridge).await;
    assert!(queued > 0, "the alarm must hold messages back");
    let name = [("trigger", "faults")];
    let sink = [("sink", "rabbit")];
    assert_eq!(bridge.metric("delay_bridge_sink_up", &sink).await, 0.0);

    rabbit.ctl(&["set_vm_memory_high_watermark", "0.4"]).await;
    assert!(
        wait_until(Duration::from_secs(60), || tally.distinct() >= n).await,
        "{} of {n} delivered after the alarm cleared\n{}",
        tally.distinct(),
        bridge.log()
    );
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    assert_eq!(sizes, (0, 0, 0), "nothing dead-lettered");
    for metric in [
        "delay_bridge_messages_retried_total",
        "delay_bridge_messages_dead_lettered_total",
    ] {
        assert_eq!(bridge.metric(metric, &name).await, 0.0, "{metric}");
    }
    report(
        "amqp_alarm",
        n,
        0,
        &tally,
        &format!(
            "put_back={}",
            bridge
                .metric("delay_bridge_messages_put_back_total", &[])
                .await
        ),
    );
    stop_and_clean(bridge, &mut r, &key).await;
}

/// The broker never holds more than `max_unconfirmed` of the bridge's messages unconfirmed:
/// with its confirmations held on the way back, it receives exactly that many, however many
/// members the workers claimed; the rest wait in the bridge, where a crash would not have
/// sent them twice. Once the confirmations flow, everything arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_holds_at_most_max_unconfirmed_messages_unconfirmed() {
    let n = 2_000;
    let window = 40;
    let mut r = redis().await;
    let tally = Tally::start(&amqp_url()).await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
    let key = format!("{}:{{faults}}", unique("window"));
    let port = free_port();
    // A publish timeout far beyond the test: no confirmation times out, nothing is retried.
    let cfg = tally
        .config(port, &key, "workers = 4\nbatch = 100")
        .amqp(&proxy.url(&amqp_url(), ""))
        .sink("max_unconfirmed", &window.to_string())
        .sink("channels", "1")
        .lease("120s", "60s")
        .to_string();
    let bridge = Bridge::start(&cfg, port);
    // One message through first: the workers' one channel (`channels = 1`) is open and in
    // confirm mode before the broker's answers are held.
    schedule_now(&mut r, &key, [body(n, 0)]).await;
    tally
        .expect_distinct(1, Duration::from_secs(30), &bridge)
        .await;
    proxy.set(Mode::Mute);
    schedule(&mut r, &key, n, 0).await;
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() > 1).await,
        "the broker received {} messages\n{}",
        tally.distinct(),
        bridge.log()
    );
    // Time for a bridge without a window to publish what else it claimed.
    let (_, inflight, _) = wait_sizes(&mut r, &key, Duration::from_secs(3), |_| false).await;
    assert!(
        inflight >= 2 * window as i64,
        "the workers claimed only {inflight} members"
    );
    // At most the window: a batch takes room in runs, and a run that does not fit in what
    // is left waits, so the broker may hold a little less.
    assert!(
        tally.distinct() <= 1 + window,
        "the broker holds {} messages unconfirmed, more than the window of {window}",
        tally.distinct() - 1
    );
    proxy.set(Mode::Pass);
    tally
        .expect_distinct(1 + n, Duration::from_secs(60), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    assert_eq!(sizes, (0, 0, 0));
    assert_eq!(tally.duplicates(), 0);
    finish(bridge, &mut r, &key).await;
    tally.cleanup().await;
}
