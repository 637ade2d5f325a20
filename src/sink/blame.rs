//! Who is at fault when a message was not confirmed: the one rule the AMQP, Kafka and HTTP sinks share, decided by what the message controls.
//!
//! A failure is about the destination or about the message. A destination failure holds the
//! destination: its messages go back with no attempt counted, however long it lasts. A
//! destination the message chose (its own routing key, topic or URL) is part of the message:
//! a failure there counts an attempt, unless the trigger's own destination is held at the
//! same time. A failure of the message counts an attempt, and what can never be published
//! as it is goes to the dead letters at once. Evidence is what the broker or endpoint said
//! of this publish; nothing is inferred from what else happened to be confirmed. The table
//! in docs/delivery.md ("Who is at fault") is this module, row by row.

use std::borrow::Cow;

use super::{OutMessage, PublishError};

/// The part of a destination a failure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The broker or endpoint as a whole: connection, alarm, timeout, the user's rights.
    Sink,
    /// The AMQP exchange: always the trigger's own.
    Exchange,
    /// The AMQP routing key: its bindings, the user's topic permissions for it.
    RoutingKey,
    /// The Kafka topic.
    Topic,
    /// The HTTP URL.
    Url,
}

/// Who a failure is blamed on, before knowing which parts the message chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The destination failed at `Part`.
    Destination(Part),
    /// The message failed: an attempt is counted.
    Message,
    /// The message can never be published as it is (found before it was sent): dead-lettered
    /// at once.
    Unfit,
    /// Nobody: the bridge stopped waiting (shutdown). Back with no attempt, nothing held.
    Nobody,
}

/// The parts of its destination a message chose itself (an envelope's or a pointer's
/// routing key, topic or URL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Chosen {
    routing_key: bool,
    topic: bool,
    url: bool,
}

impl Chosen {
    /// What `m` chose of its destination.
    pub(crate) fn of(m: &OutMessage<'_>) -> Self {
        Self {
            routing_key: m.routing_key.is_some(),
            topic: m.topic.is_some(),
            url: m.url.is_some(),
        }
    }

    /// Whether the message chose `part` (the exchange and the sink never are).
    pub(crate) fn chose(self, part: Part) -> bool {
        match part {
            Part::RoutingKey => self.routing_key,
            Part::Topic => self.topic,
            Part::Url => self.url,
            Part::Sink | Part::Exchange => false,
        }
    }
}

/// What becomes of a message that was not confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Back with its due time and no attempt counted. `hold`: the trigger's own destination
    /// failed, and is held until a message goes through again.
    PutBack {
        /// The trigger's destination is held because of this failure.
        hold: bool,
    },
    /// An attempt is counted: retried after a backoff, dead-lettered after `max_attempts`
    /// with `reason`.
    Attempt {
        /// The bounded reason label.
        reason: Cow<'static, str>,
    },
    /// Dead-lettered now with `reason`.
    DeadLetter {
        /// The bounded reason label.
        reason: Cow<'static, str>,
    },
}

/// The reason a message is dead-lettered for after its own destination refused it
/// `max_attempts` times.
pub(crate) const DESTINATION_REFUSED: &str = "destination_refused";

/// The rule: what becomes of a message that ended in `e`, given what it chose of its
/// destination and whether the trigger's own destination failed in the same batch.
pub(crate) fn judge(e: &PublishError, chosen: Chosen, own_held: bool) -> Verdict {
    match e.fault() {
        Fault::Nobody => Verdict::PutBack { hold: false },
        Fault::Unfit => Verdict::DeadLetter { reason: e.reason() },
        Fault::Message => Verdict::Attempt { reason: e.reason() },
        Fault::Destination(part) if chosen.chose(part) => {
            if own_held {
                Verdict::PutBack { hold: false }
            } else {
                Verdict::Attempt {
                    reason: DESTINATION_REFUSED.into(),
                }
            }
        }
        Fault::Destination(_) => Verdict::PutBack { hold: true },
    }
}

/// Whether `e`, for a message that chose `chosen`, is a failure of the trigger's own
/// destination: such a failure holds it.
pub(crate) fn holds_own(e: &PublishError, chosen: Chosen) -> bool {
    matches!(e.fault(), Fault::Destination(part) if !chosen.chose(part))
}

/// HTTP statuses that are the endpoint's whatever the request: it is missing, refuses the
/// bridge, or cannot answer now. A redirect the client does not follow with the same method
/// and body (301, 302, 303) is one too: the endpoint moved.
pub(crate) fn http_status_of_endpoint(status: u16) -> bool {
    matches!(
        status,
        301 | 302
            | 303
            | 305
            | 307
            | 308
            | 401
            | 403
            | 404
            | 405
            | 407
            | 408
            | 410
            | 421
            | 425
            | 429
    ) || (500..600).contains(&status)
}

impl PublishError {
    /// Who this failure is blamed on (see the module's doc).
    pub fn fault(&self) -> Fault {
        use PublishError as E;
        match self {
            E::Aborted => Fault::Nobody,
            E::Nack | E::Timeout | E::Connection(_) | E::Closed { .. } | E::Blocked => {
                Fault::Destination(Part::Sink)
            }
            E::NoExchange(_) => Fault::Destination(Part::Exchange),
            E::Returned(_) => Fault::Destination(Part::RoutingKey),
            E::DestinationRefused { part, .. } => Fault::Destination(*part),
            E::BrokerRefused { .. } => Fault::Message,
            E::Kafka { blame, .. } => match blame {
                KafkaBlame::Message => Fault::Message,
                KafkaBlame::Topic => Fault::Destination(Part::Topic),
                KafkaBlame::Cluster => Fault::Destination(Part::Sink),
            },
            E::HttpStatus {
                status,
                every_request,
                ..
            } => {
                if *every_request || http_status_of_endpoint(*status) {
                    Fault::Destination(Part::Url)
                } else {
                    Fault::Message
                }
            }
            E::HttpTimeout | E::HttpConnect(_) => Fault::Destination(Part::Url),
            E::TooLarge
            | E::FrameTooLarge(_)
            | E::BadPayload(_)
            | E::MissingBody
            | E::BadEnvelope(_)
            | E::RouteNotAllowed(_)
            | E::TopicNotAllowed(_)
            | E::UrlNotAllowed(_)
            | E::AddressNotAllowed(_)
            | E::Expired => Fault::Unfit,
        }
    }
}

/// Whose a Kafka delivery error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaBlame {
    /// The record itself: too large, invalid.
    Message,
    /// The topic: unknown, not authorized.
    Topic,
    /// The cluster or the producer: brokers down, timeouts, anything else.
    Cluster,
}

#[cfg(test)]
#[path = "blame_tests.rs"]
mod tests;
