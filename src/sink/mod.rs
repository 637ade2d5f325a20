//! Sinks: the brokers messages are forwarded to, and the errors a publish can end in.

pub mod amqp;
pub mod kafka;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{Destination, SinkConfig};
use crate::envelope::Properties;
pub use crate::wire::MessageId;

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
}

/// Proof that the broker confirmed one message. Only the sinks construct it (the
/// constructor is private to this module and its children), so nothing else can ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirmed(());

impl Confirmed {
    /// The broker has the message: an AMQP ack without a return, a Kafka delivery report.
    fn by_broker() -> Self {
        Self(())
    }

    /// A confirmation for unit tests of code that consumes outcomes.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self(())
    }
}

/// What became of one published message.
pub type Outcome = Result<Confirmed, PublishError>;

/// Where a publisher reports each message the broker confirmed, by its position in the
/// batch and with the proof, the moment the confirmation arrives: the worker can settle it
/// before the rest of the batch is confirmed, and only with the proof in hand.
pub type Confirms = tokio::sync::mpsc::UnboundedSender<(usize, Confirmed)>;

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

/// Why a message was not confirmed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// The broker refused the message (AMQP basic.nack).
    #[error("the broker nacked the message")]
    Nack,
    /// The broker could not route the message (AMQP basic.return of a mandatory message).
    #[error("unroutable: {0}")]
    Returned(String),
    /// No confirmation within the publish timeout.
    #[error("no confirmation within the publish timeout")]
    Timeout,
    /// The connection or channel failed; the message may or may not have reached the broker.
    #[error("broker connection failed: {0}")]
    Connection(String),
    /// Kafka delivery report error.
    #[error("kafka delivery failed: {message}")]
    Kafka {
        /// Bounded snake_case name of the Kafka error code.
        code: String,
        /// Human-readable error.
        message: String,
        /// Retrying cannot help (too large, unknown topic, not authorized).
        permanent: bool,
    },
    /// The AMQP exchange does not exist: nothing is claimed until an operator declares it.
    #[error("exchange `{0}` does not exist")]
    NoExchange(String),
    /// Larger than the trigger's `max_message_bytes`.
    #[error("message is larger than max_message_bytes")]
    TooLarge,
    /// The payload cannot be published as configured.
    #[error("bad payload: {0}")]
    BadPayload(String),
    /// Hash payload mode: the id has no body in the bodies hash (`HSET` it, then requeue).
    #[error("the id has no body in the bodies hash")]
    MissingBody,
    /// The payload is not a valid envelope (`format = "envelope"`).
    #[error("bad envelope: {0}")]
    BadEnvelope(String),
    /// The message's own routing key is not in the trigger's `allowed_routing_keys`.
    #[error("routing key `{0}` is not allowed by allowed_routing_keys")]
    RouteNotAllowed(String),
    /// Claimed after its expiry (`expire_after`, or the envelope's `expires_at_ms`).
    #[error("expired before it could be delivered")]
    Expired,
    /// The shutdown deadline passed before the broker answered.
    #[error("shutdown deadline passed before the broker confirmed")]
    Aborted,
    /// RabbitMQ blocked the connection (a memory or disk alarm): it takes no messages now.
    #[error("the broker blocked the connection (resource alarm)")]
    Blocked,
    /// The broker closed the channel or the connection on this message when it was
    /// published alone on a fresh channel (e.g. 406 for a body over `max_message_size`, 403
    /// for a routing key outside the user's topic permissions), while other messages went
    /// through: the message's fault. Counts an attempt.
    #[error("the broker refused the message: {code} {text}")]
    BrokerRefused {
        /// The AMQP reply code of the close.
        code: u16,
        /// The broker's reply text.
        text: String,
    },
    /// The broker closed the channel or the connection while this message awaited its
    /// confirmation, and it has not been published alone since: it may not be to blame.
    #[error("the broker closed the channel: {code} {text}")]
    Closed {
        /// The AMQP reply code of the close.
        code: u16,
        /// The broker's reply text.
        text: String,
    },
    /// Every message of the batch was refused, each alone on a fresh channel (the exchange
    /// deleted, the user's permissions revoked): the sink's fault, not the messages'.
    #[error("the broker refuses every message of this route: {code} {text}")]
    SinkRefused {
        /// The AMQP reply code of the close.
        code: u16,
        /// The broker's reply text.
        text: String,
    },
    /// The message's properties and headers do not fit in one AMQP frame of the size the
    /// broker negotiated (`frame_max`): the broker would close the whole connection on it.
    #[error("{0}")]
    FrameTooLarge(String),
}

/// Why a sink cannot work as configured: waiting or reconnecting will not help, so the bridge
/// stops with it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Fatal {
    /// RabbitMQ refused to declare the configured exchanges or queues.
    #[error(transparent)]
    Topology(#[from] amqp::TopologyRefused),
}

/// What the worker does with a message that was not confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Count an attempt and retry after a backoff (dead-letter after `max_attempts`).
    Retry,
    /// Dead-letter now: retrying cannot help.
    DeadLetter,
    /// Return unattempted with its original due time: the sink, not the message, failed.
    PutBack,
}

/// Retry and dead-letter reasons an AMQP route can produce (their counters start at 0).
const AMQP_REASONS: &[&str] = &[
    "nack",
    "unroutable",
    "timeout",
    "broker_refused",
    "too_large",
    "bad_payload",
    "missing_body",
    "bad_envelope",
    "route_not_allowed",
    "expired",
];
/// The same for a Kafka route (other `kafka_<error>` reasons appear when they happen).
const KAFKA_REASONS: &[&str] = &[
    "timeout",
    "too_large",
    "missing_body",
    "bad_envelope",
    "expired",
    "kafka_message_size_too_large",
    "kafka_invalid_message_size",
    "kafka_invalid_record",
];

impl PublishError {
    /// The reasons a message published to `destination` may be retried or dead-lettered for.
    pub fn reasons_of(destination: &Destination) -> &'static [&'static str] {
        match destination {
            Destination::Amqp(_) => AMQP_REASONS,
            Destination::Kafka(_) => KAFKA_REASONS,
        }
    }

    /// A bounded label for metrics and the dead-letter reason.
    pub fn reason(&self) -> Cow<'static, str> {
        match self {
            PublishError::Nack => "nack".into(),
            PublishError::Returned(_) => "unroutable".into(),
            PublishError::Timeout => "timeout".into(),
            PublishError::Connection(_) => "connection".into(),
            PublishError::NoExchange(_) => "no_exchange".into(),
            PublishError::Kafka { code, .. } => format!("kafka_{code}").into(),
            PublishError::TooLarge => "too_large".into(),
            PublishError::BadPayload(_) => "bad_payload".into(),
            PublishError::MissingBody => "missing_body".into(),
            PublishError::BadEnvelope(_) => "bad_envelope".into(),
            PublishError::RouteNotAllowed(_) => "route_not_allowed".into(),
            PublishError::Expired => "expired".into(),
            PublishError::Aborted => "shutdown".into(),
            PublishError::Blocked => "blocked".into(),
            PublishError::BrokerRefused { .. } => "broker_refused".into(),
            PublishError::Closed { .. } => "connection".into(),
            PublishError::SinkRefused { .. } => "sink_refused".into(),
            PublishError::FrameTooLarge(_) => "too_large".into(),
        }
    }

    /// What a dead letter's reason says besides the label: the parser's message, the key
    /// that was refused, the broker's words.
    /// At most 1 KiB of it: a dead letter's reason stays small.
    pub fn detail(&self) -> Option<String> {
        let owned;
        let why = match self {
            PublishError::BrokerRefused { code, text } => {
                owned = format!("{code} {text}");
                &owned
            }
            PublishError::BadEnvelope(why)
            | PublishError::BadPayload(why)
            | PublishError::FrameTooLarge(why)
            | PublishError::Returned(why)
            | PublishError::RouteNotAllowed(why) => why,
            PublishError::Kafka { message, .. } => message,
            _ => return None,
        };
        let mut end = why.len().min(1024);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        Some(why[..end].to_string())
    }

    /// How the worker settles a message that ended in this error.
    pub fn disposition(&self) -> Disposition {
        match self {
            PublishError::Nack
            | PublishError::Returned(_)
            | PublishError::Timeout
            | PublishError::BrokerRefused { .. } => Disposition::Retry,
            PublishError::Kafka {
                permanent: false, ..
            } => Disposition::Retry,
            PublishError::Kafka {
                permanent: true, ..
            }
            | PublishError::TooLarge
            | PublishError::FrameTooLarge(_)
            | PublishError::BadPayload(_)
            | PublishError::MissingBody
            | PublishError::BadEnvelope(_)
            | PublishError::RouteNotAllowed(_)
            | PublishError::Expired => Disposition::DeadLetter,
            PublishError::Connection(_)
            | PublishError::Closed { .. }
            | PublishError::SinkRefused { .. }
            | PublishError::NoExchange(_)
            | PublishError::Aborted
            | PublishError::Blocked => Disposition::PutBack,
        }
    }

    /// True when the broker refused this message itself, alone: a forwarded dead letter
    /// that the broker refuses is kept for good rather than forwarded again.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            PublishError::BrokerRefused { .. } | PublishError::FrameTooLarge(_)
        )
    }

    /// True when the sink itself is suspect and the worker should get a fresh publisher
    /// (channel) and back off before claiming again.
    pub fn breaks_sink(&self) -> bool {
        matches!(
            self,
            PublishError::Connection(_)
                | PublishError::Closed { .. }
                | PublishError::SinkRefused { .. }
                | PublishError::Timeout
                | PublishError::Blocked
        )
    }
}

/// A configured broker connection shared by the workers of every trigger that uses it.
pub enum Sink {
    /// RabbitMQ (boxed: it holds a connection's state, the Kafka variant a handle).
    Amqp(Box<amqp::AmqpSink>),
    /// Kafka.
    Kafka(kafka::KafkaSink),
}

impl Sink {
    /// Builds the sink; connecting happens lazily and in [`Sink::supervise`].
    pub fn new(name: &str, config: &SinkConfig) -> anyhow::Result<Arc<Sink>> {
        Ok(Arc::new(match config {
            SinkConfig::Amqp(c) => Sink::Amqp(Box::new(amqp::AmqpSink::new(name, c)?)),
            SinkConfig::Kafka(c) => Sink::Kafka(kafka::KafkaSink::new(name, c)?),
        }))
    }

    /// The sink's configured name.
    pub fn name(&self) -> &str {
        match self {
            Sink::Amqp(s) => s.name(),
            Sink::Kafka(s) => s.name(),
        }
    }

    /// True while the broker is connected.
    pub fn is_up(&self) -> bool {
        match self {
            Sink::Amqp(s) => s.is_up(),
            Sink::Kafka(s) => s.is_up(),
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
        }
    }

    /// Whether this sink can publish to `destination` (an AMQP route needs an AMQP sink).
    pub fn serves(&self, destination: &Destination) -> bool {
        matches!(
            (self, destination),
            (Sink::Amqp(_), Destination::Amqp(_)) | (Sink::Kafka(_), Destination::Kafka(_))
        )
    }

    /// A publisher for one worker, bound to `destination`; fails while the broker is
    /// unreachable or the route's exchange is missing. The bridge checks [`Sink::serves`]
    /// at start-up, so a worker never asks a sink for a route of the other kind.
    pub async fn publisher(&self, destination: &Destination) -> Result<Publisher, PublishError> {
        match (self, destination) {
            (Sink::Amqp(s), Destination::Amqp(route)) => {
                Ok(Publisher::Amqp(Box::new(s.publisher(route).await?)))
            }
            (Sink::Kafka(s), Destination::Kafka(route)) => {
                Ok(Publisher::Kafka(s.publisher(route)?))
            }
            _ => Err(PublishError::Connection(format!(
                "sink {} cannot publish to {destination}",
                self.name()
            ))),
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
}

impl Publisher {
    /// Publishes every message to the publisher's route and waits for each confirmation, at
    /// most `timeout`, or until `abort` fires. Returns one outcome per message, in order;
    /// each confirmation is also sent to `confirms` as it arrives.
    pub async fn publish_batch(&mut self, batch: Batch<'_, '_>) -> Vec<Outcome> {
        match self {
            Publisher::Amqp(p) => p.publish_batch(batch).await,
            Publisher::Kafka(p) => p.publish_batch(batch).await,
        }
    }

    /// False once the underlying channel is closed; the worker then asks for a new publisher.
    pub fn is_usable(&self) -> bool {
        match self {
            Publisher::Amqp(p) => p.is_usable(),
            Publisher::Kafka(p) => p.is_usable(),
        }
    }
}

/// Records one message's result, reporting a confirmation to `confirms` at once.
fn record_outcome(results: &mut [Outcome], i: usize, r: Outcome, confirms: Option<&Confirms>) {
    if let (Ok(proof), Some(c)) = (&r, confirms) {
        // The receiver is gone only when nobody settles early: the result still counts.
        let _ = c.send((i, *proof));
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
    tokio::pin!(deadline);
    tokio::pin!(pending);
    loop {
        tokio::select! {
            next = pending.next() => match next {
                Some((i, r)) => record_outcome(results, i, r, confirms),
                None => return,
            },
            _ = &mut deadline => return,
            _ = abort.cancelled() => {
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
