//! Metrics, health endpoints, logs and `stats` of the real binary against real Redis and RabbitMQ.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::*;

const ALLOWED_LABELS: [&str; 7] = [
    "trigger", "sink", "reason", "state", "kind", "version", "le",
];

async fn zadd(r: &mut redis::aio::MultiplexedConnection, key: &str, score: i64, member: &str) {
    let _: i64 = redis::cmd("ZADD")
        .arg(key)
        .arg(score)
        .arg(member)
        .query_async(r)
        .await
        .unwrap();
}

/// The cumulative count of the largest bucket bound not above `le`.
fn count_le(buckets: &[(f64, f64)], le: f64) -> f64 {
    buckets
        .iter()
        .rfind(|(b, _)| *b <= le)
        .map_or(0.0, |(_, c)| *c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_n_messages_moves_counters_and_histograms_by_exactly_n() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("obs").await;
    let key = format!("{}:{{obs}}", unique("delay"));
    let port = free_port();
    let batch = 4;
    let mut bridge = Bridge::start(
        &(base_config(port)
            + &amqp_trigger(
                "obs",
                &key,
                &capture,
                &format!("workers = 2\nbatch = {batch}"),
            )),
        port,
    );
    assert!(
        bridge.wait_ready(Duration::from_secs(15)).await,
        "{}",
        bridge.log()
    );
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
    let payload = |i: usize| format!("obs-secret-payload-{i}");
    for i in 0..n {
        let due = if i < overdue {
            now - 6000 - i as i64
        } else {
            now + 200 + 20 * i as i64
        };
        zadd(&mut r, &key, due, &payload(i)).await;
    }
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() >= n).await,
        "only {} of {n} arrived\n{}",
        capture.count(),
        bridge.log()
    );
    let (settled, body) = wait_scrape(port, Duration::from_secs(10), |b| {
        metric_value(b, "delay_bridge_messages_forwarded_total", &fwd) >= n as f64
    })
    .await;
    assert!(settled, "forwarded counter never reached {n}:\n{body}");

    assert_eq!(
        metric_value(&body, "delay_bridge_messages_forwarded_total", &fwd),
        n as f64
    );
    let late_count = metric_value(&body, "delay_bridge_lateness_seconds_count", &obs);
    let late_sum = metric_value(&body, "delay_bridge_lateness_seconds_sum", &obs);
    assert_eq!(late_count, n as f64, "one lateness observation per message");
    assert!(
        late_sum >= 6.0 * overdue as f64,
        "overdue members count as late by their age: sum {late_sum}"
    );
    let lateness = histogram_buckets(&body, "delay_bridge_lateness_seconds", &obs);
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

    let publishes = metric_value(&body, "delay_bridge_publish_duration_seconds_count", &fwd);
    assert!(
        publishes >= (n / batch) as f64 && publishes <= n as f64,
        "one publish observation per batch: {publishes}"
    );
    assert!(metric_value(&body, "delay_bridge_publish_duration_seconds_sum", &fwd) > 0.0);
    let claims = metric_value(&body, "delay_bridge_claim_duration_seconds_count", &obs);
    assert!(
        claims >= publishes,
        "every publish follows a claim: {claims} claims"
    );
    let sizes = histogram_buckets(&body, "delay_bridge_claim_batch_size", &obs);
    let size_count = metric_value(&body, "delay_bridge_claim_batch_size_count", &obs);
    assert_eq!(
        metric_value(&body, "delay_bridge_claim_batch_size_sum", &obs),
        n as f64,
        "every member claimed exactly once"
    );
    assert_eq!(
        count_le(&sizes, batch as f64),
        size_count,
        "no claim above batch = {batch}: {sizes:?}"
    );
    assert_eq!(size_count, publishes, "one non-empty claim per publish");

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

    // Labels stay bounded: known names only, never a payload or a Redis key.
    for s in parse_samples(&body) {
        assert!(s.name.starts_with("delay_bridge_"), "{}", s.name);
        for (k, v) in &s.labels {
            assert!(
                ALLOWED_LABELS.contains(&k.as_str()),
                "unexpected label {k} on {}",
                s.name
            );
            assert!(
                !v.contains("secret-payload") && !v.contains(&key) && !v.contains("delay-"),
                "{}{{{k}={v:?}}} carries message data",
                s.name
            );
        }
    }
    let forwarded_series: BTreeSet<_> = parse_samples(&body)
        .into_iter()
        .filter(|s| s.name == "delay_bridge_messages_forwarded_total")
        .map(|s| s.labels)
        .collect();
    assert_eq!(forwarded_series.len(), 1, "{forwarded_series:?}");

    // Nothing is counted twice later on.
    assert_eq!(capture.count(), n, "each message once");
    assert_eq!(
        bridge
            .metric("delay_bridge_messages_forwarded_total", &fwd)
            .await,
        n as f64
    );
    bridge.signal(15);
    assert_eq!(bridge.wait_exit(Duration::from_secs(15)).await, Some(0));
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_gauges_and_readyz_follow_the_sink_going_away_and_coming_back() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("backlog").await;
    let key = format!("{}:{{backlog}}", unique("delay"));
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let port = free_port();
    // Nothing listens on this port until the forwarder below starts.
    let broker_port = free_port();
    let config = format!(
        r#"{base}
[sinks.flaky]
type = "amqp"
url = "amqp://guest:guest@127.0.0.1:{broker_port}/%2f"
reconnect_max = "300ms"

[[triggers]]
name = "backlog"
key = "{key}"
sink = "flaky"
exchange = "{exchange}"
routing_key = "{rk}"
workers = 2
"#,
        base = base_config(port),
        exchange = capture.exchange,
        rk = capture.routing_key,
    );
    let bridge = Bridge::start(&config, port);
    let (alive, got) = wait_http(port, "/healthz", Duration::from_secs(15), |s, _| s == 200).await;
    assert!(alive, "/healthz: {got:?}\n{}", bridge.log());
    // Redis connects, the sink does not: not ready, and the reason names the sink alone.
    let (unready, got) = wait_http(port, "/readyz", Duration::from_secs(15), |s, b| {
        s == 503 && b.trim() == "sink flaky: not connected"
    })
    .await;
    assert!(unready, "/readyz: {got:?}\n{}", bridge.log());

    // With the sink down nothing is claimed, so the sizes stay put.
    let (scheduled, due, inflight, dead) = (7, 5, 2, 3);
    let now = redis_now(&mut r).await;
    for i in 0..scheduled {
        zadd(&mut r, &key, now + 3_600_000 + i, &format!("later-{i}")).await;
    }
    for i in 0..due {
        zadd(
            &mut r,
            &key,
            now - 10_000 - 1000 * i,
            &format!("overdue-{i}"),
        )
        .await;
    }
    // A lease far in the future is not recovered; dead letters are only counted.
    for i in 0..inflight {
        zadd(
            &mut r,
            &keys.inflight,
            now + 3_600_000,
            &format!("leased-{i}"),
        )
        .await;
    }
    for i in 0..dead {
        zadd(&mut r, &keys.dead, now, &format!("dead-{i}")).await;
    }
    let t = [("trigger", "backlog")];
    let state = |s: &'static str| [("trigger", "backlog"), ("state", s)];
    let oldest_overdue = (10_000 + 1000 * (due - 1)) as f64 / 1000.0;
    let (seen, body) = wait_scrape(port, Duration::from_secs(10), |b| {
        metric_value(b, "delay_bridge_backlog_messages", &state("scheduled")) == scheduled as f64
            && metric_value(b, "delay_bridge_backlog_messages", &state("due")) == due as f64
            && metric_value(b, "delay_bridge_backlog_messages", &state("inflight"))
                == inflight as f64
            && metric_value(b, "delay_bridge_backlog_messages", &state("dead")) == dead as f64
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
    let _broker = TcpForwarder::start(broker_port, amqp_addr()).await;
    let (ready, got) = wait_http(port, "/readyz", Duration::from_secs(15), |s, _| s == 200).await;
    assert!(ready, "/readyz after recovery: {got:?}\n{}", bridge.log());
    assert_eq!(got.map(|(_, b)| b), Some("ready\n".to_string()));
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() >= due as usize).await,
        "{} of {due} overdue arrived\n{}",
        capture.count(),
        bridge.log()
    );
    let (drained, body) = wait_scrape(port, Duration::from_secs(10), |b| {
        metric_value(b, "delay_bridge_backlog_messages", &state("due")) == 0.0
            && metric_value(b, "delay_bridge_oldest_due_age_seconds", &t) == 0.0
            && metric_value(b, "delay_bridge_messages_forwarded_total", &t) == due as f64
            // A refresh taken while the batch awaited its confirmation counts it in flight.
            && metric_value(b, "delay_bridge_backlog_messages", &state("inflight"))
                == inflight as f64
    })
    .await;
    assert!(drained, "gauges after draining:\n{body}");
    assert_eq!(
        metric_value(&body, "delay_bridge_backlog_messages", &state("scheduled")),
        scheduled as f64
    );
    assert_eq!(
        metric_value(&body, "delay_bridge_backlog_messages", &state("dead")),
        dead as f64
    );
    // The gauge follows the sink's supervisor, which looks again within reconnect_max.
    let (up, body) = wait_scrape(port, Duration::from_secs(5), |b| {
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
    let mut r = redis().await;
    let capture = AmqpCapture::start("logs").await;
    let key = format!("{}:{{logs}}", unique("delay"));
    let down_key = format!("{}:{{logs-down}}", unique("delay"));
    let secret = unique("pw-s3cret");
    let port = free_port();
    let closed = free_port();
    // One trigger dead-letters (unroutable, one attempt), one cannot reach its broker:
    // both log from inside a worker span.
    let config = base_config(port)
        + &format!(
            r#"
[sinks.down]
type = "amqp"
url = "amqp://guest:{secret}@127.0.0.1:{closed}/%2f"
reconnect_max = "300ms"

[[triggers]]
name = "logs-dead"
key = "{key}"
sink = "rabbit"
exchange = "{exchange}"
routing_key = "nobody-listens"
max_attempts = 1

[[triggers]]
name = "logs-down"
key = "{down_key}"
sink = "down"
exchange = "{exchange}"
routing_key = "{rk}"
"#,
            exchange = capture.exchange,
            rk = capture.routing_key,
        );
    let config = config.replace("[log]\n", "[log]\nformat = \"json\"\n");
    let bridge = Bridge::start(&config, port);
    let (alive, got) = wait_http(port, "/healthz", Duration::from_secs(15), |s, _| s == 200).await;
    assert!(alive, "{got:?}\n{}", bridge.log());
    let now = redis_now(&mut r).await;
    zadd(&mut r, &key, now, "undeliverable").await;
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let mut dead = 0i64;
    for _ in 0..300 {
        dead = redis::cmd("ZCARD")
            .arg(&keys.dead)
            .query_async(&mut r)
            .await
            .unwrap();
        if dead == 1 && bridge.log().contains("sink unavailable") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let config = config.replace(
        &format!("url = \"{}\"", common::redis_url()),
        &format!("url = \"{redis_url}\""),
    );
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
    for i in 0..4 {
        zadd(&mut r, &busy, now + 600_000 + i, &format!("later-{i}")).await;
    }
    for i in 0..3 {
        zadd(&mut r, &busy, now - 7_000 + i, &format!("overdue-{i}")).await;
    }
    for i in 0..2 {
        zadd(
            &mut r,
            &keys.inflight,
            now + 600_000,
            &format!("leased-{i}"),
        )
        .await;
    }
    zadd(&mut r, &keys.dead, now, "dead-0").await;

    let config = format!(
        r#"{base}
[[triggers]]
name = "stats-busy"
key = "{busy}"
sink = "rabbit"
exchange = "x"

[[triggers]]
name = "stats-empty"
key = "{empty}"
sink = "rabbit"
exchange = "x"
"#,
        base = base_config(free_port())
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stats.toml");
    std::fs::write(&path, config).unwrap();
    let run = |json: bool| {
        let mut cmd = Command::new(binary());
        cmd.args(["stats", "--config"]).arg(&path);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
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
            "OLDEST_DUE_AGE"
        ]
    );
    assert_eq!(rows[1][..5], ["stats-busy", "4", "3", "2", "1"], "{table}");
    assert_eq!(rows[2][..5], ["stats-empty", "0", "0", "0", "0"], "{table}");
    let age: f64 = rows[1][5].trim_end_matches('s').parse().unwrap();
    assert!((7.0..60.0).contains(&age), "{table}");
    assert_eq!(rows[2][5], "0.000s");

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
        serde_json::json!({"scheduled": 0, "due": 0, "inflight": 0, "dead": 0, "oldest_due_age_seconds": 0.0})
    );

    cleanup_keys(&mut r, &busy).await;
    cleanup_keys(&mut r, &empty).await;
}
