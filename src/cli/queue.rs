//! The commands that work on a trigger's queue in Redis: stats, enqueue, cancel, pause and
//! resume, dead letters, and a test consumer.

use std::time::Duration;

use super::*;
use crate::redis_conn::Conn;

pub(super) async fn connect(config: &Config) -> anyhow::Result<Conn> {
    let endpoint = crate::bridge::redis_endpoint(config)?;
    endpoint
        .connect()
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

pub(super) fn store_for(config: &Config, conn: Conn, trigger: &str) -> anyhow::Result<Store> {
    let t = config
        .triggers
        .iter()
        .find(|t| t.name == trigger)
        .with_context(|| format!("no trigger named `{trigger}`"))?;
    crate::bridge::trigger_store(t, conn)
}

pub(super) async fn stats(config: Config, json: bool) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let mut rows = Vec::new();
    for t in &config.triggers {
        let s = store_for(&config, conn.clone(), &t.name)?.stats().await?;
        rows.push((t.name.clone(), s));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(name, s)| serde_json::json!({"trigger": name, "stats": s}))
            .collect();
        say!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        say!(
            "{:<24} {:>12} {:>10} {:>10} {:>10} {:>16}  STATE",
            "TRIGGER",
            "SCHEDULED",
            "DUE",
            "INFLIGHT",
            "DEAD",
            "OLDEST_DUE_AGE"
        );
        for (name, s) in rows {
            say!(
                "{:<24} {:>12} {:>10} {:>10} {:>10} {:>15.3}s  {}",
                name,
                s.scheduled,
                s.due,
                s.inflight,
                s.dead,
                s.oldest_due_age_seconds,
                if s.paused { "paused" } else { "active" }
            );
        }
    }
    Ok(0)
}

/// `enqueue --delay` reaches at most this far, so the due time cannot overflow.
const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 86_400);

pub(super) async fn enqueue(
    config: Config,
    trigger: String,
    delay: Option<Duration>,
    at: Option<i64>,
    id: Option<String>,
    payload: String,
) -> anyhow::Result<i32> {
    let mut conn = connect(&config).await?;
    let store = store_for(&config, conn.clone(), &trigger)?;
    match (&id, store.hash_bodies()) {
        (None, true) => {
            anyhow::bail!("trigger `{trigger}` keeps bodies by id (payload = \"hash\"): give --id")
        }
        (Some(_), false) => anyhow::bail!(
            "trigger `{trigger}` uses inline payloads (the member is the payload): drop --id"
        ),
        _ => {}
    }
    let due = match at {
        Some(at) => at,
        None => {
            let now = store.now_ms().await?;
            let delay = delay.unwrap_or_default();
            if delay > MAX_DELAY {
                anyhow::bail!(
                    "--delay {} is too far ahead (at most 100 years)",
                    humantime::format_duration(delay)
                );
            }
            // Bounded above, so the sum cannot overflow.
            now + delay.as_millis() as i64
        }
    };
    match id {
        Some(id) => {
            store
                .schedule_by_id(id.as_bytes(), payload.as_bytes(), due)
                .await?;
            say!(
                "scheduled `{id}` on {} due at {due} (body in {})",
                store.keys().source,
                store.keys().bodies
            );
        }
        None => {
            let _: i64 = redis::cmd("ZADD")
                .arg(&store.keys().source)
                .arg(due)
                .arg(payload.as_bytes())
                .query_async(&mut conn)
                .await?;
            say!("scheduled on {} due at {due}", store.keys().source);
        }
    }
    Ok(0)
}

pub(super) async fn cancel(
    config: Config,
    trigger: String,
    id: Option<String>,
    payload: Option<String>,
) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let store = store_for(&config, conn, &trigger)?;
    let removed = match (id, payload, store.hash_bodies()) {
        (Some(id), None, true) => store.cancel(id.as_bytes()).await?,
        (None, Some(payload), false) => store.cancel(payload.as_bytes()).await?,
        (_, _, true) => anyhow::bail!(
            "trigger `{trigger}` keeps bodies by id (payload = \"hash\"): cancel with --id"
        ),
        (_, _, false) => anyhow::bail!(
            "trigger `{trigger}` uses inline payloads: cancel with the exact payload, not --id"
        ),
    };
    if removed {
        say!("cancelled on {}", store.keys().source);
        Ok(0)
    } else {
        say!(
            "not scheduled on {} (already claimed, delivered or never scheduled)",
            store.keys().source
        );
        Ok(1)
    }
}

/// `pause` (`paused = true`) and `resume`: the state lives in Redis, so every bridge on the
/// trigger obeys it at its next claim, and a restart keeps it.
pub(super) async fn pause(config: Config, trigger: String, paused: bool) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let store = store_for(&config, conn, &trigger)?;
    let changed = store.set_paused(paused).await?;
    let (verb, state) = if paused {
        (
            "paused",
            "nothing is claimed until `delay-bridge resume`; producers can keep writing",
        )
    } else {
        ("resumed", "bridges claim again within their guard_interval")
    };
    if changed {
        say!(
            "{verb} trigger `{trigger}` ({}): {state}",
            store.keys().source
        );
    } else {
        say!(
            "trigger `{trigger}` ({}) was already {verb}",
            store.keys().source
        );
    }
    Ok(0)
}

pub(super) async fn dead_list(
    config: Config,
    trigger: String,
    limit: usize,
) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let store = store_for(&config, conn, &trigger)?;
    for d in store.list_dead(limit).await? {
        let body = match (&d.body, store.hash_bodies()) {
            (Some(body), _) => format!("\t{}", String::from_utf8_lossy(body)),
            (None, true) => "\t(no body)".into(),
            (None, false) => String::new(),
        };
        say!(
            "{}\t{}\t{}{body}",
            d.at_ms,
            d.reason.as_deref().unwrap_or("{}"),
            String::from_utf8_lossy(&d.member)
        );
    }
    Ok(0)
}

pub(super) async fn dead_requeue(
    config: Config,
    trigger: String,
    members: Vec<String>,
    limit: usize,
) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let store = store_for(&config, conn, &trigger)?;
    let members: Vec<Vec<u8>> = members.into_iter().map(String::into_bytes).collect();
    let n = store.requeue_dead(&members, limit).await?;
    say!("requeued {n} dead letter(s) on {}", store.keys().source);
    Ok(0)
}

pub(super) async fn consume(
    url: String,
    queue: String,
    count: Option<u64>,
    idle: Duration,
) -> anyhow::Result<i32> {
    use futures_util::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions};
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to {}", redact_url(&url)))?;
    let channel = conn.create_channel().await?;
    let mut consumer = channel
        .basic_consume(
            &queue,
            "delay-bridge-consume",
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await?;
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        let Ok(Some(delivery)) = tokio::time::timeout(idle, consumer.next()).await else {
            break;
        };
        let delivery = delivery?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64;
        let due = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(crate::wire::HEADER_DUE_MS).cloned())
            .and_then(|v| match v {
                lapin::types::AMQPValue::LongLongInt(n) => Some(n),
                _ => None,
            });
        let late = due.map_or_else(|| "?".to_string(), |d| format!("{}ms", now - d));
        say!("late={late}\t{}", String::from_utf8_lossy(&delivery.data));
        delivery.ack(BasicAckOptions::default()).await?;
        seen += 1;
    }
    Ok(0)
}
