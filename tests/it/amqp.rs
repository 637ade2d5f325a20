//! End-to-end forwarding to RabbitMQ: due times, cancel/reschedule, unroutable messages.

use crate::common;

use std::time::Duration;

use common::*;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_members_arrive_once_never_early_with_headers_and_exact_bytes() {
    let (mut r, capture, key) = amqp_scene("due.rk", "delay", "orders").await;
    let port = free_port();
    let trigger = amqp_trigger("orders", &key, &capture, "workers = 3\nbatch = 4");
    let mut bridge = Bridge::start(&(base_config(port) + &trigger), port)
        .ready(READY)
        .await;

    let expected = schedule_orders(&mut r, &key).await;

    capture
        .expect_arrivals(expected.len(), Duration::from_secs(20), &bridge)
        .await;
    // Give a duplicate the chance to show up before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = capture.snapshot();
    assert_eq!(got.len(), expected.len(), "each message exactly once");
    for m in &got {
        let due = expected
            .get(&m.body)
            .unwrap_or_else(|| panic!("unexpected body {:?}", m.body));
        assert_eq!(m.due_ms, Some(*due), "x-delay-due-ms header");
        assert!(
            m.at_ms >= *due,
            "arrived {} ms before its due time",
            due - m.at_ms
        );
        assert_eq!(m.attempt, Some(1));
        assert_eq!(m.trigger.as_deref(), Some("orders"));
        assert_eq!(m.routing_key, "due.rk");
        assert_eq!(m.delivery_mode, Some(2), "persistent");
        assert_eq!(m.message_id.as_deref().map(str::len), Some(16));
    }
    let (left, inflight, _) = queue_sizes(&mut r, &key).await;
    assert_eq!(
        (left, inflight),
        (0, 0),
        "forwarded members are removed from Redis"
    );
    bridge.terminate(Duration::from_secs(15)).await;
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reschedule_are_honoured() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("cr").await;
    let key = unique("delay-plain");
    let bridge = ready_amqp_bridge("cr", &key, &capture, "", READY).await;

    let now = redis_now(&mut r).await;
    let zadd = |due: i64, m: &'static str| redis::cmd("ZADD").arg(&key).arg(due).arg(m).to_owned();
    let _: () = redis::pipe()
        .add_command(zadd(now + 1500, "cancelled"))
        .add_command(zadd(now + 1000, "later"))
        .add_command(zadd(now + 6000, "sooner"))
        .add_command(zadd(now + 1600, "marker"))
        .query_async(&mut r)
        .await
        .unwrap();
    // Cancel one, push one back, pull one forward.
    let _: () = redis::pipe()
        .cmd("ZREM")
        .arg(&key)
        .arg("cancelled")
        .add_command(zadd(now + 2500, "later"))
        .add_command(zadd(now + 300, "sooner"))
        .query_async(&mut r)
        .await
        .unwrap();

    capture
        .expect_arrivals(3, Duration::from_secs(15), &bridge)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = capture.snapshot();
    let bodies: Vec<&[u8]> = got.iter().map(|m| m.body.as_slice()).collect();
    assert_eq!(
        bodies,
        vec![&b"sooner"[..], b"marker", b"later"],
        "order follows the rescheduled due times"
    );
    let sooner = &got[0];
    assert!(
        sooner.at_ms < now + 6000,
        "the earlier reschedule was honoured"
    );
    assert!(
        got[2].at_ms >= now + 2500,
        "the later reschedule was honoured"
    );
    assert_eq!(got[2].due_ms, Some(now + 2500));
    stop_and_clean(bridge, &mut r, &key).await;
}

/// The trigger's own routing key has no binding: the broker returns every message. That is
/// the destination's failure, not the messages': nothing is dead-lettered or retried, the
/// trigger is held (the gauge, `stats`, `/readyz`), and once a queue is bound everything
/// arrives and the hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_routing_key_holds_the_trigger_until_a_queue_is_bound() {
    let (mut r, capture, key) = amqp_scene("bound", "delay", "u").await;
    let port = free_port();
    let unroutable = format!(
        "exchange = \"{}\"\nrouting_key = \"nobody-listens\"\n\
         max_attempts = 1\nbackoff_initial = \"100ms\"\nbackoff_max = \"200ms\"",
        capture.exchange
    );
    let cfg = base_config(port) + &trigger("unroutable", &key, "rabbit", &unroutable);
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    schedule_now(&mut r, &key, ["lost-letter-1", "lost-letter-2"]).await;
    let (seen, body) = bridge
        .wait_held("unroutable", true, Duration::from_secs(10))
        .await;
    assert!(seen, "held within 10 s\n{body}\n{}", bridge.log());
    let stats = cli(&["stats"], &cfg, &[]).stdout;
    assert!(
        stats.contains("held") && stats.contains("unroutable"),
        "{stats}"
    );
    let (named, text) = bridge
        .wait_http("/readyz", Duration::from_secs(5), |status, text| {
            status == 503 && text.contains("trigger unroutable: held")
        })
        .await;
    assert!(named, "{text:?}");
    // Long enough for several tries: still nothing dead-lettered or counted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, _, dead) = queue_sizes(&mut r, &key).await;
    assert_eq!(dead, 0, "{}", bridge.log());
    let body = bridge.scrape().await;
    let any = [("trigger", "unroutable"), ("reason", "unroutable")];
    assert_eq!(
        metric_value(&body, "delay_bridge_messages_retried_total", &any),
        0.0
    );
    assert_eq!(capture.count(), 0);

    capture.bind(&capture.exchange, "nobody-listens").await;
    capture
        .expect_arrivals(2, Duration::from_secs(15), &bridge)
        .await;
    let (released, body) = bridge
        .wait_held("unroutable", false, Duration::from_secs(10))
        .await;
    assert!(released, "{body}");
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
    assert_eq!(
        left_inflight_attempts(&mut r, &key).await,
        (0, 0, 0),
        "nothing lost, nothing left behind"
    );
    stop_and_clean(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_keeps_messages_in_redis_until_it_is_declared() {
    let (mut r, capture, key) = amqp_scene("noex", "delay", "noex").await;
    let port = free_port();
    let exchange = unique("declared-later");
    let to = format!("exchange = \"{exchange}\"\nrouting_key = \"noex\"");
    let trigger = trigger("noex", &key, "rabbit", &to);
    // Never ready while held: `/readyz` names the trigger (checked below).
    let bridge = Bridge::start(&(base_config(port) + &trigger), port);
    schedule_now(&mut r, &key, ["waiting"]).await;
    assert!(
        wait_logged(&bridge, Duration::from_secs(10), "does not exist").await,
        "the missing exchange is reported: {}",
        bridge.log()
    );
    assert_eq!(
        left_inflight_attempts(&mut r, &key).await,
        (1, 0, 0),
        "not claimed, not counted as an attempt"
    );
    // Held, with the exchange's name, in the gauge, `stats` and `/readyz` within 10 s.
    let (seen, body) = bridge
        .wait_held("noex", true, Duration::from_secs(10))
        .await;
    assert!(seen, "{body}");
    let cfg = base_config(port) + &trigger;
    let stats = cli(&["stats"], &cfg, &[]).stdout;
    let line = stats
        .lines()
        .find(|l| l.starts_with("noex"))
        .unwrap_or_default();
    assert!(line.ends_with("held"), "{stats}");
    assert!(
        stats.contains(&format!("held: exchange `{exchange}` does not exist")),
        "{stats}"
    );
    let json = cli(&["stats", "--json"], &cfg, &[]).stdout;
    assert!(json.contains("\"state\": \"held\""), "{json}");
    let (named, text) = bridge
        .wait_http("/readyz", Duration::from_secs(5), |status, text| {
            status == 503 && text.contains("trigger noex: held") && text.contains(&exchange)
        })
        .await;
    assert!(named, "{text:?}");

    // The operator declares the exchange: the message goes out.
    let ch = declare_direct_exchange(&exchange).await;
    capture.bind(&exchange, "noex").await;
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() == 1).await,
        "{}",
        bridge.log()
    );
    let (released, body) = bridge
        .wait_held("noex", false, Duration::from_secs(10))
        .await;
    assert!(
        released,
        "the gauge returns to 0 once the exchange exists\n{body}"
    );
    let stats = cli(&["stats"], &cfg, &[]).stdout;
    assert!(!stats.contains("held"), "{stats}");
    ch.exchange_delete(&exchange, Default::default())
        .await
        .unwrap();
    cleanup_keys(&mut r, &key).await;
}

/// Thousands of workers publish on a bounded set of shared channels: RabbitMQ's limit of
/// channels per connection (2,047 by default) does not limit the triggers of a bridge, and
/// every trigger still claims and forwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_workers_share_a_few_channels() {
    const TRIGGERS: usize = 300;
    const WORKERS: usize = 8;
    const CHANNELS: usize = 6;
    let mut r = redis().await;
    let capture = AmqpCapture::start("many").await;
    let base = unique("delay-many");
    let sink = unique("many");
    let keys: Vec<String> = (0..TRIGGERS).map(|i| format!("{base}:{{t{i}}}")).collect();
    let port = free_port();
    let mut config = ConfigToml::base(port)
        .amqp_sink(&sink, &amqp_url())
        .set(&format!("sinks.{sink}"), "channels", &CHANNELS.to_string())
        .to_string();
    for (i, key) in keys.iter().enumerate() {
        let lines = capture.destination() + &format!("workers = {WORKERS}\n");
        config += &trigger(&format!("t{i}"), key, &sink, &lines);
    }
    let mut bridge = Bridge::start(&config, port).ready(READY).await;

    let now = redis_now(&mut r).await;
    let mut pipe = redis::pipe();
    for (i, key) in keys.iter().enumerate() {
        pipe.cmd("ZADD").arg(key).arg(now).arg(format!("m-{i}"));
    }
    let _: () = pipe.query_async(&mut r).await.unwrap();
    capture
        .expect_arrivals(TRIGGERS, Duration::from_secs(60), &bridge)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tally = capture.tally();
    assert_eq!(tally.len(), TRIGGERS, "one message from every trigger");
    assert!(tally.values().all(|&n| n == 1), "each exactly once");

    // The bridge's connection, told apart by its sink's name, holds at most `channels`.
    let listed = std::process::Command::new("rabbitmqctl")
        .args(["-q", "--formatter", "json", "list_connections"])
        .args(["client_properties", "channels"])
        .output()
        .expect("rabbitmqctl runs beside the broker");
    let text = String::from_utf8_lossy(&listed.stdout);
    let all: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    let ours: Vec<usize> = all
        .iter()
        .filter(|c| c.to_string().contains(&format!("delay-bridge/{sink}")))
        .filter_map(|c| c["channels"].as_u64().map(|n| n as usize))
        .collect();
    assert_eq!(ours.len(), 1, "one connection for the sink: {text}");
    assert!(
        (1..=CHANNELS).contains(&ours[0]),
        "{} channels open for {} workers, configured at most {CHANNELS}",
        ours[0],
        TRIGGERS * WORKERS
    );
    bridge.terminate(Duration::from_secs(15)).await;
    let log = bridge.log();
    assert!(!log.contains("maximum number of channels"), "{log}");
    bridge.assert_no_panic();
    for key in &keys {
        cleanup_keys(&mut r, key).await;
    }
}

/// The members left scheduled and in flight on `key`, and its failed-attempt entries.
async fn left_inflight_attempts(r: &mut Conn, key: &str) -> (i64, i64, i64) {
    let (left, inflight, _) = queue_sizes(r, key).await;
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    let attempts = hlen(r, &keys.attempts).await;
    (left, inflight, attempts)
}
