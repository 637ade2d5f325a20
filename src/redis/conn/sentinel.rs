//! Redis Sentinel: the sentinels asked, through the Redis client's own Sentinel support, which server is the master now; asked again for each new connection, so that a failover is followed on the first reconnection.

use std::sync::Mutex;

use anyhow::Context;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisResult, TlsCertificates, TlsMode};

use crate::config::Redis;
use crate::tls::Tls;

/// The master behind the sentinels, and how to reach it.
pub(super) struct SentinelMaster {
    /// The sentinels, for messages.
    shown: Vec<String>,
    /// The name the sentinels know the master by.
    pub(super) name: String,
    /// Asks the sentinels (one at a time, the first that answers), then the server they name
    /// whether it is master indeed (`ROLE`).
    client: tokio::sync::Mutex<SentinelClient>,
    /// TLS to the master (when the sentinels are `rediss://`).
    pub(super) tls: Option<Tls>,
    /// The master's `host:port` as last named.
    current: Mutex<Option<(String, u16)>>,
}

impl SentinelMaster {
    /// From `[redis]` in sentinel mode (the Redis client's TLS files read now), reaching the
    /// master with `[redis.tls]`'s client when the sentinels are `rediss://`.
    pub(super) fn new(redis: &Redis, password: Option<&str>) -> anyhow::Result<Self> {
        let config = redis.settings();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let name = config.master_name.clone().unwrap_or_default();
        let mut addrs = Vec::new();
        for (i, url) in config.sentinels.iter().enumerate() {
            let info = url
                .as_str()
                .into_connection_info()
                .with_context(|| format!("redis.sentinels[{i}]"))?;
            addrs.push(info.addr().clone());
        }
        let secure = addrs
            .iter()
            .any(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
        let mut builder = SentinelClientBuilder::new(addrs, &name, SentinelServerType::Master)
            .context("redis.sentinels")?
            .set_client_to_redis_db(0);
        if let Some(password) = password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(user) = &config.sentinel_username {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(file) = &config.sentinel_password_file {
            builder = builder.set_client_to_sentinel_password(crate::secret::read_file(file)?);
        }
        let mut master_tls = None;
        if secure {
            // Without `[redis.tls]`: the system's CAs, no client certificate.
            let certs = match &config.tls {
                Some(tls) => super::client_certificates(tls)?,
                None => TlsCertificates {
                    client_tls: None,
                    root_cert: None,
                },
            };
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
            master_tls = Some(redis.tls());
        }
        Ok(Self {
            shown: config
                .sentinels
                .iter()
                .map(|s| crate::secret::redact_url(s))
                .collect(),
            name,
            client: tokio::sync::Mutex::new(builder.build().context("redis.sentinels")?),
            tls: master_tls,
            current: Mutex::new(None),
        })
    }

    /// The sentinels, for messages.
    pub(super) fn shown(&self) -> &[String] {
        &self.shown
    }

    /// The master's `host:port` as last named by the sentinels.
    pub(super) fn current(&self) -> Option<String> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(host, port)| host_port(host, *port))
    }

    /// Asks the sentinels for the master now; logs when it moved.
    pub(super) async fn resolve(&self) -> RedisResult<(String, u16)> {
        let client = self.client.lock().await.async_get_client().await?;
        let (host, port) = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                (host.clone(), *port)
            }
            other => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "the sentinels named an unusable address",
                    other.to_string(),
                )))
            }
        };
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let moved = current.as_ref() != Some(&(host.clone(), port));
        if moved {
            let previous = current.as_ref().map(|(h, p)| host_port(h, *p));
            tracing::info!(
                master = %self.name,
                at = %host_port(&host, port),
                previous = previous.as_deref().unwrap_or("(none)"),
                "the sentinels name the master"
            );
            *current = Some((host.clone(), port));
        }
        Ok((host, port))
    }
}

/// `host:port`, an IPv6 host bracketed.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
