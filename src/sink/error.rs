//! Why a message was not confirmed, and what the worker does about it: retry, dead-letter or put back.

use std::borrow::Cow;
use std::time::Duration;

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
    /// HTTP: the endpoint answered with a status other than 2xx. 408, 425, 429 and 5xx are
    /// retried (not before `Retry-After`), any other the message's fault.
    #[error("the endpoint answered {status}")]
    HttpStatus {
        /// The HTTP status code.
        status: u16,
        /// The start of the answer's body (at most 512 bytes, lossy UTF-8).
        excerpt: String,
        /// The answer's `Retry-After`, if it had one.
        retry_after: Option<Duration>,
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

/// The same for an HTTP route: the usual statuses (others appear as `http_<status>` when
/// they happen).
const HTTP_REASONS: &[&str] = &[
    "timeout",
    "http_connection",
    "too_large",
    "bad_payload",
    "missing_body",
    "bad_envelope",
    "url_not_allowed",
    "address_not_allowed",
    "expired",
    "http_400",
    "http_401",
    "http_403",
    "http_404",
    "http_405",
    "http_408",
    "http_409",
    "http_410",
    "http_413",
    "http_415",
    "http_422",
    "http_425",
    "http_429",
    "http_500",
    "http_502",
    "http_503",
    "http_504",
];

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
            PublishError::SinkRefused { .. } => "sink_refused".into(),
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
            PublishError::BrokerRefused { code, text } => {
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

    /// How the worker settles a message that ended in this error.
    pub fn disposition(&self) -> Disposition {
        match self {
            PublishError::Nack
            | PublishError::Returned(_)
            | PublishError::Timeout
            | PublishError::BrokerRefused { .. } => Disposition::Retry,
            PublishError::Kafka {
                permanent: false, ..
            }
            | PublishError::HttpTimeout
            | PublishError::HttpConnect(_) => Disposition::Retry,
            PublishError::HttpStatus { status, .. } => {
                if super::http::retryable(*status) {
                    Disposition::Retry
                } else {
                    Disposition::DeadLetter
                }
            }
            PublishError::Kafka {
                permanent: true, ..
            }
            | PublishError::TooLarge
            | PublishError::FrameTooLarge(_)
            | PublishError::BadPayload(_)
            | PublishError::MissingBody
            | PublishError::BadEnvelope(_)
            | PublishError::RouteNotAllowed(_)
            | PublishError::TopicNotAllowed(_)
            | PublishError::UrlNotAllowed(_)
            | PublishError::AddressNotAllowed(_)
            | PublishError::Expired => Disposition::DeadLetter,
            PublishError::Connection(_)
            | PublishError::Closed { .. }
            | PublishError::SinkRefused { .. }
            | PublishError::NoExchange(_)
            | PublishError::Aborted
            | PublishError::Blocked => Disposition::PutBack,
        }
    }

    /// How long the endpoint asked the bridge to wait before trying again (`Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            PublishError::HttpStatus { retry_after, .. } => *retry_after,
            _ => None,
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
