//! The schedule script (`schedule.lua`) against the real server: a mark moves only from the
//! mark planned from, each misfire policy's branch, the pause, and a wrong-typed key that
//! fails the call with nothing changed.

use super::*;

use delay_bridge::parts::redis::store::{Enqueued, Mark, Offer};
use delay_bridge::parts::schedule::tick;

/// A fresh queue (inline, or hash payload mode) and its store.
async fn scene(hash: bool) -> (Store, MultiplexedConnection, QueueKeys) {
    let conn = common::redis().await;
    let manager = Conn::open(&common::redis_url()).await.unwrap();
    let key = format!("{}:{{sched}}", common::unique("model"));
    let keys = QueueKeys::derive(&key).unwrap();
    let mut store = Store::new(manager, keys.clone());
    if hash {
        store = store.with_hash_bodies(1 << 20);
    }
    (store, conn, keys)
}

/// A fresh inline queue whose schedule `s` enqueued one tick `late_ms` before the Redis clock
/// under `all` (which keeps a missed tick): the queue, the clock then, and the mark it left.
async fn marked(
    grace_ms: i64,
    late_ms: i64,
) -> (Store, MultiplexedConnection, QueueKeys, i64, Mark) {
    let (store, conn, keys) = scene(false).await;
    let (now, _) = store.schedule_marks(&["s"]).await.unwrap();
    offer(&store, b"", "all", grace_ms, 10, &[now - late_ms])
        .await
        .unwrap();
    let (_, mut marks) = store.schedule_marks(&["s"]).await.unwrap();
    (store, conn, keys, now, marks.remove(0))
}

/// Offers `ticks` (epoch ms) of schedule `s` planned from `planned` under `policy`.
async fn offer(
    store: &Store,
    planned: &[u8],
    policy: &str,
    grace_ms: i64,
    limit: u32,
    ticks: &[i64],
) -> Result<Enqueued, delay_bridge::parts::redis::store::StoreError> {
    let hash = store.hash_bodies();
    let ticks = ticks
        .iter()
        .map(|&t| (t, tick::member("s", t, (!hash).then_some(&b"b"[..]))))
        .collect();
    store
        .enqueue_ticks(&Offer {
            name: "s",
            planned,
            grace_ms,
            policy,
            limit,
            body: hash.then_some(&b"b"[..]),
            left_out: 0,
            ticks,
        })
        .await
}

/// The ticks waiting in the source set, ascending.
async fn waiting(conn: &mut MultiplexedConnection, keys: &QueueKeys) -> Vec<i64> {
    let members: Vec<(Vec<u8>, f64)> = common::zscored(conn, &keys.source).await;
    members
        .iter()
        .map(|(m, score)| {
            let t = tick::parse(m).expect("a tick member").tick_ms;
            assert_eq!(t as f64, *score, "due at its tick");
            t
        })
        .collect()
}

async fn clean(conn: &mut MultiplexedConnection, store: &Store, keys: &QueueKeys) {
    let mut all: Vec<String> = keys.all().iter().map(|k| k.to_string()).collect();
    all.push(store.schedules_key());
    let _: () = redis::cmd("DEL").arg(&all).query_async(conn).await.unwrap();
}

#[tokio::test]
async fn the_mark_moves_once_from_the_mark_planned_from() {
    for hash in [false, true] {
        let (store, mut conn, keys) = scene(hash).await;
        let (now, marks) = store.schedule_marks(&["s"]).await.unwrap();
        assert_eq!(marks[0].tick_ms, None);
        let t = now + 60_000;
        let first = offer(&store, b"", "skip", 1000, 10, &[t]).await.unwrap();
        assert!(
            !first.stale && first.fired == 1 && first.waiting,
            "{first:?}"
        );
        // A second bridge planning from the same (empty) mark loses and changes nothing.
        let second = offer(&store, b"", "skip", 1000, 10, &[t]).await.unwrap();
        assert!(second.stale, "{second:?}");
        assert_eq!(waiting(&mut conn, &keys).await, [t]);
        let (_, marks) = store.schedule_marks(&["s"]).await.unwrap();
        assert_eq!(marks[0].tick_ms, Some(t));
        assert!(marks[0].waiting);
        if hash {
            let member = tick::member("s", t, None);
            let body: Vec<u8> = common::hget(&mut conn, &keys.bodies, member).await;
            assert_eq!(body, b"b");
        }
        // From the new mark the next tick is enqueued.
        let next = offer(&store, &marks[0].raw, "skip", 1000, 10, &[t + 1000])
            .await
            .unwrap();
        assert_eq!((next.stale, next.mark_ms), (false, Some(t + 1000)));
        assert_eq!(waiting(&mut conn, &keys).await, [t, t + 1000]);
        clean(&mut conn, &store, &keys).await;
    }
}

#[tokio::test]
async fn each_policy_treats_missed_ticks_and_a_missed_mark_as_stated() {
    for (policy, want_waiting, want_missed) in [
        // Mark at -10 s (enqueued, unclaimed); offered -5, -4, -3 s (missed), -0.5 s (within
        // the grace), +1 s.
        ("skip", vec![-500, 1000], 4),
        ("once", vec![-3000, -500, 1000], 3),
        ("all", vec![-10_000, -4000, -3000, -500, 1000], 1),
    ] {
        let (store, mut conn, keys, now, mark) = marked(2000, 10_000).await;
        let at = |offsets: &[i64]| offsets.iter().map(|o| now + o).collect::<Vec<_>>();
        let r = offer(
            &store,
            &mark.raw,
            policy,
            2000,
            2,
            &at(&[-5000, -4000, -3000, -500, 1000]),
        )
        .await
        .unwrap();
        assert_eq!(
            waiting(&mut conn, &keys).await,
            at(&want_waiting),
            "{policy}"
        );
        assert_eq!(r.missed, want_missed, "{policy}: {r:?}");
        assert_eq!(r.mark_ms, Some(now + 1000), "{policy}");
        clean(&mut conn, &store, &keys).await;
    }
}

#[tokio::test]
async fn a_paused_trigger_enqueues_nothing_and_keeps_its_mark() {
    let (store, mut conn, keys, now, mark) = marked(1000, 5000).await;
    common::hset(&mut conn, &keys.control, "paused", "1").await;
    let late_and_next = [now - 4000, now + 1000];
    let r = offer(&store, &mark.raw, "skip", 1000, 10, &late_and_next)
        .await
        .unwrap();
    assert!(r.paused, "{r:?}");
    // The missed mark is taken back and counted; nothing new is enqueued, the mark stays.
    assert_eq!((r.missed, r.mark_ms), (1, Some(now - 5000)));
    assert!(waiting(&mut conn, &keys).await.is_empty());
    let (_, after) = store.schedule_marks(&["s"]).await.unwrap();
    assert_eq!(after[0].raw, mark.raw);
    clean(&mut conn, &store, &keys).await;
}

#[tokio::test]
async fn a_wrong_typed_key_fails_the_call_with_nothing_changed() {
    let (store, mut conn, keys, now, mark) = marked(1000, 5000).await;
    for wrong in [keys.bodies.clone(), store.schedules_key()] {
        let before: Vec<i64> = waiting(&mut conn, &keys).await;
        let backup = format!("{wrong}:backup");
        let existed: i64 = common::query(&mut conn, "EXISTS", &wrong).await;
        if existed == 1 {
            common::query::<()>(&mut conn, "RENAME", (&wrong, &backup)).await;
        }
        common::set_string(&mut conn, &wrong, "x").await;
        let late_and_next = [now - 4000, now + 1000];
        let r = offer(&store, &mark.raw, "all", 1000, 10, &late_and_next).await;
        let e = r.expect_err("a wrong-typed key fails the call");
        assert!(e.to_string().contains("WRONGTYPE"), "{e}");
        assert_eq!(waiting(&mut conn, &keys).await, before);
        common::query::<()>(&mut conn, "DEL", &wrong).await;
        if existed == 1 {
            common::query::<()>(&mut conn, "RENAME", (&backup, &wrong)).await;
        }
    }
    clean(&mut conn, &store, &keys).await;
}
