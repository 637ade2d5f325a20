//! The endpoints of an HTTP sink that are down (refusing connections, or not finishing a connection or its TLS handshake in time) or asked the bridge to wait (`Retry-After`), keyed by the URL as configured now, and the probes that find them up again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;

/// How long one probe may take (TCP, and TLS for `https`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest `Retry-After` honoured.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Where a probe connects, and whether it does the TLS handshake.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// The host (without brackets for IPv6).
    host: String,
    port: u16,
    tls: bool,
}

impl Target {
    /// The target of `url`, if it has a host and a port.
    pub(super) fn of(url: &str) -> Option<Self> {
        let u = url::Url::parse(url).ok()?;
        let host = u.host_str()?.trim_start_matches('[').trim_end_matches(']');
        Some(Self {
            host: host.to_string(),
            port: u.port_or_known_default()?,
            tls: u.scheme() == "https",
        })
    }
}

/// An endpoint that failed to connect for a whole batch.
struct Down {
    target: Target,
    /// What the last request to it failed with.
    why: String,
}

/// The endpoints down, by URL.
pub(super) struct Endpoints {
    down: Mutex<BTreeMap<String, Down>>,
    /// Endpoints that asked the bridge to wait (`Retry-After`), until when.
    waits: Mutex<BTreeMap<String, Instant>>,
    /// The URLs routes name since the last reload (`None`: as started, any): a batch of a
    /// replaced trigger that ends after the reload marks nothing down.
    current: Mutex<Option<BTreeSet<String>>>,
    /// The sink's TLS configuration, for the probes' handshakes.
    tls: Arc<rustls::ClientConfig>,
}

impl Endpoints {
    pub(super) fn new(tls: Arc<rustls::ClientConfig>) -> Self {
        Self {
            down: Mutex::default(),
            waits: Mutex::default(),
            current: Mutex::default(),
            tls,
        }
    }

    /// The map (a poisoned lock still holds a usable one).
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Down>> {
        self.down.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_waits(&self) -> MutexGuard<'_, BTreeMap<String, Instant>> {
        self.waits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `url` asked the bridge to wait `d` (at most [`MAX_RETRY_AFTER`]) before it calls again.
    pub(super) fn wait(&self, url: &str, d: Duration) {
        let until = Instant::now() + d.min(MAX_RETRY_AFTER);
        let mut waits = self.lock_waits();
        let at = waits.entry(url.to_string()).or_insert(until);
        *at = (*at).max(until);
    }

    /// How long `url` still asked the bridge to wait, if it did.
    pub(super) fn waiting(&self, url: &str) -> Option<Duration> {
        let mut waits = self.lock_waits();
        let left = waits
            .get(url)
            .map(|until| until.saturating_duration_since(Instant::now()));
        match left {
            Some(d) if d.is_zero() => {
                waits.remove(url);
                None
            }
            left => left,
        }
    }

    /// Whether no endpoint is down.
    pub(super) fn none_down(&self) -> bool {
        self.lock().is_empty()
    }

    /// Why `url` is down, if it is.
    pub(super) fn why(&self, url: &str) -> Option<String> {
        self.lock().get(url).map(|d| d.why.clone())
    }

    /// Whether `url` is down.
    pub(super) fn is_down(&self, url: &str) -> bool {
        self.lock().contains_key(url)
    }

    /// The endpoints down and why, for `/readyz`.
    pub(super) fn describe(&self) -> String {
        let all: Vec<String> = self
            .lock()
            .iter()
            .map(|(url, d)| format!("endpoint {url} unreachable: {}", d.why))
            .collect();
        all.join("; ")
    }

    /// Marks `url` down because of `why`; true when it was not down before.
    pub(super) fn mark(&self, url: &str, why: String) -> bool {
        let Some(target) = Target::of(url) else {
            return false;
        };
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|urls| !urls.contains(url)) {
            return false;
        }
        self.lock()
            .insert(url.to_string(), Down { target, why })
            .is_none()
    }

    /// Forgets the endpoints no route uses any more (after a reload changed them): the
    /// state of an endpoint is that of the endpoint as configured now.
    pub(super) fn retain(&self, urls: &BTreeSet<&str>) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        *current = Some(urls.iter().map(|u| u.to_string()).collect());
        self.lock().retain(|url, _| urls.contains(url.as_str()));
        self.lock_waits()
            .retain(|url, _| urls.contains(url.as_str()));
    }

    /// Tries every endpoint down once; those that connect (and finish the TLS handshake)
    /// are up again. Returns their URLs.
    pub(super) async fn probe(&self) -> Vec<String> {
        let targets: Vec<(String, Target)> = self
            .lock()
            .iter()
            .map(|(url, d)| (url.clone(), d.target.clone()))
            .collect();
        let mut up = Vec::new();
        for (url, target) in targets {
            let connected = tokio::time::timeout(PROBE_TIMEOUT, connect(&target, &self.tls))
                .await
                .is_ok_and(|ok| ok);
            if connected && self.lock().remove(&url).is_some() {
                up.push(url);
            }
        }
        up
    }
}

/// Whether `target` accepts a connection, and finishes the TLS handshake if it has TLS.
async fn connect(target: &Target, tls: &Arc<rustls::ClientConfig>) -> bool {
    let Ok(tcp) = tokio::net::TcpStream::connect((target.host.as_str(), target.port)).await else {
        return false;
    };
    if !target.tls {
        return true;
    }
    let Ok(name) = ServerName::try_from(target.host.clone()) else {
        return false;
    };
    tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .is_ok()
}
