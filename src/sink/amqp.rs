//! RabbitMQ sink: one connection at a time to a node or to any node of a cluster, its topology
//! declared on connect; persistent, mandatory publishes on a bounded set of shared
//! confirm-mode channels.

mod answers;
mod channel;
mod connector;
mod frame;
mod isolate;
mod nodes;
mod publisher;
mod topology;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionStatus, ExchangeKind};
use tokio_util::sync::CancellationToken;

use super::window::Window;
use super::PublishError;
use crate::backoff::Backoff;
use crate::config::{AmqpDeclare, AmqpRoute, AmqpSinkConfig};
use crate::metrics::Metrics;
use crate::repeat::Repeated;
use crate::tls::Tls;
use channel::ConfirmChannel;
use connector::Connector;
use nodes::{Node, Nodes};
pub(crate) use publisher::AmqpPublisher;
use topology::DeclareError;
pub(crate) use topology::TopologyRefused;

/// How long connecting to one node and declaring the topology there may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no connection could be had.
#[derive(Debug, Clone, thiserror::Error)]
enum ConnectError {
    /// No node could be connected to (each one's error, in the order tried).
    #[error("{0}")]
    Unreachable(String),
    /// A node refused the login (ACCESS_REFUSED): the user or password is wrong, or the user
    /// may not use the vhost. Each node's error, in the order tried.
    #[error("{0}")]
    LoginRefused(String),
    /// The broker refused the configured topology: fatal.
    #[error(transparent)]
    Refused(#[from] TopologyRefused),
}

impl From<ConnectError> for PublishError {
    fn from(e: ConnectError) -> Self {
        PublishError::Connection(e.to_string())
    }
}

/// A RabbitMQ connection shared by the workers, who publish on at most `channels` channels.
pub struct AmqpSink {
    name: String,
    connector: Arc<Connector>,
    declare: Vec<AmqpDeclare>,
    reconnect_max: Duration,
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    up: AtomicBool,
    /// The status of the connection in use, read without waiting for `conn`'s lock.
    status: std::sync::Mutex<Option<ConnectionStatus>>,
    /// Set once the broker refused the topology; no connection is attempted after that.
    refused: OnceLock<TopologyRefused>,
    /// Most channels in `pool`.
    channels: usize,
    /// The channels publishers share.
    pool: tokio::sync::Mutex<Pool>,
    /// One permit per message that may be published and not yet confirmed, shared by the
    /// triggers in turn.
    window: Arc<Window>,
}

/// Confirm-mode channels on one connection, handed out in turn: however many triggers and
/// workers there are, the bridge holds at most the sink's `channels` (RabbitMQ refuses
/// more than its `channel_max` on one connection).
#[derive(Default)]
struct Pool {
    /// The connection the channels are on; another one empties the pool.
    conn: Option<Arc<Connection>>,
    channels: Vec<ConfirmChannel>,
    /// Which channel the next publisher gets, once the pool is full.
    next: usize,
    /// Exchanges seen to exist on this connection. Forgotten when a channel closes (the
    /// broker closes it when one is deleted under a publish), so they are checked again.
    exchanges: HashSet<String>,
}

impl AmqpSink {
    /// Reads the password file; connects with `tls` to `amqps://` nodes, but not yet.
    pub fn new(name: &str, config: &AmqpSinkConfig, tls: Tls) -> anyhow::Result<Self> {
        Ok(Self {
            connector: Arc::new(Connector {
                name: name.to_string(),
                nodes: Nodes::new(name, config)?,
                tls,
            }),
            name: name.to_string(),
            declare: config.declare.clone(),
            reconnect_max: config.reconnect_max,
            conn: tokio::sync::Mutex::new(None),
            up: AtomicBool::new(false),
            status: std::sync::Mutex::new(None),
            refused: OnceLock::new(),
            channels: config.channels,
            pool: tokio::sync::Mutex::new(Pool::default()),
            window: Arc::new(Window::new(config.max_unconfirmed)),
        })
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while the connection is open and RabbitMQ is not blocking it.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed) && !self.blocked()
    }

    /// True while RabbitMQ blocks the connection (`connection.blocked`: a memory or disk
    /// alarm). A blocked connection takes no publishes, so the sink counts as down.
    fn blocked(&self) -> bool {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(ConnectionStatus::blocked)
    }

    /// Forgets the connection `broken` published on, if it is still the current one (after
    /// a failover another worker may already have connected elsewhere: that connection is
    /// kept); the next call reconnects.
    pub async fn reset(&self, broken: &AmqpPublisher) {
        if self.blocked() {
            // The broker holds the connection during an alarm; a new one would only be
            // blocked again, and the old one's queued frames are not lost by keeping it.
            return;
        }
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_some_and(|c| Arc::ptr_eq(c, &broken.conn)) {
            self.close_current(&mut guard).await;
        }
    }

    /// Closes the connection, whatever it is (the sink's owner is done with it).
    pub async fn close(&self) {
        let mut guard = self.conn.lock().await;
        self.close_current(&mut guard).await;
    }

    async fn close_current(&self, guard: &mut Option<Arc<Connection>>) {
        if let Some(conn) = guard.take() {
            self.up.store(false, Ordering::Relaxed);
            let _ =
                tokio::time::timeout(Duration::from_secs(1), conn.close(320, "reconnecting")).await;
        }
    }

    /// The open connection; if there is none, tries each node in turn (see [`Nodes::round`])
    /// and declares the topology on the first that answers.
    async fn connection(&self) -> Result<Arc<Connection>, ConnectError> {
        let mut guard = self.conn.lock().await;
        if let Some(conn) = guard.as_ref() {
            if conn.status().connected() {
                return Ok(conn.clone());
            }
            self.up.store(false, Ordering::Relaxed);
        }
        if let Some(refused) = self.refused.get() {
            return Err(refused.clone().into());
        }
        let mut failures = Vec::new();
        let mut login_refused = false;
        for (i, node) in self.connector.nodes.round() {
            let conn = match self.open(node).await {
                Ok(conn) => conn,
                Err(DeclareError::Refused(refused)) => {
                    let _ = self.refused.set(refused.clone());
                    return Err(refused.into());
                }
                Err(DeclareError::LoginRefused(e)) => {
                    login_refused = true;
                    failures.push(format!("{}: {e}", node.shown));
                    continue;
                }
                Err(DeclareError::Failed(e)) => {
                    tracing::debug!(sink = %self.name, node = %node.shown, error = %e, "cannot connect to this node");
                    failures.push(format!("{}: {e}", node.shown));
                    continue;
                }
            };
            self.connector.nodes.connected(i);
            tracing::info!(sink = %self.name, node = %node.shown, "connected to RabbitMQ");
            *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.status().clone());
            let conn = Arc::new(conn);
            *guard = Some(conn.clone());
            self.up.store(true, Ordering::Relaxed);
            return Ok(conn);
        }
        let all = failures.join("; ");
        if login_refused {
            Err(ConnectError::LoginRefused(all))
        } else {
            Err(ConnectError::Unreachable(all))
        }
    }

    /// Connects to one node and declares the topology there, within [`CONNECT_TIMEOUT`].
    async fn open(&self, node: &Node) -> Result<Connection, DeclareError> {
        let open = async {
            let conn = self.connector.connect(node, "").await?;
            if let Err(e) = topology::declare(&self.name, &conn, &self.declare).await {
                let _ = conn.close(200, "declaring failed").await;
                return Err(e);
            }
            Ok(conn)
        };
        tokio::time::timeout(CONNECT_TIMEOUT, open)
            .await
            .unwrap_or_else(|_| {
                Err(DeclareError::Failed(format!(
                    "connecting and declaring took over {CONNECT_TIMEOUT:?}"
                )))
            })
    }

    /// Connects at start and reconnects with capped backoff whenever the connection drops,
    /// so readiness recovers even when no worker is publishing. Returns only when cancelled,
    /// or with the refusal when the broker will not take the configured topology.
    pub async fn supervise(
        &self,
        metrics: Metrics,
        cancel: CancellationToken,
    ) -> Result<(), TopologyRefused> {
        let gauge = metrics.sink_up.with_label_values(&[&self.name]);
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: self.reconnect_max,
        };
        let mut failures = Repeated::default();
        let mut was_blocked = false;
        loop {
            let wait = match self.connection().await {
                Ok(_) => {
                    failures.recovered();
                    let blocked = self.blocked();
                    if blocked != was_blocked {
                        if blocked {
                            tracing::warn!(sink = %self.name,
                                "RabbitMQ blocked the connection (memory or disk alarm): not claiming until it clears");
                        } else {
                            tracing::info!(sink = %self.name, "RabbitMQ unblocked the connection");
                        }
                        was_blocked = blocked;
                    }
                    gauge.set(i64::from(!blocked));
                    Duration::from_millis(250)
                }
                Err(ConnectError::Refused(refused)) => {
                    gauge.set(0);
                    return Err(refused);
                }
                Err(e) => {
                    gauge.set(0);
                    if let Some(unlogged) = failures.failed() {
                        if matches!(e, ConnectError::LoginRefused(_)) {
                            tracing::warn!(sink = %self.name, error = %e, failures = failures.count(),
                                unlogged, "RabbitMQ refused the bridge's login, retrying");
                        } else {
                            tracing::warn!(sink = %self.name, error = %e, failures = failures.count(),
                                unlogged, "RabbitMQ unreachable, retrying");
                        }
                    }
                    backoff.delay(failures.count())
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return Ok(()),
            }
        }
    }

    /// A publisher for one worker: a shared confirm-mode channel, after checking (passively)
    /// that the exchange it will publish to exists: a missing exchange is an operator's fix,
    /// so the worker does not claim (messages wait in Redis) rather than fail every message.
    pub async fn publisher(&self, route: &AmqpRoute) -> Result<AmqpPublisher, PublishError> {
        let conn = self.connection().await?;
        if conn.status().blocked() {
            return Err(PublishError::Blocked);
        }
        let mut pool = self.pool.lock().await;
        if !pool.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
            *pool = Pool {
                conn: Some(conn.clone()),
                ..Pool::default()
            };
        }
        let open = tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.checkout(&mut pool, &conn, &route.exchange),
        );
        let err = match open.await {
            Ok(Ok(Ok(channel))) => {
                return Ok(AmqpPublisher {
                    channel,
                    conn,
                    connector: self.connector.clone(),
                    route: route.clone(),
                    window: self.window.clone(),
                })
            }
            Ok(Ok(Err(missing))) => return Err(missing),
            Ok(Err(e)) => PublishError::Connection(e.to_string()),
            Err(_) => PublishError::Connection("opening a channel timed out".into()),
        };
        *pool = Pool::default();
        drop(pool);
        // A connection that cannot open a channel is as good as dead: drop it so the next
        // attempt reconnects, and report the sink down meanwhile.
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
            *guard = None;
            self.up.store(false, Ordering::Relaxed);
        }
        Err(err)
    }

    /// A connection of its own on the first node that answers (no topology declared), for a
    /// consumer: an ingress reads its queue apart from the publishers' connection.
    pub async fn consumer_connection(&self, purpose: &str) -> Result<Connection, String> {
        self.connector.open_private(purpose).await
    }

    /// Checks `exchange` unless it was seen on this connection, then gives a new channel
    /// while the pool has room, or else the next one in turn.
    async fn checkout(
        &self,
        pool: &mut Pool,
        conn: &Connection,
        exchange: &str,
    ) -> Result<Result<ConfirmChannel, PublishError>, lapin::Error> {
        let open = pool.channels.len();
        pool.channels.retain(ConfirmChannel::usable);
        if pool.channels.len() < open {
            pool.exchanges.clear();
        }
        if !exchange.is_empty() && !pool.exchanges.contains(exchange) {
            let probe = conn.create_channel().await?;
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let kind = ExchangeKind::Direct;
            match probe
                .exchange_declare(exchange, kind, passive, FieldTable::default())
                .await
            {
                Ok(()) => {
                    let _ = probe.close(200, "checked").await;
                    pool.exchanges.insert(exchange.to_string());
                }
                Err(lapin::Error::ProtocolError(e)) if e.get_id() == 404 => {
                    return Ok(Err(PublishError::NoExchange(exchange.to_string())));
                }
                Err(e) => return Err(e),
            }
        }
        if pool.channels.len() < self.channels {
            let channel = conn.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            let channel = ConfirmChannel::new(channel);
            pool.channels.push(channel.clone());
            return Ok(Ok(channel));
        }
        let channel = pool.channels[pool.next % pool.channels.len()].clone();
        pool.next = pool.next.wrapping_add(1);
        Ok(Ok(channel))
    }
}
