//! Envelopes and expiry: a message's own headers, properties, routing and Kafka keys arrive as
//! sent; malformed envelopes and routing keys not allowed are dead-lettered with their reason;
//! expired messages are dead-lettered or dropped, never published.

use crate::common;

use std::time::Duration;

use common::kafka::*;
use common::*;
use lapin::types::AMQPValue;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// The dead letters of `key` as (member, reason JSON).
async fn dead_letters(key: &str) -> Vec<(String, serde_json::Value)> {
    store(key)
        .await
        .list_dead(1000)
        .await
        .unwrap()
        .into_iter()
        .map(|d| {
            let why = d.reason.expect("every dead letter has its reason");
            (
                String::from_utf8_lossy(&d.member).into_owned(),
                serde_json::from_str(&why).unwrap(),
            )
        })
        .collect()
}

/// Waits until `key` has `n` dead letters.
async fn expect_dead(r: &mut Conn, key: &str, n: i64, bridge: &Bridge) {
    let sizes = wait_sizes(r, key, Duration::from_secs(15), |s| s.2 == n).await;
    assert_eq!(sizes.2, n, "sizes {sizes:?}\n{}", bridge.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_envelopes_arrive_with_their_properties_and_bad_ones_are_dead_lettered() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("orders.default").await;
    capture.bind(&capture.exchange, "orders.eu").await;
    capture.bind(&capture.exchange, "billing.eu").await;
    let key = unique("env-amqp");
    let port = free_port();
    let options = "format = \"envelope\"\nallowed_routing_keys = [\"orders.*\"]";
    let config = base_config(port) + &amqp_trigger("env", &key, &capture, options);
    let full = serde_json::json!({
        "body_b64": "/wD+Cg==",
        "headers": {"traceparent": TRACEPARENT, "tracestate": "vendor=1", "tenant": 42, "urgent": true},
        "content_type": "application/octet-stream",
        "content_encoding": "gzip",
        "correlation_id": "corr-1",
        "reply_to": "replies",
        "type": "order.created",
        "priority": 7,
        "expiration_ms": 600000,
        "id": "order-1",
        "routing_key": "orders.eu",
    });
    let plain = serde_json::json!({"body": "plain text"});
    schedule_now(
        &mut r,
        &key,
        [
            full.to_string(),
            plain.to_string(),
            r#"{"body": "x", "routing_key": "billing.eu"}"#.to_string(),
            "not json at all".to_string(),
            r#"{"body": "x", "colour": "red"}"#.to_string(),
        ],
    )
    .await;
    let bridge = Bridge::start(&config, port);
    bridge
        .expect_arrivals(2, Duration::from_secs(30), || capture.count())
        .await;
    expect_dead(&mut r, &key, 3, &bridge).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = capture.snapshot();
    assert_eq!(got.len(), 2, "only the two good envelopes arrive: {got:?}");

    let m = got.iter().find(|m| m.routing_key == "orders.eu").unwrap();
    assert_full_envelope_arrived(m);

    let p = got.iter().find(|m| m.body == b"plain text").unwrap();
    assert_eq!(
        p.routing_key, "orders.default",
        "no routing key of its own: the trigger's"
    );

    let dead = dead_letters(&key).await;
    let reason_of = |needle: &str| {
        dead.iter()
            .find(|(m, _)| m.contains(needle))
            .map(|(_, why)| why.clone())
            .unwrap_or_else(|| panic!("no dead letter with {needle}: {dead:?}"))
    };
    let refused = reason_of("billing.eu");
    assert_eq!(refused["reason"], "route_not_allowed");
    assert_eq!(refused["detail"], "billing.eu");
    let garbage = reason_of("not json");
    assert_eq!(garbage["reason"], "bad_envelope");
    assert!(
        garbage["detail"].as_str().unwrap().contains("expected"),
        "{garbage}"
    );
    let unknown = reason_of("colour");
    assert_eq!(unknown["reason"], "bad_envelope");
    assert!(
        unknown["detail"]
            .as_str()
            .unwrap()
            .contains("unknown field `colour`"),
        "{unknown}"
    );
    let text = bridge.scrape().await;
    assert_eq!(dead_lettered(&text, "env", "bad_envelope"), 2.0);
    finish(bridge, &mut r, &key).await;
}

/// The full envelope arrived as sent: the body alone, byte for byte, with every property
/// and header it set, and the bridge's headers too.
fn assert_full_envelope_arrived(m: &Received) {
    assert_eq!(
        m.body,
        vec![0xff, 0x00, 0xfe, b'\n'],
        "the body alone, byte for byte"
    );
    let p = &m.properties;
    assert_eq!(
        p.content_type().as_ref().unwrap().as_str(),
        "application/octet-stream"
    );
    assert_eq!(p.content_encoding().as_ref().unwrap().as_str(), "gzip");
    assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), "corr-1");
    assert_eq!(p.reply_to().as_ref().unwrap().as_str(), "replies");
    assert_eq!(p.kind().as_ref().unwrap().as_str(), "order.created");
    assert_eq!(*p.priority(), Some(7));
    assert_eq!(p.expiration().as_ref().unwrap().as_str(), "600000");
    assert_eq!(m.message_id.as_deref(), Some("order-1"));
    assert_eq!(m.delivery_mode, Some(2));
    let headers = p.headers().clone().unwrap();
    let h = headers.inner();
    assert!(
        matches!(h.get("traceparent"), Some(AMQPValue::LongString(s)) if s.to_string() == TRACEPARENT),
        "traceparent passes through unchanged: {h:?}"
    );
    assert!(
        matches!(h.get("tracestate"), Some(AMQPValue::LongString(s)) if s.to_string() == "vendor=1")
    );
    assert!(matches!(h.get("tenant"), Some(AMQPValue::LongLongInt(42))));
    assert!(matches!(h.get("urgent"), Some(AMQPValue::Boolean(true))));
    assert_eq!(
        m.trigger.as_deref(),
        Some("env"),
        "the bridge's headers are there too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_envelopes_carry_their_headers_and_record_key() {
    let mut r = redis().await;
    let (topic, capture) = new_topic("env-kafka", 3).await;
    let key = unique("env-kafka");
    let port = free_port();
    let config = ConfigToml::base(port)
        .kafka_sink("kafka", &kafka_brokers(), &[])
        .to_string()
        + &kafka_trigger(
            "envk",
            &key,
            "kafka",
            &topic,
            "format = \"envelope\"\nkafka_key = \"member\"",
        );
    let envelope = serde_json::json!({
        "body": "kafka body",
        "headers": {"traceparent": TRACEPARENT, "tenant": 42, "content-type": "shadowed"},
        "content_type": "text/plain",
        "correlation_id": "corr-2",
        "kafka_key": "customer-9",
        "id": "msg-9",
    });
    let keyless = serde_json::json!({"body": "member keyed"});
    schedule_now(&mut r, &key, [envelope.to_string(), keyless.to_string()]).await;
    let mut bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    bridge
        .expect_arrivals(2, Duration::from_secs(30), || capture.count())
        .await;
    let got = capture.snapshot();
    let rec = got.iter().find(|r| r.body == b"kafka body").unwrap();
    assert_eq!(rec.key.as_deref(), Some(&b"customer-9"[..]));
    assert_eq!(rec.header("traceparent").as_deref(), Some(TRACEPARENT));
    assert_eq!(rec.header("tenant").as_deref(), Some("42"));
    assert_eq!(rec.header("content-type").as_deref(), Some("text/plain"));
    assert_eq!(
        rec.headers
            .iter()
            .filter(|(k, _)| k == "content-type")
            .count(),
        1,
        "the property wins over a header of the same name: {:?}",
        rec.headers
    );
    assert_eq!(rec.header("correlation-id").as_deref(), Some("corr-2"));
    assert_eq!(rec.header("x-delay-id").as_deref(), Some("msg-9"));
    assert_eq!(rec.header("x-delay-trigger").as_deref(), Some("envk"));
    let other = got.iter().find(|r| r.body == b"member keyed").unwrap();
    assert_eq!(
        other.key.as_deref(),
        Some(keyless.to_string().as_bytes()),
        "without a key of its own: the trigger's kafka_key (the member)"
    );
    bridge.terminate(Duration::from_secs(20)).await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
    capture.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_are_dead_lettered_or_dropped_never_published() {
    let mut r = redis().await;
    let now = redis_now(&mut r).await;
    for (on_expired, dead_expected) in [("dead_letter", 2i64), ("drop", 0)] {
        let capture = AmqpCapture::start("exp").await;
        let key = unique("expiry");
        let port = free_port();
        let config = base_config(port)
            + &amqp_trigger(
                "exp",
                &key,
                &capture,
                &format!(
                    "format = \"envelope\"\nexpire_after = \"1m\"\non_expired = \"{on_expired}\""
                ),
            );
        let env = |body: &str, extra: &str| format!(r#"{{"body": "{body}"{extra}}}"#);
        zadd_all(
            &mut r,
            &key,
            [
                // Due an hour ago: over expire_after.
                (now - 3_600_000, env("stale reminder", "")),
                // Due 10 s ago: within expire_after.
                (now - 10_000, env("fresh", "")),
                // Its own expiry passed, though due just now.
                (
                    now,
                    env("own expiry", &format!(r#", "expires_at_ms": {}"#, now - 1)),
                ),
                // Its own expiry ahead.
                (
                    now,
                    env(
                        "still good",
                        &format!(r#", "expires_at_ms": {}"#, now + 3_600_000),
                    ),
                ),
                // A score of 0 means "now": no due time to be late against.
                (0, env("score zero", "")),
            ],
        )
        .await;
        let bridge = Bridge::start(&config, port);
        bridge
            .expect_arrivals(3, Duration::from_secs(30), || capture.count())
            .await;
        let sizes = wait_drained(&mut r, &key, Duration::from_secs(10)).await;
        let left = (sizes.0, sizes.1);
        assert_eq!(left, (0, 0), "{on_expired}: {sizes:?}\n{}", bridge.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut bodies: Vec<Vec<u8>> = capture.snapshot().into_iter().map(|m| m.body).collect();
        bodies.sort();
        assert_eq!(
            bodies,
            [
                b"fresh".to_vec(),
                b"score zero".to_vec(),
                b"still good".to_vec()
            ],
            "{on_expired}"
        );
        assert_eq!(sizes.2, dead_expected, "{on_expired}: dead letters");
        if dead_expected > 0 {
            for (_, why) in dead_letters(&key).await {
                assert_eq!(why["reason"], "expired");
            }
        }
        let expired = bridge
            .metric("delay_bridge_messages_expired_total", &[("trigger", "exp")])
            .await;
        assert_eq!(expired, 2.0, "{on_expired}");
        finish(bridge, &mut r, &key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_for_the_other_broker_are_skipped_unread_whatever_they_hold() {
    let mut r = redis().await;
    // AMQP: Kafka-only fields that would not decode.
    let capture = AmqpCapture::start("orders.default").await;
    let key = unique("env-other-amqp");
    let (topic, kcapture) = new_topic("env-other-kafka", 1).await;
    let kkey = unique("env-other-kafka");
    let port = free_port();
    let config = ConfigToml::base(port)
        .kafka_sink("kafka", &kafka_brokers(), &[])
        .to_string()
        + &amqp_trigger("envo", &key, &capture, "format = \"envelope\"")
        + &kafka_trigger("envok", &kkey, "kafka", &topic, "format = \"envelope\"");
    schedule_now(
        &mut r,
        &key,
        [
            r#"{"body": "a1", "kafka_key_b64": "%%% not base64"}"#.to_string(),
            r#"{"body": "a2", "kafka_key": 7}"#.to_string(),
            r#"{"body": "a3", "kafka_key": "k", "kafka_key_b64": "eA=="}"#.to_string(),
        ],
    )
    .await;
    // Kafka: AMQP-only fields that would not decode or would be refused for AMQP.
    schedule_now(
        &mut r,
        &kkey,
        [
            r#"{"body": "k1", "priority": 300, "expiration_ms": "soon"}"#.to_string(),
            r#"{"body": "k2", "reply_to": 1, "type": [], "routing_key": {}}"#.to_string(),
            r#"{"body": "k3", "headers": {"CC": "elsewhere"}}"#.to_string(),
        ],
    )
    .await;
    let mut bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    // Three on each broker.
    let counts: [&dyn Fn() -> usize; 2] = [&|| capture.count(), &|| kcapture.count()];
    for count in counts {
        bridge
            .expect_arrivals(3, Duration::from_secs(30), count)
            .await;
    }
    assert!(dead_letters(&key).await.is_empty());
    assert!(dead_letters(&kkey).await.is_empty());
    let mut bodies: Vec<Vec<u8>> = capture.snapshot().into_iter().map(|m| m.body).collect();
    bodies.sort();
    assert_eq!(bodies, [b"a1".to_vec(), b"a2".to_vec(), b"a3".to_vec()]);
    let got = kcapture.snapshot();
    let k3 = got.iter().find(|m| m.body == b"k3").unwrap();
    assert_eq!(k3.header("CC").as_deref(), Some("elsewhere"));
    bridge.terminate(Duration::from_secs(20)).await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
    cleanup_keys(&mut r, &kkey).await;
    kcapture.delete().await;
}
