//! When a trigger's schedule task runs: always while it has schedules to fire (or the bridge
//! polls for stored ones); with keyspace notifications, a trigger with nothing to fire has no
//! task, and the bridge's one checker reads its change counter when a notification asks,
//! starting the task once the counter moved.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ScheduleConfig;
use crate::metrics::ScheduleMetrics;
use crate::redis::notify;
use crate::redis::store::Store;

/// Change counters the checker reads at once (a notification wakes every trigger after the
/// subscription was lost).
const CHECKS_AT_ONCE: usize = 32;

/// What a trigger's schedule task runs on: the trigger's schedules and where it fires them.
pub(crate) struct Launch {
    pub trigger: String,
    /// The trigger's first shard's store: the marks and the ticks live beside its queue.
    pub store: Store,
    /// The config's schedules.
    pub schedules: Vec<ScheduleConfig>,
    /// Keyspace notifications tell of changes to the stored schedules: a trigger with
    /// nothing to fire has no task, rather than one polling the change counter.
    pub notifications: bool,
    pub metrics: ScheduleMetrics,
    pub stop: CancellationToken,
    /// The bridge's tracker of every worker and the trigger's own, which the task runs in.
    pub trackers: [TaskTracker; 2],
    /// The bridge's checker of the change counters of triggers without a task.
    pub checker: Checker,
}

/// A trigger's schedule task and the keyspace notifications of its change counter
/// (`K:schedules:rev`): they wake the task, or have the checker look at the counter while
/// there is none.
pub(crate) struct Changes {
    key: String,
    pub(super) launch: Launch,
    pub(super) notify: Notify,
    /// The stored schedules the task runs now: whoever stops the task removes their series.
    pub(super) running: Mutex<Vec<String>>,
    /// The change counter at the last read of the stored schedules (0: they never changed).
    pub(super) seen: AtomicI64,
    /// The task runs (or is being started).
    pub(super) alive: AtomicBool,
    /// Waiting for the checker.
    queued: AtomicBool,
    me: Weak<Changes>,
}

impl Changes {
    /// The listener of `launch`'s change counter; its task starts now if the trigger has
    /// schedules (or the counter is polled), else once the checker saw the counter move.
    pub(crate) fn start(launch: Launch) -> Arc<Self> {
        let changes = Arc::new_cyclic(|me| Changes {
            key: launch.store.schedule_rev_key(),
            launch,
            notify: Notify::new(),
            running: Mutex::default(),
            seen: AtomicI64::new(0),
            alive: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            me: me.clone(),
        });
        if changes.launch.notifications && changes.launch.schedules.is_empty() {
            changes.check();
        } else {
            changes.spawn();
        }
        changes
    }

    /// The stored schedules the task runs now.
    pub(crate) fn running(&self) -> Vec<String> {
        self.running.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Starts the task unless it runs or the trigger stopped.
    fn spawn(&self) {
        if self.launch.stop.is_cancelled() || self.alive.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            self.alive.store(false, Ordering::Release);
            return;
        };
        let [all, own] = &self.launch.trackers;
        all.spawn(own.track_future(super::run(me)));
    }

    /// Has the checker read the counter, unless the task runs (it reads the counter itself)
    /// or a check is waiting already.
    fn check(&self) {
        if self.alive.load(Ordering::Acquire) || self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.launch.checker.0.send(self.me.clone()).is_err() {
            // The bridge is stopping.
            self.queued.store(false, Ordering::Release);
        }
    }

    /// The checker's read: the task starts if the counter moved since the last read (and
    /// reads the stored schedules), or if it cannot be read (the task tries again).
    async fn checked(&self) {
        self.queued.store(false, Ordering::Release);
        if self.alive.load(Ordering::Acquire) || self.launch.stop.is_cancelled() {
            return;
        }
        match self.launch.store.schedule_rev().await {
            Ok(rev) if rev == self.seen.load(Ordering::Relaxed) => {}
            Ok(_) => self.spawn(),
            Err(e) => {
                tracing::debug!(trigger = %self.launch.trigger, error = %e,
                    "schedules: reading the change counter failed");
                self.spawn();
            }
        }
    }

    /// The task is to end with nothing to fire: true unless a change was heard since its
    /// last read, which it reads then (a task started meanwhile reads it instead).
    pub(super) fn idle(&self) -> bool {
        self.alive.store(false, Ordering::Release);
        if self.notify.notified().now_or_never().is_none() {
            return true;
        }
        self.alive.swap(true, Ordering::AcqRel)
    }
}

impl notify::Listener for Changes {
    fn key(&self) -> &str {
        &self.key
    }

    fn written(&self) {
        self.notify.notify_one();
        self.check();
    }

    /// An addition is a write too: [`Self::written`] heard of it.
    fn added(&self) {}
}

/// The bridge's one reader of the change counters of triggers without a schedule task.
#[derive(Clone)]
pub(crate) struct Checker(mpsc::UnboundedSender<Weak<Changes>>);

impl Checker {
    /// The checker, running on `tasks` until `stop`.
    pub(crate) fn start(tasks: &TaskTracker, stop: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tasks.spawn(check_all(rx, stop));
        Checker(tx)
    }
}

async fn check_all(mut rx: mpsc::UnboundedReceiver<Weak<Changes>>, stop: CancellationToken) {
    let asked = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let checks = asked.for_each_concurrent(CHECKS_AT_ONCE, |changes| async move {
        if let Some(changes) = changes.upgrade() {
            changes.checked().await;
        }
    });
    tokio::select! {
        _ = checks => {}
        _ = stop.cancelled() => {}
    }
}
