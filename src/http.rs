//! The HTTP endpoint: `/metrics`, `/healthz` (alive), `/readyz` (Redis and every sink
//! connected) and at `/` a page that links them.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
    /// The page at `/`, made once.
    landing: Arc<str>,
}

/// Binds `addr` (fails at start if it is taken) and serves until `stop`. `admin` is the
/// admin API's address, if it is enabled: the page at `/` says where it is.
pub(crate) async fn serve(
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    metrics: Metrics,
    health: Health,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(listen = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    let landing = landing_page(admin).into();
    let app = Router::new()
        .route("/", get(landing_handler))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler))
        .with_state(AppState {
            metrics,
            health,
            landing,
        });
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    }))
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    // Readiness is read live; make the gauges agree with it at scrape time.
    state.health.mirror_sinks();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

async fn landing_handler(State(state): State<AppState>) -> impl IntoResponse {
    Html(state.landing.to_string())
}

async fn ready_handler(State(state): State<AppState>) -> impl IntoResponse {
    match state.health.readiness() {
        Ok(()) => {
            let mut lines = vec!["ready".to_string()];
            lines.extend(state.health.notes());
            (StatusCode::OK, lines.join("\n") + "\n")
        }
        Err(mut reasons) => {
            reasons.extend(state.health.notes());
            (StatusCode::SERVICE_UNAVAILABLE, reasons.join("\n") + "\n")
        }
    }
}

/// A small HTML page: the version and revision, the endpoints, and the admin API's address.
fn landing_page(admin: Option<SocketAddr>) -> String {
    let admin = match admin {
        Some(addr) => format!(
            "<p>Admin API and console: listening on <code>{addr}</code> (the console at <code>/console</code> of that address).</p>"
        ),
        None => "<p>Admin API: not enabled (<code>[admin] listen</code> unset).</p>".to_string(),
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>delay-bridge</title></head>\n\
         <body>\n<h1>delay-bridge {version}</h1>\n<p>Revision <code>{revision}</code>.</p>\n<ul>\n\
         <li><a href=\"metrics\">/metrics</a>: Prometheus metrics</li>\n\
         <li><a href=\"healthz\">/healthz</a>: alive</li>\n\
         <li><a href=\"readyz\">/readyz</a>: ready (Redis and every sink connected)</li>\n\
         </ul>\n{admin}\n</body></html>\n",
        version = env!("CARGO_PKG_VERSION"),
        revision = crate::metrics::REVISION,
    )
}
