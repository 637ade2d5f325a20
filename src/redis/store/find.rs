//! Finding one message of a queue by what an operator holds: its member, its id in hash payload mode, or the id its consumers were sent.

use super::{Found, Store, StoreError};
use crate::wire::MessageId;

/// Members or hash fields one `ZSCAN`/`HSCAN` call asks for: a whole queue is read this many
/// at a time, so a lookup never holds Redis for long, however large the queue.
const SCAN_COUNT: usize = 500;

/// How a lookup recognised its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FoundBy {
    /// The text is the member itself (the id in hash payload mode).
    Member,
    /// The text is the id consumers were sent: the bridge's digest of the trigger's key and
    /// the member (AMQP `message_id`, HTTP `x-delay-id` and `Idempotency-Key`, Kafka
    /// `x-delay-id`).
    ConsumerId,
    /// The text is the `id` the message's envelope sets, which consumers were sent instead.
    EnvelopeId,
}

/// A message found by [`Store::lookup`].
#[derive(Debug, Clone, PartialEq)]
pub struct Lookup {
    /// Its member (the id in hash payload mode).
    pub member: Vec<u8>,
    /// What the text given was.
    pub by: FoundBy,
    /// Where it is, with its body in hash payload mode.
    pub found: Found,
}

/// What a queue's consumer ids are made of: the trigger's `key` (the digest is of the
/// trigger's key, the same on every shard) and whether the payload is an envelope, whose `id`
/// replaces the digest.
#[derive(Debug, Clone, Copy)]
pub struct IdScheme<'a> {
    /// The trigger's `key`.
    pub trigger_key: &'a str,
    /// `format = "envelope"`.
    pub envelope: bool,
}

impl IdScheme<'_> {
    /// The id consumers are sent for `member`, whose envelope (the member inline, the body in
    /// hash payload mode) is `envelope` when the trigger's format is an envelope. An envelope
    /// that cannot be read is dead-lettered under the digest, so that is its id.
    pub fn consumer_id(&self, member: &[u8], envelope: Option<&[u8]>) -> String {
        self.envelope
            .then_some(envelope)
            .flatten()
            .and_then(envelope_id)
            .unwrap_or_else(|| {
                MessageId::new(self.trigger_key, member)
                    .as_str()
                    .to_string()
            })
    }
}

/// The `id` an envelope sets, if it is a JSON object with a non-empty string `id`.
pub fn envelope_id(raw: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: Option<String>,
    }
    serde_json::from_slice::<IdOnly>(raw)
        .ok()?
        .id
        .filter(|id| !id.is_empty())
}

/// Whether `needle` occurs in `hay` (a cheap test before parsing an envelope).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

impl Store {
    /// The message `text` names, scheduled, in flight or dead: the member `text` (the id in
    /// hash payload mode) if there is one, else the one whose consumer id is `text`, looked for
    /// over the whole queue (see [`Store::members_by_consumer_id`]). `None`: no such message.
    pub async fn lookup(
        &self,
        scheme: IdScheme<'_>,
        text: &[u8],
    ) -> Result<Option<Lookup>, StoreError> {
        let found = self.find(text).await?;
        if !found.places.is_empty() {
            return Ok(Some(Lookup {
                member: text.to_vec(),
                by: FoundBy::Member,
                found,
            }));
        }
        let Ok(id) = std::str::from_utf8(text) else {
            return Ok(None);
        };
        for (member, by) in self.members_by_consumer_id(scheme, id).await? {
            let found = self.find(&member).await?;
            if !found.places.is_empty() {
                return Ok(Some(Lookup { member, by, found }));
            }
        }
        Ok(None)
    }

    /// Every member of the queue (scheduled, in flight or dead) whose consumer id is `id`,
    /// each once: the scheduled, in-flight and dead sets are scanned with `ZSCAN`, a page of
    /// [`SCAN_COUNT`] at a time, and each member's digest computed; an envelope's `id` is read
    /// from the member inline, from the bodies hash (`HSCAN`) in hash payload mode.
    pub async fn members_by_consumer_id(
        &self,
        scheme: IdScheme<'_>,
        id: &str,
    ) -> Result<Vec<(Vec<u8>, FoundBy)>, StoreError> {
        let digest_like = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
        let mut hits: Vec<(Vec<u8>, FoundBy)> = Vec::new();
        let mut add = |member: &[u8], by: FoundBy| {
            if !hits.iter().any(|(m, _)| m == member) {
                hits.push((member.to_vec(), by));
            }
        };
        let k = self.keys();
        for set in [&k.source, &k.inflight, &k.dead] {
            self.scan(&["ZSCAN", set.as_str()], |member, _| {
                if digest_like && MessageId::new(scheme.trigger_key, member).as_str() == id {
                    add(member, FoundBy::ConsumerId);
                } else if scheme.envelope
                    && !self.hash_bodies()
                    && contains(member, id.as_bytes())
                    && envelope_id(member).as_deref() == Some(id)
                {
                    add(member, FoundBy::EnvelopeId);
                }
            })
            .await?;
        }
        if scheme.envelope && self.hash_bodies() {
            self.scan(&["HSCAN", k.bodies.as_str()], |member, body| {
                if contains(body, id.as_bytes()) && envelope_id(body).as_deref() == Some(id) {
                    add(member, FoundBy::EnvelopeId);
                }
            })
            .await?;
        }
        Ok(hits)
    }

    /// Walks a whole sorted set (`ZSCAN`) or hash (`HSCAN`) with its cursor, calling `each`
    /// with every member and its score, or every field and its value.
    async fn scan(
        &self,
        command: &[&str; 2],
        mut each: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut cursor = "0".to_string();
        loop {
            let (next, flat): (String, Vec<Vec<u8>>) = redis::cmd(command[0])
                .arg(command[1])
                .arg(&cursor)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await?;
            for pair in flat.chunks(2) {
                if let [first, second] = pair {
                    each(first, second);
                }
            }
            if next == "0" {
                return Ok(());
            }
            cursor = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consumer_id_is_the_digest_unless_an_envelope_sets_one() {
        let raw = IdScheme {
            trigger_key: "delay:{orders}",
            envelope: false,
        };
        let digest = MessageId::new("delay:{orders}", b"m").as_str().to_string();
        assert_eq!(raw.consumer_id(b"m", Some(br#"{"id":"x"}"#)), digest);
        let env = IdScheme {
            envelope: true,
            ..raw
        };
        assert_eq!(
            env.consumer_id(b"m", Some(br#"{"body":"b","id":"x"}"#)),
            "x"
        );
        assert_eq!(
            env.consumer_id(b"m", Some(br#"{"body":"b","id":""}"#)),
            digest
        );
        assert_eq!(env.consumer_id(b"m", Some(b"not json")), digest);
        assert_eq!(env.consumer_id(b"m", None), digest);
    }

    #[test]
    fn contains_finds_a_needle_anywhere_and_never_an_empty_one() {
        assert!(contains(b"abcdef", b"cde"));
        assert!(contains(b"abc", b"abc"));
        assert!(!contains(b"ab", b"abc"));
        assert!(!contains(b"abc", b""));
    }
}
