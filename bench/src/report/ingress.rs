//! The ingress phase's figures and their lines in the report.

use serde::Serialize;

use super::Row;

/// What the ingress phase measured.
#[derive(Debug, Serialize)]
pub struct IngressRun {
    /// Messages published to the ingress exchange.
    pub messages: u64,
    /// Messages stored per second, from the first publish to the last one stored.
    pub intake_msg_per_s: f64,
    /// The plain publisher's rate into the ingress exchange meanwhile.
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
                    "ingress intake ({} messages, store p99 <= {} ms)",
                    self.messages,
                    self.store_p99_le_ms
                        .map_or("?".into(), |ms| format!("{ms:.1}"))
                ),
                bridge: rate(self.intake_msg_per_s),
                ceiling: format!("{} published", rate(self.publish_msg_per_s)),
                ratio: format!(
                    "{:.0}%",
                    100.0 * self.intake_msg_per_s / self.publish_msg_per_s.max(1.0)
                ),
                ..Row::default()
            },
            Row {
                measurement: format!(
                    "ingress end-to-end lateness p50 / p99 / max ({} duplicates)",
                    self.duplicates
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
