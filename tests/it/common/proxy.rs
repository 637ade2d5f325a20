//! A loopback TCP proxy for fault injection: forward, cut every connection, or blackhole.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Reset every open connection and every new one: the peer is gone.
    Drop,
    /// Accept connections but forward nothing: bytes stay where they are (a blackhole, or a
    /// broker that stopped reading). Switching back to `Pass` delivers what was held.
    Stall,
    /// Forward what the client sends, hold what the server answers: a broker that takes
    /// every message while its confirmations are held on the way back.
    Mute,
}

/// A proxy listening on a loopback port, forwarding to `upstream`.
pub struct Proxy {
    addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    /// A mode to switch to once so many more bytes went upstream (see [`Proxy::set_after`]).
    trip: Arc<Mutex<Option<(Mode, usize)>>>,
    accepted: Arc<AtomicUsize>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding to `upstream` (e.g. `127.0.0.1:5672`) from a free port.
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::start_on(0, upstream).await
    }

    /// Starts forwarding to `upstream` from `port`: lets a test make a server appear on a port
    /// a client already knows.
    pub async fn start_on(port: u16, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("proxy port is free");
        let addr = listener.local_addr().unwrap();
        let (mode, rx) = watch::channel(Mode::Pass);
        let mode = Arc::new(mode);
        let trip: Arc<Mutex<Option<(Mode, usize)>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let (switch, tripped) = (mode.clone(), trip.clone());
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                if *rx.borrow() == Mode::Drop {
                    reset(&client);
                    continue;
                }
                let trip = Trip {
                    mode: switch.clone(),
                    at: tripped.clone(),
                };
                tokio::spawn(connection(client, upstream, rx.clone(), trip));
            }
        });
        Self {
            addr,
            mode,
            trip,
            accepted,
            accept_task,
        }
    }

    /// The port clients should connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `url` (a Redis or AMQP URL) with its port replaced by the proxy's and its query by
    /// `query` (none if empty).
    pub fn url(&self, url: &str, query: &str) -> String {
        let mut url = url::Url::parse(url).unwrap();
        url.set_port(Some(self.port())).unwrap();
        url.set_query((!query.is_empty()).then_some(query));
        url.to_string()
    }

    /// Switches every connection, open or future, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Switches to `mode` by itself once `bytes` more went from the clients to the server
    /// (over every connection): the fault lands mid-stream however fast the client is and
    /// however late the test runs. The chunk that crosses the mark is held or cut with the rest.
    pub fn set_after(&self, mode: Mode, bytes: usize) {
        *self.trip.lock().unwrap() = Some((mode, bytes));
    }

    /// Resolves once the mode is `mode`.
    pub async fn reached(&self, mode: Mode) {
        let mut rx = self.mode.subscribe();
        let _ = rx.wait_for(|m| *m == mode).await;
    }

    /// Connections accepted so far (refused ones included): shows that a client reconnected.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        // Every connection task watches the mode channel; dropping the last sender ends them,
        // but reset them first so clients notice at once.
        self.mode.send_replace(Mode::Drop);
    }
}

/// Closes with RST rather than FIN: a cut cable, not a polite goodbye.
// The deprecation warns that a lingering close blocks the thread; a zero linger never does.
#[allow(deprecated)]
fn reset(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Waits until bytes may flow in this direction (`upstream`: from the client to the server):
/// true, or false on `Drop` or the proxy gone.
async fn wait_pass(mode: &mut watch::Receiver<Mode>, upstream: bool) -> bool {
    loop {
        match *mode.borrow_and_update() {
            Mode::Pass => return true,
            Mode::Mute if upstream => return true,
            Mode::Drop => return false,
            Mode::Stall | Mode::Mute => {}
        }
        if mode.changed().await.is_err() {
            return false;
        }
    }
}

/// A switch of the mode that a connection's upstream bytes pull (see [`Proxy::set_after`]).
#[derive(Clone)]
struct Trip {
    mode: Arc<watch::Sender<Mode>>,
    at: Arc<Mutex<Option<(Mode, usize)>>>,
}

impl Trip {
    /// Counts `n` bytes going upstream; switches the mode once the mark is passed.
    fn count(&self, n: usize) {
        let mut at = self.at.lock().unwrap();
        if let Some((mode, left)) = *at {
            if n >= left {
                *at = None;
                self.mode.send_replace(mode);
            } else {
                *at = Some((mode, left - n));
            }
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    trip: Trip,
) {
    // A connection accepted during a stall is held before it even reaches the upstream.
    if !wait_pass(&mut mode, false).await {
        reset(&client);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_rd, mut client_wr) = client.into_split();
    let (server_rd, mut server_wr) = server.into_split();
    let dropped = tokio::select! {
        d = pump(client_rd, &mut server_wr, mode.clone(), Some(&trip)) => d,
        d = pump(server_rd, &mut client_wr, mode.clone(), None) => d,
    };
    if dropped {
        reset(client_wr.as_ref());
        reset(server_wr.as_ref());
    }
}

/// Copies `from` into `to` (upstream, client to server, when it counts for a `trip`) while the
/// mode allows; returns true when cut by `Drop`, false when a side closed by itself.
async fn pump(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    trip: Option<&Trip>,
) -> bool {
    let upstream = trip.is_some();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !wait_pass(&mut mode, upstream).await {
            return true;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return true;
                }
                continue;
            }
        };
        if let Some(trip) = trip {
            trip.count(n);
        }
        // Bytes read just before a stall are held, not forwarded, until it ends.
        if !wait_pass(&mut mode, upstream).await {
            return true;
        }
        tokio::select! {
            r = to.write_all(&buf[..n]) => if r.is_err() {
                return false;
            },
            _ = wait_drop(mode.clone()) => return true,
        }
    }
}

/// Resolves once the mode is `Drop` or the proxy is gone.
async fn wait_drop(mut mode: watch::Receiver<Mode>) {
    loop {
        if *mode.borrow_and_update() == Mode::Drop {
            return;
        }
        if mode.changed().await.is_err() {
            return;
        }
    }
}
