//! The herd phase's figures and their lines in the report.

use serde::Serialize;

use super::{millis, Row};

/// The herd's drain rate against the broker's ceiling.
const HERD_MIN_RATIO: f64 = 0.9;
/// The trickle's lateness p99 while the herd drains, milliseconds.
const TRICKLE_P99_MS: f64 = 50.0;

/// What the herd phase measured.
#[derive(Debug, Serialize)]
pub struct Herd {
    /// The herd's members over the time from their release to the consumer holding all.
    pub drain: super::Rate,
    /// Messages per second scheduled on the other trigger meanwhile.
    pub trickle_per_s: u64,
    /// Messages the other trigger received.
    pub trickle_messages: u64,
    /// The trickle's lateness (consumer receive time minus due time), milliseconds.
    pub trickle_p50_ms: f64,
    pub trickle_p99_ms: f64,
    pub trickle_max_ms: f64,
    /// Messages of the phase received more than once.
    pub duplicates: u64,
    /// Bridge CPU seconds while the herd drained.
    pub cpu_seconds: f64,
}

impl Herd {
    /// The report's lines: the drain next to `ceiling` (the broker's), the trickle's lateness.
    pub fn rows(&self, ceiling: Option<f64>) -> Vec<Row> {
        let drain = format!(
            "herd drain rate ({} due at one ms, beside a trickle on another trigger)",
            self.drain.messages
        );
        let goal = format!("bridge >= {:.0}% of broker ceiling", 100.0 * HERD_MIN_RATIO);
        let label = format!(
            "{} msg/s, {} msgs, beside the herd",
            self.trickle_per_s, self.trickle_messages
        );
        let mut rows = vec![
            Row::against(drain, self.drain.msg_per_s, ceiling, HERD_MIN_RATIO, &goal),
            Row::shown(
                format!("trickle lateness p50 ({label})"),
                millis(self.trickle_p50_ms),
            ),
            Row::judged(
                "trickle lateness p99 (beside the herd)",
                millis(self.trickle_p99_ms),
                format!("<= {TRICKLE_P99_MS} ms"),
                self.trickle_p99_ms <= TRICKLE_P99_MS,
            ),
            Row::shown(
                "trickle lateness max (beside the herd)",
                millis(self.trickle_max_ms),
            ),
        ];
        if self.duplicates > 0 {
            rows.push(Row::shown(
                "duplicates received in the herd phase",
                self.duplicates.to_string(),
            ));
        }
        rows
    }
}
