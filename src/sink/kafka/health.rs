//! A producer's health as librdkafka reports it: broker connections up, fatal errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;

/// The state of one producer instance, fed by librdkafka's statistics and error callbacks.
#[derive(Default)]
pub(super) struct Health {
    /// At least one broker connection is up.
    pub(super) up: AtomicBool,
    /// The idempotent producer hit a fatal error and must be replaced.
    pub(super) fatal: AtomicBool,
}

impl Health {
    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed) && !self.fatal.load(Ordering::Relaxed)
    }

    pub(super) fn set_up(&self, sink: &str, up: bool) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if was != up {
            if up {
                tracing::info!(sink, "connected to Kafka");
            } else {
                tracing::warn!(sink, "no Kafka broker is up");
            }
        }
    }
}

/// Tracks broker reachability and fatal errors of one producer.
pub struct HealthContext {
    pub(super) health: Arc<Health>,
    pub(super) name: String,
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
            Some(RDKafkaErrorCode::Fatal) => self.health.fatal.store(true, Ordering::Relaxed),
            _ => {}
        }
        tracing::warn!(sink = %self.name, error = %error, reason, "kafka client error");
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => {
                tracing::warn!(sink = %self.name, facility = fac, "{log_message}")
            }
            _ => tracing::debug!(sink = %self.name, facility = fac, "{log_message}"),
        }
    }
}
