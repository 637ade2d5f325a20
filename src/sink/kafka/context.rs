//! The producer's librdkafka client context: its health as librdkafka's statistics, error
//! and log callbacks report it (broker connections up, fatal errors, warnings).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;

use crate::repeat::Repeated;

/// A warning this long after the previous one starts a new run, logged at once.
const QUIET: Duration = Duration::from_secs(60);

/// The state of one producer instance, fed by librdkafka's statistics and error callbacks.
#[derive(Default)]
pub(super) struct Health {
    /// At least one broker connection is up.
    pub(super) up: AtomicBool,
    /// The idempotent producer hit a fatal error and must be replaced.
    pub(super) fatal: AtomicBool,
    /// librdkafka's warnings, which repeat at every reconnect attempt (tens a second while
    /// a broker is down): logged at growing gaps, the run ending when a broker is up again.
    warnings: Mutex<Warnings>,
}

#[derive(Default)]
struct Warnings {
    run: Repeated,
    last: Option<Instant>,
}

impl Health {
    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed) && !self.fatal.load(Ordering::Relaxed)
    }

    pub(super) fn set_up(&self, sink: &str, up: bool) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if was != up {
            if up {
                let warnings = self.lock_warnings().run.recovered().unwrap_or(0);
                tracing::info!(sink, warnings, "connected to Kafka");
            } else {
                tracing::warn!(sink, "no Kafka broker is up");
            }
        }
    }

    /// Counts a client warning: `Some((failures, unlogged))` when it should be logged.
    fn warning(&self) -> Option<(u32, u64)> {
        let mut warnings = self.lock_warnings();
        let now = Instant::now();
        if warnings.last.is_some_and(|last| now - last > QUIET) {
            warnings.run.recovered();
        }
        warnings.last = Some(now);
        let unlogged = warnings.run.failed()?;
        Some((warnings.run.count(), unlogged))
    }

    fn lock_warnings(&self) -> std::sync::MutexGuard<'_, Warnings> {
        // A panic while logging leaves nothing half-updated that matters.
        self.warnings.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tracks broker reachability and fatal errors of one producer, and hands its delivery
/// reports to the batches (see `delivery`).
pub(super) struct HealthContext {
    pub(super) health: Arc<Health>,
    pub(super) name: String,
    pub(super) room: Arc<super::room::Room>,
}

impl ClientContext for HealthContext {
    fn stats(&self, stats: Statistics) {
        // Brokers learned from metadata have a node id; the bootstrap entry has -1.
        self.health.set_up(
            &self.name,
            stats
                .brokers
                .values()
                .any(|b| b.state == "UP" && b.nodeid >= 0),
        );
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => self.health.set_up(&self.name, false),
            // The supervisor logs it, once, when it replaces the producer.
            Some(RDKafkaErrorCode::Fatal) => self.health.fatal.store(true, Ordering::Relaxed),
            _ => {}
        }
        if let Some((failures, unlogged)) = self.health.warning() {
            tracing::warn!(sink = %self.name, error = %error, reason, failures, unlogged, "kafka client error");
        }
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => {
                if let Some((failures, unlogged)) = self.health.warning() {
                    tracing::warn!(sink = %self.name, facility = fac, failures, unlogged, "{log_message}")
                }
            }
            _ => tracing::debug!(sink = %self.name, facility = fac, "{log_message}"),
        }
    }
}
