//! Delivering one claimed batch: prepare the messages, publish them, plan the settlement
//! from the broker's outcomes, settle in Redis.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::prepare::prepare;
use super::settlement::{plan, Plan, Policy};
use super::ERROR_BACKOFF;
use crate::backoff::Backoff;
use crate::redis::store::{ClaimBatch, FailOutcome, Settled, Settlement, StoreError};
use crate::sink::blame::Chosen;
use crate::sink::{Batch, Confirmed, MessageId, OutMessage, Outcome, PublishError, Publisher};
use crate::trigger::{Refused, Shard};

/// How a delivered batch went, for the worker that claimed it.
pub(super) enum Verdict {
    /// Every member was settled on its own merits (acked, retried, dead-lettered).
    Settled,
    /// The trigger's destination failed (it is held): the worker backs off before claiming.
    Held {
        /// The publisher, when the sink broke on it: the worker drops it (and, if it keeps
        /// failing, its connection).
        broken: Option<Box<Publisher>>,
        /// The broker refused the destination (not the connection's fault).
        refused: bool,
    },
}

/// Publishes a claimed batch and settles every member: ack, retry, dead-letter or put
/// back. Runs as its own task so the worker can claim again while the broker confirms.
/// Members the broker confirms while others of the batch are still in flight are acked
/// meanwhile (up to [`EARLY_CALLS`] settle calls at a time, each taking what was confirmed in
/// the last [`EARLY_WAIT`] or at least [`EARLY_CHUNK`] confirmations), and the last
/// confirmations in a call of their own the moment the broker has answered for every member,
/// so a crash re-sends little more than what the broker had not confirmed.
pub(super) async fn deliver(
    shard: Arc<Shard>,
    mut publisher: Publisher,
    batch: ClaimBatch,
    claimed_at: Instant,
    abort: CancellationToken,
) -> Verdict {
    let ids: Vec<MessageId> = batch
        .items
        .iter()
        .map(|c| MessageId::new(shard.trigger().key(), &c.member))
        .collect();
    let mut early = Early::new(&shard, &batch, claimed_at);
    let (outcomes, chosen) =
        publish(&shard, &mut publisher, &batch, &ids, &abort, &mut early).await;
    early.flush().await;
    let backoff = Backoff {
        initial: shard.trigger().backoff_initial(),
        max: shard.trigger().backoff_max(),
    };
    let policy = Policy {
        backoff: &backoff,
        on_expired: shard.trigger().on_expired(),
    };
    let refused = outcomes
        .iter()
        .any(|o| matches!(o, Some(Err(PublishError::DestinationRefused { .. }))));
    let plan = plan(&batch.items, outcomes, &chosen, &early.acked, &policy);
    // Counted at confirmation: a member whose lease was lost meanwhile is redelivered and
    // counted again (a duplicate the broker really received twice).
    shard
        .metrics()
        .confirmed(&plan.confirmed_due_ms, redis_now_ms(&batch, claimed_at));
    settle(&shard, &abort, &batch, &plan).await;
    let went_through = !plan.confirmed_due_ms.is_empty() || early.acked.contains(&true);
    let refusals = plan.refused.as_ref().map(|r| Refused {
        count: r.count,
        first: ids.get(r.first),
        reply: &r.reply,
    });
    shard
        .note_batch(plan.hold.as_deref(), refusals, went_through)
        .await;
    if plan.hold.is_none() && !plan.sink_broken {
        return Verdict::Settled;
    }
    if plan.sink_broken && plan.hold.is_none() {
        tracing::warn!(sink = %shard.sink().name(), confirmed = plan.settlement.acks().len(),
            "broker connection failed mid-batch; unconfirmed messages went back");
    }
    Verdict::Held {
        broken: plan.sink_broken.then(|| Box::new(publisher)),
        refused,
    }
}

/// Now on the Redis clock: the batch's claim time plus what elapsed locally since.
fn redis_now_ms(batch: &ClaimBatch, claimed_at: Instant) -> i64 {
    batch.now_ms + claimed_at.elapsed().as_millis() as i64
}

/// Early settle calls of one batch under way at once while the broker confirms the rest.
/// Calls on one connection are pipelined: a second one does not wait for the first to return,
/// so confirmations arriving while a call is under way are acked a round trip sooner.
const EARLY_CALLS: usize = 2;

/// How long a confirmation may wait for others to share its early settle call. A sink that
/// confirms one message at a time (HTTP: one answer per request) would otherwise make a
/// script call for every message or two; this bounds what a crash re-sends to what the sink
/// confirms in this long.
const EARLY_WAIT: Duration = Duration::from_millis(1);

/// Confirmations that start an early settle call at once, without waiting [`EARLY_WAIT`].
const EARLY_CHUNK: usize = 64;

/// The acks of a batch settled while the rest of it is in flight.
struct Early<'a> {
    shard: &'a Shard,
    batch: &'a ClaimBatch,
    claimed_at: Instant,
    /// Members acked early, by position in the batch: the final settle leaves them out.
    acked: Vec<bool>,
    /// Confirmed (with the sink's proof), not yet in a settle call.
    pending: Vec<(usize, Confirmed)>,
    /// When the oldest of `pending` was confirmed.
    pending_since: Option<Instant>,
    /// The settle calls under way, each with the members it acks.
    running: FuturesUnordered<EarlySettle<'a>>,
}

type EarlySettle<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = (Vec<usize>, Result<Settled, StoreError>)> + Send + 'a>,
>;

impl<'a> Early<'a> {
    fn new(shard: &'a Shard, batch: &'a ClaimBatch, claimed_at: Instant) -> Self {
        Self {
            shard,
            batch,
            claimed_at,
            acked: vec![false; batch.items.len()],
            pending: Vec::new(),
            pending_since: None,
            running: FuturesUnordered::new(),
        }
    }

    /// The broker confirmed the member at position `i` (the proof is what lets it be
    /// acked): acked by the next call that starts.
    fn confirmed(&mut self, i: usize, proof: Confirmed) {
        self.pending_since.get_or_insert_with(Instant::now);
        self.pending.push((i, proof));
    }

    /// When the pending confirmations are to start a settle call: at once when there are
    /// [`EARLY_CHUNK`] of them, else [`EARLY_WAIT`] after the oldest; never while
    /// [`EARLY_CALLS`] are under way (the first to return takes what arrived meanwhile) or
    /// none are pending.
    fn start_at(&self) -> Option<Instant> {
        if self.running.len() >= EARLY_CALLS {
            return None;
        }
        let since = self.pending_since?;
        Some(if self.pending.len() >= EARLY_CHUNK {
            since
        } else {
            since + EARLY_WAIT
        })
    }

    /// Starts a settle call for the pending confirmations if it is time ([`Self::start_at`]).
    fn start(&mut self) {
        if self.start_at().is_some_and(|at| at <= Instant::now()) {
            self.launch();
        }
    }

    /// Starts a settle call for the pending confirmations, if any.
    fn launch(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        // Only a confirmation acks: each proof goes into the settlement with its member.
        let pending = std::mem::take(&mut self.pending);
        self.pending_since = None;
        let (shard, batch) = (self.shard, self.batch);
        let members: Vec<usize> = pending.iter().map(|(i, _)| *i).collect();
        let mut settlement = Settlement::for_batch(pending.len());
        for (i, proof) in pending {
            settlement.ack(&batch.items[i].member, proof);
        }
        self.running.push(Box::pin(async move {
            let done = shard
                .store()
                .settle(
                    batch.deadline_ms,
                    shard.trigger().max_attempts(),
                    &settlement,
                )
                .await;
            (members, done)
        }));
    }

    /// Resolves when a settle call under way returns (never when none is).
    async fn settled(&mut self) -> (Vec<usize>, Result<Settled, StoreError>) {
        match self.running.next().await {
            Some(done) => done,
            None => std::future::pending().await,
        }
    }

    /// A settle call returned: its members are acked, or on an error left to the final
    /// settle (which retries), as are those still pending.
    fn finish(&mut self, (members, done): (Vec<usize>, Result<Settled, StoreError>)) {
        match done {
            Ok(_) => {
                let due: Vec<i64> = members
                    .iter()
                    .map(|&i| self.batch.items[i].due_ms)
                    .collect();
                self.shard
                    .metrics()
                    .confirmed(&due, redis_now_ms(self.batch, self.claimed_at));
                for i in members {
                    self.acked[i] = true;
                }
            }
            Err(e) => {
                self.shard.redis_error(&e);
            }
        }
    }

    /// Publishing is over (every answer in, or the deadline or an abort came first): acks
    /// what is still pending at once, beside the calls under way, and waits for all of them.
    async fn flush(&mut self) {
        self.launch();
        while let Some(done) = self.running.next().await {
            self.finish(done);
        }
    }
}

/// One outcome slot per member: members refused before publishing get their error, the
/// rest what the sink answered. A slot the sink did not fill stays `None` (unconfirmed).
/// Confirmations are handed to `early` as they arrive, which acks them meanwhile. Beside
/// them, what each member chose of its destination (by position).
async fn publish(
    shard: &Shard,
    publisher: &mut Publisher,
    batch: &ClaimBatch,
    ids: &[MessageId],
    abort: &CancellationToken,
    early: &mut Early<'_>,
) -> (Vec<Option<Outcome>>, Vec<Chosen>) {
    let trigger = shard.trigger();
    let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.items.len()];
    let mut chosen = vec![Chosen::default(); batch.items.len()];
    let mut prepared = Vec::with_capacity(batch.items.len());
    let mut slots = Vec::with_capacity(batch.items.len());
    for (i, c) in batch.items.iter().enumerate() {
        match prepare(trigger, trigger.destination(), c, batch.now_ms) {
            Ok(p) => {
                slots.push(i);
                prepared.push((c, p));
            }
            Err(e) => outcomes[i] = Some(Err(e)),
        }
    }
    if prepared.is_empty() {
        return (outcomes, chosen);
    }
    let out: Vec<OutMessage<'_>> = prepared
        .iter()
        .zip(&slots)
        .map(|((c, p), &i)| OutMessage {
            payload: &p.body,
            member: &c.member,
            due_ms: p.tick_ms.unwrap_or(c.due_ms),
            attempt: c.attempt,
            id: p
                .properties
                .as_ref()
                .and_then(|p| p.id.as_deref())
                .unwrap_or(ids[i].as_str()),
            routing_key: p.routing_key.as_deref(),
            properties: p.properties.as_ref(),
            url: p.url.as_deref(),
            topic: p.topic.as_deref(),
        })
        .collect();
    for (m, &i) in out.iter().zip(&slots) {
        chosen[i] = Chosen::of(m);
    }
    let started = Instant::now();
    // The publisher reports positions among the prepared messages, `slots` maps them to the
    // batch.
    let (confirms, mut confirmed) = tokio::sync::mpsc::unbounded_channel();
    let publishing = publisher.publish_batch(Batch {
        trigger: shard.name(),
        messages: &out,
        timeout: trigger.publish_timeout(),
        abort,
        confirms: Some(&confirms),
    });
    tokio::pin!(publishing);
    let published = loop {
        let start_at = early.start_at();
        tokio::select! {
            published = &mut publishing => break published,
            _ = sleep_until(start_at) => early.start(),
            Some((k, proof)) = confirmed.recv() => {
                // Confirmations come in bursts (one broker answer covers many messages):
                // one call for what has arrived, not one per message.
                early.confirmed(slots[k], proof);
                while let Ok((k, proof)) = confirmed.try_recv() {
                    early.confirmed(slots[k], proof);
                }
                early.start();
            }
            done = early.settled() => {
                early.finish(done);
                early.start();
            }
        }
    };
    while let Ok((k, proof)) = confirmed.try_recv() {
        early.confirmed(slots[k], proof);
    }
    shard.metrics().published(started.elapsed());
    for (slot, outcome) in slots.into_iter().zip(published) {
        outcomes[slot] = Some(outcome);
    }
    (outcomes, chosen)
}

/// Sleeps until `at`, or forever when there is no `at`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs the settle script, retrying Redis errors until the lease would expire anyway
/// (after that, recovery redelivers the batch: a duplicate, never a loss).
async fn settle(shard: &Shard, abort: &CancellationToken, batch: &ClaimBatch, plan: &Plan<'_>) {
    let s = &plan.settlement;
    let give_up = Instant::now() + shard.trigger().lease();
    let mut failures = 0u32;
    let settled = loop {
        if s.is_empty() {
            // Every member was acked early.
            break Settled::default();
        }
        match shard
            .store()
            .settle(batch.deadline_ms, shard.trigger().max_attempts(), s)
            .await
        {
            Ok(settled) => break settled,
            Err(e) => {
                failures += 1;
                let own = shard.redis_error(&e);
                let wait = ERROR_BACKOFF.delay(failures);
                if Instant::now() + wait >= give_up || abort.is_cancelled() {
                    // During an outage every batch in flight ends here: one line each would
                    // flood the log, and the outage line already says what happens.
                    if own {
                        tracing::warn!(error = %e, members = batch.items.len(),
                            "could not settle the batch; its lease will expire and it will be redelivered");
                    } else {
                        tracing::debug!(error = %e, members = batch.items.len(),
                            "could not settle the batch; its lease will expire and it will be redelivered");
                    }
                    return;
                }
                if own {
                    tracing::warn!(error = %e, failures, "settle failed, retrying");
                }
                tokio::time::sleep(wait).await;
            }
        }
    };
    shard.metrics().settled(s, &settled);
    if settled.fail_outcomes.contains(&FailOutcome::DeadLettered) {
        shard.dead_lettered();
    }
    // A copy the producer added while this one was in flight may be claimable now.
    shard.settled(settled.released > 0);
}
