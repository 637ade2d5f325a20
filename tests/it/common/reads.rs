//! What tests read back from Redis, the admin API and the metrics, and the odd write to a
//! sorted set, each in one call.

use redis::ToRedisArgs;
use serde_json::Value;

use super::http::{request, Response};
use super::{metric_value, Conn};

/// Every member of the sorted set `key`, in its order.
pub async fn zmembers(r: &mut Conn, key: impl ToRedisArgs) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(r)
        .await
        .unwrap()
}

/// The members of a page of the admin API (`items[].member`), in its order.
pub fn item_members(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["member"].as_str().unwrap())
        .collect()
}

/// `GET path` on the admin API at `port` with the bearer `token`.
pub async fn get_with_token(port: u16, path: &str, token: &str) -> Response {
    let auth = format!("Bearer {token}");
    request(port, "GET", path, &[("Authorization", &auth)], None).await
}

/// `delay_bridge_messages_dead_lettered_total` of `trigger` for `reason` in the metrics `text`.
pub fn dead_lettered(text: &str, trigger: &str, reason: &str) -> f64 {
    metric_value(
        text,
        "delay_bridge_messages_dead_lettered_total",
        &[("trigger", trigger), ("reason", reason)],
    )
}

/// `ZREM key member`: how many members it removed.
pub async fn zrem(r: &mut Conn, key: &str, member: impl ToRedisArgs) -> i64 {
    redis::cmd("ZREM")
        .arg(key)
        .arg(member)
        .query_async(r)
        .await
        .unwrap()
}
