//! Keyspace notifications: tell a key's listener (a trigger's shard, which wakes an idle worker) as soon as a producer `ZADD`s to it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::redis::conn::{Conn, Endpoint};
use crate::repeat::Repeated;

mod cluster;

/// What a keyspace notification reaches: the listener of one key (a trigger's shard).
pub(crate) trait Listener: Send + Sync {
    /// The key whose writes it hears of.
    fn key(&self) -> &str;
    /// The key was written to, or may have been while unsubscribed: its sizes changed.
    fn written(&self);
    /// A member was added: the key's head may have moved earlier.
    fn added(&self);
}

/// Who is told how the subscription stands (the daemon's readiness and its gauge).
pub(crate) trait Subscription: Send + Sync {
    /// Notifications reach the bridge now (`true`), or no longer.
    fn live(&self, live: bool);
    /// A Redis Cluster's topology changed and the subscriptions are following it.
    fn topology_changed(&self);
}

/// The listeners of each keyspace channel.
type ByChannel = HashMap<Vec<u8>, Vec<Arc<dyn Listener>>>;

/// A keyspace event of `list`'s key: any write changes the sizes; only an addition can move
/// the head earlier.
fn written(list: &[Arc<dyn Listener>], event: &[u8]) {
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
        t.written();
        if added {
            t.added();
        }
    }
}

/// Wakes every trigger and has its sizes read again: writes may have gone unnoticed.
fn look_again(by_channel: &ByChannel) {
    for t in by_channel.values().flatten() {
        t.written();
        t.added();
    }
}

/// After a subscription ended: logs why if it failed (at growing gaps) and marks
/// notifications down, so idle workers go back to their short guard; has every trigger look
/// again; and waits before the next attempt, longer after each failure. False once `stop`.
async fn between_subscriptions(
    outcome: Result<(), String>,
    by_channel: &ByChannel,
    state: &dyn Subscription,
    failures: &mut Repeated,
    stop: &CancellationToken,
) -> bool {
    if let Err(e) = outcome {
        state.live(false);
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

/// Subscribes `pubsub` to `channels`, [`SUBSCRIBE_CHUNK`] at a time, each answered within
/// `timeout`: a server that hangs (a master mid-`DEBUG SLEEP`, stopped, or partitioned) fails
/// the subscription, which is made again, instead of holding the listener forever while
/// idle workers trust notifications that cannot come.
async fn subscribe_all<C: AsRef<[u8]> + Sync>(
    pubsub: &mut redis::aio::PubSub,
    channels: &[C],
    timeout: Duration,
) -> redis::RedisResult<()> {
    for chunk in channels.chunks(SUBSCRIBE_CHUNK) {
        let chunk: Vec<&[u8]> = chunk.iter().map(AsRef::as_ref).collect();
        match tokio::time::timeout(timeout, pubsub.subscribe(chunk)).await {
            Ok(reply) => reply?,
            Err(_) => {
                return Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("SUBSCRIBE not answered within {timeout:?}"),
                )))
            }
        }
    }
    Ok(())
}

/// Subscribes to the keyspace channel of every trigger key and wakes the trigger's idle worker
/// on each sorted-set write. Resubscribes after connection loss. While subscribed, `state`
/// says so: idle workers then sleep up to their `notified_guard_interval`.
/// On a cluster, each key's channel is subscribed on the master that owns the key's slot (only
/// it publishes the key's events), and the subscriptions follow failovers; after any of them
/// every trigger looks again, and with `enable` every node gets `Kz` again. Behind Sentinel,
/// a lost subscription is made again on the master the sentinels name then (given `Kz` again
/// with `enable`).
/// `up` is cancelled once the first subscription is made (every trigger asked to look again)
/// or failed, or the listener stops: the workers it gates start then.
pub(crate) async fn listen(
    conn: Conn,
    enable: bool,
    listeners: Vec<Arc<dyn Listener>>,
    state: Arc<dyn Subscription>,
    up: CancellationToken,
    stop: CancellationToken,
) {
    let _up = up.clone().drop_guard();
    let endpoint = conn.endpoint().clone();
    let mut by_channel: ByChannel = HashMap::new();
    for t in listeners {
        let channel = format!("__keyspace@{}__:{}", endpoint.db(), t.key()).into_bytes();
        by_channel.entry(channel).or_default().push(t);
    }
    if endpoint.is_cluster() {
        return cluster::listen(conn, enable, by_channel, state, up, stop).await;
    }
    let mut failures = Repeated::default();
    while !stop.is_cancelled() {
        // Behind Sentinel, a new master may lack the flags the old one was given.
        let reenable = (enable && endpoint.sentinel_master().is_some()).then_some(&conn);
        let outcome = subscribe(
            &endpoint,
            reenable,
            &by_channel,
            &*state,
            &up,
            &stop,
            &mut failures,
        )
        .await
        .map_err(|e| e.to_string());
        up.cancel();
        if !between_subscriptions(outcome, &by_channel, &*state, &mut failures, &stop).await {
            return;
        }
    }

    async fn subscribe(
        endpoint: &Endpoint,
        reenable: Option<&Conn>,
        by_channel: &ByChannel,
        state: &dyn Subscription,
        up: &CancellationToken,
        stop: &CancellationToken,
        failures: &mut Repeated,
    ) -> redis::RedisResult<()> {
        let mut pubsub = endpoint.pubsub().await?;
        if let Some(conn) = reenable {
            Box::pin(crate::redis::checks::ensure_enabled(conn, true)).await;
        }
        let channels: Vec<&[u8]> = by_channel.keys().map(Vec::as_slice).collect();
        subscribe_all(&mut pubsub, &channels, endpoint.response_timeout()).await?;
        failures.recovered();
        state.live(true);
        // A write may have gone unnoticed while unsubscribed: every trigger looks again.
        look_again(by_channel);
        up.cancel();
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
