//! A broker or Redis that stays down does not flood the log: a minute of outage writes a
//! few lines that say what is down and how often it failed, then one line when it is back.

use crate::common;

use std::time::Duration;

use common::servers::RedisServer;
use common::*;

/// One minute of outage, as the operator sees it.
const OUTAGE: Duration = Duration::from_secs(60);
/// Most log lines a minute of outage may write, whatever the number of triggers.
const MOST_LINES: usize = 30;

/// Three triggers on `sink`, four workers each: a per-worker or per-trigger message shows.
fn triggers(sink: &str, destination: &str) -> String {
    (0..3)
        .map(|i| {
            let key = format!("{}:{{logs}}", unique("quiet"));
            trigger(&format!("t{i}"), &key, sink, destination)
        })
        .collect()
}

/// A bridge at info level (what operators run) on a config from `ConfigToml::base`.
fn quiet_config(port: u16) -> ConfigToml {
    ConfigToml::base(port).set_str("log", "level", "info")
}

/// The lines written since `from` (a line count of the same log).
fn lines_since(bridge: &Bridge, from: usize) -> Vec<String> {
    bridge
        .log()
        .lines()
        .skip(from)
        .map(str::to_string)
        .collect()
}

fn assert_quiet(what: &str, lines: &[String], mentions: &str) {
    assert!(
        lines.len() < MOST_LINES,
        "{what}: {} lines in a minute\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        lines.iter().any(|l| l.contains(mentions)),
        "{what}: the outage must be logged (`{mentions}`)\n{}",
        lines.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_of_a_down_broker_or_redis_writes_fewer_than_thirty_lines() {
    // Kafka and RabbitMQ at a port nobody listens on, from the start.
    let kafka_port = free_port();
    let kafka_cfg = quiet_config(kafka_port)
        .without("sinks.rabbit")
        .kafka_sink("kafka", &format!("127.0.0.1:{}", free_port()), &[])
        .to_string()
        + &triggers("kafka", "topic = \"nowhere\"");
    let kafka = Bridge::start(&kafka_cfg, kafka_port);
    let amqp_port = free_port();
    let amqp_cfg = quiet_config(amqp_port)
        .amqp_sink("rabbit", &loopback_amqp(free_port()))
        .to_string()
        + &triggers(
            "rabbit",
            "exchange = \"amq.direct\"\nrouting_key = \"nowhere\"",
        );
    let amqp = Bridge::start(&amqp_cfg, amqp_port);

    // A private Redis that goes away once the bridge is claiming from it.
    let mut redis_server = RedisServer::start(&[]).await;
    let redis_port = free_port();
    let redis_cfg = quiet_config(redis_port)
        .set_str("redis", "url", &redis_server.url())
        .to_string()
        + &triggers(
            "rabbit",
            "exchange = \"amq.direct\"\nrouting_key = \"nowhere\"",
        );
    let mut redis_bridge = Bridge::start(&redis_cfg, redis_port)
        .ready(Duration::from_secs(30))
        .await;
    let before_redis = redis_bridge.log().lines().count();
    redis_server.shutdown().await;

    tokio::time::sleep(OUTAGE).await;
    let redis_lines = lines_since(&redis_bridge, before_redis);
    let kafka_lines = lines_since(&kafka, 0);
    let amqp_lines = lines_since(&amqp, 0);
    println!(
        "lines in a minute: kafka {}, rabbitmq {}, redis {}",
        kafka_lines.len(),
        amqp_lines.len(),
        redis_lines.len()
    );
    assert_quiet("Kafka down", &kafka_lines, "Connection refused");
    assert_quiet("RabbitMQ down", &amqp_lines, "RabbitMQ unreachable");
    assert_quiet("Redis down", &redis_lines, "Redis unreachable");

    // Back: one line says so, with how many calls failed meanwhile.
    redis_server.restart().await;
    assert!(
        wait_logged(
            &redis_bridge,
            Duration::from_secs(30),
            "Redis is answering again"
        )
        .await,
        "{}",
        redis_bridge.log()
    );
    for bridge in [&kafka, &amqp, &redis_bridge] {
        bridge.assert_no_panic();
    }
    redis_bridge.assert_alive();
}

/// Most lines 2,000 dead letters may write: one per trigger, reason and second.
const MOST_DEAD_LETTER_LINES: usize = 30;

/// The `count=N` of a log line.
fn count_field(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("count="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_bad_envelopes_write_a_line_per_burst_with_the_reason_and_a_sample() {
    const N: u64 = 2_000;
    let (mut r, capture, key) = amqp_scene("burst", "quiet", "burst").await;
    let port = free_port();
    let config = quiet_config(port).to_string()
        + &amqp_trigger("burst", &key, &capture, "format = \"envelope\"\nbatch = 50");
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(15))
        .await;
    let before = bridge.log().lines().count();
    let now = redis_now(&mut r).await;
    zadd_all(
        &mut r,
        &key,
        (0..N).map(|i| (now, format!("not-an-envelope-{i}"))),
    )
    .await;

    let dead_lines = |bridge: &Bridge| -> Vec<String> {
        lines_since(bridge, before)
            .into_iter()
            .filter(|l| l.contains("dead-lettered"))
            .collect()
    };
    // Every letter is counted in some line, the last burst's too.
    let all_told = wait_until(Duration::from_secs(60), || {
        dead_lines(&bridge)
            .iter()
            .map(|l| count_field(l))
            .sum::<u64>()
            == N
    })
    .await;
    let lines = dead_lines(&bridge);
    println!("lines for {N} dead letters: {}", lines.len());
    assert!(
        all_told,
        "the lines count {} of {N} letters:\n{}",
        lines.iter().map(|l| count_field(l)).sum::<u64>(),
        lines.join("\n")
    );
    assert!(
        lines.len() < MOST_DEAD_LETTER_LINES,
        "{} lines for {N} dead letters:\n{}",
        lines.len(),
        lines.join("\n")
    );
    for line in &lines {
        assert!(
            line.contains("reason=\"bad_envelope\"") && line.contains("sample=not-an-envelope-"),
            "each line names the reason and a sample member: {line}"
        );
        assert!(line.contains("detail="), "and the sample's detail: {line}");
    }
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}
