//! Dead letters forwarded to the broker: reason headers, deletion only after the broker's
//! confirmation, letters the broker refuses kept in Redis, and two bridges sharing the work.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use delay_bridge::keys::QueueKeys;
use lapin::types::AMQPValue;
use redis::AsyncCommands;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(20);

/// A header of a received message as text (strings) or a number.
fn header(m: &Received, name: &str) -> Option<String> {
    let headers = m.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// The forwarding leases: member -> score as Redis prints it.
async fn leases(r: &mut Conn, key: &str) -> HashMap<Vec<u8>, String> {
    zscored(r, QueueKeys::derive(key).unwrap().dead_inflight).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_reach_the_broker_with_their_reason_and_leave_redis_only_then() {
    let mut r = redis().await;
    let main = AmqpCapture::start("ok").await;
    let dead = AmqpCapture::start("dead").await;
    let key = format!("{}:{{dlx}}", unique("delay"));
    let keys = QueueKeys::derive(&key).unwrap();
    let port = free_port();
    // Dead letters go first to a routing key nothing is bound to: the broker returns them.
    let trigger = |routing_key: &str| {
        amqp_trigger(
            "dlx",
            &key,
            &main,
            &format!(
                "routing_key_pointer = \"/type\"\nmax_message_bytes = 300\nlease = \"3s\"\n\
                 publish_timeout = \"2s\"\ndead_letter_exchange = \"{}\"\n\
                 dead_letter_routing_key = \"{routing_key}\"\n",
                dead.exchange
            ),
        )
    };
    let config = base_config(port) + &trigger("later");
    let (code, out) = check(&config);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("dead_letters_to="), "{out}");
    let bridge = Bridge::start(&config, port).ready(READY).await;

    let good: Vec<String> = (0..30)
        .map(|i| format!(r#"{{"type":"ok","i":{i}}}"#))
        .collect();
    let bad: Vec<String> = (0..30).map(|i| format!("not json {i}")).collect();
    let huge = format!(r#"{{"type":"ok","pad":"{}"}}"#, "x".repeat(400));
    schedule_now(&mut r, &key, good.iter().chain(&bad).chain([&huge])).await;
    main.expect_arrivals(good.len(), Duration::from_secs(15), &bridge)
        .await;

    // Unroutable at the dead-letter exchange: nothing is confirmed, so all stay in Redis.
    let (returned, scraped) = bridge
        .wait_scrape(Duration::from_secs(15), |m| {
            forward_failures(m, "unroutable") >= bad.len() as f64
                && forward_failures(m, "too_large") == 1.0
        })
        .await;
    assert!(
        returned,
        "the broker returned the dead letters\n{}",
        bridge.log()
    );
    assert_eq!(letters_forwarded(&scraped), 0.0);
    assert_eq!(zcard(&mut r, &keys.dead).await, bad.len() as i64 + 1);
    assert_eq!(dead.count(), 0);
    expect_refused_letter_kept(&mut r, &key, &huge, &config).await;

    // Bind the routing key: the letters go after their lease expires, and leave Redis.
    dead.bind(&dead.exchange, "later").await;
    dead.expect_arrivals(bad.len(), Duration::from_secs(20), &bridge)
        .await;
    let (done, _) = poll(
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || zcard(&mut r, &keys.dead).await,
        |n| *n == 1,
    )
    .await;
    assert!(done, "only the refused letter stays a dead letter");
    assert_each_forwarded_once(&dead, &bad);
    let reasons: HashMap<Vec<u8>, String> = r.hgetall(&keys.dead_reasons).await.unwrap();
    assert_eq!(
        reasons.keys().collect::<Vec<_>>(),
        [&huge.as_bytes().to_vec()],
        "reasons of forwarded letters are gone"
    );
    let scraped = bridge.scrape().await;
    assert_eq!(letters_forwarded(&scraped), bad.len() as f64);
    assert_eq!(forward_failures(&scraped, "too_large"), 1.0);
    assert!(bridge
        .log()
        .contains("the broker refuses these dead letters"));

    expect_requeued_refused_again(&bridge, &huge, &config).await;
    assert_eq!(zcard(&mut r, &keys.dead).await, 1);
    assert_eq!(dead.count(), bad.len(), "nothing else was forwarded");
    finish(bridge, &mut r, &key).await;
}

/// A requeue gives the refused letter `huge` back to the trigger, where it is too large
/// again: dead-lettered and refused a second time, never lost.
async fn expect_requeued_refused_again(bridge: &Bridge, huge: &str, config: &str) {
    let requeued = cli(
        &["dead-letter", "requeue", "-t", "dlx", "--member", huge],
        config,
        &[],
    );
    assert_eq!(requeued.code, 0, "{}", requeued.text());
    let (again, _) = bridge
        .wait_scrape(Duration::from_secs(15), |m| {
            forward_failures(m, "too_large") == 2.0
        })
        .await;
    assert!(
        again,
        "the requeued letter was refused again\n{}",
        bridge.log()
    );
}

/// `delay_bridge_dead_letter_forward_failures_total` of trigger `dlx` for `reason`.
fn forward_failures(metrics: &str, reason: &str) -> f64 {
    metric_value(
        metrics,
        "delay_bridge_dead_letter_forward_failures_total",
        &[("trigger", "dlx"), ("reason", reason)],
    )
}

/// `delay_bridge_dead_letters_forwarded_total` of trigger `dlx`.
fn letters_forwarded(metrics: &str) -> f64 {
    metric_value(
        metrics,
        "delay_bridge_dead_letters_forwarded_total",
        &[("trigger", "dlx")],
    )
}

/// Every letter `dead` received is a `bad_payload` letter of trigger `dlx`, and each of `bad`
/// arrived exactly once.
fn assert_each_forwarded_once(dead: &AmqpCapture, bad: &[String]) {
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    for m in &dead.snapshot() {
        *seen.entry(m.body.clone()).or_default() += 1;
        assert_bad_payload_letter(m);
    }
    for b in bad {
        assert_eq!(seen.get(b.as_bytes()), Some(&1), "{b} forwarded once");
    }
}

/// A dead letter of trigger `dlx` as forwarded: its reason (`bad_payload`), attempts, detail
/// and time in headers, persistent, on the routing key `later`.
fn assert_bad_payload_letter(m: &Received) {
    assert_eq!(
        header(m, "x-delay-dead-reason").as_deref(),
        Some("bad_payload")
    );
    assert_eq!(header(m, "x-delay-dead-attempts").as_deref(), Some("1"));
    assert!(header(m, "x-delay-dead-detail").is_some(), "{m:?}");
    assert!(header(m, "x-delay-dead-at-ms").is_some(), "{m:?}");
    assert_eq!(m.trigger.as_deref(), Some("dlx"));
    assert_eq!(m.routing_key, "later");
    assert_eq!(m.delivery_mode, Some(2), "persistent");
}

/// The oversized letter `huge` on `key` is never sent: kept with the dead-letter score +inf
/// (claims never look at it again) and no lease; its time stays in its reason.
async fn expect_refused_letter_kept(r: &mut Conn, key: &str, huge: &str, config: &str) {
    let keys = QueueKeys::derive(key).unwrap();
    let score: Option<String> = r.zscore(&keys.dead, huge).await.unwrap();
    assert_eq!(score.as_deref(), Some("inf"));
    let held = leases(r, key).await;
    assert!(!held.contains_key(huge.as_bytes()), "{held:?}");
    let listed = cli(&["dead-letter", "list", "-t", "dlx"], config, &[]);
    assert_eq!(listed.code, 0, "{}", listed.text());
    assert!(
        !listed.stdout.contains(&i64::MAX.to_string()),
        "the refused letter's time comes from its reason, not +inf: {}",
        listed.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_forward_each_dead_letter_once_with_its_body() {
    let mut r = redis().await;
    let main = AmqpCapture::start("ok").await;
    let dead = AmqpCapture::start("dead").await;
    let key = format!("{}:{{dlx2}}", unique("delay"));
    let keys = QueueKeys::derive(&key).unwrap();
    // 2,000 dead letters in hash payload mode, made the way the settle script leaves them.
    let n = 2000;
    let now = redis_now(&mut r).await;
    let mut pipe = redis::pipe();
    for i in 0..n {
        let id = format!("id-{i}");
        let reason = format!(r#"{{"reason":"nack","attempts":{},"at":{now}}}"#, 1 + i % 3);
        pipe.zadd(&keys.dead, &id, now - i as i64)
            .hset(&keys.dead_reasons, &id, reason)
            .hset(&keys.bodies, &id, format!("body of {i}"))
            .ignore();
    }
    // One id is also scheduled again: its (new) body must stay.
    pipe.zadd(&keys.source, "id-7", "+inf").ignore();
    let _: () = pipe.query_async(&mut r).await.unwrap();

    let config = |port| {
        base_config(port)
            + &amqp_trigger(
                "dlx2",
                &key,
                &main,
                &format!(
                    "payload = \"hash\"\ndead_letter_exchange = \"{}\"\n\
                     dead_letter_routing_key = \"dead\"\n",
                    dead.exchange
                ),
            )
    };
    let (p1, p2) = (free_port(), free_port());
    let a = Bridge::start(&config(p1), p1);
    let b = Bridge::start(&config(p2), p2);
    let (a, b) = (a.ready(READY).await, b.ready(READY).await);
    a.expect_arrivals(n, Duration::from_secs(60), || dead.count())
        .await;
    let (done, left) = poll(
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            (
                zcard(&mut r, &keys.dead).await,
                hlen(&mut r, &keys.bodies).await,
            )
        },
        |sizes| *sizes == (0, 1),
    )
    .await;
    assert!(done, "dead letters and their bodies left Redis: {left:?}");
    let tally = dead.tally();
    for i in 0..n {
        let body = format!("body of {i}");
        assert_eq!(
            tally.get(body.as_bytes()),
            Some(&1),
            "{body} forwarded once"
        );
    }
    let got = dead.snapshot();
    let m = got.iter().find(|m| m.body == b"body of 5").unwrap();
    assert_eq!(header(m, "x-delay-dead-attempts").as_deref(), Some("3"));
    assert_eq!(header(m, "x-delay-dead-reason").as_deref(), Some("nack"));
    let forwarded = |body: &str| {
        metric_value(
            body,
            "delay_bridge_dead_letters_forwarded_total",
            &[("trigger", "dlx2")],
        )
    };
    let (sa, sb) = (a.scrape().await, b.scrape().await);
    assert_eq!(forwarded(&sa) + forwarded(&sb), n as f64);
    println!(
        "forwarded by the two bridges: {} and {}",
        forwarded(&sa),
        forwarded(&sb)
    );
    assert_eq!(main.count(), 0);
    drop((a, b));
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_hash_letters_carry_their_id_and_a_missing_body_stays_requeueable() {
    let mut r = redis().await;
    let main = AmqpCapture::start("ok").await;
    let dead = AmqpCapture::start("dead").await;
    let key = format!("{}:{{dlxid}}", unique("delay"));
    let keys = QueueKeys::derive(&key).unwrap();
    let port = free_port();
    let options = format!(
        "payload = \"hash\"\nmax_attempts = 1\ndead_letter_exchange = \"{}\"\n\
                 dead_letter_routing_key = \"dead\"\n",
        dead.exchange
    );
    let config = base_config(port) + &amqp_trigger("dlxid", &key, &main, &options);
    let bridge = Bridge::start(&config, port).ready(READY).await;
    // An id scheduled without its body.
    let now = redis_now(&mut r).await;
    let _: () = r.zadd(&keys.source, "invoice-4711", now).await.unwrap();
    dead.expect_arrivals(1, Duration::from_secs(20), &bridge)
        .await;
    let got = dead.snapshot();
    let letter = &got[0];
    assert_eq!(letter.body, b"", "no body to forward");
    assert_eq!(
        header(letter, "x-delay-dead-id").as_deref(),
        Some("invoice-4711")
    );
    assert_eq!(
        header(letter, "x-delay-dead-key").as_deref(),
        Some(key.as_str())
    );
    assert_eq!(
        header(letter, "x-delay-dead-reason").as_deref(),
        Some("missing_body")
    );
    // Forwarded, yet kept: the remedy (its body) can only be given in Redis. The settle
    // follows the broker's confirmation, so it may land just after the consumer has it.
    let (kept, score) = poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || -> Option<String> {
            redis::cmd("ZSCORE")
                .arg(&keys.dead)
                .arg("invoice-4711")
                .query_async(&mut r)
                .await
                .unwrap()
        },
        |score| score.as_deref() == Some("inf"),
    )
    .await;
    assert!(
        kept,
        "kept with the score +inf, never forwarded again: {score:?}"
    );
    let forwarded = bridge
        .trigger_metric("delay_bridge_dead_letters_forwarded_total", "dlxid")
        .await;
    assert_eq!(forwarded, 1.0);
    // The remedy: the body, then a requeue; the message reaches its consumers.
    let _: () = r
        .hset(&keys.bodies, "invoice-4711", "the invoice")
        .await
        .unwrap();
    let out = cli(
        &[
            "dead-letter",
            "requeue",
            "-t",
            "dlxid",
            "--member",
            "invoice-4711",
        ],
        &config,
        &[],
    );
    assert_eq!(out.code, 0, "requeue: {}", out.text());
    main.expect_arrivals(1, Duration::from_secs(20), &bridge)
        .await;
    assert_eq!(main.snapshot()[0].body, b"the invoice");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(dead.count(), 1, "forwarded once");
    assert_eq!(zcard(&mut r, &keys.dead).await, 0);
    finish(bridge, &mut r, &key).await;
}
