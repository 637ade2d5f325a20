//! The RabbitMQ ingress against the real broker: delayed messages arrive once each, none early, with their properties and headers; no-delay ones at once; cancel by message id (command line and admin API); bad input dead-lettered; two replicas store each message once.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::ingress::*;
use common::*;
use lapin::types::{AMQPValue, LongString, ShortString};
use lapin::BasicProperties;

/// A bridge whose trigger `name` publishes due messages to `capture` and takes delayed ones
/// in through `broker`'s exchange; `extra` goes into the trigger, `ingress` into its ingress.
fn config(
    port: u16,
    name: &str,
    key: &str,
    capture: &AmqpCapture,
    broker: &IngressBroker,
    extra: &str,
    ingress: &str,
) -> String {
    base_config(port)
        + &amqp_trigger(
            name,
            key,
            capture,
            &format!("{extra}\n{}", broker.table(ingress)),
        )
}

/// One test's capture of what reaches RabbitMQ with its routing key, its ingress (a fresh
/// exchange and queue) and a fresh queue key.
struct Scene {
    capture: AmqpCapture,
    broker: IngressBroker,
    key: String,
}

impl Scene {
    /// A capture of `routing_key`, a new ingress, and the key `PREFIX-N`.
    async fn new(routing_key: &str, prefix: &str) -> Self {
        Self {
            capture: AmqpCapture::start(routing_key).await,
            broker: IngressBroker::new().await,
            key: unique(prefix),
        }
    }

    /// [`config`] for this scene's key, capture and ingress.
    fn config(&self, port: u16, name: &str, extra: &str, ingress: &str) -> String {
        let (key, capture, broker) = (&self.key, &self.capture, &self.broker);
        config(port, name, key, capture, broker, extra, ingress)
    }

    /// The end: the ingress deleted, the queue's keys removed.
    async fn finish(self) {
        self.broker.delete().await;
        cleanup_keys(&mut redis().await, &self.key).await;
    }

    /// A bridge on [`Scene::config`] on a free port, ready.
    async fn bridge(&self, name: &str, extra: &str, ingress: &str) -> Bridge {
        let port = free_port();
        Bridge::start(&self.config(port, name, extra, ingress), port)
            .ready(Duration::from_secs(30))
            .await
    }
}

/// The properties every message of the big test carries, `x-delay` in one of the forms the
/// plugin takes (an int, a numeric string, a long).
fn full_props(i: usize, delay_ms: i64) -> BasicProperties {
    let delay = match i % 3 {
        0 => AMQPValue::LongInt(delay_ms as i32),
        1 => AMQPValue::LongString(LongString::from(delay_ms.to_string())),
        _ => AMQPValue::LongLongInt(delay_ms),
    };
    let props = delayed(
        delay,
        &[
            (
                "tenant",
                AMQPValue::LongString(LongString::from(format!("t-{i}"))),
            ),
            ("n", AMQPValue::LongLongInt(i as i64)),
            ("flag", AMQPValue::Boolean(i.is_multiple_of(2))),
        ],
    )
    .with_content_type(ShortString::from("text/plain"))
    .with_content_encoding(ShortString::from("identity"))
    .with_correlation_id(ShortString::from(format!("c-{i}")))
    .with_reply_to(ShortString::from("replies"))
    .with_type(ShortString::from("order.created"))
    .with_app_id(ShortString::from("shop"))
    .with_priority(3)
    .with_timestamp(1_700_000_000 + i as u64);
    if i.is_multiple_of(2) {
        props.with_message_id(ShortString::from(format!("m-{i}")))
    } else {
        props
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_arrive_once_each_none_early_with_properties_and_headers() {
    let n = 1_000;
    let scene = Scene::new("rk", "ingress").await;
    let bridge = scene.bridge("ingress", "", "").await;
    let (capture, broker, key) = (&scene.capture, &scene.broker, &scene.key);
    let mut sent_at = HashMap::new();
    let mut delays = HashMap::new();
    let messages: Vec<_> = (0..n)
        .map(|i| {
            let delay = 1_000 + (i as i64 * 7) % 2_001;
            delays.insert(format!("b-{i}").into_bytes(), delay);
            (
                "rk".to_string(),
                format!("b-{i}").into_bytes(),
                full_props(i, delay),
            )
        })
        .collect();
    for (_, body, _) in &messages {
        sent_at.insert(body.clone(), now_ms());
    }
    broker.publish_many(messages).await;
    capture
        .expect_arrivals(n, Duration::from_secs(60), &bridge)
        .await;
    // Late copies would show now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = capture.snapshot();
    assert_eq!(received.len(), n, "each message once");
    let mut early = 0;
    for m in &received {
        let i: usize = std::str::from_utf8(&m.body[2..]).unwrap().parse().unwrap();
        let want = sent_at[&m.body] + delays[&m.body];
        if m.at_ms < want || m.due_ms.unwrap() < want {
            early += 1;
        }
        let p = &m.properties;
        assert_eq!(m.routing_key, "rk");
        assert_eq!(p.content_type().as_ref().unwrap().as_str(), "text/plain");
        assert_eq!(p.content_encoding().as_ref().unwrap().as_str(), "identity");
        assert_eq!(
            p.correlation_id().as_ref().unwrap().as_str(),
            format!("c-{i}")
        );
        assert_eq!(p.reply_to().as_ref().unwrap().as_str(), "replies");
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "order.created");
        assert_eq!(p.app_id().as_ref().unwrap().as_str(), "shop");
        assert_eq!(*p.priority(), Some(3));
        assert_eq!(*p.timestamp(), Some(1_700_000_000 + i as u64));
        assert_eq!(text_header(p, "tenant"), Some(format!("t-{i}")));
        assert_eq!(int_header(p, "n"), Some(i as i64));
        let flag = p.headers().as_ref().unwrap().inner().get("flag").cloned();
        assert_eq!(flag, Some(AMQPValue::Boolean(i.is_multiple_of(2))));
        assert!(
            p.headers()
                .as_ref()
                .unwrap()
                .inner()
                .get("x-delay")
                .is_none(),
            "x-delay is not passed on"
        );
        assert_eq!(m.trigger.as_deref(), Some("ingress"));
        if i.is_multiple_of(2) {
            assert_eq!(m.message_id.as_deref(), Some(format!("m-{i}").as_str()));
        }
    }
    assert_eq!(early, 0, "messages delivered before their delay");
    let stored = bridge
        .trigger_metric("delay_bridge_ingress_messages_total", "ingress")
        .await;
    assert_eq!(stored, n as f64);
    assert!(bridge
        .scrape()
        .await
        .contains("delay_bridge_ingress_store_duration_seconds_count{trigger=\"ingress\"} 1000"));
    let mut r = redis().await;
    let sizes = wait_drained(&mut r, key, Duration::from_secs(10)).await;
    assert_eq!(sizes.0 + sizes.1, 0);
    assert_eq!(broker.depth().await, Some(0), "every delivery acked");
    scene.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_without_a_delay_arrive_at_once() {
    let scene = Scene::new("now", "ingress-now").await;
    let bridge = scene.bridge("now", "", "").await;
    let (capture, broker) = (&scene.capture, &scene.broker);
    let past = (now_ms() - 60_000).to_string();
    let forms = [
        BasicProperties::default(),
        delayed(AMQPValue::LongInt(0), &[]),
        delayed(AMQPValue::LongInt(-5_000), &[]),
        delayed(AMQPValue::LongString(LongString::from("-1")), &[]),
        delayed(
            AMQPValue::LongInt(60_000),
            &[(
                "x-delay-until",
                AMQPValue::LongString(LongString::from(past.clone())),
            )],
        ),
    ];
    let sent = now_ms();
    let messages = (0..50).map(|i| {
        (
            "now".to_string(),
            format!("n-{i}").into_bytes(),
            forms[i % forms.len()].clone(),
        )
    });
    broker.publish_many(messages).await;
    capture
        .expect_arrivals(50, Duration::from_secs(10), &bridge)
        .await;
    let slowest = capture
        .snapshot()
        .iter()
        .map(|m| m.at_ms - sent)
        .max()
        .unwrap();
    assert!(slowest < 2_000, "no-delay messages took up to {slowest} ms");
    scene.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_cancelled_by_its_message_id_and_stored_once_per_id() {
    let scene = Scene::new("c", "ingress-cancel").await;
    let (capture, broker, key) = (&scene.capture, &scene.broker, &scene.key);
    let (port, admin_port) = (free_port(), free_port());
    let token = "ingress-test-token-0123456789";
    let admin = format!("[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n");
    let cfg = admin + &scene.config(port, "cancel", "", "");
    let bridge = Bridge::start_with_env(&cfg, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", token)])
        .ready(Duration::from_secs(30))
        .await;
    let with_id =
        |id: &str| delayed(AMQPValue::LongInt(3_000), &[]).with_message_id(ShortString::from(id));
    broker.publish("c", b"keep", with_id("order-keep")).await;
    broker.publish("c", b"drop", with_id("order-drop")).await;
    broker.publish("c", b"api", with_id("order-api")).await;
    // The same id again (a producer's retry): stored once.
    broker
        .publish("c", b"keep again", with_id("order-keep"))
        .await;
    let mut r = redis().await;
    let (stored, _) = poll(
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || zcard(&mut r, key).await,
        |n| *n == 3,
    )
    .await;
    assert!(stored, "three ids stored\n{}", bridge.log());
    let out = cli(
        &["cancel", "-t", "cancel", "order-drop"],
        &cfg,
        &[("DELAY_BRIDGE_ADMIN_TOKEN", token)],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    let bearer = format!("Bearer {token}");
    let answer = common::http::request(
        admin_port,
        "POST",
        "/api/v1/triggers/cancel/cancel",
        &[("Authorization", &bearer)],
        Some(r#"{"members": ["order-api"]}"#),
    )
    .await;
    assert_eq!(answer.json()["cancelled"], 1, "{answer:?}");
    capture
        .expect_arrivals(1, Duration::from_secs(10), &bridge)
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = capture.snapshot();
    assert_eq!(got.len(), 1, "{got:?}");
    // The first of the two copies Redis took is the one stored.
    assert!(
        got[0].body == b"keep" || got[0].body == b"keep again",
        "{got:?}"
    );
    assert_eq!(got[0].message_id.as_deref(), Some("order-keep"));
    let duplicates = bridge
        .trigger_metric("delay_bridge_ingress_duplicates_total", "cancel")
        .await;
    assert_eq!(duplicates, 1.0);
    scene.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_delays_and_oversized_messages_are_dead_lettered_not_dropped() {
    let scene = Scene::new("bad", "ingress-bad").await;
    let bridge = scene.bridge("bad", "max_message_bytes = 2000", "").await;
    let (capture, broker, key) = (&scene.capture, &scene.broker, &scene.key);
    let id = |id: &str, p: BasicProperties| p.with_message_id(ShortString::from(id));
    broker
        .publish(
            "bad",
            b"x",
            id(
                "soon",
                delayed(AMQPValue::LongString(LongString::from("soon")), &[]),
            ),
        )
        .await;
    broker
        .publish(
            "bad",
            b"x",
            id("table", delayed(AMQPValue::Boolean(true), &[])),
        )
        .await;
    broker
        .publish(
            "bad",
            &vec![b'a'; 3_000],
            id("big", BasicProperties::default()),
        )
        .await;
    broker
        .publish("bad", b"fine", id("fine", BasicProperties::default()))
        .await;
    let mut r = redis().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for (member, reason, detail) in [
        ("soon", "bad_delay", "`soon` is not a number"),
        ("table", "bad_delay", "boolean"),
        ("big", "too_large", "max_message_bytes"),
    ] {
        let why = wait_dead_reason(&mut r, key, member.as_bytes(), deadline).await;
        let why = why.unwrap_or_else(|| panic!("{member} not dead-lettered\n{}", bridge.log()));
        assert_eq!(why["reason"], reason, "{why}");
        assert!(why["detail"].as_str().unwrap().contains(detail), "{why}");
    }
    capture
        .expect_arrivals(1, Duration::from_secs(10), &bridge)
        .await;
    assert_eq!(capture.snapshot()[0].body, b"fine");
    assert_eq!(
        broker.depth().await,
        Some(0),
        "refused messages are acked once stored"
    );
    for (reason, count) in [("bad_delay", 2.0), ("too_large", 1.0)] {
        let got = bridge
            .metric(
                "delay_bridge_ingress_refused_total",
                &[("trigger", "bad"), ("reason", reason)],
            )
            .await;
        assert_eq!(got, count, "{reason}");
    }
    // The dead letter keeps the message: requeued, it is delivered (now, the delay gone).
    let cfg = scene.config(free_port(), "bad", "max_message_bytes = 2000", "");
    let out = cli(
        &["dead-letter", "requeue", "-t", "bad", "--member", "soon"],
        &cfg,
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    capture
        .expect_arrivals(2, Duration::from_secs(10), &bridge)
        .await;
    let requeued = capture.snapshot()[1].clone();
    assert_eq!(
        (requeued.body.as_slice(), requeued.message_id.as_deref()),
        (&b"x"[..], Some("soon"))
    );
    scene.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_ingress_queue_store_each_message_once() {
    let n = 2_000;
    let scene = Scene::new("two", "ingress-two").await;
    let a = scene.bridge("two", "", "prefetch = 50").await;
    let b = scene.bridge("two", "", "prefetch = 50").await;
    let (capture, broker) = (&scene.capture, &scene.broker);
    let messages = (0..n).map(|i| {
        (
            "two".to_string(),
            body(i, 0),
            delayed(AMQPValue::LongInt(500), &[]),
        )
    });
    broker.publish_many(messages).await;
    a.expect_arrivals(n, Duration::from_secs(60), || capture.tally().len())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = capture.tally();
    assert!(tally.values().all(|&c| c == 1), "a message arrived twice");
    let label = [("trigger", "two")];
    let stored = "delay_bridge_ingress_messages_total";
    let [ta, tb] = metric_of_each([&a, &b], stored, &label).await;
    assert_eq!(ta + tb, n as f64);
    println!("two replicas: {n} messages, stored {ta} + {tb}, each delivered once");
    scene.finish().await;
}

/// The migration's path: an exchange that exists with another type (the plugin's, here a
/// direct one) is bound to as it is, with the configured keys; deleted, the bridge declares
/// it again as its own within seconds, and producers publish to it as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_of_another_type_is_used_as_it_is_and_declared_again_once_deleted() {
    let scene = Scene::new("k1", "ingress-adopt").await;
    let (capture, broker) = (&scene.capture, &scene.broker);
    broker.declare_exchange(lapin::ExchangeKind::Direct).await;
    let bridge = scene.bridge("adopt", "", "binding_keys = [\"k1\"]").await;
    let now = || delayed(AMQPValue::LongInt(-60_000), &[]);
    broker
        .publish("k1", b"through the old exchange", now())
        .await;
    capture
        .expect_arrivals(1, Duration::from_secs(10), &bridge)
        .await;
    assert!(
        bridge.log().contains("exists with other settings"),
        "{}",
        bridge.log()
    );
    broker.delete_exchange().await;
    let (back, _) = poll(
        Duration::from_secs(20),
        Duration::from_millis(200),
        async || broker.exchange_exists().await,
        |b| *b,
    )
    .await;
    assert!(
        back,
        "the bridge declares its exchange again\n{}",
        bridge.log()
    );
    broker
        .publish("k1", b"through the bridge's own", now())
        .await;
    capture
        .expect_arrivals(2, Duration::from_secs(10), &bridge)
        .await;
    let bodies: Vec<Vec<u8>> = capture.snapshot().into_iter().map(|m| m.body).collect();
    assert_eq!(
        bodies,
        [
            b"through the old exchange".to_vec(),
            b"through the bridge's own".to_vec()
        ]
    );
    scene.finish().await;
}
