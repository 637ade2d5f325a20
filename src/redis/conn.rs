//! Connections to Redis over TCP, TLS or a Unix socket, to a Redis Cluster, or to the master
//! Redis Sentinel names, and a shared handle that reconnects after a break.

mod cluster;
mod endpoint;
mod sentinel;

pub use cluster::{slot, Topology};
pub use endpoint::Endpoint;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, TlsCertificates, Value,
};
use tokio::task::AbortHandle;

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
    Single(Arc<OneServer>),
    /// A cluster, through the cluster client, which follows the topology itself.
    Cluster {
        endpoint: Arc<Endpoint>,
        conn: redis::cluster_async::ClusterConnection,
    },
}

struct Connected {
    generation: u64,
    conn: MultiplexedConnection,
    driver: AbortHandle,
}

struct OneServer {
    endpoint: Arc<Endpoint>,
    /// The connection in use; `None` after a break.
    current: Mutex<Option<Connected>>,
    /// Held while connecting, so that a break makes one new connection, not one per caller.
    connecting: tokio::sync::Mutex<()>,
    /// The last generation handed out.
    generations: AtomicU64,
    /// Connection attempts that failed, and the last one's error: callers that waited for an
    /// attempt get its error instead of trying again one after another.
    attempts: AtomicU64,
    last_failure: Mutex<Option<(ErrorKind, String)>>,
}

impl Endpoint {
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
            link: Link::Single(Arc::new(OneServer {
                endpoint: self.clone(),
                current: Mutex::new(Some(Connected {
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

    /// [`Conn::each_node`] with each reply read as a `T`: each server's address and its
    /// value, or in words why there is none (when not even the servers could be listed, the
    /// endpoint stands for them all).
    pub async fn each_node_as<T: FromRedisValue>(
        &self,
        cmd: Cmd,
    ) -> Vec<(String, Result<T, String>)> {
        match self.each_node(cmd).await {
            Ok(replies) => replies
                .into_iter()
                .map(|(node, reply)| {
                    let value = reply
                        .map_err(|e| e.to_string())
                        .and_then(|v| T::from_redis_value(v).map_err(|e| e.to_string()));
                    (node, value)
                })
                .collect(),
            Err(e) => vec![(self.endpoint().to_string(), Err(e.to_string()))],
        }
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
    eval.arg(crate::redis::scripts::script_text(
        std::str::from_utf8(sha).ok()?,
    )?);
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

impl OneServer {
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
                *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(Connected {
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

/// `[redis.tls]`'s files for the Redis client's own TLS (cluster and sentinel mode), read now:
/// the CA to trust, and the client's certificate and key when both are given.
fn client_certificates(tls: &crate::config::TlsConfig) -> anyhow::Result<TlsCertificates> {
    let read = |path: &std::path::Path, key: &str| {
        std::fs::read(path).with_context(|| format!("redis.tls.{key}: reading {}", path.display()))
    };
    let root_cert = match &tls.ca_file {
        Some(path) => Some(read(path, "ca_file")?),
        None => None,
    };
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "cert_file")?,
            client_key: read(key, "key_file")?,
        }),
        _ => None,
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}
