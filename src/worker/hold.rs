//! A trigger's held state: its own destination failed, so its messages wait in Redis with no attempt counted until one goes through again.

use std::sync::Mutex;
use std::time::SystemTime;

use crate::health::Health;
use crate::metrics::TriggerMetrics;

/// Whether the trigger's own destination is held, and why; shared by its shards and workers.
/// The gauge, `/readyz` and `stats` follow it.
pub(crate) struct Hold {
    trigger: String,
    sink: String,
    state: Mutex<Option<Held>>,
    metrics: TriggerMetrics,
    health: Health,
}

/// Why and since when a destination is held.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// What the broker or endpoint said, naming the destination.
    pub reason: String,
    /// When the hold started.
    pub since: SystemTime,
}

impl Hold {
    /// Not held; the gauge starts at 0.
    pub(crate) fn new(trigger: &str, sink: &str, metrics: TriggerMetrics, health: Health) -> Self {
        metrics.destination_held(false);
        Self {
            trigger: trigger.to_string(),
            sink: sink.to_string(),
            state: Mutex::new(None),
            metrics,
            health,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the destination is held.
    pub(crate) fn is_held(&self) -> bool {
        self.lock().is_some()
    }

    /// Why the destination is held, if it is.
    pub(crate) fn held(&self) -> Option<Held> {
        self.lock().clone()
    }

    /// The destination failed with `reason`: held from now (the start is logged, not each
    /// batch; the reason shown is the latest).
    pub(crate) fn hold(&self, reason: &str) {
        let started = {
            let mut state = self.lock();
            let started = state.is_none();
            let since = state.as_ref().map_or_else(SystemTime::now, |h| h.since);
            *state = Some(Held {
                reason: reason.to_string(),
                since,
            });
            started
        };
        self.metrics.destination_held(true);
        self.health.hold(&self.trigger, &self.sink, reason);
        if started {
            tracing::warn!(trigger = %self.trigger, sink = %self.sink, %reason,
                "destination held: its messages stay in Redis, no attempt counted, and are tried again with backoff; fix the destination (see the trigger-held runbook)");
        }
    }

    /// A message went through: the hold, if any, is over.
    pub(crate) fn release(&self) {
        let was = self.lock().take();
        if let Some(was) = was {
            self.metrics.destination_held(false);
            self.health.release(&self.trigger);
            let held_for = was.since.elapsed().unwrap_or_default();
            tracing::info!(trigger = %self.trigger, sink = %self.sink,
                held_for = %humantime::format_duration(std::time::Duration::from_secs(held_for.as_secs())),
                "destination takes messages again: hold released");
        }
    }
}

impl Drop for Hold {
    /// A trigger removed or replaced by a reload leaves no hold behind in `/readyz`.
    fn drop(&mut self) {
        if self.lock().is_some() {
            self.health.release(&self.trigger);
        }
    }
}
