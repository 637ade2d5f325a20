//! The ingress phase (AMQP): messages published to an ingress exchange, each due a fixed time after its publication (`x-delay-until`), taken in by the bridge and delivered: how fast it takes them in, and how late they arrive after the time they were due.

use std::time::Duration;

use anyhow::{bail, Context};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tokio::time::Instant;

use super::amqp::toml_str;
use super::process::{free_port, histogram_bound, BridgeProcess};
use super::report::IngressRun;
use super::tally::{self, quantile};
use super::{redis_ops, Bench, BridgeToml, Broker};

/// How long after its publication each message is due: long enough that the bridge takes
/// them all in before the first is due, so that the intake and the lateness are measured
/// apart.
const DUE_AFTER_MS: i64 = 5_000;
/// Publishes awaiting their confirms at once.
const WINDOW: u64 = 1_000;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

impl Bench {
    /// Runs the ingress phase; `None` on a Kafka bench (the phase is AMQP's).
    pub(super) async fn ingress(&self) -> anyhow::Result<Option<IngressRun>> {
        if !matches!(self.broker, Broker::Amqp(_)) {
            return Ok(None);
        }
        let n = self.args.ingress_messages;
        eprintln!("bench: ingress, {n} messages published with a delay");
        let key = self.new_key("ingress");
        let exchange = format!("delay-bridge-bench-{}.ingress", self.run_id);
        let port = free_port()?;
        let toml = BridgeToml {
            args: &self.args,
            broker: &self.broker,
            keys: std::slice::from_ref(&key),
            notifications: true,
            metrics_port: port,
            backlog: false,
            cluster: &[],
            shards: 1,
        }
        .render()
            + &format!(
                "[triggers.ingress]\nexchange = {}\nprefetch = 2000\n",
                toml_str(&exchange)
            );
        let path = self.dir.join("ingress.toml");
        std::fs::write(&path, toml)?;
        let log = self.dir.join("ingress.log");
        let mut bridge = BridgeProcess::spawn(&self.bridge, &path, port, &log)?;
        bridge.wait_ready(READY_TIMEOUT).await?;
        let conn = Connection::connect(&self.args.amqp_url, ConnectionProperties::default())
            .await
            .context("connecting the ingress publisher")?;
        let result = self.measure(&bridge, &conn, &exchange, n).await;
        bridge.stop(STOP_TIMEOUT).await?;
        let ch = conn.create_channel().await?;
        let queue = format!("{exchange}.ingress");
        ch.queue_delete(&queue, QueueDeleteOptions::default())
            .await?;
        ch.exchange_delete(&exchange, ExchangeDeleteOptions::default())
            .await?;
        let _ = conn.close(200, "done").await;
        redis_ops::unlink_queue(&mut self.conn.clone(), &key).await?;
        result.map(Some)
    }

    /// Publishes `n` messages, each due [`DUE_AFTER_MS`] after its publication, and waits
    /// until the bridge stored them all and the consumer received them.
    async fn measure(
        &self,
        bridge: &BridgeProcess,
        conn: &Connection,
        exchange: &str,
        n: u64,
    ) -> anyhow::Result<IngressRun> {
        let base = self.next_base();
        self.tally.reset(base, n);
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let start = Instant::now();
        let mut sent = 0;
        while sent < n {
            let mut confirms = Vec::new();
            for seq in sent..(sent + WINDOW).min(n) {
                let due = tally::now_us() / 1000 + DUE_AFTER_MS;
                let mut headers = FieldTable::default();
                headers.insert(
                    ShortString::from("x-delay-until"),
                    AMQPValue::LongLongInt(due),
                );
                let props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_headers(headers);
                let body = tally::payload(base + seq, self.args.payload_bytes);
                let options = BasicPublishOptions::default();
                // The message keeps its routing key: the bench queue's, as the route's.
                let rk = format!("delay-bridge-bench-{}", self.run_id);
                confirms.push(
                    ch.basic_publish(exchange, &rk, options, &body, props)
                        .await?,
                );
            }
            for c in confirms {
                c.await?;
            }
            sent = (sent + WINDOW).min(n);
        }
        let published = start.elapsed().as_secs_f64();
        let end = start + Duration::from_secs(60) + Duration::from_millis(n);
        let stored_at = loop {
            let metrics = bridge.metrics().await.unwrap_or_default();
            if counter(&metrics, "delay_bridge_ingress_messages_total") >= n as f64 {
                break start.elapsed().as_secs_f64();
            }
            if Instant::now() >= end {
                bail!("the bridge stored fewer than {n}; {}", bridge.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        while self.tally.distinct() < n {
            if Instant::now() >= end {
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
            messages: n,
            intake_msg_per_s: n as f64 / stored_at.max(1e-9),
            publish_msg_per_s: n as f64 / published.max(1e-9),
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

/// The sum of every sample of the counter `name` in a `/metrics` text.
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
