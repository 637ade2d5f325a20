//! Fault-test bookkeeping: schedule numbered messages, count what the broker delivers, find losses.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use tokio_util::sync::CancellationToken;

use crate::common::{amqp_url, Bridge};
use crate::proxy::Proxy;

/// Body of message `i`: a fixed-width number, padded with `pad` bytes so tests can make
/// messages large enough to fill socket buffers.
pub fn body(i: usize, pad: usize) -> Vec<u8> {
    let mut b = format!("msg-{i:07}").into_bytes();
    b.resize(b.len() + pad, b'.');
    b
}

/// Schedules `n` messages due in the past on `key`, 1000 members per `ZADD`.
pub async fn schedule(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    n: usize,
    pad: usize,
) {
    let (s, _): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    let due = s * 1000 - 60_000;
    for start in (0..n).step_by(1000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(key);
        for i in start..(start + 1000).min(n) {
            // Distinct scores keep the drain order stable; all are already due.
            cmd.arg(due + i as i64).arg(body(i, pad));
        }
        let _: i64 = cmd.query_async(conn).await.unwrap();
    }
}

/// Sizes of a queue's source and in-flight sets (and dead letters).
pub async fn queue_sizes(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> (u64, u64, u64) {
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    redis::pipe()
        .zcard(&keys.source)
        .zcard(&keys.inflight)
        .zcard(&keys.dead)
        .query_async(conn)
        .await
        .unwrap()
}

/// Every member still in Redis: in the source set or leased (in flight, to be recovered).
pub async fn members_in_redis(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Vec<Vec<u8>> {
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    let (mut source, inflight): (Vec<Vec<u8>>, Vec<Vec<u8>>) = redis::pipe()
        .zrange(&keys.source, 0, -1)
        .zrange(&keys.inflight, 0, -1)
        .query_async(conn)
        .await
        .unwrap();
    source.extend(inflight);
    source
}

/// What a consumer saw.
#[derive(Default)]
struct Seen {
    /// Copies of each body published by the bridge (broker redeliveries excluded).
    copies: HashMap<Vec<u8>, u32>,
    /// Deliveries the broker repeated because our consumer's connection died before its ack.
    broker_redeliveries: u64,
}

/// A durable queue bound to a fresh durable exchange, consumed with acks in the background;
/// reconnects when the broker goes away, so it survives a broker restart.
pub struct Tally {
    /// Exchange the bridge should publish to.
    pub exchange: String,
    /// Routing key the bridge should use.
    pub routing_key: String,
    /// The queue.
    pub queue: String,
    url: String,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
}

impl Tally {
    /// Declares the topology at `url` and starts consuming.
    pub async fn start(url: &str) -> Self {
        let me = Self {
            exchange: crate::common::unique("faults-ex"),
            routing_key: "faults".into(),
            queue: crate::common::unique("faults-q"),
            url: url.to_string(),
            seen: Arc::default(),
            stop: CancellationToken::new(),
        };
        // The first connection must work; later ones may fail while a fault is on.
        let conn = me.connect().await.expect("RabbitMQ must run (see README)");
        let (url, exchange, queue, rk) = (
            me.url.clone(),
            me.exchange.clone(),
            me.queue.clone(),
            me.routing_key.clone(),
        );
        let (seen, stop) = (me.seen.clone(), me.stop.clone());
        tokio::spawn(async move {
            let mut conn = Some(conn);
            // Bounded by `stop`, which the test always fires on drop.
            while !stop.is_cancelled() {
                let c = match conn.take() {
                    Some(c) => Ok(c),
                    None => connect(&url, &exchange, &queue, &rk).await,
                };
                if let Ok(c) = c {
                    tokio::select! {
                        _ = consume(&c, &queue, &seen) => {}
                        _ = stop.cancelled() => {}
                    }
                    let _ = c.close(200, "done").await;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stop.cancelled() => {}
                }
            }
        });
        me
    }

    async fn connect(&self) -> Result<Connection, lapin::Error> {
        connect(&self.url, &self.exchange, &self.queue, &self.routing_key).await
    }

    /// Distinct bodies received.
    pub fn distinct(&self) -> usize {
        self.seen.lock().unwrap().copies.len()
    }

    /// Extra copies published by the bridge (at-least-once duplicates).
    pub fn duplicates(&self) -> u64 {
        let seen = self.seen.lock().unwrap();
        seen.copies.values().map(|c| u64::from(c - 1)).sum()
    }

    /// Deliveries repeated by the broker itself (consumer connection lost before its ack).
    pub fn broker_redeliveries(&self) -> u64 {
        self.seen.lock().unwrap().broker_redeliveries
    }

    /// Which of messages `0..n` were never received.
    pub fn missing(&self, n: usize, pad: usize) -> Vec<usize> {
        let seen = self.seen.lock().unwrap();
        (0..n)
            .filter(|i| !seen.copies.contains_key(&body(*i, pad)))
            .collect()
    }

    /// Which of messages `0..n` were neither received nor are in `still_queued`.
    pub fn missing_except(&self, n: usize, pad: usize, still_queued: &[Vec<u8>]) -> Vec<usize> {
        let queued: HashSet<&[u8]> = still_queued.iter().map(Vec::as_slice).collect();
        let seen = self.seen.lock().unwrap();
        (0..n)
            .map(|i| (i, body(i, pad)))
            .filter(|(_, b)| !seen.copies.contains_key(b) && !queued.contains(b.as_slice()))
            .map(|(i, _)| i)
            .collect()
    }

    /// Deletes the queue (the exchange auto-deletes with its last binding).
    pub async fn cleanup(&self) {
        self.stop.cancel();
        if let Ok(conn) = Connection::connect(&self.url, ConnectionProperties::default()).await {
            if let Ok(ch) = conn.create_channel().await {
                let _ = ch.queue_delete(&self.queue, Default::default()).await;
            }
            let _ = conn.close(200, "done").await;
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn connect(
    url: &str,
    exchange: &str,
    queue: &str,
    routing_key: &str,
) -> Result<Connection, lapin::Error> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.exchange_declare(
        exchange,
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    // Durable, so a broker restart keeps what was confirmed; expires if a test dies
    // without cleaning up.
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
    ch.queue_declare(
        queue,
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await?;
    ch.queue_bind(
        queue,
        exchange,
        routing_key,
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    ch.close(200, "declared").await?;
    Ok(conn)
}

/// Consumes until the connection fails.
async fn consume(conn: &Connection, queue: &str, seen: &Mutex<Seen>) {
    let Ok(ch) = conn.create_channel().await else {
        return;
    };
    if ch
        .basic_qos(2000, BasicQosOptions::default())
        .await
        .is_err()
    {
        return;
    }
    let Ok(mut consumer) = ch
        .basic_consume(
            queue,
            "faults",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
    else {
        return;
    };
    while let Some(Ok(d)) = consumer.next().await {
        {
            let mut seen = seen.lock().unwrap();
            if d.redelivered && seen.copies.contains_key(&d.data) {
                seen.broker_redeliveries += 1;
            } else {
                *seen.copies.entry(d.data.clone()).or_default() += 1;
            }
        }
        if d.ack(BasicAckOptions::default()).await.is_err() {
            return;
        }
    }
}

/// A whole bridge config for one trigger publishing to `tally`: Redis at `redis_url`, RabbitMQ
/// at `amqp_url` (either may be a proxy), short timeouts so faults resolve in seconds.
pub fn config(
    metrics_port: u16,
    redis_url: &str,
    amqp_url: &str,
    key: &str,
    tally: &Tally,
    trigger_extra: &str,
    shutdown_timeout: &str,
) -> String {
    config_with_lease(
        metrics_port,
        redis_url,
        amqp_url,
        key,
        tally,
        trigger_extra,
        shutdown_timeout,
        ("2s", "1s"),
    )
}

/// [`config`] with another `(lease, publish_timeout)`.
#[allow(clippy::too_many_arguments)]
pub fn config_with_lease(
    metrics_port: u16,
    redis_url: &str,
    amqp_url: &str,
    key: &str,
    tally: &Tally,
    trigger_extra: &str,
    shutdown_timeout: &str,
    (lease, publish_timeout): (&str, &str),
) -> String {
    format!(
        r#"
[redis]
url = "{redis_url}"
enable_keyspace_events = true
connect_timeout = "1s"
response_timeout = "1s"

[metrics]
listen = "127.0.0.1:{metrics_port}"
backlog_interval = "200ms"

[log]
level = "info,delay_bridge=debug"

[shutdown]
timeout = "{shutdown_timeout}"

[sinks.rabbit]
type = "amqp"
url = "{amqp_url}"
reconnect_max = "1s"

[[triggers]]
name = "faults"
key = "{key}"
sink = "rabbit"
exchange = "{exchange}"
routing_key = "{rk}"
lease = "{lease}"
publish_timeout = "{publish_timeout}"
max_attempts = 1000
backoff_initial = "100ms"
backoff_max = "1s"
{trigger_extra}
"#,
        exchange = tally.exchange,
        rk = tally.routing_key,
    )
}

/// Asserts that every one of messages `0..n` arrived, and prints the one-line summary the
/// README table is built from.
pub fn report(fault: &str, n: usize, pad: usize, tally: &Tally, extra: &str) {
    let missing = tally.missing(n, pad);
    let lost = missing.len();
    println!(
        "fault={fault} messages={n} lost={lost} duplicates={}{}{extra}",
        tally.duplicates(),
        if extra.is_empty() { "" } else { " " },
    );
    assert!(
        missing.is_empty(),
        "{fault}: {lost} of {n} messages lost, e.g. {:?}",
        &missing[..missing.len().min(10)]
    );
}

/// The shared RabbitMQ's address, for a proxy in front of it.
pub fn shared_amqp_addr() -> SocketAddr {
    let url = url::Url::parse(&amqp_url()).unwrap();
    let host = url.host_str().unwrap_or("127.0.0.1");
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    SocketAddr::new(host.parse().unwrap(), url.port().unwrap_or(5672))
}

/// The shared broker's URL with the host and port replaced by a proxy's.
pub fn via_proxy(proxy: &Proxy, query: &str) -> String {
    let mut url = url::Url::parse(&amqp_url()).unwrap();
    url.set_port(Some(proxy.port())).unwrap();
    url.set_query(if query.is_empty() { None } else { Some(query) });
    url.to_string()
}

/// Waits until the key's source and in-flight sets are both empty.
pub async fn wait_drained(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    timeout: Duration,
) -> (u64, u64, u64) {
    let end = Instant::now() + timeout;
    loop {
        let sizes = queue_sizes(r, key).await;
        if (sizes.0, sizes.1) == (0, 0) || Instant::now() >= end {
            return sizes;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `/readyz` until it answers `status`.
pub async fn wait_readyz(bridge: &Bridge, status: u16, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if bridge.get("/readyz").await.map(|(s, _)| s) == Some(status) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Samples for `window` that nothing is claimed: in-flight stays empty and the source set
/// keeps its size. Returns the source size seen.
pub async fn assert_not_claiming(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    window: Duration,
    bridge: &Bridge,
) -> u64 {
    let end = Instant::now() + window;
    let (first, _, _) = queue_sizes(r, key).await;
    while Instant::now() < end {
        let (source, inflight, _) = queue_sizes(r, key).await;
        assert_eq!(
            inflight,
            0,
            "claimed while the sink is down\n{}",
            bridge.log()
        );
        assert_eq!(
            source, first,
            "members left the source set while the sink is down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first
}

/// Waits until the in-flight set is empty.
pub async fn wait_drained_inflight(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    timeout: Duration,
) -> (u64, u64, u64) {
    let end = Instant::now() + timeout;
    loop {
        let sizes = queue_sizes(r, key).await;
        if sizes.1 == 0 || Instant::now() >= end {
            return sizes;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
