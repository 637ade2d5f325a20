//! The Redis side of a queue: the claim, settle, recover, requeue and stats scripts; dead
//! letters and members in flight (in `dead`); what operators do to a queue (in `operate`).

use std::time::Duration;

use crate::redis_conn::Conn;
use redis::{Script, Value};

use crate::keys::QueueKeys;

mod dead;
mod ingest;
mod operate;
pub(crate) use dead::dead_at_ms;
pub use dead::{DeadClaim, DeadItem, DeadLetter, DeadOutcome, DeadPage, DeadSettled};
pub use ingest::{Ingest, Ingested};
pub use operate::{
    Cursor, Forecast, Found, Page, Place, Purge, ScheduledEntry, LIST_BODY_MAX, MAX_BUCKETS,
    MAX_PAGE, PREVIEW, SHOW_BODY_MAX,
};

/// Errors talking to Redis or reading a script's reply.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The command failed (connection, timeout, wrong key type, script error).
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// The script replied with something this version does not understand.
    #[error("unexpected script reply: {0}")]
    Reply(&'static str),
}

impl StoreError {
    /// A bounded label for metrics: `connection`, `timeout`, `wrong_type`, `script` or `other`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Redis(e) if e.is_timeout() => "timeout",
            StoreError::Redis(e)
                if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() =>
            {
                "connection"
            }
            StoreError::Redis(e)
                if e.kind() == redis::ErrorKind::UnexpectedReturnType
                    || e.to_string().contains("WRONGTYPE") =>
            {
                "wrong_type"
            }
            StoreError::Redis(e)
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
            {
                "script"
            }
            StoreError::Redis(_) => "other",
            StoreError::Reply(_) => "reply",
        }
    }
}

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
    fn from_reply(hash: bool, it: &mut impl Iterator<Item = Value>) -> Result<Self, StoreError> {
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
    /// Redis server time of the claim, epoch ms.
    pub now_ms: i64,
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
    /// The claimed members, earliest first.
    pub items: Vec<Claimed>,
}

/// What to do with each member of a settled batch: a description of the settle script's
/// work. The worker builds it only from the sink's outcomes (`worker::settlement`).
#[derive(Debug, Default)]
pub struct Settlement<'a> {
    /// Confirmed by the broker: remove.
    pub ack: Vec<&'a [u8]>,
    /// Rejected: count the attempt, then retry later or dead-letter.
    pub fail: Vec<Failure<'a>>,
    /// Not attempted or interrupted: back to the source set with their original score.
    pub put_back: Vec<&'a Claimed>,
    /// Expired with `on_expired = "drop"`: removed like acked members, never published.
    pub drop: Vec<&'a [u8]>,
}

impl<'a> Settlement<'a> {
    /// Nothing to do: every member was settled already.
    pub fn is_empty(&self) -> bool {
        self.ack.is_empty()
            && self.fail.is_empty()
            && self.put_back.is_empty()
            && self.drop.is_empty()
    }

    /// Acks every member without anything having been published: only for measuring what
    /// the scripts alone can do (the benchmark's Redis ceiling), never for delivery.
    pub fn ack_unpublished(items: &'a [Claimed]) -> Self {
        Self {
            ack: items.iter().map(|c| c.member.as_slice()).collect(),
            ..Self::default()
        }
    }
}

/// A member the broker did not take.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// The member.
    pub member: &'a [u8],
    /// Wait before it is due again, if it is retried.
    pub retry_in: Duration,
    /// Bounded label, also the dead-letter reason.
    pub reason: std::borrow::Cow<'static, str>,
    /// Dead-letter now: retrying cannot help.
    pub permanent: bool,
    /// Kept with the dead letter's reason: what exactly was wrong (a parser's message).
    pub detail: Option<String>,
}

/// What the settle script did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Members removed from the in-flight set.
    pub acked: u64,
    /// Members put back.
    pub put_back: u64,
    /// Failed or put-back members whose scheduled copy (the producer added them again while
    /// in flight) became claimable because this batch let go of them: the workers should
    /// look again. Acks are not counted here (see [`ClaimBatch::skipped`]).
    pub released: u64,
    /// Per entry of `Settlement::fail`: whether it was retried, dead-lettered, or no longer ours.
    pub fail_outcomes: Vec<FailOutcome>,
}

/// Fate of one failed member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Its lease had expired and someone else holds it now, or it was already recovered.
    NotOwned,
    /// Back in the source set after its backoff.
    Retried,
    /// Moved to the dead-letter set.
    DeadLettered,
}

/// Sizes of one queue, read in one consistent script call.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct QueueStats {
    /// Members due now.
    pub due: u64,
    /// Members scheduled later.
    pub scheduled: u64,
    /// Members claimed and not yet settled.
    pub inflight: u64,
    /// Dead letters.
    pub dead: u64,
    /// Age of the oldest due member in seconds (0 when nothing is due).
    pub oldest_due_age_seconds: f64,
    /// Claims are paused by an operator (`delay-bridge pause`).
    pub paused: bool,
    /// Redis's clock when the sizes were read, epoch ms.
    #[serde(skip)]
    pub now_ms: i64,
    /// The earliest lease deadline in flight, epoch ms: recovery has work from then on.
    #[serde(skip)]
    pub earliest_lease_ms: Option<i64>,
    /// Entries in the attempts hash (the recovery's sweep has work while there are some).
    #[serde(skip)]
    pub attempt_entries: u64,
    /// Dead letters a forwarder may take (all but those the broker refused).
    #[serde(skip)]
    pub dead_forwardable: u64,
}

impl QueueStats {
    /// The sizes of a sharded queue from its shards': sums, the largest oldest due age, paused
    /// if any shard is, the earliest lease.
    pub fn sum(shards: &[QueueStats]) -> QueueStats {
        let mut t = QueueStats::default();
        for s in shards {
            t.due += s.due;
            t.scheduled += s.scheduled;
            t.inflight += s.inflight;
            t.dead += s.dead;
            t.oldest_due_age_seconds = t.oldest_due_age_seconds.max(s.oldest_due_age_seconds);
            t.paused |= s.paused;
            t.now_ms = t.now_ms.max(s.now_ms);
            t.earliest_lease_ms = match (t.earliest_lease_ms, s.earliest_lease_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            t.attempt_entries += s.attempt_entries;
            t.dead_forwardable += s.dead_forwardable;
        }
        t
    }
}

/// What one recover call did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Members whose expired lease went back to the source set.
    pub recovered: u64,
    /// Where the sweep of stale attempt entries goes on (`"0"`: a pass just ended).
    pub cursor: String,
    /// Stale attempt entries removed.
    pub swept: u64,
}

pub use crate::scripts::CANCEL;
use crate::scripts::SCRIPTS;

/// A queue's keys plus a shared, auto-reconnecting Redis connection.
///
/// Scripts are sent by SHA (`EVALSHA`) and in full (`EVAL`, by the connection) when Redis
/// answers `NOSCRIPT`, e.g. after a restart or a failover.
#[derive(Clone)]
pub struct Store {
    conn: Conn,
    keys: std::sync::Arc<QueueKeys>,
    /// Hash payload mode: the most body bytes one claim returns. `None`: inline mode.
    claim_bytes: Option<usize>,
    /// Hash payload mode: larger bodies are not read, only their size is (0: no limit).
    largest_body: usize,
    /// The rate limit: messages per millisecond and the most tokens (the burst).
    rate: Option<(f64, u32)>,
}

impl Store {
    /// A store for `keys` on `conn`.
    pub fn new(conn: Conn, keys: QueueKeys) -> Self {
        Self {
            conn,
            keys: std::sync::Arc::new(keys),
            claim_bytes: None,
            largest_body: 0,
            rate: None,
        }
    }

    /// Hash payload mode: bodies over `bytes` are not read by the claim, only their size
    /// ([`Body::TooLarge`]), so one oversized body costs Redis nothing but a length.
    pub fn with_largest_body(mut self, bytes: usize) -> Self {
        self.largest_body = bytes;
        self
    }

    /// Limits claims to `per_second` members on average, `burst` at once, across every
    /// bridge on this queue (a token bucket in the control hash, on the Redis clock).
    pub fn with_rate_limit(mut self, per_second: f64, burst: u32) -> Self {
        self.rate = Some((per_second / 1000.0, burst.max(1)));
        self
    }

    /// Hash payload mode: members are ids, bodies live in the bodies hash, and one claim
    /// returns at most `claim_bytes` of them (at least one member, whatever its size).
    pub fn with_hash_bodies(mut self, claim_bytes: usize) -> Self {
        self.claim_bytes = Some(claim_bytes.max(1));
        self
    }

    /// Whether members are ids with their bodies in the bodies hash.
    pub fn hash_bodies(&self) -> bool {
        self.claim_bytes.is_some()
    }

    /// The keys of this queue.
    pub fn keys(&self) -> &QueueKeys {
        &self.keys
    }

    /// An invocation of `script` with the queue's eight keys, in the order every script takes.
    fn keyed<'s>(&self, script: &'s Script) -> redis::ScriptInvocation<'s> {
        let mut inv = script.prepare_invoke();
        for key in self.keys.all() {
            inv.key(key);
        }
        inv
    }

    /// Claims up to `batch` due members with a lease of `lease`.
    pub async fn claim(&self, batch: usize, lease: Duration) -> Result<ClaimBatch, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .keyed(&SCRIPTS.claim)
            .arg(batch)
            .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
            .arg(self.claim_bytes.unwrap_or(0))
            .arg(self.largest_body)
            .arg(self.rate.map_or(0.0, |(per_ms, _)| per_ms))
            .arg(self.rate.map_or(0, |(_, burst)| burst))
            .invoke_async(&mut conn)
            .await?;
        parse_claim(reply, self.hash_bodies())
    }

    /// Acks, fails and puts back the members of one batch in one script call.
    pub async fn settle(
        &self,
        deadline_ms: i64,
        max_attempts: u32,
        s: &Settlement<'_>,
    ) -> Result<Settled, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.keyed(&SCRIPTS.settle);
        inv.arg(deadline_ms)
            .arg(max_attempts)
            .arg(s.ack.len() + s.drop.len())
            .arg(s.fail.len())
            .arg(s.put_back.len())
            .arg(if self.hash_bodies() { "1" } else { "0" });
        for m in s.ack.iter().chain(&s.drop) {
            inv.arg(*m);
        }
        for f in &s.fail {
            inv.arg(f.member)
                .arg(u64::try_from(f.retry_in.as_millis()).unwrap_or(u64::MAX))
                .arg(f.reason.as_ref())
                .arg(if f.permanent { "1" } else { "0" })
                .arg(f.detail.as_deref().unwrap_or(""));
        }
        for c in &s.put_back {
            inv.arg(c.member.as_slice()).arg(c.due_raw.as_slice());
        }
        let reply: Vec<i64> = inv.invoke_async(&mut conn).await?;
        if reply.len() != 3 + s.fail.len() {
            return Err(StoreError::Reply("settle reply length"));
        }
        Ok(Settled {
            acked: reply[0] as u64,
            put_back: reply[1] as u64,
            released: reply[2] as u64,
            fail_outcomes: reply[3..]
                .iter()
                .map(|o| match o {
                    1 => FailOutcome::Retried,
                    2 => FailOutcome::DeadLettered,
                    _ => FailOutcome::NotOwned,
                })
                .collect(),
        })
    }

    /// Moves up to `limit` members with an expired lease back to the source set, then
    /// sweeps one page of stale attempt entries from `sweep` (a cursor, `"0"` to start a
    /// pass; `None` sweeps nothing).
    pub async fn recover(
        &self,
        limit: usize,
        sweep: Option<&str>,
    ) -> Result<Recovered, StoreError> {
        let mut conn = self.conn.clone();
        let (recovered, cursor, swept): (u64, String, u64) = self
            .keyed(&SCRIPTS.recover)
            .arg(limit)
            .arg(sweep.unwrap_or(""))
            .invoke_async(&mut conn)
            .await?;
        Ok(Recovered {
            recovered,
            cursor,
            swept,
        })
    }

    /// Schedules `body` under `id` at `due_ms` (hash payload mode): the body and the id in
    /// one transaction, as producers do.
    pub async fn schedule_by_id(
        &self,
        id: &[u8],
        body: &[u8],
        due_ms: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        redis::pipe()
            .atomic()
            .hset(&self.keys.bodies, id, body)
            .ignore()
            .zadd(&self.keys.source, id, due_ms)
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Pauses (`true`) or resumes claims of this queue, for every bridge at its next claim;
    /// returns whether that changed anything. One command: nothing half-done on a bad key.
    /// A stray value of the field is read as the claim script reads it (`pause_value` in the
    /// prelude): pausing writes the canonical `1`, resuming deletes the field.
    pub async fn set_paused(&self, paused: bool) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let was: Option<String> = redis::cmd("HGET")
            .arg(&self.keys.control)
            .arg("paused")
            .query_async(&mut conn)
            .await?;
        let was_paused = was.as_deref().is_some_and(pauses);
        if paused {
            if was.as_deref() != Some("1") {
                redis::cmd("HSET")
                    .arg(&self.keys.control)
                    .arg("paused")
                    .arg(1)
                    .query_async::<i64>(&mut conn)
                    .await?;
            }
        } else if was.is_some() {
            redis::cmd("HDEL")
                .arg(&self.keys.control)
                .arg("paused")
                .query_async::<i64>(&mut conn)
                .await?;
        }
        Ok(was_paused != paused)
    }

    /// Cancels the message scheduled under `id` (hash payload mode) with the producers'
    /// cancel script; returns whether it was scheduled.
    pub async fn cancel_by_id(&self, id: &[u8]) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let removed: i64 = SCRIPTS
            .cancel
            .key(&self.keys.source)
            .key(&self.keys.inflight)
            .key(&self.keys.dead)
            .key(&self.keys.bodies)
            .arg(id)
            .invoke_async(&mut conn)
            .await?;
        Ok(removed == 1)
    }

    /// Reads the queue's sizes and the age of its oldest due member.
    pub async fn stats(&self) -> Result<QueueStats, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = SCRIPTS
            .stats
            .key(&self.keys.source)
            .key(&self.keys.inflight)
            .key(&self.keys.dead)
            .key(&self.keys.control)
            .key(&self.keys.attempts)
            .invoke_async(&mut conn)
            .await?;
        let Value::Array(items) = reply else {
            return Err(StoreError::Reply("stats reply is not an array"));
        };
        let int = |i: usize| match items.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            _ => Err(StoreError::Reply("stats field is not an integer")),
        };
        let now = int(0)?;
        let due = int(1)? as u64;
        let total = int(2)? as u64;
        let oldest = match items.get(5) {
            Some(Value::BulkString(b)) if !b.is_empty() => score_ms(b),
            _ => None,
        };
        Ok(QueueStats {
            due,
            scheduled: total.saturating_sub(due),
            inflight: int(3)? as u64,
            dead: int(4)? as u64,
            // A `-inf` score saturates to i64::MIN: subtracting it must not overflow.
            oldest_due_age_seconds: oldest
                .map_or(0.0, |o| now.saturating_sub(o).max(0) as f64 / 1000.0),
            paused: int(6)? == 1,
            now_ms: now,
            earliest_lease_ms: match items.get(7) {
                Some(Value::BulkString(b)) if !b.is_empty() => score_ms(b),
                _ => None,
            },
            attempt_entries: int(8)? as u64,
            dead_forwardable: int(9)? as u64,
        })
    }
}

/// Whether a value of the control hash's `paused` field pauses the queue: `0`, `false`, `no`
/// and the empty value do not, anything else does (`pause_value` in the prelude).
pub fn pauses(value: &str) -> bool {
    !matches!(
        value.to_ascii_lowercase().as_str(),
        "0" | "false" | "no" | ""
    )
}

/// Parses a Redis score ("1732240000000", "-inf", "1.5e12") into epoch ms, saturating infinities.
pub fn score_ms(raw: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(raw).ok()?;
    let f: f64 = s.parse().ok().or(match s {
        "inf" | "+inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => None,
    })?;
    Some(f as i64)
}

fn parse_claim(reply: Value, hash: bool) -> Result<ClaimBatch, StoreError> {
    let Value::Array(items) = reply else {
        return Err(StoreError::Reply("claim reply is not an array"));
    };
    let width = if hash { 4 } else { 3 };
    if items.len() < 7 || (items.len() - 7) % width != 0 {
        return Err(StoreError::Reply("claim reply length"));
    }
    let mut it = items.into_iter();
    let (
        Some(Value::Int(now_ms)),
        Some(Value::Int(deadline_ms)),
        Some(head),
        Some(Value::Int(skipped)),
        Some(Value::Int(paused)),
        Some(Value::Int(wait)),
        Some(Value::Int(repaired)),
    ) = (
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
    let mut out = Vec::with_capacity(it.len() / width);
    while let (Some(m), Some(score), Some(attempt)) = (it.next(), it.next(), it.next()) {
        let (Value::BulkString(member), Value::BulkString(due_raw), Value::Int(attempt)) =
            (m, score, attempt)
        else {
            return Err(StoreError::Reply("claimed member"));
        };
        let body = Body::from_reply(hash, &mut it)?;
        let due_ms = score_ms(&due_raw).ok_or(StoreError::Reply("due score"))?;
        out.push(Claimed {
            member,
            body,
            due_raw,
            due_ms,
            attempt: attempt.clamp(1, u32::MAX as i64) as u32,
        });
    }
    Ok(ClaimBatch {
        now_ms,
        deadline_ms,
        next_head_ms,
        skipped: u64::try_from(skipped).unwrap_or(0),
        paused: paused == 1,
        rate_wait: (wait > 0).then(|| Duration::from_millis(wait as u64)),
        repaired: u64::try_from(repaired).unwrap_or(0),
        items: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_parse_and_saturate() {
        assert_eq!(score_ms(b"1732240000000"), Some(1_732_240_000_000));
        assert_eq!(score_ms(b"-inf"), Some(i64::MIN));
        assert_eq!(score_ms(b"inf"), Some(i64::MAX));
        assert_eq!(score_ms(b"1.5e3"), Some(1500));
        assert_eq!(score_ms(b"x"), None);
    }
}
