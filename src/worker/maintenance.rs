//! Per-trigger housekeeping: recovering expired leases and refreshing the backlog gauges.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Trigger;
use crate::backoff::jitter_down;

/// Recovers expired leases of one trigger until `stop` (any bridge instance may do this),
/// and sweeps stale failed-attempt entries a page at a time as it goes.
pub async fn recover_loop(t: Arc<Trigger>, stop: CancellationToken) {
    let interval = (t.config.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut cursor = String::from("0");
    loop {
        tokio::select! {
            _ = tokio::time::sleep(jitter_down(interval)) => {}
            _ = stop.cancelled() => return,
        }
        let mut sweep = Some(cursor.as_str());
        loop {
            match t.store.recover(RECOVER_LIMIT, sweep).await {
                Ok(r) => {
                    if sweep.is_some() {
                        cursor = r.cursor;
                        sweep = None;
                    }
                    if r.recovered == 0 {
                        break;
                    }
                    tracing::info!(trigger = %t.name(), recovered = r.recovered, "expired leases recovered");
                    t.metrics.redelivered(r.recovered);
                    t.wake_all();
                    if r.recovered < RECOVER_LIMIT as u64 {
                        break;
                    }
                }
                Err(e) => {
                    if t.redis_error(&e) {
                        tracing::debug!(trigger = %t.name(), error = %e, "recovering expired leases failed");
                    }
                    break;
                }
            }
        }
    }
}

/// Most expired leases one recover call moves (bounds how long the script blocks Redis).
const RECOVER_LIMIT: usize = 1000;

/// Refreshes the backlog gauges of one trigger until `stop`.
pub async fn stats_loop(t: Arc<Trigger>, interval: Duration, stop: CancellationToken) {
    loop {
        match t.store.stats().await {
            Ok(s) => {
                t.health.redis_answered();
                t.metrics.backlog(&s);
                t.note_paused(s.paused);
            }
            Err(e) => {
                if t.redis_error(&e) {
                    tracing::debug!(trigger = %t.name(), error = %e, "reading the backlog sizes failed");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}
