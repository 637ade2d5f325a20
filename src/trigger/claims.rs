//! What a shard's claim loop tells it and asks of it: a claim starting and its reply, the
//! idle wait for the next one, a settled batch.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::hold::Route;
use super::shard::Shard;
use super::wake::{due_by, Woken};
use crate::backoff::jitter_down;
use crate::redis::store::ClaimBatch;
use crate::sink::MessageId;

/// Members of one batch blamed for their own failure, for the log.
pub(crate) struct Refused<'a> {
    pub(crate) count: usize,
    /// The first one's id.
    pub(crate) first: Option<&'a MessageId>,
    /// What the broker or endpoint said of the first.
    pub(crate) reply: &'a str,
}

impl Shard {
    /// A claim is about to be sent: it answers every wake-up asked for so far.
    pub(crate) fn claiming(&self) {
        self.wakes.claiming();
    }

    /// A claim's reply arrived at `claimed_at`; `more`: more is due than it took, and its
    /// worker claims again at once. The pause is noted and the guard starts again. Unless the
    /// claim was paused or rate limited: members claimed are noted for the housekeeping, the
    /// next head for the gate's holder, members left behind for the next settle; and a claim
    /// that left more due draws in one more worker (starting the deferred ones), while one
    /// that took everything due drops a call for help that would only find nothing.
    pub(crate) fn claimed(self: &Arc<Self>, batch: &ClaimBatch, claimed_at: Instant, more: bool) {
        self.note_paused(batch.paused);
        self.wakes
            .guard_until(claimed_at + jitter_down(self.guard_now()));
        if batch.paused || batch.rate_wait.is_some() {
            return;
        }
        let took = !batch.items.is_empty();
        if took {
            self.claimed.store(true, Relaxed);
        }
        // The claimer claims again at once: the head it reported is its own.
        let again = more && took;
        self.wakes.set_clock(claimed_at, batch.now_us);
        let due = batch
            .next_head_ms
            .filter(|h| h.is_finite() && !again)
            .map(|head| due_by(claimed_at, batch.now_us, head));
        self.wakes.note_head(due);
        if batch.skipped > 0 {
            self.held_back.store(true, Relaxed);
        }
        if again {
            self.start_extra_workers();
            self.wakes.help();
        } else {
            self.wakes.drained();
        }
    }

    /// The guard interval as it stands: while paused `guard_interval` (a resume wakes the
    /// workers), else [`Self::guard`].
    fn guard_now(&self) -> std::time::Duration {
        if self.is_paused() {
            self.trigger.guard_interval()
        } else {
            self.guard()
        }
    }

    /// Starts the deferred workers, once.
    fn start_extra_workers(self: &Arc<Self>) {
        let start = self
            .extra_workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(start) = start {
            tracing::debug!(trigger = %self.name(), shard = self.index, "a backlog: starting the other workers");
            start(self);
        }
    }

    /// Without waiting, what an idle wait would find at once: a wake-up that asks for a claim
    /// (a stored one is taken), the head due, or the guard passed.
    pub(crate) fn poll(&self) -> Option<Woken> {
        let woken = self.wakes.poll(Instant::now(), self.is_paused());
        if let Some(woken) = woken {
            self.count_wake(woken);
        }
        woken
    }

    /// Waits idle until a wake-up asks for a claim, or, as the worker holding the shard's
    /// gate, until the head is due or the guard passes (see [`super::wake`]).
    pub(crate) async fn wait_idle(&self, stop: &CancellationToken) -> Woken {
        let woken = match self.wakes.gate_or_wake(stop).await {
            Ok(_gate) => {
                let guard = || Instant::now() + jitter_down(self.guard_now());
                self.wakes.watch(guard, || self.is_paused(), stop).await
            }
            Err(woken) => woken,
        };
        self.count_wake(woken);
        woken
    }

    /// Counts an idle wait ended by a wake-up that asked for a claim (a notification, mostly).
    fn count_wake(&self, woken: Woken) {
        if woken == Woken::Asked {
            self.metrics.woken();
        }
    }

    /// After a wake-up that asked for a claim: whether one is worth making. Only the head is
    /// read (one command, no script, nothing written): when it is not due yet by the Redis
    /// clock of the last claim, it becomes the head the gate's holder waits for, and no
    /// claim is made. In doubt it claims: no claim in the last seconds to date the head by,
    /// or a failed read (the claim reports the error and backs off).
    pub(crate) async fn head_due(&self) -> bool {
        let Some((at, now_us)) = self.wakes.fresh_clock() else {
            return true;
        };
        let head = self.store.head().await;
        self.metrics.head_read();
        match head {
            Ok(None) => false,
            Ok(Some(score)) => {
                let due = due_by(at, now_us, score);
                if due <= Instant::now() {
                    return true;
                }
                self.wakes.note_earlier(due);
                false
            }
            Err(_) => true,
        }
    }

    /// A batch was settled; `freed`: the settle released members whose later copies wait
    /// behind them. Those, or members a claim left behind while their copies were in flight,
    /// may be claimable now: an idle worker looks.
    pub(crate) fn settled(&self, freed: bool) {
        let held_back = self.held_back.swap(false, Relaxed);
        if freed || held_back {
            self.wake();
        }
    }

    /// Takes note of a settled batch: a failure of the trigger's own destination (`hold`, what
    /// it said) holds it, a message that went through releases it; members blamed for their
    /// own failure are logged at growing gaps, with the broker's or endpoint's words and the
    /// first id.
    pub(crate) async fn note_batch(
        &self,
        hold: Option<&str>,
        refused: Option<Refused<'_>>,
        went_through: bool,
    ) {
        if let Some(why) = hold {
            self.hold(Route::Messages, why).await;
        } else if went_through {
            self.release(Route::Messages).await;
        }
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        match refused {
            Some(r) => {
                if let Some(unlogged) = refusals.failed() {
                    tracing::warn!(sink = %self.sink.name(), refused = r.count, reply = %r.reply,
                        first_id = r.first.map(MessageId::as_str), unlogged,
                        "messages failed for a reason of their own; each is retried with backoff, then dead-lettered");
                }
            }
            None if went_through => {
                refusals.recovered();
            }
            None => {}
        }
    }
}
