//! Hash payload mode: ids in the sorted set, bodies in `K:bodies`; scheduling, cancelling and
//! rescheduling by id, re-adds in flight, missing and oversized bodies, dead letters with
//! their bodies, the claim's byte budget, and a SIGKILL mid-drain.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use delay_bridge::keys::QueueKeys;
use delay_bridge::parts::redis::store::{Body, Store};

const LEASE: Duration = Duration::from_secs(600);

/// The store of `key` in hash payload mode with a claim budget of `claim_bytes`.
async fn hash_store(key: &str, claim_bytes: usize) -> Store {
    store(key).await.with_hash_bodies(claim_bytes)
}

/// A fresh key named after `prefix` whose bodies live in a hash: the key, its store (claims
/// of up to 1 MiB) and its keys.
async fn hash_queue(prefix: &str) -> (String, Store, QueueKeys) {
    let key = unique(prefix);
    let s = hash_store(&key, 1 << 20).await;
    let k = s.keys().clone();
    (key, s, k)
}

/// The producer's schedule (body and id in one transaction), as `enqueue --id` does it.
async fn produce(s: &Store, id: &str, body: &[u8], due: i64) {
    s.schedule_by_id(id.as_bytes(), body, due).await.unwrap();
}

/// The producer's cancel with the documented script, as `cancel --id` runs it.
async fn cancel(s: &Store, id: &str) -> bool {
    s.cancel_by_id(id.as_bytes()).await.unwrap()
}

async fn body_of(r: &mut Conn, keys: &QueueKeys, id: &str) -> Option<Vec<u8>> {
    redis::cmd("HGET")
        .arg(&keys.bodies)
        .arg(id)
        .query_async(r)
        .await
        .unwrap()
}

fn hash_trigger(name: &str, key: &str, capture: &AmqpCapture, extra: &str) -> String {
    amqp_trigger(name, key, capture, &format!("payload = \"hash\"\n{extra}"))
}

#[tokio::test]
async fn an_id_added_again_while_in_flight_keeps_its_new_body() {
    let mut r = redis().await;
    let (key, s, k) = hash_queue("hash-readd").await;
    let now = redis_now(&mut r).await;

    produce(&s, "order-1", b"v1", now - 10).await;
    let a = s.claim(10, LEASE).await.unwrap();
    assert_eq!(a.items.len(), 1);
    assert_eq!(a.items[0].body, Body::Stored(b"v1".to_vec()));
    assert_eq!(
        body_of(&mut r, &k, "order-1").await.as_deref(),
        Some(&b"v1"[..]),
        "claiming deletes nothing"
    );
    // Rescheduled with a new body while v1 is being published.
    produce(&s, "order-1", b"v2", now - 5).await;
    let settled = s
        .settle(a.deadline_ms, 3, &ack_all(&a.items))
        .await
        .unwrap();
    assert_eq!(settled.acked, 1);
    assert_eq!(
        body_of(&mut r, &k, "order-1").await.as_deref(),
        Some(&b"v2"[..]),
        "the ack of v1 leaves the body of the new schedule"
    );
    let b = s.claim(10, LEASE).await.unwrap();
    assert_eq!(b.items.len(), 1);
    assert_eq!(b.items[0].body, Body::Stored(b"v2".to_vec()));
    s.settle(b.deadline_ms, 3, &ack_all(&b.items))
        .await
        .unwrap();
    assert_eq!(
        body_of(&mut r, &k, "order-1").await,
        None,
        "delivered: gone"
    );
    assert_eq!(queue_sizes(&mut r, &key).await, (0, 0, 0));

    // Cancel: a scheduled id goes with its body; an id in flight keeps the body its copy needs.
    produce(&s, "order-2", b"x", now + 3_600_000).await;
    assert!(cancel(&s, "order-2").await);
    assert_eq!(body_of(&mut r, &k, "order-2").await, None);
    assert!(!cancel(&s, "order-2").await, "nothing left to cancel");
    produce(&s, "order-3", b"y", now - 1).await;
    let c = s.claim(10, LEASE).await.unwrap();
    produce(&s, "order-3", b"y2", now - 1).await;
    assert!(cancel(&s, "order-3").await);
    assert_eq!(
        body_of(&mut r, &k, "order-3").await.as_deref(),
        Some(&b"y2"[..]),
        "the copy in flight may still be delivered or retried: its body stays"
    );
    s.settle(c.deadline_ms, 3, &ack_all(&c.items))
        .await
        .unwrap();
    assert_eq!(body_of(&mut r, &k, "order-3").await, None);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test]
async fn one_claim_returns_at_most_its_byte_budget_but_always_one_member() {
    let mut r = redis().await;
    let key = unique("hash-budget");
    let s = hash_store(&key, 250_000).await;
    let now = redis_now(&mut r).await;
    for i in 0..10 {
        produce(&s, &format!("id-{i}"), &vec![b'x'; 100_000], now - 100 + i).await;
    }
    let a = s.claim(100, LEASE).await.unwrap();
    assert_eq!(
        a.items.len(),
        2,
        "two 100 kB bodies fit in 250 kB, three do not"
    );
    let big = hash_store(&key, 1000).await;
    let b = big.claim(1, LEASE).await.unwrap();
    assert_eq!(b.items.len(), 1, "a body over the budget still comes alone");
    assert_eq!(b.items[0].member, b"id-2");
    // Bodies over the largest the trigger publishes are not even read: only their size.
    let capped = hash_store(&key, 1000).await.with_largest_body(50_000);
    let c = capped.claim(100, LEASE).await.unwrap();
    assert_eq!(c.items.len(), 7, "sizes only: they cost the budget nothing");
    assert!(c.items.iter().all(|i| i.body == Body::TooLarge(100_000)));
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_scheduled_cancelled_and_rescheduled_and_bodies_arrive_byte_exact() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("hash").await;
    let (key, s, k) = hash_queue("hash-e2e").await;
    let port = free_port();
    let config = base_config(port) + &hash_trigger("hash", &key, &capture, "workers = 2");
    let now = redis_now(&mut r).await;
    // Two equal bodies under two ids are two messages; a binary body arrives as it is.
    let bodies: HashMap<&str, Vec<u8>> = HashMap::from([
        ("a", b"same body".to_vec()),
        ("b", b"same body".to_vec()),
        ("c", vec![0xff, 0x00, b'\n', 0x80]),
        ("later", b"rescheduled to now".to_vec()),
        ("cancelled", b"never".to_vec()),
        ("parked", b"rescheduled away".to_vec()),
    ]);
    for (id, body) in &bodies {
        let due = match *id {
            "later" | "cancelled" => now + 3_600_000,
            _ => now + 500,
        };
        produce(&s, id, body, due).await;
    }
    // From the command line too.
    let out = cli(
        &[
            "enqueue",
            "-t",
            "hash",
            "--id",
            "cli",
            "--delay",
            "300ms",
            "from the CLI",
        ],
        &config,
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    let out = cli(&["enqueue", "-t", "hash", "no id"], &config, &[]);
    assert_ne!(out.code, 0, "a hash trigger needs --id: {}", out.text());
    assert!(out.text().contains("--id"), "{}", out.text());
    // Cancel and reschedule by id only.
    let out = cli(&["cancel", "-t", "hash", "--id", "cancelled"], &config, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    for (due, id) in [(now + 100, "later"), (now + 3_600_000, "parked")] {
        let _: i64 = redis::cmd("ZADD")
            .arg(&k.source)
            .arg("XX")
            .arg(due)
            .arg(id)
            .query_async(&mut r)
            .await
            .unwrap();
    }

    let bridge = Bridge::start(&config, port);
    bridge
        .expect_arrivals(5, Duration::from_secs(30), || capture.count())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got: Vec<Vec<u8>> = capture.snapshot().into_iter().map(|m| m.body).collect();
    got.sort();
    let mut want = vec![
        bodies["a"].clone(),
        bodies["b"].clone(),
        bodies["c"].clone(),
        bodies["later"].clone(),
        b"from the CLI".to_vec(),
    ];
    want.sort();
    assert_eq!(got, want, "{}", bridge.log());
    // What is left: the parked id with its body, nothing else.
    let left: HashMap<Vec<u8>, Vec<u8>> = redis::cmd("HGETALL")
        .arg(&k.bodies)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        left,
        HashMap::from([(b"parked".to_vec(), bodies["parked"].clone())])
    );
    finish(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_oversized_bodies_are_dead_lettered_with_their_reason_and_requeued() {
    let mut r = redis().await;
    let (key, s, k) = hash_queue("hash-dead").await;
    let capture = AmqpCapture::start("hashdead").await;
    let port = free_port();
    let config =
        base_config(port) + &hash_trigger("hashdead", &key, &capture, "max_message_bytes = 16");
    let now = redis_now(&mut r).await;
    // A producer bug: the id without its body.
    let _: i64 = redis::cmd("ZADD")
        .arg(&k.source)
        .arg(now)
        .arg("bodiless")
        .query_async(&mut r)
        .await
        .unwrap();
    produce(&s, "huge", &[b'h'; 100], now).await;
    produce(&s, "fine", b"ok", now).await;
    let mut bridge = Bridge::start(&config, port);
    bridge
        .expect_arrivals(1, Duration::from_secs(30), || capture.count())
        .await;
    let sizes = wait_sizes(&mut r, &key, Duration::from_secs(10), |s| s.2 == 2).await;
    assert_eq!(sizes.2, 2, "sizes {sizes:?}\n{}", bridge.log());
    bridge.terminate(Duration::from_secs(10)).await;

    let out = cli(&["dead-letter", "list", "-t", "hashdead"], &config, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    // A header line, then one line per letter.
    let lines: Vec<&str> = out.stdout.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{}", out.text());
    let bodiless = lines.iter().find(|l| l.contains("bodiless")).unwrap();
    assert!(bodiless.contains("missing_body"), "{bodiless}");
    assert!(bodiless.contains("(no body)"), "{bodiless}");
    let huge = lines.iter().find(|l| l.contains(" huge ")).unwrap();
    assert!(huge.contains("too_large"), "{huge}");
    assert!(
        huge.contains(&"h".repeat(100)),
        "a dead letter keeps its body: {huge}"
    );
    assert_eq!(
        body_of(&mut r, &k, "huge").await.map(|b| b.len()),
        Some(100)
    );
    assert_eq!(body_of(&mut r, &k, "fine").await, None, "delivered: gone");

    // Repaired: the body set, then requeued: delivered.
    hset(&mut r, &k.bodies, "bodiless", "repaired").await;
    let out = cli(
        &[
            "dead-letter",
            "requeue",
            "-t",
            "hashdead",
            "--member",
            "bodiless",
        ],
        &config,
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    let bridge = bridge.restart();
    bridge
        .expect_arrivals(2, Duration::from_secs(30), || capture.count())
        .await;
    assert!(capture.snapshot().iter().any(|m| m.body == b"repaired"));
    finish(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_in_hash_mode_loses_nothing_and_leaves_no_body() {
    let (mut r, capture, key) = amqp_scene("hashkill", "delay", "hashkill").await;
    let k = QueueKeys::derive(&key).unwrap();
    let n = 5000;
    let now = redis_now(&mut r).await;
    let mut pipe = redis::pipe();
    for i in 0..n {
        let id = format!("id-{i}");
        pipe.hset(&k.bodies, &id, body(i, 0))
            .ignore()
            .zadd(&k.source, &id, now - 60_000 + i as i64)
            .ignore();
    }
    let _: () = pipe.query_async(&mut r).await.unwrap();
    let port = free_port();
    let options = "workers = 2\nbatch = 20\nlease = \"2s\"\npublish_timeout = \"1s\"";
    let cfg = base_config(port) + &hash_trigger("hashkill", &key, &capture, options);
    let bridge = sigkill_mid_drain(Bridge::start(&cfg, port), &capture, n, "hash sigkill").await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(10)).await;
    assert_eq!((sizes.0, sizes.1), (0, 0), "{sizes:?}");
    let bodies: i64 = redis::cmd("HLEN")
        .arg(&k.bodies)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(bodies, 0, "every delivered id's body is gone");
    stop_and_clean(bridge, &mut r, &key).await;
}
