//! Hostile or broken input: odd members and scores, wrong key types, evicting Redis, JSON routing, config fuzz.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

async fn zadd(r: &mut redis::aio::MultiplexedConnection, key: &str, score: &str, member: &[u8]) {
    let _: i64 = redis::cmd("ZADD")
        .arg(key)
        .arg(score)
        .arg(member)
        .query_async(r)
        .await
        .unwrap();
}

async fn zscore(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    member: &[u8],
) -> Option<f64> {
    redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(r)
        .await
        .unwrap()
}

/// The dead-letter reason JSON of `member`, if it is a dead letter.
async fn dead_reason(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    member: &[u8],
) -> Option<serde_json::Value> {
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    let json: Option<String> = redis::cmd("HGET")
        .arg(&keys.dead_reasons)
        .arg(member)
        .query_async(r)
        .await
        .unwrap();
    json.map(|j| serde_json::from_str(&j).unwrap())
}

async fn start_ready(config: &str, port: u16) -> Bridge {
    let mut bridge = Bridge::start(config, port);
    assert!(
        bridge.wait_ready(Duration::from_secs(20)).await,
        "bridge not ready:\n{}",
        bridge.log()
    );
    bridge
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_members_and_scores_are_delivered_kept_or_dead_lettered() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("odd.rk").await;
    let key = format!("{}:{{odd}}", unique("delay"));
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let port = free_port();
    let bridge = start_ready(
        &(base_config(port) + &amqp_trigger("odd", &key, &capture, "workers = 2\nbatch = 8")),
        port,
    )
    .await;

    let now = redis_now(&mut r).await;
    let huge = vec![b'x'; 10 * 1024 * 1024];
    let binary: Vec<u8> = (0u8..=255).rev().collect();
    // (member, score, delivered?)
    let cases: Vec<(Vec<u8>, String, bool)> = vec![
        (b"".to_vec(), format!("{}", now - 1000), true),
        (binary.clone(), format!("{now}"), true),
        (b"{\"due\":\"-inf\"}".to_vec(), "-inf".into(), true),
        (b"{\"due\":\"+inf\"}".to_vec(), "+inf".into(), false),
        (b"{\"due\":\"epoch\"}".to_vec(), "0".into(), true),
        (b"{\"due\":\"before epoch\"}".to_vec(), "-1e15".into(), true),
        (
            b"{\"due\":\"fraction\"}".to_vec(),
            format!("{}.75", now - 5),
            true,
        ),
        // Year 2200: stays scheduled; the wake-up timer must not overflow.
        (
            b"{\"due\":\"2200\"}".to_vec(),
            "7258118400000".into(),
            false,
        ),
        (
            b"{\"due\":\"year 275760\"}".to_vec(),
            "8.64e15".into(),
            false,
        ),
        // Exactly max_message_bytes (default 1 MiB) is still published.
        (vec![b'y'; 1024 * 1024], format!("{}", now - 2), true),
    ];
    zadd(&mut r, &key, &format!("{}", now - 500), &huge).await;
    let just_over = vec![b'z'; 1024 * 1024 + 1];
    zadd(&mut r, &key, &format!("{}", now - 400), &just_over).await;
    for (member, score, _) in &cases {
        zadd(&mut r, &key, score, member).await;
    }
    let expected: Vec<&Vec<u8>> = cases.iter().filter(|c| c.2).map(|c| &c.0).collect();
    assert!(
        wait_until(Duration::from_secs(20), || capture.count()
            >= expected.len())
        .await,
        "{} of {} arrived\n{}",
        capture.count(),
        expected.len(),
        bridge.log()
    );
    // The oversized member is dead-lettered in the same pass, with one attempt and no retry.
    let end = Instant::now() + Duration::from_secs(10);
    let reason = loop {
        if let Some(reason) = dead_reason(&mut r, &key, &huge).await {
            break reason;
        }
        assert!(
            Instant::now() < end,
            "10 MiB member not dead-lettered\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(reason["reason"], "too_large", "{reason}");
    assert_eq!(reason["attempts"], 1, "{reason}");
    assert!(zscore(&mut r, &keys.dead, &huge).await.is_some());
    assert!(zscore(&mut r, &key, &huge).await.is_none(), "not retried");
    let reason = dead_reason(&mut r, &key, &just_over).await;
    assert_eq!(
        reason.map(|r| r["reason"].clone()),
        Some("too_large".into())
    );

    // Let a late duplicate or an early delivery of the never-due members show up.
    let _ = wait_until(Duration::from_millis(1500), || {
        capture.count() > expected.len()
    })
    .await;
    let got = capture.snapshot();
    let bodies: Vec<&Vec<u8>> = got.iter().map(|m| &m.body).collect();
    let mut want = expected.clone();
    let mut seen = bodies.clone();
    want.sort();
    seen.sort();
    assert_eq!(
        seen, want,
        "delivered exactly the due members, byte for byte"
    );
    let by_body: HashMap<&Vec<u8>, &Received> = got.iter().map(|m| (&m.body, m)).collect();
    assert_eq!(
        by_body[&binary].due_ms,
        Some(now),
        "non-UTF-8 member with its due time"
    );
    assert_eq!(
        by_body[&b"".to_vec()].due_ms,
        Some(now - 1000),
        "empty member"
    );
    assert_eq!(
        by_body[&b"{\"due\":\"-inf\"}".to_vec()].due_ms,
        Some(i64::MIN),
        "-inf saturates in the header"
    );
    for (member, score, delivered) in &cases {
        if !delivered {
            assert!(
                zscore(&mut r, &key, member).await.is_some(),
                "{} (score {score}) must stay scheduled",
                String::from_utf8_lossy(member)
            );
        }
    }
    let metrics = bridge.get("/metrics").await.unwrap().1;
    let labels = [("trigger", "odd"), ("reason", "too_large")];
    assert_eq!(
        metric_value(
            &metrics,
            "delay_bridge_messages_dead_lettered_total",
            &labels
        ),
        2.0
    );
    assert_eq!(
        metric_value(
            &metrics,
            "delay_bridge_messages_retried_total",
            &[("trigger", "odd")]
        ),
        0.0
    );
    assert_eq!(
        metric_value(
            &metrics,
            "delay_bridge_messages_forwarded_total",
            &[("trigger", "odd")]
        ),
        expected.len() as f64
    );
    assert!(!bridge.log().contains("panicked"), "{}", bridge.log());
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

/// A `-inf` head saturates to i64::MIN; the age of the oldest due member must not overflow.
#[tokio::test]
async fn stats_survive_infinite_scores() {
    let mut r = redis().await;
    let key = unique("delay");
    let manager = redis::Client::open(redis_url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let store = delay_bridge::store::Store::new(
        manager,
        delay_bridge::keys::QueueKeys::derive(&key).unwrap(),
    );
    zadd(&mut r, &key, "-inf", b"minus").await;
    zadd(&mut r, &key, "+inf", b"plus").await;
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.due, stats.scheduled), (1, 1));
    assert!(stats.oldest_due_age_seconds > 1e12, "{stats:?}");
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_backs_off_while_other_triggers_forward() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("good.rk").await;
    let bad = format!("{}:{{bad}}", unique("delay"));
    let good = format!("{}:{{good}}", unique("delay"));
    let _: i64 = redis::cmd("RPUSH")
        .arg(&bad)
        .arg("a list, not a sorted set")
        .query_async(&mut r)
        .await
        .unwrap();
    let port = free_port();
    let config = base_config(port)
        + &amqp_trigger("bad", &bad, &capture, "workers = 2")
        + &amqp_trigger("good", &good, &capture, "workers = 2");
    let bridge = start_ready(&config, port).await;

    let now = redis_now(&mut r).await;
    for i in 0..20 {
        zadd(
            &mut r,
            &good,
            &format!("{}", now + i * 50),
            format!("good {i}").as_bytes(),
        )
        .await;
    }
    assert!(
        wait_until(Duration::from_secs(15), || capture.count() >= 20).await,
        "the healthy trigger delivered {} of 20\n{}",
        capture.count(),
        bridge.log()
    );
    let errors = |body: &str| {
        metric_value(
            body,
            "delay_bridge_redis_errors_total",
            &[("trigger", "bad"), ("kind", "wrong_type")],
        )
    };
    let first = errors(&bridge.get("/metrics").await.unwrap().1);
    assert!(
        first >= 1.0,
        "wrong_type errors counted: {first}\n{}",
        bridge.log()
    );
    // Backing off: a few errors per second at most, not a hot loop.
    let started = Instant::now();
    let _ = wait_until(Duration::from_secs(3), || false).await;
    let body = bridge.get("/metrics").await.unwrap().1;
    let rate = (errors(&body) - first) / started.elapsed().as_secs_f64();
    eprintln!("wrong_type errors: {first} at first look, then {rate:.1}/s while backing off");
    assert!(
        rate < 20.0,
        "{rate} wrong_type errors per second: not backing off"
    );
    assert_eq!(
        metric_value(
            &body,
            "delay_bridge_redis_errors_total",
            &[("trigger", "good")]
        ),
        0.0,
        "the healthy trigger saw no error"
    );
    let len: i64 = redis::cmd("LLEN")
        .arg(&bad)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(len, 1, "the list is left alone");
    let log = bridge.log();
    assert!(
        log.contains("WRONGTYPE") || log.contains("wrong_type"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    drop(bridge);
    cleanup_keys(&mut r, &bad).await;
    cleanup_keys(&mut r, &good).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_warned_about_or_refused() {
    let redis =
        RedisServer::start(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]).await;
    let mut r = redis.conn().await;
    let capture = AmqpCapture::start("evict.rk").await;
    let key = format!("{}:{{evict}}", unique("delay"));
    let port = free_port();
    // No [log] section: the warning must show with the default log settings.
    let config = base_config(port)
        .replace(&redis_url(), &redis.url())
        .replace("[log]\nlevel = \"info,delay_bridge=debug\"\n", "")
        + &amqp_trigger("evict", &key, &capture, "");
    assert!(config.contains(&redis.url()) && !config.contains("[log]"));

    // Default: runs, and says why this Redis is risky.
    let bridge = start_ready(&config, port).await;
    zadd(&mut r, &key, "0", b"still delivered").await;
    assert!(
        wait_until(Duration::from_secs(10), || capture.count() == 1).await,
        "{}",
        bridge.log()
    );
    let log = bridge.log();
    assert!(
        log.contains("maxmemory-policy") && log.contains("allkeys-lru") && log.contains("evict"),
        "no eviction warning:\n{log}"
    );
    drop(bridge);

    // require_noeviction: refuses before claiming anything.
    zadd(&mut r, &key, "0", b"must stay").await;
    let strict = config.replace("[redis]\n", "[redis]\nrequire_noeviction = true\n");
    assert!(strict.contains("require_noeviction = true"));
    let mut bridge = Bridge::start(&strict, port);
    let code = bridge.wait_exit(Duration::from_secs(20)).await;
    let log = bridge.log();
    assert!(
        matches!(code, Some(c) if c != 0),
        "exit code {code:?}\n{log}"
    );
    assert!(log.contains("maxmemory-policy"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        zscore(&mut r, &key, b"must stay").await.is_some(),
        "nothing claimed"
    );
    assert_eq!(capture.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_key_from_a_json_field_or_dead_letter_bad_payload() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("orders.created").await;
    capture.bind(&capture.exchange, "orders.cancelled").await;
    let key = format!("{}:{{json}}", unique("delay"));
    let port = free_port();
    let trigger = amqp_trigger(
        "json",
        &key,
        &capture,
        "routing_key_pointer = \"/meta/type\"",
    );
    let bridge = start_ready(&(base_config(port) + &trigger), port).await;

    let good: Vec<(&[u8], &str)> = vec![
        (
            br#"{"meta":{"type":"orders.created"},"id":1}"#,
            "orders.created",
        ),
        (
            br#"{"id":2,"meta":{"type":"orders.cancelled"}}"#,
            "orders.cancelled",
        ),
        // RFC 6901 escapes are the pointer's business; plain keys with odd bytes are fine.
        (
            "{\"meta\":{\"type\":\"orders.created\"},\"note\":\"caf\u{e9} \u{1F600}\"}".as_bytes(),
            "orders.created",
        ),
    ];
    let bad: Vec<&[u8]> = vec![
        b"not json at all",
        b"",
        b"\xff\xfe{\"meta\":{\"type\":\"orders.created\"}}",
        br#"{"meta":{"type":"orders.created"}"#,
        br#"{"meta":{}}"#,
        br#"{"meta":{"type":42}}"#,
        br#"{"meta":{"type":null}}"#,
        br#"{"meta":"orders.created"}"#,
        br#"["meta","type"]"#,
    ];
    let now = redis_now(&mut r).await;
    for (member, _) in &good {
        zadd(&mut r, &key, &now.to_string(), member).await;
    }
    for member in &bad {
        zadd(&mut r, &key, &now.to_string(), member).await;
    }
    assert!(
        wait_until(Duration::from_secs(15), || capture.count() >= good.len()).await,
        "{} of {} arrived\n{}",
        capture.count(),
        good.len(),
        bridge.log()
    );
    let end = Instant::now() + Duration::from_secs(15);
    for member in &bad {
        let reason = loop {
            if let Some(reason) = dead_reason(&mut r, &key, member).await {
                break reason;
            }
            assert!(
                Instant::now() < end,
                "{:?} not dead-lettered\n{}",
                String::from_utf8_lossy(member),
                bridge.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(reason["reason"], "bad_payload", "{reason}");
        assert_eq!(reason["attempts"], 1, "dead-lettered at once: {reason}");
    }
    let got = capture.snapshot();
    assert_eq!(
        got.len(),
        good.len(),
        "only the well-formed payloads were published"
    );
    for (member, rk) in &good {
        let m = got.iter().find(|m| m.body == *member).expect("delivered");
        assert_eq!(m.routing_key, *rk);
    }
    let metrics = bridge.get("/metrics").await.unwrap().1;
    assert_eq!(
        metric_value(
            &metrics,
            "delay_bridge_messages_dead_lettered_total",
            &[("trigger", "json"), ("reason", "bad_payload")]
        ),
        bad.len() as f64
    );
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

// ---- config fuzz -------------------------------------------------------------------------

const SINK: &str = "[sinks.r]\ntype = \"amqp\"\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n";
const KAFKA_SINK: &str = "[sinks.k]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9092\"\n";
const TRIGGER: &str = "[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"r\"\nexchange = \"\"\n";
const KAFKA_TRIGGER: &str =
    "[[triggers]]\nname = \"kt\"\nkey = \"kk\"\nsink = \"k\"\ntopic = \"x\"\n";

/// Wrong values for a field, by the field's type.
fn wrong_values(kind: &str) -> Vec<&'static str> {
    let mut v = vec!["{ a = 1 }", "[1, 2]"];
    v.extend(match kind {
        "string" => vec!["42", "true", "1.5"],
        "duration" => vec!["42", "\"soon\"", "\"-1s\"", "true", "\"1 fortnight\""],
        "count" => vec!["-1", "\"four\"", "1.5", "99999999999999999999999", "true"],
        "bool" => vec!["\"yes\"", "1"],
        "addr" => vec![
            "\"nonsense\"",
            "9464",
            "\"127.0.0.1\"",
            "\"127.0.0.1:99999\"",
        ],
        "enum" => vec!["\"xml\"", "1"],
        "table" => vec!["1", "\"x\""],
        _ => unreachable!(),
    });
    v
}

/// Writes `toml` and runs `delay-bridge check` on it: (exit code, stdout + stderr).
fn check(toml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fuzz.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(binary())
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), text)
}

/// The valid base config with `line` set in `section` (replacing the field if already set).
fn with_line(section: &str, line: &str) -> String {
    let mut parts: Vec<(&str, String)> = vec![
        ("redis", "[redis]\n".into()),
        ("metrics", "[metrics]\n".into()),
        ("log", "[log]\n".into()),
        ("shutdown", "[shutdown]\n".into()),
        ("sinks.r", SINK.into()),
        ("sinks.k", KAFKA_SINK.into()),
        ("triggers", TRIGGER.into()),
        ("kafka_triggers", KAFKA_TRIGGER.into()),
    ];
    let part = &mut parts
        .iter_mut()
        .find(|(name, _)| *name == section)
        .unwrap()
        .1;
    let field = format!("{} =", line.split('=').next().unwrap().trim());
    let kept: Vec<&str> = part.lines().filter(|l| !l.starts_with(&field)).collect();
    *part = format!("{}\n{line}\n", kept.join("\n"));
    parts.into_iter().map(|(_, p)| p).collect()
}

#[test]
fn every_field_with_a_wrong_type_or_range_exits_78_naming_the_key() {
    let (code, text) = check(&with_line("redis", ""));
    assert_eq!(code, 0, "the base config is valid:\n{text}");

    // (section, field, type, expected key)
    let fields: &[(&str, &str, &str, &str)] = &[
        ("redis", "url", "string", "redis.url"),
        ("redis", "password_file", "string", "redis.password_file"),
        (
            "redis",
            "connect_timeout",
            "duration",
            "redis.connect_timeout",
        ),
        (
            "redis",
            "response_timeout",
            "duration",
            "redis.response_timeout",
        ),
        (
            "redis",
            "enable_keyspace_events",
            "bool",
            "redis.enable_keyspace_events",
        ),
        (
            "redis",
            "require_noeviction",
            "bool",
            "redis.require_noeviction",
        ),
        ("metrics", "listen", "addr", "metrics.listen"),
        (
            "metrics",
            "backlog_interval",
            "duration",
            "metrics.backlog_interval",
        ),
        ("log", "format", "enum", "log.format"),
        ("log", "level", "string", "log.level"),
        ("shutdown", "timeout", "duration", "shutdown.timeout"),
        ("sinks.r", "url", "string", "sinks.r.url"),
        (
            "sinks.r",
            "password_file",
            "string",
            "sinks.r.password_file",
        ),
        ("sinks.r", "declare", "table", "sinks.r.declare"),
        (
            "sinks.r",
            "reconnect_max",
            "duration",
            "sinks.r.reconnect_max",
        ),
        ("sinks.k", "brokers", "string", "sinks.k.brokers"),
        ("sinks.k", "properties", "table", "sinks.k.properties"),
        (
            "sinks.k",
            "sasl_password_file",
            "string",
            "sinks.k.sasl_password_file",
        ),
        ("triggers", "name", "string", "triggers[0].name"),
        ("triggers", "key", "string", "triggers[0].key"),
        ("triggers", "sink", "string", "triggers[0].sink"),
        ("triggers", "exchange", "string", "triggers[0].exchange"),
        (
            "triggers",
            "routing_key",
            "string",
            "triggers[0].routing_key",
        ),
        (
            "triggers",
            "routing_key_pointer",
            "string",
            "triggers[0].routing_key_pointer",
        ),
        ("triggers", "payload", "enum", "triggers[0].payload"),
        ("triggers", "workers", "count", "triggers[0].workers"),
        ("triggers", "batch", "count", "triggers[0].batch"),
        ("triggers", "lease", "duration", "triggers[0].lease"),
        (
            "triggers",
            "guard_interval",
            "duration",
            "triggers[0].guard_interval",
        ),
        (
            "triggers",
            "publish_timeout",
            "duration",
            "triggers[0].publish_timeout",
        ),
        (
            "triggers",
            "max_attempts",
            "count",
            "triggers[0].max_attempts",
        ),
        (
            "triggers",
            "backoff_initial",
            "duration",
            "triggers[0].backoff_initial",
        ),
        (
            "triggers",
            "backoff_max",
            "duration",
            "triggers[0].backoff_max",
        ),
        (
            "triggers",
            "max_message_bytes",
            "count",
            "triggers[0].max_message_bytes",
        ),
        ("kafka_triggers", "topic", "string", "triggers[1].topic"),
        (
            "kafka_triggers",
            "kafka_key",
            "enum",
            "triggers[1].kafka_key",
        ),
    ];
    let mut failures = Vec::new();
    let mut runs = 0;
    let mut probe = |section: &str, line: String, key: &str, failures: &mut Vec<String>| {
        runs += 1;
        let toml = with_line(section, &line);
        let (code, text) = check(&toml);
        // A number TOML itself cannot hold fails parsing: the error names the line, not a key
        // path, and must not be followed by problems about a config that was never read.
        let named = if line.contains("99999999999999999999999") {
            let field = line.split('=').next().unwrap().trim();
            text.contains(field) && text.contains("line") && !text.contains("at least one")
        } else {
            text.contains(key)
        };
        if code != 78 || !named || text.contains("panicked") {
            failures.push(format!(
                "`{line}` in [{section}]: exit {code}, key {key}:\n{text}"
            ));
        }
    };
    for (section, field, kind, key) in fields {
        for value in wrong_values(kind) {
            probe(section, format!("{field} = {value}"), key, &mut failures);
        }
    }
    // Out-of-range numbers and values that parse but cannot work.
    let ranges: &[(&str, &str, &str)] = &[
        ("triggers", "workers = 0", "triggers[0].workers"),
        ("triggers", "workers = 100000", "triggers[0].workers"),
        ("triggers", "batch = 0", "triggers[0].batch"),
        ("triggers", "batch = 1000000", "triggers[0].batch"),
        ("triggers", "lease = \"1s\"", "triggers[0].lease"),
        ("triggers", "lease = \"10s\"", "triggers[0].lease"),
        ("triggers", "lease = \"0s\"", "triggers[0].lease"),
        (
            "triggers",
            "publish_timeout = \"0s\"",
            "triggers[0].publish_timeout",
        ),
        ("triggers", "max_attempts = 0", "triggers[0].max_attempts"),
        (
            "triggers",
            "max_attempts = 5000000000",
            "triggers[0].max_attempts",
        ),
        (
            "triggers",
            "guard_interval = \"1ms\"",
            "triggers[0].guard_interval",
        ),
        (
            "triggers",
            "backoff_initial = \"0s\"",
            "triggers[0].backoff_initial",
        ),
        (
            "triggers",
            "backoff_max = \"1ms\"",
            "triggers[0].backoff_max",
        ),
        (
            "triggers",
            "max_message_bytes = 0",
            "triggers[0].max_message_bytes",
        ),
        ("triggers", "name = \"\"", "triggers[0].name"),
        ("triggers", "name = \"has space\"", "triggers[0].name"),
        ("triggers", "key = \"\"", "triggers[0].key"),
        ("triggers", "key = \"a{}b\"", "triggers[0].key"),
        ("triggers", "sink = \"nope\"", "triggers[0].sink"),
        (
            "triggers",
            "routing_key_pointer = \"type\"",
            "triggers[0].routing_key_pointer",
        ),
        ("triggers", "topic = \"x\"", "triggers[0].topic"),
        ("kafka_triggers", "exchange = \"x\"", "triggers[1].exchange"),
        ("kafka_triggers", "topic = \"\"", "triggers[1].topic"),
        (
            "kafka_triggers",
            "routing_key_pointer = \"/type\"",
            "triggers[1].routing_key_pointer",
        ),
        ("redis", "url = \"http://127.0.0.1\"", "redis.url"),
        ("redis", "url = \"not a url\"", "redis.url"),
        ("redis", "connect_timeout = \"0s\"", "redis.connect_timeout"),
        (
            "redis",
            "response_timeout = \"0s\"",
            "redis.response_timeout",
        ),
        (
            "metrics",
            "backlog_interval = \"1ms\"",
            "metrics.backlog_interval",
        ),
        ("shutdown", "timeout = \"0s\"", "shutdown.timeout"),
        ("sinks.r", "url = \"kafka://x\"", "sinks.r.url"),
        ("sinks.r", "type = \"smtp\"", "sinks.r"),
        (
            "sinks.r",
            "declare = [{ exchange = \"\" }]",
            "sinks.r.declare[0].exchange",
        ),
        (
            "sinks.r",
            "declare = [{ exchange = \"e\", kind = \"weird\" }]",
            "sinks.r.declare[0].kind",
        ),
        ("sinks.r", "declare = [{ exchange = 1 }]", "sinks.r.declare"),
        ("sinks.k", "brokers = \"\"", "sinks.k.brokers"),
        (
            "sinks.k",
            "properties = { \"acks\" = 1 }",
            "sinks.k.properties",
        ),
        ("log", "level = \"info,[[[\"", "log.level"),
    ];
    for (section, line, key) in ranges {
        probe(section, line.to_string(), key, &mut failures);
    }
    // Whole sections of the wrong shape.
    for (toml, key) in [
        (format!("redis = 1\n{SINK}{TRIGGER}"), "redis"),
        (format!("sinks = \"r\"\n{TRIGGER}"), "sinks"),
        (format!("triggers = 1\n{SINK}"), "triggers"),
        (format!("triggers = [1, 2]\n{SINK}"), "triggers[0]"),
        (format!("{SINK}[triggers]\nname = \"t\"\n"), "triggers"),
        (
            format!("{SINK}{TRIGGER}[[triggers]]\nname = \"t2\"\n"),
            "triggers[1].key",
        ),
        ("[[triggers]\nname = ".to_string(), ""),
        ("\u{0}\u{1}binary \u{7f}".to_string(), ""),
    ] {
        runs += 1;
        let (code, text) = check(&toml);
        if code != 78 || !text.contains(key) || text.contains("panicked") {
            failures.push(format!("{toml:?}: exit {code}, key {key}:\n{text}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} bad configs were not reported properly:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn a_bad_environment_override_is_named_with_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, format!("{SINK}{TRIGGER}")).unwrap();
    for (var, value, key) in [
        (
            "DELAY_BRIDGE_REDIS__CONNECT_TIMEOUT",
            "soon",
            "redis.connect_timeout",
        ),
        ("DELAY_BRIDGE_METRICS__LISTEN", "nowhere", "metrics.listen"),
        ("DELAY_BRIDGE_SHUTDOWN__TIMEOUT", "0s", "shutdown.timeout"),
        ("DELAY_BRIDGE_REDIS__URL", "ftp://x", "redis.url"),
    ] {
        let out = Command::new(binary())
            .args(["check", "--config"])
            .arg(&path)
            .env(var, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(78), "{var}={value}: {text}");
        assert!(text.contains(key), "{var}={value}: {text}");
        assert!(
            text.contains("DELAY_BRIDGE_") || text.contains("environment"),
            "{var}: source named: {text}"
        );
        assert!(!text.contains("panicked"), "{text}");
    }
}
