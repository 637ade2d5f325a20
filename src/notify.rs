//! Keyspace notifications: wake a trigger's idle worker as soon as a producer `ZADD`s to its key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::redis_conn::{Conn, Endpoint};
use crate::repeat::Repeated;
use crate::worker::Shard;

mod cluster;

/// A keyspace event of `list`'s key: any write changes the sizes; only an addition can move
/// the head earlier.
fn written(list: &[Arc<Shard>], event: &[u8]) {
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
fn look_again(by_channel: &HashMap<Vec<u8>, Vec<Arc<Shard>>>) {
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
    by_channel: &HashMap<Vec<u8>, Vec<Arc<Shard>>>,
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
pub(crate) async fn listen(
    conn: Conn,
    enable: bool,
    triggers: Vec<Arc<Shard>>,
    health: Health,
    stop: CancellationToken,
) {
    let endpoint = conn.endpoint().clone();
    let mut by_channel: HashMap<Vec<u8>, Vec<Arc<Shard>>> = HashMap::new();
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
        by_channel: &HashMap<Vec<u8>, Vec<Arc<Shard>>>,
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
