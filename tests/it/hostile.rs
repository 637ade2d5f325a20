//! Hostile or broken input in Redis: odd members and scores, wrong key types, an evicting
//! Redis, JSON routing. (Hostile config files: tests/it/config.rs.)

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::servers::RedisServer;
use common::*;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_members_and_scores_are_delivered_kept_or_dead_lettered() {
    let (mut r, capture, key) = amqp_scene("odd.rk", "delay", "odd").await;
    let bridge = ready_amqp_bridge("odd", &key, &capture, "workers = 2\nbatch = 8", READY).await;

    let now = redis_now(&mut r).await;
    let huge = vec![b'x'; 10 * 1024 * 1024];
    let binary: Vec<u8> = (0u8..=255).rev().collect();
    let cases = odd_cases(now, &binary);
    zadd(&mut r, &key, now - 500, &huge).await;
    let just_over = vec![b'z'; 1024 * 1024 + 1];
    zadd(&mut r, &key, now - 400, &just_over).await;
    for (member, score, _) in &cases {
        zadd(&mut r, &key, score, member).await;
    }
    let expected: Vec<&Vec<u8>> = cases.iter().filter(|c| c.2).map(|c| &c.0).collect();
    bridge
        .expect_arrivals(expected.len(), Duration::from_secs(20), || capture.count())
        .await;
    expect_oversized_dead_lettered(&mut r, &key, &huge, &just_over, &bridge).await;

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
    let metrics = bridge.scrape().await;
    assert_eq!(dead_lettered(&metrics, "odd", "too_large"), 2.0);
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
    finish(bridge, &mut r, &key).await;
}

/// The odd members and scores, relative to `now`, with whether each is due (delivered): the
/// empty member, bytes that are not UTF-8 (`binary`), infinities, the epoch and before it, a
/// fraction of a millisecond, far futures, exactly `max_message_bytes`.
fn odd_cases(now: i64, binary: &[u8]) -> Vec<(Vec<u8>, String, bool)> {
    vec![
        (b"".to_vec(), format!("{}", now - 1000), true),
        (binary.to_vec(), format!("{now}"), true),
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
    ]
}

/// The oversized members (`huge`, `just_over` the limit) are dead-lettered in the same pass,
/// `huge` with one attempt and no retry.
async fn expect_oversized_dead_lettered(
    r: &mut Conn,
    key: &str,
    huge: &[u8],
    just_over: &[u8],
    bridge: &Bridge,
) {
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let reason = wait_dead_reason(r, key, huge, end).await;
    let reason =
        reason.unwrap_or_else(|| panic!("10 MiB member not dead-lettered\n{}", bridge.log()));
    assert_eq!(reason["reason"], "too_large", "{reason}");
    assert_eq!(reason["attempts"], 1, "{reason}");
    assert!(zscore(r, &keys.dead, huge).await.is_some());
    assert!(zscore(r, key, huge).await.is_none(), "not retried");
    let reason = dead_reason(r, key, just_over).await;
    assert_eq!(
        reason.map(|r| r["reason"].clone()),
        Some("too_large".into())
    );
}

/// A `-inf` head saturates to i64::MIN; the age of the oldest due member must not overflow:
/// a member due "now" has no age, so the oldest finite due time counts (none here).
#[tokio::test]
async fn stats_survive_infinite_scores() {
    let mut r = redis().await;
    let key = unique("delay");
    let store = store(&key).await;
    zadd(&mut r, &key, "-inf", b"minus").await;
    zadd(&mut r, &key, "+inf", b"plus").await;
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.due, stats.scheduled), (1, 1));
    assert_eq!(stats.oldest_due_age_seconds, 0.0, "{stats:?}");
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
    let bridge = Bridge::start(&config, port).ready(READY).await;

    let now = redis_now(&mut r).await;
    zadd_all(
        &mut r,
        &good,
        (0..20).map(|i| (now + i * 50, format!("good {i}"))),
    )
    .await;
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
    let first = errors(&bridge.scrape().await);
    assert!(
        first >= 1.0,
        "wrong_type errors counted: {first}\n{}",
        bridge.log()
    );
    // Backing off: a few errors per second at most, not a hot loop.
    let started = Instant::now();
    let _ = wait_until(Duration::from_secs(3), || false).await;
    let body = bridge.scrape().await;
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
async fn an_evicting_redis_is_refused_or_warned_about() {
    let redis =
        RedisServer::start(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]).await;
    let (mut r, capture, key) = amqp_scene_on(&redis, "evict.rk", "evict").await;
    let port = free_port();
    // No [log] section: the messages must show with the default log settings.
    let settings = ConfigToml::base(port)
        .set_str("redis", "url", &redis.url())
        .without("log");
    let trigger = amqp_trigger("evict", &key, &capture, "");
    let config = settings.to_string() + &trigger;
    assert!(config.contains(&redis.url()) && !config.contains("[log]"));

    // Default: refuses before claiming anything, as a configuration error (78).
    zadd(&mut r, &key, "0", b"must stay").await;
    let mut bridge = Bridge::start(&config, port);
    let log = bridge.expect_exit(78, Duration::from_secs(20)).await;
    assert!(
        log.contains("maxmemory-policy allkeys-lru") && log.contains("require_noeviction"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        zscore(&mut r, &key, b"must stay").await.is_some(),
        "nothing claimed"
    );
    assert_eq!(capture.count(), 0);

    // require_noeviction = false: runs, and says why this Redis is risky.
    let lenient = settings
        .set("redis", "require_noeviction", "false")
        .to_string()
        + &trigger;
    assert!(lenient.contains("require_noeviction = false"));
    let bridge = Bridge::start(&lenient, port).ready(READY).await;
    assert!(
        wait_until(Duration::from_secs(10), || capture.count() == 1).await,
        "{}",
        bridge.log()
    );
    let log = bridge.log();
    assert!(
        log.contains("maxmemory-policy allkeys-lru") && log.contains("evict"),
        "no eviction warning:\n{log}"
    );
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
    let bridge = Bridge::start(&(base_config(port) + &trigger), port)
        .ready(READY)
        .await;

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
    let members = good.iter().map(|(member, _)| member).chain(&bad);
    schedule_now(&mut r, &key, members).await;
    bridge
        .expect_arrivals(good.len(), Duration::from_secs(15), || capture.count())
        .await;
    let end = Instant::now() + Duration::from_secs(15);
    for member in &bad {
        let reason = wait_dead_reason(&mut r, &key, member, end).await;
        let Some(reason) = reason else {
            panic!(
                "{:?} not dead-lettered\n{}",
                String::from_utf8_lossy(member),
                bridge.log()
            );
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
    let metrics = bridge.scrape().await;
    assert_eq!(
        dead_lettered(&metrics, "json", "bad_payload"),
        bad.len() as f64
    );
    stop_and_clean(bridge, &mut r, &key).await;
}
