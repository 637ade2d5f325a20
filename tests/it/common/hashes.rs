//! Reads and writes of one field of a Redis hash (a queue's control, attempts or bodies hash).

use redis::{FromRedisValue, ToRedisArgs};

use super::Conn;

/// `HGET key field`, as the type asked for (`Option<...>` for a field that may be absent).
pub async fn hget<T: FromRedisValue>(r: &mut Conn, key: &str, field: impl ToRedisArgs) -> T {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(r)
        .await
        .unwrap()
}

/// `HSET key field value`.
pub async fn hset(r: &mut Conn, key: &str, field: impl ToRedisArgs, value: impl ToRedisArgs) {
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg(field)
        .arg(value)
        .query_async(r)
        .await
        .unwrap();
}
