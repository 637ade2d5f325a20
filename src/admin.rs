//! The admin API and console: JSON on its own listener, bearer-token authenticated, audited and counted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio_util::sync::CancellationToken;

use crate::config::{AdminConfig, Trigger};
use crate::metrics::Metrics;
use crate::redis::store::StoreError;

mod extract;
mod history;
mod json;
mod reads;
mod routes;
mod schedules;

pub(crate) use history::History;

/// One trigger as the admin API sees it.
#[derive(Clone)]
pub(crate) struct AdminTrigger {
    /// Its configuration (name, key, sink, payload mode, rate limit).
    pub config: std::sync::Arc<Trigger>,
    /// Its queue over its shards.
    pub queue: crate::redis::queue::Queue,
}

/// The triggers the admin API serves, replaced when the configuration is reloaded; none
/// until the bridge has reached Redis and started them.
#[derive(Clone, Default)]
pub(crate) struct AdminTriggers(Arc<RwLock<Option<Served>>>);

/// The triggers served at one time, by name.
type Served = Arc<BTreeMap<String, AdminTrigger>>;

impl AdminTriggers {
    /// Serves `triggers` from now on.
    pub(crate) fn replace(&self, triggers: BTreeMap<String, AdminTrigger>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(triggers));
    }

    /// The triggers, or 503 while the bridge is starting (Redis not reached yet).
    fn now(&self) -> Result<Served, ApiError> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                ApiError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the bridge is starting: its triggers run once Redis answers (see /readyz)"
                        .into(),
                )
            })
    }
}

/// What every handler shares.
#[derive(Clone)]
struct Admin {
    triggers: AdminTriggers,
    /// Asks the bridge to reload its configuration.
    reload: Option<Arc<tokio::sync::Notify>>,
    token: Option<Arc<str>>,
    read_only: bool,
    metrics: Metrics,
    /// Host names besides IP addresses and `localhost` that requests may name.
    allowed_hosts: Arc<[String]>,
    /// Each trigger's last hour, sampled every 10 s.
    history: History,
}

/// An error answered as `{"error": "..."}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError(StatusCode, String);

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, message.into())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match e.kind() {
            "connection" | "timeout" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self(status, format!("redis: {e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

/// Binds `config.listen` (an error at start if it is taken) and serves the API until `stop`.
pub(crate) async fn serve(
    config: &AdminConfig,
    triggers: AdminTriggers,
    reload: Option<Arc<tokio::sync::Notify>>,
    metrics: Metrics,
    stop: CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = config.listen else {
        return Ok(None);
    };
    let history = History::default();
    history.spawn(triggers.clone(), metrics.clone(), stop.clone());
    let admin = Admin {
        history,
        triggers,
        reload,
        token: config.token()?.map(Arc::from),
        read_only: config.read_only,
        metrics,
        allowed_hosts: config
            .allowed_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(listen = %listener.local_addr()?, read_only = admin.read_only,
        "serving the admin API under /api/v1");
    let app = routes::router()
        .layer(axum::middleware::from_fn_with_state(admin.clone(), guard))
        .with_state(admin);
    Ok(Some(tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    })))
}

/// Every request: the bearer token (when one is configured), then read-only mode for
/// anything but GET; refusals are counted and logged like the calls themselves.
async fn guard(
    State(admin): State<Admin>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let action = action_of(&request);
    if !admin.host_allowed(&request) {
        admin.count(&action, StatusCode::MISDIRECTED_REQUEST);
        tracing::warn!(target: "delay_bridge::audit", %peer, action, "refused: Host not allowed");
        return secure(
            ApiError(
                StatusCode::MISDIRECTED_REQUEST,
                "this Host is not one the admin API answers to: add it to admin.allowed_hosts"
                    .into(),
            )
            .into_response(),
            true,
        );
    }
    let api = request.uri().path().starts_with("/api/");
    secure(checked(admin, peer, action, request, next).await, api)
}

/// The token and read-only checks, then the call.
async fn checked(
    admin: Admin,
    peer: SocketAddr,
    action: String,
    request: Request,
    next: Next,
) -> Response {
    // The console's page holds no data: it asks for the token and sends it with each call.
    let page = request.method() == Method::GET && routes::is_console(request.uri().path());
    if let Some(token) = admin.token.as_ref().filter(|_| !page) {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
            admin.count(&action, StatusCode::UNAUTHORIZED);
            tracing::warn!(target: "delay_bridge::audit", %peer, action, "refused: no valid bearer token");
            let mut response = ApiError(
                StatusCode::UNAUTHORIZED,
                "send `Authorization: Bearer TOKEN` with the admin token".into(),
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
            return response;
        }
    }
    if request.method() != Method::GET && admin.read_only {
        admin.count(&action, StatusCode::FORBIDDEN);
        return ApiError(
            StatusCode::FORBIDDEN,
            "the admin API is read-only (admin.read_only = true)".into(),
        )
        .into_response();
    }
    let response = next.run(request).await;
    admin.count(&action, response.status());
    response
}

/// The headers every response carries: no framing, no sniffing, no referrer, no inline
/// script (the console's script and style are files of their own); API replies are never
/// cached.
fn secure(mut response: Response, api: bool) -> Response {
    let h = response.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, name, value: &'static str| {
        h.insert(name, header::HeaderValue::from_static(value));
    };
    set(h, header::CONTENT_SECURITY_POLICY, CSP);
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::REFERRER_POLICY, "no-referrer");
    if api {
        set(h, header::CACHE_CONTROL, "no-store");
    }
    response
}

/// The console loads its own script, style and API calls, nothing else, and is never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
    img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The `Host` a request names (without port), lowercased; `None` without one.
fn host_of(request: &Request) -> Option<String> {
    let raw = match request.headers().get(header::HOST) {
        Some(v) => v.to_str().ok()?.to_string(),
        None => request.uri().authority()?.as_str().to_string(),
    };
    let authority: axum::http::uri::Authority = raw.parse().ok()?;
    Some(authority.host().to_ascii_lowercase())
}

/// A bounded label for a request: the last path segment that names an action, or `read`.
fn action_of(request: &Request) -> String {
    if request.method() == Method::GET {
        return "read".into();
    }
    let last = request.uri().path().rsplit('/').next().unwrap_or_default();
    match last {
        "pause" | "resume" | "promote" | "reschedule" | "cancel" | "purge" | "requeue"
        | "reload" => last.into(),
        _ => "other".into(),
    }
}

/// Compares in time that depends on the lengths only, not on where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Admin {
    /// An IP address (as the listen address is), `localhost`, or a configured name: a name
    /// an attacker's DNS can point at this address is not among them.
    fn host_allowed(&self, request: &Request) -> bool {
        let Some(host) = host_of(request) else {
            return false;
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<std::net::IpAddr>().is_ok()
            || host == "localhost"
            || self.allowed_hosts.contains(&host)
    }

    fn count(&self, action: &str, status: StatusCode) {
        self.metrics
            .admin_requests
            .with_label_values(&[action, status.as_str()])
            .inc();
    }

    /// This bridge's forwarded count for `t` since start, and the 99th percentile of its
    /// lateness (the upper bound of the histogram bucket it falls in; `None` before the
    /// first message).
    fn delivery(&self, t: &Trigger) -> (u64, Option<f64>) {
        let forwarded = self
            .metrics
            .triggers
            .cells(t.name(), t.sink())
            .forwarded
            .load(std::sync::atomic::Ordering::Relaxed);
        let lateness = self.metrics.lateness.with_label_values(&[t.name()]);
        let proto = prometheus::core::Metric::metric(&lateness);
        let h = proto.get_histogram();
        let count = h.get_sample_count();
        let p99 = (count > 0).then(|| {
            let rank = (count as f64 * 0.99).ceil() as u64;
            h.get_bucket()
                .iter()
                .find(|b| b.cumulative_count() >= rank)
                .map_or(f64::INFINITY, |b| b.upper_bound())
        });
        (forwarded, p99)
    }

    fn trigger(&self, name: &str) -> Result<AdminTrigger, ApiError> {
        self.triggers
            .now()?
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no trigger named `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeg"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!same(b"", b"x"));
    }
}
