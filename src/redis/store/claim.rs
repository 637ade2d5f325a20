//! The claim (`claim.lua`): the call, what it gives (the claimed members, where each one's
//! body is), the parse of its reply, and the read of the queue's head.

use std::time::Duration;

use redis::Value;

use super::{millis, score_ms, Store, StoreError, SCRIPTS};

/// Where a claimed member's message body is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Inline payload mode: the member is the body.
    Member,
    /// Hash payload mode: the body read from the bodies hash with the claim.
    Stored(Vec<u8>),
    /// Hash payload mode: the id has no body (dead-lettered as `missing_body`).
    Missing,
    /// Hash payload mode: the body has this many bytes, more than the store's largest body
    /// to read; it was not read (dead-lettered as `too_large`).
    TooLarge(u64),
}

impl Body {
    /// The message's bytes given its `member`, or `None` when there is no body to send.
    pub fn bytes<'a>(&'a self, member: &'a [u8]) -> Option<&'a [u8]> {
        match self {
            Body::Member => Some(member),
            Body::Stored(body) => Some(body),
            Body::Missing | Body::TooLarge(_) => None,
        }
    }

    /// Reads a claim reply's body field: in hash mode the next value (a body, 0 for none,
    /// or the size of one too large to read); inline, the member itself.
    pub(super) fn from_reply(
        hash: bool,
        it: &mut impl Iterator<Item = Value>,
    ) -> Result<Self, StoreError> {
        Ok(match hash.then(|| it.next()) {
            None => Body::Member,
            Some(Some(Value::BulkString(body))) => Body::Stored(body),
            Some(Some(Value::Int(0))) => Body::Missing,
            Some(Some(Value::Int(size))) if size > 0 => Body::TooLarge(size as u64),
            Some(_) => return Err(StoreError::Reply("claimed body")),
        })
    }
}

/// One claimed member.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The member bytes: the payload in inline mode, the id in hash mode.
    pub member: Vec<u8>,
    /// Its message body.
    pub body: Body,
    /// The score as Redis printed it, to put the member back exactly.
    pub due_raw: Vec<u8>,
    /// The due time in epoch milliseconds (saturated for infinities).
    pub due_ms: i64,
    /// 1 for the first delivery, then one more per failure or expired lease.
    pub attempt: u32,
}

impl Claimed {
    /// The bytes to publish, or `None` when the body is missing.
    pub fn payload(&self) -> Option<&[u8]> {
        self.body.bytes(&self.member)
    }
}

/// The result of one claim.
#[derive(Debug, Default)]
pub struct ClaimBatch {
    /// Redis server time of the claim, epoch ms (the whole milliseconds of `now_us`).
    pub now_ms: i64,
    /// Redis server time of the claim, epoch µs.
    pub now_us: i64,
    /// Lease deadline of every member of this batch; also the batch's ownership token.
    pub deadline_ms: i64,
    /// Score of the earliest member left in the source set that a claim could take.
    pub next_head_ms: Option<f64>,
    /// Due members left in place because an earlier copy of them is still in flight; they
    /// become claimable when that copy is settled.
    pub skipped: u64,
    /// The queue is paused by an operator: nothing was claimed, and the head is unknown.
    pub paused: bool,
    /// The rate limit allows the next member this much later: nothing was claimed.
    pub rate_wait: Option<Duration>,
    /// Control fields this claim found out of range and repaired (see `claim.lua`).
    pub repaired: u64,
    /// How long the claim script ran in Redis, by the Redis clock: what it held the server
    /// for, without the round trip or the worker's own wait to be scheduled.
    pub script_time: Duration,
    /// The claimed members, earliest first.
    pub items: Vec<Claimed>,
}

fn parse_claim(reply: Value, hash: bool) -> Result<ClaimBatch, StoreError> {
    let Value::Array(items) = reply else {
        return Err(StoreError::Reply("claim reply is not an array"));
    };
    let width = if hash { 2 } else { 1 };
    if items.len() < 9 || (items.len() - 9) % width != 0 {
        return Err(StoreError::Reply("claim reply length"));
    }
    let mut it = items.into_iter();
    let (
        Some(Value::Int(now_us)),
        Some(Value::Int(deadline_ms)),
        Some(head),
        Some(Value::Int(skipped)),
        Some(Value::Int(paused)),
        Some(Value::Int(wait)),
        Some(Value::Int(repaired)),
        Some(Value::BulkString(scores)),
        Some(Value::Int(took_us)),
    ) = (
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
    )
    else {
        return Err(StoreError::Reply("claim reply header"));
    };
    let next_head_ms = match head {
        Value::BulkString(b) if !b.is_empty() => {
            let s = std::str::from_utf8(&b).map_err(|_| StoreError::Reply("head score"))?;
            Some(match s {
                "inf" | "+inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                s => s.parse().map_err(|_| StoreError::Reply("head score"))?,
            })
        }
        _ => None,
    };
    // `due attempt due attempt ...`, one pair per member in the members' order.
    let mut fields = scores.split(|b| *b == b' ').filter(|_| !scores.is_empty());
    let mut out = Vec::with_capacity(it.len() / width);
    while let Some(m) = it.next() {
        let Value::BulkString(member) = m else {
            return Err(StoreError::Reply("claimed member"));
        };
        let body = Body::from_reply(hash, &mut it)?;
        let (Some(due_raw), Some(attempt)) = (fields.next(), fields.next()) else {
            return Err(StoreError::Reply("claimed member's score"));
        };
        let due_ms = score_ms(due_raw).ok_or(StoreError::Reply("due score"))?;
        let attempt: i64 = std::str::from_utf8(attempt)
            .ok()
            .and_then(|a| a.parse().ok())
            .ok_or(StoreError::Reply("claimed member's attempt"))?;
        out.push(Claimed {
            member,
            body,
            due_raw: due_raw.to_vec(),
            due_ms,
            attempt: attempt.clamp(1, u32::MAX as i64) as u32,
        });
    }
    if fields.next().is_some() {
        return Err(StoreError::Reply("claim reply scores"));
    }
    Ok(ClaimBatch {
        now_ms: now_us.div_euclid(1000),
        now_us,
        deadline_ms,
        next_head_ms,
        skipped: u64::try_from(skipped).unwrap_or(0),
        paused: paused == 1,
        rate_wait: (wait > 0).then(|| Duration::from_millis(wait as u64)),
        repaired: u64::try_from(repaired).unwrap_or(0),
        script_time: Duration::from_micros(u64::try_from(took_us).unwrap_or(0)),
        items: out,
    })
}

impl Store {
    /// Claims up to `batch` due members with a lease of `lease`.
    pub async fn claim(&self, batch: usize, lease: Duration) -> Result<ClaimBatch, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .keyed(&SCRIPTS.claim)
            .arg(batch)
            .arg(millis(lease))
            .arg(self.claim_bytes.unwrap_or(0))
            .arg(self.largest_body)
            .arg(self.rate.map_or(0.0, |(per_ms, _)| per_ms))
            .arg(self.rate.map_or(0, |(_, burst)| burst))
            .invoke_async(&mut conn)
            .await?;
        parse_claim(reply, self.hash_bodies())
    }

    /// The score of the source set's earliest member (`None`: the set is empty or missing):
    /// one read command, no script, nothing written. A member in flight may be that head.
    pub async fn head(&self) -> Result<Option<f64>, StoreError> {
        let mut conn = self.conn.clone();
        let head: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys.source)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        Ok(head.first().map(|(_, score)| *score))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(scores: &str, rest: Vec<Value>) -> Value {
        let mut v = vec![
            Value::Int(1_700_000_000_000_123),
            Value::Int(1_700_000_030_000),
            Value::BulkString(b"1700000000500".to_vec()),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::BulkString(scores.as_bytes().to_vec()),
            Value::Int(250),
        ];
        v.extend(rest);
        Value::Array(v)
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn each_member_takes_its_score_and_attempt_from_the_packed_scores_in_order() {
        let got = parse_claim(
            reply("1700000000000 1 -inf 3", vec![bulk("a"), bulk("b")]),
            false,
        )
        .unwrap();
        let items: Vec<_> = got
            .items
            .iter()
            .map(|c| {
                (
                    c.member.as_slice(),
                    c.due_raw.as_slice(),
                    c.due_ms,
                    c.attempt,
                )
            })
            .collect();
        assert_eq!(
            items,
            [
                (&b"a"[..], &b"1700000000000"[..], 1_700_000_000_000, 1),
                (&b"b"[..], &b"-inf"[..], i64::MIN, 3),
            ]
        );
        assert_eq!(
            (got.now_ms, got.next_head_ms, got.script_time),
            (
                1_700_000_000_000,
                Some(1_700_000_000_500.0),
                Duration::from_micros(250)
            )
        );
        let hash = parse_claim(reply("5 1", vec![bulk("id"), bulk("body")]), true).unwrap();
        assert_eq!(hash.items[0].body, Body::Stored(b"body".to_vec()));
        assert!(parse_claim(reply("", vec![]), false)
            .unwrap()
            .items
            .is_empty());
    }

    #[test]
    fn scores_that_do_not_match_the_members_are_a_reply_error() {
        for (scores, members) in [
            ("1 1", vec![bulk("a"), bulk("b")]),
            ("1 1 2 1", vec![bulk("a")]),
            ("1", vec![bulk("a")]),
            ("1 x", vec![bulk("a")]),
            ("", vec![bulk("a")]),
        ] {
            assert!(
                matches!(
                    parse_claim(reply(scores, members), false),
                    Err(StoreError::Reply(_))
                ),
                "{scores:?}"
            );
        }
    }
}
