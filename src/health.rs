//! Readiness: whether Redis answers and every sink is connected. `/readyz` reads it; the
//! `redis_up` and `sink_up` gauges mirror it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::sink::Sink;

/// Shared readiness state (cheap to clone).
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    redis: AtomicBool,
    sinks: Vec<Arc<Sink>>,
    metrics: Metrics,
}

impl Health {
    /// Not ready until Redis has answered; `sinks` report their own connection state.
    pub fn new(metrics: &Metrics, sinks: Vec<Arc<Sink>>) -> Self {
        metrics.redis_up.set(0);
        for sink in &sinks {
            metrics.sink_up.with_label_values(&[sink.name()]).set(0);
        }
        Self {
            inner: Arc::new(Inner {
                redis: AtomicBool::new(false),
                sinks,
                metrics: metrics.clone(),
            }),
        }
    }

    /// Redis answered a call.
    pub fn redis_answered(&self) {
        self.set_redis(true);
    }

    /// A call failed for want of Redis (connection lost, timed out).
    pub fn redis_unreachable(&self) {
        self.set_redis(false);
    }

    fn set_redis(&self, up: bool) {
        self.inner.redis.store(up, Ordering::Relaxed);
        self.inner.metrics.redis_up.set(i64::from(up));
    }

    /// True while Redis answers.
    pub fn redis_up(&self) -> bool {
        self.inner.redis.load(Ordering::Relaxed)
    }

    /// `Ok` when ready, else what is not, one reason per line.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        let mut reasons = Vec::new();
        if !self.redis_up() {
            reasons.push("redis: not connected".to_string());
        }
        for sink in &self.inner.sinks {
            if !sink.is_up() {
                reasons.push(format!("sink {}: not connected", sink.name()));
            }
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }

    /// Makes the sink gauges agree with the sinks' state (read live at scrape time).
    pub fn mirror_sinks(&self) {
        for sink in &self.inner.sinks {
            self.inner
                .metrics
                .sink_up
                .with_label_values(&[sink.name()])
                .set(i64::from(sink.is_up()));
        }
    }
}
