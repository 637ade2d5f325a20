//! Per-trigger housekeeping: the backlog gauges, and recovering expired leases when there are some.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Trigger;
use crate::backoff::jitter_down;
use crate::store::QueueStats;

/// Reads one trigger's sizes every `interval` until `stop`, for the gauges and the pause, and
/// recovers the expired leases the reading shows (any bridge instance may do this). While
/// members are in flight, or this bridge claims, it reads as often as leases need: a quarter
/// of the lease, within 100 ms to 5 s. An idle trigger costs one read per `interval`.
pub async fn maintain(t: Arc<Trigger>, interval: Duration, stop: CancellationToken) {
    let busy = (t.config.lease / 4)
        .clamp(Duration::from_millis(100), Duration::from_secs(5))
        .min(interval);
    let mut cursor = String::from("0");
    loop {
        let leased = match t.store.stats().await {
            Ok(s) => {
                t.health.redis_answered();
                t.metrics.backlog(&s);
                t.note_paused(s.paused);
                if s.dead_forwardable > 0 && t.config.dead_letter.is_some() {
                    t.dead_lettered.notify_one();
                }
                recover(&t, &s, &mut cursor).await;
                s.inflight > 0
            }
            Err(e) => {
                if t.redis_error(&e) {
                    tracing::debug!(trigger = %t.name(), error = %e, "reading the backlog sizes failed");
                }
                true
            }
        };
        let wait = if leased { busy } else { interval };
        let mut deadline = Instant::now() + jitter_down(wait);
        if !leased {
            // A claim by this bridge makes leases: look again within `busy` of it.
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => continue,
                _ = t.claimed.notified() => deadline = deadline.min(Instant::now() + busy),
                _ = stop.cancelled() => return,
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Moves expired leases back to the queue while `stats` shows some, and sweeps one page of
/// stale failed-attempt entries while there are entries.
async fn recover(t: &Trigger, stats: &QueueStats, cursor: &mut String) {
    let expired = stats
        .earliest_lease_ms
        .is_some_and(|lease| lease < stats.now_ms);
    if !expired && stats.attempt_entries == 0 {
        return;
    }
    let mut sweep = (stats.attempt_entries > 0).then_some(cursor.clone());
    let mut limit = if expired { RECOVER_LIMIT } else { 0 };
    loop {
        match t.store.recover(limit, sweep.as_deref()).await {
            Ok(r) => {
                if sweep.take().is_some() {
                    *cursor = r.cursor;
                }
                if r.recovered > 0 {
                    tracing::info!(trigger = %t.name(), recovered = r.recovered, "expired leases recovered");
                    t.metrics.redelivered(r.recovered);
                    t.wake_all();
                }
                if r.recovered < RECOVER_LIMIT as u64 {
                    return;
                }
                limit = RECOVER_LIMIT;
            }
            Err(e) => {
                if t.redis_error(&e) {
                    tracing::debug!(trigger = %t.name(), error = %e, "recovering expired leases failed");
                }
                return;
            }
        }
    }
}

/// Most expired leases one recover call moves (bounds how long the script blocks Redis).
const RECOVER_LIMIT: usize = 1000;
