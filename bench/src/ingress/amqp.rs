//! The ingress phase on RabbitMQ: the backlog published to the ingress exchange while the bridge is stopped, and the ceiling: the same messages drained from a queue of the same kind by a plain lapin consumer acking each one.

use anyhow::Context;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::time::Instant;

use super::super::amqp::{consume, toml_str};
use super::super::process::free_port;
use super::super::report::IngressRun;
use super::super::{redis_ops, tally, Bench};
use super::{due_after_ms, due_of, Backlog, Rate, STOP_TIMEOUT};

/// Publishes awaiting their confirms at once.
const WINDOW: u64 = 1_000;
/// Unacknowledged deliveries the bridge and the ceiling's consumer may hold.
const PREFETCH: u16 = 2_000;

impl Bench {
    /// The RabbitMQ ingress: a backlog in the ingress queue taken in by the bridge, next to
    /// the same backlog drained by a plain consumer.
    pub(super) async fn amqp_ingress(&self) -> anyhow::Result<IngressRun> {
        let n = self.args.ingress_messages;
        eprintln!("bench: ingress (AMQP), {n} delayed messages waiting in the ingress queue");
        let key = self.new_key("ingress");
        let exchange = format!("delay-bridge-bench-{}.ingress", self.run_id);
        let port = free_port()?;
        let lines = format!(
            "exchange = {}\nprefetch = {PREFETCH}\n",
            toml_str(&exchange)
        );
        let toml = self.ingress_toml(&key, &lines, port);
        let conn = Connection::connect(&self.args.amqp_url, ConnectionProperties::default())
            .await
            .context("connecting the ingress publisher")?;
        let ceiling_queue = format!("{exchange}.ceiling");
        let result = self
            .amqp_backlog(&conn, &toml, port, &exchange, &ceiling_queue, n)
            .await;
        let ch = conn.create_channel().await?;
        for queue in [format!("{exchange}.ingress"), ceiling_queue] {
            ch.queue_delete(&queue, QueueDeleteOptions::default())
                .await?;
        }
        ch.exchange_delete(&exchange, ExchangeDeleteOptions::default())
            .await?;
        let _ = conn.close(200, "done").await;
        redis_ops::unlink_queue(&mut self.conn.clone(), &key).await?;
        result
    }

    async fn amqp_backlog(
        &self,
        conn: &Connection,
        toml: &str,
        port: u16,
        exchange: &str,
        ceiling_queue: &str,
        n: u64,
    ) -> anyhow::Result<IngressRun> {
        // The bridge declares the ingress exchange and queue; stopped, it leaves the queue to
        // hold what is published meanwhile.
        self.start_ingress_bridge(toml, port)
            .await?
            .stop(STOP_TIMEOUT)
            .await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare(ceiling_queue, durable, FieldTable::default())
            .await?;
        let base = self.next_base();
        let due = tally::now_us() / 1000 + due_after_ms(n);
        let size = self.args.payload_bytes;
        publish(&ch, "", ceiling_queue, base, n, due, size).await?;
        let ceiling_msg_per_s = drain(conn, ceiling_queue, n).await?;
        self.tally.reset(base, n);
        // Each message keeps its routing key: the bench queue's, as the route's.
        let rk = format!("delay-bridge-bench-{}", self.run_id);
        let publish_msg_per_s = publish(&ch, exchange, &rk, base, n, due, size).await?;
        let backlog = Backlog {
            publish_msg_per_s,
            ceiling_msg_per_s,
            ceiling_client: "lapin consumer, an ack per message",
        };
        self.take_in(toml, port, n, backlog, "AMQP").await
    }
}

/// Publishes `n` persistent messages (sequence numbers from `base`, the first due at `due`
/// epoch ms, the rest after it as [`due_of`] says)
/// to `exchange` with `routing_key`, a window of confirms at a time; returns msg/s.
async fn publish(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    base: u64,
    n: u64,
    due: i64,
    size: usize,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let mut confirms = Vec::new();
        for seq in sent..(sent + WINDOW).min(n) {
            let mut headers = FieldTable::default();
            headers.insert(
                ShortString::from("x-delay-until"),
                AMQPValue::LongLongInt(due_of(due, seq)),
            );
            let props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_headers(headers);
            let body = tally::payload(base + seq, size);
            let options = BasicPublishOptions::default();
            confirms.push(
                ch.basic_publish(exchange, routing_key, options, &body, props)
                    .await?,
            );
        }
        for c in confirms {
            c.await?;
        }
        sent = (sent + WINDOW).min(n);
    }
    Ok(n as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

/// Consumes `n` messages from `queue` with manual acks, one per message, [`PREFETCH`] at a
/// time: msg/s from the first delivery to the last.
async fn drain(conn: &Connection, queue: &str, n: u64) -> anyhow::Result<f64> {
    let ch = conn.create_channel().await?;
    let mut consumer = consume(&ch, queue, "delay-bridge-bench-ceiling", PREFETCH).await?;
    let mut rate = Rate::new();
    let mut taken = 0;
    let deadline = Instant::now() + std::time::Duration::from_secs(60 + n / 1_000);
    while taken < n {
        let next = tokio::time::timeout_at(deadline, consumer.next())
            .await
            .with_context(|| format!("the ceiling consumer received {taken} of {n}"))?;
        let delivery = next.context("the ceiling consumer was cancelled")??;
        delivery.ack(BasicAckOptions::default()).await?;
        taken += 1;
        rate.saw(Instant::now(), taken);
    }
    let _ = ch.close(200, "done").await;
    Ok(rate.per_second(Instant::now(), taken))
}
