//! A trigger's worker loop: claim due members, publish them, settle the batch, sleep until the next head.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::{jitter_down, Backoff};
use crate::config::TriggerConfig;
use crate::metrics::Metrics;
use crate::sink::{Publisher, Route, Sink};
use crate::store::{ClaimBatch, Store};

mod batch;
mod deliver;
mod maintenance;
mod route;

use batch::AdaptiveBatch;
pub use maintenance::{recover_loop, stats_loop};

/// Everything the workers of one trigger share.
pub struct Trigger {
    /// The trigger's configuration.
    pub config: TriggerConfig,
    /// Its queue in Redis.
    pub store: Store,
    /// Its broker.
    pub sink: Arc<Sink>,
    /// Where on the broker its messages go.
    pub route: Route,
    /// Metrics, labelled per trigger on use.
    pub metrics: Metrics,
    /// Woken when the head of the queue may have moved earlier (keyspace notification).
    pub head_changed: Notify,
    /// Woken when a claim left due members behind: every idle worker should help.
    backlog: Notify,
    /// Only one idle worker per trigger waits on the head; the rest queue here.
    gate: tokio::sync::Mutex<()>,
    /// When the earliest known member becomes due, in local monotonic time.
    next_due: std::sync::Mutex<Option<Instant>>,
}

impl Trigger {
    /// Bundles a trigger's parts.
    pub fn new(
        config: TriggerConfig,
        store: Store,
        sink: Arc<Sink>,
        route: Route,
        metrics: Metrics,
    ) -> Self {
        Self {
            config,
            store,
            sink,
            route,
            metrics,
            head_changed: Notify::new(),
            backlog: Notify::new(),
            gate: tokio::sync::Mutex::new(()),
            next_due: std::sync::Mutex::new(None),
        }
    }

    fn name(&self) -> &str {
        &self.config.name
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

    /// Counts a failed Redis call; a connection problem also marks Redis down for `/readyz`.
    pub(crate) fn redis_error(&self, e: &crate::store::StoreError) {
        let kind = e.kind();
        self.metrics
            .redis_errors
            .with_label_values(&[self.name(), kind])
            .inc();
        if matches!(kind, "connection" | "timeout") {
            self.metrics.redis_up.set(0);
        }
    }

    /// Wakes every idle worker: there may be more due than one worker takes.
    fn wake_all(&self) {
        self.backlog.notify_waiters();
        self.head_changed.notify_one();
    }

    fn next_due(&self) -> Option<Instant> {
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs one worker until `stop`; `abort` cuts short the wait for confirmations at the shutdown deadline.
pub async fn run(
    trigger: Arc<Trigger>,
    worker: usize,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let span = tracing::info_span!("worker", trigger = %trigger.name(), worker);
    let batch = AdaptiveBatch::new(trigger.config.batch);
    Worker {
        id: worker,
        t: trigger,
        batch,
        broken_batches: 0,
        publisher: None,
        in_flight: JoinSet::new(),
        stop,
        abort,
    }
    .run()
    .instrument(span)
    .await
}

struct Worker {
    /// Position among the trigger's workers.
    id: usize,
    t: Arc<Trigger>,
    batch: AdaptiveBatch,
    /// Consecutive batches that ended with the sink failing; the worker backs off by it.
    broken_batches: u32,
    publisher: Option<Publisher>,
    /// Batches published and awaiting their confirmations; the result says if the sink failed.
    in_flight: JoinSet<bool>,
    stop: CancellationToken,
    abort: CancellationToken,
}

/// Batches one worker keeps publishing or confirming at once: it claims the next batch
/// while the broker confirms the previous ones.
pub const MAX_IN_FLIGHT: usize = 4;

pub(super) const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

impl Worker {
    async fn run(mut self) {
        let mut sink_failures = 0u32;
        let mut redis_failures = 0u32;
        while !self.stop.is_cancelled() {
            while let Some(done) = self.in_flight.try_join_next() {
                self.delivered(done).await;
            }
            if !self.publisher.as_ref().is_some_and(Publisher::is_usable) {
                self.publisher = None;
                let publisher = tokio::select! {
                    p = self.t.sink.publisher(&self.t.route) => p,
                    _ = self.stop.cancelled() => break,
                };
                match publisher {
                    Ok(p) => {
                        self.publisher = Some(p);
                        sink_failures = 0;
                    }
                    Err(e) => {
                        // Messages stay in Redis while the broker is away: no claim without a publisher.
                        sink_failures += 1;
                        // One worker per trigger speaks for all of them.
                        if self.id == 0 && (sink_failures == 1 || sink_failures.is_power_of_two()) {
                            tracing::warn!(sink = %self.t.sink.name(), error = %e,
                                failures = sink_failures, "sink unavailable, not claiming");
                        }
                        self.pause(ERROR_BACKOFF.delay(sink_failures)).await;
                        continue;
                    }
                }
            }
            let asked = self.batch.size;
            let started = Instant::now();
            let batch = match self.t.store.claim(asked, self.t.config.lease).await {
                Ok(batch) => {
                    if redis_failures > 0 {
                        tracing::info!("redis is answering again");
                    }
                    redis_failures = 0;
                    self.t.metrics.redis_up.set(1);
                    batch
                }
                Err(e) => {
                    redis_failures += 1;
                    self.t.redis_error(&e);
                    let kind = e.kind();
                    if redis_failures == 1 || redis_failures.is_power_of_two() {
                        tracing::warn!(error = %e, kind, failures = redis_failures, "claim failed, backing off");
                    }
                    self.pause(ERROR_BACKOFF.delay(redis_failures)).await;
                    continue;
                }
            };
            let claimed_at = Instant::now();
            let took = claimed_at - started;
            self.t
                .metrics
                .claim_duration
                .with_label_values(&[self.t.name()])
                .observe(took.as_secs_f64());
            self.batch.adapt(batch.items.len(), took);
            self.t.note_head(&batch, claimed_at);
            if batch.items.is_empty() {
                self.t
                    .metrics
                    .empty_claims
                    .with_label_values(&[self.t.name()])
                    .inc();
                self.idle().await;
                continue;
            }
            self.t
                .metrics
                .claim_batch_size
                .with_label_values(&[self.t.name()])
                .observe(batch.items.len() as f64);
            let more_due = batch.items.len() >= asked
                || batch.next_head_ms.is_some_and(|h| h <= batch.now_ms as f64);
            if more_due {
                self.t.backlog.notify_waiters();
            }
            let publisher = self
                .publisher
                .clone()
                .expect("publisher is set before claiming");
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
        // Stopping: let the batches in flight be confirmed (or aborted) and settled.
        while let Some(done) = self.in_flight.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "a delivery task failed; its leases will be recovered");
            }
        }
    }

    /// Takes note of a finished batch: when the sink failed, drop the publisher and back off.
    async fn delivered(&mut self, done: Result<bool, tokio::task::JoinError>) {
        match done {
            Ok(false) => self.broken_batches = 0,
            Ok(true) => {
                self.broken_batches += 1;
                self.publisher = None;
                if self.broken_batches > 1 {
                    self.t.sink.reset().await;
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
        let guard = Instant::now() + jitter_down(t.config.guard_interval);
        let wake_at = t.next_due().map_or(guard, |due| due.min(guard));
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at) => {}
            _ = t.head_changed.notified() => {
                t.metrics.notify_wakeups.with_label_values(&[t.name()]).inc();
            }
            _ = &mut backlog => {}
            _ = self.stop.cancelled() => {}
        }
    }
}
