//! A trigger's held state: its own destination failed, so its messages wait in Redis with no attempt counted until one goes through again.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::health::Health;
use crate::metrics::TriggerMetrics;
use crate::redis::store::{HeldNote, Store};

/// How long a hold noted in Redis lasts unless a bridge writes it again.
const NOTE_TTL: Duration = Duration::from_secs(20);
/// How often a bridge that still finds the destination failing writes the note again.
const NOTE_EVERY: Duration = Duration::from_secs(5);

/// Whether the trigger's own destination is held, and why; shared by its shards and workers.
/// The gauge, `/readyz` and `stats` follow it.
pub(crate) struct Hold {
    trigger: String,
    sink: String,
    /// Since when the destination is held, if it is.
    state: Mutex<Option<SystemTime>>,
    metrics: TriggerMetrics,
    health: Health,
    /// Where the hold is noted for `stats`, the console and the other bridges (the first
    /// shard's keys).
    store: Store,
    /// When the note was last written.
    noted: Mutex<Option<Instant>>,
}

impl Hold {
    /// Not held; the gauge starts at 0.
    pub(crate) fn new(
        trigger: &str,
        sink: &str,
        metrics: TriggerMetrics,
        health: Health,
        store: Store,
    ) -> Self {
        metrics.destination_held(false);
        Self {
            trigger: trigger.to_string(),
            sink: sink.to_string(),
            state: Mutex::new(None),
            metrics,
            health,
            store,
            noted: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<SystemTime>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The destination failed with `reason`: held from now (the start is logged, not each
    /// batch; the reason shown is the latest), and noted in Redis.
    pub(crate) async fn hold(&self, reason: &str) {
        let (started, since) = {
            let mut state = self.lock();
            let started = state.is_none();
            let since = *state.get_or_insert_with(SystemTime::now);
            (started, since)
        };
        self.metrics.destination_held(true);
        self.health.hold(&self.trigger, &self.sink, reason);
        if started {
            tracing::warn!(trigger = %self.trigger, sink = %self.sink, %reason,
                "destination held: its messages stay in Redis, no attempt counted, and are tried again with backoff; fix the destination (see the trigger-held runbook)");
        }
        let due = {
            let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
            let due = started || noted.is_none_or(|at| at.elapsed() >= NOTE_EVERY);
            if due {
                *noted = Some(Instant::now());
            }
            due
        };
        if due {
            let note = HeldNote {
                reason: reason.to_string(),
                since_ms: epoch_ms(since),
            };
            if let Err(e) = self.store.mark_held(&note, NOTE_TTL).await {
                tracing::debug!(trigger = %self.trigger, error = %e, "could not note the hold in Redis");
            }
        }
    }

    /// A message went through: the hold, if any, is over.
    pub(crate) async fn release(&self) {
        let was = self.lock().take();
        let Some(was) = was else {
            return;
        };
        self.metrics.destination_held(false);
        self.health.release(&self.trigger);
        *self.noted.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let held_for = was.elapsed().unwrap_or_default();
        tracing::info!(trigger = %self.trigger, sink = %self.sink,
            held_for = %humantime::format_duration(Duration::from_secs(held_for.as_secs())),
            "destination takes messages again: hold released");
        if let Err(e) = self.store.clear_held().await {
            tracing::debug!(trigger = %self.trigger, error = %e, "could not clear the hold's note in Redis");
        }
    }
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Drop for Hold {
    /// A trigger removed or replaced by a reload leaves no hold behind in `/readyz`.
    fn drop(&mut self) {
        if self.lock().is_some() {
            self.health.release(&self.trigger);
        }
    }
}
