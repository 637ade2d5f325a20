//! A trigger's held state: one of its own destinations (its route, its dead-letter route) failed, so what goes there waits in Redis with no attempt counted until a message goes through again.

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

/// Which of the trigger's destinations a hold is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Where its messages go.
    Messages = 0,
    /// Where its dead letters are forwarded.
    DeadLetters = 1,
}

/// Whether the trigger's own destinations are held, and since when; shared by its shards,
/// workers and dead-letter forwarder. The gauge, `/readyz` and `stats` follow it: held while
/// any is.
pub(crate) struct Hold {
    trigger: String,
    sink: String,
    /// Since when each route is held, if it is, by [`Route`].
    state: Mutex<[Option<SystemTime>; 2]>,
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
            state: Mutex::new([None; 2]),
            metrics,
            health,
            store,
            noted: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [Option<SystemTime>; 2]> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `route`'s destination failed with `reason`: held from now (the start is logged, not
    /// each batch; the reason shown is the latest), and noted in Redis.
    pub(crate) async fn hold(&self, route: Route, reason: &str) {
        let reason = match route {
            Route::Messages => reason.to_string(),
            Route::DeadLetters => format!("dead-letter destination: {reason}"),
        };
        let reason = reason.as_str();
        let (started, since) = {
            let mut state = self.lock();
            let slot = &mut state[route as usize];
            let started = slot.is_none();
            let since = *slot.get_or_insert_with(SystemTime::now);
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

    /// A message went through to `route`: its hold, if any, is over.
    pub(crate) async fn release(&self, route: Route) {
        let (was, still) = {
            let mut state = self.lock();
            let was = state[route as usize].take();
            (was, state.iter().any(Option::is_some))
        };
        let Some(was) = was else {
            return;
        };
        let held_for = was.elapsed().unwrap_or_default();
        tracing::info!(trigger = %self.trigger, sink = %self.sink, ?route,
            held_for = %humantime::format_duration(Duration::from_secs(held_for.as_secs())),
            "destination takes messages again: hold released");
        if still {
            // The other route is still held: its next failure writes its own words.
            return;
        }
        self.metrics.destination_held(false);
        self.health.release(&self.trigger);
        *self.noted.lock().unwrap_or_else(|e| e.into_inner()) = None;
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
        if self.lock().iter().any(Option::is_some) {
            self.health.release(&self.trigger);
        }
    }
}
