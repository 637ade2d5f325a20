//! The commands that change a trigger's queue in Redis: enqueue, cancel, pause and resume,
//! dead letters, and a test consumer.

use std::time::Duration;

use std::ffi::OsString;

use super::bytes::{os_bytes, ByteForms};
use super::reach::{connect, queue_for};
use super::text::{due_number, late_text, member_json, pasteable, say_json};
use super::when::{self, When};
use super::*;
use crate::redis::queue::Queue;
use crate::redis::store::score_arg;

/// `enqueue --delay` reaches at most this far, so the due time cannot overflow.
const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 86_400);

/// `enqueue`: a message scheduled the way a producer would.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Trigger whose key to write to.
    #[arg(long, short)]
    trigger: String,
    /// Delay from now, e.g. `5s` or `250ms` (default: due now).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "at")]
    delay: Option<Duration>,
    /// Due time: RFC 3339 (`2026-11-25T07:00:00Z`), epoch ms, `now`, `+5m`, `-inf` (due at
    /// once, ahead of everything) or `+inf`/`park` (parked until rescheduled).
    #[arg(long, value_parser = when::parse, allow_hyphen_values = true)]
    at: Option<When>,
    /// Hash payload mode: the message's id (the member); the payload is its body. Any
    /// bytes; with --base64, base64 like the payload.
    #[arg(long)]
    id: Option<OsString>,
    /// The payload: the member in inline mode, the body in hash mode. `-` reads it from
    /// standard input (any size, any bytes).
    #[arg(required_unless_present = "file", allow_hyphen_values = true)]
    payload: Option<OsString>,
    #[command(flatten)]
    bytes: ByteForms,
}

/// The due time `at`, or `delay` from now (now without either), on the Redis clock.
async fn due_of(queue: &Queue, delay: Option<Duration>, at: Option<When>) -> anyhow::Result<i64> {
    Ok(match at {
        Some(at) if !at.is_relative() => at.resolve(0),
        Some(at) => at.resolve(queue.now_ms().await?),
        None => {
            let now = queue.now_ms().await?;
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
    })
}

pub(super) async fn enqueue(config: Config, a: EnqueueArgs) -> anyhow::Result<i32> {
    let payload = a.bytes.value(a.payload.as_ref())?;
    let id = match &a.id {
        Some(id) if a.bytes.base64 => Some(super::bytes::decode_base64(&os_bytes(id))?),
        Some(id) => Some(os_bytes(id)),
        None => None,
    };
    let trigger = &a.trigger;
    let mut conn = connect(&config).await?;
    let queue = queue_for(&config, conn.clone(), trigger)?;
    match (&id, queue.hash_bodies()) {
        (None, true) => {
            anyhow::bail!("trigger `{trigger}` keeps bodies by id (payload = \"hash\"): give --id")
        }
        (Some(_), false) => anyhow::bail!(
            "trigger `{trigger}` uses inline payloads (the member is the payload): drop --id"
        ),
        _ => {}
    }
    let due = due_of(&queue, a.delay, a.at).await?;
    let shown = due_number(due);
    match id {
        Some(id) => {
            let store = queue.schedule_by_id(&id, &payload, due).await?;
            say!(
                "scheduled {} ({} B) on {} due at {shown} (body in {})",
                pasteable(&id),
                payload.len(),
                store.keys().source,
                store.keys().bodies
            );
        }
        None => {
            let source = &queue.for_member(&payload).keys().source;
            let _: i64 = redis::cmd("ZADD")
                .arg(source)
                .arg(score_arg(due))
                .arg(&payload)
                .query_async(&mut conn)
                .await?;
            say!("scheduled {} B on {source} due at {shown}", payload.len());
        }
    }
    Ok(0)
}

/// `cancel`: a scheduled message removed.
#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Trigger whose key to remove from.
    #[arg(long, short)]
    trigger: String,
    /// Hash payload mode: the message's id (as the positional MEMBER).
    #[arg(long, conflicts_with = "member")]
    id: Option<OsString>,
    /// Inline mode: the exact payload (the member); hash payload mode: the id. `-` reads it
    /// from standard input.
    #[arg(allow_hyphen_values = true)]
    member: Option<OsString>,
    #[command(flatten)]
    bytes: ByteForms,
}

pub(super) async fn cancel(config: Config, a: CancelArgs) -> anyhow::Result<i32> {
    let trigger = &a.trigger;
    let conn = connect(&config).await?;
    let queue = queue_for(&config, conn, trigger)?;
    if a.id.is_some() && !queue.hash_bodies() {
        anyhow::bail!(
            "trigger `{trigger}` uses inline payloads: cancel with the exact payload, not --id"
        );
    }
    let member = a.bytes.value(a.id.as_ref().or(a.member.as_ref()))?;
    if queue.cancel(&member).await? {
        say!("cancelled on {}", queue.place());
        Ok(0)
    } else {
        say!(
            "not scheduled on {} (already claimed, delivered or never scheduled)",
            queue.place()
        );
        Ok(1)
    }
}

/// `pause` (`paused = true`) and `resume`: the state lives in Redis, so every bridge on the
/// trigger obeys it at its next claim, and a restart keeps it.
pub(super) async fn pause(config: Config, trigger: String, paused: bool) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let queue = queue_for(&config, conn, &trigger)?;
    let changed = queue.set_paused(paused).await?;
    let (verb, state) = if paused {
        (
            "paused",
            "nothing is claimed until `delay-bridge resume`; producers can keep writing",
        )
    } else {
        ("resumed", "bridges claim again within their guard_interval")
    };
    if changed {
        say!("{verb} trigger `{trigger}` ({}): {state}", queue.place());
    } else {
        say!("trigger `{trigger}` ({}) was already {verb}", queue.place());
    }
    Ok(0)
}

pub(super) async fn dead_list(
    config: Config,
    trigger: String,
    limit: usize,
    json: bool,
) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let queue = queue_for(&config, conn, &trigger)?;
    let letters = queue.list_dead(limit).await?;
    let reason = |d: &crate::redis::store::DeadLetter| -> serde_json::Value {
        d.reason
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    if json {
        let items: Vec<serde_json::Value> = letters
            .iter()
            .map(|d| {
                let (field, member) = member_json(&d.member);
                serde_json::json!({
                    field: member,
                    "at_ms": d.at_ms,
                    "at": super::text::ms_text(d.at_ms),
                    "reason": reason(d),
                    "body_size": d.body_size,
                    "body_preview": String::from_utf8_lossy(&d.body_preview),
                })
            })
            .collect();
        return say_json(&serde_json::json!({ "items": items }));
    }
    say!(
        "{:<24} {:>8}  {:<20} MEMBER",
        "DEAD-LETTERED",
        "ATTEMPTS",
        "REASON"
    );
    for d in &letters {
        let why = reason(d);
        let text = |name: &str| why.get(name).and_then(|v| v.as_str()).map(str::to_string);
        let body = match (d.body_size, queue.hash_bodies()) {
            (Some(size), _) if d.body_preview.len() as u64 == size => format!(
                "  body: {}",
                String::from_utf8_lossy(&d.body_preview).escape_debug()
            ),
            (Some(size), _) if d.body_preview.is_empty() => {
                format!("  body: {size} B (`show` prints it)")
            }
            (Some(size), _) => format!(
                "  body: {}... ({size} B)",
                String::from_utf8_lossy(&d.body_preview).escape_debug()
            ),
            (None, true) => "  (no body)".into(),
            (None, false) => String::new(),
        };
        let detail = text("detail").map_or(String::new(), |d| format!("  detail: {d}"));
        say!(
            "{:<24} {:>8}  {:<20} {}{body}{detail}",
            super::text::ms_text(d.at_ms),
            why.get("attempts").and_then(|v| v.as_i64()).unwrap_or(0),
            text("reason").unwrap_or_else(|| "-".into()),
            super::text::listed(&d.member)
        );
    }
    if letters.is_empty() {
        say!("(no dead letters)");
    }
    Ok(0)
}

pub(super) async fn dead_requeue(
    config: Config,
    trigger: String,
    members: Vec<Vec<u8>>,
    limit: usize,
    yes: bool,
) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let queue = queue_for(&config, conn, &trigger)?;
    // Like purge: more than one letter moves only when confirmed.
    let would = if members.is_empty() {
        queue.stats().await?.dead.min(limit as u64)
    } else {
        members.len() as u64
    };
    if would > 1 && !yes {
        say!(
            "would requeue {would} dead letters of trigger `{trigger}`: add --yes to requeue them"
        );
        return Ok(1);
    }
    let n = queue.requeue_dead(&members, limit).await?;
    say!("requeued {n} dead letter(s) on {}", queue.place());
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
        let headers = delivery.properties.headers().as_ref();
        let due = headers
            .and_then(|h| h.inner().get(crate::wire::HEADER_DUE_MS))
            .and_then(header_ms);
        let late = due.map_or_else(|| "?".to_string(), |d| late_text(now, d));
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map_or_else(|| "-".to_string(), |id| id.to_string());
        say!("late={late}\tid={id}\t{}", pasteable(&delivery.data));
        delivery.ack(BasicAckOptions::default()).await?;
        seen += 1;
    }
    Ok(0)
}

/// A header holding a time in epoch ms, whatever integer type (or text) a publisher gave it.
fn header_ms(v: &lapin::types::AMQPValue) -> Option<i64> {
    use lapin::types::AMQPValue as V;
    match v {
        V::LongLongInt(n) => Some(*n),
        V::LongInt(n) => Some(i64::from(*n)),
        V::LongUInt(n) => Some(i64::from(*n)),
        V::ShortInt(n) => Some(i64::from(*n)),
        V::Timestamp(n) => i64::try_from(*n).ok(),
        V::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.trim().parse().ok(),
        _ => None,
    }
}
