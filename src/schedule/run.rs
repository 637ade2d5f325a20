//! The task that fires a trigger's schedules on one bridge: it wakes when a schedule's
//! enqueued tick falls due and runs the schedule script, which enqueues the next tick (so each
//! tick waits in the queue before its time and the ordinary claim delivers it on time).

use std::sync::Arc;
use std::time::Duration;

use super::defs;
use super::plan::{plan, Policy};
use super::tick;
use super::wake::Changes;
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
/// How often the counter of run-time schedule changes is read without keyspace notifications.
const DEFS_POLL: i64 = 5000;
/// How often the run-time schedules are read whatever the counter and notifications say.
const DEFS_FULL: i64 = 300_000;

/// One schedule and when it needs a run next (Redis clock, epoch ms).
struct Entry {
    config: ScheduleConfig,
    cron: Cron,
    wake_ms: i64,
    /// Added at run time (stored in Redis), not by the config.
    stored: bool,
}

impl Entry {
    fn new(config: ScheduleConfig, stored: bool) -> Option<Self> {
        let cron = Cron::parse(&config.cron, &config.timezone).ok()?;
        Some(Entry {
            config,
            cron,
            wake_ms: i64::MIN,
            stored,
        })
    }
}

/// Fires the schedules of `changes`'s trigger: the config's, and those stored at run time
/// (read again when `changes` hears of a change, else every [`DEFS_POLL`] without
/// notifications), until the trigger stops; with notifications, ends while there is nothing
/// to fire (`changes` starts it again).
pub(crate) async fn run(changes: Arc<Changes>) {
    let l = &changes.launch;
    let (trigger, store, metrics) = (l.trigger.as_str(), &l.store, &l.metrics);
    let mut entries: Vec<Entry> = Vec::new();
    for config in &l.schedules {
        if let Some(e) = Entry::new(config.clone(), false) {
            metrics.start(trigger, &e.config.name, e.cron.next_after(local_ms()));
            entries.push(e);
        }
    }
    // The stored definitions are read when the change counter moved since the last read
    // (0: they never changed), and every [`DEFS_FULL`] whatever it says.
    let (mut defs_at, mut full_at) = (i64::MIN, local_ms() + DEFS_FULL);
    let mut offset = 0i64;
    loop {
        if local_ms() >= defs_at {
            let full = local_ms() >= full_at;
            // Boxed, as the firing below: the task waits for as long as its trigger has
            // schedules; it holds what waiting needs, not a Redis call's state.
            let read = Box::pin(defs::read(
                &changes.seen,
                trigger,
                store,
                &l.schedules,
                full,
            ))
            .await;
            if full {
                full_at = local_ms() + DEFS_FULL;
            }
            defs_at = match l.notifications {
                true => full_at,
                false => local_ms() + DEFS_POLL,
            };
            match read {
                Ok(read) => {
                    if let Some(stored) = read {
                        merge(trigger, &mut entries, stored, metrics);
                        if let Ok(mut running) = changes.running.lock() {
                            let stored = entries.iter().filter(|e| e.stored);
                            *running = stored.map(|e| e.config.name.clone()).collect();
                        }
                    }
                    // Nothing to fire: a change notification starts the task again.
                    if entries.is_empty() && l.notifications {
                        if changes.idle() {
                            return;
                        }
                        defs_at = i64::MIN;
                        continue;
                    }
                }
                Err(e) => {
                    tracing::debug!(trigger = %trigger, error = %e, "schedules: reading stored schedules failed");
                    defs_at = local_ms() + DEFS_POLL;
                    full_at = defs_at;
                }
            }
        }
        let now = local_ms() + offset;
        let due: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].wake_ms <= now)
            .collect();
        if !due.is_empty() {
            match Box::pin(fire(trigger, store, &mut entries, &due, metrics)).await {
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
            .min(LONGEST_SLEEP)
            .min(Duration::from_millis(
                u64::try_from(defs_at - local_ms()).unwrap_or(0),
            ));
        tokio::select! {
            // Whoever stops the task removes the series (`Changes::running`) before a task
            // that replaces it starts them again.
            _ = l.stop.cancelled() => return,
            _ = tokio::time::sleep(sleep) => {}
            _ = changes.notify.notified() => defs_at = i64::MIN,
        }
    }
}

/// Makes the stored entries those of `stored`: a removed or changed one goes (a tick already
/// enqueued still fires), a new or changed one starts with its next tick.
fn merge(
    trigger: &str,
    entries: &mut Vec<Entry>,
    stored: Vec<ScheduleConfig>,
    metrics: &ScheduleMetrics,
) {
    entries.retain(|e| {
        let keep = !e.stored || stored.contains(&e.config);
        if !keep {
            metrics.remove(trigger, &e.config.name);
            tracing::info!(trigger, schedule = %e.config.name, "schedules: stored schedule removed");
        }
        keep
    });
    for config in stored {
        if entries.iter().any(|e| e.stored && e.config == config) {
            continue;
        }
        if let Some(e) = Entry::new(config, true) {
            metrics.start(trigger, &e.config.name, e.cron.next_after(local_ms()));
            tracing::info!(trigger, schedule = %e.config.name, "schedules: stored schedule added");
            entries.push(e);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::super::wake::{Changes, Checker, Launch};
    use crate::redis::notify::Listener;
    use crate::redis::store::Store;

    /// With notifications, what a trigger without schedules holds is the task's launch, not
    /// a task: 10,000 idle triggers held 8 MiB more with a task each, and more again with
    /// its Redis calls inlined.
    #[tokio::test]
    async fn a_schedule_task_stays_small() {
        let stop = CancellationToken::new();
        stop.cancel();
        let changes = Changes::start(launch("delay:{size}", true, stop).await);
        let size = std::mem::size_of_val(&super::run(changes));
        // 720 bytes in a debug build with the Redis calls boxed and the launch in the task.
        assert!(size <= 768, "a schedule task's future takes {size} bytes");
    }

    /// A trigger without schedules lets its task end after reading the stored ones; a change
    /// notification starts it again, and it runs the schedule added meanwhile.
    #[tokio::test]
    async fn a_change_starts_the_task_of_a_trigger_without_schedules() {
        let key = format!("delay:{{wake-{}}}", std::process::id());
        let l = launch(&key, true, CancellationToken::new()).await;
        let (store, trackers) = (l.store.clone(), l.trackers.clone());
        store.delete_all().await;
        let changes = Changes::start(l);
        let ended = || async {
            for _ in 0..500 {
                if trackers[1].is_empty() && !changes.alive.load(Ordering::Acquire) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        };
        assert!(ended().await, "the task keeps running with nothing to fire");
        let json = br#"{"name":"every","cron":"* * * * * *","body":"b"}"#;
        assert!(store.add_schedule_def("every", json).await.unwrap());
        changes.written();
        let mut started = false;
        for _ in 0..500 {
            if changes.running() == ["every"] {
                started = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(started, "the change did not start the task");
        assert_eq!(trackers[1].len(), 1);
        // Removed: the task ends again at the next change.
        store.remove_schedule_def("every").await.unwrap();
        changes.written();
        assert!(
            ended().await,
            "the task keeps running once its schedule is gone"
        );
        changes.launch.stop.cancel();
        store.delete_all().await;
    }

    async fn launch(key: &str, notifications: bool, stop: CancellationToken) -> Launch {
        Launch {
            trigger: "t".into(),
            store: Store::on_local_redis(key).await,
            schedules: Vec::new(),
            notifications,
            metrics: crate::metrics::Metrics::new().schedules.clone(),
            checker: Checker::start(&TaskTracker::new(), stop.clone()),
            stop,
            trackers: [TaskTracker::new(), TaskTracker::new()],
        }
    }
}
