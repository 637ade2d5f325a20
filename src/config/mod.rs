//! Configuration: the TOML schema, its defaults, and loading through figment.

mod http;
mod ingress;
mod load;
mod location;
mod problem;
mod route;
mod rules;
mod schedule;
mod search;
mod service;
mod sinks;
mod tls;
mod topics;
mod trigger;
mod urls;
mod validate;
mod warnings;
pub use validate::MAX_SHARDS;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::tls::TlsConfig;
pub use http::HttpSinkConfig;
pub use ingress::{IngressConfig, MAX_PREFETCH};
pub use load::{env_overrides, load, load_from};
pub use problem::{ConfigError, Problem};
pub use route::{AmqpRoute, AmqpRouting, Destination, HttpRoute, HttpTarget, KafkaRoute};
pub use schedule::{
    problems as schedule_problems, Misfire, ScheduleConfig, MAX_CATCH_UP, MAX_SCHEDULES,
};
pub use search::{find as find_config, NotFound, CONFIG_ENV, LOCAL_CONFIG, SYSTEM_CONFIG};
pub use service::{
    AdminConfig, LogConfig, LogFormat, MetricsConfig, ShutdownConfig, ADMIN_TOKEN_ENV,
};
pub use sinks::{
    AmqpDeclare, AmqpSinkConfig, ExchangeType, KafkaSinkConfig, QueueType, SinkConfig,
};
pub use topics::TopicPatterns;
pub use trigger::{
    parse_rate, KafkaKey, MessageFormat, OnExpired, PayloadMode, Trigger, TriggerConfig, MAX_RATE,
};
pub use urls::url_match;

/// The whole configuration, validated: only [`load`] makes one (tests use [`load_from`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the sorted sets live.
    pub redis: RedisConfig,
    /// The HTTP endpoint for `/metrics`, `/healthz` and `/readyz`.
    pub metrics: MetricsConfig,
    /// The admin API (off unless `listen` is set).
    pub admin: AdminConfig,
    /// Log format and level.
    pub log: LogConfig,
    /// How the daemon stops.
    pub shutdown: ShutdownConfig,
    /// Brokers that triggers publish to, by name.
    pub sinks: BTreeMap<String, SinkConfig>,
    /// The sorted sets to watch and where their due members go.
    pub triggers: Vec<Trigger>,
}

/// `[redis]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `standalone`: one server (or a primary behind a stable address) at `url`;
    /// `cluster`: a Redis Cluster reached through the seed `nodes`;
    /// `sentinel`: the master the `sentinels` name `master_name`, followed over failovers.
    #[serde(default)]
    pub mode: RedisMode,
    /// Standalone mode: `redis://[user:password@]host:port/db` or `rediss://` for TLS.
    #[serde(default = "default_redis_url")]
    pub url: String,
    /// Cluster mode: seed nodes, `redis://[user:password@]host:port` or `rediss://` (all the
    /// same scheme; database 0 only). The bridge learns the rest of the cluster from them.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Sentinel mode: the sentinels, `redis://host:26379` or `rediss://` (TLS to the
    /// sentinels and to the master, with `[redis.tls]`); all the same scheme.
    #[serde(default)]
    pub sentinels: Vec<String>,
    /// Sentinel mode: the name the sentinels know the master by (`sentinel monitor NAME ...`).
    pub master_name: Option<String>,
    /// Sentinel mode: the user to authenticate to the sentinels as (ACL), if they ask for one.
    pub sentinel_username: Option<String>,
    /// Sentinel mode: a file holding the sentinels' password (`requirepass` of the sentinels).
    pub sentinel_password_file: Option<String>,
    /// Read the password from this file instead of the URL (overrides the URL's password);
    /// in cluster and sentinel mode, the password of every Redis server.
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
    /// Refuse to start when Redis may evict queued messages (`maxmemory-policy` `allkeys-*`);
    /// `false` runs anyway, with a warning. `volatile-*` policies are warned about only.
    #[serde(default = "default_true")]
    pub require_noeviction: bool,
    /// `[redis.tls]`: how a `rediss://` connection verifies the server and identifies itself.
    /// Without it, `rediss://` trusts the system's CAs and checks the URL's host name.
    pub tls: Option<TlsConfig>,
}

/// How the bridge reaches Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisMode {
    /// One server at `redis.url`.
    #[default]
    Standalone,
    /// A Redis Cluster, found through `redis.nodes`.
    Cluster,
    /// A master and its replicas watched by Redis Sentinel, found through `redis.sentinels`.
    Sentinel,
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
fn default_true() -> bool {
    true
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            mode: RedisMode::Standalone,
            url: default_redis_url(),
            nodes: Vec::new(),
            sentinels: Vec::new(),
            master_name: None,
            sentinel_username: None,
            sentinel_password_file: None,
            password_file: None,
            connect_timeout: default_connect_timeout(),
            response_timeout: default_response_timeout(),
            enable_keyspace_events: false,
            require_noeviction: true,
            tls: None,
        }
    }
}
