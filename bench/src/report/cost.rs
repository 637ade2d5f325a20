//! Kafka by cost: the bridge's CPU per 100k messages next to a plain producer's and the
//! claim/settle client's, and their lines in the report.

use serde::Serialize;

use super::{verdict, Row};
use crate::child::ChildRun;

/// The bridge's CPU per message, at most this many times that of the producer and the
/// claim/settle client together.
const COST_RATIO: f64 = 1.5;

/// What the Kafka cost phase measured.
#[derive(Debug, Serialize)]
pub struct KafkaCost {
    /// Bridge CPU seconds per 100k messages in the forwarding phase of the same run.
    pub bridge_cpu_per_100k: f64,
    /// The bridge's forwarding rate then.
    pub bridge_msg_per_s: f64,
    /// A plain rdkafka producer (a child process) producing the same messages.
    pub producer: ChildRun,
    /// The claim and settle scripts alone (a child process) draining as many.
    pub claim_settle: ChildRun,
}

impl KafkaCost {
    /// The report's lines.
    pub fn rows(&self) -> Vec<Row> {
        let secs = |v: f64| format!("{v:.3} s");
        let rate = |r: &ChildRun| r.messages as f64 / r.seconds.max(1e-9);
        let (p, c) = (
            self.producer.cpu_per_100k(),
            self.claim_settle.cpu_per_100k(),
        );
        let sum = p + c;
        let ratio = self.bridge_cpu_per_100k / sum.max(1e-9);
        vec![
            Row {
                measurement: format!(
                    "cost: plain rdkafka producer CPU per 100k ({:.0} msg/s)",
                    rate(&self.producer)
                ),
                ceiling: secs(p),
                ..Row::default()
            },
            Row {
                measurement: format!(
                    "cost: claim + settle client CPU per 100k ({:.0} msg/s)",
                    rate(&self.claim_settle)
                ),
                ceiling: secs(c),
                ..Row::default()
            },
            Row {
                measurement: format!(
                    "cost: bridge CPU per 100k forwarded ({:.0} msg/s) vs the two",
                    self.bridge_msg_per_s
                ),
                bridge: secs(self.bridge_cpu_per_100k),
                ceiling: secs(sum),
                ratio: format!("{ratio:.2}x"),
                goal: format!("<= {COST_RATIO}x producer + claim/settle"),
                result: verdict(ratio <= COST_RATIO),
            },
        ]
    }
}
