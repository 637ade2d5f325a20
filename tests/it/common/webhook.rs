//! A real HTTP endpoint on loopback for the HTTP sink's tests (axum, plain or TLS with the
//! test CA): it records every request and answers as the test says, and can go down and come
//! back on the same port.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

/// One request as the endpoint received it.
#[derive(Debug, Clone)]
pub struct Request {
    pub version: Version,
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Request {
    /// A header's value as text ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// What the endpoint answers to one request.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// Waits this long before answering (a hanging endpoint).
    pub delay: Duration,
}

impl Answer {
    /// `status` with an empty body, at once.
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
        }
    }

    /// With a body.
    pub fn body(mut self, body: &str) -> Self {
        self.body = body.to_string();
        self
    }

    /// With a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// After a wait.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// How the endpoint answers: given the request and how many times this body came before
/// (0 the first time).
pub type Script = Arc<dyn Fn(&Request, usize) -> Answer + Send + Sync>;

struct Shared {
    /// Requests being answered now, and the most there were at once.
    in_flight: Mutex<(usize, usize)>,
    received: Mutex<Vec<Request>>,
    seen: Mutex<HashMap<Vec<u8>, usize>>,
    script: Script,
}

/// The endpoint; stopped on drop.
pub struct Webhook {
    pub port: u16,
    tls: Option<Arc<rustls::ServerConfig>>,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Webhook {
    /// Serves plain HTTP on a free loopback port, answering by `script`.
    pub async fn start(script: impl Fn(&Request, usize) -> Answer + Send + Sync + 'static) -> Self {
        Self::serve(super::free_port(), None, Arc::new(script)).await
    }

    /// Answers 200 to everything.
    pub async fn ok() -> Self {
        Self::start(|_, _| Answer::status(200)).await
    }

    /// Serves HTTPS with the certificate `cert` and key `key` (PEM), offering HTTP/2 and
    /// HTTP/1.1 (ALPN).
    pub async fn start_tls(
        cert: &Path,
        key: &Path,
        script: impl Fn(&Request, usize) -> Answer + Send + Sync + 'static,
    ) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self::serve(super::free_port(), Some(Arc::new(config)), Arc::new(script)).await
    }

    async fn serve(port: u16, tls: Option<Arc<rustls::ServerConfig>>, script: Script) -> Self {
        let shared = Arc::new(Shared {
            in_flight: Mutex::default(),
            received: Mutex::default(),
            seen: Mutex::default(),
            script,
        });
        let me = Self {
            port,
            tls,
            shared,
            stop: CancellationToken::new(),
        };
        me.listen().await;
        me
    }

    async fn listen(&self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("bind the endpoint's port");
        let app = axum::Router::new()
            .fallback(record)
            .with_state(self.shared.clone());
        let stop = self.stop.clone();
        match &self.tls {
            None => {
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(stop.cancelled_owned())
                        .await;
                });
            }
            Some(config) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
                tokio::spawn(serve_tls(listener, acceptor, app, stop));
            }
        }
    }

    /// Stops listening and closes its connections: new connections are refused.
    pub async fn stop(&mut self) {
        self.stop.cancel();
        // The listener is dropped once the server task sees the cancellation.
        let port = self.port;
        super::wait_until(Duration::from_secs(5), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        })
        .await;
    }

    /// Listens again on the same port, with the same script and record.
    pub async fn resume(&mut self) {
        self.stop = CancellationToken::new();
        self.listen().await;
    }

    /// `http://127.0.0.1:PORT` (or `https://localhost:PORT`) followed by `path`.
    pub fn url(&self, path: &str) -> String {
        match self.tls {
            None => format!("http://127.0.0.1:{}{path}", self.port),
            Some(_) => format!("https://localhost:{}{path}", self.port),
        }
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Request> {
        self.shared.received.lock().unwrap().clone()
    }

    /// How many requests so far.
    pub fn count(&self) -> usize {
        self.shared.received.lock().unwrap().len()
    }

    /// The most requests the endpoint was answering at once.
    pub fn peak_in_flight(&self) -> usize {
        self.shared.in_flight.lock().unwrap().1
    }

    /// How many requests carried each body.
    pub fn tally(&self) -> HashMap<Vec<u8>, usize> {
        self.shared.seen.lock().unwrap().clone()
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn record(
    State(shared): State<Arc<Shared>>,
    version: Version,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = Request {
        version,
        method,
        path: uri.path().to_string(),
        headers,
        body: body.to_vec(),
        at: Instant::now(),
    };
    let before = {
        let mut seen = shared.seen.lock().unwrap();
        let n = seen.entry(received.body.clone()).or_default();
        *n += 1;
        *n - 1
    };
    let answer = (shared.script)(&received, before);
    shared.received.lock().unwrap().push(received);
    {
        let mut n = shared.in_flight.lock().unwrap();
        n.0 += 1;
        n.1 = n.1.max(n.0);
    }
    tokio::time::sleep(answer.delay).await;
    shared.in_flight.lock().unwrap().0 -= 1;
    let mut response = (
        StatusCode::from_u16(answer.status).unwrap(),
        answer.body.clone(),
    )
        .into_response();
    for (name, value) in &answer.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    response
}

/// HTTPS until `stop`: each connection's TLS handshake, then HTTP/2 or HTTP/1.1 as ALPN chose.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    stop: CancellationToken,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
            _ = stop.cancelled() => return,
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                .await;
        });
    }
}
