//! Kafka sink: an idempotent `acks=all` producer; a record counts only once its delivery report is in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::statistics::Statistics;
use tokio_util::sync::CancellationToken;

use super::{await_confirms, OutMessage, PublishError, Route};
use crate::config::{KafkaKey, KafkaSinkConfig};
use crate::metrics::Metrics;

/// Properties the bridge sets unless the sink's `properties` override them.
pub const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("acks", "all"),
    ("enable.idempotence", "true"),
    ("message.timeout.ms", "30000"),
    ("linger.ms", "5"),
    ("batch.num.messages", "10000"),
    ("queue.buffering.max.messages", "100000"),
    ("compression.type", "lz4"),
    ("statistics.interval.ms", "1000"),
    ("reconnect.backoff.max.ms", "5000"),
];

/// Tracks broker reachability from librdkafka's statistics and error callbacks.
pub struct HealthContext {
    up: Arc<AtomicBool>,
    name: String,
}

impl ClientContext for HealthContext {
    fn stats(&self, stats: Statistics) {
        let up = stats
            .brokers
            .values()
            .any(|b| b.state == "UP" && b.nodeid >= 0);
        let was = self.up.swap(up, Ordering::Relaxed);
        if was != up {
            if up {
                tracing::info!(sink = %self.name, "connected to Kafka");
            } else {
                tracing::warn!(sink = %self.name, "no Kafka broker is up");
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::AllBrokersDown)
        ) {
            self.up.store(false, Ordering::Relaxed);
        }
        tracing::warn!(sink = %self.name, error = %error, reason, "kafka client error");
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(sink = %self.name, facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(sink = %self.name, facility = fac, "{log_message}")
            }
            _ => tracing::debug!(sink = %self.name, facility = fac, "{log_message}"),
        }
    }
}

/// One producer per sink, shared by every worker (librdkafka batches internally).
pub struct KafkaSink {
    name: String,
    producer: FutureProducer<HealthContext>,
    up: Arc<AtomicBool>,
}

impl KafkaSink {
    /// Creates the producer (librdkafka connects in the background).
    pub fn new(name: &str, config: &KafkaSinkConfig) -> anyhow::Result<Self> {
        let mut cc = client_config(config)?;
        cc.set("client.id", format!("delay-bridge-{name}"));
        let up = Arc::new(AtomicBool::new(false));
        let producer = cc.create_with_context(HealthContext {
            up: up.clone(),
            name: name.to_string(),
        })?;
        Ok(Self {
            name: name.to_string(),
            producer,
            up,
        })
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while at least one broker connection is up.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Mirrors the connection state into `sink_up` (librdkafka reconnects by itself).
    pub async fn supervise(&self, metrics: Metrics, cancel: CancellationToken) {
        let gauge = metrics.sink_up.with_label_values(&[&self.name]);
        // Ask for metadata once so a broker connection is made before the first message.
        let producer = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let _ = producer
                .client()
                .fetch_metadata(None, Duration::from_secs(5));
        })
        .await;
        loop {
            gauge.set(i64::from(self.is_up()));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// A handle for one worker; fails while no broker is up, so workers do not claim.
    pub fn publisher(&self) -> Result<KafkaPublisher, PublishError> {
        if !self.is_up() {
            return Err(PublishError::Connection("no Kafka broker is up".into()));
        }
        Ok(KafkaPublisher {
            producer: self.producer.clone(),
        })
    }

    /// Waits up to `timeout` for queued records to be delivered.
    pub async fn flush(&self, timeout: Duration) {
        let producer = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || producer.flush(timeout)).await;
    }
}

/// The librdkafka configuration: the bridge's defaults, then the user's properties.
pub fn client_config(config: &KafkaSinkConfig) -> anyhow::Result<ClientConfig> {
    let mut cc = ClientConfig::new();
    for (k, v) in DEFAULT_PROPERTIES {
        cc.set(*k, *v);
    }
    cc.set("bootstrap.servers", &config.brokers);
    for (k, v) in &config.properties {
        cc.set(k, v);
    }
    if let Some(file) = &config.sasl_password_file {
        cc.set("sasl.password", crate::secret::read_file(file)?);
    }
    Ok(cc)
}

/// A worker's handle on the shared producer.
pub struct KafkaPublisher {
    producer: FutureProducer<HealthContext>,
}

impl KafkaPublisher {
    /// Enqueues every record (waiting for room on `QueueFull`), then awaits the delivery reports.
    pub async fn publish_batch(
        &mut self,
        trigger: &str,
        route: &Route,
        messages: &[OutMessage<'_>],
        timeout: Duration,
        abort: &CancellationToken,
    ) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Result<(), PublishError>> =
            vec![Err(PublishError::Timeout); messages.len()];
        let Route::Kafka { topic, key } = route else {
            results.fill(Err(PublishError::BadPayload(
                "route is not a Kafka route".into(),
            )));
            return results;
        };
        let mut pending = FuturesUnordered::new();
        let deadline = tokio::time::Instant::now() + timeout;
        'messages: for (i, m) in messages.iter().enumerate() {
            let due = m.due_ms.to_string();
            let attempt = m.attempt.to_string();
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: "x-delay-trigger",
                    value: Some(trigger),
                })
                .insert(Header {
                    key: "x-delay-due-ms",
                    value: Some(&due),
                })
                .insert(Header {
                    key: "x-delay-attempt",
                    value: Some(&attempt),
                })
                .insert(Header {
                    key: "x-delay-id",
                    value: Some(m.id),
                });
            let mut record = FutureRecord::<[u8], [u8]>::to(topic)
                .payload(m.payload)
                .headers(headers);
            if *key == KafkaKey::Member {
                record = record.key(m.payload);
            }
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(async move {
                            let r = match delivery.await {
                                Ok(Ok(_)) => Ok(()),
                                Ok(Err((e, _))) => Err(classify(&e)),
                                Err(_) => Err(PublishError::Connection(
                                    "producer dropped the record".into(),
                                )),
                            };
                            (i, r)
                        });
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        // Wait for room: a delivery report frees a slot; never spin.
                        let room = async {
                            match pending.next().await {
                                Some((j, r)) => results[j] = r,
                                None => tokio::time::sleep(Duration::from_millis(5)).await,
                            }
                        };
                        tokio::select! {
                            _ = room => {}
                            _ = tokio::time::sleep_until(deadline) => break 'messages,
                            _ = abort.cancelled() => break 'messages,
                        }
                    }
                    Err((e, _)) => {
                        results[i] = Err(classify(&e));
                        break;
                    }
                }
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        await_confirms(&mut results, pending, left, abort).await;
        results
    }
}

/// Maps a Kafka error to a publish error; permanent ones are dead-lettered at once.
fn classify(e: &KafkaError) -> PublishError {
    let code = e.rdkafka_error_code();
    let permanent = matches!(
        code,
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::InvalidMessage
        )
    );
    PublishError::Kafka {
        code: code.map_or_else(|| "other".to_string(), snake_case),
        message: e.to_string(),
        permanent,
    }
}

/// `MessageSizeTooLarge` -> `message_size_too_large`: a bounded label from the error enum.
fn snake_case(code: RDKafkaErrorCode) -> String {
    let name = format!("{code:?}");
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_become_bounded_labels() {
        assert_eq!(
            snake_case(RDKafkaErrorCode::MessageSizeTooLarge),
            "message_size_too_large"
        );
        let e = classify(&KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge,
        ));
        assert_eq!(e.reason(), "kafka_message_size_too_large");
        assert_eq!(e.disposition(), super::super::Disposition::DeadLetter);
        let e = classify(&KafkaError::MessageProduction(
            RDKafkaErrorCode::RequestTimedOut,
        ));
        assert_eq!(e.disposition(), super::super::Disposition::Retry);
    }
}
