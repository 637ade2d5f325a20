//! A trigger's worker loop: claim due members, publish them, settle the batch, sleep until the next head.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::{jitter_down, Backoff};
use crate::config::TriggerConfig;
use crate::metrics::Metrics;
use crate::sink::{Disposition, MessageId, OutMessage, PublishError, Publisher, Route, Sink};
use crate::store::{ClaimBatch, FailOutcome, Settlement, Store};

mod batch;
mod maintenance;
mod route;

use batch::AdaptiveBatch;
pub use maintenance::{recover_loop, stats_loop};
use route::routing_key_at;

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
        t: trigger,
        batch,
        broken_batches: 0,
        publisher: None,
        stop,
        abort,
    }
    .run()
    .instrument(span)
    .await
}

struct Worker {
    t: Arc<Trigger>,
    batch: AdaptiveBatch,
    /// Consecutive batches that ended with the sink failing; the worker backs off by it.
    broken_batches: u32,
    publisher: Option<Publisher>,
    stop: CancellationToken,
    abort: CancellationToken,
}

const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

impl Worker {
    async fn run(mut self) {
        let mut sink_failures = 0u32;
        let mut redis_failures = 0u32;
        while !self.stop.is_cancelled() {
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
                        if sink_failures == 1 || sink_failures.is_power_of_two() {
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
            self.forward(batch, claimed_at).await;
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

    /// Publishes a claimed batch and settles every member: ack, retry, dead-letter or put back.
    async fn forward(&mut self, batch: ClaimBatch, claimed_at: Instant) {
        let t = self.t.clone();
        let cfg = &t.config;
        let ids: Vec<MessageId> = batch
            .items
            .iter()
            .map(|c| MessageId::new(&cfg.key, &c.member))
            .collect();
        let pointed: Vec<Result<String, PublishError>> = match &cfg.routing_key_pointer {
            Some(pointer) => batch
                .items
                .iter()
                .map(|c| routing_key_at(&c.member, pointer))
                .collect(),
            None => Vec::new(),
        };
        let mut results: Vec<Result<(), PublishError>> = Vec::with_capacity(batch.items.len());
        let mut out = Vec::with_capacity(batch.items.len());
        let mut slots = Vec::with_capacity(batch.items.len());
        for (i, c) in batch.items.iter().enumerate() {
            let routing_key = match pointed.get(i) {
                Some(Ok(rk)) => Some(rk.as_str()),
                Some(Err(e)) => {
                    results.push(Err(e.clone()));
                    continue;
                }
                None => None,
            };
            if c.member.len() > cfg.max_message_bytes {
                results.push(Err(PublishError::TooLarge));
            } else {
                results.push(Ok(()));
                slots.push(i);
                out.push(OutMessage {
                    payload: &c.member,
                    due_ms: c.due_ms,
                    attempt: c.attempt,
                    id: ids[i].as_str(),
                    routing_key,
                });
            }
        }
        if !out.is_empty() {
            let publisher = self
                .publisher
                .as_mut()
                .expect("publisher is set before claiming");
            let started = Instant::now();
            let published = publisher
                .publish_batch(
                    cfg.name.as_str(),
                    &t.route,
                    &out,
                    cfg.publish_timeout,
                    &self.abort,
                )
                .await;
            t.metrics
                .publish_duration
                .with_label_values(&[cfg.name.as_str(), t.sink.name()])
                .observe(started.elapsed().as_secs_f64());
            for (slot, r) in slots.into_iter().zip(published) {
                results[slot] = r;
            }
        }
        // Confirmation time on the Redis clock: claim time plus what elapsed locally since.
        let confirmed_ms = batch.now_ms + claimed_at.elapsed().as_millis() as i64;

        let backoff = Backoff {
            initial: cfg.backoff_initial,
            max: cfg.backoff_max,
        };
        let mut settlement = Settlement::default();
        let mut fail_reasons = Vec::new();
        let mut sink_broken = false;
        let lateness = t.metrics.lateness.with_label_values(&[cfg.name.as_str()]);
        for (c, r) in batch.items.iter().zip(&results) {
            match r {
                Ok(()) => {
                    settlement.ack.push(&c.member);
                    lateness.observe(
                        (confirmed_ms.saturating_sub(c.due_ms)).clamp(0, 86_400_000) as f64
                            / 1000.0,
                    );
                }
                Err(e) => {
                    sink_broken |= e.breaks_sink();
                    match e.disposition() {
                        Disposition::PutBack => settlement.put_back.push((&c.member, &c.due_raw)),
                        d => {
                            fail_reasons.push(e.reason());
                            settlement.fail.push((
                                &c.member,
                                backoff.delay(c.attempt),
                                "",
                                d == Disposition::DeadLetter,
                            ));
                        }
                    }
                }
            }
        }
        for (entry, reason) in settlement.fail.iter_mut().zip(&fail_reasons) {
            entry.2 = reason;
        }
        self.settle(&batch, &settlement, &fail_reasons).await;
        if sink_broken {
            self.broken_batches += 1;
            tracing::warn!(sink = %t.sink.name(), confirmed = settlement.ack.len(),
                "broker connection failed mid-batch; unconfirmed messages went back");
            self.publisher = None;
            if self.broken_batches > 1 {
                t.sink.reset().await;
            }
            self.pause(ERROR_BACKOFF.delay(self.broken_batches)).await;
        } else {
            self.broken_batches = 0;
        }
    }

    /// Runs the settle script, retrying Redis errors until the lease would expire anyway
    /// (after that, recovery redelivers the batch: a duplicate, never a loss).
    async fn settle(
        &self,
        batch: &ClaimBatch,
        s: &Settlement<'_>,
        fail_reasons: &[std::borrow::Cow<'static, str>],
    ) {
        let t = &self.t;
        let name = t.config.name.as_str();
        let give_up = Instant::now() + t.config.lease;
        let mut failures = 0u32;
        let settled = loop {
            match t
                .store
                .settle(batch.deadline_ms, t.config.max_attempts, s)
                .await
            {
                Ok(settled) => break settled,
                Err(e) => {
                    failures += 1;
                    t.redis_error(&e);
                    let wait = ERROR_BACKOFF.delay(failures);
                    if Instant::now() + wait >= give_up || self.abort.is_cancelled() {
                        tracing::warn!(error = %e, members = batch.items.len(),
                            "could not settle the batch; its lease will expire and it will be redelivered");
                        return;
                    }
                    tracing::warn!(error = %e, failures, "settle failed, retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        if !s.ack.is_empty() {
            t.metrics
                .forwarded
                .with_label_values(&[name, t.sink.name()])
                .inc_by(s.ack.len() as u64);
        }
        if settled.put_back > 0 {
            t.metrics
                .put_back
                .with_label_values(&[name])
                .inc_by(settled.put_back);
        }
        for (outcome, reason) in settled.fail_outcomes.iter().zip(fail_reasons) {
            match outcome {
                FailOutcome::Retried => t.metrics.retried.with_label_values(&[name, reason]).inc(),
                FailOutcome::DeadLettered => {
                    tracing::warn!(reason = %reason, "message dead-lettered");
                    t.metrics
                        .dead_lettered
                        .with_label_values(&[name, reason])
                        .inc()
                }
                FailOutcome::NotOwned => {}
            }
        }
    }
}
