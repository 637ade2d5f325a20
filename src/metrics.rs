//! Every Prometheus metric of the bridge, registered in one registry that is passed in.

mod dead_log;
mod ingress;
mod make;
mod schedule;
mod series;
mod trigger;

pub(crate) use ingress::IngressMetrics;
pub(crate) use schedule::ScheduleMetrics;
pub(crate) use series::{Cells, TriggerSeries};
pub(crate) use trigger::TriggerMetrics;

use make::Make;

use prometheus::{
    exponential_buckets, Encoder, Gauge, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Registry, TextEncoder,
};

/// Handles to the bridge's metrics. Labels are bounded: trigger, sink, reason, state.
#[derive(Clone)]
pub struct Metrics {
    /// The registry all metrics live in.
    pub registry: Registry,
    /// The process's own metrics, named without the prefix.
    process: Registry,
    /// Every trigger's counters and gauges (exported when scraped).
    pub triggers: std::sync::Arc<TriggerSeries>,
    /// Broker confirmation time minus due time.
    pub lateness: HistogramVec,
    /// Publish of one batch until its last confirmation.
    pub publish_duration: HistogramVec,
    /// Duration of one claim script call.
    pub claim_duration: HistogramVec,
    /// Members per non-empty claim.
    pub claim_batch_size: HistogramVec,
    /// Admin API requests by action and HTTP status.
    pub admin_requests: IntCounterVec,
    /// Redis Cluster topology changes the keyspace notifications followed.
    pub redis_topology_changes: IntCounter,
    /// Configuration reloads applied.
    pub config_reloads: IntCounter,
    /// Configuration reloads refused (the running configuration stayed).
    pub config_reload_failures: IntCounter,
    /// 1 while the sink is connected.
    pub sink_up: IntGaugeVec,
    /// HTTP sinks' requests by the class of their answer (`2xx` .. `5xx`, `timeout`, `error`).
    pub http_responses: IntCounterVec,
    /// 1 while Redis answers.
    pub redis_up: IntGauge,
    /// Constant 1 with the version and revision labels.
    pub build_info: IntGaugeVec,
    /// 1 while keyspace notifications are in use.
    pub notifications_enabled: Gauge,
    /// Messages taken from brokers by ingresses.
    pub ingress: IngressMetrics,
    /// Schedules' missed ticks and next fires.
    pub schedules: ScheduleMetrics,
}

const PREFIX: &str = "delay_bridge";

/// The source revision the binary was built from, when the build knew it.
pub(crate) const REVISION: &str = match option_env!("DELAY_BRIDGE_REVISION") {
    Some(revision) => revision,
    None => "unknown",
};

impl Metrics {
    /// Creates and registers every metric in a new registry.
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some(PREFIX.into()), None).expect("valid prefix");
        let make = Make(&registry);
        let latency_buckets = exponential_buckets(0.0001, 2.0, 18).expect("valid buckets");
        let size_buckets = exponential_buckets(1.0, 2.0, 14).expect("valid buckets");

        let triggers = std::sync::Arc::new(TriggerSeries::new());
        registry
            .register(Box::new(series::Exporter(triggers.clone())))
            .expect("unique metrics");
        let (redis_up, notifications_enabled) = redis_gauges(&make);

        let m = Self {
            triggers,
            lateness: make.histogram(
                "lateness_seconds",
                "Broker confirmation time minus due time",
                &["trigger"],
                LATENESS_BUCKETS.to_vec(),
            ),
            publish_duration: make.histogram(
                "publish_duration_seconds",
                "Time from publishing a batch to its last confirmation",
                &["trigger", "sink"],
                latency_buckets.clone(),
            ),
            claim_duration: make.histogram(
                "claim_duration_seconds",
                "Duration of one claim script call",
                &["trigger"],
                latency_buckets,
            ),
            claim_batch_size: make.histogram(
                "claim_batch_size",
                "Members taken by one non-empty claim",
                &["trigger"],
                size_buckets,
            ),
            redis_topology_changes: make.plain_counter(
                "redis_topology_changes_total",
                "Redis Cluster topology changes followed: a key's master changed or a master's connection ended",
            ),
            config_reloads: make.plain_counter("config_reloads_total", "Configuration reloads applied (SIGHUP or the admin API)"),
            config_reload_failures: make.plain_counter(
                "config_reload_failures_total",
                "Configuration reloads refused: the file did not validate or changed more than triggers",
            ),
            admin_requests: make.counter(
                "admin_requests_total",
                "Admin API requests by action (read, pause, purge, ...) and HTTP status",
                &["action", "code"],
            ),
            sink_up: make.int_gauge("sink_up", "1 while the sink's broker is connected, else 0", &["sink"]),
            http_responses: make.counter(
                "http_responses_total",
                "HTTP sinks' requests by the class of the answer: 1xx to 5xx, timeout (no answer in time), error (no answer)",
                &["sink", "class"],
            ),
            redis_up,
            build_info: make.int_gauge(
                "build_info",
                "Always 1; the version and revision labels name the build",
                &["version", "revision"],
            ),
            notifications_enabled,
            ingress: IngressMetrics::new(&make),
            schedules: ScheduleMetrics::new(&make),
            registry,
            process: process_registry(),
        };
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), REVISION])
            .set(1);
        m
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        let _ = TextEncoder::new().encode(&families, &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// The standard `process_*` metrics (CPU seconds, resident and virtual memory, open and
/// maximum file descriptors, start time, threads), read from `/proc/self` at each scrape,
/// in a registry of their own: they keep their standard names, without the prefix.
fn process_registry() -> Registry {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("unique metrics");
    registry
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// `redis_up` and `keyspace_notifications_enabled`, registered.
fn redis_gauges(make: &Make<'_>) -> (IntGauge, Gauge) {
    let redis_up = make.registered(
        IntGauge::new("redis_up", "1 while Redis answers, else 0").expect("valid metric"),
    );
    let help = "1 while workers are woken by Redis keyspace notifications, 0 when they rely on the guard interval";
    let notifications_enabled =
        make.registered(Gauge::new("keyspace_notifications_enabled", help).expect("valid metric"));
    (redis_up, notifications_enabled)
}

/// Lateness buckets: 1 ms to 5 min, fine where the on-time goals are (a few ms) and coarse
/// beyond.
const LATENESS_BUCKETS: [f64; 21] = [
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
