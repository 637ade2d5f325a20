//! Sinks: the brokers messages are forwarded to, and the errors a publish can end in.

pub(crate) mod amqp;
pub(crate) mod blame;
mod error;
pub(crate) mod http;
pub mod kafka;
mod window;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{self, Destination, SinkConfig};
use crate::envelope::Properties;
pub(crate) use crate::proof::Confirmed;
pub use crate::wire::MessageId;
pub(crate) use error::PublishError;

/// One message to publish: the member and what the headers say about it.
#[derive(Debug, Clone, Copy)]
pub struct OutMessage<'a> {
    /// The body, byte for byte.
    pub payload: &'a [u8],
    /// The member: the body itself in inline payload mode, the id in hash mode.
    pub member: &'a [u8],
    /// Due time, epoch ms.
    pub due_ms: i64,
    /// 1 for the first delivery.
    pub attempt: u32,
    /// Stable id of the member (hex), for consumers that de-duplicate.
    pub id: &'a str,
    /// AMQP: this message's routing key, when the route takes it from the payload.
    pub routing_key: Option<&'a str>,
    /// What the message's envelope asks for (headers, properties, Kafka key), if it has one.
    pub properties: Option<&'a Properties>,
    /// HTTP: this message's URL, when it chose its own (envelope or `url_pointer`).
    pub url: Option<&'a str>,
    /// Kafka: this message's topic, when it chose its own (checked against `allowed_topics`).
    pub topic: Option<&'a str>,
}

/// What became of one published message.
pub(crate) type Outcome = Result<Confirmed, PublishError>;

/// Where a publisher reports each message the broker confirmed, by its position in the
/// batch and with the proof, the moment the confirmation arrives: the worker can settle it
/// before the rest of the batch is confirmed, and only with the proof in hand.
pub(crate) type Confirms = tokio::sync::mpsc::UnboundedSender<(usize, Confirmed)>;

/// One batch to publish: for which trigger (its header), the messages, how long the broker
/// may take to confirm them, what cuts that wait short, and where each confirmation is
/// reported the moment it arrives (see [`Confirms`]).
#[derive(Clone, Copy)]
pub struct Batch<'b, 'm> {
    pub trigger: &'b str,
    pub messages: &'b [OutMessage<'m>],
    pub timeout: Duration,
    pub abort: &'b CancellationToken,
    pub confirms: Option<&'b Confirms>,
}

impl Batch<'_, '_> {
    /// One result per message, each a `Timeout` until the broker says otherwise.
    pub fn unconfirmed(&self) -> Vec<Outcome> {
        vec![Err(PublishError::Timeout); self.messages.len()]
    }
}

/// Why a sink cannot work as configured: waiting or reconnecting will not help, so the bridge
/// stops with it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Fatal {
    /// RabbitMQ refused to declare the configured exchanges or queues.
    #[error(transparent)]
    Topology(#[from] amqp::TopologyRefused),
}

/// A configured broker connection shared by the workers of every trigger that uses it.
pub enum Sink {
    /// RabbitMQ (boxed: it holds a connection's state, the Kafka variant a handle).
    Amqp(Box<amqp::AmqpSink>),
    /// Kafka.
    Kafka(kafka::KafkaSink),
    /// HTTP endpoints.
    Http(http::HttpSink),
}

impl Sink {
    /// Builds the sink from its validated section; connecting happens lazily and in
    /// [`Sink::supervise`].
    pub fn new(config: &config::Sink) -> anyhow::Result<Arc<Sink>> {
        let name = config.name();
        Ok(Arc::new(match config.settings() {
            SinkConfig::Amqp(c) => {
                Sink::Amqp(Box::new(amqp::AmqpSink::new(name, c, config.tls())?))
            }
            SinkConfig::Kafka(c) => Sink::Kafka(kafka::KafkaSink::new(name, c)?),
            SinkConfig::Http(c) => Sink::Http(http::HttpSink::new(name, c, &config.tls())?),
        }))
    }

    /// The sink's configured name.
    pub fn name(&self) -> &str {
        match self {
            Sink::Amqp(s) => s.name(),
            Sink::Kafka(s) => s.name(),
            Sink::Http(s) => s.name(),
        }
    }

    /// True while the broker is connected.
    pub fn is_up(&self) -> bool {
        match self {
            Sink::Amqp(s) => s.is_up(),
            Sink::Kafka(s) => s.is_up(),
            Sink::Http(s) => s.is_up(),
        }
    }

    /// Why the sink is not up, for `/readyz`.
    pub fn why_down(&self) -> String {
        match self {
            Sink::Http(s) => s.why_down(),
            _ => "not connected".into(),
        }
    }

    /// Keeps the connection alive (reconnecting with capped backoff) until `cancel`; returns
    /// early only when the sink cannot work as configured, and the bridge must stop.
    pub async fn supervise(
        &self,
        metrics: crate::metrics::Metrics,
        cancel: CancellationToken,
    ) -> Result<(), Fatal> {
        match self {
            Sink::Amqp(s) => Ok(s.supervise(metrics, cancel).await?),
            Sink::Kafka(s) => {
                s.supervise(metrics, cancel).await;
                Ok(())
            }
            Sink::Http(s) => {
                s.supervise(metrics, cancel).await;
                Ok(())
            }
        }
    }

    /// A publisher for one worker, bound to `destination`; fails while the broker is
    /// unreachable or the route's exchange is missing. A trigger's destinations were resolved
    /// against the kind of the sink it names when the configuration was loaded, so a worker
    /// never asks a sink for a route of the other kind.
    pub async fn publisher(&self, destination: &Destination) -> Result<Publisher, PublishError> {
        match (self, destination) {
            (Sink::Amqp(s), Destination::Amqp(route)) => {
                Ok(Publisher::Amqp(Box::new(s.publisher(route).await?)))
            }
            (Sink::Kafka(s), Destination::Kafka(route)) => {
                Ok(Publisher::Kafka(s.publisher(route)?))
            }
            (Sink::Http(s), Destination::Http(route)) => Ok(Publisher::Http(s.publisher(route)?)),
            _ => Err(PublishError::Connection(format!(
                "sink {} cannot publish to {destination}",
                self.name()
            ))),
        }
    }

    /// The bridge's routes are now `destinations` (after a reload): an HTTP sink forgets
    /// what it knew of endpoints no route names any more.
    pub fn keep_endpoints(&self, destinations: &[&Destination]) {
        if let Sink::Http(s) = self {
            s.keep_endpoints(destinations);
        }
    }

    /// Called when a worker's publisher broke: the AMQP connection it used is dropped (and
    /// re-made on the next call), unless it was already replaced.
    pub async fn reset(&self, broken: &Publisher) {
        if let (Sink::Amqp(s), Publisher::Amqp(p)) = (self, broken) {
            s.reset(p).await;
        }
    }

    /// Closes the broker connection (an AMQP sink reconnects if asked again).
    pub async fn close(&self) {
        if let Sink::Amqp(s) = self {
            s.close().await;
        }
    }

    /// Waits for in-flight Kafka records to be delivered, up to `timeout` (no-op for AMQP).
    pub async fn flush(&self, timeout: Duration) {
        if let Sink::Kafka(s) = self {
            s.flush(timeout).await;
        }
    }
}

/// A worker's handle for publishing batches with confirmation; clones publish on the same
/// channel or producer.
#[derive(Clone)]
pub enum Publisher {
    /// An AMQP channel in confirm mode (boxed: it holds the channel and the route).
    Amqp(Box<amqp::AmqpPublisher>),
    /// A Kafka producer handle.
    Kafka(kafka::KafkaPublisher),
    /// An HTTP client bound to a route.
    Http(http::HttpPublisher),
}

impl Publisher {
    /// Publishes every message to the publisher's route and waits for each confirmation, at
    /// most `timeout`, or until `abort` fires. Returns one outcome per message, in order;
    /// each confirmation is also sent to `confirms` as it arrives.
    pub async fn publish_batch(&mut self, batch: Batch<'_, '_>) -> Vec<Outcome> {
        match self {
            Publisher::Amqp(p) => p.publish_batch(batch).await,
            Publisher::Kafka(p) => p.publish_batch(batch).await,
            Publisher::Http(p) => p.publish_batch(batch).await,
        }
    }

    /// False once the underlying channel is closed; the worker then asks for a new publisher.
    pub fn is_usable(&self) -> bool {
        match self {
            Publisher::Amqp(p) => p.is_usable(),
            Publisher::Kafka(p) => p.is_usable(),
            Publisher::Http(p) => p.is_usable(),
        }
    }

    /// Takes the publisher out of use after its destination failed batch after batch on a
    /// connection that stayed up: an AMQP channel is closed (no publisher is given it again,
    /// and the next gets a fresh one); the other sinks' publishers hold nothing to renew and
    /// stay in use. True when it was retired.
    pub async fn retire(&self) -> bool {
        match self {
            Publisher::Amqp(p) => {
                p.retire().await;
                true
            }
            Publisher::Kafka(_) | Publisher::Http(_) => false,
        }
    }
}

/// Records one message's result, reporting a confirmation to `confirms` at once.
fn record_outcome(results: &mut [Outcome], i: usize, r: Outcome, confirms: Option<&Confirms>) {
    if let (Ok(proof), Some(c)) = (&r, confirms) {
        // The receiver is gone only when nobody settles early: the result still counts.
        let _ = c.send((i, proof.clone()));
    }
    results[i] = r;
}

/// Collects per-message results while confirmations arrive, with a deadline and an abort.
async fn await_confirms<F>(
    results: &mut [Outcome],
    pending: F,
    timeout: Duration,
    abort: &CancellationToken,
    confirms: Option<&Confirms>,
) where
    F: futures_util::Stream<Item = (usize, Outcome)>,
{
    use futures_util::StreamExt;
    let deadline = tokio::time::sleep(timeout);
    // Made once: one made per answer would register with the token again each time.
    let aborted = abort.cancelled();
    tokio::pin!(deadline);
    tokio::pin!(aborted);
    tokio::pin!(pending);
    loop {
        tokio::select! {
            next = pending.next() => match next {
                Some((i, r)) => record_outcome(results, i, r, confirms),
                None => return,
            },
            _ = &mut deadline => return,
            _ = &mut aborted => {
                for r in results.iter_mut() {
                    if matches!(r, Err(PublishError::Timeout)) {
                        *r = Err(PublishError::Aborted);
                    }
                }
                return;
            }
        }
    }
}
