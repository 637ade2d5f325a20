//! `[redis]`: where the sorted sets live, as written ([`RedisConfig`]), and the validated
//! [`Redis`] the bridge connects with, its TLS client built once (by `validate/redis.rs`).

use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use crate::tls::{Tls, TlsConfig};

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

pub(super) fn default_redis_url() -> String {
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

/// `[redis]` validated: the settings as written, every one checked, and the TLS client of
/// `[redis.tls]` built from its files once. Only [`Redis::validate`] makes one.
#[derive(Debug, Clone)]
pub struct Redis {
    settings: RedisConfig,
    tls: Option<Tls>,
}

impl Redis {
    /// A validated section: only [`Redis::validate`] calls this.
    pub(super) fn new(settings: RedisConfig, tls: Option<Tls>) -> Self {
        Self { settings, tls }
    }

    /// The settings as written (checked).
    pub fn settings(&self) -> &RedisConfig {
        &self.settings
    }

    /// The TLS client of a `rediss://` connection: `[redis.tls]`'s, built when the section was
    /// validated, or the system's trust store without that table.
    pub fn tls(&self) -> Tls {
        self.tls.clone().unwrap_or_else(Tls::system)
    }
}

/// As written: a reload compares the section so.
impl Serialize for Redis {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.settings.serialize(serializer)
    }
}
