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
    /// String, with an expiry: why a bridge holds the trigger's destination (JSON), while it
    /// does. Not one of [`QueueKeys::all`]: no script touches it.
    pub held: String,
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
            held: format!("{base}:held"),
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

/// The shard of `member` among `shards`: CRC32 (IEEE 802.3, as zlib's `crc32`) of its bytes,
/// modulo `shards`. Producers compute the same (README, "Sharded triggers"), so that a cancel or
/// a reschedule finds the shard a member was scheduled on.
pub fn shard_of(member: &[u8], shards: u32) -> u32 {
    crc32fast::hash(member) % shards.max(1)
}

/// Shard `index`'s key of a trigger whose key is `key`, when it has `shards` shards: `key`
/// itself for one shard, else `key` with `:index` added inside its hash tag
/// (`delay:{orders}` -> `delay:{orders:3}`), so that each shard hashes to its own slot.
/// `None` when `key` has no hash tag and `shards > 1`.
pub fn shard_key(key: &str, index: u32, shards: u32) -> Option<String> {
    if shards <= 1 {
        return Some(key.to_string());
    }
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| format!("{}:{index}{}", &key[..close], &key[close..]))
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

    /// The test vectors the README publishes for producers.
    #[test]
    fn shard_hash_matches_the_published_vectors() {
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        let vectors: [(&[u8], u32, u32, u32); 5] = [
            (b"order-1", 3_769_860_079, 3, 15),
            (b"order-2", 2_042_244_693, 1, 5),
            (b"order-3", 247_275_203, 3, 3),
            (br#"{"id":42}"#, 1_725_307_114, 2, 10),
            ("caf\u{e9}".as_bytes(), 2_561_491_637, 1, 5),
        ];
        for (member, crc, of4, of16) in vectors {
            assert_eq!(crc32fast::hash(member), crc);
            assert_eq!(shard_of(member, 4), of4);
            assert_eq!(shard_of(member, 16), of16);
            assert_eq!(shard_of(member, 1), 0);
        }
    }

    #[test]
    fn shard_keys_stay_in_their_own_tag() {
        assert_eq!(
            shard_key("delay:{orders}", 3, 4).unwrap(),
            "delay:{orders:3}"
        );
        assert_eq!(shard_key("{orders}:due", 0, 2).unwrap(), "{orders:0}:due");
        assert_eq!(shard_key("delay:{orders}", 0, 1).unwrap(), "delay:{orders}");
        assert_eq!(shard_key("delay:orders", 0, 1).unwrap(), "delay:orders");
        assert_eq!(shard_key("delay:orders", 1, 2), None);
        assert_eq!(shard_key("a{}b", 1, 2), None);
        let k = QueueKeys::derive(&shard_key("delay:{orders}", 7, 8).unwrap()).unwrap();
        assert_eq!(k.inflight, "delay:{orders:7}:inflight");
    }

    #[test]
    fn hash_tag_follows_cluster_rules() {
        assert_eq!(hash_tag("{user1000}.following"), Some("user1000"));
        assert_eq!(hash_tag("foo{}{bar}"), None);
        assert_eq!(hash_tag("foo{{bar}}zap"), Some("{bar"));
        assert_eq!(hash_tag("foo{bar}{zap}"), Some("bar"));
    }
}
