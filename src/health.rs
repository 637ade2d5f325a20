//! Readiness: whether Redis answers and every sink is connected, and which triggers are
//! paused or held; the `redis_up` and `sink_up` gauges mirror it. The HTTP endpoint shows it:
//! `/metrics`, `/healthz` (alive), `/readyz` (ready, or why not) and at `/` a page that links
//! them.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::redis::notify;
use crate::repeat::Repeated;
use crate::sink::Sink;

/// Shared readiness state (cheap to clone).
#[derive(Clone)]
pub(crate) struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    redis: AtomicBool,
    /// Keyspace notifications are subscribed to and reach the bridge.
    notifications: AtomicBool,
    /// Every configured trigger has started (its keys taken, its workers running).
    started: AtomicBool,
    /// Calls that failed for want of Redis since it last answered, from every worker of
    /// every trigger: one outage is logged here, at growing gaps, not once per caller.
    outage: Mutex<Repeated>,
    /// Triggers an operator has paused: still ready, but `/readyz` says so.
    paused: Mutex<std::collections::BTreeSet<String>>,
    /// Triggers whose own destination is held (missing, refusing, unreachable): trigger ->
    /// what the broker or endpoint said. Not ready: an operator must fix the destination.
    held: Mutex<std::collections::BTreeMap<String, String>>,
    /// Ingresses not consuming (starting, the broker away, Redis not taking their writes):
    /// trigger -> (the ingress instance that said so, why). Not ready: producers' messages
    /// wait at the broker.
    ingress_stopped: Mutex<std::collections::BTreeMap<String, (u64, String)>>,
    sinks: Vec<Arc<Sink>>,
    metrics: Metrics,
    /// Where Redis is: in sentinel mode `/readyz` names the current master.
    redis_endpoint: Mutex<Option<Arc<crate::redis::conn::Endpoint>>>,
}

impl Health {
    /// Not ready until Redis has answered; `sinks` report their own connection state.
    pub(crate) fn new(metrics: &Metrics, sinks: Vec<Arc<Sink>>) -> Self {
        metrics.redis_up.set(0);
        for sink in &sinks {
            metrics.sink_up.with_label_values(&[sink.name()]).set(0);
        }
        Self {
            inner: Arc::new(Inner {
                redis: AtomicBool::new(false),
                notifications: AtomicBool::new(false),
                started: AtomicBool::new(false),
                outage: Mutex::default(),
                paused: Mutex::default(),
                held: Mutex::default(),
                ingress_stopped: Mutex::default(),
                sinks,
                metrics: metrics.clone(),
                redis_endpoint: Mutex::default(),
            }),
        }
    }

    /// True while keyspace notifications are subscribed to: idle workers may sleep longer.
    pub(crate) fn notifications_live(&self) -> bool {
        self.inner.notifications.load(Ordering::Relaxed)
    }

    /// Redis answered a call. The first answer after an outage logs its end.
    pub(crate) fn redis_answered(&self) {
        if !self.inner.redis.swap(true, Ordering::Relaxed) {
            self.inner.metrics.redis_up.set(1);
            if let Some(failures) = self.lock_outage().recovered() {
                tracing::info!(failed_calls = failures, "Redis is answering again");
            }
        }
    }

    /// A call failed for want of Redis (connection lost, timed out): logged here for all
    /// callers, the first failure at once, then at growing gaps with a count.
    pub(crate) fn redis_unreachable(&self, error: &dyn Display) {
        self.inner.redis.store(false, Ordering::Relaxed);
        self.inner.metrics.redis_up.set(0);
        let mut outage = self.lock_outage();
        if let Some(unlogged) = outage.failed() {
            tracing::warn!(%error, failed_calls = outage.count(), unlogged,
                "Redis unreachable or not answering in time; claims wait and retry with backoff");
        }
    }

    fn lock_outage(&self) -> std::sync::MutexGuard<'_, Repeated> {
        // Nothing half-updated in a counter matters after a panic elsewhere.
        self.inner.outage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True while Redis answers.
    pub(crate) fn redis_up(&self) -> bool {
        self.inner.redis.load(Ordering::Relaxed)
    }

    /// Notes whether `trigger` is paused; `true` when that changed.
    pub(crate) fn set_paused(&self, trigger: &str, paused: bool) -> bool {
        let mut set = self.inner.paused.lock().unwrap_or_else(|e| e.into_inner());
        if paused {
            set.insert(trigger.to_string())
        } else {
            set.remove(trigger)
        }
    }

    /// `trigger`'s own destination is held (`why`: what the broker or endpoint said):
    /// `/readyz` names it, with the latest words (the trigger's hold logs the start).
    pub(crate) fn hold(&self, trigger: &str, sink: &str, why: &str) {
        let line = format!("held: sink {sink}: {why}");
        self.lock_held().insert(trigger.to_string(), line);
    }

    /// `trigger`'s destination takes messages again (or the trigger is gone).
    pub(crate) fn release(&self, trigger: &str) {
        self.lock_held().remove(trigger);
    }

    /// The held triggers, by name, with what `/readyz` says of each.
    pub(crate) fn held(&self) -> std::collections::BTreeMap<String, String> {
        self.lock_held().clone()
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, String>> {
        self.inner.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The readiness of a new ingress of `trigger` (not consuming yet: "starting"). A reload
    /// starts another for the same trigger: each clears only what it said itself.
    pub(crate) fn ingress(&self, trigger: &str) -> IngressReadiness {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        let ingress = IngressReadiness {
            health: self.clone(),
            trigger: trigger.to_string(),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
        };
        ingress.stopped("starting");
        ingress
    }

    /// `trigger`'s ingress `instance` does not consume (`why`: starting, the broker, Redis
    /// refused or failed its write); `None`: it consumes, or it ended. An instance clears
    /// only what it said itself: the one that replaced it on a reload keeps its word.
    fn set_ingress_stopped(&self, trigger: &str, instance: u64, why: Option<&str>) {
        let mut stopped = self
            .inner
            .ingress_stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match why {
            Some(why) => {
                stopped.insert(trigger.to_string(), (instance, why.to_string()));
            }
            None => {
                if stopped.get(trigger).is_some_and(|(i, _)| *i == instance) {
                    stopped.remove(trigger);
                }
            }
        }
    }

    /// Where Redis is, for `/readyz` to name the master the sentinels chose.
    pub(crate) fn redis_at(&self, endpoint: Arc<crate::redis::conn::Endpoint>) {
        *self
            .inner
            .redis_endpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(endpoint);
    }

    /// In sentinel mode `redis: master NAME at HOST:PORT`; then the paused triggers, one
    /// `trigger NAME: paused` line each (a paused trigger is still ready: the bridge works, an
    /// operator holds the queue).
    pub(crate) fn notes(&self) -> Vec<String> {
        let endpoint = self
            .inner
            .redis_endpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let master = endpoint.and_then(|e| e.sentinel_master());
        let set = self.inner.paused.lock().unwrap_or_else(|e| e.into_inner());
        master
            .map(|m| format!("redis: {m}"))
            .into_iter()
            .chain(set.iter().map(|t| format!("trigger {t}: paused")))
            .collect()
    }

    /// Every configured trigger has started: from now on, readiness is the connections'.
    pub(crate) fn triggers_started(&self) {
        self.inner.started.store(true, Ordering::Relaxed);
    }

    /// `Ok` when ready, else what is not, one reason per line.
    pub(crate) fn readiness(&self) -> Result<(), Vec<String>> {
        let mut reasons = Vec::new();
        if !self.redis_up() {
            reasons.push("redis: not connected".to_string());
        } else if !self.inner.started.load(Ordering::Relaxed) {
            reasons.push("triggers: starting".to_string());
        }
        for sink in &self.inner.sinks {
            if !sink.is_up() {
                reasons.push(format!("sink {}: {}", sink.name(), sink.why_down()));
            }
        }
        for (trigger, line) in self.held() {
            reasons.push(format!("trigger {trigger}: {line}"));
        }
        let stopped = self
            .inner
            .ingress_stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (trigger, (_, why)) in stopped.iter() {
            reasons.push(format!("trigger {trigger}: ingress not consuming ({why})"));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }

    /// Makes the sink gauges agree with the sinks' state (read live at scrape time).
    pub(crate) fn mirror_sinks(&self) {
        for sink in &self.inner.sinks {
            self.inner
                .metrics
                .sink_up
                .with_label_values(&[sink.name()])
                .set(i64::from(sink.is_up()));
        }
    }
}

/// The keyspace subscription's state: readiness and the gauge follow it.
impl notify::Subscription for Health {
    fn live(&self, live: bool) {
        self.inner.notifications.store(live, Ordering::Relaxed);
        self.inner
            .metrics
            .notifications_enabled
            .set(f64::from(u8::from(live)));
    }

    fn topology_changed(&self) {
        self.inner.metrics.redis_topology_changes.inc();
    }
}

/// One ingress's word on readiness: not ready while it does not consume.
pub(crate) struct IngressReadiness {
    health: Health,
    trigger: String,
    /// This ingress among those of its trigger (a reload starts another).
    instance: u64,
}

impl IngressReadiness {
    /// It does not consume, for `why` (the broker, Redis refused or failed a write).
    pub(crate) fn stopped(&self, why: &str) {
        self.health
            .set_ingress_stopped(&self.trigger, self.instance, Some(why));
    }

    /// It consumes again, or it ended.
    pub(crate) fn consuming(&self) {
        self.health
            .set_ingress_stopped(&self.trigger, self.instance, None);
    }
}

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
