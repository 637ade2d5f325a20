//! End-to-end forwarding to RabbitMQ: due times, cancel/reschedule, unroutable messages.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_members_arrive_once_never_early_with_headers_and_exact_bytes() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("due.rk").await;
    let key = format!("{}:{{orders}}", unique("delay"));
    let port = free_port();
    let mut bridge = Bridge::start(
        &(base_config(port) + &amqp_trigger("orders", &key, &capture, "workers = 3\nbatch = 4")),
        port,
    );
    assert!(
        bridge.wait_ready(Duration::from_secs(15)).await,
        "bridge not ready:\n{}",
        bridge.log()
    );

    let now = redis_now(&mut r).await;
    let mut expected: HashMap<Vec<u8>, i64> = HashMap::new();
    for i in 0..40i64 {
        let mut body = format!("{{\"order\":{i}}}").into_bytes();
        if i % 5 == 0 {
            body = vec![0xff, 0x00, 0xfe, b'\n', i as u8, 0x80];
        }
        let due = now + 200 + i * 70;
        expected.insert(body.clone(), due);
        let _: i64 = redis::cmd("ZADD")
            .arg(&key)
            .arg(due)
            .arg(&body)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    // One already overdue: "a score in the past means now".
    let past = b"from the past".to_vec();
    expected.insert(past.clone(), now - 60_000);
    let _: i64 = redis::cmd("ZADD")
        .arg(&key)
        .arg(now - 60_000)
        .arg(&past)
        .query_async(&mut r)
        .await
        .unwrap();

    assert!(
        wait_until(Duration::from_secs(20), || capture.count()
            >= expected.len())
        .await,
        "only {} of {} arrived\n{}",
        capture.count(),
        expected.len(),
        bridge.log()
    );
    // Give a duplicate the chance to show up before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = capture.snapshot();
    assert_eq!(got.len(), expected.len(), "each message exactly once");
    for m in &got {
        let due = expected
            .get(&m.body)
            .unwrap_or_else(|| panic!("unexpected body {:?}", m.body));
        assert_eq!(m.due_ms, Some(*due), "x-delay-due-ms header");
        assert!(
            m.at_ms >= *due,
            "arrived {} ms before its due time",
            due - m.at_ms
        );
        assert_eq!(m.attempt, Some(1));
        assert_eq!(m.trigger.as_deref(), Some("orders"));
        assert_eq!(m.routing_key, "due.rk");
        assert_eq!(m.delivery_mode, Some(2), "persistent");
        assert_eq!(m.message_id.as_deref().map(str::len), Some(16));
    }
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let (left, inflight): (i64, i64) = redis::pipe()
        .zcard(&keys.source)
        .zcard(&keys.inflight)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        (left, inflight),
        (0, 0),
        "forwarded members are removed from Redis"
    );
    bridge.signal(15);
    assert_eq!(bridge.wait_exit(Duration::from_secs(15)).await, Some(0));
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reschedule_are_honoured() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("cr").await;
    let key = unique("delay-plain");
    let port = free_port();
    let mut bridge = Bridge::start(
        &(base_config(port) + &amqp_trigger("cr", &key, &capture, "")),
        port,
    );
    assert!(
        bridge.wait_ready(Duration::from_secs(15)).await,
        "{}",
        bridge.log()
    );

    let now = redis_now(&mut r).await;
    let zadd = |due: i64, m: &'static str| redis::cmd("ZADD").arg(&key).arg(due).arg(m).to_owned();
    let _: () = redis::pipe()
        .add_command(zadd(now + 1500, "cancelled"))
        .add_command(zadd(now + 1000, "later"))
        .add_command(zadd(now + 6000, "sooner"))
        .add_command(zadd(now + 1600, "marker"))
        .query_async(&mut r)
        .await
        .unwrap();
    // Cancel one, push one back, pull one forward.
    let _: () = redis::pipe()
        .cmd("ZREM")
        .arg(&key)
        .arg("cancelled")
        .add_command(zadd(now + 2500, "later"))
        .add_command(zadd(now + 300, "sooner"))
        .query_async(&mut r)
        .await
        .unwrap();

    assert!(
        wait_until(Duration::from_secs(15), || capture.count() >= 3).await,
        "{}",
        bridge.log()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = capture.snapshot();
    let bodies: Vec<&[u8]> = got.iter().map(|m| m.body.as_slice()).collect();
    assert_eq!(
        bodies,
        vec![&b"sooner"[..], b"marker", b"later"],
        "order follows the rescheduled due times"
    );
    let sooner = &got[0];
    assert!(
        sooner.at_ms < now + 6000,
        "the earlier reschedule was honoured"
    );
    assert!(
        got[2].at_ms >= now + 2500,
        "the later reschedule was honoured"
    );
    assert_eq!(got[2].due_ms, Some(now + 2500));
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_messages_are_retried_then_dead_lettered_with_reason() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("bound").await;
    let key = format!("{}:{{u}}", unique("delay"));
    let port = free_port();
    // Publish with a routing key no queue is bound to: the broker returns the message.
    let trigger = format!(
        r#"
[[triggers]]
name = "unroutable"
key = "{key}"
sink = "rabbit"
exchange = "{ex}"
routing_key = "nobody-listens"
max_attempts = 3
backoff_initial = "100ms"
backoff_max = "200ms"
"#,
        ex = capture.exchange
    );
    let mut bridge = Bridge::start(&(base_config(port) + &trigger), port);
    assert!(
        bridge.wait_ready(Duration::from_secs(15)).await,
        "{}",
        bridge.log()
    );
    let now = redis_now(&mut r).await;
    let _: () = redis::cmd("ZADD")
        .arg(&key)
        .arg(now)
        .arg("lost-letter-1")
        .arg(now)
        .arg("lost-letter-2")
        .query_async(&mut r)
        .await
        .unwrap();
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let mut dead = 0i64;
    for _ in 0..200 {
        dead = redis::cmd("ZCARD")
            .arg(&keys.dead)
            .query_async(&mut r)
            .await
            .unwrap();
        if dead == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dead, 2, "{}", bridge.log());
    let reason: String = redis::cmd("HGET")
        .arg(&keys.dead_reasons)
        .arg("lost-letter-1")
        .query_async(&mut r)
        .await
        .unwrap();
    let reason: serde_json::Value = serde_json::from_str(&reason).unwrap();
    assert_eq!(reason["reason"], "unroutable");
    assert_eq!(reason["attempts"], 3);
    let (left, inflight, attempts): (i64, i64, i64) = redis::pipe()
        .zcard(&keys.source)
        .zcard(&keys.inflight)
        .hlen(&keys.attempts)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        (left, inflight, attempts),
        (0, 0, 0),
        "nothing lost, nothing left behind"
    );
    let labels = [("trigger", "unroutable"), ("reason", "unroutable")];
    assert!(
        wait_until(Duration::from_secs(5), || true).await
            && bridge
                .metric("delay_bridge_messages_retried_total", &labels)
                .await
                == 4.0,
        "two retries per message"
    );
    assert_eq!(
        bridge
            .metric("delay_bridge_messages_dead_lettered_total", &labels)
            .await,
        2.0
    );
    assert_eq!(capture.count(), 0);

    // Replay: requeue through the CLI, now routable, and it arrives.
    drop(bridge);
    let fixed = base_config(port) + &amqp_trigger("unroutable", &key, &capture, "");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fixed.toml");
    std::fs::write(&path, &fixed).unwrap();
    let out = std::process::Command::new(binary())
        .args(["dead-letter", "list", "-t", "unroutable", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("lost-letter-1") && listed.contains("unroutable"),
        "{listed}"
    );
    let out = std::process::Command::new(binary())
        .args(["dead-letter", "requeue", "-t", "unroutable", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("requeued 2"),
        "{out:?}"
    );
    let bridge = Bridge::start(&fixed, port);
    assert!(
        wait_until(Duration::from_secs(15), || capture.count() >= 2).await,
        "{}",
        bridge.log()
    );
    drop(bridge);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_keeps_messages_in_redis_until_it_is_declared() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("noex").await;
    let key = format!("{}:{{noex}}", unique("delay"));
    let port = free_port();
    let exchange = unique("declared-later");
    let trigger = format!(
        "\n[[triggers]]\nname = \"noex\"\nkey = \"{key}\"\nsink = \"rabbit\"\nexchange = \"{exchange}\"\nrouting_key = \"noex\"\n"
    );
    let mut bridge = Bridge::start(&(base_config(port) + &trigger), port);
    assert!(
        bridge.wait_ready(Duration::from_secs(15)).await,
        "{}",
        bridge.log()
    );
    let now = redis_now(&mut r).await;
    let _: i64 = redis::cmd("ZADD")
        .arg(&key)
        .arg(now)
        .arg("waiting")
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || bridge
            .log()
            .contains("does not exist"))
        .await,
        "the missing exchange is reported: {}",
        bridge.log()
    );
    let keys = delay_bridge::keys::QueueKeys::derive(&key).unwrap();
    let (left, inflight, attempts): (i64, i64, i64) = redis::pipe()
        .zcard(&keys.source)
        .zcard(&keys.inflight)
        .hlen(&keys.attempts)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        (left, inflight, attempts),
        (1, 0, 0),
        "not claimed, not counted as an attempt"
    );

    // The operator declares the exchange: the message goes out.
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        &exchange,
        lapin::ExchangeKind::Direct,
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    capture.bind(&exchange, "noex").await;
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() == 1).await,
        "{}",
        bridge.log()
    );
    ch.exchange_delete(&exchange, Default::default())
        .await
        .unwrap();
    cleanup_keys(&mut r, &key).await;
}
