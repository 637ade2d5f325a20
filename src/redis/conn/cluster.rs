//! Redis Cluster: the client built from `[redis] nodes`, the topology, and connections to one node.

use std::time::Duration;

use anyhow::Context;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, RedisError, RedisResult, TlsCertificates, Value};

use super::within_named;
use crate::config::RedisConfig;

/// Redirections and reconnections the client itself follows for one request before the error
/// reaches the bridge, whose own backoff retries it. One, so that a `MOVED` after a failover
/// is followed at once, and a claim is re-sent at most once unseen (a claim sent twice leaves
/// the first one's members leased, and the lease recovery puts them back).
const CLIENT_RETRIES: u32 = 1;

/// A Redis Cluster, reached through its seed nodes.
pub(super) struct Cluster {
    /// The seed nodes without credentials, for messages.
    shown: Vec<String>,
    settings: Settings,
    /// The client for commands.
    client: ClusterClient,
}

/// What every client of the cluster is built from.
struct Settings {
    /// The seed nodes as configured.
    seeds: Vec<String>,
    password: Option<String>,
    certs: Option<TlsCertificates>,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Settings {
    /// A builder with the seeds, credentials, TLS files, timeouts and retry cap.
    fn builder(&self) -> ClusterClientBuilder {
        let mut builder = ClusterClientBuilder::new(self.seeds.clone())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .retries(CLIENT_RETRIES);
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        if let Some(certs) = &self.certs {
            builder = builder.certs(certs.clone());
        }
        builder
    }
}

impl Cluster {
    /// From `[redis]` in cluster mode (files read now).
    pub(super) fn new(config: &RedisConfig) -> anyhow::Result<Self> {
        // The client's TLS uses the process's default crypto provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let password = match &config.password_file {
            Some(file) => Some(crate::secret::read_file(file)?),
            None => None,
        };
        let certs = config
            .tls
            .as_ref()
            .map(super::client_certificates)
            .transpose()?;
        let settings = Settings {
            seeds: config.nodes.clone(),
            password,
            certs,
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
        };
        Ok(Self {
            shown: config
                .nodes
                .iter()
                .map(|n| crate::secret::redact_url(n))
                .collect(),
            client: settings.builder().build().context("redis.nodes")?,
            settings,
        })
    }

    /// A connection for commands: it routes each by its first key's slot and follows the
    /// cluster's topology by itself.
    pub(super) async fn connect(&self) -> RedisResult<ClusterConnection> {
        self.client.get_async_connection().await
    }

    /// Seed nodes for messages, without credentials.
    pub(super) fn shown(&self) -> &[String] {
        &self.shown
    }

    /// A client of the one node at `addr` (`host:port`), with the seeds' scheme, credentials
    /// and TLS files.
    pub(super) fn node(&self, addr: &str) -> RedisResult<redis::Client> {
        let invalid = |what: &str| {
            RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "cannot address a cluster node",
                format!("{addr}: {what}"),
            ))
        };
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| invalid("not host:port"))?;
        let seed = self
            .settings
            .seeds
            .first()
            .ok_or_else(|| invalid("no seed"))?;
        let mut url = url::Url::parse(seed).map_err(|e| invalid(&e.to_string()))?;
        url.set_host(Some(host.trim_start_matches('[').trim_end_matches(']')))
            .map_err(|e| invalid(&e.to_string()))?;
        url.set_port(Some(port)).map_err(|()| invalid("port"))?;
        url.set_path("");
        let mut info = url.as_str().into_connection_info()?;
        let mut redis = info.redis_settings().clone();
        if let Some(password) = &self.settings.password {
            redis = redis.set_password(password);
        }
        info = info.set_redis_settings(redis);
        match &self.settings.certs {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
            None => redis::Client::open(info),
        }
    }

    /// A subscriber connection to the node at `addr`.
    pub(super) async fn node_pubsub(&self, addr: &str) -> RedisResult<redis::aio::PubSub> {
        let client = self.node(addr)?;
        within_named(
            self.settings.connect_timeout,
            &addr,
            client.get_async_pubsub(),
        )
        .await
    }

    /// Sends `cmd` to the node at `addr` on a connection of its own.
    pub(super) async fn on_node(&self, addr: &str, cmd: &Cmd) -> RedisResult<Value> {
        let client = self.node(addr)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.response_timeout));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        within_named(
            self.settings.response_timeout,
            &addr,
            cmd.query_async(&mut conn),
        )
        .await
    }
}

/// Which node serves which slots: read with `CLUSTER SLOTS` from any node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Slot ranges (inclusive) and their master's `host:port`.
    ranges: Vec<(u16, u16, String)>,
    /// Every node, masters and replicas, as `host:port`.
    nodes: Vec<String>,
}

impl Topology {
    /// Reads it through the cluster connection.
    pub(super) async fn read(conn: &mut ClusterConnection) -> RedisResult<Self> {
        let reply: Vec<Vec<Value>> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
        let mut ranges = Vec::new();
        let mut nodes = Vec::new();
        let node = |v: &Value| -> Option<String> {
            let Value::Array(fields) = v else { return None };
            let host = match fields.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let Value::Int(port) = fields.get(1)? else {
                return None;
            };
            Some(if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            })
        };
        for range in &reply {
            let (Some(Value::Int(start)), Some(Value::Int(end))) = (range.first(), range.get(1))
            else {
                continue;
            };
            let Some(master) = range.get(2).and_then(node) else {
                continue;
            };
            ranges.push((*start as u16, *end as u16, master.clone()));
            for n in std::iter::once(master).chain(range[3..].iter().filter_map(node)) {
                if !nodes.contains(&n) {
                    nodes.push(n);
                }
            }
        }
        ranges.sort();
        Ok(Self { ranges, nodes })
    }

    /// The master serving `slot`, if any.
    pub fn master_of(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, master)| master.as_str())
    }

    /// The masters serving slots, each once.
    pub fn masters(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (_, _, master) in &self.ranges {
            if !out.contains(&master.as_str()) {
                out.push(master);
            }
        }
        out
    }

    /// Every node, masters and replicas.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key, mod 16384.
pub fn slot(key: &[u8]) -> u16 {
    let hashed = match (key.iter().position(|b| *b == b'{'), key) {
        (Some(open), _) => match key[open + 1..].iter().position(|b| *b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        (None, _) => key,
    };
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // As `CLUSTER KEYSLOT` answers.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(
            slot(b"__keyspace@0__:delay:{orders}"),
            slot(b"delay:{orders}")
        );
    }
}
