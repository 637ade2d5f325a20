//! Metrics, health endpoints, logs and `stats` of the real binary against real Redis and RabbitMQ.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::proxy::Proxy;
use common::*;
use delay_bridge::keys::QueueKeys;

const ALLOWED_LABELS: [&str; 8] = [
    "trigger", "sink", "reason", "state", "kind", "version", "revision", "le",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_n_messages_moves_counters_and_histograms_by_exactly_n() {
    let (mut r, capture, key) = amqp_scene("obs", "delay", "obs").await;
    let port = free_port();
    let batch = 4;
    let trigger = amqp_trigger(
        "obs",
        &key,
        &capture,
        &format!("workers = 2\nbatch = {batch}"),
    );
    let mut bridge = Bridge::start(&(base_config(port) + &trigger), port)
        .ready(Duration::from_secs(15))
        .await;
    let fwd = [("trigger", "obs"), ("sink", "rabbit")];
    let obs = [("trigger", "obs")];
    assert_eq!(
        bridge
            .metric("delay_bridge_messages_forwarded_total", &fwd)
            .await,
        0.0
    );
    assert_eq!(
        bridge
            .metric("delay_bridge_lateness_seconds_count", &obs)
            .await,
        0.0
    );

    // 10 members overdue by at least 6 s and 20 due shortly: all must be counted, and the
    // overdue ones must show up as late by at least their age.
    let overdue = 10;
    let n = 30;
    let now = redis_now(&mut r).await;
    let due = |i: usize| {
        if i < overdue {
            now - 6000 - i as i64
        } else {
            now + 200 + 20 * i as i64
        }
    };
    let members = (0..n).map(|i| (due(i), format!("obs-secret-payload-{i}")));
    zadd_all(&mut r, &key, members).await;
    bridge
        .expect_arrivals(n, Duration::from_secs(20), || capture.count())
        .await;
    let (settled, body) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, "delay_bridge_messages_forwarded_total", &fwd) >= n as f64
        })
        .await;
    assert!(settled, "forwarded counter never reached {n}:\n{body}");

    assert_eq!(
        metric_value(&body, "delay_bridge_messages_forwarded_total", &fwd),
        n as f64
    );
    assert_lateness(&body, n, overdue);

    assert_claims_and_publishes(&body, n, batch);

    assert_eq!(
        metric_value(
            &body,
            "delay_bridge_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert_eq!(metric_value(&body, "delay_bridge_redis_up", &[]), 1.0);
    assert_eq!(
        metric_value(&body, "delay_bridge_sink_up", &[("sink", "rabbit")]),
        1.0
    );
    assert_eq!(
        bridge.get("/healthz").await.map(|(s, _)| s),
        Some(200),
        "/healthz"
    );

    assert_bounded_labels(&body, &key);

    // Nothing is counted twice later on.
    assert_eq!(capture.count(), n, "each message once");
    assert_eq!(
        bridge
            .metric("delay_bridge_messages_forwarded_total", &fwd)
            .await,
        n as f64
    );
    bridge.terminate(Duration::from_secs(15)).await;
    cleanup_keys(&mut r, &key).await;
}

/// The lateness histogram of `n` messages forwarded by trigger `obs`, `overdue` of them
/// overdue by at least 6 s when scheduled.
fn assert_lateness(body: &str, n: usize, overdue: usize) {
    let obs = [("trigger", "obs")];
    let late_count = metric_value(body, "delay_bridge_lateness_seconds_count", &obs);
    let late_sum = metric_value(body, "delay_bridge_lateness_seconds_sum", &obs);
    assert_eq!(late_count, n as f64, "one lateness observation per message");
    assert!(
        late_sum >= 6.0 * overdue as f64,
        "overdue members count as late by their age: sum {late_sum}"
    );
    let lateness = histogram_buckets(body, "delay_bridge_lateness_seconds", &obs);
    assert_eq!(lateness.last().map(|b| b.1), Some(n as f64), "+Inf bucket");
    assert!(
        lateness.first().map(|b| b.0) <= Some(0.001)
            && lateness.iter().any(|b| b.0.is_finite() && b.0 >= 300.0),
        "buckets span 1 ms to 5 min: {lateness:?}"
    );
    assert!(
        n as f64 - count_le(&lateness, 5.9) >= overdue as f64,
        "the overdue members fall in buckets above 6 s: {lateness:?}"
    );
}

/// One publish observation per batch of at most `batch` claimed, of the `n` messages
/// trigger `obs` forwarded.
fn assert_claims_and_publishes(body: &str, n: usize, batch: usize) {
    let fwd = [("trigger", "obs"), ("sink", "rabbit")];
    let obs = [("trigger", "obs")];
    let publishes = metric_value(body, "delay_bridge_publish_duration_seconds_count", &fwd);
    assert!(
        publishes >= (n / batch) as f64 && publishes <= n as f64,
        "one publish observation per batch: {publishes}"
    );
    assert!(metric_value(body, "delay_bridge_publish_duration_seconds_sum", &fwd) > 0.0);
    let claims = metric_value(body, "delay_bridge_claim_duration_seconds_count", &obs);
    assert!(
        claims >= publishes,
        "every publish follows a claim: {claims} claims"
    );
    let sizes = histogram_buckets(body, "delay_bridge_claim_batch_size", &obs);
    let size_count = metric_value(body, "delay_bridge_claim_batch_size_count", &obs);
    assert_eq!(
        metric_value(body, "delay_bridge_claim_batch_size_sum", &obs),
        n as f64,
        "every member claimed exactly once"
    );
    assert_eq!(
        count_le(&sizes, batch as f64),
        size_count,
        "no claim above batch = {batch}: {sizes:?}"
    );
    assert_eq!(size_count, publishes, "one non-empty claim per publish");
}

/// Labels stay bounded: known names only, never a payload or a Redis key (`key`).
fn assert_bounded_labels(body: &str, key: &str) {
    for s in parse_samples(body) {
        assert!(
            s.name.starts_with("delay_bridge_") || s.name.starts_with("process_"),
            "{}",
            s.name
        );
        for (k, v) in &s.labels {
            assert!(
                ALLOWED_LABELS.contains(&k.as_str()),
                "unexpected label {k} on {}",
                s.name
            );
            assert!(
                !v.contains("secret-payload") && !v.contains(key) && !v.contains("delay-"),
                "{}{{{k}={v:?}}} carries message data",
                s.name
            );
        }
    }
    let forwarded_series: BTreeSet<_> = parse_samples(body)
        .into_iter()
        .filter(|s| s.name == "delay_bridge_messages_forwarded_total")
        .map(|s| s.labels)
        .collect();
    assert_eq!(forwarded_series.len(), 1, "{forwarded_series:?}");
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
        .amqp_sink(
            "flaky",
            &format!("amqp://guest:guest@127.0.0.1:{broker_port}/%2f"),
        )
        .set_str("sinks.flaky", "reconnect_max", "300ms");
    let to = capture.destination() + "workers = 2";
    let config = settings.to_string() + &trigger("backlog", &key, "flaky", &to);
    let bridge = Bridge::start(&config, port);
    let (alive, got) = bridge
        .wait_http("/healthz", Duration::from_secs(15), |s, _| s == 200)
        .await;
    assert!(alive, "/healthz: {got:?}\n{}", bridge.log());
    // Redis connects, the sink does not: not ready, and the reason names the sink alone.
    let (unready, got) = bridge
        .wait_http("/readyz", Duration::from_secs(15), |s, b| {
            s == 503 && b.trim() == "sink flaky: not connected"
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
    assert_eq!(
        metric_value(&body, "delay_bridge_sink_up", &[("sink", "flaky")]),
        0.0
    );
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
        .wait_scrape(Duration::from_secs(5), |b| {
            metric_value(b, "delay_bridge_sink_up", &[("sink", "flaky")]) == 1.0
        })
        .await;
    assert!(up, "sink_up after recovery:\n{body}");
    assert_eq!(capture.count(), due as usize);
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_worker_spans_and_never_a_password() {
    let (mut r, capture, key) = amqp_scene("logs", "delay", "logs").await;
    let down_key = format!("{}:{{logs-down}}", unique("delay"));
    let secret = unique("pw-s3cret");
    let port = free_port();
    let closed = free_port();
    // One trigger dead-letters (unroutable, one attempt), one cannot reach its broker:
    // both log from inside a worker span.
    let settings = ConfigToml::base(port)
        .set_str("log", "format", "json")
        .amqp_sink(
            "down",
            &format!("amqp://guest:{secret}@127.0.0.1:{closed}/%2f"),
        )
        .set_str("sinks.down", "reconnect_max", "300ms");
    let unroutable = format!(
        "exchange = \"{}\"\nrouting_key = \"nobody-listens\"\nmax_attempts = 1",
        capture.exchange
    );
    let triggers = trigger("logs-dead", &key, "rabbit", &unroutable)
        + &trigger("logs-down", &down_key, "down", &capture.destination());
    let bridge = Bridge::start(&(settings.to_string() + &triggers), port);
    let (alive, got) = bridge
        .wait_http("/healthz", Duration::from_secs(15), |s, _| s == 200)
        .await;
    assert!(alive, "{got:?}\n{}", bridge.log());
    let now = redis_now(&mut r).await;
    zadd(&mut r, &key, now, "undeliverable").await;
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let (_, dead) = poll(
        Duration::from_secs(15),
        Duration::from_millis(50),
        async || zcard(&mut r, &keys.dead).await,
        |dead| *dead == 1 && bridge.log().contains("sink unavailable"),
    )
    .await;
    assert_eq!(dead, 1, "{}", bridge.log());
    let log = bridge.log();

    let mut worker_events = BTreeSet::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line}"));
        assert!(v.is_object(), "{line}");
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        let span = &v["span"];
        if span["name"] == "worker" {
            assert!(span["worker"].is_u64(), "worker index in the span: {line}");
            let message = v["message"].as_str().unwrap_or_default();
            let trigger = span["trigger"].as_str().unwrap_or_default();
            if message.contains("dead-lettered") || message.contains("sink unavailable") {
                worker_events.insert(trigger.to_string());
            }
        }
    }
    assert_eq!(
        worker_events,
        BTreeSet::from(["logs-dead".to_string(), "logs-down".to_string()]),
        "worker events carry trigger and worker:\n{log}"
    );
    assert!(!log.contains(&secret), "the AMQP password leaked:\n{log}");
    drop(bridge);

    // A Redis URL with a password the server rejects: the bridge refuses to start, says
    // why, and never logs the password.
    let redis_secret = unique("redis-s3cret");
    let redis_url = redis_url().replacen("redis://", &format!("redis://:{redis_secret}@"), 1);
    let config = settings.set_str("redis", "url", &redis_url).to_string() + &triggers;
    assert!(config.contains(&redis_secret));
    let mut bridge = Bridge::start(&config, port);
    let code = bridge.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(code, Some(1), "{}", bridge.log());
    let log = bridge.log();
    assert!(log.contains("credentials"), "{log}");
    assert!(
        !log.contains(&redis_secret),
        "the Redis password leaked:\n{log}"
    );
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
    cleanup_keys(&mut r, &down_key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_prints_a_row_per_trigger_and_json_with_the_sizes() {
    let mut r = redis().await;
    let busy = format!("{}:{{stats}}", unique("delay"));
    let empty = unique("delay-stats-empty");
    let keys = delay_bridge::keys::QueueKeys::derive(&busy).unwrap();
    let now = redis_now(&mut r).await;
    let later = (0..4).map(|i| (now + 600_000 + i, format!("later-{i}")));
    let overdue = (0..3).map(|i| (now - 7_000 + i, format!("overdue-{i}")));
    zadd_all(&mut r, &busy, later.chain(overdue)).await;
    let leased = (0..2).map(|i| (now + 600_000, format!("leased-{i}")));
    zadd_all(&mut r, &keys.inflight, leased).await;
    zadd(&mut r, &keys.dead, now, "dead-0").await;

    let config = base_config(free_port())
        + &trigger("stats-busy", &busy, "rabbit", "exchange = \"x\"")
        + &trigger("stats-empty", &empty, "rabbit", "exchange = \"x\"");
    let run = |json: bool| {
        let args: &[&str] = if json {
            &["stats", "--json"]
        } else {
            &["stats"]
        };
        let out = cli(args, &config, &[]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.stdout
    };

    let table = run(false);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "a header and one row per trigger:\n{table}");
    assert_eq!(
        rows[0],
        [
            "TRIGGER",
            "SCHEDULED",
            "DUE",
            "INFLIGHT",
            "DEAD",
            "OLDEST_DUE_AGE",
            "STATE"
        ]
    );
    assert_eq!(rows[1][..5], ["stats-busy", "4", "3", "2", "1"], "{table}");
    assert_eq!(rows[2][..5], ["stats-empty", "0", "0", "0", "0"], "{table}");
    let age: f64 = rows[1][5].trim_end_matches('s').parse().unwrap();
    assert!((7.0..60.0).contains(&age), "{table}");
    assert_eq!(rows[2][5], "0.000s");
    assert_eq!((rows[1][6], rows[2][6]), ("active", "active"), "{table}");

    let json: serde_json::Value = serde_json::from_str(&run(true)).expect("--json parses");
    let list = json.as_array().expect("a list of triggers");
    assert_eq!(list.len(), 2, "{json}");
    let busy_stats = &list[0]["stats"];
    assert_eq!(list[0]["trigger"], "stats-busy");
    assert_eq!(busy_stats["scheduled"], 4);
    assert_eq!(busy_stats["due"], 3);
    assert_eq!(busy_stats["inflight"], 2);
    assert_eq!(busy_stats["dead"], 1);
    let age = busy_stats["oldest_due_age_seconds"].as_f64().unwrap();
    assert!((7.0..60.0).contains(&age), "{json}");
    assert_eq!(list[1]["trigger"], "stats-empty");
    assert_eq!(
        list[1]["stats"],
        serde_json::json!({"scheduled": 0, "due": 0, "inflight": 0, "dead": 0, "oldest_due_age_seconds": 0.0, "paused": false})
    );

    cleanup_keys(&mut r, &busy).await;
    cleanup_keys(&mut r, &empty).await;
}

/// Series whose labels are known at start-up are exported from start-up with 0, so an
/// `increase(...) > 0` alert sees the first dead letter of each reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_counters_are_exported_at_zero_from_start_up() {
    let capture = AmqpCapture::start("zero").await;
    let key = format!("{}:{{zero}}", unique("delay"));
    let port = free_port();
    let bridge = Bridge::start(
        &(base_config(port) + &amqp_trigger("zero", &key, &capture, "")),
        port,
    )
    .ready(Duration::from_secs(15))
    .await;
    let body = bridge.scrape().await;
    let samples = parse_samples(&body);
    let present = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .any(|s| s.name == name && s.has(labels) && s.value == 0.0)
    };
    for reason in [
        "nack",
        "unroutable",
        "timeout",
        "broker_refused",
        "too_large",
        "bad_payload",
    ] {
        for name in [
            "delay_bridge_messages_retried_total",
            "delay_bridge_messages_dead_lettered_total",
        ] {
            assert!(
                present(name, &[("trigger", "zero"), ("reason", reason)]),
                "{name}{{reason={reason}}} missing at start-up:\n{body}"
            );
        }
    }
    for kind in ["connection", "timeout", "wrong_type", "script"] {
        assert!(
            present(
                "delay_bridge_redis_errors_total",
                &[("trigger", "zero"), ("kind", kind)]
            ),
            "redis_errors_total{{kind={kind}}} missing at start-up"
        );
    }
    for name in [
        "delay_bridge_messages_forwarded_total",
        "delay_bridge_messages_redelivered_total",
        "delay_bridge_messages_put_back_total",
        "delay_bridge_empty_claims_total",
    ] {
        assert!(
            samples
                .iter()
                .any(|s| s.name == name && s.has(&[("trigger", "zero")])),
            "{name} missing at start-up"
        );
    }
    // Histograms of deliveries appear with the first one: an idle trigger holds no buckets.
    for name in [
        "delay_bridge_lateness_seconds_bucket",
        "delay_bridge_publish_duration_seconds_bucket",
        "delay_bridge_claim_batch_size_bucket",
    ] {
        assert!(
            !samples
                .iter()
                .any(|s| s.name == name && s.has(&[("trigger", "zero")])),
            "{name} exported before any delivery"
        );
    }
}

/// The metrics listener describes itself: the process's own metrics from start-up, the
/// build's revision, and a page at `/` that links the endpoints and names the admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_metrics_revision_and_a_landing_page_are_served_from_start_up() {
    let capture = AmqpCapture::start("proc").await;
    let key = format!("{}:{{proc}}", unique("delay"));
    let (port, admin_port) = (free_port(), free_port());
    let admin = format!("127.0.0.1:{admin_port}");
    let settings = ConfigToml::base(port)
        .set_str("admin", "listen", &admin)
        .set("admin", "read_only", "true");
    let mut bridge = Bridge::start(
        &(settings.to_string() + &amqp_trigger("proc", &key, &capture, "")),
        port,
    )
    .ready(Duration::from_secs(15))
    .await;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let body = bridge.scrape().await;
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_threads",
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} ")),
            "{name} missing at start-up:\n{body}"
        );
    }
    assert!(metric_value(&body, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(metric_value(&body, "process_open_fds", &[]) >= 3.0);
    let start = metric_value(&body, "process_start_time_seconds", &[]);
    assert!(
        (started - 120.0..=started + 1.0).contains(&start),
        "start time {start}, now {started}"
    );
    let revision = parse_samples(&body)
        .into_iter()
        .find(|s| s.name == "delay_bridge_build_info")
        .and_then(|s| s.labels.into_iter().find(|(k, _)| k == "revision"))
        .map(|(_, v)| v);
    let expected = option_env!("DELAY_BRIDGE_REVISION").unwrap_or("unknown");
    assert_eq!(revision.as_deref(), Some(expected), "{body}");

    let (status, page) = bridge.get("/").await.expect("GET / answers");
    assert_eq!(status, 200, "{page}");
    for link in ["href=\"metrics\"", "href=\"healthz\"", "href=\"readyz\""] {
        assert!(page.contains(link), "{link} missing:\n{page}");
    }
    assert!(page.contains(&admin), "the admin API's address:\n{page}");
    assert!(page.contains(env!("CARGO_PKG_VERSION")), "{page}");
    bridge.terminate(Duration::from_secs(15)).await;

    // Without an admin API the page says so.
    let port = free_port();
    let mut bridge = Bridge::start(
        &(base_config(port) + &amqp_trigger("proc", &key, &capture, "")),
        port,
    )
    .ready(Duration::from_secs(15))
    .await;
    let (status, page) = bridge.get("/").await.expect("GET / answers");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("not enabled"), "{page}");
    bridge.terminate(Duration::from_secs(15)).await;
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
    let _: () = redis::cmd("ZREM")
        .arg(&key)
        .arg("in an hour")
        .query_async(&mut r)
        .await
        .unwrap();
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
