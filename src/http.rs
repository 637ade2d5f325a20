//! The HTTP endpoint: `/metrics`, `/healthz` (alive) and `/readyz` (Redis and every sink connected).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
}

/// Binds `addr` (fails at start if it is taken) and serves until `stop`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    health: Health,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(listen = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, health });
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
