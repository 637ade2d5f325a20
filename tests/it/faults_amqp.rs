//! RabbitMQ faults: the connection cut and blackholed through a proxy, the broker restarted, a broker slower than the lease.

use crate::common;

use std::fmt::Display;
use std::time::{Duration, Instant};

use common::outage::*;
use common::proxy::{Mode, Proxy};
use common::servers::RabbitServer;
use common::tally::*;
use common::*;

const REDELIVERED: &str = "delay_bridge_messages_redelivered_total";
const RETRIED: &str = "delay_bridge_messages_retried_total";
const PUT_BACK: &str = "delay_bridge_messages_put_back_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_connection_cut_then_blackholed() {
    let n = 40_000;
    let (mut r, tally, key) = fault_scene("cut").await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    // A 2 s heartbeat is what detects a blackhole (no RST, no FIN) in about 4 s.
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 100")
        .amqp(&proxy.url(&amqp_url(), "heartbeat=2"))
        .to_string();
    let bridge = start_draining(&tally, &cfg, port, n / 10).await;

    // Cut: every connection reset, new ones refused.
    proxy.set(Mode::Drop);
    let detected = time_readyz(&bridge, 503, Duration::from_secs(5)).await;
    assert_given_back(&mut r, &key, Duration::from_secs(10), &bridge).await;
    let attempts_before = proxy.accepted();
    let mid_stream = "the cut must land mid-stream";
    assert_held(&mut r, &key, Duration::from_secs(3), &bridge, mid_stream).await;
    let reconnects = proxy.accepted() - attempts_before;
    // Capped backoff (reconnect_max = 1s): a few attempts in 3 s, not a storm, not silence.
    assert!(
        (1..=20).contains(&reconnects),
        "{reconnects} reconnect attempts in 3 s"
    );
    proxy.set(Mode::Pass);
    let recovered = time_readyz(&bridge, 200, Duration::from_secs(10)).await;
    // reconnect_max = 1s caps the wait between attempts, however long the outage was.
    assert!(
        recovered < Duration::from_secs(5),
        "reconnected after {recovered:?}"
    );
    expect_progress(&tally, tally.distinct(), n / 10, &bridge).await;

    // Blackhole: connections stay open but nothing moves either way.
    proxy.set(Mode::Stall);
    let blackhole_detected = time_readyz(&bridge, 503, Duration::from_secs(15)).await;
    assert_given_back(&mut r, &key, Duration::from_secs(10), &bridge).await;
    let mid_stream = "the blackhole must land mid-stream";
    assert_held(&mut r, &key, Duration::from_secs(2), &bridge, mid_stream).await;
    proxy.set(Mode::Pass);
    bridge.expect_readyz(200, Duration::from_secs(10)).await;

    let sizes = delivered_and_drained(&tally, n, &bridge, &mut r, &key).await;
    let figures: [(&str, &dyn Display); 4] = [
        ("put_back", &bridge.metric(PUT_BACK, &[]).await),
        ("cut_detected_ms", &detected.as_millis()),
        ("reconnected_ms", &recovered.as_millis()),
        ("blackhole_detected_ms", &blackhole_detected.as_millis()),
    ];
    report_drained("amqp_cut_and_blackhole", n, &tally, sizes, &figures);
    finish(bridge, &mut r, &key).await;
    tally.cleanup().await;
}

/// [`fault_scene`] with the tally on a private node, `rabbit`.
async fn scene_on(rabbit: &RabbitServer, prefix: &str) -> (Conn, Tally, String) {
    let tally = Tally::start(&rabbit.url()).await;
    (redis().await, tally, fault_key(prefix))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_restarted_mid_drain() {
    let n = 20_000;
    let mut rabbit = RabbitServer::start().await;
    let (mut r, tally, key) = scene_on(&rabbit, "rmq-restart").await;
    // Due over 20 s: `rabbitmqctl stop` takes a second or two, long enough for the bridge
    // to forward a backlog that is all due at once.
    schedule_over(&mut r, &key, n, Duration::from_secs(20)).await;
    let port = free_port();
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 100")
        .amqp(&rabbit.url())
        .to_string();
    let bridge = start_draining(&tally, &cfg, port, n / 5).await;
    rabbit.stop().await;
    let stopped_at = Instant::now();
    bridge.expect_readyz(503, Duration::from_secs(5)).await;
    assert_given_back(&mut r, &key, Duration::from_secs(10), &bridge).await;
    let mid_drain = "the restart must land mid-drain";
    assert_held(&mut r, &key, Duration::from_secs(1), &bridge, mid_drain).await;
    rabbit.restart().await;
    bridge.expect_readyz(200, Duration::from_secs(15)).await;
    let outage = stopped_at.elapsed();
    let sizes = delivered_and_drained(&tally, n, &bridge, &mut r, &key).await;
    let figures: [(&str, &dyn Display); 3] = [
        ("put_back", &bridge.metric(PUT_BACK, &[]).await),
        ("outage_ms", &outage.as_millis()),
        ("consumer_side_redeliveries", &tally.broker_redeliveries()),
    ];
    report_drained("rabbitmq_restart", n, &tally, sizes, &figures);
    stop_and_clean(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_shorter_than_a_stalled_publish() {
    let n = 5_000;
    let (mut r, tally, key) = fault_scene("slow").await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
    let port = free_port();
    // No heartbeat: the broker looks alive, only slow.
    let cfg = big_batches_through(&mut r, &tally, &key, n, port, &proxy)
        .await
        .to_string();
    let stall = (Mode::Stall, n / 10 * BIG);
    let bridge = start_until_fault(&tally, &cfg, port, &proxy, stall).await;
    let stalled_at = Instant::now();
    // Hold the broker until the stall outlasts the 2 s lease and leases start expiring
    // (or publishes start timing out, whichever the bridge does first: a broker that does
    // not confirm is the destination's failure, so those go back without an attempt).
    let end = Instant::now() + Duration::from_secs(30);
    let name = [("trigger", "faults")];
    let (mut redelivered, mut put_back) = (0.0, 0.0);
    while Instant::now() < end
        && (stalled_at.elapsed() < Duration::from_secs(3) || redelivered + put_back == 0.0)
    {
        [redelivered, put_back] = bridge.metrics([REDELIVERED, PUT_BACK], &name).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stall = stalled_at.elapsed();
    proxy.set(Mode::Pass);
    let sizes = delivered_and_drained(&tally, n, &bridge, &mut r, &key).await;
    // Put back: messages whose confirmation was still owed when their channel closed go back
    // without an attempt: the broker may have them too.
    let [redelivered, retried, put_back] = bridge
        .metrics([REDELIVERED, RETRIED, PUT_BACK], &name)
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
        redelivered + put_back > 0.0,
        "the stall must have outlasted a lease or a publish timeout"
    );
    assert_eq!(retried, 0.0, "a stalled broker costs no attempt");
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
    let (mut r, tally, key) = scene_on(&rabbit, "refused").await;
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
        .expect_all(n, 0, Duration::from_secs(60), &bridge, &mut r, &key)
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
        .filter(|l| l.starts_with(RETRIED) && !l.ends_with(" 0"))
        .collect();
    assert_eq!(
        metric_value(&scraped, RETRIED, &name),
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
    let (mut r, tally, key) = scene_on(&rabbit, "alarm").await;
    let port = free_port();
    // One attempt is all a message gets: a timeout counted as an attempt would dead-letter it.
    let cfg = tally
        .config(port, &key, "workers = 2\nbatch = 50")
        .amqp(&rabbit.url())
        .max_attempts(1)
        .to_string();
    let bridge = Bridge::start(&cfg, port)
        .ready(Duration::from_secs(30))
        .await;
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
    assert_given_back(&mut r, &key, Duration::from_secs(15), &bridge).await;
    let held = "the alarm must hold messages back";
    assert_held(&mut r, &key, Duration::from_secs(2), &bridge, held).await;
    let name = [("trigger", "faults")];
    let sink = [("sink", "rabbit")];
    assert_eq!(bridge.metric("delay_bridge_sink_up", &sink).await, 0.0);

    rabbit.ctl(&["set_vm_memory_high_watermark", "0.4"]).await;
    // Delivered once the alarm cleared.
    tally
        .expect_distinct(n, Duration::from_secs(60), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    assert_eq!(sizes, (0, 0, 0), "nothing dead-lettered");
    for metric in [RETRIED, "delay_bridge_messages_dead_lettered_total"] {
        assert_eq!(bridge.metric(metric, &name).await, 0.0, "{metric}");
    }
    report(
        "amqp_alarm",
        n,
        0,
        &tally,
        &format!("put_back={}", bridge.metric(PUT_BACK, &[]).await),
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
    let (mut r, tally, key) = fault_scene("window").await;
    let proxy = Proxy::start(shared_amqp_addr()).await;
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
