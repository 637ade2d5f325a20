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
pub use validate::MAX_SHARDS;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use crate::tls::{Tls, TlsConfig};
pub use http::HttpSinkConfig;
pub use ingress::{IngressConfig, MAX_PREFETCH};
pub use load::{env_overrides, load, load_from};
pub use message::{KafkaKey, MessageFormat, OnExpired, PayloadMode};
pub use problem::{ConfigError, Invalid, Problem};
#[cfg(test)]
use rate::parse_rate;
pub use rate::{Rate, MAX_RATE};
pub use redis::{Redis, RedisConfig, RedisMode};
pub use route::{AmqpRoute, AmqpRouting, Destination, HttpRoute, HttpTarget, KafkaRoute};
pub use schedule::{
    problems as schedule_problems, Misfire, ScheduleConfig, MAX_CATCH_UP, MAX_SCHEDULES,
};
pub use search::{find as find_config, NotFound, CONFIG_ENV, LOCAL_CONFIG, SYSTEM_CONFIG};
pub use service::{
    AdminConfig, LogConfig, LogFormat, MetricsConfig, ShutdownConfig, ADMIN_TOKEN_ENV,
};
pub use sinks::{
    AmqpDeclare, AmqpSinkConfig, ExchangeType, KafkaSinkConfig, QueueType, Sink, SinkConfig,
};
pub use topics::TopicPatterns;
pub use trigger::Trigger;
pub use trigger_config::TriggerConfig;
pub use urls::url_match;

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
