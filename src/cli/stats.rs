//! `delay-bridge stats`: the backlog of every trigger, its state, its schedules, its shards,
//! and the keys that hold members this configuration does not serve.

use super::reach::{connect, queue_for};
use super::text::{fire_text, ms_text, say_json};
use crate::config::{Config, Trigger};
use crate::redis::conn::Conn;
use crate::redis::queue::Stranded;
use crate::redis::store::{HeldNote, QueueStats, Store};

/// One trigger's row of `stats`, and what stands under it.
struct TriggerStats {
    /// The trigger's name.
    name: String,
    /// Its stats, summed over its shards.
    total: QueueStats,
    /// Each shard's source key and stats.
    shards: Vec<(String, QueueStats)>,
    /// Keys this configuration does not serve that still hold members.
    stranded: Vec<Stranded>,
    /// Why its destination is held, while it is.
    held: Option<HeldNote>,
    /// Its schedules with their last and next fire.
    schedules: Vec<ScheduleRow>,
}

impl TriggerStats {
    /// A trigger's state: `paused` by an operator, `held` while its destination fails, else
    /// `active`.
    fn state(&self) -> &'static str {
        state(&self.total, self.held.as_ref())
    }
}

/// The backlog of every trigger; with `shards`, one row per shard of each sharded trigger too.
pub(super) async fn stats(config: Config, json: bool, shards: bool) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let mut rows = Vec::new();
    for t in &config.triggers {
        rows.push(trigger_stats(&config, &conn, t).await?);
    }
    if json {
        let v: Vec<_> = rows.iter().map(|row| stats_json(row, shards)).collect();
        return say_json(&v);
    }
    if let Some(master) = conn.endpoint().sentinel_master() {
        say!("redis: {master}");
    }
    say_stats(&rows, shards);
    Ok(0)
}

/// Reads one trigger's row of `stats` from Redis.
async fn trigger_stats(config: &Config, conn: &Conn, t: &Trigger) -> anyhow::Result<TriggerStats> {
    let queue = queue_for(config, conn.clone(), t.name())?;
    let each = queue.shard_stats().await?;
    let keys = queue.shards().iter().map(|s| s.keys().source.clone());
    Ok(TriggerStats {
        name: t.name().to_string(),
        total: QueueStats::sum(&each),
        shards: keys.zip(each).collect(),
        stranded: queue.stranded().await?,
        held: queue.held().await?,
        schedules: schedule_rows(&queue.shards()[0], t).await?,
    })
}

/// `stats --json`: one trigger's object; with `shards`, each shard of a sharded trigger too.
fn stats_json(row: &TriggerStats, shards: bool) -> serde_json::Value {
    let mut v = serde_json::json!({
        "trigger": row.name,
        "state": row.state(),
        "stats": row.total,
        "held": row.held,
    });
    if !row.schedules.is_empty() {
        v["schedules"] = serde_json::json!(row.schedules);
    }
    if !row.stranded.is_empty() {
        v["unserved_keys"] = serde_json::json!(row.stranded);
    }
    if shards && row.shards.len() > 1 {
        v["shards"] = row
            .shards
            .iter()
            .map(|(key, s)| serde_json::json!({"key": key, "stats": s}))
            .collect();
    }
    v
}

/// `stats` as a table: a line per trigger, with what is held, its schedules and (with
/// `shards`) its shards under it; then a warning for each key that holds members this
/// configuration does not serve.
fn say_stats(rows: &[TriggerStats], shards: bool) {
    say!(
        "{:<24} {:>12} {:>10} {:>10} {:>10} {:>16}  STATE",
        "TRIGGER",
        "SCHEDULED",
        "DUE",
        "INFLIGHT",
        "DEAD",
        "OLDEST_DUE_AGE"
    );
    let line = |name: &str, s: &QueueStats, state: &str| {
        say!(
            "{:<24} {:>12} {:>10} {:>10} {:>10} {:>15.3}s  {}",
            name,
            s.scheduled,
            s.due,
            s.inflight,
            s.dead,
            s.oldest_due_age_seconds,
            state
        );
    };
    for row in rows {
        line(&row.name, &row.total, row.state());
        if let Some(h) = &row.held {
            // Why, on the line under the trigger's.
            say!("  held: {} (since {})", h.reason, ms_text(h.since_ms));
        }
        say_rows(&row.schedules);
        if shards && row.shards.len() > 1 {
            for (key, s) in &row.shards {
                line(&format!("  {key}"), s, state(s, None));
            }
        }
    }
    for row in rows {
        for k in &row.stranded {
            say!(
                "warning: trigger {}: {k}, on a key this configuration does not serve \
                 (add `drain_shards = {}` to deliver them)",
                row.name,
                k.shards
            );
        }
    }
}

/// A trigger's state: `paused` by an operator, `held` while its destination fails, else
/// `active`.
fn state(s: &QueueStats, held: Option<&HeldNote>) -> &'static str {
    crate::trigger::State::of(s.paused, held.is_some()).as_str()
}

/// One schedule as `stats` shows it.
#[derive(Debug, serde::Serialize)]
struct ScheduleRow {
    /// The schedule's name.
    name: String,
    /// `config`, or `runtime` for one added at run time.
    source: &'static str,
    /// The last tick fired (enqueued and due), epoch ms.
    last_fire_ms: Option<i64>,
    /// The next tick to fire, epoch ms.
    next_fire_ms: Option<i64>,
}

/// The schedules of `t`, the config's and those added at run time, with their last and next
/// fire, read from the marks in `store` (the trigger's first shard).
async fn schedule_rows(store: &Store, t: &Trigger) -> anyhow::Result<Vec<ScheduleRow>> {
    Ok(crate::schedule::stored::list(store, t)
        .await?
        .into_iter()
        .map(|l| ScheduleRow {
            name: l.schedule.name,
            source: l.source,
            last_fire_ms: l.last_fire_ms,
            next_fire_ms: l.next_fire_ms,
        })
        .collect())
}

/// `stats`' lines of a trigger's schedules.
fn say_rows(rows: &[ScheduleRow]) {
    for r in rows {
        say!(
            "  schedule {}: last fire {}, next fire {}",
            r.name,
            fire_text(r.last_fire_ms),
            fire_text(r.next_fire_ms)
        );
    }
}
