//! The admin API's reads of one trigger's queue: scheduled pages, one message (by member, id
//! or the id consumers see), dead letters, members in flight, the forecast and the history.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::extract::{cursor, page_limit, Named, Params, Reply};
use super::json::{from_b64, put_bytes, put_time};
use super::{Admin, AdminTrigger, ApiError};
use crate::redis::store::{Lookup, Place, MAX_BUCKETS};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScheduledQuery {
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    limit: Option<usize>,
    after: Option<String>,
}

pub(super) async fn scheduled(Named(t): Named, Params(q): Params<ScheduledQuery>) -> Reply {
    let (limit, after) = (page_limit(q.limit)?, cursor(q.after.as_deref())?);
    let page = t
        .queue
        .browse(q.from_ms, q.to_ms, after.as_ref(), limit)
        .await?;
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|e| {
            let mut o = Map::new();
            put_bytes(&mut o, "member", &e.member);
            put_id(&mut o, &t, &e.member);
            put_time(&mut o, "due", e.due_ms);
            o.insert("attempts".into(), e.attempts.into());
            o.insert("body_size".into(), json!(e.body_size));
            let preview = String::from_utf8_lossy(&e.body_preview);
            o.insert("body_preview".into(), preview.into());
            Value::Object(o)
        })
        .collect();
    Ok(Json(json!({
        "items": items,
        "next": page.next.map(|c| c.to_string()),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageQuery {
    /// `base64`: the path names the member in base64 (a member that is not UTF-8).
    encoding: Option<String>,
}

/// One message, found by its member, its id in hash mode, or the id its consumers see
/// (AMQP `message_id`, `x-delay-id`), wherever it is: scheduled, in flight or dead.
pub(super) async fn message(
    Named(t): Named,
    Path((_, given)): Path<(String, String)>,
    Params(q): Params<MessageQuery>,
) -> Reply {
    let wanted = match q.encoding.as_deref() {
        None | Some("utf-8") => given.clone().into_bytes(),
        Some("base64") => from_b64(&given)?,
        Some(_) => return Err(ApiError::bad("`encoding` must be \"base64\" or \"utf-8\"")),
    };
    let Some(Lookup { member, by, found }) = t.queue.lookup(&wanted).await? else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "`{}` is neither a member nor the id of one that is scheduled, in flight or dead",
                String::from_utf8_lossy(&wanted[..wanted.len().min(200)])
            ),
        ));
    };
    let mut o = Map::new();
    put_bytes(&mut o, "member", &member);
    o.insert("member_size".into(), member.len().into());
    let payload = found.body.as_deref().unwrap_or(&member);
    let id = t.queue.id_scheme().consumer_id(&member, Some(payload));
    o.insert("id".into(), id.into());
    o.insert("found_by".into(), json!(by));
    let places: Vec<Value> = found
        .places
        .iter()
        .map(|p| place(p, &t, &member, found.body_size))
        .collect();
    o.insert("places".into(), places.into());
    o.insert("body_size".into(), json!(found.body_size));
    match &found.body {
        Some(body) => put_bytes(&mut o, "body", body),
        None => {
            o.insert("body".into(), Value::Null);
        }
    }
    Ok(Json(Value::Object(o)))
}

/// A listed member's `id`, the one its consumers see, where a list knows it: inline (the
/// member is the message, envelope and all) or for raw bodies in hash mode; an envelope in
/// hash mode may set its own, which only the message itself tells.
fn put_id(o: &mut Map<String, Value>, t: &AdminTrigger, member: &[u8]) {
    let scheme = t.queue.id_scheme();
    let hash = t.queue.hash_bodies();
    if !(hash && scheme.envelope) {
        let id = scheme.consumer_id(member, (!hash).then_some(member));
        o.insert("id".into(), id.into());
    }
}

/// A place as JSON: its state and time (`"now"`/`"parked"` for infinite scores); a dead
/// letter's reason as its JSON text, and a `detail` that is never empty.
fn place(p: &Place, t: &AdminTrigger, member: &[u8], body_size: Option<u64>) -> Value {
    let mut o = Map::new();
    match p {
        Place::Scheduled { due_ms, attempts } => {
            o.insert("state".into(), "scheduled".into());
            put_time(&mut o, "due", *due_ms);
            o.insert("attempts".into(), (*attempts).into());
        }
        Place::InFlight { lease_deadline_ms } => {
            o.insert("state".into(), "in_flight".into());
            put_time(&mut o, "lease_deadline", *lease_deadline_ms);
        }
        Place::Dead { at_ms, reason } => {
            o.insert("state".into(), "dead".into());
            put_time(&mut o, "at", *at_ms);
            o.insert("reason".into(), json!(reason));
            let parsed = reason.as_deref().and_then(|r| serde_json::from_str(r).ok());
            let size = body_size.unwrap_or(member.len() as u64);
            o.insert("detail".into(), json!(detail(parsed.as_ref(), size, t)));
        }
    }
    Value::Object(o)
}

/// A dead letter's detail: its reason's own, or for `too_large` (which has none) its size
/// against the trigger's limit.
pub(super) fn detail(reason: Option<&Value>, size: u64, t: &AdminTrigger) -> Option<String> {
    let reason = reason?;
    if let Some(d) = reason.get("detail").and_then(Value::as_str) {
        return Some(d.to_string());
    }
    (reason.get("reason").and_then(Value::as_str) == Some("too_large")).then(|| {
        format!(
            "{size} bytes, over the trigger's max_message_bytes ({})",
            t.config.max_message_bytes()
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ForecastQuery {
    bucket_ms: Option<u64>,
    buckets: Option<usize>,
}

pub(super) async fn forecast(Named(t): Named, Params(q): Params<ForecastQuery>) -> Reply {
    let buckets = q.buckets.unwrap_or(60);
    let bucket_ms = q.bucket_ms.unwrap_or(60_000);
    if !(1..=MAX_BUCKETS).contains(&buckets) || bucket_ms == 0 {
        return Err(ApiError::bad(format!(
            "`buckets` must be 1 to {MAX_BUCKETS} and `bucket_ms` at least 1"
        )));
    }
    let f = t
        .queue
        .forecast(Duration::from_millis(bucket_ms), buckets)
        .await?;
    Ok(Json(json!(f)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeadQuery {
    limit: Option<usize>,
    after: Option<String>,
}

pub(super) async fn dead(Named(t): Named, Params(q): Params<DeadQuery>) -> Reply {
    let (limit, after) = (page_limit(q.limit)?, cursor(q.after.as_deref())?);
    let page = t.queue.list_dead_after(after.as_ref(), limit).await?;
    let items: Vec<Value> = page
        .items
        .into_iter()
        .map(|d| {
            let reason = d
                .reason
                .and_then(|r| serde_json::from_str::<Value>(&r).ok());
            let size = d.body_size.unwrap_or(d.member.len() as u64);
            let mut o = Map::new();
            put_bytes(&mut o, "member", &d.member);
            put_id(&mut o, &t, &d.member);
            put_time(&mut o, "at", d.at_ms);
            let attempts = reason.as_ref().and_then(|r| r.get("attempts"));
            o.insert("attempts".into(), json!(attempts.and_then(Value::as_u64)));
            o.insert("detail".into(), json!(detail(reason.as_ref(), size, &t)));
            o.insert("reason".into(), json!(reason));
            o.insert("body_size".into(), json!(d.body_size));
            let preview = String::from_utf8_lossy(&d.body_preview);
            o.insert("body_preview".into(), preview.into());
            Value::Object(o)
        })
        .collect();
    Ok(Json(
        json!({ "items": items, "next": page.next.map(|c| c.to_string()) }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct InflightQuery {
    limit: Option<usize>,
}

/// Members claimed by a bridge and not yet settled, earliest lease deadline first.
pub(super) async fn inflight(Named(t): Named, Params(q): Params<InflightQuery>) -> Reply {
    let limit = page_limit(q.limit)?;
    let now_ms = t.queue.now_ms().await?;
    let items: Vec<Value> = t
        .queue
        .list_inflight(limit)
        .await?
        .into_iter()
        .map(|(member, deadline)| {
            let mut o = Map::new();
            put_bytes(&mut o, "member", &member);
            put_id(&mut o, &t, &member);
            put_time(&mut o, "lease_deadline", deadline);
            Value::Object(o)
        })
        .collect();
    Ok(Json(json!({ "now_ms": now_ms, "items": items })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HistoryQuery {
    window: Option<String>,
}

/// The trigger's last 15 minutes or hour on this bridge, a point per 10 s.
pub(super) async fn history(
    State(admin): State<Admin>,
    Named(t): Named,
    Params(q): Params<HistoryQuery>,
) -> Reply {
    let window = q.window.unwrap_or_else(|| "15m".into());
    let span = match window.as_str() {
        "15m" => Duration::from_secs(900),
        "1h" => Duration::from_secs(3600),
        _ => return Err(ApiError::bad("`window` must be \"15m\" or \"1h\"")),
    };
    Ok(Json(json!({
        "window": window,
        "interval_ms": super::history::INTERVAL.as_millis() as u64,
        "points": admin.history.points(t.config.name(), span),
    })))
}
