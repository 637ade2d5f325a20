//! Sinks: the brokers messages are forwarded to, and the errors a publish can end in.

pub mod amqp;
pub mod kafka;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{KafkaKey, SinkConfig};

/// One message to publish: the member and what the headers say about it.
#[derive(Debug, Clone, Copy)]
pub struct OutMessage<'a> {
    /// The body, byte for byte.
    pub payload: &'a [u8],
    /// Due time, epoch ms.
    pub due_ms: i64,
    /// 1 for the first delivery.
    pub attempt: u32,
    /// Stable id of the member (hex), for consumers that de-duplicate.
    pub id: &'a str,
    /// AMQP: overrides the route's routing key for this message.
    pub routing_key: Option<&'a str>,
}

/// Where a trigger's messages go on its sink.
#[derive(Debug, Clone)]
pub enum Route {
    /// AMQP exchange and routing key.
    Amqp {
        /// Exchange name, `""` for the default exchange.
        exchange: String,
        /// Routing key.
        routing_key: String,
    },
    /// Kafka topic and record key choice.
    Kafka {
        /// Topic name.
        topic: String,
        /// Record key.
        key: KafkaKey,
    },
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
    /// The shutdown deadline passed before the broker answered.
    #[error("shutdown deadline passed before the broker confirmed")]
    Aborted,
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

impl PublishError {
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
            PublishError::Aborted => "shutdown".into(),
        }
    }

    /// How the worker settles a message that ended in this error.
    pub fn disposition(&self) -> Disposition {
        match self {
            PublishError::Nack | PublishError::Returned(_) | PublishError::Timeout => {
                Disposition::Retry
            }
            PublishError::Kafka {
                permanent: false, ..
            } => Disposition::Retry,
            PublishError::Kafka {
                permanent: true, ..
            }
            | PublishError::TooLarge
            | PublishError::BadPayload(_) => Disposition::DeadLetter,
            PublishError::Connection(_) | PublishError::NoExchange(_) | PublishError::Aborted => {
                Disposition::PutBack
            }
        }
    }

    /// True when the sink itself is suspect and the worker should get a fresh publisher
    /// (channel) and back off before claiming again.
    pub fn breaks_sink(&self) -> bool {
        matches!(self, PublishError::Connection(_) | PublishError::Timeout)
    }
}

/// A configured broker connection shared by the workers of every trigger that uses it.
pub enum Sink {
    /// RabbitMQ.
    Amqp(amqp::AmqpSink),
    /// Kafka.
    Kafka(kafka::KafkaSink),
}

impl Sink {
    /// Builds the sink; connecting happens lazily and in [`Sink::supervise`].
    pub fn new(name: &str, config: &SinkConfig) -> anyhow::Result<Arc<Sink>> {
        Ok(Arc::new(match config {
            SinkConfig::Amqp(c) => Sink::Amqp(amqp::AmqpSink::new(name, c)?),
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

    /// Keeps the connection alive (reconnecting with capped backoff) until `cancel`.
    pub async fn supervise(&self, metrics: crate::metrics::Metrics, cancel: CancellationToken) {
        match self {
            Sink::Amqp(s) => s.supervise(metrics, cancel).await,
            Sink::Kafka(s) => s.supervise(metrics, cancel).await,
        }
    }

    /// A publisher for one worker publishing to `route`; fails while the broker is
    /// unreachable or the route's exchange is missing.
    pub async fn publisher(&self, route: &Route) -> Result<Publisher, PublishError> {
        match self {
            Sink::Amqp(s) => {
                let exchange = match route {
                    Route::Amqp { exchange, .. } => exchange.as_str(),
                    Route::Kafka { .. } => "",
                };
                Ok(Publisher::Amqp(s.publisher(exchange).await?))
            }
            Sink::Kafka(s) => Ok(Publisher::Kafka(s.publisher()?)),
        }
    }

    /// Called when a worker's publisher broke: an AMQP connection is dropped and re-made.
    pub async fn reset(&self) {
        if let Sink::Amqp(s) = self {
            s.reset().await;
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
    /// An AMQP channel in confirm mode.
    Amqp(amqp::AmqpPublisher),
    /// A Kafka producer handle.
    Kafka(kafka::KafkaPublisher),
}

impl Publisher {
    /// Publishes every message and waits for each confirmation, at most `timeout`, or until
    /// `abort` fires. Returns one result per message, in order.
    pub async fn publish_batch(
        &mut self,
        trigger: &str,
        route: &Route,
        messages: &[OutMessage<'_>],
        timeout: Duration,
        abort: &CancellationToken,
    ) -> Vec<Result<(), PublishError>> {
        match self {
            Publisher::Amqp(p) => {
                p.publish_batch(trigger, route, messages, timeout, abort)
                    .await
            }
            Publisher::Kafka(p) => {
                p.publish_batch(trigger, route, messages, timeout, abort)
                    .await
            }
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

/// A member's stable id: FNV-1a 64 of the key and member as 16 hex digits, the same in
/// every process, kept inline to avoid an allocation per message.
#[derive(Clone, Copy)]
pub struct MessageId([u8; 16]);

impl MessageId {
    /// The id of `member` in the queue `key`.
    pub fn new(key: &str, member: &[u8]) -> Self {
        use std::hash::Hasher;
        let mut h = fnv::FnvHasher::default();
        h.write(key.as_bytes());
        h.write(&[0]);
        h.write(member);
        let mut out = [0u8; 16];
        let v = h.finish();
        for (i, b) in out.iter_mut().enumerate() {
            *b = b"0123456789abcdef"[((v >> (60 - 4 * i)) & 0xf) as usize];
        }
        Self(out)
    }

    /// The hex digits.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// Collects per-message results while confirmations arrive, with a deadline and an abort.
pub(crate) async fn await_confirms<F>(
    results: &mut [Result<(), PublishError>],
    pending: F,
    timeout: Duration,
    abort: &CancellationToken,
) where
    F: futures_util::Stream<Item = (usize, Result<(), PublishError>)>,
{
    use futures_util::StreamExt;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    tokio::pin!(pending);
    loop {
        tokio::select! {
            next = pending.next() => match next {
                Some((i, r)) => results[i] = r,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_hex_and_depend_on_key_and_member() {
        let a = MessageId::new("k", b"m");
        assert_eq!(a.as_str(), MessageId::new("k", b"m").as_str());
        assert_eq!(a.as_str().len(), 16);
        assert!(a.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a.as_str(), MessageId::new("k2", b"m").as_str());
        assert_ne!(a.as_str(), MessageId::new("k", b"m2").as_str());
        // FNV-1a 64 of the empty input is its offset basis.
        let mut h = fnv::FnvHasher::default();
        std::hash::Hasher::write(&mut h, b"");
        assert_eq!(std::hash::Hasher::finish(&h), 0xcbf29ce484222325);
    }
}
