//! Watches each trigger's keys that its configuration no longer serves: members written there
//! (a producer still on an earlier shard count) are counted and named, not left unseen.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backoff::jitter_down;
use crate::redis::queue::Queue;
use crate::trigger::Shard;

/// Passes between two readings of a trigger's shard-count registry: which keys are unserved
/// changes only when a bridge starts or reloads with another count, so an unsharded trigger
/// with no other count costs one SMEMBERS per this many intervals, not one per interval.
const REGISTRY_EVERY: u32 = 12;

/// Reads, every `interval` until `stop`, the members on each trigger's unserved keys into
/// `delay_bridge_unserved_members`, and logs when a trigger starts to have some and when they
/// are gone. `triggers` pairs each queue with its first shard (the metrics' owner).
pub(crate) async fn watch_unserved(
    triggers: Vec<(Queue, Arc<Shard>)>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut seen = vec![0u64; triggers.len()];
    let mut known: Vec<Option<Vec<(u32, String)>>> = vec![None; triggers.len()];
    let mut pass: u32 = 0;
    loop {
        for (((queue, shard), last), keys) in triggers.iter().zip(&mut seen).zip(&mut known) {
            if pass.is_multiple_of(REGISTRY_EVERY) || keys.is_none() {
                // The backlog readings count and log Redis's failures.
                *keys = queue.unserved_keys().await.ok();
            }
            let stranded = match keys.as_deref() {
                Some([]) => Vec::new(),
                Some(keys) => match queue.stranded_on(keys).await {
                    Ok(stranded) => stranded,
                    Err(_) => continue,
                },
                None => continue,
            };
            let members: u64 = stranded.iter().map(|k| k.members()).sum();
            shard.metrics().unserved(members);
            if members > 0 && *last == 0 {
                let keys: Vec<String> = stranded.iter().map(ToString::to_string).collect();
                tracing::warn!(trigger = %shard.name(), members, keys = %keys.join("; "),
                    "members on keys this configuration does not serve: nothing delivers them \
                     (serve them with drain_shards, or move them)");
            } else if members == 0 && *last > 0 {
                tracing::info!(trigger = %shard.name(), "no members left on unserved keys");
            }
            *last = members;
        }
        pass = pass.wrapping_add(1);
        tokio::select! {
            _ = tokio::time::sleep(jitter_down(interval)) => {}
            _ = stop.cancelled() => return,
        }
    }
}
