//! Kafka helpers: topics made and deleted with the Admin API, and a capturing consumer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use super::{kafka_brokers, unique, Bridge};

/// Header marking the test's own fence records.
const FENCE_HEADER: &str = "x-test-fence";

/// A fresh topic `PREFIX-N` of `partitions` on the test broker, and a consumer reading all of
/// it from the beginning.
pub async fn new_topic(prefix: &str, partitions: i32) -> (String, KafkaCapture) {
    let topic = unique(prefix);
    create_topic(&kafka_brokers(), &topic, partitions).await;
    let capture = KafkaCapture::start(&kafka_brokers(), &topic, partitions);
    (topic, capture)
}

/// Creates `topic` with the Admin API (the test brokers do not auto-create topics) and waits
/// until its metadata lists every partition.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("a Kafka-protocol broker must run on loopback (see README)");
    for r in created {
        r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e:?}"));
    }
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer = consumer(&brokers);
        for _ in 0..100 {
            if let Ok(md) = consumer.fetch_metadata(Some(&topic), Duration::from_secs(2)) {
                if md
                    .topics()
                    .iter()
                    .any(|t| t.name() == topic && t.partitions().len() == partitions as usize)
                {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("topic {topic} never showed {partitions} partitions");
    })
    .await
    .unwrap();
}

/// Record headers from `(name, value)` pairs, in order.
pub fn owned_headers<V: AsRef<[u8]>>(headers: &[(&str, V)]) -> OwnedHeaders {
    headers
        .iter()
        .fold(OwnedHeaders::new(), |h, (name, value)| {
            h.insert(Header {
                key: name,
                value: Some(value.as_ref()),
            })
        })
}

/// Deletes `topic`, ignoring errors (cleanup).
/// Deletes `topic`. Stop every consumer of it first (the bridge too): see
/// [`KafkaCapture::delete`].
pub async fn delete_topic(brokers: &str, topic: &str) {
    let admin: Result<AdminClient<DefaultClientContext>, _> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create();
    if let Ok(admin) = admin {
        let _ = admin
            .delete_topics(
                &[topic],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(5))),
            )
            .await;
    }
}

fn consumer(brokers: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", super::unique("test"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("reconnect.backoff.max.ms", "200")
        // Its connection errors during the outage tests are expected: keep them out of the logs.
        .set_log_level(RDKafkaLogLevel::Emerg)
        .create()
        .unwrap()
}

/// One record read back from the topic.
#[derive(Debug, Clone)]
pub struct Record {
    /// Payload bytes.
    pub body: Vec<u8>,
    /// Record key.
    pub key: Option<Vec<u8>>,
    /// Partition it landed on.
    pub partition: i32,
    /// Offset in that partition.
    pub offset: i64,
    /// Headers in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Local receive time, epoch ms.
    pub at_ms: i64,
}

impl Record {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// `x-delay-attempt` as a number.
    pub fn attempt(&self) -> Option<u32> {
        self.header("x-delay-attempt")?.parse().ok()
    }
}

/// A fence record seen: its partition and token.
type Fence = (i32, Vec<u8>);

/// Reads every partition of a topic from the beginning (no consumer group) in a thread.
pub struct KafkaCapture {
    pub topic: String,
    pub received: Arc<Mutex<Vec<Record>>>,
    brokers: String,
    partitions: i32,
    /// Fence records seen, by partition (kept out of `received`).
    fences: Arc<Mutex<Vec<Fence>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KafkaCapture {
    /// Starts reading partitions `0..partitions` of `topic`.
    pub fn start(brokers: &str, topic: &str, partitions: i32) -> Self {
        let consumer = consumer(brokers);
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&tpl).unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let fences = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, fenced, halt) = (received.clone(), fences.clone(), stop.clone());
        // Bounded by the capture's lifetime: Drop sets `stop` and joins.
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    let headers: Vec<(String, Option<Vec<u8>>)> = m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                                .collect()
                        })
                        .unwrap_or_default();
                    if headers.iter().any(|(k, _)| k == FENCE_HEADER) {
                        let body = m.payload().unwrap_or_default().to_vec();
                        fenced.lock().unwrap().push((m.partition(), body));
                        continue;
                    }
                    let r = Record {
                        body: m.payload().unwrap_or_default().to_vec(),
                        key: m.key().map(<[u8]>::to_vec),
                        partition: m.partition(),
                        offset: m.offset(),
                        headers,
                        at_ms: super::now_ms(),
                    };
                    sink.lock().unwrap().push(r);
                }
            }
        });
        Self {
            topic: topic.to_string(),
            received,
            brokers: brokers.to_string(),
            partitions,
            fences,
            stop,
            thread: Some(thread),
        }
    }

    /// Records read so far.
    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// Asserts that `n` records arrive from `bridge` within `timeout`.
    pub async fn expect_arrivals(&self, n: usize, timeout: Duration, bridge: &Bridge) {
        bridge.expect_arrivals(n, timeout, || self.count()).await;
    }

    /// A copy of everything read so far.
    pub fn snapshot(&self) -> Vec<Record> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until everything written to the topic so far has been read: writes a fence record
    /// to every partition and waits for all of them (a partition is read in order). Counting
    /// after this is exact, so duplicates cannot hide in consumer lag. (The test broker's
    /// watermarks are not reliable enough to count with.)
    pub async fn fence(&self) {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("message.timeout.ms", "10000")
            .create()
            .unwrap();
        let token = super::unique("fence").into_bytes();
        for p in 0..self.partitions {
            producer
                .send(
                    FutureRecord::<[u8], [u8]>::to(&self.topic)
                        .partition(p)
                        .payload(&token)
                        .headers(OwnedHeaders::new().insert(Header {
                            key: FENCE_HEADER,
                            value: Some("1"),
                        })),
                    Duration::from_secs(10),
                )
                .await
                .expect("fence record delivered");
        }
        let seen = |f: &Mutex<Vec<Fence>>| {
            f.lock()
                .unwrap()
                .iter()
                .filter(|(_, b)| *b == token)
                .count() as i32
        };
        assert!(
            super::wait_until(Duration::from_secs(15), || seen(&self.fences)
                >= self.partitions)
            .await,
            "the consumer did not catch up with the fence records"
        );
    }

    /// How many times each body was read.
    pub fn tally(&self) -> HashMap<Vec<u8>, usize> {
        let mut seen = HashMap::new();
        for r in self.received.lock().unwrap().iter() {
            *seen.entry(r.body.clone()).or_default() += 1;
        }
        seen
    }
}

impl KafkaCapture {
    /// Stops reading, then deletes the topic. A consumer still fetching a topic that was
    /// deleted has crashed librdkafka in the test process (the test broker answers with a
    /// leader change naming the topic by a zero id, which librdkafka looks up by a null name).
    pub async fn delete(mut self) {
        self.halt();
        delete_topic(&self.brokers, &self.topic).await;
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for KafkaCapture {
    fn drop(&mut self) {
        self.halt();
    }
}
