//! The ingress phase's figures and their lines in the report.

use serde::Serialize;

use super::Row;

/// What the ingress phase measured.
#[derive(Debug, Serialize)]
pub struct IngressRun {
    /// `AMQP` or `Kafka`.
    pub broker: &'static str,
    /// Messages waiting in the broker's ingress queue or topic when the bridge started.
    pub messages: u64,
    /// Messages stored per second, from the first one stored to the last.
    pub intake_msg_per_s: f64,
    /// A plain consumer draining the same backlog from the same broker, msg/s.
    pub ceiling_msg_per_s: f64,
    /// What that consumer is.
    pub ceiling_client: &'static str,
    /// The plain publisher's (producer's) rate into the ingress while the backlog was made.
    pub publish_msg_per_s: f64,
    /// Upper bound of the 99th percentile of one store call (the metric's bucket).
    pub store_p99_le_ms: Option<f64>,
    /// Arrival minus due time (`x-delay-until`, set at publication): the end-to-end lateness.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Messages the consumer received more than once.
    pub duplicates: u64,
}

impl IngressRun {
    /// The report's lines.
    pub fn rows(&self) -> Vec<Row> {
        let rate = |r: f64| format!("{r:.0} msg/s");
        vec![
            Row {
                measurement: format!(
                    "{} ingress intake of a {}-message backlog (store p99 <= {} ms; published at {})",
                    self.broker,
                    self.messages,
                    self.store_p99_le_ms
                        .map_or("?".into(), |ms| format!("{ms:.1}")),
                    rate(self.publish_msg_per_s)
                ),
                bridge: rate(self.intake_msg_per_s),
                ceiling: format!("{} ({})", rate(self.ceiling_msg_per_s), self.ceiling_client),
                ratio: format!(
                    "{:.0}%",
                    100.0 * self.intake_msg_per_s / self.ceiling_msg_per_s.max(1.0)
                ),
                ..Row::default()
            },
            Row {
                measurement: format!(
                    "{} ingress end-to-end lateness p50 / p99 / max ({} duplicates)",
                    self.broker, self.duplicates
                ),
                bridge: format!(
                    "{:.1} / {:.1} / {:.1} ms",
                    self.p50_ms, self.p99_ms, self.max_ms
                ),
                ..Row::default()
            },
        ]
    }
}
