//! Configuration: the TOML schema as written (`...Config`, serde only), loading through figment,
//! and the validated types each section becomes ([`Redis`], [`Sink`], [`Trigger`]).

mod http;
mod ingress;
mod load;
mod location;
mod message;
mod problem;
mod rate;
mod redis;
mod route;
mod rules;
mod schedule;
mod search;
mod service;
mod sinks;
mod tls;
mod topics;
mod trigger;
mod trigger_config;
mod urls;
mod validate;
mod warnings;
pub(crate) use validate::MAX_SHARDS;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use crate::tls::Tls;
pub(crate) use crate::tls::TlsConfig;
pub(crate) use http::HttpSinkConfig;
pub(crate) use ingress::IngressConfig;
pub(crate) use load::env_overrides;
pub use load::{load, load_from};
pub(crate) use message::{KafkaKey, MessageFormat, OnExpired, PayloadMode};
pub use problem::Problem;
pub(crate) use problem::{ConfigError, Invalid};
#[cfg(test)]
use rate::parse_rate;
pub use redis::{Redis, RedisConfig, RedisMode};
pub use route::Destination;
#[cfg(test)]
pub(crate) use route::HttpTarget;
pub(crate) use route::{AmqpRoute, AmqpRouting, HttpRoute, KafkaRoute};
pub(crate) use schedule::{problems as schedule_problems, Misfire, ScheduleConfig, MAX_SCHEDULES};
pub(crate) use search::find as find_config;
pub(crate) use service::{
    AdminConfig, LogConfig, LogFormat, MetricsConfig, ShutdownConfig, ADMIN_TOKEN_ENV,
};
pub(crate) use sinks::{AmqpDeclare, AmqpSinkConfig, ExchangeType, KafkaSinkConfig, QueueType};
pub use sinks::{Sink, SinkConfig};
pub(crate) use topics::TopicPatterns;
pub use trigger::Trigger;
pub(crate) use trigger_config::TriggerConfig;
pub(crate) use urls::url_match;

/// The whole configuration, validated: only [`load`] makes one (tests use [`load_from`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the sorted sets live.
    pub redis: Redis,
    /// The HTTP endpoint for `/metrics`, `/healthz` and `/readyz`.
    pub metrics: MetricsConfig,
    /// The admin API (off unless `listen` is set).
    pub admin: AdminConfig,
    /// Log format and level.
    pub log: LogConfig,
    /// How the daemon stops.
    pub shutdown: ShutdownConfig,
    /// Brokers that triggers publish to, by name.
    pub sinks: BTreeMap<String, Sink>,
    /// The sorted sets to watch and where their due members go.
    pub triggers: Vec<Trigger>,
}
