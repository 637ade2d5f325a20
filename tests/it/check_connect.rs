//! `check --connect` against the real services: a missing exchange and dead-letter exchange, a missing Kafka topic, an HTTP URL on a closed port and keyspace notifications that cannot be turned on are all reported in one run (exit 69); a configuration whose destinations all exist exits 0.

use crate::common;

use std::time::Duration;

use common::kafka::create_topic;
use common::servers::RedisServer;
use common::webhook::Webhook;
use common::*;

/// `delay-bridge check --connect` on `config`, off the async threads (the test's own servers
/// answer meanwhile): (exit code, stdout and stderr).
async fn check_connect(config: String) -> (i32, String) {
    tokio::task::spawn_blocking(move || {
        let out = cli(&["check", "--connect"], &config, &[]);
        (out.code, out.text())
    })
    .await
    .unwrap()
}

/// The settings every case shares: sinks `rabbit` (the shared RabbitMQ), `kafka` and `hooks`.
fn settings(port: u16) -> ConfigToml {
    ConfigToml::base(port)
        .kafka_sink("kafka", &kafka_brokers(), &[])
        .http_sink("hooks", &[("timeout", "\"3s\"")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_missing_destination_and_notifications_are_reported_at_once() {
    // A Redis whose user may read its configuration but not change it, notifications off.
    let redis_server = RedisServer::start(&[]).await;
    let mut admin = redis_server.conn().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "bridge",
            "on",
            ">s3cret",
            "~*",
            "&*",
            "+@all",
            "-config|set",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let redis_url = format!("redis://bridge:s3cret@{}/0", redis_server.addr());
    let capture = AmqpCapture::start("k").await;
    let (exchange, dlx, topic) = (unique("no-ex"), unique("no-dlx"), unique("no-topic"));
    let closed = free_port();
    let port = free_port();
    let config = settings(port)
        .set_str("redis", "url", &redis_url)
        .to_string()
        + &trigger(
            "orders",
            &unique("connect-a"),
            "rabbit",
            &format!("exchange = \"{exchange}\"\nrouting_key = \"k\""),
        )
        + &amqp_trigger(
            "refunds",
            &unique("connect-b"),
            &capture,
            &format!("dead_letter_exchange = \"{dlx}\""),
        )
        + &kafka_trigger("events", &unique("connect-c"), "kafka", &topic, "")
        + &trigger(
            "hook",
            &unique("connect-d"),
            "hooks",
            &format!("url = \"http://127.0.0.1:{closed}/hook\""),
        );
    let (code, out) = check_connect(config).await;
    assert_eq!(code, 69, "{out}");
    for expected in [
        format!("problem: trigger orders (sink rabbit): exchange `{exchange}` does not exist (404)"),
        format!(
            "problem: trigger refunds (sink rabbit): dead_letter_exchange `{dlx}` does not exist (404)"
        ),
        format!("problem: trigger events (sink kafka): topic `{topic}` does not exist"),
        format!(
            "problem: trigger hook (sink hooks): url http://127.0.0.1:{closed}/hook cannot be reached"
        ),
        "keyspace notifications are off".to_string(),
        "cannot be turned on (CONFIG SET refused".to_string(),
        "connect: 5 problem(s) found".to_string(),
    ] {
        assert!(out.contains(&expected), "missing `{expected}` in:\n{out}");
    }
    // Nothing was changed: the notifications are still off.
    let flags: (String, String) = redis::cmd("CONFIG")
        .arg(&["GET", "notify-keyspace-events"])
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(flags.1, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_whose_destinations_all_exist_passes() {
    let capture = AmqpCapture::start("k").await;
    let topic = unique("connect-topic");
    create_topic(&kafka_brokers(), &topic, 1).await;
    let hook = Webhook::ok().await;
    let port = free_port();
    let config = settings(port).to_string()
        + &amqp_trigger(
            "orders",
            &unique("connect-ok-a"),
            &capture,
            &format!("dead_letter_exchange = \"{}\"", capture.exchange),
        )
        + &kafka_trigger("events", &unique("connect-ok-b"), "kafka", &topic, "")
        + &trigger(
            "hook",
            &unique("connect-ok-c"),
            "hooks",
            &format!("url = {}", quoted(&hook.url("/hook"))),
        );
    let (code, out) = check_connect(config).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("connect: Redis and every trigger's destination reached"),
        "{out}"
    );
    assert!(!out.contains("problem:"), "{out}");
    assert_eq!(hook.count(), 0, "a connect only, no request");
    tokio::time::timeout(
        Duration::from_secs(10),
        common::kafka::delete_topic(&kafka_brokers(), &topic),
    )
    .await
    .unwrap();
}
