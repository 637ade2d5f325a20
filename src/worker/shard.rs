//! One shard of a trigger as its workers share it: its store, sink, metrics, wake-ups,
//! the head it expects next, the pause and the refusals it has seen.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::hold::{Hold, Route};
use super::settlement;
use super::wake::{due_by, Wakes, Woken};
use crate::config::Trigger;
use crate::health::Health;
use crate::metrics::{Metrics, TriggerMetrics};
use crate::redis::notify;
use crate::redis::queue::Queue;
use crate::redis::store::{ClaimBatch, Store, StoreError};
use crate::repeat::Repeated;
use crate::sink::{MessageId, PublishError, Sink};

/// Everything the workers of one trigger share.
pub(crate) struct Shard {
    /// The trigger's settings and routes, shared by its shards and workers.
    pub(crate) config: Arc<Trigger>,
    /// This shard's queue (the whole queue of an unsharded trigger).
    pub(crate) store: Store,
    /// The shard's position among the trigger's shards.
    pub(crate) shard: usize,
    pub(crate) sink: Arc<Sink>,
    pub(crate) metrics: TriggerMetrics,
    pub(crate) health: Health,
    /// Wake-ups of the idle workers and the head they expect next.
    pub(super) wakes: Wakes,
    /// A claim left due members behind because earlier copies of them were in flight: the
    /// next settled batch may have freed them, so it wakes a worker.
    pub(super) held_back: std::sync::atomic::AtomicBool,
    /// Woken when this bridge dead-lettered a message, or the backlog gauges saw dead
    /// letters to forward: the dead-letter forwarder looks.
    pub(crate) dead_lettered: Notify,
    /// Set when a worker claimed members: the housekeeping watches their leases.
    pub(crate) claimed: std::sync::atomic::AtomicBool,
    /// Set when a keyspace notification said the queue was written to: the housekeeping
    /// reads again the sizes of a queue it last saw empty.
    pub(crate) written: std::sync::atomic::AtomicBool,
    /// The shard was paused when last seen.
    pub(super) paused: std::sync::atomic::AtomicBool,
    /// Starts this shard's other workers: they start when a claim first leaves more due than
    /// one worker takes, so an idle trigger holds one worker task per shard, not `workers`.
    pub(super) extra_workers: std::sync::Mutex<Option<StartWorkers>>,
    /// Batches with members blamed for their own failure, logged at growing gaps.
    pub(super) refusals: std::sync::Mutex<Repeated>,
    /// The trigger's held state, shared by its shards.
    pub(crate) hold: Arc<Hold>,
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
            .map(|(shard, store)| {
                Arc::new(Self {
                    config: config.clone(),
                    store: store.clone(),
                    shard,
                    sink: sink.clone(),
                    metrics: metrics.clone(),
                    health: health.clone(),
                    wakes: Wakes::default(),
                    held_back: std::sync::atomic::AtomicBool::new(false),
                    dead_lettered: Notify::new(),
                    claimed: std::sync::atomic::AtomicBool::new(false),
                    written: std::sync::atomic::AtomicBool::new(true),
                    paused: std::sync::atomic::AtomicBool::new(false),
                    extra_workers: std::sync::Mutex::new(None),
                    refusals: std::sync::Mutex::default(),
                    hold: hold.clone(),
                })
            })
            .collect()
    }

    /// The trigger's name.
    pub(crate) fn name(&self) -> &str {
        self.config.name()
    }

    /// The sorted set producers write to.
    pub(crate) fn source_key(&self) -> &str {
        &self.store.keys().source
    }

    /// Defers this shard's other workers: `start` runs when a claim first finds a backlog.
    pub(crate) fn defer_workers(&self, start: StartWorkers) {
        *self.extra_workers.lock().unwrap_or_else(|e| e.into_inner()) = Some(start);
    }

    /// Starts the deferred workers, once.
    pub(super) fn start_extra_workers(self: &Arc<Self>) {
        let start = self
            .extra_workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(start) = start {
            tracing::debug!(trigger = %self.name(), shard = self.shard, "a backlog: starting the other workers");
            start(self);
        }
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
        self.written
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// An ingress wrote to this shard: a scheduled member (the idle worker looks again) or,
    /// with `dead`, a dead letter (the dead-letter forwarder looks).
    pub(crate) fn ingested(&self, dead: bool) {
        self.touched();
        if dead {
            self.dead_lettered.notify_one();
        } else {
            self.wake();
        }
    }

    /// Remembers the head reported by a claim, unless the claimer claims again at once
    /// (`again`): the idle worker watching the head looks again if it moved earlier.
    pub(super) fn note_head(&self, batch: &ClaimBatch, claimed_at: Instant, again: bool) {
        self.wakes.set_clock(claimed_at, batch.now_us);
        let due = batch
            .next_head_ms
            .filter(|h| h.is_finite() && !again)
            .map(|head| due_by(claimed_at, batch.now_us, head));
        self.wakes.note_head(due);
    }

    /// After a wake-up that asked for a claim: whether one is worth making. Only the head is
    /// read (one command, no script, nothing written): when it is not due yet by the Redis
    /// clock of the last claim, it becomes the head the gate's holder waits for, and no
    /// claim is made. In doubt it claims: no claim in the last seconds to date the head by,
    /// or a failed read (the claim reports the error and backs off).
    pub(super) async fn head_due(&self) -> bool {
        let Some((at, now_us)) = self.wakes.fresh_clock() else {
            return true;
        };
        let head = self.store.head().await;
        self.metrics.head_read();
        match head {
            Ok(None) => false,
            Ok(Some(score)) => {
                let due = due_by(at, now_us, score);
                if due <= Instant::now() {
                    return true;
                }
                self.wakes.note_earlier(due);
                false
            }
            Err(_) => true,
        }
    }

    /// Counts an idle wait ended by a wake-up that asked for a claim (a notification, mostly).
    pub(super) fn count_wake(&self, woken: Woken) {
        if woken == Woken::Asked {
            self.metrics.woken();
        }
    }

    /// Longest idle sleep: `notified_guard_interval` while keyspace notifications reach the
    /// bridge (they are the wake-up; the guard is a safety net), else `guard_interval`.
    pub(crate) fn guard(&self) -> Duration {
        if self.health.notifications_live() {
            self.config.notified_guard()
        } else {
            self.config.guard_interval()
        }
    }

    pub(super) fn next_due(&self) -> Option<Instant> {
        self.wakes.next_due()
    }

    /// Mirrors an operator's pause, seen by a claim or a stats call, in the gauge and
    /// `/readyz`; the first to see a change logs it, and a resume wakes the workers.
    pub(crate) fn note_paused(&self, paused: bool) {
        self.metrics.paused(self.shard, paused);
        if self.health.set_paused(self.name(), paused) {
            if paused {
                tracing::warn!(trigger = %self.name(), "paused by an operator: nothing is claimed until `delay-bridge resume`");
            } else {
                tracing::info!(trigger = %self.name(), "resumed: claiming again");
            }
        }
        let was = self
            .paused
            .swap(paused, std::sync::atomic::Ordering::Relaxed);
        if was && !paused {
            // A resume is no keyspace event: an idle worker that last saw the pause
            // must not sleep its whole guard before it looks.
            self.wakes.resumed();
        }
    }

    /// Whether this shard was paused when last seen.
    pub(super) fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes note of a settled batch: a failure of the trigger's own destination holds it,
    /// a message that went through releases it; members blamed for their own failure are
    /// logged at growing gaps, with the broker's or endpoint's words and the first id.
    pub(super) async fn note_refusals(
        &self,
        plan: &settlement::Plan<'_>,
        went_through: bool,
        ids: &[MessageId],
    ) {
        if let Some(why) = &plan.hold {
            self.hold.hold(Route::Messages, why).await;
        } else if went_through {
            self.hold.release(Route::Messages).await;
        }
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        match &plan.refused {
            Some(r) => {
                if let Some(unlogged) = refusals.failed() {
                    let first = ids.get(r.first);
                    tracing::warn!(sink = %self.sink.name(), refused = r.count, reply = %r.reply,
                        first_id = first.map(MessageId::as_str), unlogged,
                        "messages failed for a reason of their own; each is retried with backoff, then dead-lettered");
                }
            }
            None if went_through => {
                refusals.recovered();
            }
            None => {}
        }
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
