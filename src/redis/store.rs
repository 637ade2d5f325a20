//! The calls on one queue, each script beside its caller and its reply's parse (`claim`,
//! `settle`, `recover`, `stats`, `cancel`, ...); dead letters and members in flight (in
//! `dead`); what operators do to a queue (in `operate`).

use crate::redis::conn::Conn;
use redis::Script;

use crate::keys::QueueKeys;

mod cancel;
mod claim;
mod cursor;
mod dead;
mod dead_forward;
mod find;
mod held;
mod ingest;
mod operate;
mod recover;
mod schedule;
mod schedule_defs;
mod settle;
mod stats;
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
pub use recover::Recovered;
pub use schedule::{Enqueued, Mark, Offer};
pub use settle::{FailOutcome, Failure, Settled, Settlement};
pub use stats::QueueStats;

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

    /// A store for the queue `key` on the local test Redis (127.0.0.1:6379).
    #[cfg(test)]
    pub(crate) async fn on_local_redis(key: &str) -> Self {
        let conn = Conn::open("redis://127.0.0.1:6379")
            .await
            .expect("the local Redis");
        Self::new(conn, QueueKeys::derive(key).expect("a queue key"))
    }

    /// Deletes the queue's keys and its schedules' (a test's own queue, once it is done).
    #[cfg(test)]
    pub(crate) async fn delete_all(&self) {
        let mut keys: Vec<String> = self.keys.all().iter().map(|k| k.to_string()).collect();
        keys.extend([
            self.schedules_key(),
            self.schedule_defs_key(),
            self.schedule_rev_key(),
        ]);
        let mut conn = self.conn.clone();
        let _: Result<i64, _> = redis::AsyncCommands::del(&mut conn, keys).await;
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

    /// [`hash_bodies`](Self::hash_bodies) as the scripts take it: `1` or `0`.
    fn hash_flag(&self) -> &'static str {
        if self.hash_bodies() {
            "1"
        } else {
            "0"
        }
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
}

/// Whether a value of the control hash's `paused` field pauses the queue: `0`, `false`, `no`
/// and the empty value do not, anything else does (`pause_value` in the prelude).
pub fn pauses(value: &str) -> bool {
    !matches!(
        value.to_ascii_lowercase().as_str(),
        "0" | "false" | "no" | ""
    )
}

/// A duration as a script's milliseconds argument (saturated).
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
