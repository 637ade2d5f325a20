//! The RabbitMQ ingress under faults: a bridge SIGKILLed ten times while messages stream in loses none; with Redis stopped or over `maxmemory` the ingress stops consuming (the messages wait at the broker, `/readyz` says so) and resumes after; while Redis answers reads but refuses writes it stays stopped, so a quorum queue's `delivery-limit` drops nothing.

use crate::common;

use std::time::{Duration, Instant};

use common::ingress::*;
use common::servers::{RabbitServer, RedisServer};
use common::*;
use lapin::types::AMQPValue;

/// A bridge on `redis_url` whose trigger `name` takes delayed messages in through `broker`
/// and publishes them to `capture`.
fn config(
    port: u16,
    redis_url: &str,
    name: &str,
    key: &str,
    capture: &AmqpCapture,
    broker: &IngressBroker,
) -> String {
    ConfigToml::base(port)
        .set_str("redis", "url", redis_url)
        .to_string()
        + &amqp_trigger(
            name,
            key,
            capture,
            &format!("lease = \"15s\"\n{}", broker.table("")),
        )
}

/// Asserts that the `n` messages just published wait at the broker and that `/readyz` says
/// the ingress does not consume because of Redis.
async fn expect_not_consuming(broker: &IngressBroker, n: u32, bridge: &Bridge) {
    broker
        .expect_depth(n, Duration::from_secs(30), bridge)
        .await;
    let why = "ingress not consuming (Redis";
    bridge
        .expect_readyz_saying(503, why, Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_sigkilled_ten_times_while_messages_stream_in_loses_none() {
    let n = 20_000;
    let capture = AmqpCapture::start("k").await;
    let broker = std::sync::Arc::new(IngressBroker::new().await);
    let key = unique("ingress-kill");
    let port = free_port();
    let mut bridge = Bridge::start(
        &config(port, &redis_url(), "kill", &key, &capture, &broker),
        port,
    )
    .ready(Duration::from_secs(30))
    .await;
    // Producers stream the messages in batches over about 20 s, each due 0-500 ms after it
    // is taken in.
    let producer = {
        let broker = broker.clone();
        tokio::spawn(async move {
            for start in (0..n).step_by(200) {
                let batch = (start..start + 200).map(|i| {
                    (
                        "k".to_string(),
                        body(i, 0),
                        delayed(AMQPValue::LongInt((i % 501) as i32), &[]),
                    )
                });
                broker.publish_many(batch).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let (mut kills, mut streaming) = (0, 0);
    while kills < 10 {
        tokio::time::sleep(Duration::from_millis(400 + 61 * kills)).await;
        streaming += usize::from(!producer.is_finished());
        bridge.signal(9);
        assert!(bridge.wait_exit(Duration::from_secs(5)).await.is_some());
        kills += 1;
        bridge = bridge.restart();
        assert!(
            bridge.wait_ready(Duration::from_secs(30)).await,
            "{}",
            bridge.log()
        );
    }
    assert!(
        streaming >= 8,
        "only {streaming} of the kills landed while messages streamed in"
    );
    producer.await.unwrap();
    let started = Instant::now();
    bridge
        .expect_arrivals(n, Duration::from_secs(180), || capture.tally().len())
        .await;
    let seen = capture.tally();
    let duplicates = assert_none_lost(&seen, n);
    println!(
        "ingress SIGKILL x{kills}: {n} messages, lost 0, delivered twice {duplicates}, {streaming} kills while streaming, drained {:?} after the last publish",
        started.elapsed()
    );
    let mut r = redis().await;
    wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    assert_eq!(broker.depth().await, Some(0));
    broker.delete().await;
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_or_full_the_ingress_stops_consuming_and_resumes_after() {
    let mut redis_server = RedisServer::append_only().await;
    let capture = AmqpCapture::start("r").await;
    let broker = IngressBroker::new().await;
    let key = unique("ingress-redis");
    let port = free_port();
    let bridge = Bridge::start(
        &config(port, &redis_server.url(), "redis", &key, &capture, &broker),
        port,
    )
    .ready(Duration::from_secs(30))
    .await;
    let publish = |from: usize, count: usize| {
        (from..from + count).map(|i| {
            (
                "r".to_string(),
                body(i, 0),
                delayed(AMQPValue::LongInt(0), &[]),
            )
        })
    };
    broker.publish_many(publish(0, 100)).await;
    bridge
        .expect_arrivals(100, Duration::from_secs(20), || capture.count())
        .await;

    // Redis stopped: the messages stay at the broker, unconsumed.
    redis_server.shutdown().await;
    broker.publish_many(publish(100, 200)).await;
    expect_not_consuming(&broker, 200, &bridge).await;
    assert_eq!(
        bridge
            .metric("delay_bridge_ingress_consuming", &[("trigger", "redis")])
            .await,
        0.0
    );
    assert_eq!(capture.count(), 100);
    redis_server.restart().await;
    bridge
        .expect_arrivals(300, Duration::from_secs(30), || capture.tally().len())
        .await;
    bridge.expect_readyz(200, Duration::from_secs(10)).await;

    // Over maxmemory: Redis answers but refuses writes; the same.
    let mut r = redis_server.conn().await;
    config_set(&mut r, "maxmemory", "1").await;
    broker.publish_many(publish(300, 50)).await;
    expect_not_consuming(&broker, 50, &bridge).await;
    config_set(&mut r, "maxmemory", "0").await;
    bridge
        .expect_arrivals(350, Duration::from_secs(30), || capture.tally().len())
        .await;
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
    assert!(
        capture.tally().values().all(|&c| c == 1),
        "each message once"
    );
    assert!(bridge.log().contains("consuming stops"), "{}", bridge.log());
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_refuses_writes_the_ingress_hands_each_delivery_back_once() {
    let redis_server = RedisServer::start(&[]).await;
    let rabbit = RabbitServer::start().await;
    // A message handed back to the quorum queue more than three times is dropped.
    rabbit
        .ctl(&[
            "set_policy",
            "delivery-limit",
            "^ingress-q",
            r#"{"delivery-limit":3}"#,
            "--apply-to",
            "queues",
        ])
        .await;
    let broker = IngressBroker::on(&rabbit.url()).await;
    let key = unique("ingress-noreplicas");
    let port = free_port();
    // Due in an hour: what reaches Redis stays in the source set, to be counted.
    let cfg = ConfigToml::base(port)
        .set_str("redis", "url", &redis_server.url())
        .amqp_sink("rabbit", &rabbit.url())
        .to_string()
        + &trigger(
            "limited",
            &key,
            "rabbit",
            &format!(
                "exchange = \"amq.direct\"\nrouting_key = \"nowhere\"\n{}",
                broker.table("queue_type = \"quorum\"\n")
            ),
        );
    let bridge = Bridge::start(&cfg, port)
        .ready(Duration::from_secs(30))
        .await;
    let mut r = redis_server.conn().await;
    // Reads answered, writes refused (NOREPLICAS), for 20 s.
    config_set(&mut r, "min-replicas-to-write", 1).await;
    let n = 20;
    broker
        .publish_many((0..n).map(|i| {
            let delay = AMQPValue::LongInt(3_600_000);
            ("k".to_string(), body(i, 0), delayed(delay, &[]))
        }))
        .await;
    let outage = Instant::now();
    // The deliveries go back to the broker.
    broker
        .expect_depth(n as u32, Duration::from_secs(15), &bridge)
        .await;
    // The rest of the outage: the ingress does not take them again.
    let (taken, depth) = poll(
        Duration::from_secs(20).saturating_sub(outage.elapsed()),
        Duration::from_millis(200),
        async || broker.depth().await,
        |d| *d != Some(n as u32),
    )
    .await;
    assert!(
        !taken,
        "consuming resumed while Redis refused writes: depth {depth:?}\n{}",
        bridge.log()
    );
    config_set(&mut r, "min-replicas-to-write", 0).await;
    let (stored, count) = poll(
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || zcard(&mut r, &key).await,
        |c| *c == n as i64,
    )
    .await;
    assert!(
        stored,
        "{count} of {n} stored after a 20 s outage (the rest dropped by the delivery limit?)\n{}",
        bridge.log()
    );
    assert_eq!(broker.depth().await, Some(0));
    let log = bridge.log();
    assert!(log.contains("consuming stops"), "{log}");
    let sessions = log.matches("ingress: consuming").count();
    assert_eq!(sessions, 2, "once at start, once after the outage\n{log}");
}
