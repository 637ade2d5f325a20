//! The producer and the thread of its own that serves its events: delivery reports,
//! statistics, errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::BaseProducer;

use super::health::HealthContext;

/// How long one poll of the event queue waits. librdkafka wakes the poll as soon as an event
/// comes, so this only bounds how long the thread takes to notice it should stop; rdkafka's
/// poll loop spins through the last millisecond of each wait, so a short one costs CPU when
/// the producer idles (about 0.5% of a core at 100 ms).
const POLL_WAIT: Duration = Duration::from_secs(1);

/// A producer shared by clones; its events are served by a thread that ends (destroying the
/// producer, off the async runtime) within [`POLL_WAIT`] of the last clone's drop.
#[derive(Clone)]
pub(super) struct Polled {
    producer: Arc<BaseProducer<HealthContext>>,
    _stop: Arc<StopOnDrop>,
}

struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Polled {
    pub(super) fn create(config: &ClientConfig, context: HealthContext) -> KafkaResult<Self> {
        let producer: Arc<BaseProducer<HealthContext>> =
            Arc::new(config.create_with_context(context)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (served, stopped) = (producer.clone(), stop.clone());
        std::thread::Builder::new()
            .name("kafka-events".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    served.poll(POLL_WAIT);
                }
            })
            .map_err(|e| {
                rdkafka::error::KafkaError::ClientCreation(format!(
                    "could not start the producer's event thread: {e}"
                ))
            })?;
        Ok(Self {
            producer,
            _stop: Arc::new(StopOnDrop(stop)),
        })
    }
}

impl std::ops::Deref for Polled {
    type Target = BaseProducer<HealthContext>;

    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}
