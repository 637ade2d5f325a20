//! The admin API's routes under `/api/v1`: read a trigger's queue, and act on it.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::header::CONTENT_TYPE;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::extract::{Act, JsonBody, Reply};
use super::json::members_of;
use super::{reads, Admin, ApiError};
use crate::redis::store::{Purge, MAX_PAGE};

/// Most members one call names.
const MAX_MEMBERS: usize = 1000;

/// The console: one page, its script and its style, embedded in the binary; the script is
/// served as its own file so that the Content-Security-Policy allows no inline script.
const CONSOLE: &str = include_str!("console.html");

/// The console's files besides its page: path, content type, content.
const ASSETS: [(&str, &str, &str); 4] = [
    ("/console.js", JS, include_str!("console.js")),
    ("/console-charts.js", JS, include_str!("console-charts.js")),
    ("/console-drawer.js", JS, include_str!("console-drawer.js")),
    (
        "/console.css",
        "text/css; charset=utf-8",
        include_str!("console.css"),
    ),
];
const JS: &str = "text/javascript; charset=utf-8";

/// Whether `path` is the console's page or one of its files, which hold no data and are
/// served without the token.
pub(super) fn is_console(path: &str) -> bool {
    matches!(path, "/" | "/console") || ASSETS.iter().any(|(p, _, _)| *p == path)
}

pub(super) fn router() -> Router<Admin> {
    let mut router = Router::new().merge(super::schedules::router());
    for (path, kind, body) in ASSETS {
        router = router.route(
            path,
            get(move || async move { ([(CONTENT_TYPE, kind)], body) }),
        );
    }
    router
        .route(
            "/",
            get(|| async { axum::response::Redirect::to("/console") }),
        )
        .route("/console", get(|| async { axum::response::Html(CONSOLE) }))
        .route("/api/v1/triggers", get(triggers))
        .route(
            "/api/v1/triggers/{trigger}/scheduled",
            get(reads::scheduled),
        )
        .route(
            "/api/v1/triggers/{trigger}/messages/{member}",
            get(reads::message),
        )
        .route("/api/v1/triggers/{trigger}/forecast", get(reads::forecast))
        .route("/api/v1/triggers/{trigger}/dead", get(reads::dead))
        .route("/api/v1/triggers/{trigger}/inflight", get(reads::inflight))
        .route("/api/v1/triggers/{trigger}/history", get(reads::history))
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

/// The members a call names, as text (`members`) or base64 (`members_b64`): 1 to
/// [`MAX_MEMBERS`] in all.
fn members(text: Vec<String>, b64: Vec<String>) -> Result<Vec<Vec<u8>>, ApiError> {
    let all = members_of(text, b64)?;
    if all.is_empty() || all.len() > MAX_MEMBERS {
        return Err(ApiError::bad(format!(
            "`members` and `members_b64` must name 1 to {MAX_MEMBERS} members"
        )));
    }
    Ok(all)
}

async fn triggers(State(admin): State<Admin>) -> Reply {
    let mut out = Vec::new();
    for t in admin.triggers.now()?.values() {
        let stats = t.queue.stats().await?;
        let held = t.queue.held().await?;
        let state = crate::trigger::State::of(stats.paused, held.is_some()).as_str();
        let rate = t
            .config
            .rate()
            .map(|r| json!({ "per_second": r.per_second(), "burst": r.burst() }));
        let (forwarded, lateness_p99) = admin.delivery(&t.config);
        out.push(json!({
            "name": t.config.name(),
            "key": t.config.key(),
            "sink": t.config.sink(),
            "payload": t.config.payload(),
            "rate_limit": rate,
            "stats": stats,
            "state": state,
            "held": held,
            "forwarded_total": forwarded,
            "lateness_p99_seconds": lateness_p99,
            "lateness_p99_1m_seconds": admin.history.recent_p99(t.config.name()),
        }));
    }
    Ok(Json(
        json!({ "triggers": out, "read_only": admin.read_only }),
    ))
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
    /// Members as UTF-8 text.
    #[serde(default)]
    members: Vec<String>,
    /// Members as base64, for those that are not UTF-8.
    #[serde(default)]
    members_b64: Vec<String>,
}

async fn promote(act: Act, JsonBody(b): JsonBody<Members>) -> Reply {
    let t = &act.t;
    let members = members(b.members, b.members_b64)?;
    let changed = t.queue.reschedule(&members, None, true).await?;
    act.audit("promote", changed);
    Ok(Json(json!({ "changed": changed })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Reschedule {
    #[serde(default)]
    members: Vec<String>,
    #[serde(default)]
    members_b64: Vec<String>,
    due_ms: i64,
}

async fn reschedule(act: Act, JsonBody(b): JsonBody<Reschedule>) -> Reply {
    let t = &act.t;
    let members = members(b.members, b.members_b64)?;
    let changed = t.queue.reschedule(&members, Some(b.due_ms), false).await?;
    act.audit("reschedule", changed);
    Ok(Json(json!({ "changed": changed })))
}

async fn cancel(act: Act, JsonBody(b): JsonBody<Members>) -> Reply {
    let t = &act.t;
    let mut cancelled = 0u64;
    for m in members(b.members, b.members_b64)? {
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

async fn purge(act: Act, JsonBody(b): JsonBody<PurgeBody>) -> Reply {
    let t = &act.t;
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
    #[serde(default)]
    members_b64: Vec<String>,
    limit: Option<usize>,
}

async fn requeue(act: Act, JsonBody(b): JsonBody<Requeue>) -> Reply {
    let t = &act.t;
    let limit = b.limit.unwrap_or(MAX_PAGE);
    let members = members_of(b.members, b.members_b64)?;
    if members.len() > MAX_MEMBERS || !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad(format!(
            "at most {MAX_MEMBERS} `members`, and `limit` 1 to {MAX_PAGE}"
        )));
    }
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
