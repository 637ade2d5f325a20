//! Redis key names derived from a trigger's sorted set, kept in the source key's cluster slot.

use std::fmt;

/// The keys one queue uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeys {
    /// The sorted set producers write to: member -> due epoch ms.
    pub source: String,
    /// Claimed members: member -> lease deadline epoch ms.
    pub inflight: String,
    /// Hash: member -> `count:stamp`, the attempts that did not end in a confirmation, of the
    /// copy (scheduled or in flight) whose score is `stamp`.
    pub attempts: String,
    /// Dead-letter sorted set: member -> time it was dead-lettered (`+inf` once the broker
    /// refused it as a forwarded dead letter; the time is then in its reason).
    pub dead: String,
    /// Hash: dead member -> JSON with the reason and attempt count.
    pub dead_reasons: String,
    /// Hash: id -> message body, for triggers with `payload = "hash"` (the member is an id).
    pub bodies: String,
    /// Hash: the operator's hold on the queue: field `paused` while claims are paused.
    pub control: String,
    /// Dead letters being forwarded to the trigger's dead-letter destination: member ->
    /// lease deadline epoch ms. (One the broker refused has the dead-letter score `+inf`.)
    pub dead_inflight: String,
}

/// A key whose braces would make Redis Cluster hash it differently from its derived keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadKey(String);

impl fmt::Display for BadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key `{}` contains braces but no usable hash tag; use a non-empty `{{tag}}` or no braces",
            self.0
        )
    }
}

impl std::error::Error for BadKey {}

impl QueueKeys {
    /// `K:inflight` when `K` has a `{tag}`, `{K}:inflight` when it has no braces.
    pub fn derive(source: &str) -> Result<Self, BadKey> {
        let base = if hash_tag(source).is_some() {
            source.to_string()
        } else if source.contains(['{', '}']) {
            return Err(BadKey(source.to_string()));
        } else {
            format!("{{{source}}}")
        };
        Ok(Self {
            source: source.to_string(),
            inflight: format!("{base}:inflight"),
            attempts: format!("{base}:attempts"),
            dead: format!("{base}:dead"),
            dead_reasons: format!("{base}:dead:reasons"),
            bodies: format!("{base}:bodies"),
            control: format!("{base}:control"),
            dead_inflight: format!("{base}:dead:inflight"),
        })
    }
}

impl QueueKeys {
    /// Every key of the queue, the source first, in the order every writing script takes.
    pub fn all(&self) -> [&str; 8] {
        [
            &self.source,
            &self.inflight,
            &self.attempts,
            &self.dead,
            &self.dead_reasons,
            &self.bodies,
            &self.control,
            &self.dead_inflight,
        ]
    }
}

/// The Redis Cluster hash tag of a key: the bytes between the first `{` and the next `}`, if non-empty.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_key_gets_suffixes() {
        let k = QueueKeys::derive("delay:{orders}").unwrap();
        assert_eq!(k.inflight, "delay:{orders}:inflight");
        assert_eq!(k.attempts, "delay:{orders}:attempts");
        assert_eq!(k.dead, "delay:{orders}:dead");
        assert_eq!(hash_tag(&k.dead_reasons), Some("orders"));
    }

    #[test]
    fn plain_key_is_wrapped_so_the_slot_stays() {
        let k = QueueKeys::derive("delay:orders").unwrap();
        assert_eq!(k.inflight, "{delay:orders}:inflight");
        assert_eq!(hash_tag(&k.inflight), Some("delay:orders"));
        assert_eq!(k.source, "delay:orders");
    }

    #[test]
    fn braces_without_a_tag_are_rejected() {
        assert!(QueueKeys::derive("a{}b").is_err());
        assert!(QueueKeys::derive("a}b").is_err());
        assert!(QueueKeys::derive("a{b").is_err());
    }

    #[test]
    fn hash_tag_follows_cluster_rules() {
        assert_eq!(hash_tag("{user1000}.following"), Some("user1000"));
        assert_eq!(hash_tag("foo{}{bar}"), None);
        assert_eq!(hash_tag("foo{{bar}}zap"), Some("{bar"));
        assert_eq!(hash_tag("foo{bar}{zap}"), Some("bar"));
    }
}
