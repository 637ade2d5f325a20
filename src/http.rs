//! The HTTP endpoint: `/metrics`, `/healthz` (alive) and `/readyz` (Redis and every sink connected).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::sink::Sink;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    sinks: Arc<Vec<Arc<Sink>>>,
}

/// Binds `addr` (fails at start if it is taken) and serves until `stop`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    sinks: Vec<Arc<Sink>>,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(listen = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler))
        .with_state(AppState {
            metrics,
            sinks: Arc::new(sinks),
        });
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    }))
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    // Readiness is read live; make the gauge agree with it at scrape time.
    for sink in state.sinks.iter() {
        state
            .metrics
            .sink_up
            .with_label_values(&[sink.name()])
            .set(i64::from(sink.is_up()));
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

async fn ready_handler(State(state): State<AppState>) -> impl IntoResponse {
    let mut reasons = Vec::new();
    if state.metrics.redis_up.get() != 1 {
        reasons.push("redis: not connected".to_string());
    }
    for sink in state.sinks.iter() {
        if !sink.is_up() {
            reasons.push(format!("sink {}: not connected", sink.name()));
        }
    }
    if reasons.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, reasons.join("\n") + "\n")
    }
}
