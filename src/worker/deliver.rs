//! Delivering one claimed batch: prepare the messages, publish them, plan the settlement
//! from the broker's outcomes, settle in Redis.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::prepare::prepare;
use super::settlement::{plan, Plan};
use super::{Trigger, ERROR_BACKOFF};
use crate::backoff::Backoff;
use crate::sink::{MessageId, OutMessage, Outcome, Publisher};
use crate::store::{ClaimBatch, FailOutcome};

/// How a delivered batch went, for the worker that claimed it.
pub(super) enum Verdict {
    /// Every member was settled on its own merits (acked, retried, dead-lettered).
    Settled,
    /// The sink failed on this publisher: the worker drops it (and, if it keeps failing,
    /// its connection) and backs off before claiming.
    SinkFailed(Box<Publisher>),
}

/// Publishes a claimed batch and settles every member: ack, retry, dead-letter or put
/// back. Runs as its own task so the worker can claim again while the broker confirms.
pub(super) async fn deliver(
    t: Arc<Trigger>,
    mut publisher: Publisher,
    batch: ClaimBatch,
    claimed_at: Instant,
    abort: CancellationToken,
) -> Verdict {
    let ids: Vec<MessageId> = batch
        .items
        .iter()
        .map(|c| MessageId::new(&t.config.key, &c.member))
        .collect();
    let outcomes = publish(&t, &mut publisher, &batch, &ids, &abort).await;
    let backoff = Backoff {
        initial: t.config.backoff_initial,
        max: t.config.backoff_max,
    };
    let plan = plan(&batch.items, &outcomes, &backoff, t.config.on_expired);
    // Confirmation time on the Redis clock: claim time plus what elapsed locally since.
    // Counted at confirmation: a member whose lease was lost meanwhile is redelivered and
    // counted again (a duplicate the broker really received twice).
    let confirmed_ms = batch.now_ms + claimed_at.elapsed().as_millis() as i64;
    t.metrics.confirmed(&plan.confirmed_due_ms, confirmed_ms);
    settle(&t, &abort, &batch, &plan).await;
    if plan.sink_broken {
        tracing::warn!(sink = %t.sink.name(), confirmed = plan.settlement.ack.len(),
            "broker connection failed mid-batch; unconfirmed messages went back");
        Verdict::SinkFailed(Box::new(publisher))
    } else {
        Verdict::Settled
    }
}

/// One outcome slot per member: members refused before publishing get their error, the
/// rest what the sink answered. A slot the sink did not fill stays `None` (unconfirmed).
async fn publish(
    t: &Trigger,
    publisher: &mut Publisher,
    batch: &ClaimBatch,
    ids: &[MessageId],
    abort: &CancellationToken,
) -> Vec<Option<Outcome>> {
    let cfg = &t.config;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.items.len()];
    let mut prepared = Vec::with_capacity(batch.items.len());
    let mut slots = Vec::with_capacity(batch.items.len());
    for (i, c) in batch.items.iter().enumerate() {
        match prepare(cfg, &t.destination, c, batch.now_ms) {
            Ok(p) => {
                slots.push(i);
                prepared.push((c, p));
            }
            Err(e) => outcomes[i] = Some(Err(e)),
        }
    }
    if prepared.is_empty() {
        return outcomes;
    }
    let out: Vec<OutMessage<'_>> = prepared
        .iter()
        .zip(&slots)
        .map(|((c, p), &i)| OutMessage {
            payload: &p.body,
            member: &c.member,
            due_ms: c.due_ms,
            attempt: c.attempt,
            id: p
                .properties
                .as_ref()
                .and_then(|p| p.id.as_deref())
                .unwrap_or(ids[i].as_str()),
            routing_key: p.routing_key.as_deref(),
            properties: p.properties.as_ref(),
        })
        .collect();
    let started = Instant::now();
    let published = publisher
        .publish_batch(t.name(), &out, cfg.publish_timeout, abort)
        .await;
    t.metrics.published(started.elapsed());
    for (slot, outcome) in slots.into_iter().zip(published) {
        outcomes[slot] = Some(outcome);
    }
    outcomes
}

/// Runs the settle script, retrying Redis errors until the lease would expire anyway
/// (after that, recovery redelivers the batch: a duplicate, never a loss).
async fn settle(t: &Trigger, abort: &CancellationToken, batch: &ClaimBatch, plan: &Plan<'_>) {
    let s = &plan.settlement;
    let give_up = Instant::now() + t.config.lease;
    let mut failures = 0u32;
    let settled = loop {
        match t
            .store
            .settle(batch.deadline_ms, t.config.max_attempts, s)
            .await
        {
            Ok(settled) => break settled,
            Err(e) => {
                failures += 1;
                let own = t.redis_error(&e);
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
    t.metrics.settled(s, &settled);
    if settled.fail_outcomes.contains(&FailOutcome::DeadLettered) {
        t.dead_lettered.notify_one();
    }
    let held_back = t
        .held_back
        .swap(false, std::sync::atomic::Ordering::Relaxed);
    if settled.released > 0 || held_back {
        // A copy the producer added while this one was in flight may be claimable now.
        t.wake_all();
    }
}
