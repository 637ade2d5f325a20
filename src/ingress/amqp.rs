//! The RabbitMQ ingress: declares the exchange and its queue, consumes with manual acks, stores each delivery and acks it only then; stops consuming while Redis does not take writes.

use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};
use tokio_util::sync::CancellationToken;

use super::{message, Ended, Ingress};
use crate::backoff::Backoff;
use crate::config::{ExchangeType, IngressConfig};
use crate::repeat::Repeated;
use crate::sink::amqp::AmqpSink;

/// Deliveries being stored at once (each one Redis call); the rest wait in the prefetch.
const STORES_AT_ONCE: usize = 64;
/// How often the queue's depth is read for the lag gauge, and the exchange looked for.
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Consumes `ingress`'s queue on `sink`'s broker until `stop`, reconnecting after a broker
/// failure and waiting out a Redis one with the messages left at the broker.
pub(super) async fn run(
    ctx: &Ingress,
    sink: &AmqpSink,
    ingress: &IngressConfig,
    stop: &CancellationToken,
) {
    let name = ctx.config.name();
    let backoff = Backoff {
        initial: Duration::from_millis(250),
        max: Duration::from_secs(10),
    };
    let mut failures = Repeated::default();
    while !stop.is_cancelled() {
        let purpose = format!("/ingress/{name}");
        let ended = match sink.consumer_connection(&purpose).await {
            Ok(conn) => {
                let ended = session(ctx, &conn, ingress, stop).await;
                ctx.consuming(false);
                let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(200, "bye")).await;
                ended
            }
            Err(e) => Err(Ended::Broker(e)),
        };
        let again = ctx.session_ended(ended, stop, |e| {
            if let Some(unlogged) = failures.failed() {
                tracing::warn!(trigger = name, error = %e, failures = failures.count(), unlogged,
                    "ingress: cannot consume from RabbitMQ, retrying");
            }
            backoff.delay(failures.count())
        })
        .await;
        if !again {
            return;
        }
    }
}

/// One connection's consumer: declares, consumes, stores and acks until `stop` (`Ok`), a
/// broker failure or a Redis one.
async fn session(
    ctx: &Ingress,
    conn: &Connection,
    ingress: &IngressConfig,
    stop: &CancellationToken,
) -> Result<(), Ended> {
    let name = ctx.config.name();
    let queue = ingress.queue_name();
    let channel = declare(conn, ingress, &queue, name).await?;
    channel
        .basic_qos(ingress.prefetch, BasicQosOptions::default())
        .await?;
    let tag = format!("delay-bridge/{name}");
    let mut consumer = channel
        .basic_consume(
            &queue,
            &tag,
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    ctx.consuming(true);
    tracing::info!(trigger = name, queue = %queue, exchange = %ingress.exchange_name(), "ingress: consuming");
    let lag_channel = conn.create_channel().await?;
    let mut lag = tokio::time::interval(LAG_EVERY);
    let mut storing = FuturesUnordered::new();
    let ended = loop {
        tokio::select! {
            _ = stop.cancelled() => break Ok(()),
            Some(done) = storing.next(), if !storing.is_empty() => {
                if let Err(e) = done {
                    break Err(e);
                }
            }
            delivery = consumer.next(), if storing.len() < STORES_AT_ONCE => match delivery {
                Some(Ok(d)) => storing.push(handle(ctx, d)),
                Some(Err(e)) => break Err(e.into()),
                None => break Err(Ended::Broker("the broker cancelled the consumer".into())),
            },
            _ = lag.tick() => {
                if let Err(e) = look(ctx, &lag_channel, ingress, &queue).await {
                    break Err(e);
                }
            }
        }
    };
    // No more deliveries; those taken finish storing and are acked (a Redis failure among
    // them leaves the rest unacked: the broker hands them out again).
    let _ = channel
        .basic_cancel(&tag, BasicCancelOptions::default())
        .await;
    let mut result = ended;
    while let Some(done) = storing.next().await {
        if let (Ok(()), Err(e)) = (&result, done) {
            result = Err(e);
        }
    }
    result
}

/// Stores one delivery, then acks it.
async fn handle(ctx: &Ingress, d: Delivery) -> Result<(), Ended> {
    let m = message::incoming(&d.data, d.routing_key.as_str(), &d.properties);
    ctx.store(&m).await.map_err(Ended::Redis)?;
    d.acker.ack(BasicAckOptions::default()).await?;
    Ok(())
}

/// Declares the exchange (durable; one that exists with another type, such as the
/// delayed-message plugin's, is used as it is) and the durable queue bound to it; returns
/// the channel to consume on.
async fn declare(
    conn: &Connection,
    ingress: &IngressConfig,
    queue: &str,
    trigger: &str,
) -> Result<Channel, Ended> {
    let kind = match ingress.exchange_type {
        ExchangeType::Direct => ExchangeKind::Direct,
        ExchangeType::Topic => ExchangeKind::Topic,
        ExchangeType::Fanout => ExchangeKind::Fanout,
        ExchangeType::Headers => ExchangeKind::Headers,
    };
    let mut channel = conn.create_channel().await?;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let declared = channel
        .exchange_declare(
            ingress.exchange_name(),
            kind.clone(),
            durable,
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(()) => {}
        Err(lapin::Error::ProtocolError(e)) if e.get_id() == 406 => {
            tracing::warn!(trigger, exchange = %ingress.exchange_name(), reply = %e.get_message(),
                "ingress: the exchange exists with other settings (the delayed-message plugin's?): binding to it as it is");
            channel = conn.create_channel().await?;
            exchange_exists(&channel, ingress.exchange_name(), kind).await?;
        }
        Err(e) => return Err(e.into()),
    }
    let mut args = FieldTable::default();
    if let Some(t) = ingress.queue_type {
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(t.as_str().into()),
        );
    }
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue, options, args)
        .await
        .map_err(|e| {
            Ended::Broker(format!(
                "declaring queue `{queue}` ({e}): a queue of that name with other arguments (its type) \
                 must be deleted, or ingress.queue_type made to match it"
            ))
        })?;
    for key in &ingress.binding_keys {
        channel
            .queue_bind(
                queue,
                ingress.exchange_name(),
                key,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    Ok(channel)
}

/// Reads the queue's ready messages into the lag gauge, and checks that the exchange is
/// still there (passive declares): one deleted, or the queue, ends the session, and the
/// next declares them again (the plugin's exchange deleted in a migration becomes the
/// bridge's).
async fn look(
    ctx: &Ingress,
    channel: &Channel,
    ingress: &IngressConfig,
    queue: &str,
) -> Result<(), Ended> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = channel
        .queue_declare(queue, passive, FieldTable::default())
        .await?;
    ctx.metrics
        .ingress
        .lag
        .with_label_values(&[ctx.config.name()])
        .set(i64::from(q.message_count()));
    exchange_exists(channel, ingress.exchange_name(), ExchangeKind::Fanout)
        .await
        .map_err(|e| Ended::Broker(format!("exchange `{}`: {e}", ingress.exchange_name())))
}

/// Checks that the exchange `name` is there (a passive declare), whatever its settings.
async fn exchange_exists(
    channel: &Channel,
    name: &str,
    kind: ExchangeKind,
) -> Result<(), lapin::Error> {
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    channel
        .exchange_declare(name, kind, passive, FieldTable::default())
        .await
}
