//! Declaring an AMQP sink's exchanges and queues on every connect, and the refusal that
//! stops the bridge: an exchange or queue that exists with other settings.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ExchangeKind};

use crate::config::{AmqpDeclare, ExchangeType};

/// RabbitMQ refused to declare an exchange or queue as configured (406 PRECONDITION_FAILED):
/// one of that name exists with other settings, such as a classic queue where `queue_type =
/// "quorum"` is configured. Reconnecting cannot change that, so the bridge stops with it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("sink `{sink}`: RabbitMQ refused to declare {object} as configured ({reply}); {advice}")]
pub struct TopologyRefused {
    /// The sink's name.
    pub sink: String,
    /// What was refused, e.g. ``queue `orders.due` ``.
    pub object: String,
    /// RabbitMQ's reply text, which names the setting that differs.
    pub reply: String,
    /// What an operator can do about it.
    advice: String,
}

/// Why declaring failed.
pub(super) enum DeclareError {
    /// A 406 reply: the object exists with other settings.
    Refused(TopologyRefused),
    /// The node refused the login (ACCESS_REFUSED): the user, password or vhost is wrong.
    LoginRefused(String),
    /// Anything else (the connection or channel failed, or it timed out): another node or
    /// attempt may do.
    Failed(String),
}

/// Declares every `[[sinks.NAME.declare]]` entry on one channel: durable exchanges, and
/// durable queues (of the configured type) bound to them.
pub(super) async fn declare(
    sink: &str,
    conn: &Connection,
    declare: &[AmqpDeclare],
) -> Result<(), DeclareError> {
    if declare.is_empty() {
        return Ok(());
    }
    let channel = conn.create_channel().await.map_err(failed)?;
    for d in declare {
        let kind = match d.kind {
            ExchangeType::Direct => ExchangeKind::Direct,
            ExchangeType::Topic => ExchangeKind::Topic,
            ExchangeType::Fanout => ExchangeKind::Fanout,
            ExchangeType::Headers => ExchangeKind::Headers,
        };
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let exchange = || {
            Refusal {
            sink,
            object: format!("exchange `{}`", d.exchange),
            advice: format!(
                "an exchange of that name exists with another type or durability: make `kind` in \
                 [[sinks.{sink}.declare]] match it, or delete the exchange so that the bridge declares it"
            ),
        }
        };
        channel
            .exchange_declare(&d.exchange, kind, durable, FieldTable::default())
            .await
            .map_err(|e| exchange().of(e))?;
        let Some(queue) = &d.queue else {
            continue;
        };
        let queue_refusal = || Refusal {
            sink,
            object: format!("queue `{queue}`"),
            advice: format!(
                "a queue of that name exists with other arguments (its type, for one): make \
                 [[sinks.{sink}.declare]] match it (queue_type), or move its messages elsewhere \
                 and delete it so that the bridge declares it"
            ),
        };
        // Quorum queues and streams must be durable, neither exclusive nor auto-delete: what
        // every queue declared here is.
        let opts = QueueDeclareOptions {
            durable: true,
            exclusive: false,
            auto_delete: false,
            ..Default::default()
        };
        let mut args = FieldTable::default();
        if let Some(t) = d.queue_type {
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString(t.as_str().into()),
            );
        }
        channel
            .queue_declare(queue, opts, args)
            .await
            .map_err(|e| queue_refusal().of(e))?;
        let binding = d.binding_key.as_deref().unwrap_or(queue);
        channel
            .queue_bind(
                queue,
                &d.exchange,
                binding,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| queue_refusal().of(e))?;
    }
    channel.close(200, "declared").await.map_err(failed)?;
    Ok(())
}

/// What a 406 on one declaration is reported as.
struct Refusal<'a> {
    sink: &'a str,
    object: String,
    advice: String,
}

impl Refusal<'_> {
    /// A 406 is this refusal; any other error is a failure worth another attempt.
    fn of(self, e: lapin::Error) -> DeclareError {
        match e {
            lapin::Error::ProtocolError(p) if p.get_id() == 406 => {
                DeclareError::Refused(TopologyRefused {
                    sink: self.sink.to_string(),
                    object: self.object,
                    reply: p.get_message().to_string(),
                    advice: self.advice,
                })
            }
            e => failed(e),
        }
    }
}

/// An error another attempt may not meet.
pub(super) fn failed(e: lapin::Error) -> DeclareError {
    DeclareError::Failed(e.to_string())
}
