//! Keyspace notifications on a Redis Cluster: each channel on its slot's master, followed through failovers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{between_subscriptions, look_again, subscribe_all, written, ByChannel, Subscription};
use crate::redis::checks::{check_eviction_policy, ensure_enabled};
use crate::redis::conn::{slot, Conn, Topology};
use crate::repeat::Repeated;

/// How often the topology is read again while subscribed: a manual failover or a slot
/// migration moves a key's master without breaking any connection.
const TOPOLOGY_CHECK: Duration = Duration::from_secs(2);

/// Channels by the master that publishes them: a key's events come only from the master
/// serving its slot (a channel with the key's hash tag has the key's slot).
type Assignment = BTreeMap<String, Vec<Vec<u8>>>;

/// Each channel's master in `topology`, or the first slot that has none (the cluster is
/// not whole).
fn assign(topology: &Topology, channels: &[&Vec<u8>]) -> Result<Assignment, u16> {
    let mut out = Assignment::new();
    for channel in channels {
        let s = slot(channel);
        let master = topology.master_of(s).ok_or(s)?;
        out.entry(master.to_string())
            .or_default()
            .push(channel.to_vec());
    }
    Ok(out)
}

/// Subscribes each channel on the master that owns its slot, one subscriber connection per
/// master, and wakes triggers as on one server. The topology is read again every
/// [`TOPOLOGY_CHECK`]; when a channel's master changed, or a subscriber's connection ended
/// (a master killed), every subscriber is made again where the topology says now (retrying
/// while the cluster is not whole), every trigger looks again (a write may have gone
/// unnoticed), every node's eviction policy is checked again (warned about), and with
/// `enable` every node gets `Kz` again.
pub(super) async fn listen(
    conn: Conn,
    enable: bool,
    by_channel: ByChannel,
    state: Arc<dyn Subscription>,
    up: CancellationToken,
    stop: CancellationToken,
) {
    let channels: Vec<&Vec<u8>> = by_channel.keys().collect();
    let mut failures = Repeated::default();
    let mut first = true;
    while !stop.is_cancelled() {
        let outcome = follow(
            &conn,
            &channels,
            &by_channel,
            &*state,
            &up,
            &stop,
            &mut failures,
            enable,
            !first,
        )
        .await;
        first = false;
        up.cancel();
        if !between_subscriptions(outcome, &by_channel, &*state, &mut failures, &stop).await {
            return;
        }
    }
}

/// Subscribes where the topology says, then handles messages until the topology changes,
/// a subscriber's connection ends, or `stop`. With `recheck` (not the first time), every
/// node's settings are checked again first, and with `enable` `Kz` set where missing. `up`
/// is cancelled once subscribed (see [`super::listen`]).
#[allow(clippy::too_many_arguments)]
async fn follow(
    conn: &Conn,
    channels: &[&Vec<u8>],
    by_channel: &ByChannel,
    state: &dyn Subscription,
    up: &CancellationToken,
    stop: &CancellationToken,
    failures: &mut Repeated,
    enable: bool,
    recheck: bool,
) -> Result<(), String> {
    let topology = read_topology(conn).await?;
    let assignment = assign(&topology, channels)
        .map_err(|s| format!("slot {s} has no master (the cluster is not whole)"))?;
    if recheck {
        // The topology changed: a node may be new.
        if enable {
            ensure_enabled(conn, true).await;
        }
        let _ = check_eviction_policy(conn, false).await;
    }
    // The slot map came from one node, which may not have heard of a failover yet: each
    // master is asked itself, so no subscription waits on a former master.
    futures_util::future::try_join_all(assignment.keys().map(|m| confirm_master(conn, m))).await?;
    let mut streams = Vec::new();
    for (master, list) in &assignment {
        let mut pubsub = conn
            .endpoint()
            .node_pubsub(master)
            .await
            .map_err(|e| format!("{master}: {e}"))?;
        subscribe_all(&mut pubsub, list, conn.endpoint().response_timeout())
            .await
            .map_err(|e| format!("{master}: {e}"))?;
        let master = master.clone();
        // Each stream says when it ends: one master's connection gone is a change.
        streams.push(
            pubsub
                .into_on_message()
                .map(Some)
                .chain(futures_util::stream::once(async move {
                    tracing::debug!(%master, "a master's subscriber connection ended");
                    None
                }))
                .boxed(),
        );
    }
    failures.recovered();
    if recheck {
        let masters: Vec<&str> = assignment.keys().map(String::as_str).collect();
        tracing::info!(masters = %masters.join(","), "keyspace notifications subscribed again");
    }
    state.live(true);
    // A write may have gone unnoticed while unsubscribed: every trigger looks again.
    look_again(by_channel);
    up.cancel();
    let mut messages = futures_util::stream::select_all(streams);
    let mut check = tokio::time::interval(TOPOLOGY_CHECK);
    check.reset();
    let mut unreadable = Repeated::default();
    loop {
        tokio::select! {
            msg = messages.next() => {
                let Some(Some(msg)) = msg else {
                    state.topology_changed();
                    return Err("a master's subscriber connection ended".into());
                };
                if let Some(list) = by_channel.get(msg.get_channel_name().as_bytes()) {
                    written(list, msg.get_payload_bytes());
                }
            }
            _ = check.tick() => {
                // An unreadable topology changes nothing: the subscribers still work.
                let now = match read_topology(conn).await {
                    Ok(now) => now,
                    Err(e) => {
                        if let Some(unlogged) = unreadable.failed() {
                            tracing::warn!(error = %e, failures = unreadable.count(), unlogged,
                                "cannot read the cluster's topology: keyspace notifications stay where they are");
                        }
                        continue;
                    }
                };
                unreadable.recovered();
                if assign(&now, channels).as_ref() != Ok(&assignment) {
                    state.topology_changed();
                    // Until subscribed where the topology says now, idle workers keep their
                    // short guard.
                    state.live(false);
                    tracing::info!("a key's master changed: keyspace notifications follow it");
                    return Ok(());
                }
            }
            _ = stop.cancelled() => return Ok(()),
        }
    }
}

/// Ok when the node at `addr` answers `ROLE` as a master, or may not run `ROLE` (an ACL
/// without it: the slot map is trusted then).
async fn confirm_master(conn: &Conn, addr: &str) -> Result<(), String> {
    match conn.set_on(addr, redis::cmd("ROLE")).await {
        Ok(redis::Value::Array(fields)) => match fields.first() {
            Some(redis::Value::BulkString(role)) if role.as_slice() == b"master" => Ok(()),
            Some(redis::Value::BulkString(role)) => Err(format!(
                "{addr} is a {} now, not the master the slot map named",
                String::from_utf8_lossy(role)
            )),
            other => Err(format!("{addr}: unexpected ROLE reply {other:?}")),
        },
        Ok(other) => Err(format!("{addr}: unexpected ROLE reply {other:?}")),
        Err(e) if e.code() == Some("NOPERM") => Ok(()),
        Err(e) => Err(format!("{addr}: {e}")),
    }
}

/// The topology through the bridge's cluster connection.
async fn read_topology(conn: &Conn) -> Result<Topology, String> {
    match conn.topology().await {
        Some(Ok(topology)) => Ok(topology),
        Some(Err(e)) => Err(format!("reading the cluster's slots: {e}")),
        None => Err("not a cluster".into()),
    }
}
