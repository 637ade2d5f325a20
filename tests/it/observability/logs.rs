//! JSON logs with worker spans and no password, and `stats` as a table and as JSON.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_worker_spans_and_never_a_password() {
    let (mut r, capture, key) = amqp_scene("logs", "delay", "logs").await;
    let down_key = format!("{}:{{logs-down}}", unique("delay"));
    let secret = unique("pw-s3cret");
    let port = free_port();
    let closed = free_port();
    // One trigger dead-letters (too large, at once), one cannot reach its broker:
    // both log from inside a worker span.
    let settings = ConfigToml::base(port)
        .set_str("log", "format", "json")
        .amqp_sink(
            "down",
            &format!("amqp://guest:{secret}@127.0.0.1:{closed}/%2f"),
        )
        .set_str("sinks.down", "reconnect_max", "300ms");
    // Larger than the trigger allows: the message's own fault, dead-lettered at once.
    let too_large = capture.destination() + "max_message_bytes = 4\nmax_attempts = 1";
    let triggers = trigger("logs-dead", &key, "rabbit", &too_large)
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
    let log = bridge.expect_exit(1, Duration::from_secs(15)).await;
    assert!(log.contains("credentials"), "{log}");
    assert!(
        !log.contains(&redis_secret),
        "the Redis password leaked:\n{log}"
    );
    stop_and_clean(bridge, &mut r, &key).await;
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
