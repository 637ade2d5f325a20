//! The backlog gauges and `/readyz` as the sink goes and comes back, and an empty queue read
//! again only once written to or paused.

use super::*;

/// The `delay_bridge_sink_up` gauge of sink `flaky`, as `body` shows it.
fn flaky_sink_up(body: &str) -> f64 {
    metric_value(body, "delay_bridge_sink_up", &[("sink", "flaky")])
}

/// The `delay_bridge_backlog_messages` gauge of trigger `backlog` in `state`, as `body` shows it.
fn backlog(body: &str, state: &str) -> f64 {
    metric_value(
        body,
        "delay_bridge_backlog_messages",
        &[("trigger", "backlog"), ("state", state)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_gauges_and_readyz_follow_the_sink_going_away_and_coming_back() {
    let (mut r, capture, key) = amqp_scene("backlog", "delay", "backlog").await;
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let port = free_port();
    // Nothing listens on this port until the proxy below starts.
    let broker_port = free_port();
    let settings = ConfigToml::base(port)
        .amqp_sink("flaky", &loopback_amqp(broker_port))
        .set_str("sinks.flaky", "reconnect_max", "300ms");
    let to = capture.destination() + "workers = 2";
    let config = settings.to_string() + &trigger("backlog", &key, "flaky", &to);
    let bridge = Bridge::start(&config, port);
    let (alive, got) = bridge
        .wait_http("/healthz", Duration::from_secs(15), |s, _| s == 200)
        .await;
    assert!(alive, "/healthz: {got:?}\n{}", bridge.log());
    // Redis connects, the sink does not: not ready, and the reasons name the sink and the
    // trigger it holds.
    let (unready, got) = bridge
        .wait_http("/readyz", Duration::from_secs(15), |s, b| {
            s == 503
                && b.starts_with("sink flaky: not connected\n")
                && b.contains("trigger backlog: held: sink flaky: broker connection failed")
        })
        .await;
    assert!(unready, "/readyz: {got:?}\n{}", bridge.log());

    // With the sink down nothing is claimed, so the sizes stay put.
    let (scheduled, due, inflight, dead) = (7, 5, 2, 3);
    let now = redis_now(&mut r).await;
    let later = (0..scheduled).map(|i| (now + 3_600_000 + i, format!("later-{i}")));
    let overdue = (0..due).map(|i| (now - 10_000 - 1000 * i, format!("overdue-{i}")));
    zadd_all(&mut r, &key, later.chain(overdue)).await;
    // A lease far in the future is not recovered; dead letters are only counted.
    let leased = (0..inflight).map(|i| (now + 3_600_000, format!("leased-{i}")));
    zadd_all(&mut r, &keys.inflight, leased).await;
    let dead_letters = (0..dead).map(|i| (now, format!("dead-{i}")));
    zadd_all(&mut r, &keys.dead, dead_letters).await;
    let t = [("trigger", "backlog")];
    let oldest_overdue = (10_000 + 1000 * (due - 1)) as f64 / 1000.0;
    let (seen, body) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            backlog(b, "scheduled") == scheduled as f64
                && backlog(b, "due") == due as f64
                && backlog(b, "inflight") == inflight as f64
                && backlog(b, "dead") == dead as f64
                && metric_value(b, "delay_bridge_oldest_due_age_seconds", &t) >= oldest_overdue
        })
        .await;
    assert!(seen, "backlog gauges never matched:\n{body}");
    let age = metric_value(&body, "delay_bridge_oldest_due_age_seconds", &t);
    assert!(
        age < oldest_overdue + 30.0,
        "oldest overdue age {age} s, expected about {oldest_overdue} s"
    );
    assert_eq!(flaky_sink_up(&body), 0.0);
    assert_eq!(metric_value(&body, "delay_bridge_redis_up", &[]), 1.0);
    assert_eq!(
        metric_value(&body, "delay_bridge_messages_forwarded_total", &t),
        0.0
    );

    // The broker appears on the configured port: the same process becomes ready and drains.
    let _broker = Proxy::start_on(broker_port, shared_amqp_addr()).await;
    let (ready, got) = bridge
        .wait_http("/readyz", Duration::from_secs(15), |s, _| s == 200)
        .await;
    assert!(ready, "/readyz after recovery: {got:?}\n{}", bridge.log());
    assert_eq!(got.map(|(_, b)| b), Some("ready\n".to_string()));
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() >= due as usize).await,
        "{} of {due} overdue arrived\n{}",
        capture.count(),
        bridge.log()
    );
    let (drained, body) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            backlog(b, "due") == 0.0
            && metric_value(b, "delay_bridge_oldest_due_age_seconds", &t) == 0.0
            && metric_value(b, "delay_bridge_messages_forwarded_total", &t) == due as f64
            // A refresh taken while the batch awaited its confirmation counts it in flight.
            && backlog(b, "inflight")
                == inflight as f64
        })
        .await;
    assert!(drained, "gauges after draining:\n{body}");
    assert_eq!(backlog(&body, "scheduled"), scheduled as f64);
    assert_eq!(backlog(&body, "dead"), dead as f64);
    // The gauge follows the sink's supervisor, which looks again within reconnect_max.
    let (up, body) = bridge
        .wait_scrape(Duration::from_secs(5), |b| flaky_sink_up(b) == 1.0)
        .await;
    assert!(up, "sink_up after recovery:\n{body}");
    assert_eq!(capture.count(), due as usize);
    stop_and_clean(bridge, &mut r, &key).await;
}

/// While notifications are subscribed, a queue read empty is read again only once written
/// to: its gauges still follow a producer's write at once, and an operator's pause (no
/// write to the queue) within a few intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_queue_is_read_again_when_written_to_or_paused() {
    let (mut r, capture, key) = amqp_scene("quiet", "delay", "quiet").await;
    let keys = QueueKeys::derive(&key).unwrap();
    let port = free_port();
    let config = base_config(port) + &amqp_trigger("quiet", &key, &capture, "");
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(15))
        .await;
    let (subscribed, body) = bridge
        .wait_scrape(Duration::from_secs(5), |b| {
            metric_value(b, "delay_bridge_keyspace_notifications_enabled", &[]) == 1.0
        })
        .await;
    assert!(subscribed, "{body}");
    // Read empty a few times: the housekeeping now skips its readings.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let gauge = |state: &'static str| {
        move |b: &str| {
            metric_value(
                b,
                "delay_bridge_backlog_messages",
                &[("trigger", "quiet"), ("state", state)],
            )
        }
    };
    let later = redis_now(&mut r).await + 3_600_000;
    zadd(&mut r, &key, later, "in an hour").await;
    let (seen, body) = bridge
        .wait_scrape(Duration::from_secs(5), |b| gauge("scheduled")(b) == 1.0)
        .await;
    assert!(seen, "a write to an empty queue is read:\n{body}");
    assert_eq!(zrem(&mut r, &key, "in an hour").await, 1);
    let (seen, body) = bridge
        .wait_scrape(Duration::from_secs(5), |b| gauge("scheduled")(b) == 0.0)
        .await;
    assert!(seen, "a removal is read too:\n{body}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    hset(&mut r, &keys.control, "paused", 1).await;
    let (seen, body) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, "delay_bridge_trigger_paused", &[("trigger", "quiet")]) == 1.0
        })
        .await;
    assert!(seen, "a pause of an empty queue is read:\n{body}");
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}
