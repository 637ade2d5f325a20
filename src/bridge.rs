//! The daemon: connects Redis and the sinks, runs every trigger's workers, and shuts down cleanly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, KafkaKey, SinkConfig, TriggerConfig};
use crate::keys::QueueKeys;
use crate::metrics::Metrics;
use crate::sink::{Route, Sink};
use crate::store::Store;
use crate::worker::{self, Trigger};

/// Stops the bridge: cancelling `stop` ends claiming; the daemon then drains within
/// `shutdown.timeout` and puts back what the broker has not confirmed by then.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Cancelled by the first signal.
    pub stop: CancellationToken,
}

/// A Redis client for the configured URL, with the password file applied.
pub fn redis_client(config: &Config) -> anyhow::Result<redis::Client> {
    use redis::IntoConnectionInfo;
    let mut info = config
        .redis
        .url
        .as_str()
        .into_connection_info()
        .context("redis.url")?;
    if let Some(file) = &config.redis.password_file {
        info.redis.password = Some(crate::secret::read_file(file)?);
    }
    Ok(redis::Client::open(info)?)
}

/// Connects with the configured timeouts; the manager reconnects by itself afterwards.
pub async fn connect_redis(
    config: &Config,
    client: &redis::Client,
) -> redis::RedisResult<ConnectionManager> {
    let cm = ConnectionManagerConfig::new()
        .set_connection_timeout(config.redis.connect_timeout)
        .set_response_timeout(config.redis.response_timeout)
        .set_number_of_retries(1)
        .set_max_delay(500);
    ConnectionManager::new_with_config(client.clone(), cm).await
}

/// The route a trigger publishes to.
pub fn route(t: &TriggerConfig, sink: &SinkConfig) -> Route {
    match sink {
        SinkConfig::Amqp(_) => Route::Amqp {
            exchange: t.exchange.clone().unwrap_or_default(),
            routing_key: t.routing_key.clone().unwrap_or_default(),
        },
        SinkConfig::Kafka(_) => Route::Kafka {
            topic: t.topic.clone().unwrap_or_default(),
            key: t.kafka_key.unwrap_or(KafkaKey::None),
        },
    }
}

/// Runs the daemon until `shutdown.stop` is cancelled, then drains within `shutdown.timeout`.
pub async fn run(config: Config, metrics: Metrics, shutdown: Shutdown) -> anyhow::Result<()> {
    let stop = shutdown.stop.clone();
    let client = redis_client(&config)?;

    let mut sinks: BTreeMap<String, Arc<Sink>> = BTreeMap::new();
    for (name, sc) in &config.sinks {
        if config.triggers.iter().any(|t| &t.sink == name) {
            sinks.insert(
                name.clone(),
                Sink::new(name, sc).with_context(|| format!("sinks.{name}"))?,
            );
        }
    }
    for name in sinks.keys() {
        metrics.sink_up.with_label_values(&[name]).set(0);
    }
    metrics.redis_up.set(0);
    let http_stop = CancellationToken::new();
    let http = crate::http::serve(
        config.metrics.listen,
        metrics.clone(),
        sinks.values().cloned().collect(),
        http_stop.clone(),
    )
    .await
    .with_context(|| format!("metrics.listen: binding {}", config.metrics.listen))?;

    let tasks = TaskTracker::new();
    let sink_stop = CancellationToken::new();
    for sink in sinks.values() {
        let (sink, metrics, cancel) = (sink.clone(), metrics.clone(), sink_stop.clone());
        tasks.spawn(async move { sink.supervise(metrics, cancel).await });
    }

    // Redis may not be up yet (e.g. started together in compose): wait for it.
    let mut conn = {
        let mut failures = 0u32;
        loop {
            match connect_redis(&config, &client).await {
                Ok(c) => break c,
                // Wrong credentials do not heal by waiting: refuse to start, like a bad config.
                Err(e) if is_auth_error(&e) => {
                    sink_stop.cancel();
                    http_stop.cancel();
                    anyhow::bail!(
                        "Redis rejected the credentials (check redis.url and redis.password_file): {e}"
                    );
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "Redis unreachable, retrying");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        _ = stop.cancelled() => {
                            sink_stop.cancel();
                            http_stop.cancel();
                            return Ok(());
                        }
                    }
                }
            }
        }
    };
    // Without a password the connection opens and only commands fail (NOAUTH): ask now.
    if let Err(e) = redis::cmd("PING").query_async::<()>(&mut conn).await {
        if is_auth_error(&e) {
            sink_stop.cancel();
            http_stop.cancel();
            anyhow::bail!(
                "Redis requires credentials (set them in redis.url or redis.password_file): {e}"
            );
        }
    }
    metrics.redis_up.set(1);
    check_eviction_policy(&mut conn, config.redis.require_noeviction).await?;
    let notifications =
        crate::notify::ensure_enabled(&mut conn, config.redis.enable_keyspace_events).await;

    let abort = CancellationToken::new();
    let mut triggers = Vec::new();
    let workers = TaskTracker::new();
    for tc in &config.triggers {
        let keys = QueueKeys::derive(&tc.key).expect("validated");
        let sink = sinks[&tc.sink].clone();
        let route = route(tc, &config.sinks[&tc.sink]);
        let t = Arc::new(Trigger::new(
            tc.clone(),
            Store::new(conn.clone(), keys),
            sink,
            route,
            metrics.clone(),
        ));
        for w in 0..tc.workers {
            workers.spawn(worker::run(t.clone(), w, stop.clone(), abort.clone()));
        }
        tasks.spawn(worker::recover_loop(t.clone(), stop.clone()));
        tasks.spawn(worker::stats_loop(
            t.clone(),
            config.metrics.backlog_interval,
            stop.clone(),
        ));
        triggers.push(t);
    }
    if notifications {
        let db = client.get_connection_info().redis.db;
        tasks.spawn(crate::notify::listen(
            client.clone(),
            db,
            triggers.clone(),
            metrics.clone(),
            stop.clone(),
        ));
    }
    tracing::info!(
        triggers = config.triggers.len(),
        workers = config.triggers.iter().map(|t| t.workers).sum::<usize>(),
        notifications,
        "delay-bridge running"
    );

    stop.cancelled().await;
    tracing::info!(timeout = ?config.shutdown.timeout, "stopping: no new claims; waiting for outstanding confirmations");
    workers.close();
    // Everything, putting back the aborted batches included, fits in shutdown.timeout:
    // confirmations may take all but a margin, the margin is for the put-back scripts.
    let timeout = config.shutdown.timeout;
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
    sink_stop.cancel();
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(1), tasks.wait()).await;
    http_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_millis(500), http).await;
    tracing::info!("stopped");
    Ok(())
}

/// Wrong or missing Redis credentials: waiting will not fix them.
fn is_auth_error(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// Warns (or refuses to start) when Redis may evict queued messages under memory pressure.
async fn check_eviction_policy(conn: &mut ConnectionManager, require: bool) -> anyhow::Result<()> {
    let policy: Result<(String, String), _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    match policy {
        Ok((_, p)) if p == "noeviction" => Ok(()),
        Ok((_, p)) if require => anyhow::bail!(
            "Redis maxmemory-policy is `{p}`: queued messages may be evicted under memory pressure; \
             set it to noeviction or turn off [redis] require_noeviction"
        ),
        Ok((_, p)) => {
            tracing::warn!(policy = %p, "Redis maxmemory-policy is not noeviction: queued messages may be evicted (lost) under memory pressure");
            Ok(())
        }
        Err(e) if require => anyhow::bail!("cannot read maxmemory-policy to verify noeviction: {e}"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read maxmemory-policy; make sure it is noeviction");
            Ok(())
        }
    }
}
