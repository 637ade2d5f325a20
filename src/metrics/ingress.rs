//! The ingress metrics: messages taken from a broker and stored, refused, seen again, the store's latency and the backlog at the broker.

use prometheus::{exponential_buckets, HistogramVec, IntCounterVec, IntGaugeVec};

use super::Make;

/// Reasons an ingress refuses a message (dead-lettered at once), for the counters' labels.
pub(crate) const REFUSALS: [&str; 2] = ["bad_delay", "too_large"];

/// Handles to the ingress metrics, labelled by trigger.
#[derive(Clone)]
pub struct IngressMetrics {
    /// Messages taken from the broker and stored (scheduled).
    pub stored: IntCounterVec,
    /// Deliveries whose id was already stored: a redelivery, stored once.
    pub duplicates: IntCounterVec,
    /// Messages refused, by reason: dead-lettered, then acknowledged.
    pub refused: IntCounterVec,
    /// One store call, from the delivery to Redis's reply.
    pub store_duration: HistogramVec,
    /// Messages waiting at the broker (AMQP: the ingress queue's ready messages).
    pub lag: IntGaugeVec,
    /// 1 while the ingress consumes, 0 while it is stopped (Redis down, the broker away).
    pub consuming: IntGaugeVec,
}

impl IngressMetrics {
    /// Creates and registers them.
    pub(super) fn new(make: &Make<'_>) -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| make.counter(name, help, labels);
        let gauge = |name: &str, help: &str| make.int_gauge(name, help, &["trigger"]);
        let store_duration = make.histogram(
            "ingress_store_duration_seconds",
            "Time to store one ingested message in Redis",
            &["trigger"],
            exponential_buckets(0.0001, 2.0, 16).expect("valid buckets"),
        );
        Self {
            stored: counter(
                "ingress_messages_total",
                "Messages taken from the broker by an ingress and stored in Redis",
                &["trigger"],
            ),
            duplicates: counter(
                "ingress_duplicates_total",
                "Deliveries an ingress found already stored (redelivered): stored once",
                &["trigger"],
            ),
            refused: counter(
                "ingress_refused_total",
                "Messages an ingress refused, by reason: dead-lettered",
                &["trigger", "reason"],
            ),
            store_duration,
            lag: gauge(
                "ingress_lag",
                "Messages waiting at the broker for an ingress (AMQP: ready messages of its queue)",
            ),
            consuming: gauge(
                "ingress_consuming",
                "1 while an ingress consumes, 0 while it is stopped (Redis unavailable, broker away)",
            ),
        }
    }

    /// Makes the trigger's series exist, at 0, before its first message.
    pub fn start(&self, trigger: &str) {
        self.stored.with_label_values(&[trigger]);
        self.duplicates.with_label_values(&[trigger]);
        for reason in REFUSALS {
            self.refused.with_label_values(&[trigger, reason]);
        }
        self.lag.with_label_values(&[trigger]);
        self.consuming.with_label_values(&[trigger]).set(0);
    }
}
