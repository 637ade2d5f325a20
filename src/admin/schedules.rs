//! The admin API's routes of a trigger's schedules: list them (the config's and those added
//! at run time, with their last and next fire), add one at run time, remove one.

use std::collections::HashMap;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde_json::json;

use super::extract::{Act, JsonBody, Named, Reply};
use super::{Admin, ApiError};
use crate::config::ScheduleConfig;
use crate::schedule::stored::{self, ChangeError};

/// The routes, merged into the API's.
pub(super) fn router() -> Router<Admin> {
    Router::new()
        .route("/api/v1/triggers/{trigger}/schedules", get(list).post(add))
        .route(
            "/api/v1/triggers/{trigger}/schedules/{name}",
            delete(remove),
        )
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Invalid(_) => ApiError::bad(e.to_string()),
            ChangeError::Conflict(why) => ApiError(StatusCode::CONFLICT, why),
            ChangeError::Missing(why) => ApiError(StatusCode::NOT_FOUND, why),
            ChangeError::Store(e) => e.into(),
        }
    }
}

async fn list(Named(t): Named) -> Reply {
    let rows = stored::list(&t.queue.shards()[0], &t.config).await?;
    Ok(Json(json!({ "schedules": rows })))
}

async fn add(act: Act, JsonBody(s): JsonBody<ScheduleConfig>) -> Reply {
    stored::add(&act.t.queue.shards()[0], &act.t.config, &s).await?;
    act.audit("schedule-add", 1);
    let next = crate::cron::Cron::parse(&s.cron, &s.timezone)
        .ok()
        .and_then(|c| c.next_after(crate::cron::now_ms()));
    Ok(Json(json!({ "added": s.name, "next_fire_ms": next })))
}

async fn remove(act: Act, Path(params): Path<HashMap<String, String>>) -> Reply {
    let name = params.get("name").map_or("", String::as_str);
    stored::remove(&act.t.queue.shards()[0], &act.t.config, name).await?;
    act.audit("schedule-remove", 1);
    Ok(Json(json!({ "removed": name })))
}
