//! A trigger's queue over its shards: the shard a member belongs to, and operator calls on all of them.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{MessageFormat, PayloadMode, Trigger};
use crate::keys::{shard_of, QueueKeys};
use crate::redis::conn::Conn;
use crate::redis::store::{
    Cursor, DeadLetter, DeadPage, Forecast, IdScheme, Lookup, Page, Purge, QueueStats, Store,
    StoreError,
};

mod layout;

pub(crate) use layout::{take_layouts, take_layouts_dry, LayoutError, LayoutRefused, Stranded};

/// One logical trigger's shard stores: those of `shards` first (where producers write), then
/// those still drained after a change of the shard count. Clones share one copy.
#[derive(Clone)]
pub(crate) struct Queue(Arc<Parts>);

/// What a [`Queue`] is made of, held once however many hold the queue.
pub(crate) struct Parts {
    /// The trigger's `key`.
    key: String,
    /// `format = "envelope"`: an envelope's `id` is what consumers are sent.
    envelope: bool,
    shards: Vec<Store>,
    /// How many of `shards` producers write to (`shards` in the configuration).
    producing: u32,
    /// `drain_shards` in the configuration.
    draining: Option<u32>,
    /// The set of shard counts the key has been served with (`None`: a key that cannot have one).
    counts_key: Option<String>,
    conn: Conn,
}

impl std::ops::Deref for Queue {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

impl Queue {
    /// The queue of trigger `tc` on `conn`. A rate limit is split evenly over the shards (each
    /// has its own token bucket), so that together they keep to it when load is spread evenly.
    pub(crate) fn new(tc: &Trigger, conn: Conn) -> anyhow::Result<Self> {
        let keys = tc.shard_keys();
        anyhow::ensure!(
            !keys.is_empty(),
            "trigger {}: key `{}` cannot be sharded (no hash tag)",
            tc.name(),
            tc.key()
        );
        let n = keys.len() as u32;
        let shards = keys
            .iter()
            .map(|key| {
                let mut store = Store::new(conn.clone(), QueueKeys::derive(key)?);
                if let Some(rate) = tc.rate() {
                    store = store.with_rate_limit(
                        rate.per_second() / f64::from(n),
                        rate.burst().div_ceil(n),
                    );
                }
                Ok(match tc.payload() {
                    PayloadMode::Inline => store,
                    PayloadMode::Hash => store
                        .with_hash_bodies(tc.max_claim_bytes())
                        .with_largest_body(tc.max_message_bytes()),
                })
            })
            .collect::<anyhow::Result<Vec<Store>>>()?;
        Ok(Self(Arc::new(Parts {
            key: tc.key().to_string(),
            envelope: tc.format() == MessageFormat::Envelope,
            shards,
            producing: tc.shards().max(1),
            draining: tc.drain_shards(),
            counts_key: layout::counts_key(tc.key()),
            conn,
        })))
    }

    /// Where the queue is, for messages: its key, with the shard count when sharded.
    pub(crate) fn place(&self) -> String {
        match self.shards.len() {
            1 => self.first().keys().source.clone(),
            n => format!("{} ({n} shards)", self.key),
        }
    }

    /// Redis's clock, epoch ms.
    pub(crate) async fn now_ms(&self) -> Result<i64, StoreError> {
        self.first().now_ms().await
    }

    /// Whether Redis takes a write on every shard producers write to (one that changes
    /// nothing: [`Store::probe_write`]); the first refusal.
    pub(crate) async fn probe_write(&self) -> Result<(), StoreError> {
        for store in &self.shards[..(self.producing as usize).min(self.shards.len())] {
            store.probe_write().await?;
        }
        Ok(())
    }

    /// Every shard's store, producing shards first.
    pub(crate) fn shards(&self) -> &[Store] {
        &self.shards
    }

    /// The first shard (the only one of an unsharded trigger).
    fn first(&self) -> &Store {
        &self.shards[0]
    }

    /// Whether the member is an id with its body in the bodies hash.
    pub(crate) fn hash_bodies(&self) -> bool {
        self.first().hash_bodies()
    }

    /// The shard producers put `member` (the id in hash payload mode) on.
    pub(crate) fn for_member(&self, member: &[u8]) -> &Store {
        &self.shards[self.shard_index(member)]
    }

    /// The position in [`Self::shards`] of the shard producers put `member` on.
    pub(crate) fn shard_index(&self, member: &[u8]) -> usize {
        shard_of(member, self.producing) as usize
    }

    /// The shards in the order to look for `member`: its own first, then the rest (a member
    /// scheduled before the shard count changed, or by a producer that picks any shard).
    fn looking_for<'a>(&'a self, member: &[u8]) -> impl Iterator<Item = &'a Store> + 'a {
        let own = shard_of(member, self.producing) as usize;
        std::iter::once(&self.shards[own]).chain(
            self.shards
                .iter()
                .enumerate()
                .filter(move |(i, _)| *i != own)
                .map(|(_, s)| s),
        )
    }

    /// Each shard's sizes, in shard order, read at once.
    pub(crate) async fn shard_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        futures_util::future::try_join_all(self.shards.iter().map(Store::stats)).await
    }

    /// The sizes of the whole queue: sums, the oldest due age the largest, paused if any shard is.
    pub(crate) async fn stats(&self) -> Result<QueueStats, StoreError> {
        Ok(QueueStats::sum(&self.shard_stats().await?))
    }

    /// Why a bridge holds the trigger's destination, if one does (noted on the first shard).
    pub(crate) async fn held(&self) -> Result<Option<crate::redis::store::HeldNote>, StoreError> {
        self.shards[0].held().await
    }

    /// Schedules `body` under `id` on the id's shard (hash payload mode).
    pub(crate) async fn schedule_by_id(
        &self,
        id: &[u8],
        body: &[u8],
        due_ms: i64,
    ) -> Result<&Store, StoreError> {
        let store = self.for_member(id);
        store.schedule_by_id(id, body, due_ms).await?;
        Ok(store)
    }

    /// Cancels a scheduled member: on its own shard, else on any other.
    pub(crate) async fn cancel(&self, member: &[u8]) -> Result<bool, StoreError> {
        for s in self.looking_for(member) {
            if s.cancel(member).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The sum over every shard of what `each` counts on it.
    async fn sum<'a, F, Fut>(&'a self, each: F) -> Result<u64, StoreError>
    where
        F: Fn(&'a Store) -> Fut,
        Fut: std::future::Future<Output = Result<u64, StoreError>>,
    {
        let mut n = 0;
        for s in &self.shards {
            n += each(s).await?;
        }
        Ok(n)
    }

    /// How the queue's consumer ids are made.
    pub(crate) fn id_scheme(&self) -> IdScheme<'_> {
        IdScheme {
            trigger_key: &self.key,
            envelope: self.envelope,
        }
    }

    /// The id consumers are sent for `member`: the envelope is the member inline, `body` (if
    /// read whole) in hash payload mode.
    pub(crate) fn consumer_id(&self, member: &[u8], body: Option<&[u8]>) -> String {
        let envelope = if self.hash_bodies() {
            body
        } else {
            Some(member)
        };
        self.id_scheme().consumer_id(member, envelope)
    }

    /// The message `text` names, scheduled, in flight or dead, on whichever shard holds it:
    /// by member (the id in hash payload mode) on every shard first, its own first, then by
    /// the id consumers were sent, over the whole of every shard.
    pub(crate) async fn lookup(&self, text: &[u8]) -> Result<Option<Lookup>, StoreError> {
        for s in self.looking_for(text) {
            let found = s.find(text).await?;
            if !found.places.is_empty() {
                return Ok(Some(Lookup {
                    member: text.to_vec(),
                    by: crate::redis::store::FoundBy::Member,
                    found,
                }));
            }
        }
        for s in self.looking_for(text) {
            if let Some(hit) = s.lookup(self.id_scheme(), text).await? {
                return Ok(Some(hit));
            }
        }
        Ok(None)
    }

    /// Moves the scheduled `members` to `due_ms` (now when `None`) on every shard that has them.
    pub(crate) async fn reschedule(
        &self,
        members: &[Vec<u8>],
        due_ms: Option<i64>,
        earlier_only: bool,
    ) -> Result<u64, StoreError> {
        self.sum(|s| s.reschedule(members, due_ms, earlier_only))
            .await
    }

    /// Deletes what `what` names on every shard.
    pub(crate) async fn purge(&self, what: Purge) -> Result<u64, StoreError> {
        self.sum(|s| s.purge(what)).await
    }

    /// Scheduled members due within `[from, to]`, over every shard.
    pub(crate) async fn count_scheduled(
        &self,
        from: Option<i64>,
        to: Option<i64>,
    ) -> Result<u64, StoreError> {
        self.sum(|s| s.count_scheduled(from, to)).await
    }

    /// Requeues the dead `members` (every dead letter, up to `limit`, when empty) on every shard.
    pub(crate) async fn requeue_dead(
        &self,
        members: &[Vec<u8>],
        limit: usize,
    ) -> Result<u64, StoreError> {
        let mut n = 0;
        for s in &self.shards {
            let left = if members.is_empty() {
                limit.saturating_sub(n as usize)
            } else {
                limit
            };
            if left == 0 {
                break;
            }
            n += s.requeue_dead(members, left).await?;
        }
        Ok(n)
    }

    /// The `limit` oldest dead letters over every shard, oldest first.
    pub(crate) async fn list_dead(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let mut all = Vec::new();
        for s in &self.shards {
            all.extend(s.list_dead(limit).await?);
        }
        all.sort_by(|a, b| (a.at_ms, &a.member).cmp(&(b.at_ms, &b.member)));
        all.truncate(limit);
        Ok(all)
    }

    /// A page of dead letters over every shard after `after`, oldest first: each shard's page
    /// from the same cursor, merged, as [`Queue::browse`] does.
    pub(crate) async fn list_dead_after(
        &self,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        if let [one] = self.shards.as_slice() {
            return one.list_dead_after(after, limit).await;
        }
        let mut more = false;
        let mut items = Vec::new();
        for s in &self.shards {
            let page = s.list_dead_after(after, limit).await?;
            more |= page.next.is_some();
            items.extend(page.items);
        }
        let score = |d: &DeadLetter| d.score.parse::<f64>().unwrap_or(f64::NAN);
        items.sort_by(|a, b| {
            score(a)
                .total_cmp(&score(b))
                .then_with(|| a.member.cmp(&b.member))
        });
        let more = more || items.len() > limit;
        items.truncate(limit);
        let next = items
            .last()
            .filter(|_| more)
            .map(|d| Cursor::after(d.score.clone(), d.member.clone()));
        Ok(DeadPage { items, next })
    }

    /// Deletes (or, with `dry_run`, counts) the dead letters whose reason is `reason`, on
    /// every shard.
    pub(crate) async fn purge_dead_reason(
        &self,
        reason: &str,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        self.sum(|s| s.purge_dead_reason(reason, dry_run)).await
    }

    /// Up to `limit` members in flight over every shard, earliest lease deadline first.
    pub(crate) async fn list_inflight(
        &self,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, i64)>, StoreError> {
        let mut all = Vec::new();
        for s in &self.shards {
            all.extend(s.list_inflight(limit).await?);
        }
        all.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        all.truncate(limit);
        Ok(all)
    }

    /// What falls due in each bucket, summed over the shards.
    pub(crate) async fn forecast(
        &self,
        bucket: Duration,
        buckets: usize,
    ) -> Result<Forecast, StoreError> {
        let mut sum: Option<Forecast> = None;
        for s in &self.shards {
            let f = s.forecast(bucket, buckets).await?;
            match &mut sum {
                None => sum = Some(f),
                Some(sum) => {
                    sum.overdue += f.overdue;
                    sum.later += f.later;
                    for (a, b) in sum.buckets.iter_mut().zip(&f.buckets) {
                        *a += b;
                    }
                }
            }
        }
        Ok(sum.expect("a queue has at least one shard"))
    }

    /// A page of scheduled members over every shard, earliest first: each shard's page from
    /// the same cursor, merged, so the keyset paging of one shard holds for all of them.
    pub(crate) async fn browse(
        &self,
        from: Option<i64>,
        to: Option<i64>,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        if let [one] = self.shards.as_slice() {
            return one.browse(from, to, after, limit).await;
        }
        let mut pages = Vec::with_capacity(self.shards.len());
        for s in &self.shards {
            pages.push(s.browse(from, to, after, limit).await?);
        }
        let more = pages.iter().any(|p| p.next.is_some());
        let mut items: Vec<_> = pages.into_iter().flat_map(|p| p.items).collect();
        items.sort_by(|a, b| a.order(b));
        let more = more || items.len() > limit;
        items.truncate(limit);
        let next = items.last().filter(|_| more).map(|e| e.cursor());
        Ok(Page { items, next })
    }
}
