//! A record's own topic against a real Kafka-protocol broker: an `x-delay-topic` (or an envelope's `topic`) that `allowed_topics` matches is honoured with key and headers intact; any other, or any at all on a trigger without the patterns, is dead-lettered as `topic_not_allowed` and never produced; an allowed topic the cluster lacks is retried, then dead-lettered, while the rest flows.

use crate::common;

use std::time::Duration;

use common::kafka::*;
use common::*;
use delay_bridge::keys::QueueKeys;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Writes one record (key, value, headers) to `topic`, awaited.
async fn produce(topic: &str, key: &str, value: &str, headers: &[(&str, &str)]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("message.timeout.ms", "10000")
        .create()
        .unwrap();
    let record = FutureRecord::to(topic)
        .key(key)
        .payload(value)
        .headers(owned_headers(headers));
    producer
        .send(record, Duration::from_secs(10))
        .await
        .expect("record written");
}

/// A bridge on the shared Redis, ready: sink `kafka` (records time out after 2 s, so that
/// one for a missing topic fails soon) and a trigger `name` on `key` producing to `dest`,
/// reading `ingress`, with `extra` trigger lines (before its ingress table).
async fn start_bridge(name: &str, key: &str, dest: &str, ingress: &str, extra: &str) -> Bridge {
    let port = free_port();
    let props = [("message.timeout.ms", "2000")];
    let lines = format!(
        "{extra}max_attempts = 2\nbackoff_initial = \"100ms\"\n[triggers.ingress]\ntopic = \"{ingress}\"\ngroup = \"{}\"\n",
        unique("topic-group")
    );
    let cfg = ConfigToml::base(port)
        .kafka_sink("kafka", &kafka_brokers(), &props)
        .to_string()
        + &kafka_trigger(name, key, "kafka", dest, &lines);
    Bridge::start(&cfg, port)
        .ready(Duration::from_secs(30))
        .await
}

/// Topics made for one test, deleted at its end.
struct Topics(Vec<String>);

impl Topics {
    /// A test's topics: its ingress and destination topics, also returned in that order.
    async fn new() -> (Self, String, String) {
        let mut topics = Topics(Vec::new());
        let ingress = topics.add(unique("topic-in")).await;
        let dest = topics.add(unique("topic-dest")).await;
        (topics, ingress, dest)
    }

    /// Creates a topic of one partition named `name`.
    async fn add(&mut self, name: String) -> String {
        create_topic(&kafka_brokers(), &name, 1).await;
        self.0.push(name.clone());
        name
    }

    async fn delete(self) {
        for t in self.0 {
            delete_topic(&kafka_brokers(), &t).await;
        }
    }
}

/// Waits until `key`'s dead-letter set holds `n` members, and returns them.
async fn dead(r: &mut Conn, key: &str, n: usize) -> Vec<String> {
    let keys = QueueKeys::derive(key).unwrap();
    let (_, members) = poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let m: Vec<String> = redis::cmd("ZRANGE")
                .arg(&keys.dead)
                .arg(0)
                .arg(-1)
                .query_async(r)
                .await
                .unwrap();
            m
        },
        |m| m.len() >= n,
    )
    .await;
    assert_eq!(members.len(), n, "{members:?}");
    members
}

/// Stores an envelope under `id` in `key`'s queue (hash payload mode), due now, as a producer
/// writing to Redis does.
async fn schedule_envelope(r: &mut Conn, key: &str, id: &str, envelope: serde_json::Value) {
    let keys = QueueKeys::derive(key).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&keys.bodies)
        .arg(id)
        .arg(envelope.to_string())
        .query_async(r)
        .await
        .unwrap();
    zadd(r, key, 0, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_own_topic_is_honoured_and_any_other_is_dead_lettered_unproduced() {
    let base = unique("topic-own");
    let (mut topics, ingress, dest) = Topics::new().await;
    let chosen = topics.add(format!("{base}.eu")).await;
    let refused = topics.add(format!("{base}-eu")).await;
    let (to_dest, to_chosen, to_refused) = (
        KafkaCapture::start(&kafka_brokers(), &dest, 1),
        KafkaCapture::start(&kafka_brokers(), &chosen, 1),
        KafkaCapture::start(&kafka_brokers(), &refused, 1),
    );
    let key = unique("ingress-topic");
    let allowed = format!("allowed_topics = ['{base}\\..*']\n");
    let bridge = start_bridge("ktopic", &key, &dest, &ingress, &allowed).await;
    let sent = now_ms();
    let own = [
        ("x-delay", "500"),
        ("x-delay-topic", chosen.as_str()),
        ("tenant", "t-1"),
    ];
    produce(&ingress, "k-own", "own", &own).await;
    produce(&ingress, "k-plain", "plain", &[("tenant", "t-2")]).await;
    let not_allowed = [("x-delay-topic", refused.as_str())];
    produce(&ingress, "k-refused", "refused", &not_allowed).await;
    let mut r = redis().await;
    let envelope = |topic: &str, body: &str| serde_json::json!({"body": body, "topic": topic});
    schedule_envelope(&mut r, &key, "zadd-own", envelope(&chosen, "zadd-own")).await;
    schedule_envelope(&mut r, &key, "zadd-refused", envelope(&refused, "zadd-bad")).await;

    bridge
        .expect_arrivals(2, Duration::from_secs(30), || to_chosen.count())
        .await;
    bridge
        .expect_arrivals(1, Duration::from_secs(30), || to_dest.count())
        .await;
    let mut letters = dead(&mut r, &key, 2).await;
    letters.sort();
    assert!(
        letters[0].starts_with(&format!("{ingress}/")),
        "{letters:?}"
    );
    assert_eq!(letters[1], "zadd-refused");
    for member in &letters {
        let why = dead_reason(&mut r, &key, member).await.unwrap();
        assert_eq!(why["reason"], "topic_not_allowed", "{why}");
        assert_eq!(why["detail"], refused.as_str(), "{why}");
    }
    let label = |reason| [("trigger", "ktopic"), ("reason", reason)];
    let at_ingress = bridge
        .metric(
            "delay_bridge_ingress_refused_total",
            &label("topic_not_allowed"),
        )
        .await;
    assert_eq!(at_ingress, 1.0, "the record is refused as it is taken in");
    let when_due = bridge
        .metric(
            "delay_bridge_messages_dead_lettered_total",
            &label("topic_not_allowed"),
        )
        .await;
    assert!(when_due >= 1.0, "the envelope is refused when due");

    for capture in [&to_dest, &to_chosen, &to_refused] {
        capture.fence().await;
    }
    assert_eq!(
        to_refused.count(),
        0,
        "never produced to a topic not allowed"
    );
    let mut got = to_chosen.snapshot();
    got.sort_by(|a, b| a.body.cmp(&b.body));
    assert_eq!(got.len(), 2, "each once");
    let (record, zadded) = (&got[0], &got[1]);
    assert_eq!(
        (&record.body[..], &zadded.body[..]),
        (&b"own"[..], &b"zadd-own"[..])
    );
    assert_eq!(record.key.as_deref(), Some(&b"k-own"[..]));
    assert_eq!(record.header("tenant").as_deref(), Some("t-1"));
    assert_eq!(record.header("x-delay-topic"), None, "read, not passed on");
    assert_eq!(record.header("x-delay"), None);
    assert_eq!(record.header("x-delay-trigger").as_deref(), Some("ktopic"));
    let due: i64 = record.header("x-delay-due-ms").unwrap().parse().unwrap();
    assert!(due >= sent + 500, "due {due}, sent {sent}");
    assert!(record.at_ms >= due, "never early");
    let plain = &to_dest.snapshot()[0];
    assert_eq!(plain.body, b"plain");
    assert_eq!(plain.header("tenant").as_deref(), Some("t-2"));

    // The consumers stop before their topics go (librdkafka's metadata cache crashes on a
    // topic deleted under two assigned consumers).
    drop((bridge, to_dest, to_chosen, to_refused));
    cleanup_keys(&mut r, &key).await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allowed_topics_a_record_naming_a_topic_is_dead_lettered() {
    let (mut topics, ingress, dest) = Topics::new().await;
    let other = topics.add(unique("topic-other")).await;
    let (to_dest, to_other) = (
        KafkaCapture::start(&kafka_brokers(), &dest, 1),
        KafkaCapture::start(&kafka_brokers(), &other, 1),
    );
    let key = unique("ingress-topic-none");
    let bridge = start_bridge("knone", &key, &dest, &ingress, "").await;
    // Even the trigger's own topic: without the patterns, records do not choose.
    produce(&ingress, "k1", "to-other", &[("x-delay-topic", &other)]).await;
    produce(&ingress, "k2", "to-dest", &[("x-delay-topic", &dest)]).await;
    produce(&ingress, "k3", "plain", &[]).await;
    bridge
        .expect_arrivals(1, Duration::from_secs(30), || to_dest.count())
        .await;
    let mut r = redis().await;
    for member in dead(&mut r, &key, 2).await {
        let why = dead_reason(&mut r, &key, &member).await.unwrap();
        assert_eq!(why["reason"], "topic_not_allowed", "{why}");
    }
    to_dest.fence().await;
    to_other.fence().await;
    assert_eq!(to_other.count(), 0);
    let bodies: Vec<Vec<u8>> = to_dest.snapshot().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies, [b"plain".to_vec()]);
    drop((bridge, to_dest, to_other));
    cleanup_keys(&mut r, &key).await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_topic_the_cluster_lacks_is_retried_then_dead_lettered_and_the_rest_flow() {
    let base = unique("topic-missing");
    let (topics, ingress, dest) = Topics::new().await;
    let to_dest = KafkaCapture::start(&kafka_brokers(), &dest, 1);
    let key = unique("ingress-topic-missing");
    let allowed = format!("allowed_topics = ['{base}\\..*']\n");
    let bridge = start_bridge("kmiss", &key, &dest, &ingress, &allowed).await;
    // The test broker does not create topics it is asked about.
    let missing = format!("{base}.nowhere");
    produce(&ingress, "k0", "lost?", &[("x-delay-topic", &missing)]).await;
    for i in 0..20 {
        produce(&ingress, &format!("k{i}"), &format!("v{i}"), &[]).await;
    }
    bridge
        .expect_arrivals(20, Duration::from_secs(30), || to_dest.count())
        .await;
    let mut r = redis().await;
    let letter = dead(&mut r, &key, 1).await;
    let why = dead_reason(&mut r, &key, &letter[0]).await.unwrap();
    let reason = why["reason"].as_str().unwrap();
    // The record chose its topic: the topic's failure is the record's own destination's.
    assert_eq!(reason, "destination_refused", "{why}");
    assert_eq!(why["attempts"], 2, "{why}");
    println!("an allowed topic the cluster lacks: dead-lettered as {reason} after 2 attempts");
    drop((bridge, to_dest));
    cleanup_keys(&mut r, &key).await;
    topics.delete().await;
}
