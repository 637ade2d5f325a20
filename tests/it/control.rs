//! Operator control against real Redis and RabbitMQ: `pause` holds every replica of a trigger
//! at its next claim and survives a restart; `resume` lets the held messages go.

use crate::common;

use std::time::Duration;

use common::*;

const TRIGGER: &str = "paused";

/// `pause` or `resume` through the CLI; its stdout.
fn control(verb: &str, config: &str) -> String {
    let out = cli(&[verb, "-t", TRIGGER], config, &[]);
    assert_eq!(out.code, 0, "{verb}: {}", out.text());
    out.stdout
}

async fn paused_gauge(bridge: &Bridge, want: f64) {
    let (held, body) = bridge
        .wait_scrape(Duration::from_secs(10), |body| {
            metric_value(body, "delay_bridge_trigger_paused", &[("trigger", TRIGGER)]) == want
        })
        .await;
    assert!(held, "delay_bridge_trigger_paused != {want}:\n{body}");
}

/// For `span`, nothing more arrives at `capture` and the held messages stay scheduled.
async fn assert_held(r: &mut Conn, key: &str, capture: &AmqpCapture, arrived: usize, held: i64) {
    let end = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < end {
        assert_eq!(capture.count(), arrived, "forwarded while paused");
        assert_eq!(zcard(r, key).await, held, "claimed while paused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_every_replica_across_a_restart_and_resume_delivers() {
    let (mut r, capture, key) = amqp_scene("control", "pause", "control").await;
    let settings = |port| {
        base_config(port) + &amqp_trigger(TRIGGER, &key, &capture, "guard_interval = \"200ms\"\n")
    };
    let (port_a, port_b) = (free_port(), free_port());
    let config = settings(port_a);
    let a = Bridge::start(&config, port_a)
        .ready(Duration::from_secs(20))
        .await;
    let b = Bridge::start(&settings(port_b), port_b)
        .ready(Duration::from_secs(20))
        .await;
    schedule(&mut r, &key, 50, 0).await;
    a.expect_arrivals(50, Duration::from_secs(20), || capture.count())
        .await;
    paused_gauge(&a, 0.0).await;

    let said = control("pause", &config);
    assert!(said.contains("paused trigger `paused`"), "{said}");
    assert!(
        control("pause", &config).contains("already paused"),
        "a second pause changes nothing and says so"
    );
    for bridge in [&a, &b] {
        paused_gauge(bridge, 1.0).await;
        let (status, body) = bridge.get("/readyz").await.unwrap();
        assert_eq!(
            (status, body.as_str()),
            (200, "ready\ntrigger paused: paused\n"),
            "paused is still ready, and says so"
        );
    }
    // Producers keep writing; nothing is claimed by either replica.
    let now = redis_now(&mut r).await;
    zadd_all(&mut r, &key, (0..100).map(|i| (now, format!("held-{i}")))).await;
    assert_held(&mut r, &key, &capture, 50, 100).await;
    let stats = cli(&["stats"], &config, &[]);
    let row: Vec<&str> = stats
        .stdout
        .lines()
        .find(|l| l.starts_with(TRIGGER))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!((row[2], row[6]), ("100", "paused"), "{}", stats.stdout);

    // The pause lives in Redis: a restarted bridge comes back paused.
    let a = a.restart().ready(Duration::from_secs(20)).await;
    paused_gauge(&a, 1.0).await;
    assert_held(&mut r, &key, &capture, 50, 100).await;

    let said = control("resume", &config);
    assert!(said.contains("resumed trigger `paused`"), "{said}");
    // A resume wakes the idle workers: they do not wait out their 60 s notified guard.
    a.expect_arrivals(150, Duration::from_secs(15), || capture.count())
        .await;
    let seen = capture.tally();
    assert!(
        (0..100).all(|i| seen.get(format!("held-{i}").as_bytes()) == Some(&1)),
        "every held message once"
    );
    for bridge in [&a, &b] {
        paused_gauge(bridge, 0.0).await;
        assert_eq!(bridge.get("/readyz").await.unwrap().1, "ready\n");
        bridge.assert_no_panic();
    }
    let log = a.log() + &b.log();
    assert!(log.contains("paused by an operator"), "{log}");
    assert!(log.contains("resumed: claiming again"), "{log}");
    let out = cli(&["pause", "-t", "nobody"], &config, &[]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("no trigger named `nobody`"),
        "{}",
        out.text()
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_every_replica_together_and_drains_the_backlog() {
    let n = 60;
    let (rate, burst) = (20, 5);
    let (mut r, capture, key) = amqp_scene("rate", "rate", "control").await;
    schedule(&mut r, &key, n, 0).await;
    let extra =
        format!("rate_limit = \"{rate}/s\"\nrate_burst = {burst}\nworkers = 4\nbatch = 50\n");
    let settings = |port| base_config(port) + &amqp_trigger("limited", &key, &capture, &extra);
    let (port_a, port_b) = (free_port(), free_port());
    let a = Bridge::start(&settings(port_a), port_a);
    let b = Bridge::start(&settings(port_b), port_b);
    a.expect_arrivals(n, Duration::from_secs(30), || capture.count())
        .await;

    // Two replicas of four workers each send no faster than the one bucket allows: the
    // burst, then `rate` a second (with a quarter second of slack for the first message
    // arriving later after its claim than the rest).
    let mut at: Vec<i64> = capture.snapshot().iter().map(|m| m.at_ms).collect();
    at.sort_unstable();
    let first_second = at.iter().take_while(|t| **t < at[0] + 1000).count();
    assert!(
        first_second <= burst + rate + rate / 4,
        "{first_second} messages in the first second at {rate}/s with a burst of {burst}"
    );
    let span = at[n - 1] - at[0];
    println!("{rate}/s, burst {burst}: {first_second} in the first second, {n} in {span} ms");
    let least = (n - burst) as i64 * 1000 / rate as i64;
    assert!(
        span >= least - 100,
        "{n} messages in {span} ms; the rate allows no less than {least} ms"
    );
    assert_eq!(capture.tally().len(), n, "every message once");
    assert!(capture.tally().values().all(|c| *c == 1));
    let waited = a
        .trigger_metric("delay_bridge_rate_limited_claims_total", "limited")
        .await
        + b.trigger_metric("delay_bridge_rate_limited_claims_total", "limited")
            .await;
    assert!(waited > 0.0, "claims found the bucket empty");
    for bridge in [&a, &b] {
        bridge.assert_no_panic();
    }
    cleanup_keys(&mut r, &key).await;
}

/// Schedules five messages due now, named `what-i`, and waits until they arrived.
async fn round(
    r: &mut Conn,
    key: &str,
    bridge: &Bridge,
    capture: &AmqpCapture,
    sent: &mut usize,
    what: &str,
) {
    let now = redis_now(r).await;
    zadd_all(r, key, (0..5).map(|i| (now, format!("{what}-{i}")))).await;
    *sent += 5;
    bridge
        .expect_arrivals(*sent, Duration::from_secs(10), || capture.count())
        .await;
}

/// Writes `fields` (name, value pairs) straight into the trigger's control hash.
async fn stray(r: &mut Conn, key: &str, fields: &[(&str, &str)]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(format!("{key}:control"));
    for (f, v) in fields {
        cmd.arg(*f).arg(*v);
    }
    let _: i64 = cmd.query_async(r).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_control_values_are_repaired_counted_and_never_wedge_the_trigger() {
    let (mut r, capture, key) = amqp_scene("stray", "stray", "control").await;
    let port = free_port();
    let extra = "rate_limit = \"200/s\"\nrate_burst = 5\nguard_interval = \"300ms\"\n";
    let config = base_config(port) + &amqp_trigger(TRIGGER, &key, &capture, extra);
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    let mut sent = 0;
    round(&mut r, &key, &bridge, &capture, &mut sent, "first").await;

    // An empty bucket for ever, a debt of centuries, a clock from the future: each is
    // repaired at the next claim, and the messages go.
    let now = redis_now(&mut r).await.to_string();
    stray(&mut r, &key, &[("tokens", "-inf"), ("at", &now)]).await;
    round(&mut r, &key, &bridge, &capture, &mut sent, "minus-inf").await;
    stray(&mut r, &key, &[("tokens", "-1e12"), ("at", &now)]).await;
    round(&mut r, &key, &bridge, &capture, &mut sent, "debt").await;
    stray(&mut r, &key, &[("tokens", "nan"), ("at", "9e18")]).await;
    round(&mut r, &key, &bridge, &capture, &mut sent, "nan").await;
    stray(&mut r, &key, &[("tokens", "many"), ("at", "soon")]).await;
    round(&mut r, &key, &bridge, &capture, &mut sent, "words").await;
    // `paused = 0` does not pause; the claim deletes it.
    stray(&mut r, &key, &[("paused", "0")]).await;
    round(&mut r, &key, &bridge, &capture, &mut sent, "zero").await;
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{key}:control"))
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(!fields.contains_key("paused"), "repaired: {fields:?}");
    let tokens: f64 = fields["tokens"].parse().unwrap();
    assert!((0.0..=5.0).contains(&tokens), "repaired: {fields:?}");
    let repairs = bridge
        .trigger_metric("delay_bridge_control_repairs_total", TRIGGER)
        .await;
    assert_eq!(
        repairs, 7.0,
        "one repair for each field written out of range"
    );

    // A stray `paused = 0` does not stop `pause` from pausing; any other value pauses.
    stray(&mut r, &key, &[("paused", "0")]).await;
    assert!(control("pause", &config).contains("paused trigger `paused`"));
    paused_gauge(&bridge, 1.0).await;
    let now = redis_now(&mut r).await;
    zadd_all(&mut r, &key, (0..5).map(|i| (now, format!("held-{i}")))).await;
    assert_held(&mut r, &key, &capture, sent, 5).await;
    stray(&mut r, &key, &[("paused", "yes")]).await;
    assert_held(&mut r, &key, &capture, sent, 5).await;
    assert!(control("resume", &config).contains("resumed trigger"));
    bridge
        .expect_arrivals(sent + 5, Duration::from_secs(10), || capture.count())
        .await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}
