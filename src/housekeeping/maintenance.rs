//! Housekeeping of every trigger of a bridge: the backlog gauges, and recovering expired leases
//! when there are some.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::jitter_down;
use crate::redis::store::QueueStats;
use crate::trigger::Shard;

/// Readings (and recoveries) the housekeeping has in flight at once.
const READINGS_AT_ONCE: usize = 64;

/// How often the housekeeping looks for triggers whose reading is due.
const ROUND: Duration = Duration::from_millis(100);

/// A queue last read empty, and not written to since, is read again after this many
/// `backlog_interval`s (only an operator's pause can change it unseen).
const QUIET_READS: u32 = 6;

/// One trigger's place in the housekeeping.
struct Kept {
    shard: Arc<Shard>,
    /// When its sizes are read next.
    next: Instant,
    /// Its lease recovery's interval while members are in flight.
    busy: Duration,
    /// Where the sweep of stale attempt entries goes on.
    cursor: String,
    /// When it was last read and found empty (nothing scheduled, in flight or dead, no
    /// attempt entries, not paused); `None` otherwise.
    empty_since: Option<Instant>,
}

/// Reads each trigger's sizes every `interval` until `stop`, for the gauges and the pause, and
/// recovers the expired leases a reading shows (any bridge instance may do this). While a
/// trigger has members in flight, or this bridge claimed for it, it is read as often as
/// leases need: a quarter of the lease, within 100 ms to 5 s. One task serves every trigger,
/// and the readings due together go out together: an idle trigger costs one reading per
/// `interval`, not a task and its wake-ups. While keyspace notifications are subscribed, a
/// queue read empty is read again only once written to, or after [`QUIET_READS`] intervals.
pub(crate) async fn maintain(
    triggers: Vec<Arc<Shard>>,
    interval: Duration,
    stop: CancellationToken,
) {
    let now = Instant::now();
    let mut kept: Vec<Kept> = triggers
        .into_iter()
        .map(|shard| Kept {
            busy: (shard.trigger().lease() / 4)
                .clamp(Duration::from_millis(100), Duration::from_secs(5))
                .min(interval),
            shard,
            next: now,
            cursor: String::from("0"),
            empty_since: None,
        })
        .collect();
    let permits = tokio::sync::Semaphore::new(READINGS_AT_ONCE);
    loop {
        let now = Instant::now();
        for k in &mut kept {
            if k.shard.take_claimed() {
                // A claim by this bridge makes leases: look again within `busy` of it.
                k.next = k.next.min(now + k.busy);
            }
        }
        // A bounded number at once: at start every trigger is due, and ten thousand readings
        // in flight together would be a peak of memory the process keeps.
        let at_once = &permits;
        let due = kept
            .iter_mut()
            .filter(|k| k.next <= now)
            .map(|k| async move {
                let _permit = at_once.acquire().await;
                // Boxed: a reading waiting for its turn holds a pointer, not the reading's state.
                Box::pin(look(k, now, interval)).await;
            });
        join_all(due).await;
        tokio::select! {
            _ = tokio::time::sleep(ROUND) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Reads `k`'s sizes, unless its queue was empty, unwritten and notifications would have said
/// otherwise; plans its next reading.
async fn look(k: &mut Kept, now: Instant, interval: Duration) {
    let written = k.shard.take_touched();
    let quiet = k.shard.notifications_live()
        && !written
        && k.empty_since
            .is_some_and(|since| now < since + interval * QUIET_READS);
    if quiet {
        k.next = now + jitter_down(interval);
        return;
    }
    let (leased, empty) = read(&k.shard, &mut k.cursor).await;
    k.empty_since = empty.then_some(now);
    let wait = if leased { k.busy } else { interval };
    k.next = Instant::now() + jitter_down(wait);
}

/// Reads one trigger's sizes and acts on them. Says whether it has members in flight (or the
/// reading failed), and whether the queue is empty.
async fn read(shard: &Shard, cursor: &mut String) -> (bool, bool) {
    match shard.store().stats().await {
        Ok(s) => {
            shard.sizes_read(&s);
            recover(shard, &s, cursor).await;
            let empty =
                s.due + s.scheduled + s.inflight + s.dead + s.attempt_entries == 0 && !s.paused;
            (s.inflight > 0, empty)
        }
        Err(e) => {
            if shard.redis_error(&e) {
                tracing::debug!(trigger = %shard.name(), error = %e, "reading the backlog sizes failed");
            }
            (true, false)
        }
    }
}

/// Moves expired leases back to the queue while `stats` shows some, and sweeps one page of
/// stale failed-attempt entries while there are entries.
async fn recover(shard: &Shard, stats: &QueueStats, cursor: &mut String) {
    let expired = stats
        .earliest_lease_ms
        .is_some_and(|lease| lease < stats.now_ms);
    if !expired && stats.attempt_entries == 0 {
        return;
    }
    let mut sweep = (stats.attempt_entries > 0).then_some(cursor.clone());
    let mut limit = if expired { RECOVER_LIMIT } else { 0 };
    loop {
        match shard.store().recover(limit, sweep.as_deref()).await {
            Ok(r) => {
                if sweep.take().is_some() {
                    *cursor = r.cursor;
                }
                if r.recovered > 0 {
                    tracing::info!(trigger = %shard.name(), recovered = r.recovered, "expired leases recovered");
                    shard.metrics().redelivered(r.recovered);
                    shard.wake();
                }
                if r.recovered < RECOVER_LIMIT as u64 {
                    return;
                }
                limit = RECOVER_LIMIT;
            }
            Err(e) => {
                if shard.redis_error(&e) {
                    tracing::debug!(trigger = %shard.name(), error = %e, "recovering expired leases failed");
                }
                return;
            }
        }
    }
}

/// Most expired leases one recover call moves (bounds how long the script blocks Redis).
const RECOVER_LIMIT: usize = 1000;
