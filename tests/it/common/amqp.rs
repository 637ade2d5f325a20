//! AMQP helpers: a capturing consumer on the shared RabbitMQ and where that broker is.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::{amqp_url, now_ms, socket_addr, unique, Bridge};

/// Messages ready in `queue` (a passive declare on a channel of its own, closed after), or
/// why they cannot be counted (no such queue, or the connection cannot open a channel).
pub async fn queue_depth(conn: &Connection, queue: &str) -> Result<u32, String> {
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| format!("no channel: {e}"))?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let read = ch
        .queue_declare(queue, passive, FieldTable::default())
        .await
        .map(|q| q.message_count())
        .map_err(|e| e.to_string());
    let _ = ch.close(200, "read").await;
    read
}

/// Declares the exchange (name, kind, options) and the queue (name, options) on `ch`, and
/// binds the queue to the exchange with `routing_key`.
pub async fn declare_bound_queue(
    ch: &Channel,
    (exchange, kind, exchange_options): (&str, ExchangeKind, ExchangeDeclareOptions),
    (queue, queue_options): (&str, QueueDeclareOptions),
    routing_key: &str,
) {
    ch.exchange_declare(exchange, kind, exchange_options, FieldTable::default())
        .await
        .unwrap();
    ch.queue_declare(queue, queue_options, FieldTable::default())
        .await
        .unwrap();
    bind_queue(ch, queue, exchange, routing_key).await.unwrap();
}

/// Binds `queue` to `exchange` with `routing_key`.
pub async fn bind_queue(
    ch: &Channel,
    queue: &str,
    exchange: &str,
    routing_key: &str,
) -> lapin::Result<()> {
    let options = QueueBindOptions::default();
    ch.queue_bind(queue, exchange, routing_key, options, FieldTable::default())
        .await
}

/// The shared RabbitMQ's address, for a proxy in front of it.
pub fn shared_amqp_addr() -> SocketAddr {
    socket_addr(&amqp_url(), 5672)
}

/// One message received by a test consumer.
#[derive(Debug, Clone)]
pub struct Received {
    /// Body bytes.
    pub body: Vec<u8>,
    /// Local receive time, epoch ms.
    pub at_ms: i64,
    /// `x-delay-due-ms` header.
    pub due_ms: Option<i64>,
    /// `x-delay-attempt` header.
    pub attempt: Option<i64>,
    /// `x-delay-trigger` header.
    pub trigger: Option<String>,
    /// Routing key it was published with.
    pub routing_key: String,
    /// AMQP delivery mode (2 = persistent).
    pub delivery_mode: Option<u8>,
    /// AMQP message id.
    pub message_id: Option<String>,
    /// Every property and header as received.
    pub properties: lapin::BasicProperties,
}

/// A queue bound to a fresh exchange, consumed in the background into `received`.
pub struct AmqpCapture {
    pub exchange: String,
    pub queue: String,
    pub routing_key: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Why the consumer stopped (its stream ended or failed), once it did.
    ended: Arc<Mutex<Option<String>>>,
    conn: Connection,
}

impl AmqpCapture {
    /// Declares a direct exchange and an exclusive queue bound with `routing_key`, then consumes.
    pub async fn start(routing_key: &str) -> Self {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on loopback (see README)");
        let ch = conn.create_channel().await.unwrap();
        let exchange = unique("ex");
        let queue = unique("q");
        let exchange_options = ExchangeDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        let queue_options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..Default::default()
        };
        declare_bound_queue(
            &ch,
            (&exchange, ExchangeKind::Direct, exchange_options),
            (&queue, queue_options),
            routing_key,
        )
        .await;
        let mut consumer = ch
            .basic_consume(
                &queue,
                "test",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(Mutex::new(None));
        let (sink, why) = (received.clone(), ended.clone());
        tokio::spawn(async move {
            let end = loop {
                let d = match consumer.next().await {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => break format!("failed: {e}"),
                    None => break "its stream ended".to_string(),
                };
                let headers = d.properties.headers().clone().unwrap_or_default();
                let h = headers.inner();
                let int = |k: &str| match h.get(k) {
                    Some(AMQPValue::LongLongInt(n)) => Some(*n),
                    Some(AMQPValue::LongInt(n)) => Some(i64::from(*n)),
                    _ => None,
                };
                let r = Received {
                    body: d.data.clone(),
                    at_ms: now_ms(),
                    due_ms: int("x-delay-due-ms"),
                    attempt: int("x-delay-attempt"),
                    trigger: match h.get("x-delay-trigger") {
                        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                        _ => None,
                    },
                    routing_key: d.routing_key.to_string(),
                    delivery_mode: *d.properties.delivery_mode(),
                    message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
                    properties: d.properties.clone(),
                };
                sink.lock().unwrap().push(r);
                let _ = d.ack(BasicAckOptions::default()).await;
            };
            *why.lock().unwrap() = Some(end);
        });
        Self {
            exchange,
            queue,
            routing_key: routing_key.to_string(),
            received,
            ended,
            conn,
        }
    }

    /// For a failure message: whether the consumer still runs, and how many messages wait
    /// in the queue unconsumed (the broker's count, read on a channel of its own).
    pub async fn state(&self) -> String {
        let consumer = match &*self.ended.lock().unwrap() {
            Some(why) => format!("the capture's consumer stopped ({why})"),
            None => "the capture's consumer runs".to_string(),
        };
        let ready = match queue_depth(&self.conn, &self.queue).await {
            Ok(n) => format!("{n} messages wait in its queue"),
            Err(e) => format!("its queue cannot be read: {e}"),
        };
        format!("{consumer}; {ready}")
    }

    /// Binds the capture's (exclusive) queue to another exchange, on the queue's own connection.
    pub async fn bind(&self, exchange: &str, routing_key: &str) {
        let ch = self.conn.create_channel().await.unwrap();
        bind_queue(&ch, &self.queue, exchange, routing_key)
            .await
            .unwrap();
        let _ = ch.close(200, "bound").await;
    }

    /// The lines of a trigger that publish to this capture: its exchange and routing key.
    pub fn destination(&self) -> String {
        format!(
            "exchange = \"{}\"\nrouting_key = \"{}\"\n",
            self.exchange, self.routing_key
        )
    }

    /// Number of messages received so far.
    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// Asserts that `n` messages arrive from `bridge` within `timeout`.
    pub async fn expect_arrivals(&self, n: usize, timeout: Duration, bridge: &Bridge) {
        bridge.expect_arrivals(n, timeout, || self.count()).await;
    }

    /// A copy of everything received so far.
    pub fn snapshot(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// How many times each body was received.
    pub fn tally(&self) -> HashMap<Vec<u8>, usize> {
        let mut seen = HashMap::new();
        for m in self.received.lock().unwrap().iter() {
            *seen.entry(m.body.clone()).or_default() += 1;
        }
        seen
    }
}

/// SIGKILLs `bridge` once `capture` holds 300 messages, asserts the kill landed mid-drain,
/// restarts it, and waits until every message `0..n` (see [`super::body`]) has arrived at
/// least once; prints the duplicates as `what`. Returns the restarted bridge.
pub async fn sigkill_mid_drain(
    mut bridge: Bridge,
    capture: &AmqpCapture,
    n: usize,
    what: &str,
) -> Bridge {
    capture
        .expect_arrivals(300, Duration::from_secs(30), &bridge)
        .await;
    bridge.signal(9);
    assert!(bridge.wait_exit(Duration::from_secs(5)).await.is_some());
    let before = capture.count();
    assert!(before < n, "the kill must land mid-drain");
    let bridge = bridge.restart();
    if !super::wait_until(Duration::from_secs(60), || capture.tally().len() >= n).await {
        panic!(
            "only {} of {n} delivered; {}\n{}",
            capture.tally().len(),
            capture.state().await,
            bridge.log()
        );
    }
    let seen = capture.tally();
    let duplicates: usize = seen.values().map(|c| c - 1).sum();
    println!("{what}: {n} messages, lost 0, duplicates {duplicates} (killed after {before})");
    for i in 0..n {
        assert!(seen.contains_key(&super::body(i, 0)), "lost {i}");
    }
    bridge
}

/// Declares the direct exchange `name` on a connection of its own, as an operator would;
/// the channel deletes it again.
pub async fn declare_direct_exchange(name: &str) -> lapin::Channel {
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .expect("RabbitMQ must run on loopback (see README)");
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        name,
        lapin::ExchangeKind::Direct,
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    ch
}
