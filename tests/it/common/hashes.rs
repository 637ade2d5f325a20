//! Reads, writes and deletes of one field of a Redis hash (a queue's control, attempts or bodies hash).

use redis::{FromRedisValue, ToRedisArgs};

use super::{query, Conn};

/// `HGET key field`, as the type asked for (`Option<...>` for a field that may be absent).
pub async fn hget<T: FromRedisValue>(r: &mut Conn, key: &str, field: impl ToRedisArgs) -> T {
    query(r, "HGET", (key, field)).await
}

/// `HSET key field value`.
pub async fn hset(r: &mut Conn, key: &str, field: impl ToRedisArgs, value: impl ToRedisArgs) {
    query::<()>(r, "HSET", (key, field, value)).await
}

/// `HDEL key field`.
pub async fn hdel(r: &mut Conn, key: &str, field: impl ToRedisArgs) {
    query::<()>(r, "HDEL", (key, field)).await
}
