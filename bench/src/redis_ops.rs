//! The Redis side of the bench: loading queues, the claim-script ceiling, counting commands.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use delay_bridge::keys::QueueKeys;
use delay_bridge::parts::redis::conn::Conn;
use delay_bridge::parts::redis::store::Store;
use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use tokio_util::sync::CancellationToken;

use super::shape::{PayloadArg, Shape};

/// Members per `ZADD` and `ZADD`s per round trip while loading.
const LOAD_CHUNK: u64 = 1000;
const LOAD_PIPELINE: u64 = 8;

/// Schedules `count` bench messages (sequence `base..base + count`) of `shape` on the sorted
/// set `zset` of queue `key` (bodies in `key`'s bodies hash), scored by `due(seq)`.
#[allow(clippy::too_many_arguments)]
pub async fn load(
    conn: &mut impl ConnectionLike,
    shape: &Shape,
    key: &str,
    zset: &str,
    base: u64,
    count: u64,
    due: impl Fn(u64) -> i64,
) -> anyhow::Result<()> {
    let queue = QueueKeys::derive(key)?;
    let mut i = 0;
    while i < count {
        let mut pipe = redis::pipe();
        for _ in 0..LOAD_PIPELINE {
            if i >= count {
                break;
            }
            let end = (i + LOAD_CHUNK).min(count);
            shape.schedule_many(&mut pipe, &queue, zset, base + i..base + end, |seq| {
                due(seq - base)
            });
            i = end;
        }
        pipe.query_async::<()>(conn).await?;
    }
    Ok(())
}

/// Deletes a queue's source set and every key derived from it (`UNLINK`: large sets are freed
/// in the background instead of blocking Redis).
pub async fn unlink_queue(conn: &mut impl ConnectionLike, key: &str) -> redis::RedisResult<()> {
    let Ok(k) = QueueKeys::derive(key) else {
        return Ok(());
    };
    // The queue's keys, and the registry of the shard counts it was served with.
    let counts = k
        .control
        .strip_suffix(":control")
        .map(|base| format!("{base}:shard-counts"));
    redis::cmd("UNLINK")
        .arg(&k.all()[..])
        .arg(counts.as_slice())
        .query_async(conn)
        .await
}

/// Members in the source and in-flight sets of a queue.
pub async fn queue_len(conn: &mut impl ConnectionLike, key: &str) -> redis::RedisResult<u64> {
    let k = QueueKeys::derive(key)
        .map_err(|e| redis::RedisError::from((redis::ErrorKind::Client, "key", e.to_string())))?;
    let (a, b): (u64, u64) = redis::pipe()
        .zcard(&k.source)
        .zcard(&k.inflight)
        .query_async(conn)
        .await?;
    Ok(a + b)
}

/// The store a ceiling claims from: queue `key`, its bodies in the bodies hash when `shape`
/// keeps them there.
pub fn ceiling_store(conn: Conn, key: &str, shape: &Shape) -> anyhow::Result<Store> {
    let store = Store::new(conn, QueueKeys::derive(key)?);
    Ok(if shape.payload == PayloadArg::Hash {
        store.with_hash_bodies(16 * 1024 * 1024)
    } else {
        store
    })
}

/// Drains `key` with the bridge's own claim and settle scripts and nothing else: `workers`
/// concurrent loops of claim(`batch`) then ack-all; returns the members claimed.
pub async fn claim_ceiling(
    conn: Conn,
    key: &str,
    shape: &Shape,
    workers: usize,
    batch: usize,
) -> anyhow::Result<u64> {
    let store = ceiling_store(conn, key, shape)?;
    let lease = Duration::from_secs(60);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut claimed = 0u64;
            loop {
                let b = store.claim(batch, lease).await?;
                if b.items.is_empty() {
                    return Ok::<_, anyhow::Error>(claimed);
                }
                claimed += b.items.len() as u64;
                delay_bridge::hooks::ack_unpublished(&store, &b, 10).await?;
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total)
}

/// `CONFIG GET notify-keyspace-events`.
pub async fn notify_flags(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    let (_, flags): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await?;
    Ok(flags)
}

/// `CONFIG SET notify-keyspace-events <flags>`.
pub async fn set_notify_flags(
    conn: &mut MultiplexedConnection,
    flags: &str,
) -> redis::RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(flags)
        .query_async(conn)
        .await
}

/// A field of `INFO <section>`, e.g. `redis_version` or `total_commands_processed`.
pub async fn info_field(
    conn: &mut MultiplexedConnection,
    section: &str,
    field: &str,
) -> redis::RedisResult<Option<String>> {
    let text: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    Ok(field_of(&text, field).map(str::to_string))
}

/// The value of `field` in the text of an `INFO` reply.
fn field_of<'t>(text: &'t str, field: &str) -> Option<&'t str> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// The Redis server's own CPU time so far (`used_cpu_sys` + `used_cpu_user`), seconds.
pub async fn server_cpu_seconds(
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<Option<f64>> {
    let text: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let seconds = |field| field_of(&text, field)?.parse::<f64>().ok();
    Ok(seconds("used_cpu_sys")
        .zip(seconds("used_cpu_user"))
        .map(|(s, u)| s + u))
}

/// Counts the commands every client sends, by client port, until `stop` (`MONITOR`).
pub struct CommandCounter {
    counts: Arc<std::sync::Mutex<HashMap<u16, u64>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl CommandCounter {
    /// Starts monitoring; fails when `MONITOR` is not allowed.
    pub async fn start(client: &redis::Client) -> redis::RedisResult<Self> {
        // The client sends MONITOR before handing the connection over.
        let monitor = client.get_async_monitor().await?;
        let counts = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let stop = CancellationToken::new();
        let (c, s) = (counts.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut lines = monitor.into_on_message::<String>();
            loop {
                let line = tokio::select! {
                    l = lines.next() => match l { Some(l) => l, None => return },
                    _ = s.cancelled() => return,
                };
                if let Some(port) = client_port(&line) {
                    *c.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(port)
                        .or_insert(0) += 1;
                }
            }
        });
        Ok(Self { counts, stop, task })
    }

    /// Stops monitoring; returns the commands counted per client port.
    pub async fn finish(self) -> HashMap<u16, u64> {
        self.stop.cancel();
        let _ = self.task.await;
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.clone()
    }
}

/// The client port of a `MONITOR` line: `1700000000.123456 [0 127.0.0.1:54321] "PING"`.
/// Commands run by scripts (`[0 lua]`) have none: they are part of the `EVALSHA` counted already.
fn client_port(line: &str) -> Option<u16> {
    let rest = line.split_once('[')?.1;
    let addr = rest.split_whitespace().nth(1)?.strip_suffix(']')?;
    addr.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_name_the_client_port() {
        let l = r#"1700000000.123456 [0 127.0.0.1:54321] "EVALSHA" "abc" "3""#;
        assert_eq!(client_port(l), Some(54321));
        let l6 = r#"1700000000.123456 [0 [::1]:40000] "PING""#;
        assert_eq!(client_port(l6), Some(40000));
        assert_eq!(client_port(r#"1700000000.1 [0 lua] "ZRANGE""#), None);
        assert_eq!(client_port("OK"), None);
    }
}
