//! Opening connections to a sink's nodes: the sink's shared connection and the publishers'
//! own short-lived ones, plain or TLS, each within a deadline.

use std::time::Duration;

use lapin::tcp::{HandshakeError, RustlsConnector, TcpStream};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};

use super::nodes::{Node, Nodes};
use super::topology::{self, DeclareError};
use crate::tls::Tls;

use super::CONNECT_TIMEOUT;

/// What opens connections to a sink's nodes: the sink's shared connection, and the
/// publishers' own short-lived one when they isolate a message that made the broker close a
/// connection (so that finding the culprit does not cut every trigger's publishing again).
pub(super) struct Connector {
    pub(super) name: String,
    pub(super) nodes: Nodes,
    /// How `amqps://` addresses verify the broker and identify the bridge.
    pub(super) tls: Tls,
}

impl Connector {
    /// Opens the AMQP connection to one node: plain, or TLS with the sink's settings (the
    /// certificate checked against `tls.server_name` or the address's host). The socket is
    /// ours: connected and handshaken within [`CONNECT_TIMEOUT`], to the host as the URL
    /// writes it (IPv6 literals included), then handed to lapin non-blocking.
    pub(super) async fn connect(
        &self,
        node: &Node,
        purpose: &str,
    ) -> Result<Connection, DeclareError> {
        let props = ConnectionProperties::default()
            .with_executor(tokio_executor_trait::Tokio::current())
            .with_reactor(tokio_reactor_trait::Tokio)
            .with_connection_name(format!("delay-bridge/{}{purpose}", self.name).into());
        let uri: AMQPUri = node
            .url
            .parse()
            .map_err(|e| DeclareError::Failed(format!("not an AMQP URI: {e}")))?;
        let host = url::Url::parse(&node.url)
            .ok()
            .and_then(|u| match u.host()? {
                url::Host::Domain(d) => Some(d.to_string()),
                url::Host::Ipv4(ip) => Some(ip.to_string()),
                url::Host::Ipv6(ip) => Some(ip.to_string()),
            })
            .ok_or_else(|| DeclareError::Failed("the URL has no host".into()))?;
        let port = uri.authority.port;
        let tls = (uri.scheme == AMQPScheme::AMQPS).then(|| {
            (
                RustlsConnector::from(self.tls.config()),
                self.tls.name_for(&host).to_string(),
            )
        });
        let is_tls = tls.is_some();
        // lapin's connector takes this result type as it is, large error variant included.
        #[allow(clippy::result_large_err)]
        let connect = move |_: &AMQPUri| {
            let stream =
                connect_within(&host, port, CONNECT_TIMEOUT).map_err(HandshakeError::Failure)?;
            let stream = match tls {
                Some((connector, name)) => {
                    handshake_within(stream.into_rustls(&connector, &name), CONNECT_TIMEOUT)?
                }
                None => stream,
            };
            // lapin's reactor needs a non-blocking socket without timeouts.
            let ready = |s: &TcpStream| {
                s.set_read_timeout(None)?;
                s.set_write_timeout(None)?;
                s.set_nonblocking(true)
            };
            ready(&stream).map_err(HandshakeError::Failure)?;
            Ok(stream)
        };
        let hint = if !is_tls {
            ""
        } else if self.tls.has_client_certificate() {
            " (TLS)"
        } else {
            " (TLS; if the broker requires client certificates, set tls.cert_file and tls.key_file)"
        };
        Connection::connector(uri, Box::new(connect), props)
            .await
            .map_err(|e| match e {
                lapin::Error::IOError(_) => DeclareError::Failed(format!("{e}{hint}")),
                // A refused login (the broker's 403 on connection.open, or the connection
                // closed during the handshake with ACCESS_REFUSED) is no outage: say so.
                e if e.to_string().contains("ACCESS_REFUSED") => DeclareError::LoginRefused(format!(
                    "the broker refused the login ({e}): check the user and password (or password_file) and \
                     the user's permissions on the vhost"
                )),
                e => topology::failed(e),
            })
    }

    /// A connection of its own (no topology declared: the shared connection did that), on
    /// the first node that answers within [`CONNECT_TIMEOUT`].
    pub(super) async fn open_private(&self, purpose: &str) -> Result<Connection, String> {
        let mut failures = Vec::new();
        for (_, node) in self.nodes.round() {
            match tokio::time::timeout(CONNECT_TIMEOUT, self.connect(node, purpose)).await {
                Ok(Ok(conn)) => return Ok(conn),
                Ok(Err(DeclareError::Failed(e) | DeclareError::LoginRefused(e))) => {
                    failures.push(format!("{}: {e}", node.shown))
                }
                Ok(Err(DeclareError::Refused(e))) => failures.push(format!("{}: {e}", node.shown)),
                Err(_) => {
                    failures.push(format!("{}: no answer in {CONNECT_TIMEOUT:?}", node.shown))
                }
            }
        }
        Err(failures.join("; "))
    }
}

/// A blocking TCP connection to the first address of `host:port` that answers within
/// `timeout`, with `timeout` on reads and writes (the TLS handshake runs on it).
fn connect_within(host: &str, port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for addr in (host, port).to_socket_addrs()? {
        match std::net::TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                return TcpStream::from_std(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            "the host has no address",
        )
    }))
}

/// Drives a TLS handshake on a socket with read and write timeouts to its end, or fails
/// once `timeout` has passed (a timed-out read shows as "would block").
#[allow(clippy::result_large_err)]
fn handshake_within(
    mut result: Result<TcpStream, HandshakeError>,
    timeout: Duration,
) -> Result<TcpStream, HandshakeError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match result {
            Ok(stream) => return Ok(stream),
            Err(HandshakeError::WouldBlock(mid)) if std::time::Instant::now() < deadline => {
                result = mid.handshake();
            }
            Err(HandshakeError::WouldBlock(_)) => {
                return Err(HandshakeError::Failure(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("TLS handshake not done within {timeout:?}"),
                )))
            }
            Err(e) => return Err(e),
        }
    }
}
