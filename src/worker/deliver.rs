//! Delivering one claimed batch: publish, wait for the broker's confirmations, settle in Redis.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::route::routing_key_at;
use super::{Trigger, ERROR_BACKOFF};
use crate::backoff::Backoff;
use crate::sink::{Disposition, MessageId, OutMessage, PublishError, Publisher};
use crate::store::{ClaimBatch, FailOutcome, Settlement};

/// Publishes a claimed batch and settles every member: ack, retry, dead-letter or put
/// back. Runs as its own task so the worker can claim again while the broker confirms.
/// Returns true when the sink failed (the worker then gets a new publisher and backs off).
pub(super) async fn deliver(
    t: Arc<Trigger>,
    mut publisher: Publisher,
    batch: ClaimBatch,
    claimed_at: Instant,
    abort: CancellationToken,
) -> bool {
    let cfg = &t.config;
    let ids: Vec<MessageId> = batch
        .items
        .iter()
        .map(|c| MessageId::new(&cfg.key, &c.member))
        .collect();
    let pointed: Vec<Result<String, PublishError>> = match &cfg.routing_key_pointer {
        Some(pointer) => batch
            .items
            .iter()
            .map(|c| routing_key_at(&c.member, pointer))
            .collect(),
        None => Vec::new(),
    };
    let mut results: Vec<Result<(), PublishError>> = Vec::with_capacity(batch.items.len());
    let mut out = Vec::with_capacity(batch.items.len());
    let mut slots = Vec::with_capacity(batch.items.len());
    for (i, c) in batch.items.iter().enumerate() {
        let routing_key = match pointed.get(i) {
            Some(Ok(rk)) => Some(rk.as_str()),
            Some(Err(e)) => {
                results.push(Err(e.clone()));
                continue;
            }
            None => None,
        };
        if c.member.len() > cfg.max_message_bytes {
            results.push(Err(PublishError::TooLarge));
        } else {
            results.push(Ok(()));
            slots.push(i);
            out.push(OutMessage {
                payload: &c.member,
                due_ms: c.due_ms,
                attempt: c.attempt,
                id: ids[i].as_str(),
                routing_key,
            });
        }
    }
    if !out.is_empty() {
        let started = Instant::now();
        let published = publisher
            .publish_batch(
                cfg.name.as_str(),
                &t.route,
                &out,
                cfg.publish_timeout,
                &abort,
            )
            .await;
        t.metrics
            .publish_duration
            .with_label_values(&[cfg.name.as_str(), t.sink.name()])
            .observe(started.elapsed().as_secs_f64());
        for (slot, r) in slots.into_iter().zip(published) {
            results[slot] = r;
        }
    }
    // Confirmation time on the Redis clock: claim time plus what elapsed locally since.
    let confirmed_ms = batch.now_ms + claimed_at.elapsed().as_millis() as i64;

    let backoff = Backoff {
        initial: cfg.backoff_initial,
        max: cfg.backoff_max,
    };
    let mut settlement = Settlement::default();
    let mut fail_reasons = Vec::new();
    let mut sink_broken = false;
    let lateness = t.metrics.lateness.with_label_values(&[cfg.name.as_str()]);
    for (c, r) in batch.items.iter().zip(&results) {
        match r {
            Ok(()) => {
                settlement.ack.push(&c.member);
                lateness.observe(
                    (confirmed_ms.saturating_sub(c.due_ms)).clamp(0, 86_400_000) as f64 / 1000.0,
                );
            }
            Err(e) => {
                sink_broken |= e.breaks_sink();
                match e.disposition() {
                    Disposition::PutBack => settlement.put_back.push((&c.member, &c.due_raw)),
                    d => {
                        fail_reasons.push(e.reason());
                        settlement.fail.push((
                            &c.member,
                            backoff.delay(c.attempt),
                            "",
                            d == Disposition::DeadLetter,
                        ));
                    }
                }
            }
        }
    }
    for (entry, reason) in settlement.fail.iter_mut().zip(&fail_reasons) {
        entry.2 = reason;
    }
    settle(&t, &abort, &batch, &settlement, &fail_reasons).await;
    if sink_broken {
        tracing::warn!(sink = %t.sink.name(), confirmed = settlement.ack.len(),
            "broker connection failed mid-batch; unconfirmed messages went back");
    }
    sink_broken
}

/// Runs the settle script, retrying Redis errors until the lease would expire anyway
/// (after that, recovery redelivers the batch: a duplicate, never a loss).
async fn settle(
    t: &Trigger,
    abort: &CancellationToken,
    batch: &ClaimBatch,
    s: &Settlement<'_>,
    fail_reasons: &[std::borrow::Cow<'static, str>],
) {
    let name = t.config.name.as_str();
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
                t.redis_error(&e);
                let wait = ERROR_BACKOFF.delay(failures);
                if Instant::now() + wait >= give_up || abort.is_cancelled() {
                    tracing::warn!(error = %e, members = batch.items.len(),
                        "could not settle the batch; its lease will expire and it will be redelivered");
                    return;
                }
                tracing::warn!(error = %e, failures, "settle failed, retrying");
                tokio::time::sleep(wait).await;
            }
        }
    };
    if !s.ack.is_empty() {
        t.metrics
            .forwarded
            .with_label_values(&[name, t.sink.name()])
            .inc_by(s.ack.len() as u64);
    }
    if settled.put_back > 0 {
        t.metrics
            .put_back
            .with_label_values(&[name])
            .inc_by(settled.put_back);
    }
    for (outcome, reason) in settled.fail_outcomes.iter().zip(fail_reasons) {
        match outcome {
            FailOutcome::Retried => t.metrics.retried.with_label_values(&[name, reason]).inc(),
            FailOutcome::DeadLettered => {
                tracing::warn!(reason = %reason, "message dead-lettered");
                t.metrics
                    .dead_lettered
                    .with_label_values(&[name, reason])
                    .inc()
            }
            FailOutcome::NotOwned => {}
        }
    }
}
