//! The Redis side of a queue: the claim, settle, recover, requeue and stats scripts; dead
//! letters and members in flight (in `dead`); what operators do to a queue (in `operate`).

use std::time::Duration;

use crate::redis::conn::Conn;
use redis::{Script, Value};

use crate::keys::QueueKeys;

mod claim;
mod cursor;
mod dead;
mod dead_forward;
mod find;
mod held;
mod ingest;
mod operate;
mod schedule;
mod schedule_defs;
mod settle;
use claim::parse_claim;
pub use claim::{Body, ClaimBatch, Claimed};
pub use cursor::Cursor;
pub(crate) use dead::dead_at_ms;
pub use dead::{DeadLetter, DeadPage};
pub use dead_forward::{DeadClaim, DeadItem, DeadOutcome, DeadSettled};
pub use find::{envelope_id, FoundBy, IdScheme, Lookup};
pub use held::HeldNote;
pub use ingest::{Ingest, Ingested};
pub use operate::{
    Forecast, Found, Page, Place, Purge, ScheduledEntry, LIST_BODY_MAX, MAX_BUCKETS, MAX_PAGE,
    PREVIEW, SHOW_BODY_MAX,
};
pub use schedule::{Enqueued, Mark, Offer};
pub use settle::{FailOutcome, Failure, Settled, Settlement};

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

pub use crate::redis::scripts::CANCEL;
use crate::redis::scripts::SCRIPTS;

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
            .zadd(&self.keys.source, id, score_arg(due_ms))
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

    /// The due time of the earliest member due by `now` whose score is not `-inf`: a `-inf`
    /// member is due "now" and has no age, but must not hide the age of those behind it.
    async fn oldest_finite_due(&self, now: i64) -> Result<Option<i64>, StoreError> {
        let mut conn = self.conn.clone();
        let head: Vec<(Vec<u8>, String)> = redis::cmd("ZRANGE")
            .arg(&self.keys.source)
            .arg("(-inf")
            .arg(now)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        Ok(head.first().and_then(|(_, s)| score_ms(s.as_bytes())))
    }

    /// Reads the queue's sizes and the age of its oldest due member (a `-inf` member, due
    /// "now", has none: the age is that of the oldest member with a due time).
    pub async fn stats(&self) -> Result<QueueStats, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = self.keyed(&SCRIPTS.stats).invoke_async(&mut conn).await?;
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
        let mut oldest = match items.get(5) {
            Some(Value::BulkString(b)) if !b.is_empty() => score_ms(b),
            _ => None,
        };
        if oldest == Some(i64::MIN) {
            oldest = self.oldest_finite_due(now).await?;
        }
        Ok(QueueStats {
            due,
            scheduled: total.saturating_sub(due),
            inflight: int(3)? as u64,
            dead: int(4)? as u64,
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

/// A due time in epoch ms as a score argument: the ends of i64 (where [`score_ms`] saturates
/// the infinite scores) as `-inf` and `+inf`, so that a due time read comes back the same.
pub fn score_arg(ms: i64) -> String {
    match ms {
        i64::MIN => "-inf".to_string(),
        i64::MAX => "+inf".to_string(),
        ms => ms.to_string(),
    }
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
        for ms in [i64::MIN, i64::MAX, 0, -5, 1_732_240_000_000] {
            assert_eq!(score_ms(score_arg(ms).as_bytes()), Some(ms));
        }
    }
}
