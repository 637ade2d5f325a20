//! Instructions per message, counted by callgrind: the bridge next to the sink's independent
//! publisher and the claim/settle client, and their lines in the report.

use serde::Serialize;

use super::Row;

/// What the instructions phase counted: each program's instructions in all, at `messages` and
/// at twice as many.
#[derive(Debug, Serialize)]
pub struct Instructions {
    /// Messages of the smaller run.
    pub messages: u64,
    /// What the independent publisher is ("amqprs publisher", ...).
    pub publisher_name: &'static str,
    /// The bridge draining the runs (start-up and shutdown included in each).
    pub bridge: [u64; 2],
    /// The independent publisher sending as many (a child process).
    pub publisher: [u64; 2],
    /// The claim and settle scripts alone draining as many (a child process).
    pub claim_settle: [u64; 2],
}

impl Instructions {
    /// Instructions per message of a program counted at both sizes: the difference over the
    /// extra messages, so that what does not depend on the count cancels out.
    fn per_message(&self, counts: [u64; 2]) -> f64 {
        (counts[1] as f64 - counts[0] as f64) / self.messages.max(1) as f64
    }

    /// The report's lines.
    pub fn rows(&self) -> Vec<Row> {
        let thousands = |v: f64| format!("{:.1}k instr", v / 1000.0);
        let runs = format!("{} and {} messages", self.messages, 2 * self.messages);
        let (p, c, b) = (
            self.per_message(self.publisher),
            self.per_message(self.claim_settle),
            self.per_message(self.bridge),
        );
        vec![
            Row {
                measurement: format!(
                    "instructions per message: {} (callgrind, {runs})",
                    self.publisher_name
                ),
                ceiling: thousands(p),
                ..Row::default()
            },
            Row {
                measurement: format!(
                    "instructions per message: claim + settle client (callgrind, {runs})"
                ),
                ceiling: thousands(c),
                ..Row::default()
            },
            Row {
                measurement: format!(
                    "instructions per message: bridge vs the two (callgrind, {runs})"
                ),
                bridge: thousands(b),
                ceiling: thousands(p + c),
                ratio: format!("{:.2}x", b / (p + c).max(1e-9)),
                ..Row::default()
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_per_message_is_the_difference_over_the_extra_messages() {
        let i = Instructions {
            messages: 1000,
            publisher_name: "HTTP client alone",
            // 40M to start and stop, then 60k, 10k and 100k per message.
            publisher: [100_000_000, 160_000_000],
            claim_settle: [50_000_000, 60_000_000],
            bridge: [140_000_000, 240_000_000],
        };
        let rows = i.rows();
        assert_eq!(rows[0].ceiling, "60.0k instr");
        assert_eq!(rows[1].ceiling, "10.0k instr");
        assert_eq!(rows[2].bridge, "100.0k instr");
        assert_eq!(rows[2].ceiling, "70.0k instr");
        assert_eq!(rows[2].ratio, "1.43x");
    }
}
