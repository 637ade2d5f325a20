//! One shard of a running trigger as its workers, its housekeeping and its ingress share it:
//! its store, sink and metrics, and behind methods its wake-ups, pause, hold and flags.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::hold::{Hold, Route};
use super::wake::Wakes;
use crate::config::Trigger;
use crate::health::Health;
use crate::metrics::{Metrics, TriggerMetrics};
use crate::redis::notify;
use crate::redis::queue::Queue;
use crate::redis::store::{QueueStats, Store, StoreError};
use crate::repeat::Repeated;
use crate::sink::{PublishError, Sink};

/// One shard of a running trigger (the whole queue of an unsharded one). Its state is its
/// own: the others tell it what happened and ask it what to do.
pub(crate) struct Shard {
    /// The trigger's settings and routes, shared by its shards and workers.
    pub(super) trigger: Arc<Trigger>,
    /// This shard's queue.
    pub(super) store: Store,
    /// The shard's position among the trigger's shards.
    pub(super) index: usize,
    pub(super) sink: Arc<Sink>,
    pub(super) metrics: TriggerMetrics,
    pub(super) health: Health,
    /// Wake-ups of the idle workers, the head they expect next and the guard.
    pub(super) wakes: Wakes,
    /// A claim left due members behind because earlier copies of them were in flight: the
    /// next settled batch may have freed them, so it wakes a worker.
    pub(super) held_back: AtomicBool,
    /// Woken when this bridge dead-lettered a message, or the backlog gauges saw dead
    /// letters to forward: the dead-letter forwarder looks.
    dead_lettered: Notify,
    /// Set when a worker claimed members: the housekeeping watches their leases.
    pub(super) claimed: AtomicBool,
    /// Set when a keyspace notification said the queue was written to: the housekeeping
    /// reads again the sizes of a queue it last saw empty.
    written: AtomicBool,
    /// The shard was paused when last seen.
    paused: AtomicBool,
    /// Starts this shard's other workers: they start when a claim first leaves more due than
    /// one worker takes, so an idle trigger holds one worker task per shard, not `workers`.
    pub(super) extra_workers: Mutex<Option<StartWorkers>>,
    /// Batches with members blamed for their own failure, logged at growing gaps.
    pub(super) refusals: Mutex<Repeated>,
    /// The trigger's held state, shared by its shards.
    hold: Arc<Hold>,
}

/// Starts a shard's deferred workers (given the shard).
pub(crate) type StartWorkers = Box<dyn FnOnce(&Arc<Shard>) + Send>;

impl Shard {
    /// One `Shard` per shard of `queue` (one for an unsharded trigger), sharing the trigger's
    /// metrics. `sink` is the one made from the trigger's `[sinks.NAME]`, against whose kind
    /// loading resolved the trigger's destinations.
    pub(crate) fn shards(
        config: &Arc<Trigger>,
        queue: &Queue,
        sink: Arc<Sink>,
        metrics: &Metrics,
        health: Health,
    ) -> Vec<Arc<Self>> {
        let destination = config.destination();
        let metrics = TriggerMetrics::new(
            metrics,
            config.name(),
            sink.name(),
            PublishError::reasons_of(destination),
            queue.shards().len(),
        );
        let hold = Arc::new(Hold::new(
            config.name(),
            sink.name(),
            metrics.clone(),
            health.clone(),
            queue.shards()[0].clone(),
        ));
        queue
            .shards()
            .iter()
            .enumerate()
            .map(|(index, store)| {
                Arc::new(Self {
                    trigger: config.clone(),
                    store: store.clone(),
                    index,
                    sink: sink.clone(),
                    metrics: metrics.clone(),
                    health: health.clone(),
                    wakes: Wakes::default(),
                    held_back: AtomicBool::new(false),
                    dead_lettered: Notify::new(),
                    claimed: AtomicBool::new(false),
                    written: AtomicBool::new(true),
                    paused: AtomicBool::new(false),
                    extra_workers: Mutex::new(None),
                    refusals: Mutex::default(),
                    hold: hold.clone(),
                })
            })
            .collect()
    }

    /// The trigger's name.
    pub(crate) fn name(&self) -> &str {
        self.trigger.name()
    }

    /// The trigger's settings and routes.
    pub(crate) fn trigger(&self) -> &Trigger {
        &self.trigger
    }

    /// This shard's queue.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The sink the trigger publishes to.
    pub(crate) fn sink(&self) -> &Sink {
        &self.sink
    }

    /// The trigger's metrics, shared by its shards.
    pub(crate) fn metrics(&self) -> &TriggerMetrics {
        &self.metrics
    }

    /// The sorted set producers write to.
    pub(crate) fn source_key(&self) -> &str {
        &self.store.keys().source
    }

    /// Defers this shard's other workers: `start` runs when a claim first finds a backlog.
    pub(crate) fn defer_workers(&self, start: StartWorkers) {
        *self.extra_workers.lock().unwrap_or_else(|e| e.into_inner()) = Some(start);
    }

    /// Something may be due that was not (a producer wrote, a settle freed a member, leases
    /// were recovered): one idle worker claims, unless a claim starts meanwhile. Nothing
    /// while paused: a resume wakes a worker.
    pub(crate) fn wake(&self) {
        if !self.is_paused() {
            self.wakes.ask();
        }
    }

    /// A keyspace notification said the queue was written to (any write, or one that may
    /// have been missed while unsubscribed).
    pub(crate) fn touched(&self) {
        self.written.store(true, Relaxed);
    }

    /// For the housekeeping: whether the queue was written to since it last asked.
    pub(crate) fn take_touched(&self) -> bool {
        self.written.swap(false, Relaxed)
    }

    /// For the housekeeping: whether this bridge claimed members since it last asked (their
    /// leases need watching).
    pub(crate) fn take_claimed(&self) -> bool {
        self.claimed.swap(false, Relaxed)
    }

    /// An ingress wrote to this shard: a scheduled member (the idle worker looks again) or,
    /// with `dead`, a dead letter (the dead-letter forwarder looks).
    pub(crate) fn ingested(&self, dead: bool) {
        self.touched();
        if dead {
            self.dead_lettered();
        } else {
            self.wake();
        }
    }

    /// A message was dead-lettered, or a reading found dead letters to forward: the
    /// dead-letter forwarder looks.
    pub(crate) fn dead_lettered(&self) {
        self.dead_lettered.notify_one();
    }

    /// For the dead-letter forwarder: resolves once [`Self::dead_lettered`] was called
    /// (since the last call of this, or while waiting).
    pub(crate) async fn dead_letters(&self) {
        self.dead_lettered.notified().await
    }

    /// The housekeeping read the shard's sizes: the backlog gauges and the pause follow them,
    /// and dead letters to forward wake the forwarder.
    pub(crate) fn sizes_read(&self, stats: &QueueStats) {
        self.health.redis_answered();
        self.metrics.backlog(self.index, stats);
        self.note_paused(stats.paused);
        if stats.dead_forwardable > 0 && self.trigger.dead_letter().is_some() {
            self.dead_lettered();
        }
    }

    /// Longest idle sleep: `notified_guard_interval` while keyspace notifications reach the
    /// bridge (they are the wake-up; the guard is a safety net), else `guard_interval`.
    pub(crate) fn guard(&self) -> Duration {
        if self.notifications_live() {
            self.trigger.notified_guard()
        } else {
            self.trigger.guard_interval()
        }
    }

    /// Whether keyspace notifications reach the bridge: a write would have been heard of.
    pub(crate) fn notifications_live(&self) -> bool {
        self.health.notifications_live()
    }

    /// Mirrors an operator's pause, seen by a claim or a stats call, in the gauge and
    /// `/readyz`; the first to see a change logs it, and a resume wakes the workers.
    pub(crate) fn note_paused(&self, paused: bool) {
        self.metrics.paused(self.index, paused);
        if self.health.set_paused(self.name(), paused) {
            if paused {
                tracing::warn!(trigger = %self.name(), "paused by an operator: nothing is claimed until `delay-bridge resume`");
            } else {
                tracing::info!(trigger = %self.name(), "resumed: claiming again");
            }
        }
        let was = self.paused.swap(paused, Relaxed);
        if was && !paused {
            // A resume is no keyspace event: an idle worker that last saw the pause
            // must not sleep its whole guard before it looks.
            self.wakes.resumed();
        }
    }

    /// Whether this shard was paused when last seen.
    pub(super) fn is_paused(&self) -> bool {
        self.paused.load(Relaxed)
    }

    /// `route`'s destination failed with `reason`: the trigger is held (see [`Hold`]).
    pub(crate) async fn hold(&self, route: Route, reason: &str) {
        self.hold.hold(route, reason).await
    }

    /// A message went through to `route`: its hold, if any, is over.
    pub(crate) async fn release(&self, route: Route) {
        self.hold.release(route).await
    }

    /// A Redis call answered: Redis is reachable.
    pub(crate) fn redis_answered(&self) {
        self.health.redis_answered();
    }

    /// Counts a failed Redis call. A lost or slow Redis is logged by [`Health`], once for
    /// every caller; `true` when the error is this trigger's own and the caller logs it.
    pub(crate) fn redis_error(&self, e: &StoreError) -> bool {
        let kind = e.kind();
        self.metrics.redis_error(kind);
        if matches!(kind, "connection" | "timeout") {
            self.health.redis_unreachable(e);
            return false;
        }
        true
    }
}

/// A keyspace notification of the shard's key: any write changes its sizes, an addition may
/// have brought its head earlier.
impl notify::Listener for Shard {
    fn key(&self) -> &str {
        self.source_key()
    }

    fn written(&self) {
        self.touched();
    }

    fn added(&self) {
        self.wake();
    }
}
