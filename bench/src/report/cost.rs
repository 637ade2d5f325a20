//! Cost per message: the bridge's CPU per 100k messages next to what an independent publisher
//! (amqprs, a plain rdkafka producer, the HTTP client alone) and the claim/settle client spend,
//! the Redis server's beside each, and their lines in the report.

use serde::Serialize;

use super::{verdict, Row};
use crate::child::ChildRun;

/// The bridge's CPU per message, at most this many times that of the producer and the
/// claim/settle client together.
const COST_RATIO: f64 = 1.5;

/// What a cost phase measured.
#[derive(Debug, Serialize)]
pub struct Cost {
    /// What the independent publisher is ("amqprs publisher", "plain rdkafka producer", "HTTP
    /// client alone").
    pub publisher_name: &'static str,
    /// Bridge CPU seconds per 100k messages in the forwarding phase of the same run.
    pub bridge_cpu_per_100k: f64,
    /// The Redis server's CPU seconds per 100k messages meanwhile.
    pub bridge_redis_cpu_per_100k: Option<f64>,
    /// The bridge's forwarding rate then.
    pub bridge_msg_per_s: f64,
    /// The independent publisher (a child process) sending as many messages.
    pub producer: ChildRun,
    /// The claim and settle scripts alone (a child process) draining as many.
    pub claim_settle: ChildRun,
    /// The Redis server's CPU seconds per 100k messages while the scripts alone ran.
    pub claim_settle_redis_cpu_per_100k: Option<f64>,
}

impl Cost {
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
        let mut rows = vec![
            Row {
                measurement: format!(
                    "cost: {} CPU per 100k ({:.0} msg/s)",
                    self.publisher_name,
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
                goal: format!("<= {COST_RATIO}x publisher + claim/settle"),
                result: verdict(ratio <= COST_RATIO),
            },
        ];
        if let Some((bridge, alone)) = self
            .bridge_redis_cpu_per_100k
            .zip(self.claim_settle_redis_cpu_per_100k)
        {
            rows.push(Row {
                measurement: "cost: redis server CPU per 100k, bridge forwarding vs the scripts alone"
                    .into(),
                bridge: secs(bridge),
                ceiling: secs(alone),
                ratio: format!("{:.2}x", bridge / alone.max(1e-9)),
                ..Row::default()
            });
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(messages: u64, cpu_seconds: f64) -> ChildRun {
        ChildRun {
            messages,
            seconds: 1.0,
            cpu_seconds,
        }
    }

    #[test]
    fn the_bridge_is_judged_against_the_publisher_and_the_scripts_together() {
        let cost = |bridge| Cost {
            publisher_name: "HTTP client alone",
            bridge_cpu_per_100k: bridge,
            bridge_redis_cpu_per_100k: Some(1.0),
            bridge_msg_per_s: 30_000.0,
            producer: run(200_000, 4.4),
            claim_settle: run(200_000, 1.6),
            claim_settle_redis_cpu_per_100k: Some(0.4),
        };
        // 2.2 s and 0.8 s per 100k: 3.0 s together, 4.5 s allowed.
        let within = cost(4.4).rows();
        assert!(within[0]
            .measurement
            .starts_with("cost: HTTP client alone CPU per 100k"));
        assert_eq!(within[0].ceiling, "2.200 s");
        assert_eq!(within[2].ratio, "1.47x");
        assert_eq!(within[2].result, verdict(true));
        assert_eq!(cost(4.6).rows()[2].result, verdict(false));
        // The Redis server's share beside the scripts alone's.
        assert_eq!(within[3].bridge, "1.000 s");
        assert_eq!(within[3].ratio, "2.50x");
    }
}
