//! What tests read back from Redis, the admin API and the metrics, and the odd write to a
//! sorted set or a string key, each in one call.

use redis::{FromRedisValue, ToRedisArgs};
use serde_json::Value;

use super::http::{request, Response};
use super::{metric_value, query, Conn};

/// Every member of the sorted set `key`, in its order.
pub async fn zmembers(r: &mut Conn, key: impl ToRedisArgs) -> Vec<String> {
    query(r, "ZRANGE", (key, 0, -1)).await
}

/// Every member of the sorted set `key` with its score, in its order, as the type asked for
/// (`Vec<(Vec<u8>, f64)>`, or a map of member to the score as Redis prints it).
pub async fn zscored<T: FromRedisValue>(r: &mut Conn, key: impl ToRedisArgs) -> T {
    query(r, "ZRANGE", (key, 0, -1, "WITHSCORES")).await
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
    query(r, "ZREM", (key, member)).await
}

/// `SET key value`: a string where a test wants a key of the wrong type.
pub async fn set_string(r: &mut Conn, key: &str, value: &str) {
    query::<()>(r, "SET", (key, value)).await
}
