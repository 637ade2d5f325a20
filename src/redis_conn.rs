//! Connections to Redis over TCP, TLS or a Unix socket, or to a Redis Cluster, and a shared
//! handle that reconnects after a break.

mod cluster;

pub use cluster::{slot, Topology};

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::AbortHandle;

use crate::config::{RedisConfig, RedisMode};
use crate::tls::Tls;

/// TCP keepalive: a peer that vanished without a reset is noticed in about a minute.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// A byte stream to Redis, whatever carries it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Where Redis is and how to reach it: address, TLS, credentials and timeouts.
pub struct Endpoint {
    addr: Addr,
    info: RedisConnectionInfo,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// Cluster mode: the cluster (`addr` and `info` are then unused).
    cluster: Option<cluster::Cluster>,
}

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
    /// From `[redis]`: the URL, the password file and `[redis.tls]` (files read now).
    pub fn new(config: &RedisConfig) -> anyhow::Result<Self> {
        if config.mode == RedisMode::Cluster {
            return Ok(Self {
                addr: Addr::Unix(PathBuf::new()),
                info: RedisConnectionInfo::default(),
                connect_timeout: config.connect_timeout,
                response_timeout: config.response_timeout,
                cluster: Some(cluster::Cluster::new(config)?),
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
            ConnectionAddr::Tcp(host, port) if tls => {
                let tls = match &config.tls {
                    Some(settings) => settings.client().map_err(|problems| {
                        let list: Vec<String> = problems
                            .iter()
                            .map(|p| format!("redis.tls.{}: {}", p.field, p.message))
                            .collect();
                        anyhow::anyhow!(list.join("; "))
                    })?,
                    None => Tls::system(),
                };
                Addr::Tls { host, port, tls }
            }
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
        })
    }

    /// A plain endpoint for `url` with default timeouts (tools and tests).
    pub fn from_url(url: &str) -> anyhow::Result<Self> {
        Self::new(&RedisConfig {
            url: url.to_string(),
            ..RedisConfig::default()
        })
    }

    /// The database number commands run in (0 on a cluster).
    pub fn db(&self) -> i64 {
        if self.cluster.is_some() {
            0
        } else {
            self.info.db()
        }
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Opens a byte stream within the connect timeout, TLS handshake included.
    async fn stream(&self) -> RedisResult<Box<dyn Io>> {
        let open = async {
            Ok::<Box<dyn Io>, RedisError>(match &self.addr {
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
    async fn tcp(&self, host: &str, port: u16) -> RedisResult<tokio::net::TcpStream> {
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
    async fn probe(
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
    fn io(&self, e: std::io::Error) -> RedisError {
        RedisError::from(std::io::Error::new(e.kind(), format!("{self}: {e}")))
    }

    /// An I/O error that names this endpoint and says what failed.
    fn failed(&self, what: &'static str, e: impl std::fmt::Display) -> RedisError {
        RedisError::from((ErrorKind::Io, what, format!("{self}: {e}")))
    }

    /// A multiplexed connection and the handle of its driver task.
    async fn multiplexed(&self) -> RedisResult<(MultiplexedConnection, AbortHandle)> {
        let stream = self.stream().await?;
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(self.response_timeout));
        let (conn, driver) =
            MultiplexedConnection::new_with_config(&self.info, stream, config).await?;
        let driver = tokio::spawn(driver).abort_handle();
        Ok((conn, driver))
    }

    /// Connects now (so that start-up sees what is wrong) and returns a handle that
    /// reconnects on the first command after the connection broke.
    pub async fn connect(self: &Arc<Self>) -> RedisResult<Conn> {
        if let Some(cluster) = &self.cluster {
            return Ok(Conn {
                link: Link::Cluster {
                    endpoint: self.clone(),
                    conn: cluster.connect().await?,
                },
                db: 0,
            });
        }
        let (first, driver) = self.multiplexed().await?;
        Ok(Conn {
            link: Link::Single(Arc::new(Shared {
                endpoint: self.clone(),
                current: Mutex::new(Some(Current {
                    generation: 0,
                    conn: first,
                    driver,
                })),
                connecting: tokio::sync::Mutex::new(()),
                generations: AtomicU64::new(0),
                attempts: AtomicU64::new(0),
                last_failure: Mutex::new(None),
            })),
            db: self.db(),
        })
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

/// A shared connection to Redis: cheap to clone, multiplexed, and replaced on the next
/// command after an I/O error or a timeout. Commands that fail are not retried here: the
/// callers own retries and backoff. A script Redis does not have cached (`NOSCRIPT`: a
/// restart, a failover) is sent again in full (`EVAL`) to the same key's node.
#[derive(Clone)]
pub struct Conn {
    link: Link,
    db: i64,
}

#[derive(Clone)]
enum Link {
    /// One server, through a connection replaced after a break.
    Single(Arc<Shared>),
    /// A cluster, through the cluster client, which follows the topology itself.
    Cluster {
        endpoint: Arc<Endpoint>,
        conn: redis::cluster_async::ClusterConnection,
    },
}

struct Current {
    generation: u64,
    conn: MultiplexedConnection,
    driver: AbortHandle,
}

struct Shared {
    endpoint: Arc<Endpoint>,
    /// The connection in use; `None` after a break.
    current: Mutex<Option<Current>>,
    /// Held while connecting, so that a break makes one new connection, not one per caller.
    connecting: tokio::sync::Mutex<()>,
    /// The last generation handed out.
    generations: AtomicU64,
    /// Connection attempts that failed, and the last one's error: callers that waited for an
    /// attempt get its error instead of trying again one after another.
    attempts: AtomicU64,
    last_failure: Mutex<Option<(ErrorKind, String)>>,
}

impl Conn {
    /// Connects to a plain `url` (tools and tests).
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let endpoint = Arc::new(Endpoint::from_url(url)?);
        Ok(endpoint.connect().await?)
    }

    /// Where this connection goes.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        match &self.link {
            Link::Single(shared) => &shared.endpoint,
            Link::Cluster { endpoint, .. } => endpoint,
        }
    }

    /// Cluster mode: which master serves which slots now; `None` for a standalone server.
    pub async fn topology(&self) -> Option<RedisResult<Topology>> {
        match &self.link {
            Link::Single(_) => None,
            Link::Cluster { endpoint, conn } => {
                Some(within(endpoint, Topology::read(&mut conn.clone())).await)
            }
        }
    }

    /// Sends `cmd` to every server: the one server, or every node of a cluster, replicas
    /// included, each on a connection of its own. Each server's address and its reply.
    pub async fn each_node(&self, cmd: Cmd) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        let Some(topology) = self.topology().await else {
            let mut conn = self.clone();
            let reply = conn.req_packed_command(&cmd).await;
            return Ok(vec![(self.endpoint().to_string(), reply)]);
        };
        let topology = topology?;
        let cluster = self
            .endpoint()
            .cluster
            .as_ref()
            .expect("a cluster's connection");
        let replies = futures_util::future::join_all(
            topology
                .nodes()
                .iter()
                .map(|node| cluster.on_node(node, &cmd)),
        )
        .await;
        Ok(topology.nodes().iter().cloned().zip(replies).collect())
    }

    /// Sends `cmd` to `node`, an address [`Conn::each_node`] gave (to the one server when
    /// standalone).
    pub async fn set_on(&self, node: &str, cmd: Cmd) -> RedisResult<Value> {
        match &self.endpoint().cluster {
            None => self.send(&cmd).await,
            Some(cluster) => cluster.on_node(node, &cmd).await,
        }
    }

    /// Sends `cmd` as it is.
    async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        match &self.link {
            Link::Single(shared) => {
                shared
                    .request(move |mut conn: MultiplexedConnection| async move {
                        conn.req_packed_command(cmd).await
                    })
                    .await
            }
            Link::Cluster { endpoint, conn } => {
                let mut conn = conn.clone();
                within(endpoint, conn.req_packed_command(cmd)).await
            }
        }
    }
}

/// `EVAL` with the script's text for an `EVALSHA` of one of the bridge's scripts.
fn eval_instead(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter();
    match args.next()? {
        redis::Arg::Simple(name) if name.eq_ignore_ascii_case(b"EVALSHA") => {}
        _ => return None,
    }
    let redis::Arg::Simple(sha) = args.next()? else {
        return None;
    };
    let mut eval = redis::cmd("EVAL");
    eval.arg(crate::scripts::script_text(std::str::from_utf8(sha).ok()?)?);
    for arg in args {
        if let redis::Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    Some(eval)
}

/// `reply` within `endpoint`'s response timeout (waiting to send included).
async fn within<T>(
    endpoint: &Endpoint,
    reply: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    within_named(endpoint.response_timeout, endpoint, reply).await
}

/// `reply` within `timeout`; a timeout is an I/O error naming `server`.
async fn within_named<T>(
    timeout: Duration,
    server: &(dyn std::fmt::Display + Sync),
    reply: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    match tokio::time::timeout(timeout, reply).await {
        Ok(reply) => reply,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{server}: no reply within {timeout:?}"),
        ))),
    }
}

impl Shared {
    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| (c.generation, c.conn.clone()))
    }

    async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let failed_before = self.attempts.load(Ordering::Acquire);
        let _one = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        if self.attempts.load(Ordering::Acquire) != failed_before {
            // An attempt failed while this caller waited: its answer is this caller's too.
            let last = self
                .last_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some((kind, message)) = last {
                return Err(RedisError::from((kind, "cannot connect", message)));
            }
        }
        match self.endpoint.multiplexed().await {
            Ok((conn, driver)) => {
                let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
                *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(Current {
                    generation,
                    conn: conn.clone(),
                    driver,
                });
                Ok((generation, conn))
            }
            Err(e) => {
                *self.last_failure.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((e.kind(), e.to_string()));
                self.attempts.fetch_add(1, Ordering::Release);
                Err(e)
            }
        }
    }

    /// Drops connection `generation`, if it is still the one in use, when `e` says it is
    /// broken or stuck: I/O errors, timeouts (a peer gone silent), and a server that turned
    /// replica under a stable address. Replies such as a script error keep it.
    fn broke(&self, generation: u64, e: &RedisError) {
        let broken = e.is_unrecoverable_error()
            || e.is_timeout()
            || matches!(
                e.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
            );
        if !broken {
            return;
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            if let Some(old) = current.take() {
                old.driver.abort();
            }
        }
    }

    /// Runs one request on the current connection within the response timeout (waiting to
    /// send included), dropping the connection if the request shows it broken.
    async fn request<T, F>(&self, send: impl FnOnce(MultiplexedConnection) -> F) -> RedisResult<T>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        let (generation, conn) = self.get().await?;
        let reply = within(&self.endpoint, send(conn)).await;
        if let Err(e) = &reply {
            self.broke(generation, e);
        }
        reply
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.send(cmd).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    match eval_instead(cmd) {
                        Some(eval) => self.send(&eval).await,
                        None => Err(e),
                    }
                }
                reply => reply,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match &self.link {
                Link::Single(shared) => {
                    shared
                        .request(move |mut conn: MultiplexedConnection| async move {
                            conn.req_packed_commands(cmd, offset, count).await
                        })
                        .await
                }
                Link::Cluster { endpoint, conn } => {
                    let mut conn = conn.clone();
                    within(endpoint, conn.req_packed_commands(cmd, offset, count)).await
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
