//! The loss and wedge paths of a hostile review, each replayed against the real scripts:
//! re-added members, wrong-typed keys, attempt counts outliving their member, requeue edge cases.

use crate::common;

use std::time::Duration;

use common::*;
use delay_bridge::keys::QueueKeys;
use delay_bridge::parts::redis::store::{FailOutcome, Failure, Settlement, Store};

const LEASE: Duration = Duration::from_secs(600);

/// A settlement failing `member` alone: due again after `retry_in`, or dead-lettered if
/// `permanent`.
fn failing(member: &[u8], retry_in: Duration, permanent: bool) -> Settlement<'_> {
    let mut s = Settlement::for_batch(1);
    s.fail(Failure {
        member,
        retry_in,
        reason: "nack".into(),
        permanent,
        detail: None,
    });
    s
}

/// A connection, and the store of queue `key` holding the member `m`, long due.
async fn holding_m(key: &str) -> (Conn, Store) {
    let mut r = redis().await;
    let s = store(key).await;
    zadd(&mut r, key, "1", "m").await;
    (r, s)
}

/// A producer adds a member again while its first copy is in flight: the second schedule
/// must survive whatever the first copy's batch does, and each schedule is delivered.
#[tokio::test]
async fn a_member_added_again_while_in_flight_keeps_its_second_schedule() {
    let mut r = redis().await;
    let key = unique("loss-readd");
    let s = store(&key).await;
    let k = s.keys().clone();

    zadd(&mut r, &key, "1", "m").await;
    let a = s.claim(10, LEASE).await.unwrap();
    assert_eq!(a.items.len(), 1);
    // The producer schedules m again (due now) while batch A is publishing it.
    zadd(&mut r, &key, "2", "m").await;
    let b = s.claim(10, LEASE).await.unwrap();
    assert!(
        b.items.is_empty(),
        "the second copy must wait until the first is settled, not take over its lease"
    );
    assert_eq!(b.skipped, 1, "the claim says it left a due member behind");
    assert_eq!(
        b.next_head_ms, None,
        "a member in flight is not a head to wake up for"
    );

    // A is confirmed: only A's lease ends; the second schedule is still there.
    let settled = s
        .settle(a.deadline_ms, 3, &ack_all(&a.items))
        .await
        .unwrap();
    assert_eq!(settled.acked, 1);
    assert_eq!(zscore(&mut r, &k.source, "m").await, Some(2.0));
    assert_eq!(zscore(&mut r, &k.inflight, "m").await, None);

    let c = s.claim(10, LEASE).await.unwrap();
    assert_eq!(c.items.len(), 1, "the second schedule is delivered too");
    assert_eq!(c.items[0].attempt, 1);
    s.settle(c.deadline_ms, 3, &ack_all(&c.items))
        .await
        .unwrap();

    // A failure of the first copy keeps the producer's new schedule (same member: one copy).
    zadd(&mut r, &key, "1", "n").await;
    let a = s.claim(10, LEASE).await.unwrap();
    let later = redis_now(&mut r).await + 3_600_000;
    zadd(&mut r, &key, &later.to_string(), "n").await;
    let settled = s
        .settle(a.deadline_ms, 3, &failing(b"n", Duration::ZERO, false))
        .await
        .unwrap();
    assert_eq!(settled.fail_outcomes, vec![FailOutcome::Retried]);
    assert_eq!(zscore(&mut r, &k.source, "n").await, Some(later as f64));
    assert_eq!(zscore(&mut r, &k.inflight, "n").await, None);
    cleanup_keys(&mut r, &key).await;
}

/// A batch whose lease expired and was recovered cannot ack the member away from under the
/// claim that took it next.
#[tokio::test]
async fn a_stale_batch_cannot_ack_a_newer_claim() {
    let key = unique("loss-stale");
    let (mut r, s) = holding_m(&key).await;
    let a = s.claim(10, Duration::ZERO).await.unwrap();
    // Wait for the Redis clock to pass A's deadline, then recover and claim again.
    while redis_now(&mut r).await <= a.deadline_ms {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(s.recover(10, None).await.unwrap().recovered, 1);
    let b = s.claim(10, LEASE).await.unwrap();
    assert_eq!(b.items.len(), 1);
    assert_eq!(
        b.items[0].attempt, 2,
        "the expired lease counted as an attempt"
    );
    let settled = s
        .settle(a.deadline_ms, 3, &ack_all(&a.items))
        .await
        .unwrap();
    assert_eq!(settled.acked, 0, "A no longer owns m");
    assert_eq!(
        zscore(&mut r, &s.keys().inflight, "m").await,
        Some(b.deadline_ms as f64),
        "B's lease is intact, so B's crash would still be recovered"
    );
    cleanup_keys(&mut r, &key).await;
}

async fn del(r: &mut Conn, key: &str) {
    query::<()>(r, "DEL", key).await
}

/// Redis does not roll a script back: a wrong-typed key must fail every script before its
/// first write, so each member stays in some set.
#[tokio::test]
async fn a_wrong_typed_key_fails_the_scripts_before_they_write() {
    let key = format!("{}:{{w}}", unique("loss-type"));
    let (mut r, s) = holding_m(&key).await;
    let k = s.keys().clone();
    zadd(&mut r, &key, "1", "n").await;

    // Claim with a broken attempts hash: nothing moves.
    set_string(&mut r, &k.attempts, "oops").await;
    let e = s.claim(10, LEASE).await.unwrap_err();
    assert_eq!(e.kind(), "wrong_type", "{e}");
    assert!(e.to_string().contains(&k.attempts), "names the key: {e}");
    del(&mut r, &k.attempts).await;
    assert_eq!(zscore(&mut r, &k.source, "m").await, Some(1.0));

    let batch = s.claim(10, Duration::ZERO).await.unwrap();
    assert_eq!(batch.items.len(), 2);

    // Dead-lettering into a broken dead-letter set: the member stays leased.
    set_string(&mut r, &k.dead, "oops").await;
    let e = s
        .settle(batch.deadline_ms, 3, &failing(b"m", Duration::ZERO, true))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "wrong_type");
    del(&mut r, &k.dead).await;
    assert!(zscore(&mut r, &k.inflight, "m").await.is_some());

    // Recovering into a broken source key: the leases stay.
    while redis_now(&mut r).await <= batch.deadline_ms {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    set_string(&mut r, &k.source, "oops").await;
    let e = s.recover(10, Some("0")).await.unwrap_err();
    assert_eq!(e.kind(), "wrong_type");
    del(&mut r, &k.source).await;
    assert_eq!(
        zcard(&mut r, &k.inflight).await,
        2,
        "both members are still leased"
    );
    assert_eq!(s.recover(10, None).await.unwrap().recovered, 2);
    cleanup_keys(&mut r, &key).await;
}

/// A failure count belongs to its member: removed with it, never inherited by an identical
/// payload the producer schedules later, and swept from the hash.
#[tokio::test]
async fn an_attempt_count_does_not_outlive_its_member() {
    let key = unique("loss-count");
    let (mut r, s) = holding_m(&key).await;
    let k = s.keys().clone();
    fail_once(&s, b"m").await;
    let count: Option<String> = hget(&mut r, &k.attempts, "m").await;
    assert!(count.is_some_and(|c| c.starts_with("1:")));

    // The producer cancels the retry, then schedules the same payload anew.
    zrem(&mut r, &key, "m").await;
    zadd(&mut r, &key, "5", "m").await;
    let b = s.claim(10, LEASE).await.unwrap();
    assert_eq!(
        b.items[0].attempt, 1,
        "a new schedule starts with attempt 1"
    );
    s.settle(b.deadline_ms, 10, &ack_all(&b.items))
        .await
        .unwrap();

    // Cancelled for good: the sweep removes what is left.
    zadd(&mut r, &key, "1", "x").await;
    fail_once(&s, b"x").await;
    zrem(&mut r, &key, "x").await;
    let swept = s.recover(0, Some("0")).await.unwrap();
    assert_eq!((swept.cursor.as_str(), swept.swept), ("0", 1));
    assert_eq!(hlen(&mut r, &k.attempts).await, 0);
    cleanup_keys(&mut r, &key).await;
}

/// Claims `member` and fails it once: due again in an hour, one attempt counted.
async fn fail_once(s: &Store, member: &[u8]) {
    let batch = s.claim(10, LEASE).await.unwrap();
    let retry = failing(member, Duration::from_secs(3600), false);
    s.settle(batch.deadline_ms, 10, &retry).await.unwrap();
}

/// A dead letter whose member is also parked at +inf fires when requeued.
#[tokio::test]
async fn requeue_moves_a_parked_copy_to_now() {
    let key = unique("loss-parked");
    let (mut r, s) = holding_m(&key).await;
    let a = s.claim(10, LEASE).await.unwrap();
    s.settle(a.deadline_ms, 3, &failing(b"m", Duration::ZERO, true))
        .await
        .unwrap();
    zadd(&mut r, &key, "+inf", "m").await;
    let before = redis_now(&mut r).await;
    assert_eq!(s.requeue_dead(&[b"m".to_vec()], 10).await.unwrap(), 1);
    let score = zscore(&mut r, &key, "m").await.unwrap();
    assert!(
        score >= before as f64 && score.is_finite(),
        "due now, not +inf: {score}"
    );
    assert_eq!(s.claim(10, LEASE).await.unwrap().items.len(), 1);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test]
async fn requeue_with_limit_zero_moves_nothing_and_enqueue_refuses_a_huge_delay() {
    let mut r = redis().await;
    let key = unique("loss-cli");
    let k = QueueKeys::derive(&key).unwrap();
    zadd_all(&mut r, &k.dead, [(1, "d1"), (2, "d2")]).await;
    let config = base_config(free_port()) + &trigger("t", &key, "rabbit", "exchange = \"\"");
    let run = |args: &[&str]| cli(args, &config, &[]);
    let out = run(&["dead-letter", "requeue", "-t", "t", "--limit", "0"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.text().contains("requeued 0"), "{}", out.text());
    assert_eq!(zcard(&mut r, &k.dead).await, 2);

    let out = run(&["enqueue", "-t", "t", "--delay", "100000000years", "late"]);
    assert_ne!(out.code, 0, "{}", out.text());
    assert!(out.text().contains("too far ahead"), "{}", out.text());
    assert_eq!(zcard(&mut r, &key).await, 0, "nothing was scheduled");
    cleanup_keys(&mut r, &key).await;
}

/// End to end: a trigger whose dead-letter key holds a string claims nothing (nothing can be
/// lost), says so, and delivers everything once an operator removes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_with_a_wrong_typed_key_waits_for_the_operator() {
    let (mut r, capture, key) = amqp_scene("wrongtype", "loss-e2e", "wt").await;
    let k = QueueKeys::derive(&key).unwrap();
    set_string(&mut r, &k.dead, "oops").await;
    zadd_all(&mut r, &key, (0..20).map(|i| (1, format!("m{i}")))).await;
    let port = free_port();
    let cfg = base_config(port) + &amqp_trigger("wt", &key, &capture, "");
    let bridge = Bridge::start(&cfg, port);
    let (seen, _) = bridge
        .wait_scrape(Duration::from_secs(20), |body| {
            metric_value(
                body,
                "delay_bridge_redis_errors_total",
                &[("trigger", "wt"), ("kind", "wrong_type")],
            ) >= 2.0
        })
        .await;
    assert!(seen, "{}", bridge.log());
    assert_eq!(zcard(&mut r, &key).await, 20, "nothing was claimed");
    assert_eq!(capture.count(), 0);
    assert!(
        wait_until(Duration::from_secs(10), || bridge.log().contains(&k.dead)).await,
        "the log names the key\n{}",
        bridge.log()
    );
    del(&mut r, &k.dead).await;
    bridge
        .expect_arrivals(20, Duration::from_secs(30), || capture.count())
        .await;
    stop_and_clean(bridge, &mut r, &key).await;
}

/// The producers' cancel script checks its keys and looks both copies up before its first
/// write: a wrong-typed key fails it with the id still scheduled and its body kept.
#[tokio::test]
async fn cancel_with_a_wrong_typed_key_changes_nothing() {
    let mut r = redis().await;
    let key = unique("loss-cancel");
    let s = store(&key).await.with_hash_bodies(1 << 20);
    let k = s.keys().clone();
    s.schedule_by_id(b"x", b"body", 1).await.unwrap();
    set_string(&mut r, &k.dead, "not a sorted set").await;
    let e = s.cancel_by_id(b"x").await.unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    assert_eq!(zscore(&mut r, &k.source, "x").await, Some(1.0));
    let body: Option<Vec<u8>> = hget(&mut r, &k.bodies, "x").await;
    assert_eq!(body.as_deref(), Some(&b"body"[..]));
    let _: () = redis::cmd("DEL")
        .arg(&k.dead)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(s.cancel_by_id(b"x").await.unwrap());
    cleanup_keys(&mut r, &key).await;
}
