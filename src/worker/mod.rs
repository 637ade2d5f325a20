//! A trigger's workers: claim due members, hand each batch to a delivery task, sleep until the next head.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::{jitter_down, Backoff};
use crate::config::{Destination, TriggerConfig};
use crate::health::Health;
use crate::metrics::{Metrics, TriggerMetrics};
use crate::queue::Queue;
use crate::repeat::Repeated;
use crate::sink::{MessageId, PublishError, Publisher, Sink};
use crate::store::{ClaimBatch, Store, StoreError};

mod batch;
mod deliver;
mod forward;
mod maintenance;
mod prepare;
mod route;
mod settlement;
mod unserved;

use batch::AdaptiveBatch;
use deliver::Verdict;
pub use forward::forward_dead_letters;
pub use maintenance::maintain;
pub use unserved::watch_unserved;

/// Everything the workers of one trigger share.
pub struct Trigger {
    config: Arc<TriggerConfig>,
    destination: Destination,
    /// This shard's queue (the whole queue of an unsharded trigger).
    store: Store,
    /// The shard's position among the trigger's shards.
    shard: usize,
    sink: Arc<Sink>,
    metrics: TriggerMetrics,
    health: Health,
    /// Woken when the head of the queue may have moved earlier (keyspace notification).
    head_changed: Notify,
    /// Woken when a claim left due members behind: every idle worker should help.
    backlog: Notify,
    /// Only one idle worker per trigger waits on the head; the rest queue here.
    gate: tokio::sync::Mutex<()>,
    /// When the earliest known member becomes due, in local monotonic time.
    next_due: std::sync::Mutex<Option<Instant>>,
    /// A claim left due members behind because earlier copies of them were in flight: the
    /// next settled batch may have freed them, so it wakes the workers.
    held_back: std::sync::atomic::AtomicBool,
    /// Woken when this bridge dead-lettered a message, or the backlog gauges saw dead
    /// letters to forward: the dead-letter forwarder looks.
    dead_lettered: Notify,
    /// Set when a worker claimed members: the housekeeping watches their leases.
    claimed: std::sync::atomic::AtomicBool,
    /// Set when a keyspace notification said the queue was written to: the housekeeping
    /// reads again the sizes of a queue it last saw empty.
    written: std::sync::atomic::AtomicBool,
    /// The shard was paused when last seen.
    paused: std::sync::atomic::AtomicBool,
    /// Starts this shard's other workers: they start when a claim first leaves more due than
    /// one worker takes, so an idle trigger holds one worker task per shard, not `workers`.
    extra_workers: std::sync::Mutex<Option<StartWorkers>>,
    /// Batches in which the broker refused members published alone, logged at growing gaps.
    refusals: std::sync::Mutex<Repeated>,
}

/// Starts a shard's deferred workers (given the shard).
pub type StartWorkers = Box<dyn FnOnce(&Arc<Trigger>) + Send>;

impl Trigger {
    /// One `Trigger` per shard of `queue` (one for an unsharded trigger), sharing the trigger's
    /// metrics. Fails when the configuration was not loaded (no resolved destination) or its
    /// destination is not of the sink's kind.
    pub fn shards(
        config: &Arc<TriggerConfig>,
        queue: &Queue,
        sink: Arc<Sink>,
        metrics: &Metrics,
        health: Health,
    ) -> Result<Vec<Arc<Self>>, String> {
        let destination = config
            .destination
            .clone()
            .ok_or_else(|| format!("trigger {}: destination not resolved", config.name))?;
        for d in std::iter::once(&destination).chain(&config.dead_letter) {
            if !sink.serves(d) {
                return Err(format!(
                    "trigger {}: sink {} cannot publish to {d}",
                    config.name,
                    sink.name()
                ));
            }
        }
        let metrics = TriggerMetrics::new(
            metrics,
            &config.name,
            sink.name(),
            PublishError::reasons_of(&destination),
            queue.shards().len(),
        );
        Ok(queue
            .shards()
            .iter()
            .enumerate()
            .map(|(shard, store)| {
                Arc::new(Self {
                    config: config.clone(),
                    destination: destination.clone(),
                    store: store.clone(),
                    shard,
                    sink: sink.clone(),
                    metrics: metrics.clone(),
                    health: health.clone(),
                    head_changed: Notify::new(),
                    backlog: Notify::new(),
                    gate: tokio::sync::Mutex::new(()),
                    next_due: std::sync::Mutex::new(None),
                    held_back: std::sync::atomic::AtomicBool::new(false),
                    dead_lettered: Notify::new(),
                    claimed: std::sync::atomic::AtomicBool::new(false),
                    written: std::sync::atomic::AtomicBool::new(true),
                    paused: std::sync::atomic::AtomicBool::new(false),
                    extra_workers: std::sync::Mutex::new(None),
                    refusals: std::sync::Mutex::default(),
                })
            })
            .collect())
    }

    /// The trigger's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The sorted set producers write to.
    pub fn source_key(&self) -> &str {
        &self.store.keys().source
    }

    /// Defers this shard's other workers: `start` runs when a claim first finds a backlog.
    pub fn defer_workers(&self, start: StartWorkers) {
        *self.extra_workers.lock().unwrap_or_else(|e| e.into_inner()) = Some(start);
    }

    /// Starts the deferred workers, once.
    fn start_extra_workers(self: &Arc<Self>) {
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

    /// The head may have moved earlier (a producer wrote): the idle worker looks again.
    pub fn wake(&self) {
        self.head_changed.notify_one();
    }

    /// A keyspace notification said the queue was written to (any write, or one that may
    /// have been missed while unsubscribed).
    pub fn touched(&self) {
        self.written
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// An ingress wrote to this shard: a scheduled member (the idle worker looks again) or,
    /// with `dead`, a dead letter (the dead-letter forwarder looks).
    pub fn ingested(&self, dead: bool) {
        self.touched();
        if dead {
            self.dead_lettered.notify_one();
        } else {
            self.wake();
        }
    }

    /// Wakes every idle worker: there may be more due than one worker takes.
    fn wake_all(&self) {
        self.backlog.notify_waiters();
        self.head_changed.notify_one();
    }

    /// Remembers the head reported by a claim; wakes the idle waiter if it moved earlier.
    fn note_head(&self, batch: &ClaimBatch, claimed_at: Instant) {
        let due = batch.next_head_ms.filter(|h| h.is_finite()).map(|head| {
            let wait_ms = (head - batch.now_ms as f64).max(0.0);
            claimed_at + Duration::from_micros((wait_ms * 1000.0).min(1e15) as u64)
        });
        let mut next = self.next_due.lock().unwrap_or_else(|e| e.into_inner());
        let earlier = match (*next, due) {
            (Some(old), Some(new)) => new < old,
            (None, Some(_)) => true,
            _ => false,
        };
        *next = due;
        drop(next);
        if earlier {
            self.head_changed.notify_one();
        }
    }

    /// Longest idle sleep: `notified_guard_interval` while keyspace notifications reach the
    /// bridge (they are the wake-up; the guard is a safety net), else `guard_interval`.
    fn guard(&self) -> Duration {
        if self.health.notifications_live() {
            self.config.notified_guard()
        } else {
            self.config.guard_interval
        }
    }

    fn next_due(&self) -> Option<Instant> {
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mirrors an operator's pause, seen by a claim or a stats call, in the gauge and
    /// `/readyz`; the first to see a change logs it, and a resume wakes the workers.
    fn note_paused(&self, paused: bool) {
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
            self.wake_all();
        }
    }

    /// Whether this shard was paused when last seen.
    fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes note of what the broker refused in a batch: a refusal of every member (the
    /// sink's fault) goes to `/readyz` and is logged when it starts and ends; members
    /// refused alone are logged at growing gaps, with the broker's words and the first id.
    fn note_refusals(&self, plan: &settlement::Plan<'_>, went_through: bool, ids: &[MessageId]) {
        if let Some(why) = &plan.sink_refusal {
            self.health.sink_refuses(self.name(), self.sink.name(), why);
        } else if went_through {
            self.health.sink_accepts(self.name());
        }
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        match &plan.refused {
            Some(r) => {
                if let Some(unlogged) = refusals.failed() {
                    let first = ids.get(r.first);
                    tracing::warn!(sink = %self.sink.name(), refused = r.count, reply = %r.reply,
                        first_id = first.map(MessageId::as_str), unlogged,
                        "the broker refused messages published alone; each is retried with backoff, then dead-lettered as broker_refused");
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
    fn redis_error(&self, e: &StoreError) -> bool {
        let kind = e.kind();
        self.metrics.redis_error(kind);
        if matches!(kind, "connection" | "timeout") {
            self.health.redis_unreachable(e);
            return false;
        }
        true
    }
}

/// Runs one worker over `shards` (one, or several that no other worker serves) until
/// `stop`; `abort` cuts short the wait for confirmations at the shutdown deadline.
pub async fn run(
    shards: Vec<Arc<Trigger>>,
    worker: usize,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let t = shards[0].clone();
    let span = tracing::info_span!("worker", trigger = %t.name(), worker);
    let batch = AdaptiveBatch::new(t.config.batch);
    let now = Instant::now();
    Worker {
        id: worker,
        t,
        ready: vec![true; shards.len()],
        guard_at: vec![now; shards.len()],
        shards,
        current: 0,
        turn: None,
        batch,
        broken_batches: 0,
        witness: false,
        publishing: Publishing::default(),
        redis_failures: Repeated::default(),
        in_flight: JoinSet::new(),
        stop,
        abort,
    }
    .run()
    .instrument(span)
    .await
}

/// Which shards each of a trigger's `workers` serves: with no more shards than workers,
/// worker `w` serves shard `w mod shards` (alone or with other workers); with more, shard `s`
/// is served by worker `s mod workers` alone. The first `min(shards, workers)` workers start
/// at once; the others are started by their shard when it first has a backlog.
pub fn assign(shards: &[Arc<Trigger>], workers: usize) -> Vec<Vec<Arc<Trigger>>> {
    let workers = workers.max(1);
    if shards.len() <= workers {
        (0..workers)
            .map(|w| vec![shards[w % shards.len()].clone()])
            .collect()
    } else {
        (0..workers)
            .map(|w| shards.iter().skip(w).step_by(workers).cloned().collect())
            .collect()
    }
}

struct Worker {
    /// Position among the trigger's workers.
    id: usize,
    /// The shard being claimed from.
    t: Arc<Trigger>,
    /// Every shard this worker serves; with more than one, no other worker serves them.
    shards: Vec<Arc<Trigger>>,
    /// With several shards: which may have something due (woken, due or never looked at).
    ready: Vec<bool>,
    /// With several shards: when each is looked at again however quiet it seems.
    guard_at: Vec<Instant>,
    /// Position of `t` in `shards`.
    current: usize,
    /// A turn among the first claims at start (see [`STARTING`]), while held.
    turn: Option<tokio::sync::SemaphorePermit<'static>>,
    batch: AdaptiveBatch,
    /// Consecutive batches that ended with the sink failing; the worker backs off by it.
    broken_batches: u32,
    /// The broker refused every member of the last batch alone: the next claim takes at
    /// least two (see [`Verdict::SinkFailed`]).
    witness: bool,
    publishing: Publishing,
    /// Failed claims.
    redis_failures: Repeated,
    /// Batches published and awaiting their confirmations.
    in_flight: JoinSet<Verdict>,
    stop: CancellationToken,
    abort: CancellationToken,
}

/// A publisher kept while it is usable and asked of the sink again when it is not, with
/// the current run of failures to get one.
#[derive(Default)]
struct Publishing {
    current: Option<Publisher>,
    failures: Repeated,
}

impl Publishing {
    /// The usable publisher, or a new one for `destination`: `Ok(None)` when `stop` fired
    /// first, `Err` when the sink could not give one (the caller counts it in `failures`).
    async fn get(
        &mut self,
        sink: &Sink,
        destination: &Destination,
        stop: &CancellationToken,
    ) -> Result<Option<Publisher>, PublishError> {
        if let Some(p) = self.current.as_ref().filter(|p| p.is_usable()) {
            return Ok(Some(p.clone()));
        }
        self.current = None;
        let p = tokio::select! {
            p = sink.publisher(destination) => p?,
            _ = stop.cancelled() => return Ok(None),
        };
        self.failures.recovered();
        self.current = Some(p.clone());
        Ok(Some(p))
    }
}

/// What a claim came to.
enum Claimed {
    /// Members to deliver, claimed at this instant.
    Batch(ClaimBatch, Instant),
    /// Nothing to take (none due, or paused): wait idle.
    Nothing,
    /// A failed claim's backoff, or the rate limit's wait.
    Wait(Duration),
}

/// Workers getting their first publisher and making their first claim at once, over the whole
/// bridge: with thousands of triggers, all of them at once would be a peak of memory that the
/// allocator keeps for good (measured: 133 against 119-122 MiB at 10,000 idle triggers).
static STARTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(64);

/// Batches one worker keeps publishing or confirming at once: it claims the next batch
/// while the broker confirms the previous ones.
pub const MAX_IN_FLIGHT: usize = 4;

/// Shortest wait for the rate limit's next token: below it, a low rate would cost one claim
/// per message.
const RATE_TICK: Duration = Duration::from_millis(10);

pub(super) const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

impl Worker {
    /// The lifecycle, one batch at a time: publisher -> claim -> deliver (in its own task,
    /// which publishes and settles) -> claim again while it confirms.
    async fn run(mut self) {
        if self.shards.len() > 1 {
            return Box::pin(self.run_shards()).await;
        }
        let mut starting = true;
        while !self.stop.is_cancelled() {
            Box::pin(self.reap()).await;
            if starting {
                self.take_turn().await;
            }
            // The larger steps are boxed: a task is as large as its largest state, and an
            // idle trigger's workers should hold only what waiting needs.
            let Some(publisher) = Box::pin(self.publisher()).await else {
                continue;
            };
            let claimed = Box::pin(self.claim()).await;
            starting = false;
            self.turn = None;
            let (batch, claimed_at) = match claimed {
                Claimed::Batch(batch, at) => (batch, at),
                Claimed::Nothing => {
                    Box::pin(self.idle()).await;
                    continue;
                }
                Claimed::Wait(wait) => {
                    self.pause(wait).await;
                    continue;
                }
            };
            Box::pin(self.dispatch(publisher, batch, claimed_at)).await;
        }
        self.finish().await;
    }

    /// The lifecycle over several shards: claim from each shard that may have something due
    /// in turn, and sleep until the earliest head or guard of them all, or a notification.
    async fn run_shards(mut self) {
        let mut starting = true;
        while !self.stop.is_cancelled() {
            Box::pin(self.reap()).await;
            if starting {
                self.take_turn().await;
            }
            let Some(publisher) = Box::pin(self.publisher()).await else {
                continue;
            };
            if !self.pick() {
                // Every shard was looked at once: the start is over for this worker.
                starting = false;
                Box::pin(self.idle_shards()).await;
                continue;
            }
            let claimed = Box::pin(self.claim()).await;
            self.turn = None;
            match claimed {
                Claimed::Batch(batch, at) => {
                    Box::pin(self.dispatch(publisher, batch, at)).await;
                }
                Claimed::Nothing => self.ready[self.current] = false,
                Claimed::Wait(wait) => self.pause(wait).await,
            }
        }
        self.finish().await;
    }

    /// Stopping: lets the batches in flight be confirmed (or aborted) and settled.
    async fn finish(&mut self) {
        while let Some(done) = self.in_flight.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "a delivery task failed; its leases will be recovered");
            }
        }
    }

    /// Makes the next shard after the current one that may have something due current; `false`
    /// when none may. A shard may when woken, when its head or its guard time has come.
    fn pick(&mut self) -> bool {
        let now = Instant::now();
        for (i, t) in self.shards.iter().enumerate() {
            let woken = futures_util::FutureExt::now_or_never(t.head_changed.notified()).is_some();
            if woken || self.guard_at[i] <= now || t.next_due().is_some_and(|due| due <= now) {
                self.ready[i] = true;
            }
        }
        let n = self.shards.len();
        let Some(i) = (1..=n)
            .map(|k| (self.current + k) % n)
            .find(|&i| self.ready[i])
        else {
            return false;
        };
        self.current = i;
        self.t = self.shards[i].clone();
        let guard = if self.t.is_paused() {
            self.t.config.guard_interval
        } else {
            self.t.guard()
        };
        self.guard_at[i] = now + jitter_down(guard);
        true
    }

    /// Waits until a shard's head or guard time comes, or a notification wakes one of them.
    async fn idle_shards(&mut self) {
        let wake_at = self
            .shards
            .iter()
            .zip(&self.guard_at)
            .map(|(t, &guard)| t.next_due().map_or(guard, |due| due.min(guard)))
            .min()
            .unwrap_or_else(Instant::now);
        let woken = futures_util::future::select_all(
            self.shards
                .iter()
                .map(|t| Box::pin(t.head_changed.notified())),
        );
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at) => {}
            (_, i, _) = woken => {
                self.shards[i].metrics.woken();
                self.ready[i] = true;
            }
            _ = self.stop.cancelled() => {}
        }
    }

    /// Takes note of the batches that finished meanwhile.
    async fn reap(&mut self) {
        while let Some(done) = self.in_flight.try_join_next() {
            self.delivered(done).await;
        }
    }

    /// A usable publisher, or `None` after backing off while the sink is unavailable:
    /// nothing is claimed without one, so messages wait in Redis, not in the bridge.
    async fn publisher(&mut self) -> Option<Publisher> {
        let e = match self
            .publishing
            .get(&self.t.sink, &self.t.destination, &self.stop)
            .await
        {
            Ok(p) => return p,
            Err(e) => e,
        };
        // One worker per trigger speaks for all of them. While the broker is down the sink
        // logs the outage itself: here only its start, once per trigger.
        let failures = &mut self.publishing.failures;
        let sink_down = !self.t.sink.is_up();
        if let Some(unlogged) = failures
            .failed()
            .filter(|_| self.id == 0 && !(sink_down && failures.count() > 1))
        {
            tracing::warn!(sink = %self.t.sink.name(), error = %e,
                failures = failures.count(), unlogged, "sink unavailable, not claiming");
        }
        let wait = ERROR_BACKOFF.delay(failures.count());
        // A sink down at start must not hold a start-up turn through its backoff.
        self.turn = None;
        self.pause(wait).await;
        None
    }

    /// Waits for a turn among the workers starting at once (see [`STARTING`]), unless it
    /// holds one. The turn covers a publisher and a claim: it goes back after the claim, or
    /// before the backoff when the sink is down.
    async fn take_turn(&mut self) {
        if self.turn.is_none() {
            self.turn = tokio::select! {
                turn = STARTING.acquire() => turn.ok(),
                _ = self.stop.cancelled() => None,
            };
        }
    }

    /// Claims the next batch, or says how long to wait: until the next head when there was
    /// nothing due or the trigger is paused, for a backoff when the claim failed.
    async fn claim(&mut self) -> Claimed {
        let asked = if std::mem::take(&mut self.witness) {
            self.batch.size.max(2)
        } else {
            self.batch.size
        };
        let started = Instant::now();
        let batch = match self.t.store.claim(asked, self.t.config.lease).await {
            Ok(batch) => batch,
            Err(e) => {
                let own = self.t.redis_error(&e);
                if let Some(unlogged) = self.redis_failures.failed().filter(|_| own) {
                    let failures = self.redis_failures.count();
                    if e.kind() == "wrong_type" {
                        // Nothing moved (the scripts check types before writing), but
                        // nothing will until an operator fixes the key.
                        tracing::error!(error = %e, failures, unlogged,
                            "a key of this trigger holds the wrong type; nothing is claimed until it is renamed or deleted");
                    } else {
                        tracing::warn!(error = %e, kind = e.kind(), failures, unlogged, "claim failed, backing off");
                    }
                }
                return Claimed::Wait(ERROR_BACKOFF.delay(self.redis_failures.count()));
            }
        };
        if let Some(failures) = self.redis_failures.recovered() {
            tracing::debug!(failures, "claiming again");
        }
        self.t.health.redis_answered();
        let claimed_at = Instant::now();
        let took = claimed_at - started;
        if batch.repaired > 0 {
            // Once per stray write: the script rewrote the fields, the next claim finds them valid.
            self.t.metrics.control_repaired(batch.repaired);
            tracing::warn!(trigger = %self.t.name(), key = %self.t.store.keys().control,
                fields = batch.repaired, "repaired control fields out of range (a stray write to the control hash)");
        }
        self.t.note_paused(batch.paused);
        if batch.paused || batch.rate_wait.is_some() {
            // Held by an operator or the rate limit: nothing was looked at.
            self.t.metrics.held(took, batch.rate_wait.is_some());
            return match batch.rate_wait {
                // Whatever the reply says, the worker claims again within its guard interval.
                Some(wait) => Claimed::Wait(wait.max(RATE_TICK).min(self.t.config.guard_interval)),
                None => Claimed::Nothing,
            };
        }
        self.t.metrics.claimed(batch.items.len(), took);
        if !batch.items.is_empty() {
            self.t
                .claimed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.batch.adapt(batch.items.len(), took);
        self.t.note_head(&batch, claimed_at);
        if batch.skipped > 0 {
            self.t
                .held_back
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if batch.items.is_empty() {
            return Claimed::Nothing;
        }
        let more_due = batch.items.len() >= asked
            || batch.next_head_ms.is_some_and(|h| h <= batch.now_ms as f64);
        if more_due {
            self.t.start_extra_workers();
            self.t.backlog.notify_waiters();
        }
        Claimed::Batch(batch, claimed_at)
    }

    /// Delivers the batch in its own task, keeping at most [`MAX_IN_FLIGHT`] at once.
    async fn dispatch(&mut self, publisher: Publisher, batch: ClaimBatch, claimed_at: Instant) {
        let task = deliver::deliver(
            self.t.clone(),
            publisher,
            batch,
            claimed_at,
            self.abort.clone(),
        );
        self.in_flight
            .spawn(task.instrument(tracing::Span::current()));
        while self.in_flight.len() >= MAX_IN_FLIGHT {
            if let Some(done) = self.in_flight.join_next().await {
                self.delivered(done).await;
            }
        }
    }

    /// Takes note of a finished batch: when the sink failed, drop the publisher and back off.
    async fn delivered(&mut self, done: Result<Verdict, tokio::task::JoinError>) {
        match done {
            Ok(Verdict::Settled) => self.broken_batches = 0,
            Ok(Verdict::SinkFailed {
                publisher: broken,
                refused,
            }) => {
                self.witness |= refused;
                self.broken_batches += 1;
                self.publishing.current = None;
                // A route the broker refuses is no fault of the connection, which other
                // triggers publish on: only a connection that keeps failing is made anew.
                if self.broken_batches > 1 && !refused {
                    self.t.sink.reset(&broken).await;
                }
                self.pause(ERROR_BACKOFF.delay(self.broken_batches)).await;
            }
            Err(e) => {
                tracing::error!(error = %e, "a delivery task failed; its leases will be recovered");
            }
        }
    }

    /// Sleeps for `d` unless stopping.
    async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stop.cancelled() => {}
        }
    }

    /// Waits until the head is due, the guard interval passes, a notification arrives,
    /// or a peer found a backlog. Only the worker holding the gate watches the head.
    async fn idle(&self) {
        let t = &self.t;
        let backlog = t.backlog.notified();
        tokio::pin!(backlog);
        backlog.as_mut().enable();
        let _gate = tokio::select! {
            g = t.gate.lock() => g,
            _ = &mut backlog => return,
            _ = self.stop.cancelled() => return,
        };
        if t.is_paused() {
            let guard = Instant::now() + jitter_down(t.config.guard_interval);
            // Producers keep writing to a paused queue: their notifications would only
            // wake a claim that takes nothing. A resume is seen within the guard interval.
            tokio::select! {
                _ = tokio::time::sleep_until(guard) => {}
                _ = self.stop.cancelled() => {}
            }
            return;
        }
        let guard = Instant::now() + jitter_down(t.guard());
        let wake_at = t.next_due().map_or(guard, |due| due.min(guard));
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at) => {}
            _ = t.head_changed.notified() => t.metrics.woken(),
            _ = &mut backlog => {}
            _ = self.stop.cancelled() => {}
        }
    }
}
