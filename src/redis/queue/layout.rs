//! The shard counts a trigger's key has been served with, and the members left on keys no
//! bridge serves any more.

use std::collections::BTreeSet;
use std::fmt;

use futures_util::future::join_all;

use super::Queue;
use crate::keys::{shard_key, QueueKeys};
use crate::redis::store::{Store, StoreError};

/// Largest shard count read back from the registry (the configuration's bound).
const MAX_COUNT: u32 = crate::config::MAX_SHARDS;

/// The key of the set of shard counts trigger key `key` has been served with: `K:shard-counts`,
/// in the slot of `key` itself.
pub(super) fn counts_key(key: &str) -> Option<String> {
    let control = QueueKeys::derive(key).ok()?.control;
    Some(format!(
        "{}:shard-counts",
        control.strip_suffix(":control")?
    ))
}

/// A key that holds members though this configuration does not serve it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Stranded {
    /// The shard's key.
    pub key: String,
    /// The shard count that used it.
    pub shards: u32,
    /// Members scheduled (due or not).
    pub scheduled: u64,
    /// Members in flight.
    pub inflight: u64,
    /// Dead letters.
    pub dead: u64,
}

impl Stranded {
    /// Every member the key holds.
    pub(crate) fn members(&self) -> u64 {
        self.scheduled + self.inflight + self.dead
    }
}

impl fmt::Display for Stranded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (of {} shard{}): {} scheduled, {} in flight, {} dead",
            self.key,
            self.shards,
            if self.shards == 1 { "" } else { "s" },
            self.scheduled,
            self.inflight,
            self.dead
        )
    }
}

/// Why a configuration cannot serve a trigger's keys as they are.
#[derive(Debug)]
pub(crate) enum LayoutError {
    /// Redis did not answer.
    Redis(StoreError),
    /// Keys the configuration would stop serving still hold members.
    Stranded {
        trigger: String,
        keys: Vec<Stranded>,
    },
}

impl From<StoreError> for LayoutError {
    fn from(e: StoreError) -> Self {
        Self::Redis(e)
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redis(e) => write!(f, "reading the trigger's shard keys failed: {e}"),
            Self::Stranded { trigger, keys } => {
                let counts: BTreeSet<u32> = keys.iter().map(|k| k.shards).collect();
                let list: Vec<String> = keys.iter().map(Stranded::to_string).collect();
                let counts: Vec<String> = counts.iter().map(u32::to_string).collect();
                write!(
                    f,
                    "trigger {trigger}: keys this configuration does not serve still hold members: \
                     {}; serve them until they are empty with `drain_shards = {}` beside `shards` \
                     (`delay-bridge stats --shards` shows them), or delete them",
                    list.join("; "),
                    counts.join("` or `drain_shards = ")
                )
            }
        }
    }
}

impl std::error::Error for LayoutError {}

/// A key's sizes, `None` when a key of it has the wrong type: that is the workers' to report
/// (they back off and say which key), not a reason to refuse the configuration.
fn readable(
    stats: Result<crate::redis::store::QueueStats, StoreError>,
) -> Result<Option<crate::redis::store::QueueStats>, StoreError> {
    match stats {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == "wrong_type" => Ok(None),
        Err(e) => Err(e),
    }
}

impl Queue {
    /// The shard counts this configuration serves: `shards`, and `drain_shards` if set.
    fn served_counts(&self) -> Vec<u32> {
        let mut counts = vec![self.producing];
        counts.extend(self.draining.filter(|d| *d != self.producing));
        counts
    }

    /// Keys of the shard counts the trigger was served with (read from the registry, and the
    /// plain key always) that this configuration does not serve, with their counts.
    pub(crate) async fn unserved_keys(&self) -> Result<Vec<(u32, String)>, StoreError> {
        let mut counts: BTreeSet<u32> = BTreeSet::from([1]);
        if let Some(registry) = &self.counts_key {
            let mut conn = self.conn.clone();
            let known: Vec<String> = redis::cmd("SMEMBERS")
                .arg(registry)
                .query_async(&mut conn)
                .await?;
            counts.extend(
                known
                    .iter()
                    .filter_map(|c| c.parse::<u32>().ok())
                    .filter(|c| (1..=MAX_COUNT).contains(c)),
            );
        }
        let served: BTreeSet<&str> = self
            .shards
            .iter()
            .map(|s| s.keys().source.as_str())
            .collect();
        let mut out: Vec<(u32, String)> = Vec::new();
        for count in counts {
            for i in 0..count {
                let Some(key) = shard_key(&self.key, i, count) else {
                    continue;
                };
                if !served.contains(key.as_str()) && !out.iter().any(|(_, k)| *k == key) {
                    out.push((count, key));
                }
            }
        }
        Ok(out)
    }

    /// The stores of `keys` (unserved keys with their counts).
    fn stores_of(&self, keys: &[(u32, String)]) -> Vec<(u32, Store)> {
        keys.iter()
            .filter_map(|(count, key)| {
                let keys = QueueKeys::derive(key).ok()?;
                Some((*count, Store::new(self.conn.clone(), keys)))
            })
            .collect()
    }

    /// Members on keys of the trigger that this configuration does not serve: those of
    /// earlier shard counts, and the plain key.
    pub(crate) async fn stranded(&self) -> Result<Vec<Stranded>, StoreError> {
        let keys = self.unserved_keys().await?;
        self.stranded_on(&keys).await
    }

    /// Members on `keys`, unserved keys as [`Self::unserved_keys`] lists them.
    pub(crate) async fn stranded_on(
        &self,
        keys: &[(u32, String)],
    ) -> Result<Vec<Stranded>, StoreError> {
        Ok(self.read_unserved(keys).await?.0)
    }

    /// The unserved keys of `keys` holding members, and whether any of them is paused.
    async fn read_unserved(
        &self,
        keys: &[(u32, String)],
    ) -> Result<(Vec<Stranded>, bool), StoreError> {
        let mut stranded = Vec::new();
        let mut paused = false;
        for (count, store) in self.stores_of(keys) {
            let Some(s) = readable(store.stats().await)? else {
                continue;
            };
            paused |= s.paused;
            let found = Stranded {
                key: store.keys().source.clone(),
                shards: count,
                scheduled: s.due + s.scheduled,
                inflight: s.inflight,
                dead: s.dead,
            };
            if found.members() > 0 {
                stranded.push(found);
            }
        }
        Ok((stranded, paused))
    }

    /// Whether [`Self::take_layout`] would be refused, changing nothing.
    pub(crate) async fn check_layout(&self, trigger: &str) -> Result<(), LayoutError> {
        let stranded = self.stranded().await?;
        if stranded.is_empty() {
            Ok(())
        } else {
            Err(LayoutError::Stranded {
                trigger: trigger.to_string(),
                keys: stranded,
            })
        }
    }

    /// Takes the trigger's keys as this configuration serves them, before its workers start:
    /// refused while a key it would stop serving holds members; otherwise records the shard
    /// counts served, and carries a pause found on any of the trigger's keys, old or new, to
    /// every key served (the pause belongs to the trigger, not to a key).
    pub(crate) async fn take_layout(&self, trigger: &str) -> Result<(), LayoutError> {
        let unserved = self.unserved_keys().await?;
        let (stranded, paused_unserved) = self.read_unserved(&unserved).await?;
        if !stranded.is_empty() {
            return Err(LayoutError::Stranded {
                trigger: trigger.to_string(),
                keys: stranded,
            });
        }
        if let Some(registry) = &self.counts_key {
            let mut conn = self.conn.clone();
            redis::cmd("SADD")
                .arg(registry)
                .arg(self.served_counts())
                .query_async::<i64>(&mut conn)
                .await
                .map_err(StoreError::from)?;
        }
        let mut paused = paused_unserved;
        for store in &self.shards {
            paused |= readable(store.stats().await)?.is_some_and(|s| s.paused);
        }
        if paused {
            self.set_paused(true).await?;
        }
        Ok(())
    }

    /// Pauses or resumes every key of the trigger: those served, and those of earlier shard
    /// counts (a bridge still running an older configuration serves them). `true` if any
    /// changed.
    pub(crate) async fn set_paused(&self, paused: bool) -> Result<bool, StoreError> {
        let mut changed = false;
        for s in &self.shards {
            changed |= s.set_paused(paused).await?;
        }
        let unserved = self.unserved_keys().await?;
        for (_, s) in self.stores_of(&unserved) {
            changed |= s.set_paused(paused).await?;
        }
        Ok(changed)
    }
}

/// The triggers whose keys a configuration cannot take as they are, each with its reason.
#[derive(Debug)]
pub(crate) struct LayoutRefused(pub Vec<LayoutError>);

impl fmt::Display for LayoutRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let each: Vec<String> = self.0.iter().map(LayoutError::to_string).collect();
        f.write_str(&each.join("; also "))
    }
}

impl std::error::Error for LayoutRefused {}

/// Takes the keys of every trigger of `triggers` on `conn` (see [`Queue::take_layout`]);
/// refused with every trigger's reason at once.
pub(crate) async fn take_layouts<'a>(
    triggers: impl IntoIterator<Item = &'a crate::config::Trigger>,
    conn: &crate::redis::conn::Conn,
) -> Result<(), LayoutRefused> {
    layouts(triggers, conn, true).await
}

/// What [`take_layouts`] would say, changing nothing (for `check`).
pub(crate) async fn take_layouts_dry<'a>(
    triggers: impl IntoIterator<Item = &'a crate::config::Trigger>,
    conn: &crate::redis::conn::Conn,
) -> Result<(), LayoutRefused> {
    layouts(triggers, conn, false).await
}

/// Triggers whose keys are read at once: their calls share the connection's pipeline, so
/// that thousands of triggers take a few hundred round trips, not several per trigger.
const AT_ONCE: usize = 64;

async fn layouts<'a>(
    triggers: impl IntoIterator<Item = &'a crate::config::Trigger>,
    conn: &crate::redis::conn::Conn,
    take: bool,
) -> Result<(), LayoutRefused> {
    let triggers: Vec<&crate::config::Trigger> = triggers.into_iter().collect();
    let mut refused = Vec::new();
    for chunk in triggers.chunks(AT_ONCE) {
        let outcomes = join_all(chunk.iter().map(|tc| layout(tc, conn, take))).await;
        refused.extend(outcomes.into_iter().filter_map(Result::err));
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(LayoutRefused(refused))
    }
}

/// Takes (or with `take` false, checks) the keys of one trigger.
async fn layout(
    tc: &crate::config::Trigger,
    conn: &crate::redis::conn::Conn,
    take: bool,
) -> Result<(), LayoutError> {
    // A key that cannot be sharded is the configuration's problem, reported by its start.
    let Ok(queue) = Queue::new(tc, conn.clone()) else {
        return Ok(());
    };
    if take {
        queue.take_layout(tc.name()).await
    } else {
        queue.check_layout(tc.name()).await
    }
}
