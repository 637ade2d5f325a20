//! The Kafka ingress against a real Kafka-protocol broker: delayed records arrive once each, none early, with their key and headers; no-delay ones at once; a bad `x-delay` is dead-lettered; a consumer-group rebalance mid-stream loses nothing and delivers nothing twice, and waits for the stores under way; a bridge SIGKILLed mid-ingest loses nothing; with Redis stopped it stops reading and resumes after; while Redis answers reads but refuses writes it does not read again until a write succeeds.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::kafka::*;
use common::proxy::{Mode, Proxy};
use common::*;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

const PARTITIONS: i32 = 3;

/// One record to write to the ingress topic: key, value and headers.
type Out = (String, Vec<u8>, Vec<(&'static str, String)>);

/// Writes `records` to `topic`, each awaited.
async fn produce(topic: &str, records: Vec<Out>) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("message.timeout.ms", "10000")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut sends = Vec::new();
    for (key, value, headers) in &records {
        let h = owned_headers(headers);
        let record = FutureRecord::to(topic).key(key).payload(value).headers(h);
        sends.push(producer.send(record, Duration::from_secs(10)));
    }
    for s in sends {
        s.await.expect("record written");
    }
}

/// One test's ingress topic, the capture of its destination topic (read from the
/// beginning), its queue key and the trigger `name` that reads the first and produces to the
/// second.
struct Scene {
    key: String,
    ingress: String,
    capture: KafkaCapture,
    trigger: String,
}

impl Scene {
    /// Fresh topics and key, the trigger `name` reading in its own consumer group.
    async fn new(name: &str, key_prefix: &str) -> Self {
        let key = unique(key_prefix);
        let ingress = unique("ingress-in");
        let dest = unique("ingress-out");
        create_topic(&kafka_brokers(), &ingress, PARTITIONS).await;
        create_topic(&kafka_brokers(), &dest, PARTITIONS).await;
        let capture = KafkaCapture::start(&kafka_brokers(), &dest, PARTITIONS);
        let group = unique("ingress-group");
        let trigger = kafka_trigger(
            name,
            &key,
            "kafka",
            &dest,
            &format!("[triggers.ingress]\ntopic = \"{ingress}\"\ngroup = \"{group}\"\n"),
        );
        Self {
            key,
            ingress,
            capture,
            trigger,
        }
    }

    /// A bridge with the trigger, on `redis` (a URL) or else the shared Redis, ready.
    async fn bridge(&self, redis: Option<&str>) -> Bridge {
        let port = free_port();
        let mut cfg = config(port, &self.trigger);
        if let Some(url) = redis {
            cfg = cfg.replace(&redis_url(), url);
        }
        Bridge::start(&cfg, port)
            .ready(Duration::from_secs(30))
            .await
    }

    /// The end: `bridge` stopped, the queue's keys and the topics deleted.
    async fn finish(self, bridge: Option<Bridge>) {
        cleanup_keys(&mut redis().await, &self.key).await;
        drop(bridge);
        self.capture.delete().await;
        delete_topic(&kafka_brokers(), &self.ingress).await;
    }
}

/// Records `from..from + n` (key `k-I`, body [`body`]), each due `I % 300` ms after it is
/// read if `delayed`.
fn records(from: usize, n: usize, delayed: bool) -> Vec<Out> {
    (from..from + n)
        .map(|i| {
            let headers = match delayed {
                true => vec![("x-delay", (i % 300).to_string())],
                false => vec![],
            };
            (format!("k-{i}"), body(i, 0), headers)
        })
        .collect()
}

/// A bridge config on the shared Redis with sink `kafka` (a short session and poll interval,
/// so that a member that dies is replaced quickly) and `trigger`.
fn config(port: u16, trigger: &str) -> String {
    // A rebalance waits this long at most for a member that died while joining.
    settings(port, "10000").to_string() + trigger
}

/// The settings of [`config`], with `max.poll.interval.ms` at `max_poll_ms`.
fn settings(port: u16, max_poll_ms: &str) -> ConfigToml {
    let props = [
        ("session.timeout.ms", "6000"),
        ("heartbeat.interval.ms", "500"),
        ("max.poll.interval.ms", max_poll_ms),
    ];
    ConfigToml::base(port).kafka_sink("kafka", &kafka_brokers(), &props)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_records_arrive_once_each_none_early_with_key_and_headers() {
    let n = 300;
    let scene = Scene::new("kin", "ingress-kafka").await;
    let (ingress, capture) = (&scene.ingress, &scene.capture);
    let mut bridge = scene.bridge(None).await;
    let mut delays = HashMap::new();
    let records: Vec<Out> = (0..n)
        .map(|i| {
            let delay = if i % 10 == 0 {
                0
            } else {
                1_000 + (i * 7) % 1_001
            };
            delays.insert(format!("v-{i}").into_bytes(), delay as i64);
            let mut headers = vec![("tenant", format!("t-{i}"))];
            if delay > 0 {
                headers.push(("x-delay", delay.to_string()));
            }
            (format!("k-{i}"), format!("v-{i}").into_bytes(), headers)
        })
        .collect();
    let sent = now_ms();
    produce(ingress, records).await;
    bridge
        .expect_arrivals(n, Duration::from_secs(60), || capture.count())
        .await;
    bridge.terminate(Duration::from_secs(20)).await;
    capture.fence().await;
    let got = capture.snapshot();
    assert_eq!(got.len(), n, "each record once");
    for r in &got {
        let i: usize = std::str::from_utf8(&r.body[2..]).unwrap().parse().unwrap();
        let due: i64 = r.header("x-delay-due-ms").unwrap().parse().unwrap();
        assert!(due >= sent + delays[&r.body], "record {i} early");
        assert_eq!(r.key.as_deref(), Some(format!("k-{i}").as_bytes()));
        assert_eq!(r.header("tenant"), Some(format!("t-{i}")));
        assert_eq!(r.header("x-delay"), None);
        let id = r.header("x-delay-id").unwrap();
        assert!(id.starts_with(&format!("{ingress}/")), "{id}");
    }
    scene.finish(Some(bridge)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_delay_is_dead_lettered_and_the_offset_moves_on() {
    let scene = Scene::new("kbad", "ingress-kafka-bad").await;
    let (key, ingress, capture) = (&scene.key, &scene.ingress, &scene.capture);
    let bridge = scene.bridge(None).await;
    let bad = vec![("x-delay", "soon".to_string())];
    produce(ingress, vec![("k".into(), b"bad".to_vec(), bad)]).await;
    produce(ingress, vec![("k".into(), b"good".to_vec(), vec![])]).await;
    bridge
        .expect_arrivals(1, Duration::from_secs(30), || capture.count())
        .await;
    assert_eq!(capture.snapshot()[0].body, b"good");
    let mut r = redis().await;
    let dead_key = delay_bridge::keys::QueueKeys::derive(key).unwrap().dead;
    let (_, dead) = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || zmembers(&mut r, &dead_key).await,
        |m| m.len() == 1,
    )
    .await;
    let why = dead_reason(&mut r, key, &dead[0]).await.unwrap();
    assert_eq!(why["reason"], "bad_delay", "{why}");
    assert!(dead[0].starts_with(&format!("{ingress}/")), "{dead:?}");
    let refused = bridge
        .metric(
            "delay_bridge_ingress_refused_total",
            &[("trigger", "kbad"), ("reason", "bad_delay")],
        )
        .await;
    assert_eq!(refused, 1.0);
    scene.finish(Some(bridge)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_mid_stream_loses_nothing_and_delivers_nothing_twice() {
    let n = 3_000;
    let scene = Scene::new("kreb", "ingress-kafka-rebalance").await;
    let capture = &scene.capture;
    let mut a = scene.bridge(None).await;
    let mut b = None;
    for (step, from) in (0..n).step_by(500).enumerate() {
        produce(&scene.ingress, records(from, 500, true)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        match step {
            // A second member joins: the partitions are spread again.
            1 => b = Some(scene.bridge(None).await),
            // The first leaves: its partitions move to the second.
            3 => {
                let label = [("trigger", "kreb")];
                let took = a
                    .metric("delay_bridge_ingress_messages_total", &label)
                    .await;
                assert!(took > 0.0, "the first member read nothing");
                a.terminate(Duration::from_secs(30)).await;
            }
            _ => {}
        }
    }
    let mut b = b.unwrap();
    b.expect_arrivals(n, Duration::from_secs(90), || capture.tally().len())
        .await;
    let label = [("trigger", "kreb")];
    let took = b
        .metric("delay_bridge_ingress_messages_total", &label)
        .await;
    assert!(took > 0.0, "the second member read nothing\n{}", b.log());
    b.terminate(Duration::from_secs(30)).await;
    capture.fence().await;
    let tally = capture.tally();
    assert_none_lost(&tally, n);
    let twice = tally.values().filter(|&&c| c > 1).count();
    assert_eq!(twice, 0, "records delivered twice");
    println!("kafka ingress rebalance: {n} records, lost 0, delivered twice 0");
    scene.finish(None).await;
}

/// A member joins while another's stores are under way (Redis took them, its answers are
/// held): the group's rebalance waits until they are answered and their offsets committed,
/// so the partitions' next owner does not read those records again (the first copies went
/// out meanwhile: read again, they would go out twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_while_stores_are_unanswered_reads_nothing_again() {
    let scene = Scene::new("kmute", "ingress-kafka-mute").await;
    let capture = &scene.capture;
    let proxy = Proxy::start(shared_redis_addr()).await;
    // Polls may be minutes apart here, and a store may wait that long for its answer: no
    // member is dropped, no store given up, while the answers are held.
    let start = async |redis: &str| {
        let port = free_port();
        let cfg = settings(port, "60000")
            .set_str("redis", "url", redis)
            .set_str("redis", "response_timeout", "60s")
            .to_string()
            + &scene.trigger;
        Bridge::start(&cfg, port)
            .ready(Duration::from_secs(30))
            .await
    };
    let mut a = start(&proxy.url(&redis_url(), "")).await;
    produce(&scene.ingress, records(0, 10, false)).await;
    a.expect_arrivals(10, Duration::from_secs(30), || capture.tally().len())
        .await;

    proxy.set(Mode::Mute);
    produce(&scene.ingress, records(10, 30, false)).await;
    let mut r = redis().await;
    let source = delay_bridge::keys::QueueKeys::derive(&scene.key)
        .unwrap()
        .source;
    let (stored, _) = poll(
        Duration::from_secs(20),
        Duration::from_millis(20),
        async || zcard(&mut r, &source).await,
        |n| *n > 0,
    )
    .await;
    assert!(stored, "no store reached Redis\n{}", a.log());
    // The second member delivers what the first stored, and asks for partitions.
    let mut b = start(&redis_url()).await;
    let label = [("trigger", "kmute")];
    let (read, _) = b
        .wait_scrape(Duration::from_secs(5), |body| {
            metric_value(body, "delay_bridge_ingress_messages_total", &label) > 0.0
        })
        .await;
    assert!(
        !read,
        "the second member read while the first had stores under way"
    );
    proxy.set(Mode::Pass);

    b.expect_arrivals(40, Duration::from_secs(60), || capture.tally().len())
        .await;
    a.terminate(Duration::from_secs(30)).await;
    b.terminate(Duration::from_secs(30)).await;
    capture.fence().await;
    let tally = capture.tally();
    assert_none_lost(&tally, 40);
    let twice: Vec<_> = tally.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "records delivered twice: {twice:?}");
    scene.finish(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_sigkilled_mid_ingest_loses_nothing() {
    let n = 3_000;
    let scene = Scene::new("kkill", "ingress-kafka-kill").await;
    let mut bridge = scene.bridge(None).await;
    for (step, from) in (0..n).step_by(500).enumerate() {
        produce(&scene.ingress, records(from, 500, true)).await;
        if step % 2 == 1 {
            // Killed while it reads: what it stored since the last commit is read again. It
            // has read, so the kill lands once the group gave it its partitions, not while it
            // joins (a member that dies joining can hold the broker's rebalance up for good).
            let label = [("trigger", "kkill")];
            let (reading, _) = bridge
                .wait_scrape(Duration::from_secs(30), |body| {
                    metric_value(body, "delay_bridge_ingress_messages_total", &label) > 0.0
                })
                .await;
            assert!(
                reading,
                "the bridge stored nothing in 30 s\n{}",
                bridge.log()
            );
            bridge.signal(9);
            assert!(bridge.wait_exit(Duration::from_secs(5)).await.is_some());
            bridge = bridge.restart();
            assert!(
                bridge.wait_ready(Duration::from_secs(30)).await,
                "{}",
                bridge.log()
            );
        }
    }
    bridge
        .expect_arrivals(n, Duration::from_secs(120), || scene.capture.tally().len())
        .await;
    let again = bridge
        .trigger_metric("delay_bridge_ingress_duplicates_total", "kkill")
        .await;
    bridge.terminate(Duration::from_secs(30)).await;
    scene.capture.fence().await;
    let tally = scene.capture.tally();
    assert_none_lost(&tally, n);
    let twice = tally.values().filter(|&&c| c > 1).count();
    println!(
        "kafka ingress SIGKILL x3: {n} records, lost 0, delivered twice {twice}, read again and found stored (last run) {again}"
    );
    scene.finish(Some(bridge)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_the_ingress_stops_reading_and_resumes_after() {
    let mut redis_server = common::servers::RedisServer::append_only().await;
    let scene = Scene::new("kredis", "ingress-kafka-redis").await;
    let (ingress, capture) = (&scene.ingress, &scene.capture);
    let bridge = scene.bridge(Some(&redis_server.url())).await;
    produce(ingress, records(0, 100, false)).await;
    bridge
        .expect_arrivals(100, Duration::from_secs(30), || capture.count())
        .await;
    redis_server.shutdown().await;
    produce(ingress, records(100, 100, false)).await;
    bridge
        .expect_readyz_saying(503, "ingress not consuming (Redis", Duration::from_secs(20))
        .await;
    let label = [("trigger", "kredis")];
    assert_eq!(
        bridge
            .metric("delay_bridge_ingress_consuming", &label)
            .await,
        0.0
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(capture.tally().len(), 100, "nothing taken in meanwhile");
    redis_server.restart().await;
    bridge
        .expect_arrivals(200, Duration::from_secs(60), || capture.tally().len())
        .await;
    bridge.expect_readyz(200, Duration::from_secs(20)).await;
    scene.finish(Some(bridge)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_refuses_writes_the_ingress_does_not_read_again() {
    let redis_server = common::servers::RedisServer::start(&[]).await;
    let scene = Scene::new("knoreplicas", "ingress-kafka-noreplicas").await;
    let bridge = scene.bridge(Some(&redis_server.url())).await;
    let mut r = redis_server.conn().await;
    // Reads answered, writes refused (NOREPLICAS), for 10 s.
    config_set(&mut r, "min-replicas-to-write", 1).await;
    produce(&scene.ingress, records(0, 50, false)).await;
    let outage = std::time::Instant::now();
    bridge
        .expect_readyz_saying(503, "ingress not consuming (Redis", Duration::from_secs(20))
        .await;
    // The rest of the outage: the ingress does not join the group again to read.
    let (read_again, sessions) = poll(
        Duration::from_secs(10).saturating_sub(outage.elapsed()),
        Duration::from_millis(200),
        async || bridge.log().matches("ingress: reading").count(),
        |n| *n > 1,
    )
    .await;
    let log = bridge.log();
    assert!(
        !read_again,
        "read again ({sessions} sessions) while Redis refused writes\n{log}"
    );
    config_set(&mut r, "min-replicas-to-write", 0).await;
    bridge
        .expect_arrivals(50, Duration::from_secs(60), || scene.capture.tally().len())
        .await;
    assert_eq!(bridge.log().matches("ingress: reading").count(), 2);
    scene.finish(Some(bridge)).await;
}
