//! Per-trigger housekeeping: recovering expired leases and refreshing the backlog gauges.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Trigger;
use crate::backoff::jitter_down;

/// Recovers expired leases of one trigger until `stop` (any bridge instance may do this).
pub async fn recover_loop(t: Arc<Trigger>, stop: CancellationToken) {
    let interval = (t.config.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let counter = t.metrics.redelivered.with_label_values(&[t.name()]);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(jitter_down(interval)) => {}
            _ = stop.cancelled() => return,
        }
        loop {
            match t.store.recover(1000).await {
                Ok(0) => break,
                Ok(n) => {
                    tracing::info!(trigger = %t.name(), recovered = n, "expired leases recovered");
                    counter.inc_by(n);
                    t.wake_all();
                    if n < 1000 {
                        break;
                    }
                }
                Err(e) => {
                    t.redis_error(&e);
                    break;
                }
            }
        }
    }
}

/// Refreshes the backlog gauges of one trigger until `stop`.
pub async fn stats_loop(t: Arc<Trigger>, interval: Duration, stop: CancellationToken) {
    let name = t.name().to_string();
    loop {
        match t.store.stats().await {
            Ok(s) => {
                t.metrics.redis_up.set(1);
                for (state, v) in [
                    ("due", s.due),
                    ("scheduled", s.scheduled),
                    ("inflight", s.inflight),
                    ("dead", s.dead),
                ] {
                    t.metrics
                        .backlog
                        .with_label_values(&[&name, state])
                        .set(v as i64);
                }
                t.metrics
                    .oldest_due_age
                    .with_label_values(&[&name])
                    .set(s.oldest_due_age_seconds);
            }
            Err(e) => t.redis_error(&e),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}
