//! What the admin API's handlers take from a request and give back: the trigger a route
//! names, the caller of a call that changes a queue, the query, the JSON body, a page's limit
//! and cursor, and the reply.

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Admin, AdminTrigger, ApiError};
use crate::redis::store::{Cursor, MAX_PAGE};

/// What a handler answers: its JSON, or the error the API turns into a status and a message.
pub(super) type Reply = Result<Json<Value>, ApiError>;

/// The trigger a route names (`{trigger}` in its path): 404 when there is none, 503 while
/// the bridge is starting.
pub(super) struct Named(pub(super) AdminTrigger);

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
pub(super) struct Act {
    pub(super) t: AdminTrigger,
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
    pub(super) fn audit(&self, action: &str, count: u64) {
        tracing::info!(target: "delay_bridge::audit", peer = %self.peer, action, trigger = %self.t.config.name(), count, "admin call");
    }
}

/// The query string read into `T`; a query that does not read is a 400 that says why.
pub(super) struct Params<T>(pub(super) T);

impl<T: DeserializeOwned> FromRequestParts<Admin> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, admin: &Admin) -> Result<Self, ApiError> {
        let Query(q) = Query::<T>::from_request_parts(parts, admin)
            .await
            .map_err(|e| ApiError::bad(format!("bad query: {}", e.body_text())))?;
        Ok(Params(q))
    }
}

/// The JSON body read into `T`; a body that does not read is a 400 that says why.
pub(super) struct JsonBody<T>(pub(super) T);

impl<T: DeserializeOwned> FromRequest<Admin> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, admin: &Admin) -> Result<Self, ApiError> {
        let Json(b) = Json::<T>::from_request(request, admin)
            .await
            .map_err(|e| ApiError::bad(format!("bad JSON body: {}", e.body_text())))?;
        Ok(JsonBody(b))
    }
}

/// A page's `limit`: 100 unless given, 1 to [`MAX_PAGE`].
pub(super) fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad(format!("`limit` must be 1 to {MAX_PAGE}")));
    }
    Ok(limit)
}

/// A page's `after`: where the previous page ended.
pub(super) fn cursor(after: Option<&str>) -> Result<Option<Cursor>, ApiError> {
    after.map(str::parse).transpose().map_err(ApiError::bad)
}
