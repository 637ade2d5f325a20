//! A queue's sizes and the age of its oldest due member, read in one script call (`stats.lua`).

use redis::Value;

use super::{score_ms, Store, StoreError, SCRIPTS};

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

impl Store {
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
}
