//! A worker's Kafka publisher: enqueue a batch, wait for room when the queue is full, await
//! every delivery report.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};

use super::delivery::Report;
use super::errors::classify;
use super::{down, Instance, SinkState};
use crate::config::{KafkaKey, KafkaRoute};
use crate::sink::blame::KafkaBlame;
use crate::sink::{await_confirms, record_outcome, Batch, OutMessage, Outcome, PublishError};
use crate::wire::{HEADER_ATTEMPT, HEADER_DUE_MS, HEADER_ID, HEADER_TRIGGER};

/// How long a publisher that found librdkafka's queue full waits at most before trying again.
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(5);

/// A worker's handle on the sink's producer (whichever instance is current).
#[derive(Clone)]
pub struct KafkaPublisher {
    pub(super) shared: Arc<SinkState>,
    pub(super) route: KafkaRoute,
}

impl KafkaPublisher {
    /// False while no broker is up: the worker should stop claiming and ask the sink again.
    pub fn is_usable(&self) -> bool {
        self.shared.current().health.is_up()
    }

    /// Enqueues every record (waiting for room on `QueueFull`), then awaits the delivery
    /// reports (each also to `confirms` as it arrives).
    pub async fn publish_batch(&mut self, batch: Batch<'_, '_>) -> Vec<Outcome> {
        let mut results = batch.unconfirmed();
        let KafkaRoute { topic, key, .. } = &self.route;
        let Instance { producer, health } = self.shared.current();
        if !health.is_up() {
            // Claimed while the broker went away: hand the batch back untouched.
            results.fill(Err(down()));
            return results;
        }
        let room = &self.shared.room;
        let (reports, mut reported) = tokio::sync::mpsc::unbounded_channel();
        let deadline = tokio::time::Instant::now() + batch.timeout;
        let (mut due, mut attempt) = (itoa::Buffer::new(), itoa::Buffer::new());
        'messages: for (i, m) in batch.messages.iter().enumerate() {
            let (headers, own_key) = headers_of(batch.trigger, m, &mut due, &mut attempt);
            let mut record = BaseRecord::<[u8], [u8], Box<Report>>::with_opaque_to(
                m.topic.unwrap_or(topic),
                Report::new(&reports, i),
            )
            .payload(m.payload)
            .headers(headers);
            if let Some(own) = own_key {
                record = record.key(own);
            } else if *key == KafkaKey::Member {
                // Every copy of one member (payload or id) hashes to one partition.
                record = record.key(m.member);
            }
            let mut freed = None;
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        // librdkafka's queue is full (shared by every worker): wait until a
                        // delivery report, ours or another worker's, frees a slot.
                        let Some(wait) = freed.as_mut() else {
                            freed = Some(room.wait());
                            continue;
                        };
                        let look_again = tokio::select! {
                            Some((j, r)) = reported.recv() => {
                                record_outcome(&mut results, j, r, batch.confirms);
                                false
                            }
                            _ = wait => true,
                            // A slot frees only once the report's event is done with: look
                            // again after a while even if no other report comes.
                            _ = tokio::time::sleep(QUEUE_FULL_RETRY) => true,
                            _ = tokio::time::sleep_until(deadline) => {
                                record.delivery_opaque.disarm();
                                break 'messages;
                            }
                            _ = batch.abort.cancelled() => {
                                record.delivery_opaque.disarm();
                                break 'messages;
                            }
                        };
                        if look_again {
                            freed = None;
                        }
                    }
                    Err((e, mut back)) => {
                        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                            health.fatal.store(true, Ordering::Relaxed);
                        }
                        // Never enqueued: its outcome is this error, not a dropped record.
                        back.delivery_opaque.disarm();
                        results[i] = Err(classify(&e));
                        break;
                    }
                }
            }
        }
        // Only the records' own senders are left: the channel ends when the last report is in.
        drop(reports);
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let reported = futures_util::stream::poll_fn(|cx| reported.poll_recv(cx));
        await_confirms(&mut results, reported, left, batch.abort, batch.confirms).await;
        if producer.client().fatal_error().is_some() {
            health.fatal.store(true, Ordering::Relaxed);
        }
        if !health.is_up() {
            sink_failed(&mut results);
        }
        results
    }
}

/// The broker went away: what failed for the sink's sake (a timeout, a retryable Kafka error)
/// goes back without an attempt, and the worker stops claiming until a broker is back.
fn sink_failed(results: &mut [Outcome]) {
    for r in results.iter_mut() {
        let transient = match r {
            Err(PublishError::Timeout) => true,
            Err(PublishError::Kafka { blame, .. }) => *blame == KafkaBlame::Cluster,
            _ => false,
        };
        if transient {
            *r = Err(down());
        }
    }
}

/// A record's headers: the envelope's headers and properties first, then the bridge's own
/// (which win over an envelope's of the same name); and the envelope's Kafka key, if any.
fn headers_of<'m>(
    trigger: &str,
    m: &OutMessage<'m>,
    due: &mut itoa::Buffer,
    attempt: &mut itoa::Buffer,
) -> (OwnedHeaders, Option<&'m [u8]>) {
    let mut headers = OwnedHeaders::new_with_capacity(4);
    let mut own_key = None;
    if let Some(p) = m.properties {
        // The envelope's headers first; the bridge's own names are the bridge's.
        for (name, value) in &p.headers {
            // The bridge's own names are the bridge's, and a property the envelope
            // sets wins over a header of the same name: one header each.
            let taken = [HEADER_TRIGGER, HEADER_DUE_MS, HEADER_ATTEMPT, HEADER_ID]
                .contains(&name.as_str())
                || p.sets_header(name);
            if taken {
                continue;
            }
            headers = headers.insert(Header {
                key: name,
                value: Some(&value.to_text()),
            });
        }
        for (name, value) in p.header_properties() {
            if let Some(value) = value {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
        }
        own_key = p.kafka_key.as_deref();
    }
    let headers = headers
        .insert(Header {
            key: HEADER_TRIGGER,
            value: Some(trigger),
        })
        .insert(Header {
            key: HEADER_DUE_MS,
            value: Some(due.format(m.due_ms)),
        })
        .insert(Header {
            key: HEADER_ATTEMPT,
            value: Some(attempt.format(m.attempt)),
        })
        .insert(Header {
            key: HEADER_ID,
            value: Some(m.id),
        });
    (headers, own_key)
}

#[cfg(test)]
mod tests {
    use crate::config::KafkaSinkConfig;
    use crate::sink::kafka::client_config;

    #[test]
    fn user_properties_override_the_defaults() {
        let mut config = KafkaSinkConfig {
            brokers: "b:9092".into(),
            properties: Default::default(),
            sasl_password_file: None,
            accept_possible_loss: false,
        };
        config.properties.insert("linger.ms".into(), "50".into());
        let cc = client_config(&config).unwrap();
        assert_eq!(cc.get("linger.ms"), Some("50"));
        assert_eq!(cc.get("acks"), Some("all"));
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("bootstrap.servers"), Some("b:9092"));
    }
}
