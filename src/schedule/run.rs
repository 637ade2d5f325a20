//! The task that fires a trigger's schedules on one bridge: it wakes when a schedule's
//! enqueued tick falls due and runs the schedule script, which enqueues the next tick (so each
//! tick waits in the queue before its time and the ordinary claim delivers it on time).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::plan::{plan, Policy};
use super::tick;
use crate::config::ScheduleConfig;
use crate::cron::{now_ms as local_ms, Cron};
use crate::metrics::ScheduleMetrics;
use crate::redis::store::{Enqueued, Mark, Offer, Store};

/// Longest sleep: marks are read again at least this often (another bridge may have moved one).
const LONGEST_SLEEP: Duration = Duration::from_secs(30);
/// How soon a paused trigger's schedules or a failed Redis call are looked at again.
const RETRY: i64 = 1000;
/// Runs of the script after which a schedule whose mark keeps moving waits for the next round.
const STALE_TRIES: usize = 3;

/// One schedule and when it needs a run next (Redis clock, epoch ms).
struct Entry {
    config: ScheduleConfig,
    cron: Cron,
    wake_ms: i64,
}

/// Fires `schedules` of trigger `trigger` on `store` (the trigger's first shard) until `stop`.
pub(crate) async fn run(
    trigger: String,
    store: Store,
    schedules: Vec<ScheduleConfig>,
    metrics: ScheduleMetrics,
    stop: CancellationToken,
) {
    let mut entries: Vec<Entry> = schedules
        .into_iter()
        .filter_map(|config| {
            let cron = Cron::parse(&config.cron, &config.timezone).ok()?;
            metrics.start(&trigger, &config.name, cron.next_after(local_ms()));
            Some(Entry {
                config,
                cron,
                wake_ms: i64::MIN,
            })
        })
        .collect();
    if entries.is_empty() {
        return;
    }
    let mut offset = 0i64;
    loop {
        let now = local_ms() + offset;
        let due: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].wake_ms <= now)
            .collect();
        if !due.is_empty() {
            match fire(&trigger, &store, &mut entries, &due, &metrics).await {
                Ok(redis_now) => offset = redis_now - local_ms(),
                Err(e) => {
                    tracing::warn!(trigger = %trigger, error = %e, "schedules: Redis call failed; trying again");
                    for &i in &due {
                        entries[i].wake_ms = now + RETRY;
                    }
                }
            }
        }
        let next = entries.iter().map(|e| e.wake_ms).min().unwrap_or(i64::MAX);
        let sleep = Duration::from_millis(u64::try_from(next - (local_ms() + offset)).unwrap_or(0))
            .min(LONGEST_SLEEP);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Runs the script for each of `due`; returns the Redis clock.
async fn fire(
    trigger: &str,
    store: &Store,
    entries: &mut [Entry],
    due: &[usize],
    metrics: &ScheduleMetrics,
) -> Result<i64, crate::redis::store::StoreError> {
    let names: Vec<&str> = due
        .iter()
        .map(|&i| entries[i].config.name.as_str())
        .collect();
    let (mut now, marks) = store.schedule_marks(&names).await?;
    for (&i, mut mark) in due.iter().zip(marks) {
        let e = &mut entries[i];
        let mut tries = 0;
        let done = loop {
            let done = step(store, e, &mark, now).await?;
            tries += 1;
            if !done.stale || tries == STALE_TRIES {
                break done;
            }
            let (at, mut again) = store.schedule_marks(&[e.config.name.as_str()]).await?;
            now = at;
            mark = again.pop().unwrap_or_default();
        };
        if done.missed > 0 {
            metrics
                .missed
                .with_label_values(&[trigger, &e.config.name])
                .inc_by(done.missed);
            tracing::info!(trigger, schedule = %e.config.name, missed = done.missed,
                policy = e.config.misfire.as_str(), "schedule: missed ticks");
        }
        let next_fire = match done.mark_ms {
            Some(mark) if done.waiting => Some(mark),
            Some(mark) => e.cron.next_after(mark.max(now)),
            None => e.cron.next_after(now),
        };
        metrics.set_next(trigger, &e.config.name, next_fire);
        e.wake_ms = wake(e, &done, now);
    }
    Ok(now)
}

/// One run of the script from `mark` at `now`.
async fn step(
    store: &Store,
    e: &Entry,
    mark: &Mark,
    now: i64,
) -> Result<Enqueued, crate::redis::store::StoreError> {
    let c = &e.config;
    let policy = Policy {
        misfire: c.misfire,
        grace_ms: i64::try_from(c.misfire_grace.as_millis()).unwrap_or(i64::MAX),
        limit: c.catch_up_limit,
    };
    let p = plan(mark.tick_ms, now, policy, |t| e.cron.next_after(t));
    let mark_missed = mark.waiting && mark.tick_ms.is_some_and(|m| m + policy.grace_ms < now);
    if p.ticks.is_empty() && p.left_out == 0 && !mark_missed {
        // Nothing new and nothing to take back: the script has nothing to do.
        return Ok(Enqueued {
            stale: false,
            paused: false,
            mark_ms: mark.tick_ms,
            fired: 0,
            missed: 0,
            waiting: mark.waiting,
        });
    }
    let hash = store.hash_bodies();
    let body = c.body.as_bytes();
    let ticks = p
        .ticks
        .iter()
        .map(|&t| (t, tick::member(&c.name, t, (!hash).then_some(body))))
        .collect();
    store
        .enqueue_ticks(&Offer {
            name: &c.name,
            planned: &mark.raw,
            grace_ms: policy.grace_ms,
            policy: c.misfire.as_str(),
            limit: c.catch_up_limit,
            body: hash.then_some(body),
            left_out: p.left_out,
            ticks,
        })
        .await
}

/// When the schedule needs its next run: when its enqueued tick falls due (the next one is
/// enqueued then), or once a waiting tick would be missed (so that the policy, not a late
/// claim, decides about it), or soon while paused or behind.
fn wake(e: &Entry, done: &Enqueued, now: i64) -> i64 {
    let grace = i64::try_from(e.config.misfire_grace.as_millis()).unwrap_or(i64::MAX);
    if done.stale {
        return now + RETRY;
    }
    match done.mark_ms {
        _ if done.paused => now + RETRY,
        Some(mark) if mark > now => mark,
        Some(mark) if done.waiting => (mark.saturating_add(grace) + 1)
            .max(now + 1)
            .min(now + RETRY),
        Some(mark) => match e.cron.next_after(mark) {
            Some(next) if next <= now => now + 1,
            Some(next) => next,
            None => i64::MAX,
        },
        None => e.cron.next_after(now).unwrap_or(i64::MAX),
    }
}
