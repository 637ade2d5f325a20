//! One trigger's metrics, labelled once: the worker reports what happened with verbs.

use std::time::Duration;

use std::sync::OnceLock;

use prometheus::{Gauge, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge};

use super::Metrics;
use crate::store::{FailOutcome, QueueStats, Settled, Settlement};

/// Kinds of Redis errors (`StoreError::kind`), pre-created at 0.
const REDIS_ERROR_KINDS: [&str; 6] = [
    "connection",
    "timeout",
    "wrong_type",
    "script",
    "reply",
    "other",
];

/// Handles to one trigger's series.
#[derive(Clone)]
pub struct TriggerMetrics {
    name: String,
    sink: String,
    forwarded: IntCounter,
    put_back: IntCounter,
    redelivered: IntCounter,
    lateness: Lazy,
    publish_duration: Lazy,
    claim_duration: Histogram,
    claim_batch_size: Lazy,
    empty_claims: IntCounter,
    rate_limited_claims: IntCounter,
    notify_wakeups: IntCounter,
    retried: IntCounterVec,
    dead_lettered: IntCounterVec,
    expired: IntCounter,
    dead_letters_forwarded: IntCounterVec,
    dead_letter_forward_failures: IntCounterVec,
    redis_errors: IntCounterVec,
    backlog: [IntGauge; 4],
    oldest_due_age: Gauge,
    paused: IntGauge,
    /// Each shard's last sizes and pause: the gauges show the whole trigger.
    shards: std::sync::Arc<std::sync::Mutex<Vec<QueueStats>>>,
}

/// A histogram series made at its first observation: a trigger that never delivers keeps
/// no buckets (thousands of idle triggers would otherwise hold and export them all).
#[derive(Clone)]
struct Lazy {
    vec: HistogramVec,
    series: OnceLock<Histogram>,
}

impl Lazy {
    fn new(vec: &HistogramVec) -> Self {
        Self {
            vec: vec.clone(),
            series: OnceLock::new(),
        }
    }

    fn get(&self, labels: &[&str]) -> &Histogram {
        self.series
            .get_or_init(|| self.vec.with_label_values(labels))
    }
}

impl TriggerMetrics {
    /// The series of trigger `name` publishing to `sink`. The counters of every reason in
    /// `reasons` (and of every Redis error kind) start at 0, so that `increase()` and
    /// alerts see their first event.
    pub fn new(m: &Metrics, name: &str, sink: &str, reasons: &[&str], shards: usize) -> Self {
        let one = [name];
        for reason in reasons {
            m.retried.with_label_values(&[name, reason]);
            m.dead_lettered.with_label_values(&[name, reason]);
        }
        for kind in REDIS_ERROR_KINDS {
            m.redis_errors.with_label_values(&[name, kind]);
        }
        Self {
            name: name.to_string(),
            sink: sink.to_string(),
            forwarded: m.forwarded.with_label_values(&[name, sink]),
            put_back: m.put_back.with_label_values(&one),
            redelivered: m.redelivered.with_label_values(&one),
            lateness: Lazy::new(&m.lateness),
            publish_duration: Lazy::new(&m.publish_duration),
            claim_duration: m.claim_duration.with_label_values(&one),
            claim_batch_size: Lazy::new(&m.claim_batch_size),
            empty_claims: m.empty_claims.with_label_values(&one),
            rate_limited_claims: m.rate_limited_claims.with_label_values(&one),
            notify_wakeups: m.notify_wakeups.with_label_values(&one),
            retried: m.retried.clone(),
            dead_lettered: m.dead_lettered.clone(),
            expired: m.expired.with_label_values(&one),
            dead_letters_forwarded: m.dead_letters_forwarded.clone(),
            dead_letter_forward_failures: m.dead_letter_forward_failures.clone(),
            redis_errors: m.redis_errors.clone(),
            backlog: ["due", "scheduled", "inflight", "dead"]
                .map(|state| m.backlog.with_label_values(&[name, state])),
            oldest_due_age: m.oldest_due_age.with_label_values(&one),
            paused: m.trigger_paused.with_label_values(&one),
            shards: std::sync::Arc::new(std::sync::Mutex::new(vec![
                QueueStats::default();
                shards.max(1)
            ])),
        }
    }

    /// A claim script call took `took` and took nothing because the trigger is paused or,
    /// with `rate_limited`, its rate limit is spent.
    pub fn held(&self, took: Duration, rate_limited: bool) {
        self.claim_duration.observe(took.as_secs_f64());
        if rate_limited {
            self.rate_limited_claims.inc();
        }
    }

    /// The trigger forwards its dead letters: its forwarding series start at 0, a failure
    /// series for each of `reasons`.
    pub fn forwarding_dead_letters(&self, reasons: &[&str]) {
        self.dead_letters_forwarded.with_label_values(&[&self.name]);
        for reason in reasons {
            self.dead_letter_forward_failures
                .with_label_values(&[self.name.as_str(), reason]);
        }
    }

    /// `n` dead letters reached the dead-letter destination and left Redis.
    pub fn dead_letters_forwarded(&self, n: u64) {
        self.dead_letters_forwarded
            .with_label_values(&[&self.name])
            .inc_by(n);
    }

    /// A dead letter was not forwarded, for `reason`.
    pub fn dead_letter_not_forwarded(&self, reason: &str) {
        self.dead_letter_forward_failures
            .with_label_values(&[&self.name, reason])
            .inc();
    }

    /// A claim script call took `took` and returned `n` members.
    pub fn claimed(&self, n: usize, took: Duration) {
        self.claim_duration.observe(took.as_secs_f64());
        if n == 0 {
            self.empty_claims.inc();
        } else {
            self.claim_batch_size.get(&[&self.name]).observe(n as f64);
        }
    }

    /// A batch took `took` from its first publish to its last confirmation.
    pub fn published(&self, took: Duration) {
        self.publish_duration
            .get(&[&self.name, &self.sink])
            .observe(took.as_secs_f64());
    }

    /// The broker confirmed messages due at `due_ms`, at `confirmed_ms` (both Redis clock).
    pub fn confirmed(&self, due_ms: &[i64], confirmed_ms: i64) {
        self.forwarded.inc_by(due_ms.len() as u64);
        let lateness = self.lateness.get(&[&self.name]);
        for due in due_ms {
            let late = confirmed_ms.saturating_sub(*due).clamp(0, 86_400_000);
            lateness.observe(late as f64 / 1000.0);
        }
    }

    /// The settle script ran `s` and did `done`; dead letters are also logged.
    pub fn settled(&self, s: &Settlement<'_>, done: &Settled) {
        self.put_back.inc_by(done.put_back);
        self.expired.inc_by(s.drop.len() as u64);
        for (outcome, failure) in done.fail_outcomes.iter().zip(&s.fail) {
            let reason = failure.reason.as_ref();
            match outcome {
                FailOutcome::Retried => self.retried.with_label_values(&[&self.name, reason]).inc(),
                FailOutcome::DeadLettered => {
                    if reason == "expired" {
                        self.expired.inc();
                    }
                    tracing::warn!(reason, "message dead-lettered");
                    self.dead_lettered
                        .with_label_values(&[&self.name, reason])
                        .inc();
                }
                FailOutcome::NotOwned => {}
            }
        }
    }

    /// `n` expired leases went back to the source set.
    pub fn redelivered(&self, n: u64) {
        self.redelivered.inc_by(n);
    }

    /// A Redis call failed with an error of this kind.
    pub fn redis_error(&self, kind: &str) {
        self.redis_errors
            .with_label_values(&[&self.name, kind])
            .inc();
    }

    /// An idle worker was woken by a keyspace notification.
    pub fn woken(&self) {
        self.notify_wakeups.inc();
    }

    /// Shard `shard`'s sizes were read: the gauges show the sums over the shards (the oldest
    /// due age the largest).
    pub fn backlog(&self, shard: usize, s: &QueueStats) {
        let total = {
            let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
            let Some(slot) = shards.get_mut(shard) else {
                return;
            };
            *slot = QueueStats {
                paused: slot.paused,
                ..s.clone()
            };
            QueueStats::sum(&shards)
        };
        for (gauge, v) in
            self.backlog
                .iter()
                .zip([total.due, total.scheduled, total.inflight, total.dead])
        {
            gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
        }
        self.oldest_due_age.set(total.oldest_due_age_seconds);
    }

    /// Whether an operator has paused shard `shard`, as the last claim or stats call saw it:
    /// the gauge is 1 while any shard is.
    pub fn paused(&self, shard: usize, paused: bool) {
        let any = {
            let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = shards.get_mut(shard) {
                slot.paused = paused;
            }
            shards.iter().any(|s| s.paused)
        };
        self.paused.set(i64::from(any));
    }
}
