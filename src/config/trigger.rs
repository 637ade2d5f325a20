//! `[[triggers]]`: the schema of one trigger as written, and the validated [`Trigger`] whose
//! routes are resolved.

use std::ops::Deref;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ingress::IngressConfig;
use super::route::Destination;
use super::schedule::ScheduleConfig;

/// How a trigger finds the message body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// The member is the payload.
    #[default]
    Inline,
    /// The member is an id; the body is the id's field in the hash `KEY:bodies` (`{KEY}:bodies`
    /// for a key without a hash tag). Producers cancel and reschedule by id.
    Hash,
}

/// How the payload (member or body) is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageFormat {
    /// The payload is the body, published byte for byte.
    #[default]
    Raw,
    /// The payload is a JSON envelope (`schema/envelope.schema.json`): the body plus the
    /// message's own headers, properties, routing key, Kafka key, id and expiry.
    Envelope,
}

/// What happens to a message that is claimed after it expired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpired {
    /// Dead-lettered with reason `expired` (visible, requeueable).
    #[default]
    DeadLetter,
    /// Removed without a trace but the `delay_bridge_messages_expired_total` counter.
    Drop,
}

/// What a Kafka record's key is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KafkaKey {
    /// No key: records spread over partitions.
    #[default]
    None,
    /// The member bytes: every copy of one member lands on the same partition.
    Member,
}

/// `[[triggers]]`: one watched sorted set and its destination.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerConfig {
    /// Unique name, used in logs, metrics and headers (`[A-Za-z0-9_.-]`).
    pub name: String,
    /// The sorted set producers `ZADD` to (score = due time in epoch milliseconds).
    pub key: String,
    /// Name of a `[sinks.NAME]` entry.
    pub sink: String,
    /// AMQP: exchange to publish to (`""` is the default exchange).
    pub exchange: Option<String>,
    /// AMQP: routing key (default `""`).
    pub routing_key: Option<String>,
    /// AMQP: take each message's routing key from this JSON Pointer (RFC 6901, e.g. `/type`)
    /// into the payload instead; payloads that are not JSON or lack a string there are
    /// dead-lettered with reason `bad_payload`.
    pub routing_key_pointer: Option<String>,
    /// Kafka: topic to produce to.
    pub topic: Option<String>,
    /// HTTP: the URL called for every message (`http://` or `https://`).
    pub url: Option<String>,
    /// HTTP: take each message's URL from this JSON Pointer into the payload instead (needs
    /// `allowed_urls`); payloads that are not JSON or lack a string there are dead-lettered
    /// with reason `bad_payload`.
    pub url_pointer: Option<String>,
    /// HTTP: the request method, `POST` (default), `PUT`, `PATCH` or `DELETE`.
    pub method: Option<String>,
    /// HTTP: URL patterns a message's own URL (from `url_pointer` or an envelope's `url`)
    /// must match: scheme, host (`*.` for any subdomain) and port equal, the path under the
    /// pattern's path. Others are dead-lettered as `url_not_allowed`. Unset: messages cannot
    /// choose their URL.
    pub allowed_urls: Option<Vec<String>>,
    /// Kafka: record key, `none` or `member`.
    pub kafka_key: Option<KafkaKey>,
    /// How the member maps to the message body: `inline` (the member is the body) or `hash`
    /// (the member is an id, the body is in the bodies hash).
    #[serde(default)]
    pub payload: PayloadMode,
    /// Hash payload mode: the most body bytes one claim returns (it always takes at least
    /// one member), so that one script call never returns hundreds of MiB.
    #[serde(default = "default_max_claim_bytes")]
    pub max_claim_bytes: usize,
    /// `raw` (the payload is the body) or `envelope` (the payload is a JSON envelope with
    /// the body and the message's own properties).
    #[serde(default)]
    pub format: MessageFormat,
    /// How late a message may still be delivered (after its due time); later ones expire
    /// instead of being published. Unset: never (an envelope's `expires_at_ms` still applies).
    #[serde(default, with = "humantime_serde")]
    pub expire_after: Option<Duration>,
    /// What an expired message becomes: `dead_letter` (reason `expired`) or `drop`.
    #[serde(default)]
    pub on_expired: OnExpired,
    /// AMQP topic patterns (`*` one word, `#` any number) a message's own routing key (from
    /// an envelope or `routing_key_pointer`) must match; others are dead-lettered as
    /// `route_not_allowed`. Unset: any routing key on the trigger's exchange.
    pub allowed_routing_keys: Option<Vec<String>>,
    /// Kafka: regular expressions, each matched against the whole name, of the topics a
    /// record may choose for itself (an ingress record's `x-delay-topic` header, an
    /// envelope's `topic`); a record choosing another is dead-lettered as
    /// `topic_not_allowed`. Unset: records cannot choose their topic.
    pub allowed_topics: Option<Vec<String>>,
    /// Most messages forwarded per second, minute or hour (`"500/s"`, `"30/m"`, `"100/h"`),
    /// by every bridge on this trigger together (a token bucket in Redis). Unset: no limit.
    pub rate_limit: Option<String>,
    /// With `rate_limit`: the most messages sent at once after a quiet spell (the bucket's
    /// size). Default: one second's worth, at least 1.
    pub rate_burst: Option<u32>,
    /// Shards of this trigger's queue: with more than 1, `key` (which needs a hash tag, e.g.
    /// `delay:{orders}`) stands for the keys `delay:{orders:0}` .. `delay:{orders:N-1}`, each in
    /// its own cluster slot; producers pick one by CRC32 of the member mod N.
    #[serde(default = "default_shards")]
    pub shards: u32,
    /// While changing `shards`: the shard count producers used before. The bridge serves the
    /// keys of both counts until this is removed (README, "Changing the number of shards").
    pub drain_shards: Option<u32>,
    /// Worker tasks claiming and publishing for this trigger (spread over its shards).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Most members one claim takes.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// How long a claimed member stays leased before another worker may recover it.
    #[serde(default = "default_lease", with = "humantime_serde")]
    pub lease: Duration,
    /// Longest sleep of an idle worker: the bridge looks at the queue at least this often
    /// while keyspace notifications are off or their subscription is down.
    #[serde(default = "default_guard_interval", with = "humantime_serde")]
    pub guard_interval: Duration,
    /// Longest sleep of an idle worker while keyspace notifications are subscribed to: they
    /// wake it, and this is only the safety net (at least `guard_interval`).
    #[serde(default = "default_notified_guard_interval", with = "humantime_serde")]
    pub notified_guard_interval: Duration,
    /// How long to wait for the broker to confirm a batch before counting the rest as failed.
    #[serde(default = "default_publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Attempts before a failing member moves to the dead-letter set.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Backoff after the first failure; doubles with each attempt.
    #[serde(default = "default_backoff_initial", with = "humantime_serde")]
    pub backoff_initial: Duration,
    /// Cap of the backoff.
    #[serde(default = "default_backoff_max", with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Larger members are dead-lettered with reason `too_large` instead of published
    /// (at most 128 MiB).
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// AMQP: forward dead letters to this exchange, with the reason in headers; each leaves
    /// Redis only once the broker confirmed it. Unset: dead letters stay in Redis.
    pub dead_letter_exchange: Option<String>,
    /// AMQP: the routing key of forwarded dead letters (default `""`).
    pub dead_letter_routing_key: Option<String>,
    /// Kafka: forward dead letters to this topic, with the reason in headers; each leaves
    /// Redis only once the broker confirmed it. Unset: dead letters stay in Redis.
    pub dead_letter_topic: Option<String>,
    /// `[triggers.ingress]`: producers publish delayed messages to the broker (an `x-delay`
    /// header) and the bridge stores them in this trigger's queue. Implies `payload = "hash"`
    /// and `format = "envelope"`. (Boxed: most triggers have none, and every trigger's
    /// settings are held for as long as it runs.)
    pub ingress: Option<Box<IngressConfig>>,
    /// `[[triggers.schedules]]`: recurring schedules whose every tick is a message of this
    /// trigger, due at the tick (see "Recurring schedules").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<ScheduleConfig>,
}

fn default_shards() -> u32 {
    1
}
fn default_workers() -> usize {
    4
}
/// Largest `rate_limit`, per second.
pub const MAX_RATE: f64 = 1_000_000.0;

/// `"500/s"`, `"30/m"` (or `/min`), `"100/h"`: messages per second.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let bad = || format!("`{text}` is not a rate like \"500/s\", \"30/m\" or \"100/h\"");
    let (count, unit) = text.split_once('/').ok_or_else(bad)?;
    let count: f64 = count.trim().parse().map_err(|_| bad())?;
    let seconds = match unit.trim() {
        "s" | "sec" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let per_second = count / seconds;
    if !(per_second.is_finite() && per_second > 0.0 && per_second <= MAX_RATE) {
        return Err(format!(
            "`{text}` must be more than 0 and at most {MAX_RATE} per second"
        ));
    }
    Ok(per_second)
}

impl TriggerConfig {
    /// Every key the bridge serves for this trigger: the shard keys of `shards`, then those of
    /// `drain_shards` not among them. Empty when the key cannot be sharded (validation says why).
    pub fn shard_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = (0..self.shards)
            .filter_map(|i| crate::keys::shard_key(&self.key, i, self.shards))
            .collect();
        if let Some(old) = self.drain_shards {
            for i in 0..old {
                if let Some(k) = crate::keys::shard_key(&self.key, i, old) {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
        }
        keys
    }

    /// The idle sleep while keyspace notifications are subscribed: never below
    /// `guard_interval`.
    pub fn notified_guard(&self) -> Duration {
        self.notified_guard_interval.max(self.guard_interval)
    }

    /// The rate limit as (messages per second, burst), once validated.
    pub fn rate(&self) -> Option<(f64, u32)> {
        let per_second = parse_rate(self.rate_limit.as_deref()?).ok()?;
        let burst = self
            .rate_burst
            .unwrap_or_else(|| per_second.ceil().min(u32::MAX as f64) as u32)
            .max(1);
        Some((per_second, burst))
    }
}

fn default_batch() -> usize {
    256
}
fn default_lease() -> Duration {
    Duration::from_secs(30)
}
fn default_guard_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_notified_guard_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_publish_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_attempts() -> u32 {
    10
}
fn default_backoff_initial() -> Duration {
    Duration::from_secs(1)
}
fn default_backoff_max() -> Duration {
    Duration::from_secs(300)
}
fn default_max_message_bytes() -> usize {
    1024 * 1024
}
fn default_max_claim_bytes() -> usize {
    16 * 1024 * 1024
}

/// A validated trigger: its settings as written and the routes resolved from them and its
/// sink's type. Only loading makes one, so every trigger the bridge runs has a destination.
#[derive(Debug, Clone)]
pub struct Trigger {
    settings: TriggerConfig,
    /// Where the messages go.
    pub destination: Destination,
    /// Where dead letters are forwarded (`None`: they stay in Redis).
    pub dead_letter: Option<Destination>,
}

impl Trigger {
    /// A trigger whose settings passed validation, with the routes validation resolved.
    pub(super) fn new(
        settings: TriggerConfig,
        destination: Destination,
        dead_letter: Option<Destination>,
    ) -> Self {
        Self {
            settings,
            destination,
            dead_letter,
        }
    }

    /// The settings as written in the file (a reload compares these).
    pub fn settings(&self) -> &TriggerConfig {
        &self.settings
    }
}

impl Deref for Trigger {
    type Target = TriggerConfig;

    fn deref(&self) -> &TriggerConfig {
        &self.settings
    }
}
