//! An ingress's broker side: the exchange producers publish delayed messages to (with `x-delay`), a confirming publisher on it, and its queue's depth.

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use std::time::Duration;

use super::{amqp_url, poll, unique, Bridge};

/// Unique names for an ingress's exchange and queue, and a publisher's channel on the shared
/// RabbitMQ (or another broker's URL).
pub struct IngressBroker {
    pub exchange: String,
    pub queue: String,
    conn: Connection,
    channel: Channel,
}

impl IngressBroker {
    /// Fresh names on the shared RabbitMQ.
    pub async fn new() -> Self {
        Self::on(&amqp_url()).await
    }

    /// Fresh names on the broker at `url`.
    pub async fn on(url: &str) -> Self {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on loopback");
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Self {
            exchange: unique("ingress-ex"),
            queue: unique("ingress-q"),
            conn,
            channel,
        }
    }

    /// The trigger's `[triggers.ingress]` table (last in the trigger), plus `extra` lines.
    pub fn table(&self, extra: &str) -> String {
        format!(
            "[triggers.ingress]\nexchange = \"{}\"\nqueue = \"{}\"\n{extra}",
            self.exchange, self.queue
        )
    }

    /// Publishes `body` with `props` and routing key `rk`; waits for the broker's confirm.
    pub async fn publish(&self, rk: &str, body: &[u8], props: BasicProperties) {
        self.publish_many(std::iter::once((rk.to_string(), body.to_vec(), props)))
            .await;
    }

    /// Publishes each (routing key, body, properties), then waits for every confirm.
    pub async fn publish_many(
        &self,
        messages: impl IntoIterator<Item = (String, Vec<u8>, BasicProperties)>,
    ) {
        let mut confirms = Vec::new();
        for (rk, body, props) in messages {
            let confirm = self
                .channel
                .basic_publish(
                    &self.exchange,
                    &rk,
                    BasicPublishOptions::default(),
                    &body,
                    props.with_delivery_mode(2),
                )
                .await
                .expect("publish to the ingress exchange (declared by the bridge)");
            confirms.push(confirm);
        }
        for c in confirms {
            let confirmation = c.await.unwrap();
            assert!(confirmation.is_ack(), "the broker nacked a publish");
        }
    }

    /// Messages ready in the ingress queue (a passive declare); `None` if it does not exist.
    pub async fn depth(&self) -> Option<u32> {
        super::amqp::queue_depth(&self.conn, &self.queue).await.ok()
    }

    /// Asserts that the queue holds `n` messages within `timeout`, with `bridge`'s log if not.
    pub async fn expect_depth(&self, n: u32, timeout: Duration, bridge: &Bridge) {
        let every = Duration::from_millis(100);
        let (held, depth) = poll(
            timeout,
            every,
            async || self.depth().await,
            |d| *d == Some(n),
        )
        .await;
        assert!(
            held,
            "{n} messages wait at the broker, not {depth:?}\n{}",
            bridge.log()
        );
    }

    /// Declares the exchange, durable, of `kind`, before the bridge does.
    pub async fn declare_exchange(&self, kind: lapin::ExchangeKind) {
        let ch = self.conn.create_channel().await.unwrap();
        let durable = lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(&self.exchange, kind, durable, FieldTable::default())
            .await
            .unwrap();
    }

    /// Whether the exchange exists (a passive declare).
    pub async fn exchange_exists(&self) -> bool {
        let ch = self.conn.create_channel().await.unwrap();
        let passive = lapin::options::ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        ch.exchange_declare(
            &self.exchange,
            lapin::ExchangeKind::Fanout,
            passive,
            FieldTable::default(),
        )
        .await
        .is_ok()
    }

    /// Deletes the exchange alone.
    pub async fn delete_exchange(&self) {
        let ch = self.conn.create_channel().await.unwrap();
        ch.exchange_delete(&self.exchange, ExchangeDeleteOptions::default())
            .await
            .unwrap();
    }

    /// Deletes the exchange and queue.
    pub async fn delete(&self) {
        let ch = self.conn.create_channel().await.unwrap();
        let _ = ch
            .queue_delete(&self.queue, QueueDeleteOptions::default())
            .await;
        let ch = self.conn.create_channel().await.unwrap();
        let _ = ch
            .exchange_delete(&self.exchange, ExchangeDeleteOptions::default())
            .await;
    }
}

/// Properties with an `x-delay` header of `delay` and the other `headers`.
pub fn delayed(delay: AMQPValue, headers: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(ShortString::from("x-delay"), delay);
    for (name, value) in headers {
        h.insert(ShortString::from(*name), value.clone());
    }
    BasicProperties::default().with_headers(h)
}

/// A header of `props` as a whole number, if it is one.
pub fn int_header(props: &BasicProperties, name: &str) -> Option<i64> {
    match props.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}

/// A header of `props` as text, if it is a string.
pub fn text_header(props: &BasicProperties, name: &str) -> Option<String> {
    match props.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}
