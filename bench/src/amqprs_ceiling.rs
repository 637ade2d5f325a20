//! RabbitMQ's ceiling measured by another client than the bridge's: a raw publisher on
//! amqprs, with the bridge's messages, persistence, mandatory flag and publisher confirms.
//!
//! amqprs has no confirmation futures: the broker's acks, nacks and returns arrive through a
//! `ChannelCallback`, and the publisher tracks its delivery tags itself (one counter per
//! channel, starting at 1 after `confirm.select`). A window of unconfirmed messages shared by
//! the connection's channels keeps the broker busy without queueing without bound. The same
//! publisher also forwards what the bridge's claim script hands out (`forward_claimed`).

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use amqprs::callbacks::ChannelCallback;
use amqprs::channel::{BasicPublishArguments, Channel, ConfirmSelectArguments};
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{
    Ack, BasicProperties, Cancel, CloseChannel, FieldTable, FieldValue, LongStr, Nack, Return,
    ShortStr,
};
use anyhow::{anyhow, bail, Context};
use delay_bridge::parts::redis::store::Store;
use delay_bridge::wire::{MessageId, HEADER_ATTEMPT, HEADER_DUE_MS, HEADER_TRIGGER};
use lapin::uri::{AMQPScheme, AMQPUri};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use super::ceiling::Window;
use super::tally::payload;

/// What a channel callback answers.
type Result<T> = std::result::Result<T, amqprs::error::Error>;

/// The trigger name the messages carry, as the bridge's bench trigger's do.
const TRIGGER: &str = "bench";
/// The lease of what `forward_claimed` claims: longer than any run.
const LEASE: Duration = Duration::from_secs(600);

/// How the raw publishers keep the broker busy: `channels` confirm-mode channels on one
/// connection, at most `window` messages unconfirmed on all of them together.
#[derive(Debug, Clone, Copy)]
pub struct Unconfirmed {
    pub channels: usize,
    pub window: usize,
}

/// What the broker answered so far, shared by the channels' callbacks.
#[derive(Default)]
struct Answers {
    acked: AtomicU64,
    nacked: AtomicU64,
    returned: AtomicU64,
    /// Why the broker closed a channel, if it did.
    closed: Mutex<Option<String>>,
    /// Woken at each answer.
    changed: Notify,
}

impl Answers {
    fn settled(&self) -> u64 {
        self.acked.load(Ordering::Relaxed) + self.nacked.load(Ordering::Relaxed)
    }

    fn closed(&self) -> Option<String> {
        self.closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One channel's delivery tags not yet confirmed.
struct Tags {
    /// The last delivery tag used on the channel (0 before any publish).
    last: AtomicU64,
    unconfirmed: Mutex<BTreeSet<u64>>,
    /// Delivery tags the broker answered on the channel (each once, acked or nacked).
    answered: AtomicU64,
    window: Arc<Semaphore>,
    answers: Arc<Answers>,
}

impl Tags {
    /// Forgets `tag` (and with `multiple` every smaller one), frees their room in the
    /// window; returns how many.
    fn settle(&self, tag: u64, multiple: bool) -> u64 {
        let n = {
            let mut set = self.unconfirmed.lock().unwrap_or_else(|e| e.into_inner());
            if multiple {
                let rest = set.split_off(&(tag + 1));
                let n = set.len();
                *set = rest;
                n
            } else {
                usize::from(set.remove(&tag))
            }
        };
        self.window.add_permits(n);
        self.answered.fetch_add(n as u64, Ordering::Relaxed);
        n as u64
    }
}

/// The callback of one channel: counts the broker's answers.
struct Callback(Arc<Tags>);

#[async_trait::async_trait]
impl ChannelCallback for Callback {
    async fn close(&mut self, _: &Channel, close: CloseChannel) -> Result<()> {
        let why = format!("the broker closed a channel: {close}");
        *self
            .0
            .answers
            .closed
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(why);
        // Nothing more will be confirmed: publishers waiting for room give up.
        self.0.window.close();
        self.0.answers.changed.notify_waiters();
        Ok(())
    }

    async fn cancel(&mut self, _: &Channel, _: Cancel) -> Result<()> {
        Ok(())
    }

    async fn flow(&mut self, _: &Channel, active: bool) -> Result<bool> {
        Ok(active)
    }

    async fn publish_ack(&mut self, _: &Channel, ack: Ack) {
        let n = self.0.settle(ack.delivery_tag(), ack.mutiple());
        self.0.answers.acked.fetch_add(n, Ordering::Relaxed);
        self.0.answers.changed.notify_waiters();
    }

    async fn publish_nack(&mut self, _: &Channel, nack: Nack) {
        let n = self.0.settle(nack.delivery_tag(), nack.multiple());
        self.0.answers.nacked.fetch_add(n, Ordering::Relaxed);
        self.0.answers.changed.notify_waiters();
    }

    async fn publish_return(&mut self, _: &Channel, _: Return, _: BasicProperties, _: Vec<u8>) {
        // The ack that follows a return settles the tag; the return makes it a failure.
        self.0.answers.returned.fetch_add(1, Ordering::Relaxed);
    }
}

/// A connection with its confirm-mode channels, ready to publish.
pub struct RawPublisher {
    conn: Connection,
    channels: Vec<(Channel, Arc<Tags>)>,
    answers: Arc<Answers>,
    exchange: String,
    routing_key: String,
}

impl RawPublisher {
    /// Connects to `url` (plain `amqp://`) and opens `u.channels` confirm-mode channels that
    /// publish to `exchange` with `routing_key`.
    pub async fn connect(
        url: &str,
        exchange: &str,
        routing_key: &str,
        u: Unconfirmed,
    ) -> anyhow::Result<Self> {
        let uri = AMQPUri::from_str(url).map_err(|e| anyhow!("--amqp-url: {e}"))?;
        anyhow::ensure!(
            uri.scheme == AMQPScheme::AMQP,
            "the amqprs ceiling speaks plain amqp:// only"
        );
        let a = &uri.authority;
        let args = OpenConnectionArguments::new(
            &a.host,
            a.port,
            &a.userinfo.username,
            &a.userinfo.password,
        )
        .virtual_host(&uri.vhost)
        .connection_name("delay-bridge-bench/amqprs-ceiling")
        .finish();
        let conn = Connection::open(&args)
            .await
            .map_err(|e| anyhow!("amqprs: connecting: {e}"))?;
        let window = Arc::new(Semaphore::new(u.window.max(1)));
        let answers = Arc::new(Answers::default());
        let mut channels = Vec::new();
        for _ in 0..u.channels.max(1) {
            let ch = conn
                .open_channel(None)
                .await
                .map_err(|e| anyhow!("amqprs: opening a channel: {e}"))?;
            let tags = Arc::new(Tags {
                last: AtomicU64::new(0),
                unconfirmed: Mutex::default(),
                answered: AtomicU64::new(0),
                window: window.clone(),
                answers: answers.clone(),
            });
            ch.register_callback(Callback(tags.clone()))
                .await
                .map_err(|e| anyhow!("amqprs: {e}"))?;
            ch.confirm_select(ConfirmSelectArguments::default())
                .await
                .map_err(|e| anyhow!("amqprs: confirm.select: {e}"))?;
            channels.push((ch, tags));
        }
        Ok(Self {
            conn,
            channels,
            answers,
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
        })
    }

    /// Publishes `w.count` messages over the channels and waits until the broker confirmed
    /// every one; fails on a nack, a return or a closed channel. Returns when publishing
    /// started. Each call continues the channels' delivery tags.
    pub async fn publish(&mut self, w: &Window, timeout: Duration) -> anyhow::Result<Instant> {
        let started = Instant::now();
        let before = self.answers.settled();
        let next = Arc::new(AtomicU64::new(0));
        let mut lanes = Vec::new();
        for (ch, tags) in &self.channels {
            let (ch, tags, next, w) = (ch.clone(), tags.clone(), next.clone(), w.clone());
            let args = self.publish_args();
            lanes.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= w.count {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let body = payload(w.base + i, w.payload_bytes);
                    let props = properties(&w.key, &body, w.due_ms, 1);
                    publish_one(&ch, &tags, props, body, &args).await?;
                }
            }));
        }
        for lane in lanes {
            lane.await.context("an amqprs publisher panicked")??;
        }
        let end = Instant::now() + timeout;
        let answers = &self.answers;
        until(answers, end, || answers.settled() - before >= w.count)
            .await
            .with_context(|| {
                format!(
                    "the broker confirmed {} of {} messages within {timeout:?}",
                    answers.settled() - before,
                    w.count
                )
            })?;
        self.all_acked()?;
        Ok(started)
    }

    /// Forwards what `store`'s claim script hands out until it hands out nothing, and
    /// settles it with the settle script: per channel a loop that claims up to `batch`
    /// members, publishes them, waits until the broker answered for all of them and then
    /// acks them in Redis in the background while it claims again. The same Redis work as
    /// the bridge's (one settle call per batch, where the bridge settles as confirmations
    /// arrive), with this client's publishing. Returns the members forwarded; fails on a
    /// nack, a return or a closed channel.
    pub async fn forward_claimed(
        &self,
        store: &Store,
        key: &str,
        batch: usize,
        timeout: Duration,
    ) -> anyhow::Result<u64> {
        let end = Instant::now() + timeout;
        let mut lanes = Vec::new();
        for (ch, tags) in &self.channels {
            let (ch, tags, store, key) = (ch.clone(), tags.clone(), store.clone(), key.to_string());
            let args = self.publish_args();
            lanes.push(tokio::spawn(async move {
                let mut settles = Vec::new();
                let mut forwarded = 0u64;
                loop {
                    let b = store.claim(batch, LEASE).await?;
                    if b.items.is_empty() {
                        break;
                    }
                    for c in &b.items {
                        let body = c.payload().context("a claimed member without a body")?;
                        let props = properties(&key, body, c.due_ms, c.attempt);
                        publish_one(&ch, &tags, props, body.to_vec(), &args).await?;
                    }
                    // Every tag up to the last one answered: the whole batch.
                    let last = tags.last.load(Ordering::Relaxed);
                    until(&tags.answers, end, || {
                        tags.answered.load(Ordering::Relaxed) >= last
                    })
                    .await?;
                    forwarded += b.items.len() as u64;
                    let store = store.clone();
                    settles.push(tokio::spawn(async move {
                        delay_bridge::hooks::ack_unpublished(&store, &b, 1).await
                    }));
                }
                for s in settles {
                    s.await.context("a settle call panicked")??;
                }
                Ok::<_, anyhow::Error>(forwarded)
            }));
        }
        let mut forwarded = 0;
        for lane in lanes {
            forwarded += lane.await.context("an amqprs forwarder panicked")??;
        }
        self.all_acked()?;
        Ok(forwarded)
    }

    /// Every publish's arguments: the target, `mandatory`.
    fn publish_args(&self) -> BasicPublishArguments {
        BasicPublishArguments::new(&self.exchange, &self.routing_key)
            .mandatory(true)
            .finish()
    }

    /// Fails if the broker nacked or returned a message since the last call.
    fn all_acked(&self) -> anyhow::Result<()> {
        let nacked = self.answers.nacked.swap(0, Ordering::Relaxed);
        let returned = self.answers.returned.swap(0, Ordering::Relaxed);
        if nacked + returned > 0 {
            bail!("the broker nacked {nacked} and returned {returned} messages");
        }
        Ok(())
    }

    /// Closes the channels and the connection.
    pub async fn close(self) {
        for (ch, _) in self.channels {
            let _ = ch.close().await;
        }
        let _ = self.conn.close().await;
    }
}

/// Publishes one message on `ch` once the window has room, its delivery tag noted as
/// unconfirmed. Only one task publishes on a channel: tags follow its publishes.
async fn publish_one(
    ch: &Channel,
    tags: &Tags,
    props: BasicProperties,
    body: Vec<u8>,
    args: &BasicPublishArguments,
) -> anyhow::Result<()> {
    let Ok(room) = tags.window.acquire().await else {
        bail!("a channel closed while publishing");
    };
    room.forget();
    let tag = tags.last.fetch_add(1, Ordering::Relaxed) + 1;
    tags.unconfirmed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(tag);
    ch.basic_publish(props, body, args.clone())
        .await
        .map_err(|e| anyhow!("amqprs: publishing: {e}"))
}

/// Waits until `done()` holds, looking again at each answer of the broker; fails when a
/// channel closes or at `end`.
async fn until(answers: &Answers, end: Instant, done: impl Fn() -> bool) -> anyhow::Result<()> {
    loop {
        // Created before looking: an answer arriving in between still wakes it.
        let changed = answers.changed.notified();
        if let Some(why) = answers.closed() {
            bail!("{why}");
        }
        if done() {
            return Ok(());
        }
        if tokio::time::timeout_at(end, changed).await.is_err() {
            bail!("the broker did not answer in time");
        }
    }
}

/// The bridge's properties for a message of queue `key`: persistent, its id, the trigger,
/// due time and attempt headers.
fn properties(key: &str, body: &[u8], due_ms: i64, attempt: u32) -> BasicProperties {
    let mut headers = FieldTable::new();
    let name = |s: &str| ShortStr::try_from(s).expect("a short header name");
    let trigger = LongStr::try_from(TRIGGER).expect("a short trigger name");
    headers.insert(name(HEADER_TRIGGER), FieldValue::S(trigger));
    headers.insert(name(HEADER_DUE_MS), FieldValue::l(due_ms));
    headers.insert(name(HEADER_ATTEMPT), FieldValue::l(attempt.into()));
    BasicProperties::default()
        .with_delivery_mode(amqprs::DELIVERY_MODE_PERSISTENT)
        .with_message_id(MessageId::new(key, body).as_str())
        .with_headers(headers)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::{FormatArg, PayloadArg, Shape};
    use delay_bridge::keys::QueueKeys;
    use delay_bridge::parts::redis::conn::Conn;
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::FieldTable as LapinTable;

    const REDIS: &str = "redis://127.0.0.1:6379";
    const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

    /// The ceiling with the scripts forwards every claimed member once to the broker, with the
    /// bridge's headers, and leaves nothing scheduled or in flight in Redis.
    #[tokio::test]
    async fn forwarding_claimed_members_publishes_each_once_and_settles_them() {
        let run = std::process::id();
        let (key, queue) = (
            format!("delay-bridge-bench-test:{{scripts-{run}}}"),
            format!("delay-bridge-bench-test-scripts-{run}"),
        );
        let lapin = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
            .await
            .expect("RabbitMQ on 127.0.0.1:5672");
        let ch = lapin.create_channel().await.unwrap();
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare(&queue, durable, LapinTable::default())
            .await
            .unwrap();

        let shape = Shape {
            payload: PayloadArg::Inline,
            format: FormatArg::Raw,
            payload_bytes: 100,
        };
        let n = 1_000;
        let mut redis = redis::Client::open(REDIS)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("Redis on 127.0.0.1:6379");
        crate::redis_ops::load(&mut redis, &shape, &key, &key, 7_000, n, |_| 1)
            .await
            .unwrap();
        let store = Store::new(
            Conn::open(REDIS).await.unwrap(),
            QueueKeys::derive(&key).unwrap(),
        );
        let u = Unconfirmed {
            channels: 2,
            window: 100,
        };
        // The default exchange routes by queue name.
        let publisher = RawPublisher::connect(AMQP, "", &queue, u).await.unwrap();
        let forwarded = publisher
            .forward_claimed(&store, &key, 64, Duration::from_secs(60))
            .await
            .unwrap();
        publisher.close().await;

        let left = crate::redis_ops::queue_len(&mut redis, &key).await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let held = ch
            .queue_declare(&queue, passive, LapinTable::default())
            .await
            .unwrap()
            .message_count();
        let first = ch
            .basic_get(&queue, lapin::options::BasicGetOptions::default())
            .await
            .unwrap()
            .expect("a message");
        ch.queue_delete(&queue, QueueDeleteOptions::default())
            .await
            .unwrap();
        crate::redis_ops::unlink_queue(&mut redis, &key)
            .await
            .unwrap();

        assert_eq!((forwarded, left, held), (n, 0, n as u32));
        let headers = first.properties.headers().clone().unwrap_or_default();
        assert!(headers.inner().contains_key(HEADER_DUE_MS));
        assert_eq!(
            first
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_owned()),
            Some(MessageId::new(&key, &first.data).as_str().to_owned())
        );
    }
}
