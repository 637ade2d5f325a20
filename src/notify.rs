//! Keyspace notifications: wake a trigger's idle worker as soon as a producer `ZADD`s to its key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::redis_conn::{Conn, Endpoint};

mod cluster;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::repeat::Repeated;
use crate::worker::Trigger;

/// Flags the bridge needs in `notify-keyspace-events`: keyspace channel (K), sorted-set events (z).
const NEEDED: [char; 2] = ['K', 'z'];

/// True when the flags deliver sorted-set events on the keyspace channel (`A` includes `z`).
pub fn flags_suffice(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('z') || flags.contains('A'))
}

/// The flags with what the bridge needs added, keeping the existing ones.
pub fn with_needed_flags(flags: &str) -> String {
    let mut out = flags.to_string();
    for c in NEEDED {
        if c == 'z' && flags.contains('A') {
            continue;
        }
        if !out.contains(c) {
            out.push(c);
        }
    }
    out
}

/// One setting of every server (every node of a cluster, replicas included): each node's
/// address and the value or why it could not be read.
pub async fn config_get(conn: &Conn, name: &str) -> Vec<(String, Result<String, String>)> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(name);
    match conn.each_node(cmd).await {
        Ok(replies) => replies
            .into_iter()
            .map(|(node, reply)| {
                let value = reply
                    .map_err(|e| e.to_string())
                    .and_then(|v| {
                        redis::from_redis_value::<(String, String)>(v).map_err(|e| e.to_string())
                    })
                    .map(|(_, value)| value);
                (node, value)
            })
            .collect(),
        Err(e) => vec![(conn.endpoint().to_string(), Err(e.to_string()))],
    }
}

/// Checks `notify-keyspace-events` on every server, enabling it where allowed; returns whether
/// notifications will arrive from all of them.
pub async fn ensure_enabled(conn: &Conn, enable: bool) -> bool {
    let mut all = true;
    for (node, flags) in config_get(conn, "notify-keyspace-events").await {
        let flags = match flags {
            Ok(flags) => flags,
            Err(e) => {
                tracing::warn!(%node, error = %e, "cannot read notify-keyspace-events; idle workers will rely on guard_interval");
                all = false;
                continue;
            }
        };
        if flags_suffice(&flags) {
            continue;
        }
        if !enable {
            tracing::warn!(
                %node,
                current = %flags,
                "Redis keyspace notifications for sorted sets are off (notify-keyspace-events lacks Kz): \
                 messages added earlier than the queue head may wait up to guard_interval; \
                 set [redis] enable_keyspace_events = true or run CONFIG SET notify-keyspace-events Kz"
            );
            all = false;
            continue;
        }
        all &= enable_on(conn, &node, &with_needed_flags(&flags)).await;
    }
    all
}

/// Sets `notify-keyspace-events` to `wanted` on `node` (or on the one server).
async fn enable_on(conn: &Conn, node: &str, wanted: &str) -> bool {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET").arg("notify-keyspace-events").arg(wanted);
    let set = match conn.set_on(node, cmd).await {
        Ok(redis::Value::Okay) => Ok(()),
        Ok(other) => Err(format!("unexpected reply {other:?}")),
        Err(e) => Err(e.to_string()),
    };
    match set {
        Ok(()) => {
            tracing::info!(%node, flags = %wanted, "enabled Redis keyspace notifications");
            true
        }
        Err(e) => {
            tracing::warn!(%node, error = %e, "could not enable keyspace notifications; idle workers will rely on guard_interval");
            false
        }
    }
}

/// A keyspace event of `list`'s key: any write changes the sizes; only an addition can move
/// the head earlier.
fn written(list: &[Arc<Trigger>], event: &[u8]) {
    let added = matches!(
        event,
        b"zadd"
            | b"zincr"
            | b"zunionstore"
            | b"zinterstore"
            | b"zdiffstore"
            | b"zrangestore"
            | b"rename_to"
            | b"restore"
    );
    for t in list {
        t.touched();
        if added {
            t.wake();
        }
    }
}

/// Wakes every trigger and has its sizes read again: writes may have gone unnoticed.
fn look_again(by_channel: &HashMap<Vec<u8>, Vec<Arc<Trigger>>>) {
    for t in by_channel.values().flatten() {
        t.touched();
        t.wake();
    }
}

/// After a subscription ended: logs why if it failed (at growing gaps) and marks
/// notifications down, so idle workers go back to their short guard; has every trigger look
/// again; and waits before the next attempt, longer after each failure. False once `stop`.
async fn between_subscriptions(
    outcome: Result<(), String>,
    by_channel: &HashMap<Vec<u8>, Vec<Arc<Trigger>>>,
    health: &Health,
    failures: &mut Repeated,
    stop: &CancellationToken,
) -> bool {
    if let Err(e) = outcome {
        health.set_notifications(false);
        if let Some(unlogged) = failures.failed() {
            tracing::warn!(error = %e, failures = failures.count(), unlogged,
                "keyspace notification subscription lost, resubscribing");
        }
    }
    look_again(by_channel);
    let pause = Duration::from_millis(100 * u64::from(failures.count().min(50)));
    tokio::select! {
        _ = tokio::time::sleep(pause) => true,
        _ = stop.cancelled() => false,
    }
}

/// Channels asked for in one SUBSCRIBE: thousands of triggers subscribe in a few round trips.
const SUBSCRIBE_CHUNK: usize = 1000;

/// Subscribes to the keyspace channel of every trigger key and wakes the trigger's idle worker
/// on each sorted-set write. Resubscribes after connection loss. While subscribed, `health`
/// says so: idle workers then sleep up to their `notified_guard_interval`.
/// On a cluster, each key's channel is subscribed on the master that owns the key's slot (only
/// it publishes the key's events), and the subscriptions follow failovers; after any of them
/// every trigger looks again, and with `enable` every node gets `Kz` again.
pub async fn listen(
    conn: Conn,
    enable: bool,
    triggers: Vec<Arc<Trigger>>,
    health: Health,
    stop: CancellationToken,
) {
    let endpoint = conn.endpoint().clone();
    let mut by_channel: HashMap<Vec<u8>, Vec<Arc<Trigger>>> = HashMap::new();
    for t in triggers {
        let channel = format!("__keyspace@{}__:{}", endpoint.db(), t.source_key()).into_bytes();
        by_channel.entry(channel).or_default().push(t);
    }
    if endpoint.is_cluster() {
        return cluster::listen(conn, enable, by_channel, health, stop).await;
    }
    let mut failures = Repeated::default();
    while !stop.is_cancelled() {
        let outcome = subscribe(&endpoint, &by_channel, &health, &stop, &mut failures)
            .await
            .map_err(|e| e.to_string());
        if !between_subscriptions(outcome, &by_channel, &health, &mut failures, &stop).await {
            return;
        }
    }

    async fn subscribe(
        endpoint: &Endpoint,
        by_channel: &HashMap<Vec<u8>, Vec<Arc<Trigger>>>,
        health: &Health,
        stop: &CancellationToken,
        failures: &mut Repeated,
    ) -> redis::RedisResult<()> {
        let mut pubsub = endpoint.pubsub().await?;
        let channels: Vec<&[u8]> = by_channel.keys().map(Vec::as_slice).collect();
        for chunk in channels.chunks(SUBSCRIBE_CHUNK) {
            pubsub.subscribe(chunk).await?;
        }
        failures.recovered();
        health.set_notifications(true);
        // A write may have gone unnoticed while unsubscribed: every trigger looks again.
        look_again(by_channel);
        let mut messages = pubsub.on_message();
        loop {
            tokio::select! {
                msg = messages.next() => {
                    let Some(msg) = msg else {
                        return Err(redis::RedisError::from((redis::ErrorKind::Io, "subscription closed")));
                    };
                    let Some(list) = by_channel.get(msg.get_channel_name().as_bytes()) else {
                        continue;
                    };
                    written(list, msg.get_payload_bytes());
                }
                _ = stop.cancelled() => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_added_not_replaced() {
        assert!(!flags_suffice(""));
        assert!(!flags_suffice("Ex"));
        assert!(flags_suffice("KA"));
        assert!(flags_suffice("Kz"));
        assert_eq!(with_needed_flags(""), "Kz");
        assert_eq!(with_needed_flags("Ex"), "ExKz");
        assert_eq!(with_needed_flags("EA"), "EAK");
    }
}
