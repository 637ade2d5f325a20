//! `[[triggers]]`: the schema of one trigger as written ([`TriggerConfig`]); the validated
//! [`Trigger`] the bridge runs is made from it in `trigger.rs`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ingress::IngressConfig;
use super::message::{KafkaKey, MessageFormat, OnExpired, PayloadMode};
use super::schedule::ScheduleConfig;

/// `[[triggers]]`: one watched sorted set and its destination.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TriggerConfig {
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
impl TriggerConfig {
    /// Every key the bridge serves for this trigger (see [`Trigger::shard_keys`]).
    pub(super) fn shard_keys(&self) -> Vec<String> {
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
