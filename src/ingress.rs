//! Ingress: delayed messages producers publish to the broker (with `x-delay`) taken in and stored in a trigger's queue, once each, acknowledged (AMQP) or committed (Kafka) only after Redis has them.

mod amqp;
pub(crate) mod delay;
mod kafka;
pub(crate) mod message;
pub(crate) mod record;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{Destination, Trigger};
use crate::health::{Health, IngressReadiness};
use crate::metrics::Metrics;
use crate::redis::queue::Queue;
use crate::redis::store::{Ingest, StoreError};
use crate::sink::Sink;
use crate::trigger::Shard;
use delay::Due;
use message::Incoming;

/// What an ingress of one trigger works with.
pub(crate) struct Ingress {
    config: Arc<Trigger>,
    queue: Queue,
    /// The trigger's shards, in the queue's order: the one written to is woken.
    shards: Vec<Arc<Shard>>,
    metrics: Metrics,
    health: Health,
    /// Set while consuming is stopped for want of Redis (`/readyz` says so).
    stopped: AtomicBool,
    /// What `/readyz` says of it.
    readiness: IngressReadiness,
    /// Times in a row Redis refused a write: the wait before consuming again grows with it
    /// (Redis over `maxmemory` answers reads, so answering is not enough to go on).
    refusals: AtomicU32,
}

/// Why consuming ended.
#[derive(Debug)]
enum Ended {
    /// The broker connection or channel failed: connect again.
    Broker(String),
    /// Redis did not take a write: stop consuming until it does.
    Redis(StoreError),
}

impl From<lapin::Error> for Ended {
    fn from(e: lapin::Error) -> Self {
        Ended::Broker(e.to_string())
    }
}

impl Ingress {
    /// The ingress of `config`'s trigger, storing into `queue` and waking `shards`.
    pub(crate) fn new(
        config: Arc<Trigger>,
        queue: Queue,
        shards: Vec<Arc<Shard>>,
        metrics: Metrics,
        health: Health,
    ) -> Self {
        metrics.ingress.start(config.name());
        let readiness = health.ingress(config.name());
        Self {
            config,
            queue,
            shards,
            metrics,
            health,
            stopped: AtomicBool::new(false),
            readiness,
            refusals: AtomicU32::new(0),
        }
    }

    /// Consumes until `stop`; a store in progress then finishes and is acknowledged.
    pub(crate) async fn run(self, sink: Arc<Sink>, stop: CancellationToken) {
        let Some(ingress) = self.config.ingress() else {
            return;
        };
        match &*sink {
            Sink::Amqp(amqp) => amqp::run(&self, amqp, ingress, &stop).await,
            Sink::Kafka(k) => kafka::run(&self, k, ingress, &stop).await,
            // The configuration refuses an ingress on an HTTP sink (`config::ingress`).
            Sink::Http(_) => return,
        }
        self.consuming(false);
        self.readiness.consuming();
    }

    /// What the store is asked to do with `m`: schedule it, or dead-letter it with a reason.
    fn disposition<'a>(&self, m: &'a Incoming) -> Ingest<'a> {
        if m.envelope.len() > self.config.max_message_bytes() {
            return Ingest::Dead {
                reason: "too_large",
                detail: "the message (body and properties) is over max_message_bytes",
            };
        }
        if let Some(why) = &m.refused {
            return Ingest::Dead {
                reason: "bad_envelope",
                detail: why,
            };
        }
        // Checked now too (the worker checks again when it is due): the producer learns of it
        // while its record is fresh, not when it was due.
        if let Some(topic) = &m.topic {
            let allowed = match &self.config.destination() {
                Destination::Kafka(route) => route.allows(topic),
                _ => false,
            };
            if !allowed {
                return Ingest::Dead {
                    reason: "topic_not_allowed",
                    detail: topic,
                };
            }
        }
        match &m.due {
            Ok(Due::In(ms)) => Ingest::In(*ms),
            Ok(Due::At(ms)) => Ingest::At(*ms),
            Err(why) => Ingest::Dead {
                reason: "bad_delay",
                detail: why,
            },
        }
    }

    /// Stores one message, once: `Ok` when Redis has it (now or from an earlier delivery).
    async fn store(&self, m: &Incoming) -> Result<(), StoreError> {
        let how = self.disposition(m);
        let name = self.config.name();
        let started = Instant::now();
        let result = self
            .queue
            .for_member(&m.id)
            .ingest(&m.id, &m.envelope, how)
            .await;
        self.metrics
            .ingress
            .store_duration
            .with_label_values(&[name])
            .observe(started.elapsed().as_secs_f64());
        let done = match result {
            Ok(done) => done,
            Err(e) => {
                if matches!(e.kind(), "connection" | "timeout") {
                    self.health.redis_unreachable(&e);
                }
                return Err(e);
            }
        };
        self.health.redis_answered();
        self.refusals.store(0, Ordering::Relaxed);
        if self.stopped.swap(false, Ordering::Relaxed) {
            tracing::info!(trigger = name, "ingress: Redis takes writes again");
            self.readiness.consuming();
        }
        let m_ = &self.metrics.ingress;
        match how {
            _ if !done.stored => m_.duplicates.with_label_values(&[name]).inc(),
            Ingest::Dead { reason, detail } => {
                tracing::warn!(trigger = name, reason, detail, id = %String::from_utf8_lossy(&m.id),
                    "ingress: message refused, dead-lettered");
                m_.refused.with_label_values(&[name, reason]).inc();
            }
            _ => m_.stored.with_label_values(&[name]).inc(),
        }
        if done.stored {
            let dead = matches!(how, Ingest::Dead { .. });
            self.shards[self.queue.shard_index(&m.id)].ingested(dead);
        }
        Ok(())
    }

    /// Consuming stopped because Redis did not take a write: logged, shown by `/readyz`.
    fn redis_stopped(&self, e: &StoreError) {
        let name = self.config.name();
        self.refusals.fetch_add(1, Ordering::Relaxed);
        if !self.stopped.swap(true, Ordering::Relaxed) {
            tracing::warn!(trigger = name, error = %e,
                "ingress: Redis did not take a write; consuming stops (messages stay at the broker) until it does");
        }
        self.readiness.stopped(&format!("Redis: {}", e.kind()));
    }

    /// Waits until Redis takes a write again (or `stop`), probing with a write that changes
    /// nothing ([`Queue::probe_write`]), the first probe the later the more times in a row
    /// it refused one; `false` on `stop`. A Redis that answers reads but refuses writes (over
    /// `maxmemory`, `NOREPLICAS`, a read-only replica) keeps the ingress stopped: consuming
    /// again would take the messages and hand them back to the broker, once per try, and a
    /// quorum queue's `delivery-limit` drops a message handed back too often.
    async fn wait_for_redis(&self, stop: &CancellationToken) -> bool {
        let refusals = self.refusals.load(Ordering::Relaxed).min(5);
        let mut wait =
            (Duration::from_millis(250) * 2u32.pow(refusals)).min(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
            }
            match self.queue.probe_write().await {
                Ok(()) => return true,
                Err(e) => self.readiness.stopped(&format!("Redis: {}", e.kind())),
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    /// Mirrors whether the ingress consumes in its gauge and, once it does (and Redis has
    /// not refused a write since), in readiness.
    fn consuming(&self, on: bool) {
        self.metrics
            .ingress
            .consuming
            .with_label_values(&[&self.config.name()])
            .set(i64::from(on));
        if on && !self.stopped.load(Ordering::Relaxed) {
            self.readiness.consuming();
        }
    }

    /// Whether to consume again after a session ended, once Redis answers after refusing a
    /// write, or after the wait `failed` returns for a broker failure (it logs the error);
    /// `false` when the session ended for good or `stop` came first.
    async fn session_ended(
        &self,
        ended: Result<(), Ended>,
        stop: &CancellationToken,
        failed: impl FnOnce(&str) -> Duration,
    ) -> bool {
        match ended {
            Ok(()) => false,
            Err(Ended::Redis(e)) => {
                self.redis_stopped(&e);
                self.wait_for_redis(stop).await
            }
            Err(Ended::Broker(e)) => {
                self.broker_failed();
                wait_unless_stopped(stop, failed(&e)).await
            }
        }
    }

    /// Consuming failed on the broker's side: not ready until it consumes again.
    fn broker_failed(&self) {
        self.readiness.stopped("cannot consume from the broker");
    }
}

/// Waits `wait`; `false` when `stop` came first.
async fn wait_unless_stopped(stop: &CancellationToken, wait: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}
