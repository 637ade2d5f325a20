//! The ingress phase: a backlog of delayed messages (`x-delay-until`) waiting in the broker is taken in by the bridge, next to a plain consumer draining the same backlog, then delivered when due: the intake rate against that ceiling, and the end-to-end lateness.

mod amqp;
mod kafka;

use std::time::Duration;

use anyhow::bail;
use tokio::time::Instant;

use super::process::{histogram_bound, metric_sum, BridgeProcess};
use super::report::IngressRun;
use super::tally::quantile;
use super::{Bench, BridgeToml, Broker};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the bridge's stored count is read while it takes the backlog in.
const POLL: Duration = Duration::from_millis(10);

/// How long after the backlog's publication its first message is due: the backlog is
/// published, the ceiling drained, the bridge started and every message taken in before the
/// first is due (a millisecond per message on top of five seconds), so that intake and
/// lateness are measured apart.
fn due_after_ms(n: u64) -> i64 {
    5_000 + n as i64
}

/// Messages falling due per second once the first is due: a steady stream, so that the
/// lateness is the ingress's and not that of a herd due at one instant.
const DUE_PER_SECOND: i64 = 2_000;

/// When message `seq` of a backlog whose first message is due at `first` (epoch ms) is due.
fn due_of(first: i64, seq: u64) -> i64 {
    first + seq as i64 * 1_000 / DUE_PER_SECOND
}

/// How fast a backlog was taken in: messages after the first seen, over the time between.
struct Rate {
    first: Option<(Instant, u64)>,
}

impl Rate {
    fn new() -> Self {
        Self { first: None }
    }

    /// `count` messages were taken by `at`.
    fn saw(&mut self, at: Instant, count: u64) {
        if count > 0 && self.first.is_none() {
            self.first = Some((at, count));
        }
    }

    /// Messages per second once `count` were taken at `at`.
    fn per_second(&self, at: Instant, count: u64) -> f64 {
        match self.first {
            Some((t0, c0)) if at > t0 && count > c0 => {
                (count - c0) as f64 / at.duration_since(t0).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// What a broker's part of the phase measured, before the bridge's delivery is added.
struct Backlog {
    /// Plain publisher (or producer) into the ingress, msg/s.
    publish_msg_per_s: f64,
    /// The plain consumer draining the same backlog, msg/s.
    ceiling_msg_per_s: f64,
    /// What the ceiling's consumer is, for the report.
    ceiling_client: &'static str,
}

impl Bench {
    /// Runs the ingress phase on an AMQP or Kafka bench; `None` on an HTTP one.
    pub(super) async fn ingress(&self) -> anyhow::Result<Option<IngressRun>> {
        match &self.broker {
            Broker::Amqp(_) => self.amqp_ingress().await.map(Some),
            Broker::Kafka(k) => self.kafka_ingress(k).await.map(Some),
            Broker::Http(_) => Ok(None),
        }
    }

    /// A bridge configuration for one trigger on `key` with `ingress` as its
    /// `[triggers.ingress]` lines, listening on `port`.
    fn ingress_toml(&self, key: &str, ingress: &str, port: u16) -> String {
        BridgeToml {
            args: &self.args,
            broker: &self.broker,
            keys: std::slice::from_ref(&key.to_string()),
            notifications: true,
            metrics_port: port,
            backlog: false,
            cluster: &[],
            shards: 1,
        }
        .render()
            + "[triggers.ingress]\n"
            + ingress
    }

    /// Starts a bridge on `toml` and waits until it is ready.
    async fn start_ingress_bridge(&self, toml: &str, port: u16) -> anyhow::Result<BridgeProcess> {
        let path = self.dir.join("ingress.toml");
        std::fs::write(&path, toml)?;
        let log = self.dir.join("ingress.log");
        let mut bridge = BridgeProcess::spawn(&self.bridge, &path, port, &log)?;
        bridge.wait_ready(READY_TIMEOUT).await?;
        Ok(bridge)
    }

    /// With `n` messages waiting in the broker (the tally reset for them), starts the
    /// bridge on `toml`, measures how fast it stores them, then waits until the consumer
    /// received every one and reports the whole run.
    async fn take_in(
        &self,
        toml: &str,
        port: u16,
        n: u64,
        backlog: Backlog,
        broker: &'static str,
    ) -> anyhow::Result<IngressRun> {
        let bridge = self.start_ingress_bridge(toml, port).await?;
        let result = self.measure(&bridge, n, backlog, broker).await;
        bridge.stop(STOP_TIMEOUT).await?;
        result
    }

    async fn measure(
        &self,
        bridge: &BridgeProcess,
        n: u64,
        backlog: Backlog,
        broker: &'static str,
    ) -> anyhow::Result<IngressRun> {
        let end = Instant::now() + Duration::from_secs(60) + Duration::from_millis(n);
        let mut rate = Rate::new();
        let intake = loop {
            let metrics = bridge.metrics().await.unwrap_or_default();
            let now = Instant::now();
            let stored =
                metric_sum(&metrics, "delay_bridge_ingress_messages_total").unwrap_or(0.0) as u64;
            rate.saw(now, stored);
            if stored >= n {
                break rate.per_second(now, stored);
            }
            if now >= end {
                bail!("the bridge stored {stored} of {n}; {}", bridge.log_tail());
            }
            tokio::time::sleep(POLL).await;
        };
        while self.tally.distinct() < n {
            if Instant::now() >= end + Duration::from_millis(due_after_ms(n) as u64) {
                bail!(
                    "the consumer received {} of {n}; {}",
                    self.tally.distinct(),
                    bridge.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let metrics = bridge.metrics().await.unwrap_or_default();
        let s = self.tally.summary(|_| true);
        let ms = |q: f64| quantile(&s.late_us, q).unwrap_or(0) as f64 / 1000.0;
        Ok(IngressRun {
            broker,
            messages: n,
            intake_msg_per_s: intake,
            ceiling_msg_per_s: backlog.ceiling_msg_per_s,
            ceiling_client: backlog.ceiling_client,
            publish_msg_per_s: backlog.publish_msg_per_s,
            store_p99_le_ms: histogram_bound(
                &metrics,
                "delay_bridge_ingress_store_duration_seconds",
                0.99,
            )
            .map(|s| s * 1000.0),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            max_ms: ms(1.0),
            duplicates: s.duplicates,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_counts_from_the_first_message_seen() {
        let t0 = Instant::now();
        let mut r = Rate::new();
        r.saw(t0, 0);
        r.saw(t0 + Duration::from_millis(10), 100);
        r.saw(t0 + Duration::from_millis(20), 600);
        let at = t0 + Duration::from_millis(110);
        assert!((r.per_second(at, 1_100) - 10_000.0).abs() < 1e-6);
        assert_eq!(Rate::new().per_second(at, 5), 0.0);
    }

    #[test]
    fn a_backlog_falls_due_as_a_steady_stream() {
        assert_eq!(due_of(1_000, 0), 1_000);
        assert_eq!(due_of(1_000, 1), 1_000);
        assert_eq!(due_of(1_000, 2), 1_001);
        assert_eq!(due_of(1_000, 20_000), 11_000);
    }
}
