//! Where Redis is and how to reach it: the address (TCP, TLS or a Unix socket), credentials
//! and timeouts, and opening one connection there.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use redis::aio::{MultiplexedConnection, PubSub};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, RedisResult,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::AbortHandle;

use super::cluster;
use super::sentinel::SentinelMaster;
use crate::config::{Redis, RedisConfig, RedisMode};
use crate::tls::Tls;

/// TCP keepalive: a peer that vanished without a reset is noticed in about a minute.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// A byte stream to Redis, whatever carries it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Where Redis is and how to reach it: address, TLS, credentials and timeouts.
pub struct Endpoint {
    addr: Addr,
    pub(super) info: RedisConnectionInfo,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    /// Cluster mode: the cluster (`addr` and `info` are then unused).
    pub(super) cluster: Option<cluster::Cluster>,
    /// Sentinel mode: the master the sentinels name (`addr` is then unused).
    sentinel: Option<SentinelMaster>,
}

#[derive(Clone)]
enum Addr {
    Tcp { host: String, port: u16 },
    Tls { host: String, port: u16, tls: Tls },
    Unix(PathBuf),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credentials stay out: only where it is.
        f.debug_struct("Endpoint")
            .field("addr", &self.to_string())
            .field("db", &self.db())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bracketed = |host: &str| {
            if host.contains(':') {
                format!("[{host}]")
            } else {
                host.to_string()
            }
        };
        if let Some(cluster) = &self.cluster {
            return write!(f, "Redis Cluster via {}", cluster.shown().join(", "));
        }
        if let Some(sentinel) = &self.sentinel {
            write!(
                f,
                "master `{}` via sentinels {}",
                sentinel.name,
                sentinel.shown().join(", ")
            )?;
            return match sentinel.current() {
                Some(at) => write!(f, " (at {at})"),
                None => Ok(()),
            };
        }
        match &self.addr {
            Addr::Tcp { host, port } => write!(f, "redis://{}:{port}", bracketed(host)),
            Addr::Tls { host, port, tls } => {
                write!(f, "rediss://{}:{port}", bracketed(host))?;
                match tls.name_for(host) {
                    name if name != host => write!(f, " (certificate name `{name}`)"),
                    _ => Ok(()),
                }
            }
            Addr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl Endpoint {
    /// From `[redis]`: the URL, the password file and `[redis.tls]`'s client (the files of
    /// the Redis client's own TLS, in cluster and sentinel mode, are read now).
    pub fn new(section: &Redis) -> anyhow::Result<Self> {
        let config = section.settings();
        if config.mode == RedisMode::Cluster {
            return Ok(Self {
                addr: Addr::Unix(PathBuf::new()),
                info: RedisConnectionInfo::default(),
                connect_timeout: config.connect_timeout,
                response_timeout: config.response_timeout,
                cluster: Some(cluster::Cluster::new(config)?),
                sentinel: None,
            });
        }
        if config.mode == RedisMode::Sentinel {
            let password = match &config.password_file {
                Some(file) => Some(crate::secret::read_file(file)?),
                None => None,
            };
            let mut info = RedisConnectionInfo::default();
            if let Some(password) = &password {
                info = info.set_password(password.clone());
            }
            return Ok(Self {
                addr: Addr::Unix(PathBuf::new()),
                info,
                connect_timeout: config.connect_timeout,
                response_timeout: config.response_timeout,
                cluster: None,
                sentinel: Some(SentinelMaster::new(section, password.as_deref())?),
            });
        }
        // TLS is ours: the URL is parsed as plain and the scheme says whether to wrap it.
        let (tls, plain) = match config.url.strip_prefix("rediss://") {
            Some(rest) => (true, format!("redis://{rest}")),
            None => (false, config.url.clone()),
        };
        let info = plain.as_str().into_connection_info().context("redis.url")?;
        let mut redis = info.redis_settings().clone();
        if let Some(file) = &config.password_file {
            redis = redis.set_password(crate::secret::read_file(file)?);
        }
        let addr = match info.addr().clone() {
            ConnectionAddr::Tcp(host, port) if tls => Addr::Tls {
                host,
                port,
                tls: section.tls(),
            },
            ConnectionAddr::Tcp(host, port) => Addr::Tcp { host, port },
            ConnectionAddr::TcpTls { .. } => anyhow::bail!("redis.url: unexpected TLS address"),
            ConnectionAddr::Unix(path) => Addr::Unix(path),
            other => anyhow::bail!("redis.url: unsupported address {other}"),
        };
        Ok(Self {
            addr,
            info: redis,
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            cluster: None,
            sentinel: None,
        })
    }

    /// A plain endpoint for `url` with default timeouts (tools and tests).
    pub fn from_url(url: &str) -> anyhow::Result<Self> {
        let redis = Redis::validate(RedisConfig {
            url: url.to_string(),
            ..RedisConfig::default()
        })?;
        Self::new(&redis)
    }

    /// The database number commands run in (0 on a cluster).
    pub fn db(&self) -> i64 {
        if self.cluster.is_some() {
            0
        } else {
            self.info.db()
        }
    }

    /// How long a reply may take before the server counts as not answering.
    pub fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Sentinel mode: the master's name and where it is now (as the sentinels last said).
    pub fn sentinel_master(&self) -> Option<String> {
        let sentinel = self.sentinel.as_ref()?;
        let at = sentinel
            .current()
            .unwrap_or_else(|| "(not yet named)".into());
        Some(format!("master `{}` at {at}", sentinel.name))
    }

    /// Where to connect now: the address configured, or the master the sentinels name.
    async fn target(&self) -> RedisResult<std::borrow::Cow<'_, Addr>> {
        let Some(sentinel) = &self.sentinel else {
            return Ok(std::borrow::Cow::Borrowed(&self.addr));
        };
        // Boxed: the client's future is deep, and every connection's future holds this one.
        let (host, port) = Box::pin(sentinel.resolve()).await?;
        Ok(std::borrow::Cow::Owned(match &sentinel.tls {
            Some(tls) => Addr::Tls {
                host,
                port,
                tls: tls.clone(),
            },
            None => Addr::Tcp { host, port },
        }))
    }

    /// Opens a byte stream within the connect timeout, TLS handshake included.
    async fn stream(&self) -> RedisResult<Box<dyn Io>> {
        let open = async {
            let target = self.target().await?;
            Ok::<Box<dyn Io>, RedisError>(match &*target {
                Addr::Tcp { host, port } => Box::new(self.tcp(host, *port).await?),
                Addr::Tls { host, port, tls } => {
                    let tcp = self.tcp(host, *port).await?;
                    let name = ServerName::try_from(tls.name_for(host).to_string())
                        .map_err(|e| self.failed("TLS server name", e))?;
                    let mut stream = tokio_rustls::TlsConnector::from(tls.config())
                        .connect(name, tcp)
                        .await
                        .map_err(|e| self.failed("TLS handshake failed", e))?;
                    self.probe(&mut stream, tls).await?;
                    Box::new(stream)
                }
                Addr::Unix(path) => Box::new(
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map_err(|e| self.io(e))?,
                ),
            })
        };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(stream) => stream,
            Err(_) => Err(self.io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {:?}", self.connect_timeout),
            ))),
        }
    }

    /// A TCP connection with no delay and keepalive on.
    pub(super) async fn tcp(&self, host: &str, port: u16) -> RedisResult<tokio::net::TcpStream> {
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| self.io(e))?;
        stream.set_nodelay(true).map_err(|e| self.io(e))?;
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE)
            .with_interval(KEEPALIVE / 3);
        socket2::SockRef::from(&stream)
            .set_tcp_keepalive(&keepalive)
            .map_err(|e| self.io(e))?;
        Ok(stream)
    }

    /// One `PING` over a fresh TLS session, answered by one line (`+PONG`, `-NOAUTH ...`).
    /// With TLS 1.3 a server that refuses the client's certificate says so only after the
    /// handshake, in an alert the Redis client would turn into "connection closed"; read
    /// here, the alert is the error, with what to do about it.
    pub(super) async fn probe(
        &self,
        stream: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        tls: &Tls,
    ) -> RedisResult<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let refused = |e: std::io::Error| {
            let hint = if tls.has_client_certificate() {
                ""
            } else {
                " (if the server requires client certificates, set redis.tls.cert_file and key_file)"
            };
            self.failed("TLS session refused", format!("{e}{hint}"))
        };
        stream
            .write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .map_err(refused)?;
        stream.flush().await.map_err(refused)?;
        // Byte by byte up to the line's end, so nothing of a later reply is consumed.
        let mut reply = Vec::new();
        while !reply.ends_with(b"\r\n") {
            if reply.len() >= 4096 {
                return Err(self.failed("unexpected reply to PING", "no line end in 4 kB"));
            }
            let byte = stream.read_u8().await.map_err(refused)?;
            reply.push(byte);
        }
        if !matches!(reply.first(), Some(b'+' | b'-')) {
            return Err(self.failed(
                "unexpected reply to PING",
                String::from_utf8_lossy(&reply).trim_end().to_string(),
            ));
        }
        Ok(())
    }

    /// An I/O error that names this endpoint and keeps its kind (refused, timed out, ...).
    pub(super) fn io(&self, e: std::io::Error) -> RedisError {
        RedisError::from(std::io::Error::new(e.kind(), format!("{self}: {e}")))
    }

    /// An I/O error that names this endpoint and says what failed.
    pub(super) fn failed(&self, what: &'static str, e: impl std::fmt::Display) -> RedisError {
        RedisError::from((ErrorKind::Io, what, format!("{self}: {e}")))
    }

    /// A multiplexed connection and the handle of its driver task.
    pub(super) async fn multiplexed(&self) -> RedisResult<(MultiplexedConnection, AbortHandle)> {
        let stream = self.stream().await?;
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(self.response_timeout));
        let (conn, driver) =
            MultiplexedConnection::new_with_config(&self.info, stream, config).await?;
        let driver = tokio::spawn(driver).abort_handle();
        Ok((conn, driver))
    }

    /// A connection in subscriber mode.
    pub async fn pubsub(&self) -> RedisResult<PubSub> {
        let stream = self.stream().await?;
        match tokio::time::timeout(self.response_timeout, PubSub::new(&self.info, stream)).await {
            Ok(pubsub) => pubsub,
            Err(_) => Err(self.io(std::io::ErrorKind::TimedOut.into())),
        }
    }

    /// Cluster mode: a subscriber connection to the node at `addr` (`host:port`, as
    /// [`Topology`] names it). An error for a standalone server.
    pub async fn node_pubsub(&self, addr: &str) -> RedisResult<PubSub> {
        match &self.cluster {
            Some(cluster) => cluster.node_pubsub(addr).await,
            None => Err(RedisError::from((ErrorKind::Client, "not a cluster"))),
        }
    }
}
