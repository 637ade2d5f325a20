//! How a trigger reads and shapes its messages: where the body is, its format, what an expired
//! message becomes, and a Kafka record's key.

use serde::{Deserialize, Serialize};

/// How a trigger finds the message body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// The member is the payload.
    #[default]
    Inline,
    /// The member is an id; the body is the id's field in the hash `KEY:bodies` (`{KEY}:bodies`
    /// for a key without a hash tag). Producers cancel and reschedule by id.
    Hash,
}

/// How the payload (member or body) is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageFormat {
    /// The payload is the body, published byte for byte.
    #[default]
    Raw,
    /// The payload is a JSON envelope (`schema/envelope.schema.json`): the body plus the
    /// message's own headers, properties, routing key, Kafka key, id and expiry.
    Envelope,
}

/// What happens to a message that is claimed after it expired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpired {
    /// Dead-lettered with reason `expired` (visible, requeueable).
    #[default]
    DeadLetter,
    /// Removed without a trace but the `delay_bridge_messages_expired_total` counter.
    Drop,
}

/// What a Kafka record's key is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KafkaKey {
    /// No key: records spread over partitions.
    #[default]
    None,
    /// The member bytes: every copy of one member lands on the same partition.
    Member,
}
