//! The ingress metrics: messages taken from a broker and stored, refused, seen again, the store's latency and the backlog at the broker.

use prometheus::{
    exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Reasons an ingress refuses a message (dead-lettered at once), for the counters' labels.
pub const REFUSALS: [&str; 2] = ["bad_delay", "too_large"];

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
    /// Creates and registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["trigger"]).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let store_duration = HistogramVec::new(
            HistogramOpts::new(
                "ingress_store_duration_seconds",
                "Time to store one ingested message in Redis",
            )
            .buckets(exponential_buckets(0.0001, 2.0, 16).expect("valid buckets")),
            &["trigger"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(store_duration.clone()))
            .expect("unique metric");
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
