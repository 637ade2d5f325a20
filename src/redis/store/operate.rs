//! What operators do to a queue: browse what is scheduled, find one message, forecast, promote or reschedule, purge.

use std::time::Duration;

use redis::Value;

use super::cursor::{Cursor, CURSOR_MEMBER_MAX};
use super::{millis, score_arg, score_ms, Store, StoreError, SCRIPTS};

/// Most entries one page of [`Store::browse`] returns.
pub const MAX_PAGE: usize = 1000;
/// Most buckets one [`Store::forecast`] counts.
pub const MAX_BUCKETS: usize = 1440;
/// Body bytes a listed entry shows (browse and dead letters, hash payload mode).
pub const PREVIEW: usize = 256;
/// Largest body a list reads to show its first bytes: a larger one is listed with its size
/// only, as Redis cannot read the start of a hash field without copying all of it.
pub const LIST_BODY_MAX: u64 = 16 * 1024;

/// Member and preview bytes after which a list's page ends (it always has its first entry):
/// a page costs Redis, the bridge and the network about this much, whatever is stored.
pub(super) const LIST_BUDGET: usize = 1024 * 1024;
/// Largest body that showing one message returns; a larger one is shown by its size only.
pub const SHOW_BODY_MAX: u64 = 1024 * 1024;
/// Members one reschedule or purge script call takes; the store makes as many calls as needed.
const CHUNK: usize = 1000;

/// One scheduled member, as browsing shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ScheduledEntry {
    /// The member (the id in hash payload mode).
    #[serde(serialize_with = "lossy")]
    pub member: Vec<u8>,
    /// Due time, epoch ms (saturated for infinite scores).
    pub due_ms: i64,
    /// Failed attempts of this copy so far.
    pub attempts: u32,
    /// Hash payload mode: the body's size, `None` when the id has no body.
    pub body_size: Option<u64>,
    /// Hash payload mode: the body's first bytes.
    #[serde(serialize_with = "lossy")]
    pub body_preview: Vec<u8>,
    /// The due score as Redis wrote it, for a cursor after this entry.
    #[serde(skip)]
    pub score: String,
}

impl ScheduledEntry {
    /// Browsing order: due score, then member (as in a sorted set).
    pub fn order(&self, other: &Self) -> std::cmp::Ordering {
        let score = |e: &Self| e.score.parse::<f64>().unwrap_or(f64::NAN);
        score(self)
            .total_cmp(&score(other))
            .then_with(|| self.member.cmp(&other.member))
    }

    /// The cursor of a page that ends with this entry.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            score: self.score.clone(),
            member: self.member.clone(),
            place: None,
        }
    }
}

fn lossy<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes))
}

/// One page of scheduled members, earliest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The entries.
    pub items: Vec<ScheduledEntry>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
}

/// Where a member is.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Place {
    /// In the source set, due at `due_ms`, after `attempts` failed attempts.
    Scheduled {
        /// Due time, epoch ms.
        due_ms: i64,
        /// Failed attempts of this copy.
        attempts: u32,
    },
    /// Claimed by a bridge, leased until `lease_deadline_ms`.
    InFlight {
        /// Lease deadline, epoch ms.
        lease_deadline_ms: i64,
    },
    /// A dead letter since `at_ms`, with its reason JSON.
    Dead {
        /// When it was dead-lettered, epoch ms.
        at_ms: i64,
        /// The reason JSON (reason, attempts, detail).
        reason: Option<String>,
    },
}

/// A member and every place it is in (a member added again while in flight is in two).
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// Scheduled, in flight, dead: each place it is in.
    pub places: Vec<Place>,
    /// Hash payload mode: its body's size, if it has one.
    pub body_size: Option<u64>,
    /// Hash payload mode: its body, if it has one of at most [`SHOW_BODY_MAX`] bytes.
    pub body: Option<Vec<u8>>,
}

/// How many members fall due in each bucket from now on.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Forecast {
    /// Redis time the counts were taken at, epoch ms.
    pub now_ms: i64,
    /// Width of each bucket in ms.
    pub bucket_ms: u64,
    /// Due already.
    pub overdue: u64,
    /// Members due in `[now + i * bucket, now + (i + 1) * bucket)`.
    pub buckets: Vec<u64>,
    /// Due after the last bucket.
    pub later: u64,
}

/// What [`Store::purge`] deletes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Purge {
    /// Scheduled members due within `[from, to]` epoch ms (`None`: unbounded).
    Scheduled {
        /// Earliest due time.
        from: Option<i64>,
        /// Latest due time.
        to: Option<i64>,
    },
    /// Every dead letter.
    Dead,
}

fn bound(ms: Option<i64>, open: &str) -> String {
    ms.map_or_else(|| open.to_string(), score_arg)
}

impl Store {
    /// A page of at most `limit` (1..=[`MAX_PAGE`]) scheduled members due within
    /// `[from, to]`, earliest first, starting after `after`. Paging never re-reads what
    /// earlier pages covered, however large the queue.
    pub async fn browse(
        &self,
        from: Option<i64>,
        to: Option<i64>,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let limit = limit.clamp(1, MAX_PAGE);
        let mut conn = self.conn.clone();
        let mut inv = self.keyed(&SCRIPTS.browse);
        inv.arg(bound(from, "-inf"))
            .arg(bound(to, "+inf"))
            .arg(limit)
            .arg(after.map_or("", |c| c.score.as_str()))
            .arg(after.map_or(&[][..], |c| c.member.as_slice()))
            .arg(if self.hash_bodies() { PREVIEW } else { 0 })
            .arg(LIST_BODY_MAX)
            .arg(LIST_BUDGET)
            .arg(
                after
                    .and_then(|c| c.place)
                    .map_or(String::new(), |p| p.to_string()),
            );
        let Value::Array(reply) = inv.invoke_async(&mut conn).await? else {
            return Err(StoreError::Reply("browse reply is not an array"));
        };
        let [Value::Int(cut), Value::Int(place), reply @ ..] = reply.as_slice() else {
            return Err(StoreError::Reply("browse reply"));
        };
        let mut items = Vec::new();
        for entry in reply.chunks(5) {
            let [Value::BulkString(member), Value::BulkString(score), Value::BulkString(entry), Value::Int(size), Value::BulkString(preview)] =
                entry
            else {
                return Err(StoreError::Reply("browse entry"));
            };
            let due_ms = score_ms(score).ok_or(StoreError::Reply("due score"))?;
            items.push(ScheduledEntry {
                member: member.clone(),
                due_ms,
                attempts: attempts_of(entry, score),
                body_size: u64::try_from(*size).ok(),
                body_preview: preview.clone(),
                score: String::from_utf8_lossy(score).into_owned(),
            });
        }
        let next = items
            .last()
            .filter(|_| items.len() == limit || *cut == 1)
            .map(|last| match last.member.len() > CURSOR_MEMBER_MAX {
                true => Cursor {
                    score: last.score.clone(),
                    member: Vec::new(),
                    place: u64::try_from(*place).ok(),
                },
                false => last.cursor(),
            });
        Ok(Page { items, next })
    }

    /// Where `member` (the id in hash payload mode) is, with its body in hash mode.
    pub async fn find(&self, member: &[u8]) -> Result<Found, StoreError> {
        let mut conn = self.conn.clone();
        let k = self.keys();
        #[allow(clippy::type_complexity)]
        let (due, entry, lease, dead, reason, body): (
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            u64,
        ) = redis::pipe()
            .zscore(&k.source, member)
            .hget(&k.attempts, member)
            .zscore(&k.inflight, member)
            .zscore(&k.dead, member)
            .hget(&k.dead_reasons, member)
            .cmd("HSTRLEN")
            .arg(&k.bodies)
            .arg(member)
            .query_async(&mut conn)
            .await?;
        // The body is read only when it exists and is within the limit (HSTRLEN reads nothing).
        let exists = self.hash_bodies()
            && redis::cmd("HEXISTS")
                .arg(&k.bodies)
                .arg(member)
                .query_async::<bool>(&mut conn)
                .await?;
        let (body_size, body) = if !exists {
            (None, None)
        } else if body > SHOW_BODY_MAX {
            (Some(body), None)
        } else {
            let read: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(&k.bodies)
                .arg(member)
                .query_async(&mut conn)
                .await?;
            (Some(body), Some(read.unwrap_or_default()))
        };
        let ms = |s: &str| score_ms(s.as_bytes()).ok_or(StoreError::Reply("score"));
        let mut places = Vec::new();
        if let Some(due) = due {
            let attempts = entry.map_or(0, |e| attempts_of(e.as_bytes(), due.as_bytes()));
            places.push(Place::Scheduled {
                due_ms: ms(&due)?,
                attempts,
            });
        }
        if let Some(lease) = lease {
            places.push(Place::InFlight {
                lease_deadline_ms: ms(&lease)?,
            });
        }
        if let Some(at) = dead {
            places.push(Place::Dead {
                at_ms: super::dead_at_ms(ms(&at)?, reason.as_deref()),
                reason,
            });
        }
        Ok(Found {
            places,
            body_size,
            body,
        })
    }

    /// The Redis server's clock, epoch ms: the "now" every script uses.
    pub async fn now_ms(&self) -> Result<i64, StoreError> {
        let mut conn = self.conn.clone();
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok(s * 1000 + us / 1000)
    }

    /// Counts what falls due in `buckets` (1..=[`MAX_BUCKETS`]) consecutive windows of
    /// `bucket` from now on: the clock, then one ZCOUNT each in one pipeline.
    pub async fn forecast(&self, bucket: Duration, buckets: usize) -> Result<Forecast, StoreError> {
        let buckets = buckets.clamp(1, MAX_BUCKETS);
        let bucket_ms = millis(bucket).max(1);
        let now = self.now_ms().await?;
        let mut conn = self.conn.clone();
        let source = &self.keys().source;
        let mut pipe = redis::pipe();
        pipe.zcount(source, "-inf", format!("({now}"));
        let edge = |i: usize| now.saturating_add((bucket_ms as i64).saturating_mul(i as i64));
        for i in 0..buckets {
            pipe.zcount(source, edge(i), format!("({}", edge(i + 1)));
        }
        pipe.zcount(source, edge(buckets), "+inf");
        let counts: Vec<u64> = pipe.query_async(&mut conn).await?;
        let (overdue, rest) = counts
            .split_first()
            .ok_or(StoreError::Reply("forecast counts"))?;
        let (later, buckets) = rest
            .split_last()
            .ok_or(StoreError::Reply("forecast counts"))?;
        Ok(Forecast {
            now_ms: now,
            bucket_ms,
            overdue: *overdue,
            buckets: buckets.to_vec(),
            later: *later,
        })
    }

    /// Cancels a scheduled message: its exact member inline (`ZREM`), by id in hash mode
    /// (the producers' cancel script, which drops the body unless a copy needs it).
    /// Returns whether it was scheduled.
    pub async fn cancel(&self, member: &[u8]) -> Result<bool, StoreError> {
        if self.hash_bodies() {
            return self.cancel_by_id(member).await;
        }
        let mut conn = self.conn.clone();
        let n: i64 = redis::cmd("ZREM")
            .arg(&self.keys().source)
            .arg(member)
            .query_async(&mut conn)
            .await?;
        Ok(n == 1)
    }

    /// How many scheduled members are due within `[from, to]` epoch ms.
    pub async fn count_scheduled(
        &self,
        from: Option<i64>,
        to: Option<i64>,
    ) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("ZCOUNT")
            .arg(&self.keys().source)
            .arg(bound(from, "-inf"))
            .arg(bound(to, "+inf"))
            .query_async(&mut conn)
            .await?)
    }

    /// Gives scheduled `members` a new due time: `due_ms`, or the Redis clock's now. With
    /// `earlier_only` (promote) a member only moves earlier. Members not scheduled are left
    /// alone; their attempt counts move with them. Returns how many changed.
    pub async fn reschedule(
        &self,
        members: &[Vec<u8>],
        due_ms: Option<i64>,
        earlier_only: bool,
    ) -> Result<u64, StoreError> {
        let mut changed = 0;
        for chunk in members.chunks(CHUNK) {
            let mut conn = self.conn.clone();
            let mut inv = self.keyed(&SCRIPTS.reschedule);
            inv.arg(due_ms.map_or_else(String::new, score_arg))
                .arg(if earlier_only { "earlier" } else { "" });
            for m in chunk {
                inv.arg(m.as_slice());
            }
            let (n, _now): (u64, i64) = inv.invoke_async(&mut conn).await?;
            changed += n;
        }
        Ok(changed)
    }

    /// Deletes what `what` names, [`CHUNK`] members per script call, until nothing
    /// is left (members in flight are never touched). Returns how many were deleted.
    pub async fn purge(&self, what: Purge) -> Result<u64, StoreError> {
        let (kind, from, to) = match what {
            Purge::Scheduled { from, to } => ("scheduled", bound(from, "-inf"), bound(to, "+inf")),
            Purge::Dead => ("dead", "-inf".to_string(), "+inf".to_string()),
        };
        let mut deleted = 0;
        loop {
            let mut conn = self.conn.clone();
            let n: u64 = self
                .keyed(&SCRIPTS.purge)
                .arg(kind)
                .arg(CHUNK)
                .arg(&from)
                .arg(&to)
                .arg(self.hash_flag())
                .invoke_async(&mut conn)
                .await?;
            deleted += n;
            if n < CHUNK as u64 {
                return Ok(deleted);
            }
        }
    }
}

/// The failed attempts an attempt entry (`count:stamp`) records for the copy whose score
/// is `score`: 0 when it belongs to another copy.
fn attempts_of(entry: &[u8], score: &[u8]) -> u32 {
    let entry = String::from_utf8_lossy(entry);
    let Some((count, stamp)) = entry.split_once(':') else {
        return 0;
    };
    let (Ok(stamp), Some(score)) = (
        stamp.parse::<f64>(),
        std::str::from_utf8(score)
            .ok()
            .and_then(|s| s.parse::<f64>().ok()),
    ) else {
        return 0;
    };
    if stamp == score {
        count.parse().unwrap_or(0)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_any_member_bytes_and_refuse_garbage() {
        let c = Cursor {
            score: "1732240000000".into(),
            member: b"\xff\x00:a b".to_vec(),
            place: None,
        };
        assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        let c = Cursor {
            score: "inf".into(),
            member: Vec::new(),
            place: Some(3),
        };
        assert_eq!(c.to_string(), "inf#3");
        assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        for bad in ["", "12", "x:YQ", "12:***", "12#x", "NaN#1"] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad}");
        }
    }

    #[test]
    fn attempt_entries_count_only_for_their_own_copy() {
        assert_eq!(attempts_of(b"3:1500", b"1500"), 3);
        assert_eq!(attempts_of(b"3:1500", b"1501"), 0);
        assert_eq!(attempts_of(b"junk", b"1500"), 0);
    }
}
