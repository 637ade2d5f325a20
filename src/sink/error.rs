//! Why a message was not confirmed, in the broker's or endpoint's words; who is at fault is [`super::blame`]'s.

use std::borrow::Cow;
use std::time::Duration;

use super::blame::{KafkaBlame, Part};
use crate::config::Destination;

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
        /// Whose error it is: the record's, the topic's or the cluster's.
        blame: KafkaBlame,
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
    /// The message's own Kafka topic is not matched by the trigger's `allowed_topics` (or the
    /// trigger has none).
    #[error("topic `{0}` is not allowed by allowed_topics")]
    TopicNotAllowed(String),
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
    /// The broker closed the channel on this message published alone for a reason of its
    /// destination (404: the exchange is missing; 403: the user may not write to the exchange,
    /// or to the routing key): whose fault it is depends on whether the message chose `part`.
    #[error("the broker refused the destination: {code} {text}")]
    DestinationRefused {
        /// The AMQP reply code of the close.
        code: u16,
        /// The broker's reply text.
        text: String,
        /// What the refusal is about: the exchange, or the routing key.
        part: Part,
    },
    /// The message's properties and headers do not fit in one AMQP frame of the size the
    /// broker negotiated (`frame_max`): the broker would close the whole connection on it.
    #[error("{0}")]
    FrameTooLarge(String),
    /// HTTP: the endpoint answered with a status other than 2xx (see
    /// [`super::blame::http_status_of_endpoint`] for whose fault each is).
    #[error("the endpoint answered {status}")]
    HttpStatus {
        /// The HTTP status code.
        status: u16,
        /// The start of the answer's body (at most 512 bytes, lossy UTF-8).
        excerpt: String,
        /// The answer's `Retry-After`, if it had one.
        retry_after: Option<Duration>,
        /// Every recent request to this endpoint got this status: the endpoint's, not the
        /// message's.
        every_request: bool,
    },
    /// HTTP: no answer within the sink's `timeout`.
    #[error("no answer within the http sink's timeout")]
    HttpTimeout,
    /// HTTP: the request failed without an answer (connection refused or broken, name not
    /// resolved) while the endpoint as a whole is not known to be down.
    #[error("http request failed: {0}")]
    HttpConnect(String),
    /// The message's own URL does not match the trigger's `allowed_urls`.
    #[error("url `{0}` is not allowed by allowed_urls")]
    UrlNotAllowed(String),
    /// The URL's host is, or resolves to, a link-local or metadata address and the sink does
    /// not allow those (`allow_link_local`).
    #[error("{0}")]
    AddressNotAllowed(String),
}

/// The reasons an HTTP route's messages can be retried or dead-lettered for (others appear
/// as `http_<status>` when they happen). An endpoint's failures hold it and count nothing.
const HTTP_REASONS: &[&str] = &[
    "destination_refused",
    "too_large",
    "bad_payload",
    "missing_body",
    "bad_envelope",
    "url_not_allowed",
    "address_not_allowed",
    "expired",
    "http_400",
    "http_409",
    "http_413",
    "http_415",
    "http_422",
];

/// The same for an AMQP route (their counters start at 0).
const AMQP_REASONS: &[&str] = &[
    "broker_refused",
    "destination_refused",
    "too_large",
    "bad_payload",
    "missing_body",
    "bad_envelope",
    "route_not_allowed",
    "expired",
];
/// The same for a Kafka route (other `kafka_<error>` reasons appear when they happen).
const KAFKA_REASONS: &[&str] = &[
    "destination_refused",
    "too_large",
    "missing_body",
    "bad_envelope",
    "topic_not_allowed",
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
            Destination::Http(_) => HTTP_REASONS,
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
            PublishError::TopicNotAllowed(_) => "topic_not_allowed".into(),
            PublishError::Expired => "expired".into(),
            PublishError::Aborted => "shutdown".into(),
            PublishError::Blocked => "blocked".into(),
            PublishError::BrokerRefused { .. } => "broker_refused".into(),
            PublishError::Closed { .. } => "connection".into(),
            PublishError::DestinationRefused { .. } => "destination_refused".into(),
            PublishError::FrameTooLarge(_) => "too_large".into(),
            PublishError::HttpStatus { status, .. } => format!("http_{status}").into(),
            PublishError::HttpTimeout => "timeout".into(),
            PublishError::HttpConnect(_) => "http_connection".into(),
            PublishError::UrlNotAllowed(_) => "url_not_allowed".into(),
            PublishError::AddressNotAllowed(_) => "address_not_allowed".into(),
        }
    }

    /// What a dead letter's reason says besides the label: the parser's message, the key
    /// that was refused, the broker's words.
    /// At most 1 KiB of it: a dead letter's reason stays small.
    pub fn detail(&self) -> Option<String> {
        let owned;
        let why = match self {
            PublishError::BrokerRefused { code, text }
            | PublishError::DestinationRefused { code, text, .. } => {
                owned = format!("{code} {text}");
                &owned
            }
            PublishError::HttpStatus { excerpt, .. } if !excerpt.is_empty() => excerpt,
            PublishError::BadEnvelope(why)
            | PublishError::HttpConnect(why)
            | PublishError::UrlNotAllowed(why)
            | PublishError::AddressNotAllowed(why)
            | PublishError::BadPayload(why)
            | PublishError::FrameTooLarge(why)
            | PublishError::Returned(why)
            | PublishError::RouteNotAllowed(why)
            | PublishError::TopicNotAllowed(why) => why,
            PublishError::Kafka { message, .. } => message,
            _ => return None,
        };
        let mut end = why.len().min(1024);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        Some(why[..end].to_string())
    }

    /// How long the endpoint asked the bridge to wait before trying again (`Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            PublishError::HttpStatus { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// True when the sink itself is suspect and the worker should get a fresh publisher
    /// (channel) and back off before claiming again.
    pub fn breaks_sink(&self) -> bool {
        matches!(
            self,
            PublishError::Connection(_)
                | PublishError::Closed { .. }
                | PublishError::DestinationRefused { .. }
                | PublishError::Timeout
                | PublishError::Blocked
        )
    }
}
