//! A validated trigger: what the bridge runs for one `[[triggers]]` entry, every value checked,
//! its routes resolved against its sink and its rate read, made only by loading.

use std::time::Duration;

use super::ingress::IngressConfig;
use super::message::{MessageFormat, OnExpired, PayloadMode};
use super::rate::Rate;
use super::route::Destination;
use super::schedule::ScheduleConfig;
use super::trigger_config::TriggerConfig;

/// A trigger whose settings passed validation. Only loading makes one, so every trigger the
/// bridge runs has a destination of its sink's kind (and a dead-letter destination of the same
/// kind, if any), and a rate limit that was read without error.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    name: String,
    key: String,
    sink: String,
    destination: Destination,
    dead_letter: Option<Destination>,
    payload: PayloadMode,
    max_claim_bytes: usize,
    format: MessageFormat,
    expire_after: Option<Duration>,
    on_expired: OnExpired,
    rate: Option<Rate>,
    shards: u32,
    drain_shards: Option<u32>,
    shard_keys: Vec<String>,
    workers: usize,
    batch: usize,
    lease: Duration,
    guard_interval: Duration,
    notified_guard: Duration,
    publish_timeout: Duration,
    max_attempts: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    max_message_bytes: usize,
    ingress: Option<Box<IngressConfig>>,
    schedules: Vec<ScheduleConfig>,
}

/// What validation resolved of one trigger, beyond the values it only checked.
pub(super) struct Resolved {
    /// Where the messages go, on the trigger's sink.
    pub destination: Destination,
    /// Where dead letters go, on the same sink (`None`: they stay in Redis).
    pub dead_letter: Option<Destination>,
    /// The rate limit, read.
    pub rate: Option<Rate>,
}

impl Trigger {
    /// The trigger `settings` describe, once validation found nothing wrong with them and
    /// resolved what they name.
    pub(super) fn new(settings: TriggerConfig, resolved: Resolved) -> Self {
        let shard_keys = settings.shard_keys();
        let t = settings;
        Self {
            name: t.name,
            key: t.key,
            sink: t.sink,
            destination: resolved.destination,
            dead_letter: resolved.dead_letter,
            payload: t.payload,
            max_claim_bytes: t.max_claim_bytes,
            format: t.format,
            expire_after: t.expire_after,
            on_expired: t.on_expired,
            rate: resolved.rate,
            shards: t.shards,
            drain_shards: t.drain_shards,
            shard_keys,
            workers: t.workers,
            batch: t.batch,
            lease: t.lease,
            guard_interval: t.guard_interval,
            notified_guard: t.notified_guard_interval.max(t.guard_interval),
            publish_timeout: t.publish_timeout,
            max_attempts: t.max_attempts,
            backoff_initial: t.backoff_initial,
            backoff_max: t.backoff_max,
            max_message_bytes: t.max_message_bytes,
            ingress: t.ingress,
            schedules: t.schedules,
        }
    }

    /// Unique name, used in logs, metrics and headers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sorted set producers `ZADD` to (with `shards`, the pattern of the shard keys).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The name of the trigger's `[sinks.NAME]`.
    pub fn sink(&self) -> &str {
        &self.sink
    }

    /// Where the messages go, of the sink's kind.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    /// Where dead letters are forwarded, of the sink's kind (`None`: they stay in Redis).
    pub fn dead_letter(&self) -> Option<&Destination> {
        self.dead_letter.as_ref()
    }

    /// Whether the member is the body or an id of a body in the bodies hash.
    pub fn payload(&self) -> PayloadMode {
        self.payload
    }

    /// Hash payload mode: the most body bytes one claim returns.
    pub fn max_claim_bytes(&self) -> usize {
        self.max_claim_bytes
    }

    /// Whether the payload is the body or an envelope around it.
    pub fn format(&self) -> MessageFormat {
        self.format
    }

    /// How late a message may still be delivered (`None`: never too late).
    pub fn expire_after(&self) -> Option<Duration> {
        self.expire_after
    }

    /// What an expired message becomes.
    pub fn on_expired(&self) -> OnExpired {
        self.on_expired
    }

    /// The rate limit shared by every bridge on this trigger (`None`: no limit).
    pub fn rate(&self) -> Option<Rate> {
        self.rate
    }

    /// How many shard keys producers write to now.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// While the shard count changes: the count producers used before.
    pub fn drain_shards(&self) -> Option<u32> {
        self.drain_shards
    }

    /// Every key the bridge serves for this trigger: the shard keys of `shards`, then those of
    /// `drain_shards` not among them (the key itself when unsharded).
    pub fn shard_keys(&self) -> &[String] {
        &self.shard_keys
    }

    /// Worker tasks claiming and publishing for this trigger.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Most members one claim takes.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// How long a claimed member stays leased.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Longest sleep of an idle worker without keyspace notifications.
    pub fn guard_interval(&self) -> Duration {
        self.guard_interval
    }

    /// Longest sleep of an idle worker while keyspace notifications are subscribed: never
    /// below [`Self::guard_interval`].
    pub fn notified_guard(&self) -> Duration {
        self.notified_guard
    }

    /// How long the broker has to confirm a batch.
    pub fn publish_timeout(&self) -> Duration {
        self.publish_timeout
    }

    /// Attempts before a failing member is dead-lettered.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Backoff after the first failure.
    pub fn backoff_initial(&self) -> Duration {
        self.backoff_initial
    }

    /// Cap of the backoff.
    pub fn backoff_max(&self) -> Duration {
        self.backoff_max
    }

    /// Larger members are dead-lettered as `too_large`.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// The ingress producers publish delayed messages through, if any.
    pub fn ingress(&self) -> Option<&IngressConfig> {
        self.ingress.as_deref()
    }

    /// The recurring schedules of the configuration file.
    pub fn schedules(&self) -> &[ScheduleConfig] {
        &self.schedules
    }
}
