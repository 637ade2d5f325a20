//! HTTP for the bench: an endpoint on loopback that answers 204 and records what it received,
//! and the ceiling: the same HTTP client (reqwest) calling it directly, without the bridge.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use delay_bridge::wire::{HEADER_ATTEMPT, HEADER_DUE_MS, HEADER_ID, HEADER_TRIGGER};
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::amqp::toml_str;
use super::tally::{now_us, payload, Tally};

/// Requests in flight on the bench sink, and in the ceiling: the sink's default.
pub const CONCURRENCY: usize = 64;

/// The bench's endpoint.
pub struct HttpBench {
    url: String,
    stop: CancellationToken,
}

impl HttpBench {
    /// Serves the endpoint on a free loopback port, recording into `tally`.
    pub async fn setup(tally: Arc<Tally>) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the bench endpoint")?;
        let url = format!("http://{}/bench", listener.local_addr()?);
        let app = axum::Router::new().fallback(receive).with_state(tally);
        let stop = CancellationToken::new();
        let until = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(until)
                .await;
        });
        Ok(Self { url, stop })
    }

    /// The `[sinks.bench]` section for a bridge calling the endpoint.
    pub fn sink_toml(&self) -> String {
        format!("[sinks.bench]\ntype = \"http\"\nmax_concurrency = {CONCURRENCY}\n")
    }

    /// The route lines of a `[[triggers]]` entry calling the endpoint.
    pub fn route_toml(&self) -> String {
        format!("url = {}\n", toml_str(&self.url))
    }

    /// Stops the endpoint.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        self.stop.cancel();
        Ok(())
    }

    /// The ceiling: `count` requests from `base` on, `CONCURRENCY` at a time, from one
    /// pooled reqwest client, each POSTing a bench payload with the bridge's headers. Fails unless
    /// every one is answered 2xx; returns when sending started.
    pub async fn ceiling(
        &self,
        base: u64,
        count: u64,
        payload_bytes: usize,
        due_ms: i64,
    ) -> anyhow::Result<Instant> {
        let client = client()?;
        let started = Instant::now();
        post_all(&client, &self.url, base, count, payload_bytes, due_ms).await?;
        Ok(started)
    }

    /// The endpoint's URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// The ceiling's client: the sink's TLS setup (rustls with ring, the system's CAs, though
/// loopback is plain), one pool of `CONCURRENCY` connections, a user agent as long as the
/// bridge's.
pub fn client() -> anyhow::Result<reqwest::Client> {
    let tls = (*delay_bridge::parts::config::Tls::system().config()).clone();
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .pool_max_idle_per_host(CONCURRENCY)
        .tcp_nodelay(true)
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .user_agent(concat!("delay-bridge-bench/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// POSTs `count` bench payloads from `base` on to `url`, `CONCURRENCY` at a time, each with
/// the headers the bridge sends (trigger, due time, attempt, id, idempotency key), so that
/// the client and the endpoint handle the same requests as through the bridge; fails unless
/// every one is answered 2xx.
pub async fn post_all(
    client: &reqwest::Client,
    url: &str,
    base: u64,
    count: u64,
    payload_bytes: usize,
    due_ms: i64,
) -> anyhow::Result<()> {
    let ok = Arc::new(AtomicU64::new(0));
    let due = due_ms.to_string();
    let mut sent = futures_util::stream::iter(0..count)
        .map(|i| {
            let id = format!("{:016x}", base + i);
            let request = client
                .post(url)
                .header(HEADER_TRIGGER, "bench-0")
                .header(HEADER_DUE_MS, &due)
                .header(HEADER_ATTEMPT, "1")
                .header(HEADER_ID, &id)
                .header("idempotency-key", id)
                .body(payload(base + i, payload_bytes));
            let ok = ok.clone();
            async move {
                let answer = request.send().await?;
                if answer.status().is_success() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, reqwest::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY);
    while let Some(r) = sent.next().await {
        r.context("a request failed")?;
    }
    let ok = ok.load(Ordering::Relaxed);
    if ok != count {
        bail!("{ok} of {count} requests answered 2xx");
    }
    Ok(())
}

async fn receive(State(tally): State<Arc<Tally>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let at = now_us();
    let due = headers
        .get(HEADER_DUE_MS)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    tally.record(&body, due, at);
    StatusCode::NO_CONTENT
}
