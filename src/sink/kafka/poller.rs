//! The producer and the thread of its own that serves its events: delivery reports,
//! statistics, errors.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::BaseProducer;

use super::context::HealthContext;

/// How long one poll of the event queue waits. librdkafka wakes the poll as soon as an event
/// comes, so this only bounds how long the thread takes to notice the producer was dropped;
/// rdkafka's poll loop spins through the last millisecond of each wait, so a short one costs
/// CPU while the producer idles (100 ms waits: 0.9% of a core, measured with 10,000 idle
/// triggers).
const POLL_WAIT: Duration = Duration::from_secs(1);

/// A producer shared by clones; its events are served by a thread that ends (destroying the
/// producer, off the async runtime) within [`POLL_WAIT`] of the last clone's drop.
#[derive(Clone)]
pub(super) struct Polled {
    producer: Arc<BaseProducer<HealthContext>>,
    /// The thread serves events while a clone holds this.
    _alive: Arc<()>,
}

impl Polled {
    pub(super) fn create(config: &ClientConfig, context: HealthContext) -> KafkaResult<Self> {
        let producer: Arc<BaseProducer<HealthContext>> =
            Arc::new(config.create_with_context(context)?);
        let alive = Arc::new(());
        let (served, watched) = (producer.clone(), Arc::downgrade(&alive));
        std::thread::Builder::new()
            .name("kafka-events".into())
            .spawn(move || {
                while watched.strong_count() > 0 {
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
            _alive: alive,
        })
    }
}

impl std::ops::Deref for Polled {
    type Target = BaseProducer<HealthContext>;

    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}
