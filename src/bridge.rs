//! The daemon: connects Redis and the sinks, runs every trigger's workers, and shuts down cleanly.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Trigger};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::redis::conn::{Conn, Endpoint};
use crate::repeat::Repeated;
use crate::sink::{self, Sink};

mod running;
use running::Running;

/// Stops the bridge: cancelling `stop` ends claiming; the daemon then drains within
/// `shutdown.timeout` and puts back what the broker has not confirmed by then.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Cancelled by the first signal.
    pub stop: CancellationToken,
    /// How the configuration is reloaded (SIGHUP, the admin API); `None`: never.
    pub reload: Option<Reload>,
}

/// Reloading the configuration: the file to read again, and the request to do it.
#[derive(Clone)]
pub struct Reload {
    /// The configuration file.
    pub path: std::path::PathBuf,
    /// Notified by SIGHUP and by `POST /api/v1/reload`.
    pub requested: Arc<tokio::sync::Notify>,
}

/// Loads `path` again and applies its triggers; a configuration that does not validate,
/// changes more than triggers, or would stop serving keys that hold members changes nothing.
/// Returns the configuration now running.
async fn reload_config(
    path: &std::path::Path,
    current: &Config,
    running: &mut Running,
    metrics: &Metrics,
) -> Option<Config> {
    let refused = |why: &str| {
        metrics.config_reload_failures.inc();
        tracing::error!(file = %path.display(), "configuration not reloaded, the running one stays: {why}");
        None
    };
    let next = match crate::config::load(path) {
        Ok(next) => next,
        Err(e) => {
            for problem in &e.problems {
                tracing::error!(key = %problem.key, "{}", problem.message);
            }
            return refused(&format!(
                "{} problem(s), each logged with its key",
                e.problems.len()
            ));
        }
    };
    let layouts = crate::redis::queue::take_layouts(running.changed(&next), running.conn()).await;
    if let Err(not_taken) = layouts {
        return refused(&not_taken.to_string());
    }
    match running.apply(current, &next) {
        Ok(summary) => {
            metrics.config_reloads.inc();
            tracing::info!(file = %path.display(), "configuration reloaded: {summary}");
            Some(next)
        }
        Err(why) => refused(&why),
    }
}

/// Runs the daemon until `shutdown.stop` is cancelled, then drains within `shutdown.timeout`.
pub async fn run(mut config: Config, metrics: Metrics, shutdown: Shutdown) -> anyhow::Result<()> {
    let stop = shutdown.stop.clone();
    let endpoint = Arc::new(Endpoint::new(&config.redis)?);
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }

    let sinks = sinks_in_use(&config)?;
    let health = Health::new(&metrics, sinks.values().cloned().collect());
    health.redis_at(endpoint.clone());
    let http_stop = CancellationToken::new();
    // Whichever way `run` returns, its listeners, sink supervisors and workers stop: the
    // normal shutdown below cancels them in its own order, an early return by these guards.
    let _http_stopped = http_stop.clone().drop_guard();
    let admin_triggers = crate::admin::AdminTriggers::default();
    let reload = shutdown.reload.clone();
    let (http, admin) = listen(
        &config,
        &metrics,
        &health,
        &admin_triggers,
        &reload,
        &http_stop,
    )
    .await?;

    let tasks = TaskTracker::new();
    let sink_stop = CancellationToken::new();
    let _sinks_stopped = sink_stop.clone().drop_guard();
    let _workers_stopped = stop.clone().drop_guard();
    let fatal = supervise_sinks(&sinks, &tasks, &metrics, &sink_stop, &stop);
    let outcome = || match fatal.get() {
        Some(e) => Err(anyhow::Error::new(e.clone())),
        None => Ok(()),
    };

    let Some(conn) = wait_for_redis(&endpoint, &stop).await? else {
        return outcome();
    };
    health.redis_answered();
    let notifications = check_redis(&conn, &config).await?;

    let abort = CancellationToken::new();
    let workers = TaskTracker::new();
    let mut running = Running::new(running::Services {
        conn: conn.clone(),
        sinks: sinks.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        workers: workers.clone(),
        tasks: tasks.clone(),
        stop: stop.clone(),
        abort: abort.clone(),
        notifications,
        enable_keyspace_events: config.redis.settings().enable_keyspace_events,
        admin: admin_triggers,
    });
    let count = start_triggers(std::mem::take(&mut config.triggers), &mut running).await?;
    running.publish(config.metrics.backlog_interval);
    health.triggers_started();
    tracing::info!(
        triggers = count,
        workers = running.worker_count(),
        notifications,
        "delay-bridge running"
    );

    let current = serve_reloads(config, &reload, &mut running, &metrics, &stop).await;
    tracing::info!(timeout = ?current.shutdown.timeout, "stopping: no new claims; waiting for outstanding confirmations");
    drain(&workers, &abort, &sinks, current.shutdown.timeout).await;
    sink_stop.cancel();
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(1), tasks.wait()).await;
    close_listeners(&http_stop, http, admin).await;
    tracing::info!("stopped");
    outcome()
}

/// Learns what the Redis behind `conn` is, refusing one the bridge cannot work with, and
/// turns keyspace notifications on where the configuration asks; returns whether they are on.
async fn check_redis(conn: &Conn, config: &Config) -> anyhow::Result<bool> {
    let settings = config.redis.settings();
    let found = crate::redis::engine::inspect(conn, settings, false).await;
    crate::redis::engine::log_and_judge(&found)?;
    let notifications =
        crate::redis::checks::ensure_enabled(conn, settings.enable_keyspace_events).await;
    if !notifications {
        tracing::warn!(
            "keyspace notifications are off: {}",
            crate::redis::engine::FALLBACK
        );
    }
    Ok(notifications)
}

/// Starts every trigger of the configuration once the keys they serve are taken; returns how
/// many started.
async fn start_triggers(triggers: Vec<Trigger>, running: &mut Running) -> anyhow::Result<usize> {
    // Each trigger's settings leave the configuration for its running trigger, held once.
    let triggers: Vec<Arc<Trigger>> = triggers.into_iter().map(Arc::new).collect();
    // Every key a trigger stops serving must be empty; a pause holds on every key it serves.
    let layouts =
        crate::redis::queue::take_layouts(triggers.iter().map(|t| &**t), running.conn()).await;
    if let Err(refused) = layouts {
        return Err(anyhow::Error::new(refused));
    }
    let count = triggers.len();
    for tc in triggers {
        running.start(tc).map_err(anyhow::Error::msg)?;
    }
    Ok(count)
}

/// Stops the metrics and health listener and the admin API, waiting a moment for each.
async fn close_listeners(
    http_stop: &CancellationToken,
    http: JoinHandle<()>,
    admin: Option<JoinHandle<()>>,
) {
    http_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_millis(500), http).await;
    if let Some(admin) = admin {
        let _ = tokio::time::timeout(Duration::from_millis(500), admin).await;
    }
}

/// Binds the metrics and health listener and the admin API, before Redis is waited for and
/// before any worker claims: a taken port stops nothing mid-batch, and the API answers (503,
/// "starting") while Redis is down at start; `/readyz` cannot say ready before it listens.
async fn listen(
    config: &Config,
    metrics: &Metrics,
    health: &Health,
    admin_triggers: &crate::admin::AdminTriggers,
    reload: &Option<Reload>,
    http_stop: &CancellationToken,
) -> anyhow::Result<(JoinHandle<()>, Option<JoinHandle<()>>)> {
    let http = crate::health::serve(
        config.metrics.listen,
        config.admin.listen,
        metrics.clone(),
        health.clone(),
        http_stop.clone(),
    )
    .await
    .with_context(|| format!("metrics.listen: binding {}", config.metrics.listen))?;

    let admin = crate::admin::serve(
        &config.admin,
        admin_triggers.clone(),
        reload.as_ref().map(|r| r.requested.clone()),
        metrics.clone(),
        http_stop.clone(),
    )
    .await
    .with_context(|| {
        let listen = config
            .admin
            .listen
            .map_or_else(String::new, |l| l.to_string());
        format!("admin.listen: starting the admin API on {listen}")
    })?;
    Ok((http, admin))
}

/// The sinks some trigger uses, made from their configuration (not yet connected).
fn sinks_in_use(config: &Config) -> anyhow::Result<BTreeMap<String, Arc<Sink>>> {
    let mut sinks = BTreeMap::new();
    for (name, sc) in &config.sinks {
        if config.triggers.iter().any(|t| t.sink() == name) {
            let sink = Sink::new(sc).with_context(|| format!("sinks.{name}"))?;
            sinks.insert(name.clone(), sink);
        }
    }
    Ok(sinks)
}

/// Keeps each sink connected until `sink_stop`. A sink that cannot work as configured stops
/// the bridge the way a signal does; its error is then in the returned cell, for `run` to
/// return.
fn supervise_sinks(
    sinks: &BTreeMap<String, Arc<Sink>>,
    tasks: &TaskTracker,
    metrics: &Metrics,
    sink_stop: &CancellationToken,
    stop: &CancellationToken,
) -> Arc<OnceLock<sink::Fatal>> {
    let fatal: Arc<OnceLock<sink::Fatal>> = Arc::default();
    for sink in sinks.values() {
        let (sink, metrics, cancel) = (sink.clone(), metrics.clone(), sink_stop.clone());
        let (fatal, stop) = (fatal.clone(), stop.clone());
        tasks.spawn(async move {
            if let Err(e) = sink.supervise(metrics, cancel).await {
                tracing::warn!(sink = %sink.name(), "the sink cannot work as configured: stopping");
                let _ = fatal.set(e);
                stop.cancel();
            }
        });
    }
    fatal
}

/// A connection to Redis, waiting for it while it is unreachable (it may start together with
/// the bridge); `None` when `stop` comes first. Wrong or missing credentials do not heal by
/// waiting: they refuse the start, like a bad configuration.
async fn wait_for_redis(
    endpoint: &Arc<Endpoint>,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Conn>> {
    let mut failures = Repeated::default();
    let mut conn = loop {
        match endpoint.connect().await {
            Ok(c) => break c,
            Err(e) if is_auth_error(&e) => anyhow::bail!(
                "Redis rejected the credentials (check redis.url and redis.password_file): {e}"
            ),
            Err(e) => {
                if let Some(unlogged) = failures.failed() {
                    tracing::warn!(error = %e, failures = failures.count(), unlogged, "Redis unreachable, retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.cancelled() => return Ok(None),
                }
            }
        }
    };
    // Without a password the connection opens and only commands fail (NOAUTH): ask now.
    if let Err(e) = redis::cmd("PING").query_async::<()>(&mut conn).await {
        if is_auth_error(&e) {
            anyhow::bail!(
                "Redis requires credentials (set them in redis.url or redis.password_file): {e}"
            );
        }
    }
    Ok(Some(conn))
}

/// Applies each requested reload until `stop`; returns the configuration then running (its
/// triggers left to `running`, which holds one copy of each).
async fn serve_reloads(
    config: Config,
    reload: &Option<Reload>,
    running: &mut Running,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Config {
    let mut current = Config {
        triggers: Vec::new(),
        ..config
    };
    loop {
        let requested = async {
            match reload {
                Some(r) => r.requested.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return current,
            _ = requested => {
                let path = &reload.as_ref().expect("requested").path;
                if let Some(next) = reload_config(path, &current, running, metrics).await {
                    current = Config {
                        triggers: Vec::new(),
                        ..next
                    };
                }
            }
        }
    }
}

/// Lets the workers finish within `timeout`: confirmations may take all but a margin, the
/// margin is for putting back what `abort` cut short; then each sink flushes what it holds.
async fn drain(
    workers: &TaskTracker,
    abort: &CancellationToken,
    sinks: &BTreeMap<String, Arc<Sink>>,
    timeout: Duration,
) {
    workers.close();
    let deadline = tokio::time::Instant::now() + timeout;
    let margin = (timeout / 5).min(Duration::from_secs(2));
    tokio::select! {
        _ = workers.wait() => {}
        _ = tokio::time::sleep_until(deadline - margin) => {
            tracing::warn!("shutdown timeout reached: putting unconfirmed messages back");
            abort.cancel();
            if tokio::time::timeout_at(deadline, workers.wait()).await.is_err() {
                tracing::warn!("workers did not finish; their leases will expire and be recovered");
            }
        }
    }
    for sink in sinks.values() {
        // Kafka: records handed to librdkafka before the abort still get their chance.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        sink.flush(left.max(Duration::from_millis(100))).await;
    }
}

/// Wrong or missing Redis credentials: waiting will not fix them.
fn is_auth_error(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}
