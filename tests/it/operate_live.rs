//! The operator's tools against a running bridge and the real RabbitMQ: `show` finds a
//! message by the id its consumer saw, past the first thousand; a `-inf` member is counted
//! apart from lateness and `consume` says "now" for it; `health` prints `/readyz`'s reasons.

use crate::common;

use std::time::Duration;

use common::*;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_finds_a_message_by_the_id_its_consumer_saw() {
    let (mut r, capture, key) = amqp_scene("ids", "ids", "ids").await;
    let port = free_port();
    let config = base_config(port) + &amqp_trigger("ids", &key, &capture, "");
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    schedule_now(&mut r, &key, ["order-1500"]).await;
    bridge
        .expect_arrivals(1, Duration::from_secs(10), || capture.count())
        .await;
    let id = capture.snapshot()[0]
        .message_id
        .clone()
        .expect("a message id");
    drop(bridge);

    // The producer schedules the same member again, behind 1,500 others.
    let now = redis_now(&mut r).await;
    schedule_crowd(&mut r, &key, "order", 1500, now + 3_600_000).await;
    zadd(&mut r, &key, now + 7_200_000, "order-1500").await;
    let out = cli(&["show", "-t", "ids", &id], &config, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("member: order-1500"), "{}", out.stdout);
    assert!(
        out.stdout.contains(&format!("consumer id: {id}")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("scheduled: due"), "{}", out.stdout);
    let out = cli(&["show", "-t", "ids", "--json", &id], &config, &[]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["found_by"], "consumer_id", "{v}");
    // By member, the same message and id.
    let out = cli(&["show", "-t", "ids", "order-1500"], &config, &[]);
    assert!(
        out.stdout.contains(&format!("consumer id: {id}")),
        "{}",
        out.stdout
    );
    // An id of nothing here.
    let out = cli(&["show", "-t", "ids", "0123456789abcdef"], &config, &[]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stdout.contains("no member and no consumer id"),
        "{}",
        out.stdout
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_due_at_minus_infinity_is_counted_apart_and_consumed_as_now() {
    let mut r = redis().await;
    let key = format!("{}:{{now}}", unique("now"));
    // A queue of its own that `consume` can read (not exclusive to a test connection).
    let amqp = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let ch = amqp.create_channel().await.unwrap();
    let (exchange, queue) = (unique("ex-now"), unique("q-now"));
    let auto_delete = ExchangeDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    declare_bound_queue(
        &ch,
        (&exchange, ExchangeKind::Direct, auto_delete),
        (&queue, QueueDeclareOptions::default()),
        "now",
    )
    .await;
    let port = free_port();
    let lines = format!("exchange = \"{exchange}\"\nrouting_key = \"now\"\n");
    let config = base_config(port) + &trigger("now", &key, "rabbit", &lines);
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    zadd(&mut r, &key, "-inf", "at-once").await;
    schedule_now(&mut r, &key, ["on-time"]).await;
    let labels = [("trigger", "now")];
    let (moved, body) = bridge
        .wait_scrape(Duration::from_secs(10), |body| {
            metric_value(body, "delay_bridge_messages_forwarded_total", &labels) == 2.0
        })
        .await;
    assert!(moved, "{body}");
    let immediate = metric_value(&body, "delay_bridge_messages_immediate_total", &labels);
    let observed = metric_value(&body, "delay_bridge_lateness_seconds_count", &labels);
    assert_eq!((immediate, observed), (1.0, 1.0), "{body}");
    let sum = metric_value(&body, "delay_bridge_lateness_seconds_sum", &labels);
    assert!(sum < 60.0, "no day of lateness for `-inf`: {sum}");

    let url = amqp_url();
    let out = std::process::Command::new(binary())
        .args(["consume", "--url", &url, "--queue", &queue])
        .args(["--count", "2", "--idle", "10s"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let text = stdout.clone() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !text.contains("panicked"), "{text}");
    let out = Output {
        code: 0,
        stdout,
        stderr: String::new(),
    };
    let at_once = out.stdout.lines().find(|l| l.contains("at-once")).unwrap();
    assert!(at_once.starts_with("late=now\tid="), "{}", out.stdout);
    let on_time = out.stdout.lines().find(|l| l.contains("on-time")).unwrap();
    assert!(
        on_time.starts_with("late=") && on_time.contains("ms\tid="),
        "{}",
        out.stdout
    );
    let _ = ch
        .queue_delete(&queue, Default::default())
        .await
        .map(|_| ());
    finish(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_prints_the_reasons_readyz_gives() {
    let port = free_port();
    let dead = free_port();
    // A sink nobody listens on: alive, not ready, and /readyz says why.
    let config = ConfigToml::base(port)
        .amqp_sink("rabbit", &loopback_amqp(dead))
        .to_string()
        + &trigger(
            "h",
            &format!("{}:{{h}}", unique("health")),
            "rabbit",
            "exchange = \"x\"\n",
        );
    let bridge = Bridge::start(&config, port);
    assert!(bridge.wait_readyz(503, Duration::from_secs(20)).await);
    let out = cli(&["health"], &config, &[]);
    assert_eq!(out.code, 0, "alive: {}", out.text());
    assert!(out.stdout.contains("healthy"), "{}", out.stdout);
    assert!(out.stdout.contains("not ready"), "{}", out.stdout);
    assert!(
        out.stdout.contains("rabbit"),
        "the reason names the sink: {}",
        out.stdout
    );
    let out = cli(&["health", "--ready"], &config, &[]);
    assert_eq!(out.code, 1, "{}", out.text());
    drop(bridge);
}
