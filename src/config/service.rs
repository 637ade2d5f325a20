//! The daemon's own sections: `[metrics]`, `[admin]`, `[log]` and `[shutdown]`.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[metrics]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the HTTP listener; loopback by default. Use `0.0.0.0:9464` to expose it.
    pub listen: SocketAddr,
    /// How often the backlog gauges are refreshed from Redis.
    #[serde(with = "humantime_serde")]
    pub backlog_interval: Duration,
}

/// `[admin]`: the admin API, on a listener of its own.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin API's listener. Unset: no admin API. Keep it on loopback (or
    /// behind a proxy of your own): the token is sent in clear over plain HTTP.
    pub listen: Option<SocketAddr>,
    /// File holding the bearer token every call must carry (at least 16 characters);
    /// `DELAY_BRIDGE_ADMIN_TOKEN` may give it instead.
    pub token_file: Option<String>,
    /// Only the calls that read (triggers, browse, show, forecast, dead letters); the
    /// others answer 403. Without a token, the admin API must be read-only.
    pub read_only: bool,
    /// Host names (without port) the admin API answers to, besides IP addresses and
    /// `localhost`: a request whose `Host` header names anything else is refused with 421, so
    /// that a page on another site cannot reach the API by pointing its own name at this
    /// address (DNS rebinding). List the names a proxy or the operators use, e.g.
    /// `["bridge.internal"]`.
    pub allowed_hosts: Vec<String>,
}

/// The environment variable that may hold the admin API's token.
pub(crate) const ADMIN_TOKEN_ENV: &str = "DELAY_BRIDGE_ADMIN_TOKEN";

impl AdminConfig {
    /// The bearer token: from `token_file`, else from [`ADMIN_TOKEN_ENV`]; `None` without.
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        match &self.token_file {
            Some(path) => Ok(Some(crate::secret::read_file(path)?)),
            None => Ok(std::env::var(ADMIN_TOKEN_ENV)
                .ok()
                .filter(|t| !t.is_empty())),
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            backlog_interval: Duration::from_secs(10),
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `delay_bridge=debug`; `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            level: "info".into(),
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
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long to wait for outstanding broker confirmations after SIGTERM
    /// before putting the unconfirmed messages back.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
        }
    }
}
