//! Storing a message an ingress took from a broker: once per id, scheduled or dead-lettered.

use redis::Value;

use super::{Store, StoreError, SCRIPTS};

/// Where an ingested message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingest<'a> {
    /// Due this many milliseconds from now on the Redis clock (0 or less: now).
    In(i64),
    /// Due at this time, epoch ms.
    At(i64),
    /// Refused: a dead letter with this reason label and detail (`""`: none).
    Dead {
        /// The reason label (`bad_delay`, `too_large`).
        reason: &'a str,
        /// What was wrong, in words.
        detail: &'a str,
    },
}

/// What the store made of an ingested message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ingested {
    /// `true` if stored now, `false` if the id was already scheduled, in flight or dead
    /// (a delivery seen before: nothing was written).
    pub stored: bool,
    /// Its due time (or when it was dead-lettered), epoch ms: now stored, or as found.
    pub at_ms: i64,
}

impl Store {
    /// Stores `body` under `id` (hash payload mode) as `how` says, unless the id is already
    /// scheduled, in flight or dead: one script call, idempotent.
    pub async fn ingest(
        &self,
        id: &[u8],
        body: &[u8],
        how: Ingest<'_>,
    ) -> Result<Ingested, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.keyed(&SCRIPTS.ingest);
        inv.arg(id).arg(body);
        match how {
            Ingest::In(ms) => inv.arg("in").arg(ms).arg("").arg(""),
            Ingest::At(ms) => inv.arg("at").arg(ms).arg("").arg(""),
            Ingest::Dead { reason, detail } => inv.arg("dead").arg(0).arg(reason).arg(detail),
        };
        let reply: Value = inv.invoke_async(&mut conn).await?;
        let Value::Array(items) = reply else {
            return Err(StoreError::Reply("ingest reply is not an array"));
        };
        match items.as_slice() {
            [Value::Int(stored), at] => Ok(Ingested {
                stored: *stored == 1,
                at_ms: match at {
                    Value::BulkString(raw) => {
                        super::score_ms(raw).ok_or(StoreError::Reply("ingest time"))?
                    }
                    _ => return Err(StoreError::Reply("ingest time")),
                },
            }),
            _ => Err(StoreError::Reply("ingest reply")),
        }
    }
}

/// The member the write probe names: whether it is in the set or not, the probe leaves it as
/// it is.
const PROBE_MEMBER: &str = "delay-bridge:write-probe";

impl Store {
    /// Whether Redis takes a write on this queue's node now: `ZADD K XX GT -inf` of one member,
    /// which adds nothing (`XX`) and moves nothing (no score is below `-inf`), so it changes no
    /// key and sends no notification, yet Redis refuses it as it refuses the ingest's writes
    /// (over `maxmemory`, `NOREPLICAS`, `READONLY`, `MISCONF`).
    pub async fn probe_write(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.source)
            .arg("XX")
            .arg("GT")
            .arg("-inf")
            .arg(PROBE_MEMBER)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}
