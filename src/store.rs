//! The Redis side of a queue: the claim, settle, recover, requeue and stats scripts.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Script, Value};

use crate::keys::QueueKeys;

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
                if e.kind() == redis::ErrorKind::TypeError
                    || e.to_string().contains("WRONGTYPE") =>
            {
                "wrong_type"
            }
            StoreError::Redis(e) if e.kind() == redis::ErrorKind::ResponseError => "script",
            StoreError::Redis(_) => "other",
            StoreError::Reply(_) => "reply",
        }
    }
}

/// One claimed member.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The member bytes (the payload in inline mode).
    pub member: Vec<u8>,
    /// The score as Redis printed it, to put the member back exactly.
    pub due_raw: Vec<u8>,
    /// The due time in epoch milliseconds (saturated for infinities).
    pub due_ms: i64,
    /// 1 for the first delivery, then one more per failure or expired lease.
    pub attempt: u32,
}

/// The result of one claim.
#[derive(Debug, Default)]
pub struct ClaimBatch {
    /// Redis server time of the claim, epoch ms.
    pub now_ms: i64,
    /// Lease deadline of every member of this batch; also the batch's ownership token.
    pub deadline_ms: i64,
    /// Score of the earliest member left in the source set.
    pub next_head_ms: Option<f64>,
    /// The claimed members, earliest first.
    pub items: Vec<Claimed>,
}

/// What to do with each member of a settled batch.
#[derive(Debug, Default)]
pub struct Settlement<'a> {
    /// Confirmed by the broker: remove.
    pub ack: Vec<&'a [u8]>,
    /// Rejected: (member, retry delay, reason label, dead-letter now).
    pub fail: Vec<(&'a [u8], Duration, &'a str, bool)>,
    /// Not attempted or interrupted: back to the source set with their original score.
    pub put_back: Vec<(&'a [u8], &'a [u8])>,
}

/// What the settle script did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Members removed from the in-flight set.
    pub acked: u64,
    /// Members put back.
    pub put_back: u64,
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
}

struct Scripts {
    claim: Script,
    settle: Script,
    recover: Script,
    requeue: Script,
    stats: Script,
}

static SCRIPTS: std::sync::LazyLock<Scripts> = std::sync::LazyLock::new(|| Scripts {
    claim: Script::new(include_str!("scripts/claim.lua")),
    settle: Script::new(include_str!("scripts/settle.lua")),
    recover: Script::new(include_str!("scripts/recover.lua")),
    requeue: Script::new(include_str!("scripts/requeue.lua")),
    stats: Script::new(include_str!("scripts/stats.lua")),
});

/// A queue's keys plus a shared, auto-reconnecting Redis connection.
///
/// Scripts are sent by SHA (`EVALSHA`) and loaded again when Redis answers `NOSCRIPT`,
/// e.g. after a restart.
#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    keys: std::sync::Arc<QueueKeys>,
}

impl Store {
    /// A store for `keys` on `conn`.
    pub fn new(conn: ConnectionManager, keys: QueueKeys) -> Self {
        Self {
            conn,
            keys: std::sync::Arc::new(keys),
        }
    }

    /// The keys of this queue.
    pub fn keys(&self) -> &QueueKeys {
        &self.keys
    }

    /// Claims up to `batch` due members with a lease of `lease`.
    pub async fn claim(&self, batch: usize, lease: Duration) -> Result<ClaimBatch, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = SCRIPTS
            .claim
            .key(&self.keys.source)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .arg(batch)
            .arg(lease.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        parse_claim(reply)
    }

    /// Acks, fails and puts back the members of one batch in one script call.
    pub async fn settle(
        &self,
        deadline_ms: i64,
        max_attempts: u32,
        s: &Settlement<'_>,
    ) -> Result<Settled, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = SCRIPTS.settle.prepare_invoke();
        inv.key(&self.keys.source)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .key(&self.keys.dead)
            .key(&self.keys.dead_reasons)
            .arg(deadline_ms)
            .arg(max_attempts)
            .arg(s.ack.len())
            .arg(s.fail.len())
            .arg(s.put_back.len());
        for m in &s.ack {
            inv.arg(*m);
        }
        for (m, delay, reason, permanent) in &s.fail {
            inv.arg(*m)
                .arg(delay.as_millis() as u64)
                .arg(*reason)
                .arg(if *permanent { "1" } else { "0" });
        }
        for (m, due) in &s.put_back {
            inv.arg(*m).arg(*due);
        }
        let reply: Vec<i64> = inv.invoke_async(&mut conn).await?;
        if reply.len() != 2 + s.fail.len() {
            return Err(StoreError::Reply("settle reply length"));
        }
        Ok(Settled {
            acked: reply[0] as u64,
            put_back: reply[1] as u64,
            fail_outcomes: reply[2..]
                .iter()
                .map(|o| match o {
                    1 => FailOutcome::Retried,
                    2 => FailOutcome::DeadLettered,
                    _ => FailOutcome::NotOwned,
                })
                .collect(),
        })
    }

    /// Moves up to `limit` members with an expired lease back to the source set.
    pub async fn recover(&self, limit: usize) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let n: u64 = SCRIPTS
            .recover
            .key(&self.keys.source)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .arg(limit)
            .invoke_async(&mut conn)
            .await?;
        Ok(n)
    }

    /// Moves dead letters back to the source set: the named ones, or up to `limit` of the oldest.
    pub async fn requeue_dead(&self, members: &[Vec<u8>], limit: usize) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = SCRIPTS.requeue.prepare_invoke();
        inv.key(&self.keys.source)
            .key(&self.keys.attempts)
            .key(&self.keys.dead)
            .key(&self.keys.dead_reasons)
            .arg(limit);
        for m in members {
            inv.arg(m.as_slice());
        }
        Ok(inv.invoke_async(&mut conn).await?)
    }

    /// Lists up to `limit` dead letters, oldest first: (member, dead-lettered at ms, reason JSON).
    pub async fn list_dead(
        &self,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, i64, Option<String>)>, StoreError> {
        if limit == 0 {
            // ZRANGE 0 -1 would list everything.
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let items: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys.dead)
            .arg(0)
            .arg(limit as i64 - 1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&self.keys.dead_reasons);
        for (m, _) in &items {
            hmget.arg(m.as_slice());
        }
        let reasons: Vec<Option<String>> = hmget.query_async(&mut conn).await?;
        Ok(items
            .into_iter()
            .zip(reasons)
            .map(|((m, at), r)| (m, at as i64, r))
            .collect())
    }

    /// Reads the queue's sizes and the age of its oldest due member.
    pub async fn stats(&self) -> Result<QueueStats, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = SCRIPTS
            .stats
            .key(&self.keys.source)
            .key(&self.keys.inflight)
            .key(&self.keys.dead)
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
        })
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

fn parse_claim(reply: Value) -> Result<ClaimBatch, StoreError> {
    let Value::Array(items) = reply else {
        return Err(StoreError::Reply("claim reply is not an array"));
    };
    if items.len() < 3 || (items.len() - 3) % 3 != 0 {
        return Err(StoreError::Reply("claim reply length"));
    }
    let mut it = items.into_iter();
    let (Some(Value::Int(now_ms)), Some(Value::Int(deadline_ms)), Some(head)) =
        (it.next(), it.next(), it.next())
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
    let mut out = Vec::with_capacity(it.len() / 3);
    while let (Some(m), Some(score), Some(attempt)) = (it.next(), it.next(), it.next()) {
        let (Value::BulkString(member), Value::BulkString(due_raw), Value::Int(attempt)) =
            (m, score, attempt)
        else {
            return Err(StoreError::Reply("claimed member"));
        };
        let due_ms = score_ms(&due_raw).ok_or(StoreError::Reply("due score"))?;
        out.push(Claimed {
            member,
            due_raw,
            due_ms,
            attempt: attempt.clamp(1, u32::MAX as i64) as u32,
        });
    }
    Ok(ClaimBatch {
        now_ms,
        deadline_ms,
        next_head_ms,
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
