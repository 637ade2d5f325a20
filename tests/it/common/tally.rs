//! Fault-test bookkeeping: count what the broker delivers of the numbered messages
//! [`schedule`](super::schedule) wrote, find losses, and the config the fault tests share.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use tokio_util::sync::CancellationToken;

use super::{
    body, queue_sizes, trigger, unique, wait_until, whereabouts, Bridge, ConfigToml, Conn,
};

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
            exchange: unique("faults-ex"),
            routing_key: "faults".into(),
            queue: unique("faults-q"),
            url: url.to_string(),
            seen: Arc::default(),
            stop: CancellationToken::new(),
        };
        // The first connection must work; later ones may fail while a fault is on.
        let conn = me.connect().await.expect("RabbitMQ must run (see README)");
        me.consume_from(vec![me.url.clone()], Some(conn), true);
        me
    }

    /// A tally of the quorum queue [`Tally::quorum_queue`] that the bridge declares (on a
    /// private cluster, which takes the queue with it: [`Tally::cleanup`] is not needed).
    /// Nothing is consumed until [`Tally::consume_on`].
    pub fn quorum() -> Self {
        Self {
            exchange: unique("faults-ex"),
            routing_key: "faults".into(),
            queue: unique("faults-q"),
            url: String::new(),
            seen: Arc::default(),
            stop: CancellationToken::new(),
        }
    }

    /// [`Tally::quorum`], consumed from `urls` at once.
    pub fn on_cluster(urls: &[String]) -> Self {
        let me = Self::quorum();
        me.consume_on(urls);
        me
    }

    /// Consumes the queue (it may not exist yet) from the first of `urls`, moving on to the
    /// next whenever the connection fails. Nothing is declared: the queue is the bridge's.
    pub fn consume_on(&self, urls: &[String]) {
        self.consume_from(urls.to_vec(), None, false);
    }

    /// The `[[sinks.rabbit.declare]]` entry, inline, that declares this tally's exchange and
    /// its queue as a quorum queue.
    pub fn quorum_queue(&self) -> String {
        format!(
            "[{{ exchange = \"{}\", queue = \"{}\", queue_type = \"quorum\", binding_key = \"{}\" }}]",
            self.exchange, self.queue, self.routing_key
        )
    }

    /// Consumes in the background until `stop`, reconnecting to the next of `urls` (declaring
    /// the topology first if `declare`) whenever the connection fails.
    fn consume_from(&self, urls: Vec<String>, first: Option<Connection>, declare: bool) {
        let (exchange, queue, rk) = (
            self.exchange.clone(),
            self.queue.clone(),
            self.routing_key.clone(),
        );
        let (seen, stop) = (self.seen.clone(), self.stop.clone());
        tokio::spawn(async move {
            let mut conn = first;
            let mut next = 0;
            // Bounded by `stop`, which the test always fires on drop.
            while !stop.is_cancelled() {
                let c = match conn.take() {
                    Some(c) => Ok(c),
                    None => {
                        let url = &urls[next % urls.len()];
                        next += 1;
                        if declare {
                            connect(url, &exchange, &queue, &rk).await
                        } else {
                            Connection::connect(url, ConnectionProperties::default()).await
                        }
                    }
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
    }

    /// A [`FaultConfig`] for a bridge with metrics on `metrics_port`, draining `key` into this
    /// tally, with `trigger_extra` lines (workers, batch) in its trigger.
    pub fn config(&self, metrics_port: u16, key: &str, trigger_extra: &str) -> FaultConfig {
        let to = format!(
            "exchange = \"{}\"\nrouting_key = \"{}\"\n",
            self.exchange, self.routing_key
        );
        FaultConfig {
            settings: ConfigToml::base(metrics_port)
                .set_str("redis", "connect_timeout", "1s")
                .set_str("redis", "response_timeout", "1s")
                .set_str("shutdown", "timeout", "5s"),
            trigger: trigger("faults", key, "rabbit", &(to + trigger_extra)),
            lease: "2s",
            publish_timeout: "1s",
            max_attempts: 1000,
        }
    }

    async fn connect(&self) -> Result<Connection, lapin::Error> {
        connect(&self.url, &self.exchange, &self.queue, &self.routing_key).await
    }

    /// Distinct bodies received.
    pub fn distinct(&self) -> usize {
        self.seen.lock().unwrap().copies.len()
    }

    /// Asserts that at least `n` distinct messages arrive within `timeout`.
    pub async fn expect_distinct(&self, n: usize, timeout: Duration, bridge: &Bridge) {
        assert!(
            wait_until(timeout, || self.distinct() >= n).await,
            "{} of {n} delivered\n{}",
            self.distinct(),
            bridge.log()
        );
    }

    /// Asserts that messages `0..n` (padded by `pad`) all arrive within `timeout`; a failure
    /// says where each missing one is in Redis (see [`whereabouts`]), with the bridge's log.
    pub async fn expect_all(
        &self,
        n: usize,
        pad: usize,
        timeout: Duration,
        bridge: &Bridge,
        r: &mut Conn,
        key: &str,
    ) {
        if wait_until(timeout, || self.missing(n, pad).is_empty()).await {
            return;
        }
        let mut missing = Vec::new();
        for i in self.missing(n, pad).into_iter().take(10) {
            let place = whereabouts(r, key, &body(i, pad)).await;
            missing.push(format!("msg-{i:07}: {place}"));
        }
        panic!(
            "{} of {n} delivered; missing:\n{}\n{}",
            n - self.missing(n, pad).len(),
            missing.join("\n"),
            bridge.log()
        );
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

    /// What the broker still holds ready in the queue: tells a consumer that lags from a
    /// message that never reached the broker.
    pub async fn depth(&self) -> String {
        let conn = match Connection::connect(&self.url, ConnectionProperties::default()).await {
            Ok(conn) => conn,
            Err(e) => return format!("the queue could not be read: {e}"),
        };
        let read = match super::amqp::queue_depth(&conn, &self.queue).await {
            Ok(ready) => format!("{ready} ready in the queue"),
            Err(e) => format!("the queue could not be read: {e}"),
        };
        let _ = conn.close(200, "read").await;
        read
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
    super::bind_queue(&ch, queue, exchange, routing_key).await?;
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

/// The config of a fault test: one trigger `faults` publishing to a [`Tally`], short timeouts
/// so faults resolve in seconds, the shared servers unless told otherwise (a proxy, a private
/// server). `Display` writes the TOML.
pub struct FaultConfig {
    settings: ConfigToml,
    trigger: String,
    lease: &'static str,
    publish_timeout: &'static str,
    max_attempts: u32,
}

impl FaultConfig {
    /// Redis at `url` instead of the shared one.
    pub fn redis(mut self, url: &str) -> Self {
        self.settings = self.settings.set_str("redis", "url", url);
        self
    }

    /// RabbitMQ at `url` instead of the shared one.
    pub fn amqp(mut self, url: &str) -> Self {
        self.settings = self.settings.set_str("sinks.rabbit", "url", url);
        self
    }

    /// The nodes of a RabbitMQ cluster (`urls`) instead of the shared broker, with
    /// `declare` (inline `[[sinks.rabbit.declare]]` entries, e.g. [`Tally::quorum_queue`]).
    pub fn amqp_cluster(mut self, urls: &[String], declare: &str) -> Self {
        let list: Vec<String> = urls.iter().map(|u| super::quoted(u)).collect();
        self.settings = self
            .settings
            .unset("sinks.rabbit", "url")
            .set("sinks.rabbit", "urls", &format!("[{}]", list.join(", ")))
            .set("sinks.rabbit", "declare", declare);
        self
    }

    /// `key = value` (TOML) in the RabbitMQ sink's table.
    pub fn sink(mut self, key: &str, value: &str) -> Self {
        self.settings = self.settings.set("sinks.rabbit", key, value);
        self
    }

    /// Another `shutdown.timeout` (5 s by default).
    pub fn shutdown(mut self, timeout: &str) -> Self {
        self.settings = self.settings.set_str("shutdown", "timeout", timeout);
        self
    }

    /// Another lease and publish timeout (2 s and 1 s by default).
    pub fn lease(mut self, lease: &'static str, publish_timeout: &'static str) -> Self {
        (self.lease, self.publish_timeout) = (lease, publish_timeout);
        self
    }

    /// Another `max_attempts` (1000 by default: a fault never dead-letters).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
}

impl fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}lease = \"{}\"\npublish_timeout = \"{}\"\nmax_attempts = {}\n\
             backoff_initial = \"100ms\"\nbackoff_max = \"1s\"\n",
            self.settings, self.trigger, self.lease, self.publish_timeout, self.max_attempts
        )
    }
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

/// Samples for `window` that nothing is claimed: in-flight stays empty and the source set
/// keeps its size. Returns the source size seen.
pub async fn assert_not_claiming(
    r: &mut Conn,
    key: &str,
    window: Duration,
    bridge: &Bridge,
) -> i64 {
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
