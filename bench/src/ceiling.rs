//! The broker ceiling: the bridge's own sink publishing, with no Redis and no claiming around
//! it, so it measures the same client path (properties, headers, confirms, producer settings)
//! as the bridge under test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use delay_bridge::parts::config::{self, Destination};
use delay_bridge::parts::metrics::Metrics;
use delay_bridge::parts::sink::{Batch, OutMessage, Publisher, Sink};
use delay_bridge::wire::MessageId;
use delay_bridge::MAX_IN_FLIGHT;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tally::payload;

/// The sink's name (AMQP connection `delay-bridge/<name>`, Kafka `client.id` `delay-bridge-<name>`).
const SINK_NAME: &str = "bench-ceiling";
/// The trigger name the messages carry in their headers.
const TRIGGER: &str = "bench";
/// How long the sink may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a publisher is asked for while the sink connects.
const CONNECT_POLL: Duration = Duration::from_millis(50);

/// The messages a ceiling run sends and how it pipelines them.
#[derive(Debug, Clone)]
pub struct Window {
    /// Queue name the message ids are derived from, as the bridge does.
    pub key: String,
    /// First sequence number.
    pub base: u64,
    /// Messages.
    pub count: u64,
    /// Bytes per payload.
    pub payload_bytes: usize,
    /// The due time every header carries.
    pub due_ms: i64,
    /// Messages published before awaiting their confirms (the bridge's batch); each
    /// publisher keeps `worker::MAX_IN_FLIGHT` such windows going, as a worker does.
    pub batch: usize,
}

/// A connected sink and one publisher per worker, as the bridge's workers hold them.
pub struct Ceiling {
    sink: Arc<Sink>,
    publishers: Vec<Publisher>,
    timeout: Duration,
    stop: CancellationToken,
    supervisor: JoinHandle<()>,
}

impl Ceiling {
    /// Builds the sink from the bridge's resolved sink config, keeps it connected like the
    /// bridge does, and waits until it hands out a publisher to `destination` for each of
    /// `workers`. `timeout` is the trigger's `publish_timeout`.
    pub async fn connect(
        config: &config::Sink,
        destination: &Destination,
        workers: usize,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        // The bridge's settings under a name of its own, so the broker tells the two apart.
        let config = config::Sink::validate(SINK_NAME, config.settings().clone())?;
        let sink = Sink::new(&config)?;
        let stop = CancellationToken::new();
        let supervisor = tokio::spawn({
            let (sink, stop) = (sink.clone(), stop.clone());
            // A refused topology ends supervision; `publisher` then keeps failing with the
            // refusal, which is what `connect` reports.
            async move {
                let _ = sink.supervise(Metrics::new(), stop).await;
            }
        });
        let mut ceiling = Self {
            sink,
            publishers: Vec::with_capacity(workers),
            timeout,
            stop,
            supervisor,
        };
        let end = Instant::now() + CONNECT_TIMEOUT;
        while ceiling.publishers.len() < workers {
            match ceiling.sink.publisher(destination).await {
                Ok(p) => ceiling.publishers.push(p),
                Err(e) if Instant::now() >= end => {
                    ceiling.close().await;
                    bail!("the ceiling's sink did not connect within {CONNECT_TIMEOUT:?}: {e}");
                }
                Err(_) => tokio::time::sleep(CONNECT_POLL).await,
            }
        }
        Ok(ceiling)
    }

    /// Publishes `w.count` messages with `publish_batch`, each publisher keeping
    /// `MAX_IN_FLIGHT` windows of `w.batch` in flight, and fails unless every one of them was
    /// confirmed. Returns when publishing started.
    pub async fn publish(&self, w: &Window) -> anyhow::Result<Instant> {
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        // One failed window aborts the others instead of letting them run to the end.
        let abort = CancellationToken::new();
        let mut lanes = Vec::new();
        for publisher in &self.publishers {
            for _ in 0..MAX_IN_FLIGHT {
                let (mut publisher, next, w) = (publisher.clone(), next.clone(), w.clone());
                let (abort, timeout) = (abort.clone(), self.timeout);
                lanes.push(tokio::spawn(async move {
                    let mut confirmed = 0u64;
                    loop {
                        let start = next.fetch_add(w.batch as u64, Ordering::Relaxed);
                        if start >= w.count || abort.is_cancelled() {
                            return Ok::<_, anyhow::Error>(confirmed);
                        }
                        let end = (start + w.batch as u64).min(w.count);
                        let bodies: Vec<Vec<u8>> = (start..end)
                            .map(|i| payload(w.base + i, w.payload_bytes))
                            .collect();
                        let ids: Vec<MessageId> =
                            bodies.iter().map(|b| MessageId::new(&w.key, b)).collect();
                        let messages: Vec<OutMessage<'_>> = bodies
                            .iter()
                            .zip(&ids)
                            .map(|(body, id)| OutMessage {
                                payload: body,
                                member: body,
                                due_ms: w.due_ms,
                                attempt: 1,
                                id: id.as_str(),
                                routing_key: None,
                                properties: None,
                                url: None,
                                topic: None,
                            })
                            .collect();
                        let outcomes = publisher
                            .publish_batch(Batch {
                                trigger: TRIGGER,
                                messages: &messages,
                                timeout,
                                abort: &abort,
                                confirms: None,
                            })
                            .await;
                        // Only a confirmation counts.
                        confirmed += outcomes.iter().filter(|o| o.is_ok()).count() as u64;
                        if let Some(Err(e)) = outcomes.iter().find(|o| o.is_err()) {
                            if abort.is_cancelled() {
                                // Aborted because another window failed: that one reports.
                                return Ok(confirmed);
                            }
                            abort.cancel();
                            bail!("the broker did not confirm a message: {e}");
                        }
                    }
                }));
            }
        }
        let mut confirmed = 0;
        let mut failed = None;
        for lane in lanes {
            match lane.await.context("a ceiling publisher panicked")? {
                Ok(n) => confirmed += n,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e.context(format!("{confirmed} of {} confirmed", w.count)));
        }
        if confirmed != w.count {
            bail!("{confirmed} of {} messages confirmed", w.count);
        }
        Ok(started)
    }

    /// Stops the sink's supervisor, closes the AMQP connection or flushes and drops the Kafka
    /// producer.
    pub async fn close(self) {
        self.stop.cancel();
        let _ = self.supervisor.await;
        drop(self.publishers);
        self.sink.flush(Duration::from_secs(1)).await;
        self.sink.close().await;
        // Dropping a Kafka producer flushes it briefly: not on the runtime's threads.
        let sink = self.sink;
        let _ = tokio::task::spawn_blocking(move || drop(sink)).await;
    }
}
