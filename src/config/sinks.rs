//! The `[sinks.NAME]` sections as written: AMQP (addresses, channels, the topology to
//! declare), Kafka (brokers and producer properties) and HTTP; and the validated [`Sink`] each
//! becomes, its TLS client built once.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use super::HttpSinkConfig;
use crate::tls::{Tls, TlsConfig};

/// `[sinks.NAME]`: a broker, chosen by `type`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SinkConfig {
    /// RabbitMQ (AMQP 0-9-1) with publisher confirms.
    Amqp(AmqpSinkConfig),
    /// Kafka with an idempotent producer.
    Kafka(KafkaSinkConfig),
    /// HTTP endpoints: a message counts as delivered on a 2xx answer.
    Http(HttpSinkConfig),
}

impl SinkConfig {
    /// `amqp`, `kafka` or `http`, for labels and messages.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Amqp(_) => "amqp",
            SinkConfig::Kafka(_) => "kafka",
            SinkConfig::Http(_) => "http",
        }
    }
}

/// `[sinks.NAME] type = "amqp"`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSinkConfig {
    /// One node: `amqp://user:password@host:port/vhost` or `amqps://` for TLS. Give this or
    /// `urls`.
    pub url: Option<String>,
    /// The nodes of a cluster, same scheme, credentials and vhost, differing in host and port:
    /// the bridge connects to one at a time, starting from a random one, and moves on to the
    /// next when it cannot connect or the connection drops. Give this or `url`.
    pub urls: Option<Vec<String>>,
    /// Read the password from this file instead of the URL (overrides the password of every
    /// address).
    pub password_file: Option<String>,
    /// Exchanges and queues to declare (idempotently) on every connect.
    #[serde(default)]
    pub declare: Vec<AmqpDeclare>,
    /// Longest wait between reconnection attempts.
    #[serde(default = "default_reconnect_max", with = "humantime_serde")]
    pub reconnect_max: Duration,
    /// Most channels the bridge opens on its connection; every worker and dead-letter
    /// forwarder of every trigger publishes on one of them, in turn (at most 2,000: RabbitMQ's
    /// default `channel_max` is 2,047).
    #[serde(default = "default_channels")]
    pub channels: usize,
    /// Most messages published on the connection and not yet confirmed by the broker; a
    /// publish beyond it waits for a confirmation. What the broker holds unconfirmed is what
    /// a crash of the bridge sends again (those members are still in Redis), so this bounds
    /// the duplicates per crash; too small a window leaves the broker idle between
    /// confirmations. Claimed members waiting for room are not at the broker: a crash
    /// redelivers them without a duplicate.
    #[serde(default = "default_max_unconfirmed")]
    pub max_unconfirmed: usize,
    /// `[sinks.NAME.tls]`: how an `amqps://` connection verifies the broker and identifies
    /// itself. Without it, `amqps://` trusts the system's CAs and checks the URL's host name.
    pub tls: Option<TlsConfig>,
}

fn default_reconnect_max() -> Duration {
    Duration::from_secs(10)
}
fn default_channels() -> usize {
    32
}
fn default_max_unconfirmed() -> usize {
    256
}

impl AmqpSinkConfig {
    /// Every configured address, in the order given: `urls`, or `url` alone.
    pub fn addresses(&self) -> Vec<&str> {
        match (&self.url, &self.urls) {
            (_, Some(urls)) => urls.iter().map(String::as_str).collect(),
            (Some(url), None) => vec![url.as_str()],
            (None, None) => Vec::new(),
        }
    }
}

/// `[[sinks.NAME.declare]]`: an exchange, optionally with a queue bound to it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpDeclare {
    /// Exchange name (durable).
    pub exchange: String,
    /// Exchange type: `direct` (default), `topic`, `fanout` or `headers`.
    #[serde(default)]
    pub kind: ExchangeType,
    /// A durable queue to declare and bind to the exchange.
    pub queue: Option<String>,
    /// The queue's type (`x-queue-type`): `classic`, `quorum` (replicated over the cluster by
    /// Raft) or `stream`. Unset: no argument, which RabbitMQ takes as classic.
    pub queue_type: Option<QueueType>,
    /// Binding key of the queue (defaults to the queue name).
    pub binding_key: Option<String>,
}

/// The type of a declared exchange.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeType {
    /// Routes on the exact routing key.
    #[default]
    Direct,
    /// Routes on routing-key patterns.
    Topic,
    /// Routes to every bound queue.
    Fanout,
    /// Routes on header values.
    Headers,
}

/// The type of a declared queue (`x-queue-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// A queue on one node.
    Classic,
    /// A queue replicated by Raft: a confirm means a majority of its replicas has the message.
    Quorum,
    /// An append-only log replicated over the cluster; consumers read it by offset.
    Stream,
}

impl QueueType {
    /// The value of `x-queue-type`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }
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
    pub sasl_password_file: Option<String>,
    /// Allow `properties` that make a delivery report prove nothing (`acks` other than
    /// `all`/`-1`, `enable.idempotence = false`): members are then deleted from Redis on the
    /// word of a broker that may not have stored them. Off: such properties are refused.
    #[serde(default)]
    pub accept_possible_loss: bool,
}

/// A `[sinks.NAME]` validated: its settings as written, every one checked, and the TLS client
/// of its `tls` table built from its files once. Only [`Sink::validate`] makes one.
#[derive(Debug, Clone)]
pub struct Sink {
    name: String,
    settings: SinkConfig,
    tls: Option<Tls>,
}

impl Sink {
    /// A validated sink: only [`Sink::validate`] calls this.
    pub(super) fn new(name: &str, settings: SinkConfig, tls: Option<Tls>) -> Self {
        Self {
            name: name.to_string(),
            settings,
            tls,
        }
    }

    /// The sink's name, the `NAME` of `[sinks.NAME]`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings as written (checked), by type.
    pub fn settings(&self) -> &SinkConfig {
        &self.settings
    }

    /// `amqp`, `kafka` or `http`.
    pub fn kind(&self) -> &'static str {
        self.settings.kind()
    }

    /// The TLS client of an `amqps://` or `https://` connection: the `tls` table's, built when
    /// the sink was validated, or the system's trust store without that table.
    pub fn tls(&self) -> Tls {
        self.tls.clone().unwrap_or_else(Tls::system)
    }
}

/// As written: a reload compares the section so.
impl Serialize for Sink {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.settings.serialize(serializer)
    }
}
