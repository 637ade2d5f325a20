//! A worker's claim: the next batch of due members of its current shard, or how long to
//! wait (until the next head, the rate limit's next token, a backoff after an error).

use tokio::time::Instant;

use super::{Claim, Worker};
use super::{ERROR_BACKOFF, RATE_TICK};

impl Worker {
    /// Claims the next batch, or says how long to wait: until the next head when there was
    /// nothing due or the trigger is paused, for a backoff when the claim failed. A batch
    /// says whether more is due.
    pub(super) async fn claim(&mut self) -> Claim {
        let shard = self.shard().clone();
        let asked = self.batch.size;
        // Every wake-up asked for so far is answered by this claim.
        shard.claiming();
        let started = Instant::now();
        let batch = match shard.store().claim(asked, shard.trigger().lease()).await {
            Ok(batch) => batch,
            Err(e) => {
                let own = shard.redis_error(&e);
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
        shard.redis_answered();
        let claimed_at = Instant::now();
        let took = claimed_at - started;
        if batch.repaired > 0 {
            // Once per stray write: the script rewrote the fields, the next claim finds them valid.
            shard.metrics().control_repaired(batch.repaired);
            tracing::warn!(trigger = %shard.name(), key = %shard.store().keys().control,
                fields = batch.repaired, "repaired control fields out of range (a stray write to the control hash)");
        }
        // More is due when the reply's next head (the earliest member a claim could take) is
        // due already: the claim was full, or a byte budget stopped it. This worker claims
        // again at once and wakes one more. Otherwise the claim took every member due, however
        // full it was (due members left behind in flight are claimed when their copy settles).
        let more = batch
            .next_head_ms
            .is_some_and(|head| head <= batch.now_ms as f64);
        shard.claimed(&batch, claimed_at, more);
        if batch.paused || batch.rate_wait.is_some() {
            // Held by an operator or the rate limit: nothing was looked at.
            shard.metrics().held(took, batch.rate_wait.is_some());
            return match batch.rate_wait {
                // Whatever the reply says, the worker claims again within its guard interval.
                Some(wait) => {
                    Claim::Wait(wait.max(RATE_TICK).min(shard.trigger().guard_interval()))
                }
                None => Claim::Nothing,
            };
        }
        shard.metrics().claimed(batch.items.len(), took);
        // Sized by what the script held Redis for: the wait for the reply also holds this
        // worker's own wait to be scheduled, which on a busy host (or under a profiler) would
        // shrink the batches and make the bridge busier still.
        self.batch.adapt(batch.items.len(), batch.script_time);
        if batch.items.is_empty() {
            return Claim::Nothing;
        }
        Claim::Batch(batch, claimed_at, more)
    }
}
