//! Adding, listing and removing a trigger's schedules at run time (the command line and the
//! admin API): the config's checks, a name the config does not use, and each schedule's last
//! and next fire read from its mark.

use serde::Serialize;

use crate::config::{schedule_problems, ScheduleConfig, Trigger, MAX_SCHEDULES};
use crate::cron::Cron;
use crate::redis::store::{Mark, Store, StoreError};

/// Why a schedule was not added or removed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    /// The schedule fails the config's checks: each field with its problem.
    #[error("{}", .0.iter().map(|(f, why)| format!("{f}: {why}")).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<(String, String)>),
    /// The name is taken (by the config or a stored schedule), or the trigger is full.
    #[error("{0}")]
    Conflict(String),
    /// No stored schedule has that name.
    #[error("{0}")]
    Missing(String),
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Stores `s` as a run-time schedule of `t` (`store`: its first shard); the running bridges
/// pick it up at once (keyspace notifications) or within seconds.
pub(crate) async fn add(store: &Store, t: &Trigger, s: &ScheduleConfig) -> Result<(), ChangeError> {
    let problems = schedule_problems(s);
    if !problems.is_empty() {
        let problems = problems.into_iter().map(|(f, w)| (f.to_string(), w));
        return Err(ChangeError::Invalid(problems.collect()));
    }
    if t.schedules().iter().any(|c| c.name == s.name) {
        return Err(ChangeError::Conflict(format!(
            "trigger `{}` has a schedule `{}` in its config: change it there",
            t.name(),
            s.name
        )));
    }
    let stored = store.schedule_defs().await?;
    if stored.len() + t.schedules().len() >= MAX_SCHEDULES {
        return Err(ChangeError::Conflict(format!(
            "trigger `{}` has {MAX_SCHEDULES} schedules already",
            t.name()
        )));
    }
    let mut json = serde_json::to_value(s).map_err(|e| ChangeError::Conflict(e.to_string()))?;
    if let Some(o) = json.as_object_mut() {
        o.insert(super::defs::ADDED_MS.into(), crate::cron::now_ms().into());
    }
    let json = json.to_string().into_bytes();
    if !store.add_schedule_def(&s.name, &json).await? {
        return Err(ChangeError::Conflict(format!(
            "trigger `{}` has a run-time schedule `{}` already: remove it first",
            t.name(),
            s.name
        )));
    }
    Ok(())
}

/// Removes run-time schedule `name` of `t`; a tick already enqueued still fires.
pub(crate) async fn remove(store: &Store, t: &Trigger, name: &str) -> Result<(), ChangeError> {
    if t.schedules().iter().any(|c| c.name == name) {
        return Err(ChangeError::Conflict(format!(
            "schedule `{name}` of trigger `{}` is in its config: remove it there",
            t.name()
        )));
    }
    if !store.remove_schedule_def(name).await? {
        return Err(ChangeError::Missing(format!(
            "trigger `{}` has no run-time schedule `{name}`",
            t.name()
        )));
    }
    Ok(())
}

/// One schedule as `schedule list` and the admin API show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Listed {
    /// Where it is defined: `config` or `runtime` (stored in Redis).
    pub source: &'static str,
    /// Its definition.
    #[serde(flatten)]
    pub schedule: ScheduleConfig,
    /// The last tick fired (enqueued and due), epoch ms.
    pub last_fire_ms: Option<i64>,
    /// The next tick to fire, epoch ms.
    pub next_fire_ms: Option<i64>,
}

/// The schedules of `t`, the config's then the stored ones (those the bridges run), each with
/// its last and next fire.
pub(crate) async fn list(store: &Store, t: &Trigger) -> Result<Vec<Listed>, StoreError> {
    let mut all: Vec<(&'static str, ScheduleConfig, Option<i64>)> = t
        .schedules()
        .iter()
        .map(|s| ("config", s.clone(), None))
        .collect();
    for (name, json) in store.schedule_defs().await? {
        match super::defs::parse(&name, &json) {
            Ok((s, added)) if !t.schedules().iter().any(|c| c.name == name) => {
                all.push(("runtime", s, added))
            }
            _ => {}
        }
    }
    if all.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = all.iter().map(|(_, s, _)| s.name.as_str()).collect();
    let (now, marks) = store.schedule_marks(&names).await?;
    Ok(all
        .into_iter()
        .zip(marks)
        .map(|((source, schedule, added), mark)| {
            let cron = Cron::parse(&schedule.cron, &schedule.timezone).ok();
            let (mut last_fire_ms, next_fire_ms) = fires(cron.as_ref(), &mark, now);
            // The tick before the first one enqueued never fired.
            last_fire_ms = last_fire_ms.filter(|l| added.is_none_or(|a| *l >= a));
            Listed {
                source,
                schedule,
                last_fire_ms,
                next_fire_ms,
            }
        })
        .collect())
}

/// A schedule's last and next fire from its `mark` at `now` (Redis clock).
pub(crate) fn fires(cron: Option<&Cron>, mark: &Mark, now: i64) -> (Option<i64>, Option<i64>) {
    let next = match (mark.tick_ms, cron) {
        (Some(m), _) if m > now || mark.waiting => Some(m),
        (Some(m), Some(c)) => c.next_after(m.max(now)),
        (None, Some(c)) => c.next_after(now),
        (_, None) => None,
    };
    let last = match (mark.tick_ms, cron) {
        (Some(m), Some(c)) if m > now || mark.waiting => c.prev_before(m).filter(|_| m > now),
        (Some(m), _) => Some(m),
        (None, _) => None,
    };
    (last, next)
}
