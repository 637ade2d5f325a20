//! One trigger's metrics, labelled once: the worker reports what happened with verbs.

use std::time::Duration;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use prometheus::{Histogram, HistogramVec};

use super::dead_log::DeadLetterLog;
use super::{Cells, Metrics};
use crate::redis::store::{FailOutcome, QueueStats, Settled, Settlement};

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
pub(crate) struct TriggerMetrics {
    name: String,
    sink: String,
    cells: Arc<Cells>,
    lateness: Lazy,
    publish_duration: Lazy,
    claim_duration: Lazy,
    claim_batch_size: Lazy,
    /// Dead letters, logged by the burst.
    dead_log: DeadLetterLog,
    /// Each shard's last sizes and pause: the gauges show the whole trigger.
    shards: Arc<std::sync::Mutex<Vec<QueueStats>>>,
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
    pub(crate) fn new(
        m: &Metrics,
        name: &str,
        sink: &str,
        reasons: &[&str],
        shards: usize,
    ) -> Self {
        let cells = m.triggers.cells(name, sink);
        cells.retried.touch_all(reasons.iter().copied());
        cells.dead_lettered.touch_all(reasons.iter().copied());
        cells.redis_errors.touch_all(REDIS_ERROR_KINDS.into_iter());
        Self {
            name: name.to_string(),
            sink: sink.to_string(),
            cells,
            dead_log: DeadLetterLog::new(name),
            lateness: Lazy::new(&m.lateness),
            publish_duration: Lazy::new(&m.publish_duration),
            claim_duration: Lazy::new(&m.claim_duration),
            claim_batch_size: Lazy::new(&m.claim_batch_size),
            shards: Arc::new(std::sync::Mutex::new(vec![
                QueueStats::default();
                shards.max(1)
            ])),
        }
    }

    /// A claim script call took `took` and took nothing because the trigger is paused or,
    /// with `rate_limited`, its rate limit is spent.
    pub(crate) fn held(&self, took: Duration, rate_limited: bool) {
        self.claim_took(took);
        if rate_limited {
            self.cells.rate_limited_claims.fetch_add(1, Relaxed);
        }
    }

    /// A claim repaired `n` control fields.
    pub(crate) fn control_repaired(&self, n: u64) {
        self.cells.control_repairs.fetch_add(n, Relaxed);
    }

    /// A claim's duration, once the trigger has delivered (an idle trigger keeps no buckets).
    fn claim_took(&self, took: Duration) {
        if let Some(h) = self.claim_duration.series.get() {
            h.observe(took.as_secs_f64());
        }
    }

    /// The trigger forwards its dead letters: its forwarding series start at 0, a failure
    /// series for each of `reasons`.
    pub(crate) fn forwarding_dead_letters(&self, reasons: &[&str]) {
        self.cells.forwards_dead_letters.store(true, Relaxed);
        self.cells
            .dead_letter_forward_failures
            .touch_all(reasons.iter().copied());
    }

    /// `n` dead letters reached the dead-letter destination and left Redis.
    pub(crate) fn dead_letters_forwarded(&self, n: u64) {
        self.cells.dead_letters_forwarded.fetch_add(n, Relaxed);
    }

    /// A dead letter was not forwarded, for `reason`.
    pub(crate) fn dead_letter_not_forwarded(&self, reason: &str) {
        self.cells.dead_letter_forward_failures.add(reason, 1);
    }

    /// A claim script call took `took` and returned `n` members. The claim-duration buckets
    /// are made at the first claim that took something.
    pub(crate) fn claimed(&self, n: usize, took: Duration) {
        if n == 0 {
            self.claim_took(took);
            self.cells.empty_claims.fetch_add(1, Relaxed);
        } else {
            self.claim_duration
                .get(&[&self.name])
                .observe(took.as_secs_f64());
            self.claim_batch_size.get(&[&self.name]).observe(n as f64);
        }
    }

    /// A batch took `took` from its first publish to its last confirmation.
    pub(crate) fn published(&self, took: Duration) {
        self.publish_duration
            .get(&[&self.name, &self.sink])
            .observe(took.as_secs_f64());
    }

    /// The broker confirmed messages due at `due_ms`, at `confirmed_ms` (both Redis clock).
    pub(crate) fn confirmed(&self, due_ms: &[i64], confirmed_ms: i64) {
        self.cells.forwarded.fetch_add(due_ms.len() as u64, Relaxed);
        let lateness = self.lateness.get(&[&self.name]);
        for due in due_ms {
            // `-inf` and `+inf` scores saturate to the ends of i64: due "now" or parked,
            // they have no lateness to observe.
            if *due == i64::MIN || *due == i64::MAX {
                self.cells.immediate.fetch_add(1, Relaxed);
                continue;
            }
            let late = confirmed_ms.saturating_sub(*due).clamp(0, 86_400_000);
            lateness.observe(late as f64 / 1000.0);
        }
    }

    /// The settle script ran `s` and did `done`; dead letters are also logged, a line per
    /// burst and reason.
    pub(crate) fn settled(&self, s: &Settlement<'_>, done: &Settled) {
        self.cells.put_back.fetch_add(done.put_back, Relaxed);
        self.cells
            .expired
            .fetch_add(s.drops().len() as u64, Relaxed);
        for (outcome, failure) in done.fail_outcomes.iter().zip(s.failures()) {
            let reason = failure.reason.as_ref();
            match outcome {
                FailOutcome::Retried => self.cells.retried.add(reason, 1),
                FailOutcome::DeadLettered => {
                    if reason == "expired" {
                        self.cells.expired.fetch_add(1, Relaxed);
                    }
                    self.dead_log
                        .dead_lettered(failure.member, reason, failure.detail.as_deref());
                    self.cells.dead_lettered.add(reason, 1);
                }
                FailOutcome::NotOwned => {}
            }
        }
    }

    /// `n` expired leases went back to the source set.
    pub(crate) fn redelivered(&self, n: u64) {
        self.cells.redelivered.fetch_add(n, Relaxed);
    }

    /// A Redis call failed with an error of this kind.
    pub(crate) fn redis_error(&self, kind: &str) {
        self.cells.redis_errors.add(kind, 1);
    }

    /// An idle worker was woken by a keyspace notification.
    pub(crate) fn woken(&self) {
        self.cells.notify_wakeups.fetch_add(1, Relaxed);
    }

    /// A wake-up read the queue's head before claiming.
    pub(crate) fn head_read(&self) {
        self.cells.head_reads.fetch_add(1, Relaxed);
    }

    /// Shard `shard`'s sizes were read: the gauges show the sums over the shards (the oldest
    /// due age the largest).
    pub(crate) fn backlog(&self, shard: usize, s: &QueueStats) {
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
            self.cells
                .backlog
                .iter()
                .zip([total.due, total.scheduled, total.inflight, total.dead])
        {
            gauge.store(i64::try_from(v).unwrap_or(i64::MAX), Relaxed);
        }
        self.cells.set_oldest_due_age(total.oldest_due_age_seconds);
    }

    /// `members` sit on keys of the trigger that its configuration does not serve.
    pub(crate) fn unserved(&self, members: u64) {
        self.cells
            .unserved
            .store(i64::try_from(members).unwrap_or(i64::MAX), Relaxed);
    }

    /// Whether the trigger's destination is held.
    pub(crate) fn destination_held(&self, held: bool) {
        self.cells.held.store(i64::from(held), Relaxed);
    }

    /// Whether an operator has paused shard `shard`, as the last claim or stats call saw it:
    /// the gauge is 1 while any shard is.
    pub(crate) fn paused(&self, shard: usize, paused: bool) {
        let any = {
            let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = shards.get_mut(shard) {
                slot.paused = paused;
            }
            shards.iter().any(|s| s.paused)
        };
        self.cells.paused.store(i64::from(any), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinite_due_times_are_counted_apart_from_lateness() {
        let m = Metrics::new();
        let t = TriggerMetrics::new(&m, "now", "rabbit", &[], 1);
        t.confirmed(&[i64::MIN, i64::MAX, 1_000], 1_250);
        let late = m.lateness.with_label_values(&["now"]);
        assert_eq!(late.get_sample_count(), 1);
        assert!((late.get_sample_sum() - 0.25).abs() < 1e-9);
        assert_eq!(t.cells.immediate.load(Relaxed), 2);
        assert_eq!(t.cells.forwarded.load(Relaxed), 3);
        let text = m.render();
        assert!(
            text.contains("delay_bridge_messages_immediate_total{trigger=\"now\"} 2"),
            "{text}"
        );
    }
}
