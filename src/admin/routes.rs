//! The admin API's routes under `/api/v1`: read a trigger's queue, and act on it.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use std::collections::HashMap;

use axum::extract::{ConnectInfo, FromRequestParts, Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Admin, AdminTrigger, ApiError};
use crate::redis::store::{Cursor, Place, Purge, MAX_BUCKETS, MAX_PAGE};

/// Most members one call names.
const MAX_MEMBERS: usize = 1000;

type Reply = Result<Json<Value>, ApiError>;

/// The console: one page, its script and its style, embedded in the binary; the script is
/// served as its own file so that the Content-Security-Policy allows no inline script.
const CONSOLE: &str = include_str!("console.html");
const CONSOLE_JS: &str = include_str!("console.js");
const CONSOLE_CSS: &str = include_str!("console.css");

pub(super) fn router() -> Router<Admin> {
    Router::new()
        .route(
            "/",
            get(|| async { axum::response::Redirect::to("/console") }),
        )
        .route("/console", get(|| async { axum::response::Html(CONSOLE) }))
        .route(
            "/console.js",
            get(|| async {
                (
                    [(CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    CONSOLE_JS,
                )
            }),
        )
        .route(
            "/console.css",
            get(|| async { ([(CONTENT_TYPE, "text/css; charset=utf-8")], CONSOLE_CSS) }),
        )
        .route("/api/v1/triggers", get(triggers))
        .route("/api/v1/triggers/{trigger}/scheduled", get(scheduled))
        .route("/api/v1/triggers/{trigger}/messages/{member}", get(message))
        .route("/api/v1/triggers/{trigger}/forecast", get(forecast))
        .route("/api/v1/triggers/{trigger}/dead", get(dead))
        .route("/api/v1/triggers/{trigger}/inflight", get(inflight))
        .route("/api/v1/triggers/{trigger}/history", get(history))
        .route("/api/v1/triggers/{trigger}/pause", post(pause))
        .route("/api/v1/triggers/{trigger}/resume", post(resume))
        .route("/api/v1/triggers/{trigger}/promote", post(promote))
        .route("/api/v1/triggers/{trigger}/reschedule", post(reschedule))
        .route("/api/v1/triggers/{trigger}/cancel", post(cancel))
        .route("/api/v1/triggers/{trigger}/purge", post(purge))
        .route("/api/v1/triggers/{trigger}/dead/requeue", post(requeue))
        .route("/api/v1/reload", post(reload))
        .fallback(|| async {
            ApiError(
                axum::http::StatusCode::NOT_FOUND,
                "no such route: see schema/admin.openapi.json".into(),
            )
        })
}

/// The trigger a route names (`{trigger}` in its path): 404 when there is none, 503 while
/// the bridge is starting.
struct Named(AdminTrigger);

impl FromRequestParts<Admin> for Named {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, admin: &Admin) -> Result<Self, ApiError> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, admin)
            .await
            .map_err(|e| ApiError::bad(e.body_text()))?;
        let name = params.get("trigger").map_or("", String::as_str);
        admin.trigger(name).map(Named)
    }
}

/// A call that changes a trigger's queue: the trigger, and who called (for the audit line).
struct Act {
    t: AdminTrigger,
    peer: SocketAddr,
}

impl FromRequestParts<Admin> for Act {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, admin: &Admin) -> Result<Self, ApiError> {
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, admin)
            .await
            .map_err(|e| ApiError::bad(e.body_text()))?;
        let Named(t) = Named::from_request_parts(parts, admin).await?;
        Ok(Act { t, peer })
    }
}

impl Act {
    /// One audit line per call that changes a queue: who, what, on which trigger, how many;
    /// never a member or a body.
    fn audit(&self, action: &str, count: u64) {
        tracing::info!(target: "delay_bridge::audit", peer = %self.peer, action, trigger = %self.t.config.name, count, "admin call");
    }
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad(format!("bad query: {}", e.body_text())))
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    b.map(|Json(b)| b)
        .map_err(|e| ApiError::bad(format!("bad JSON body: {}", e.body_text())))
}

/// A page's `limit`: 100 unless given, 1 to [`MAX_PAGE`].
fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad(format!("`limit` must be 1 to {MAX_PAGE}")));
    }
    Ok(limit)
}

/// A page's `after`: where the previous page ended.
fn cursor(after: Option<&str>) -> Result<Option<Cursor>, ApiError> {
    after.map(str::parse).transpose().map_err(ApiError::bad)
}

fn members(list: Vec<String>) -> Result<Vec<Vec<u8>>, ApiError> {
    if list.is_empty() || list.len() > MAX_MEMBERS {
        return Err(ApiError::bad(format!(
            "`members` must name 1 to {MAX_MEMBERS} members"
        )));
    }
    Ok(list.into_iter().map(String::into_bytes).collect())
}

async fn triggers(State(admin): State<Admin>) -> Reply {
    let mut out = Vec::new();
    for t in admin.triggers.now()?.values() {
        let stats = t.queue.stats().await?;
        let held = t.queue.held().await?;
        let state = if stats.paused {
            "paused"
        } else if held.is_some() {
            "held"
        } else {
            "active"
        };
        let rate = t
            .config
            .rate()
            .map(|(per_second, burst)| json!({ "per_second": per_second, "burst": burst }));
        let (forwarded, lateness_p99) = admin.delivery(&t.config);
        out.push(json!({
            "name": t.config.name,
            "key": t.config.key,
            "sink": t.config.sink,
            "payload": t.config.payload,
            "rate_limit": rate,
            "stats": stats,
            "state": state,
            "held": held,
            "forwarded_total": forwarded,
            "lateness_p99_seconds": lateness_p99,
            "lateness_p99_1m_seconds": admin.history.recent_p99(&t.config.name),
        }));
    }
    Ok(Json(
        json!({ "triggers": out, "read_only": admin.read_only }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduledQuery {
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    limit: Option<usize>,
    after: Option<String>,
}

async fn scheduled(Named(t): Named, q: Result<Query<ScheduledQuery>, QueryRejection>) -> Reply {
    let q = query(q)?;
    let (limit, after) = (page_limit(q.limit)?, cursor(q.after.as_deref())?);
    let page = t
        .queue
        .browse(q.from_ms, q.to_ms, after.as_ref(), limit)
        .await?;
    Ok(Json(json!({
        "items": page.items,
        "next": page.next.map(|c| c.to_string()),
    })))
}

async fn message(Named(t): Named, Path((_, member)): Path<(String, String)>) -> Reply {
    let found = t.queue.find(member.as_bytes()).await?;
    if found.places.is_empty() {
        return Err(ApiError(
            axum::http::StatusCode::NOT_FOUND,
            format!("`{member}` is not scheduled, in flight or dead"),
        ));
    }
    let places: Vec<&Place> = found.places.iter().collect();
    Ok(Json(json!({
        "member": member,
        "places": places,
        "body_size": found.body_size,
        "body": found.body.map(|b| String::from_utf8_lossy(&b).into_owned()),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForecastQuery {
    bucket_ms: Option<u64>,
    buckets: Option<usize>,
}

async fn forecast(Named(t): Named, q: Result<Query<ForecastQuery>, QueryRejection>) -> Reply {
    let q = query(q)?;
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
struct DeadQuery {
    limit: Option<usize>,
    after: Option<String>,
}

async fn dead(Named(t): Named, q: Result<Query<DeadQuery>, QueryRejection>) -> Reply {
    let q = query(q)?;
    let (limit, after) = (page_limit(q.limit)?, cursor(q.after.as_deref())?);
    let page = t.queue.list_dead_after(after.as_ref(), limit).await?;
    let items: Vec<Value> = page
        .items
        .into_iter()
        .map(|d| {
            let reason = d
                .reason
                .and_then(|r| serde_json::from_str::<Value>(&r).ok());
            json!({
                "member": String::from_utf8_lossy(&d.member),
                "at_ms": d.at_ms,
                "attempts": reason.as_ref().and_then(|r| r.get("attempts")).and_then(Value::as_u64),
                "reason": reason,
                "body_size": d.body_size,
                "body_preview": String::from_utf8_lossy(&d.body_preview),
            })
        })
        .collect();
    Ok(Json(
        json!({ "items": items, "next": page.next.map(|c| c.to_string()) }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InflightQuery {
    limit: Option<usize>,
}

/// Members claimed by a bridge and not yet settled, earliest lease deadline first.
async fn inflight(Named(t): Named, q: Result<Query<InflightQuery>, QueryRejection>) -> Reply {
    let limit = page_limit(query(q)?.limit)?;
    let now_ms = t.queue.now_ms().await?;
    let items: Vec<Value> = t
        .queue
        .list_inflight(limit)
        .await?
        .into_iter()
        .map(|(member, deadline)| {
            json!({ "member": String::from_utf8_lossy(&member), "lease_deadline_ms": deadline })
        })
        .collect();
    Ok(Json(json!({ "now_ms": now_ms, "items": items })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    window: Option<String>,
}

/// The trigger's last 15 minutes or hour on this bridge, a point per 10 s.
async fn history(
    State(admin): State<Admin>,
    Named(t): Named,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> Reply {
    let window = query(q)?.window.unwrap_or_else(|| "15m".into());
    let span = match window.as_str() {
        "15m" => Duration::from_secs(900),
        "1h" => Duration::from_secs(3600),
        _ => return Err(ApiError::bad("`window` must be \"15m\" or \"1h\"")),
    };
    Ok(Json(json!({
        "window": window,
        "interval_ms": super::history::INTERVAL.as_millis() as u64,
        "points": admin.history.points(&t.config.name, span),
    })))
}

async fn set_paused(act: Act, paused: bool) -> Reply {
    let changed = act.t.queue.set_paused(paused).await?;
    act.audit(if paused { "pause" } else { "resume" }, u64::from(changed));
    Ok(Json(json!({ "paused": paused, "changed": changed })))
}

async fn pause(act: Act) -> Reply {
    set_paused(act, true).await
}

async fn resume(act: Act) -> Reply {
    set_paused(act, false).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Members {
    members: Vec<String>,
}

async fn promote(act: Act, b: Result<Json<Members>, JsonRejection>) -> Reply {
    let t = &act.t;
    let members = members(body(b)?.members)?;
    let changed = t.queue.reschedule(&members, None, true).await?;
    act.audit("promote", changed);
    Ok(Json(json!({ "changed": changed })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Reschedule {
    members: Vec<String>,
    due_ms: i64,
}

async fn reschedule(act: Act, b: Result<Json<Reschedule>, JsonRejection>) -> Reply {
    let t = &act.t;
    let b = body(b)?;
    let members = members(b.members)?;
    let changed = t.queue.reschedule(&members, Some(b.due_ms), false).await?;
    act.audit("reschedule", changed);
    Ok(Json(json!({ "changed": changed })))
}

async fn cancel(act: Act, b: Result<Json<Members>, JsonRejection>) -> Reply {
    let t = &act.t;
    let mut cancelled = 0u64;
    for m in members(body(b)?.members)? {
        cancelled += u64::from(t.queue.cancel(&m).await?);
    }
    act.audit("cancel", cancelled);
    Ok(Json(json!({ "cancelled": cancelled })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    what: String,
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    #[serde(default)]
    confirm: bool,
    /// Only the dead letters with this reason.
    reason: Option<String>,
    /// Count what would be deleted, delete nothing.
    #[serde(default)]
    dry_run: bool,
}

async fn purge(act: Act, b: Result<Json<PurgeBody>, JsonRejection>) -> Reply {
    let t = &act.t;
    let b = body(b)?;
    if b.reason.is_some() && b.what != "dead" {
        return Err(ApiError::bad("`reason` filters dead letters only"));
    }
    if b.dry_run {
        let matching = match (b.what.as_str(), &b.reason) {
            ("dead", Some(reason)) => t.queue.purge_dead_reason(reason, true).await?,
            ("dead", None) => t.queue.stats().await?.dead,
            ("scheduled", _) => t.queue.count_scheduled(b.from_ms, b.to_ms).await?,
            _ => return Err(ApiError::bad("`what` must be \"scheduled\" or \"dead\"")),
        };
        return Ok(Json(json!({ "matching": matching })));
    }
    let what = match (b.what.as_str(), b.from_ms, b.to_ms) {
        ("scheduled", from, to) => Purge::Scheduled { from, to },
        ("dead", None, None) => Purge::Dead,
        ("dead", _, _) => return Err(ApiError::bad("a dead-letter purge takes no range")),
        _ => return Err(ApiError::bad("`what` must be \"scheduled\" or \"dead\"")),
    };
    if !b.confirm {
        return Err(ApiError::bad(
            "a purge deletes messages for good: send \"confirm\": true",
        ));
    }
    let deleted = match (&b.reason, what) {
        (Some(reason), Purge::Dead) => t.queue.purge_dead_reason(reason, false).await?,
        _ => t.queue.purge(what).await?,
    };
    act.audit("purge", deleted);
    Ok(Json(json!({ "deleted": deleted })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Requeue {
    #[serde(default)]
    members: Vec<String>,
    limit: Option<usize>,
}

async fn requeue(act: Act, b: Result<Json<Requeue>, JsonRejection>) -> Reply {
    let t = &act.t;
    let b = body(b)?;
    let limit = b.limit.unwrap_or(MAX_PAGE);
    if b.members.len() > MAX_MEMBERS || !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad(format!(
            "at most {MAX_MEMBERS} `members`, and `limit` 1 to {MAX_PAGE}"
        )));
    }
    let members: Vec<Vec<u8>> = b.members.into_iter().map(String::into_bytes).collect();
    let requeued = t.queue.requeue_dead(&members, limit).await?;
    act.audit("requeue", requeued);
    Ok(Json(json!({ "requeued": requeued })))
}

/// Asks the bridge to reload its configuration file, as SIGHUP does; the outcome is logged
/// and counted (`delay_bridge_config_reloads_total`, `..._reload_failures_total`).
async fn reload(State(admin): State<Admin>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Reply {
    let Some(reload) = &admin.reload else {
        return Err(ApiError(
            axum::http::StatusCode::CONFLICT,
            "this bridge was not started from a configuration file it can reload".into(),
        ));
    };
    reload.notify_one();
    tracing::info!(target: "delay_bridge::audit", %peer, action = "reload", "admin call");
    Ok(Json(json!({ "reload": "requested" })))
}
