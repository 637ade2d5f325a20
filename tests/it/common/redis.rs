//! Redis helpers: connections, any command in one call, the server clock, sorted-set writes and
//! reads, a queue's sizes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use delay_bridge::keys::QueueKeys;
use delay_bridge::parts::redis::store::Store;
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, ToRedisArgs};

use super::{poll, redis_url, socket_addr};

/// The connection every helper takes.
pub type Conn = MultiplexedConnection;

/// An async connection to the shared Redis.
pub async fn redis() -> Conn {
    connect(&redis::Client::open(redis_url()).unwrap())
        .await
        .expect("Redis must run on loopback (see README)")
}

/// A test's own connection through `client`, with timeouts for a loaded machine: the
/// client's defaults (1 s to connect, 500 ms per reply) fail a test while the suite runs
/// beside it, not the code under test.
pub async fn connect(client: &redis::Client) -> redis::RedisResult<Conn> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
        .set_response_timeout(Some(std::time::Duration::from_secs(30)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// The shared Redis's address, for a proxy in front of it.
pub fn shared_redis_addr() -> SocketAddr {
    socket_addr(&redis_url(), 6379)
}

/// The library's store for queue `key` on the shared Redis.
pub async fn store(key: &str) -> Store {
    let conn = delay_bridge::parts::redis::conn::Conn::open(&redis_url())
        .await
        .unwrap();
    Store::new(conn, QueueKeys::derive(key).unwrap())
}

/// Redis server time in epoch ms.
pub async fn redis_now(conn: &mut Conn) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// Runs the command `name` with `args` (a tuple for several) and returns its reply as the
/// type asked for.
pub async fn query<T: FromRedisValue>(r: &mut Conn, name: &str, args: impl ToRedisArgs) -> T {
    redis::cmd(name).arg(args).query_async(r).await.unwrap()
}

/// `CONFIG SET name value` on the server behind `r`.
pub async fn config_set(r: &mut Conn, name: &str, value: impl ToRedisArgs) {
    query::<()>(r, "CONFIG", ("SET", name, value)).await
}

/// The keys beside a queue's own: the shard counts every bridge records at start, then the
/// schedules' marks (`K:schedules`), definitions and revision.
fn keys_beside(key: &str) -> [String; 4] {
    let control = QueueKeys::derive(key).unwrap().control;
    let base = control
        .strip_suffix(":control")
        .unwrap_or(&control)
        .to_string();
    [
        ":shard-counts",
        ":schedules",
        ":schedules:defs",
        ":schedules:rev",
    ]
    .map(|suffix| format!("{base}{suffix}"))
}

/// Deletes a queue's keys (source and derived) and the keys beside them.
pub async fn cleanup_keys(conn: &mut Conn, key: &str) {
    let keys = QueueKeys::derive(key).unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&keys.all()[..])
        .arg(&keys_beside(key)[..])
        .query_async(conn)
        .await
        .unwrap();
}

/// Deletes a queue's schedule keys (`K:schedules`, its definitions and its revision).
pub async fn cleanup_schedules(conn: &mut Conn, key: &str) {
    query::<()>(conn, "DEL", &keys_beside(key)[1..]).await
}

/// `ZADD key score member`; the score may be a number or text such as `"+inf"`.
pub async fn zadd(r: &mut Conn, key: &str, score: impl ToRedisArgs, member: impl ToRedisArgs) {
    let _: i64 = redis::cmd("ZADD")
        .arg(key)
        .arg(score)
        .arg(member)
        .query_async(r)
        .await
        .unwrap();
}

/// `ZADD key score member ...` for every pair, 1000 members per command.
pub async fn zadd_all<S: ToRedisArgs, M: ToRedisArgs>(
    r: &mut Conn,
    key: &str,
    members: impl IntoIterator<Item = (S, M)>,
) {
    let mut members = members.into_iter().peekable();
    while members.peek().is_some() {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(key);
        for (score, member) in members.by_ref().take(1000) {
            cmd.arg(score).arg(member);
        }
        let _: i64 = cmd.query_async(r).await.unwrap();
    }
}

/// Schedules `n` members `PREFIX-NNNN` (four digits), one ms apart from `from_ms` on: the
/// crowd a test's message stands behind.
pub async fn schedule_crowd(r: &mut Conn, key: &str, prefix: &str, n: i64, from_ms: i64) {
    let members = (0..n).map(|i| (from_ms + i, format!("{prefix}-{i:04}")));
    zadd_all(r, key, members).await;
}

/// Schedules `members` due now on the Redis clock.
pub async fn schedule_now<M: ToRedisArgs>(
    r: &mut Conn,
    key: &str,
    members: impl IntoIterator<Item = M>,
) {
    let now = redis_now(r).await;
    zadd_all(r, key, members.into_iter().map(|m| (now, m))).await;
}

/// Body of numbered message `i`: a fixed-width number, padded with `pad` bytes so tests can
/// make messages large enough to fill socket buffers.
pub fn body(i: usize, pad: usize) -> Vec<u8> {
    let mut b = format!("msg-{i:07}").into_bytes();
    b.resize(b.len() + pad, b'.');
    b
}

/// Asserts that each of the `n` bodies [`body`]`(i, 0)` is among what arrived (`seen`: body
/// to copies); returns how many copies arrived beyond the first.
pub fn assert_none_lost(seen: &HashMap<Vec<u8>, usize>, n: usize) -> usize {
    for i in 0..n {
        assert!(seen.contains_key(&body(i, 0)), "lost {i}");
    }
    seen.values().map(|c| c - 1).sum()
}

/// Schedules messages `0..n` (see [`body`]) due a minute ago, with distinct scores so the
/// drain order is stable.
pub async fn schedule(r: &mut Conn, key: &str, n: usize, pad: usize) {
    let (s, _): (i64, i64) = redis::cmd("TIME").query_async(r).await.unwrap();
    let due = s * 1000 - 60_000;
    zadd_all(r, key, (0..n).map(|i| (due + i as i64, body(i, pad)))).await;
}

/// Schedules messages `0..n` (see [`body`]) due evenly over the next `span`, so a stream
/// lasts that long however fast the bridge forwards.
pub async fn schedule_over(r: &mut Conn, key: &str, n: usize, span: Duration) {
    let now = redis_now(r).await;
    let step = span.as_millis() as f64 / n as f64;
    zadd_all(
        r,
        key,
        (0..n).map(|i| (now + (i as f64 * step) as i64, body(i, 0))),
    )
    .await;
}

/// Schedules what the end-to-end forwarding tests send: 40 orders due over the next 3 s
/// (every fifth not UTF-8, with a NUL and a newline, so it must arrive byte for byte) and one
/// member overdue by a minute (a score in the past means now). Returns each body's due time.
pub async fn schedule_orders(r: &mut Conn, key: &str) -> HashMap<Vec<u8>, i64> {
    let now = redis_now(r).await;
    let mut expected = HashMap::new();
    for i in 0..40i64 {
        let body = match i % 5 {
            0 => vec![0xff, 0x00, 0xfe, b'\n', i as u8, 0x80],
            _ => format!("{{\"order\":{i}}}").into_bytes(),
        };
        expected.insert(body, now + 200 + i * 70);
    }
    expected.insert(b"from the past".to_vec(), now - 60_000);
    zadd_all(r, key, expected.iter().map(|(body, due)| (*due, body))).await;
    expected
}

/// `ZSCORE key member`.
pub async fn zscore(r: &mut Conn, key: &str, member: impl ToRedisArgs) -> Option<f64> {
    zscore_as(r, key, member).await
}

/// `ZSCORE key member` as Redis writes it (`inf`, `-inf`, digits).
pub async fn zscore_text(r: &mut Conn, key: &str, member: impl ToRedisArgs) -> Option<String> {
    zscore_as(r, key, member).await
}

async fn zscore_as<T: FromRedisValue>(r: &mut Conn, key: &str, member: impl ToRedisArgs) -> T {
    query(r, "ZSCORE", (key, member)).await
}

/// `ZCARD key`.
pub async fn zcard(r: &mut Conn, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query_async(r).await.unwrap()
}

/// `HLEN key`.
pub async fn hlen(r: &mut Conn, key: &str) -> i64 {
    redis::cmd("HLEN").arg(key).query_async(r).await.unwrap()
}

/// A queue's (source, in-flight, dead) sizes.
pub type Sizes = (i64, i64, i64);

/// The sizes of a queue's source, in-flight and dead-letter sets.
pub async fn queue_sizes(r: &mut Conn, key: &str) -> Sizes {
    let keys = QueueKeys::derive(key).unwrap();
    redis::pipe()
        .zcard(&keys.source)
        .zcard(&keys.inflight)
        .zcard(&keys.dead)
        .query_async(r)
        .await
        .unwrap()
}

/// Polls a queue's sizes until `done` accepts them or `timeout` passes; returns the last seen.
pub async fn wait_sizes(
    r: &mut Conn,
    key: &str,
    timeout: Duration,
    done: impl FnMut(&Sizes) -> bool,
) -> Sizes {
    poll(
        timeout,
        Duration::from_millis(50),
        async || queue_sizes(r, key).await,
        done,
    )
    .await
    .1
}

/// Waits until the queue's source and in-flight sets are both empty.
pub async fn wait_drained(r: &mut Conn, key: &str, timeout: Duration) -> Sizes {
    wait_sizes(r, key, timeout, |(source, inflight, _)| {
        (*source, *inflight) == (0, 0)
    })
    .await
}

/// Every member still in Redis: in the source set or leased (in flight, to be recovered).
pub async fn members_in_redis(r: &mut Conn, key: &str) -> Vec<Vec<u8>> {
    let keys = QueueKeys::derive(key).unwrap();
    let (mut source, inflight): (Vec<Vec<u8>>, Vec<Vec<u8>>) = redis::pipe()
        .zrange(&keys.source, 0, -1)
        .zrange(&keys.inflight, 0, -1)
        .query_async(r)
        .await
        .unwrap();
    source.extend(inflight);
    source
}

/// Where `member` is in Redis, for a failure message: its score in the source set, its
/// lease, its attempts entry and its dead-letter reason, or "nowhere".
pub async fn whereabouts(r: &mut Conn, key: &str, member: &[u8]) -> String {
    let keys = QueueKeys::derive(key).unwrap();
    let (source, lease, attempts, dead): (
        Option<f64>,
        Option<f64>,
        Option<String>,
        Option<String>,
    ) = redis::pipe()
        .zscore(&keys.source, member)
        .zscore(&keys.inflight, member)
        .hget(&keys.attempts, member)
        .hget(&keys.dead_reasons, member)
        .query_async(r)
        .await
        .unwrap();
    let found: Vec<String> = [
        source.map(|s| format!("scheduled at {s}")),
        lease.map(|l| format!("leased until {l}")),
        attempts.map(|a| format!("attempts {a}")),
        dead.map(|d| format!("dead: {d}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if found.is_empty() {
        "nowhere".into()
    } else {
        found.join(", ")
    }
}

/// The dead-letter reason JSON of `member`, if it is a dead letter.
pub async fn dead_reason(
    r: &mut Conn,
    key: &str,
    member: impl ToRedisArgs,
) -> Option<serde_json::Value> {
    let keys = QueueKeys::derive(key).unwrap();
    let json: Option<String> = redis::cmd("HGET")
        .arg(&keys.dead_reasons)
        .arg(member)
        .query_async(r)
        .await
        .unwrap();
    json.map(|j| serde_json::from_str(&j).unwrap())
}

/// Polls for `member`'s dead-letter reason until `deadline`.
pub async fn wait_dead_reason(
    r: &mut Conn,
    key: &str,
    member: &[u8],
    deadline: Instant,
) -> Option<serde_json::Value> {
    let timeout = deadline.saturating_duration_since(Instant::now());
    poll(
        timeout,
        Duration::from_millis(50),
        async || dead_reason(r, key, member).await,
        Option::is_some,
    )
    .await
    .1
}

/// Makes `member` a dead letter of `key` since `at_ms`, with `reason` as its reason JSON, the
/// way the settle script leaves one.
pub async fn dead_letter(r: &mut Conn, key: &str, member: &str, at_ms: i64, reason: &str) {
    let keys = QueueKeys::derive(key).unwrap();
    zadd(r, &keys.dead, at_ms, member).await;
    let _: () = redis::cmd("HSET")
        .arg(&keys.dead_reasons)
        .arg(member)
        .arg(reason)
        .query_async(r)
        .await
        .unwrap();
}

/// A settlement that acks every claimed member, as the settle script sees a batch the
/// broker confirmed in full (the scripts' tests have no broker to confirm).
pub fn ack_all(
    items: &[delay_bridge::parts::redis::store::Claimed],
) -> delay_bridge::parts::redis::store::Settlement<'_> {
    let mut s = delay_bridge::parts::redis::store::Settlement::for_batch(items.len());
    for c in items {
        s.ack(
            &c.member,
            delay_bridge::parts::proof::Confirmed::unpublished(),
        );
    }
    s
}
