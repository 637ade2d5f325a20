//! The admin API of a running bridge against real Redis and RabbitMQ: the token, every
//! route acting on the queue, bad input, audit lines, read-only mode, and the OpenAPI file
//! checked against what the server answered.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::http::{request, Response};
use common::*;
use delay_bridge::keys::{shard_key, shard_of, QueueKeys};
use serde_json::{json, Value};

mod access;
mod bounded;
mod members;
mod openapi;
mod sharded;

const TOKEN: &str = "a-token-of-32-characters-exactly";

/// Calls the API, recording (method, route, status) to check against the OpenAPI file.
struct Api {
    port: u16,
    calls: Vec<(String, String, u16)>,
}

impl Api {
    async fn call(
        &mut self,
        method: &str,
        route: &str,
        trigger: &str,
        tail: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> Response {
        let path = route.replace("{trigger}", trigger) + tail;
        let path = match path.split_once("{member}") {
            Some(_) => path.replace("{member}", ""),
            None => path,
        };
        let path = path.replace("{name}", "");
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        let body = body.map(|b| b.to_string());
        let r = request(self.port, method, &path, &headers, body.as_deref()).await;
        self.calls
            .push((method.to_lowercase(), route.to_string(), r.status));
        r
    }

    async fn get(&mut self, route: &str, trigger: &str, tail: &str) -> Response {
        self.call("GET", route, trigger, tail, None, Some(TOKEN))
            .await
    }

    async fn post(&mut self, route: &str, trigger: &str, body: Value) -> Response {
        self.call("POST", route, trigger, "", Some(body), Some(TOKEN))
            .await
    }
}

const TRIGGERS: &str = "/api/v1/triggers";
const SCHEDULED: &str = "/api/v1/triggers/{trigger}/scheduled";
const MESSAGE: &str = "/api/v1/triggers/{trigger}/messages/{member}";
const FORECAST: &str = "/api/v1/triggers/{trigger}/forecast";
const DEAD: &str = "/api/v1/triggers/{trigger}/dead";
const PAUSE: &str = "/api/v1/triggers/{trigger}/pause";
const RESUME: &str = "/api/v1/triggers/{trigger}/resume";
const PROMOTE: &str = "/api/v1/triggers/{trigger}/promote";
const RESCHEDULE: &str = "/api/v1/triggers/{trigger}/reschedule";
const CANCEL: &str = "/api/v1/triggers/{trigger}/cancel";
const PURGE: &str = "/api/v1/triggers/{trigger}/purge";
const REQUEUE: &str = "/api/v1/triggers/{trigger}/dead/requeue";
const INFLIGHT: &str = "/api/v1/triggers/{trigger}/inflight";
const HISTORY: &str = "/api/v1/triggers/{trigger}/history";
const SCHEDULES: &str = "/api/v1/triggers/{trigger}/schedules";
const SCHEDULE: &str = "/api/v1/triggers/{trigger}/schedules/{name}";

fn admin_config(
    metrics_port: u16,
    admin_port: u16,
    key: &str,
    capture: &AmqpCapture,
    extra: &str,
) -> String {
    admin_config_with(metrics_port, admin_port, key, capture, extra, "")
}

/// [`admin_config`] with `trigger_extra` lines in the trigger `api`.
fn admin_config_with(
    metrics_port: u16,
    admin_port: u16,
    key: &str,
    capture: &AmqpCapture,
    extra: &str,
    trigger_extra: &str,
) -> String {
    base_config(metrics_port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n{extra}\n")
        + &amqp_trigger("api", key, capture, trigger_extra)
}

/// Starts a bridge on `config` with the admin token set, and a client for its API.
async fn start_with_api(config: &str, port: u16, admin_port: u16) -> (Bridge, Api) {
    let bridge = Bridge::start_with_env(config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)])
        .ready(Duration::from_secs(20))
        .await;
    let api = Api {
        port: admin_port,
        calls: Vec::new(),
    };
    (bridge, api)
}
