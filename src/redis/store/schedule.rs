//! A trigger's schedules in Redis: reading their marks, and the script that enqueues ticks
//! and moves a mark (`schedule.lua`).

use redis::Value;

use super::{Store, StoreError, SCRIPTS};

/// A schedule's mark as stored: the last tick enqueued and its member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mark {
    /// The stored value (`tick|member`), empty for a schedule that never enqueued: the
    /// script moves the mark only from the value its caller planned from.
    pub raw: Vec<u8>,
    /// The last tick enqueued, epoch ms.
    pub tick_ms: Option<i64>,
    /// Its message still waits unclaimed, as first enqueued.
    pub waiting: bool,
}

/// What one run of the schedule script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The mark moved from another value than the one planned from: plan again.
    pub stale: bool,
    /// The trigger is paused: nothing new was enqueued and the mark stayed.
    pub paused: bool,
    /// The mark's tick after the run, epoch ms.
    pub mark_ms: Option<i64>,
    /// Ticks enqueued.
    pub fired: u64,
    /// Ticks skipped or dropped as missed.
    pub missed: u64,
    /// The mark's message waits unclaimed.
    pub waiting: bool,
}

/// One run's request: the schedule, the mark planned from, its misfire settings and ticks.
pub struct Offer<'a> {
    /// The schedule's name.
    pub name: &'a str,
    /// The mark planned from ([`Mark::raw`]).
    pub planned: &'a [u8],
    /// `misfire_grace` in ms.
    pub grace_ms: i64,
    /// `skip`, `once` or `all`.
    pub policy: &'a str,
    /// `catch_up_limit`.
    pub limit: u32,
    /// Hash payload mode: the body stored under each tick's id.
    pub body: Option<&'a [u8]>,
    /// Missed ticks the plan left out.
    pub left_out: u64,
    /// Ticks and their members, ascending.
    pub ticks: Vec<(i64, Vec<u8>)>,
}

impl Store {
    /// The hash of this queue's schedule marks, in its slot (`K:schedules`).
    pub fn schedules_key(&self) -> String {
        let control = &self.keys().control;
        let base = control.strip_suffix(":control").unwrap_or(control);
        format!("{base}:schedules")
    }

    /// The Redis clock (epoch ms) and the mark of each of `names`.
    pub async fn schedule_marks(&self, names: &[&str]) -> Result<(i64, Vec<Mark>), StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.keyed(&SCRIPTS.schedule_read);
        inv.key(self.schedules_key());
        for name in names {
            inv.arg(*name);
        }
        let reply: Value = inv.invoke_async(&mut conn).await?;
        let Value::Array(items) = reply else {
            return Err(StoreError::Reply("schedule marks reply is not an array"));
        };
        let mut items = items.into_iter();
        let Some(Value::Int(now)) = items.next() else {
            return Err(StoreError::Reply("schedule marks time"));
        };
        let mut marks = Vec::with_capacity(names.len());
        while let (Some(raw), Some(Value::Int(waiting))) = (items.next(), items.next()) {
            let raw = match raw {
                Value::BulkString(b) => b,
                _ => return Err(StoreError::Reply("schedule mark")),
            };
            marks.push(Mark {
                tick_ms: mark_tick(&raw),
                raw,
                waiting: waiting == 1,
            });
        }
        if marks.len() != names.len() {
            return Err(StoreError::Reply("schedule marks count"));
        }
        Ok((now, marks))
    }

    /// Runs the schedule script for `offer`.
    pub async fn enqueue_ticks(&self, offer: &Offer<'_>) -> Result<Enqueued, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.keyed(&SCRIPTS.schedule);
        inv.key(self.schedules_key());
        inv.arg(offer.name)
            .arg(offer.planned)
            .arg(offer.grace_ms)
            .arg(offer.policy)
            .arg(offer.limit)
            .arg(offer.body.unwrap_or_default())
            .arg(offer.left_out);
        for (tick, member) in &offer.ticks {
            inv.arg(*tick).arg(member.as_slice());
        }
        let reply: Value = inv.invoke_async(&mut conn).await?;
        let Value::Array(items) = reply else {
            return Err(StoreError::Reply("schedule reply is not an array"));
        };
        let bad = StoreError::Reply("schedule reply");
        let [status, Value::Int(mark), Value::Int(fired), Value::Int(missed), Value::Int(waiting)] =
            items.as_slice()
        else {
            return Err(bad);
        };
        let status = match status {
            Value::BulkString(s) => s.as_slice(),
            Value::SimpleString(s) => s.as_bytes(),
            _ => return Err(bad),
        };
        Ok(Enqueued {
            stale: status == b"stale",
            paused: status == b"paused",
            mark_ms: (*mark >= 0).then_some(*mark),
            fired: u64::try_from(*fired).unwrap_or(0),
            missed: u64::try_from(*missed).unwrap_or(0),
            waiting: *waiting == 1,
        })
    }
}

/// The tick of a stored mark (`tick|member`).
fn mark_tick(raw: &[u8]) -> Option<i64> {
    let bar = raw.iter().position(|&b| b == b'|')?;
    std::str::from_utf8(&raw[..bar]).ok()?.parse().ok()
}
