//! A worker's claim: the next batch of due members of its current shard, or how long to
//! wait (until the next head, the rate limit's next token, a backoff after an error).

use tokio::time::Instant;

use super::{Claim, Worker, ERROR_BACKOFF, RATE_TICK};

impl Worker {
    /// Claims the next batch, or says how long to wait: until the next head when there was
    /// nothing due or the trigger is paused, for a backoff when the claim failed. A batch
    /// says whether more is due.
    pub(super) async fn claim(&mut self) -> Claim {
        let asked = self.batch.size;
        // Every wake-up asked for so far is answered by this claim.
        self.t.wakes.claiming();
        let started = Instant::now();
        let batch = match self.t.store.claim(asked, self.t.config.lease()).await {
            Ok(batch) => batch,
            Err(e) => {
                let own = self.t.redis_error(&e);
                if let Some(unlogged) = self.redis_failures.failed().filter(|_| own) {
                    let failures = self.redis_failures.count();
                    if e.kind() == "wrong_type" {
                        // Nothing moved (the scripts check types before writing), but
                        // nothing will until an operator fixes the key.
                        tracing::error!(error = %e, failures, unlogged,
                            "a key of this trigger holds the wrong type; nothing is claimed until it is renamed or deleted");
                    } else {
                        tracing::warn!(error = %e, kind = e.kind(), failures, unlogged, "claim failed, backing off");
                    }
                }
                return Claim::Wait(ERROR_BACKOFF.delay(self.redis_failures.count()));
            }
        };
        if let Some(failures) = self.redis_failures.recovered() {
            tracing::debug!(failures, "claiming again");
        }
        self.t.health.redis_answered();
        let claimed_at = Instant::now();
        let took = claimed_at - started;
        if batch.repaired > 0 {
            // Once per stray write: the script rewrote the fields, the next claim finds them valid.
            self.t.metrics.control_repaired(batch.repaired);
            tracing::warn!(trigger = %self.t.name(), key = %self.t.store.keys().control,
                fields = batch.repaired, "repaired control fields out of range (a stray write to the control hash)");
        }
        self.t.note_paused(batch.paused);
        if batch.paused || batch.rate_wait.is_some() {
            // Held by an operator or the rate limit: nothing was looked at.
            self.t.metrics.held(took, batch.rate_wait.is_some());
            return match batch.rate_wait {
                // Whatever the reply says, the worker claims again within its guard interval.
                Some(wait) => Claim::Wait(wait.max(RATE_TICK).min(self.t.config.guard_interval())),
                None => Claim::Nothing,
            };
        }
        self.t.metrics.claimed(batch.items.len(), took);
        if !batch.items.is_empty() {
            self.t
                .claimed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.batch.adapt(batch.items.len(), took);
        // More is due when the reply's next head (the earliest member a claim could take) is
        // due already: the claim was full, or a byte budget stopped it. This worker claims
        // again at once and wakes one more. Otherwise the claim took every member due, however
        // full it was (due members left behind in flight are claimed when their copy settles).
        let more = batch
            .next_head_ms
            .is_some_and(|head| head <= batch.now_ms as f64);
        self.t
            .note_head(&batch, claimed_at, more && !batch.items.is_empty());
        if batch.skipped > 0 {
            self.t
                .held_back
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if batch.items.is_empty() {
            self.t.wakes.drained();
            return Claim::Nothing;
        }
        if more {
            self.t.start_extra_workers();
            self.t.wakes.help();
        } else {
            self.t.wakes.drained();
        }
        Claim::Batch(batch, claimed_at, more)
    }
}
