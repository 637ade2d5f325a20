//! What consumers see on the wire besides the body: header names and the message id format.

/// Header with the trigger's name.
pub const HEADER_TRIGGER: &str = "x-delay-trigger";
/// Header with the due time (the member's score), epoch ms.
pub const HEADER_DUE_MS: &str = "x-delay-due-ms";
/// Header with the attempt number: 1 for the first delivery.
pub const HEADER_ATTEMPT: &str = "x-delay-attempt";
/// AMQP header with a number unique to one publish: a returned message is matched to its
/// publish by it, never by an id a producer chose.
pub const HEADER_PUBLISH: &str = "x-delay-publish";
/// Header: the schedule whose tick a message is.
pub const HEADER_SCHEDULE: &str = "x-delay-schedule";
/// Kafka header with the message id (AMQP carries it in the `message_id` property).
pub const HEADER_ID: &str = "x-delay-id";
/// A forwarded dead letter's reason label (`nack`, `too_large`, `bad_envelope`, ...).
pub const HEADER_DEAD_REASON: &str = "x-delay-dead-reason";
/// A forwarded dead letter's detail: the broker's or the parser's words, when there are some.
pub const HEADER_DEAD_DETAIL: &str = "x-delay-dead-detail";
/// How many attempts a forwarded dead letter had.
pub const HEADER_DEAD_ATTEMPTS: &str = "x-delay-dead-attempts";
/// When a forwarded dead letter was dead-lettered, epoch ms.
pub const HEADER_DEAD_AT_MS: &str = "x-delay-dead-at-ms";
/// The Redis key a forwarded dead letter was scheduled on (its shard's key).
pub const HEADER_DEAD_KEY: &str = "x-delay-dead-key";
/// A forwarded dead letter's id in hash payload mode (the member, when it is UTF-8).
pub const HEADER_DEAD_ID: &str = "x-delay-dead-id";
/// A forwarded dead letter's id in hash payload mode as standard base64, when it is not UTF-8.
pub const HEADER_DEAD_ID_B64: &str = "x-delay-dead-id-b64";

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
