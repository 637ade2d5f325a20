//! Configuration: the TOML schema, its defaults, and loading through figment.

mod load;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use load::{load, ConfigError, Problem};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the sorted sets live.
    #[serde(default)]
    pub redis: RedisConfig,
    /// The HTTP endpoint for `/metrics`, `/healthz` and `/readyz`.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Log format and level.
    #[serde(default)]
    pub log: LogConfig,
    /// How the daemon stops.
    #[serde(default)]
    pub shutdown: ShutdownConfig,
    /// Brokers that triggers publish to, by name.
    #[serde(default)]
    pub sinks: BTreeMap<String, SinkConfig>,
    /// The sorted sets to watch and where their due members go.
    #[serde(default)]
    pub triggers: Vec<TriggerConfig>,
}

/// `[redis]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port/db` or `rediss://` for TLS.
    #[serde(default = "default_redis_url")]
    pub url: String,
    /// Read the password from this file instead of the URL (overrides the URL's password).
    #[serde(default)]
    pub password_file: Option<String>,
    /// How long to wait for a connection to be established.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long to wait for a reply to one command or script.
    #[serde(default = "default_response_timeout", with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Let the bridge add the flags it needs (`Kz`) to `notify-keyspace-events`
    /// with `CONFIG SET`, keeping the flags already set.
    #[serde(default)]
    pub enable_keyspace_events: bool,
    /// Refuse to start when Redis may evict keys (`maxmemory-policy` other than `noeviction`).
    #[serde(default)]
    pub require_noeviction: bool,
}

fn default_redis_url() -> String {
    "redis://127.0.0.1:6379/0".into()
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_response_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: default_redis_url(),
            password_file: None,
            connect_timeout: default_connect_timeout(),
            response_timeout: default_response_timeout(),
            enable_keyspace_events: false,
            require_noeviction: false,
        }
    }
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the HTTP listener; loopback by default. Use `0.0.0.0:9464` to expose it.
    #[serde(default = "default_metrics_listen")]
    pub listen: SocketAddr,
    /// How often the backlog gauges are refreshed from Redis.
    #[serde(default = "default_backlog_interval", with = "humantime_serde")]
    pub backlog_interval: Duration,
}

fn default_metrics_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}
fn default_backlog_interval() -> Duration {
    Duration::from_secs(5)
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: default_metrics_listen(),
            backlog_interval: default_backlog_interval(),
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
    /// A tracing filter such as `info` or `delay_bridge=debug`; `RUST_LOG` wins when set.
    #[serde(default = "default_log_level")]
    pub level: String,
}

fn default_log_level() -> String {
    "info".into()
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            level: default_log_level(),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[shutdown]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long to wait for outstanding broker confirmations after SIGTERM
    /// before putting the unconfirmed messages back.
    #[serde(default = "default_shutdown_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_shutdown_timeout() -> Duration {
    Duration::from_secs(30)
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            timeout: default_shutdown_timeout(),
        }
    }
}

/// `[sinks.NAME]`: a broker, chosen by `type`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SinkConfig {
    /// RabbitMQ (AMQP 0-9-1) with publisher confirms.
    Amqp(AmqpSinkConfig),
    /// Kafka with an idempotent producer.
    Kafka(KafkaSinkConfig),
}

impl SinkConfig {
    /// `amqp` or `kafka`, for labels and messages.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Amqp(_) => "amqp",
            SinkConfig::Kafka(_) => "kafka",
        }
    }
}

/// `[sinks.NAME] type = "amqp"`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSinkConfig {
    /// `amqp://user:password@host:port/vhost` or `amqps://` for TLS.
    pub url: String,
    /// Read the password from this file instead of the URL (overrides the URL's password).
    #[serde(default)]
    pub password_file: Option<String>,
    /// Exchanges and queues to declare (idempotently) on every connect.
    #[serde(default)]
    pub declare: Vec<AmqpDeclare>,
    /// Longest wait between reconnection attempts.
    #[serde(default = "default_reconnect_max", with = "humantime_serde")]
    pub reconnect_max: Duration,
}

fn default_reconnect_max() -> Duration {
    Duration::from_secs(10)
}

/// `[[sinks.NAME.declare]]`: an exchange, optionally with a queue bound to it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpDeclare {
    /// Exchange name (durable).
    pub exchange: String,
    /// Exchange type: `direct`, `topic`, `fanout` or `headers`.
    #[serde(default = "default_exchange_kind")]
    pub kind: String,
    /// A durable queue to declare and bind to the exchange.
    #[serde(default)]
    pub queue: Option<String>,
    /// Binding key of the queue (defaults to the queue name).
    #[serde(default)]
    pub binding_key: Option<String>,
}

fn default_exchange_kind() -> String {
    "direct".into()
}

/// `[sinks.NAME] type = "kafka"`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Bootstrap servers, comma separated (`bootstrap.servers`).
    pub brokers: String,
    /// librdkafka properties passed through verbatim; they override the bridge's defaults.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Read `sasl.password` from this file.
    #[serde(default)]
    pub sasl_password_file: Option<String>,
}

/// How a trigger finds the message body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// The member is the payload.
    #[default]
    Inline,
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
    #[serde(default)]
    pub exchange: Option<String>,
    /// AMQP: routing key (default `""`).
    #[serde(default)]
    pub routing_key: Option<String>,
    /// AMQP: take each message's routing key from this JSON Pointer (RFC 6901, e.g. `/type`)
    /// into the payload instead; payloads that are not JSON or lack a string there are
    /// dead-lettered with reason `bad_payload`.
    #[serde(default)]
    pub routing_key_pointer: Option<String>,
    /// Kafka: topic to produce to.
    #[serde(default)]
    pub topic: Option<String>,
    /// Kafka: record key, `none` or `member`.
    #[serde(default)]
    pub kafka_key: Option<KafkaKey>,
    /// How the member maps to the message body.
    #[serde(default)]
    pub payload: PayloadMode,
    /// Worker tasks claiming and publishing for this trigger.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Most members one claim takes.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// How long a claimed member stays leased before another worker may recover it.
    #[serde(default = "default_lease", with = "humantime_serde")]
    pub lease: Duration,
    /// Longest sleep of an idle worker: the bridge looks at the queue at least this often.
    #[serde(default = "default_guard_interval", with = "humantime_serde")]
    pub guard_interval: Duration,
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
    /// Larger members are dead-lettered with reason `too_large` instead of published.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
}

fn default_workers() -> usize {
    4
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
