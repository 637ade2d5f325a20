//! Dead letters to the broker: forwards a trigger's dead letters to its dead-letter
//! destination with the reason in headers; each leaves Redis only once the broker confirmed it.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::jitter_down;
use crate::config::Destination;
use crate::envelope::{HeaderValue, Properties};
use crate::redis::store::{Body, DeadClaim, DeadItem, DeadOutcome};
use crate::repeat::Repeated;
use crate::sink::blame::{self, Chosen, Verdict};
use crate::sink::{Batch, MessageId, OutMessage, PublishError, Publisher};
use crate::trigger::{Route, Shard};
use crate::wire::{
    HEADER_DEAD_ATTEMPTS, HEADER_DEAD_AT_MS, HEADER_DEAD_DETAIL, HEADER_DEAD_ID,
    HEADER_DEAD_ID_B64, HEADER_DEAD_KEY, HEADER_DEAD_REASON,
};
use crate::worker::{Publishing, ERROR_BACKOFF};

/// Most dead letters one forward takes.
const FORWARD_BATCH: usize = 100;

/// Forwards the dead letters of `shard` until `stop`, if the trigger has a dead-letter
/// destination; `abort` cuts short the wait for confirmations at the shutdown deadline.
/// Every bridge on the trigger may run this: a lease in the `dead_inflight` set keeps two
/// from forwarding the same letter, except after a lease expiry.
pub(crate) async fn forward_dead_letters(
    shard: Arc<Shard>,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let Some(destination) = shard.trigger().dead_letter().cloned() else {
        return;
    };
    shard
        .metrics()
        .forwarding_dead_letters(PublishError::reasons_of(&destination));
    let span = tracing::info_span!("dead_letters", trigger = %shard.name());
    Forwarder {
        shard,
        destination,
        publishing: Publishing::default(),
        redis_failures: Repeated::default(),
        unforwarded: Repeated::default(),
        refusals: Repeated::default(),
        broken_forwards: 0,
        stop,
        abort,
    }
    .run()
    .instrument(span)
    .await
}

struct Forwarder {
    shard: Arc<Shard>,
    destination: Destination,
    /// The publisher, and failures to get one or forwards that broke it.
    publishing: Publishing,
    /// Failed claims and settles.
    redis_failures: Repeated,
    /// Forwards that left letters to be tried again after their lease.
    unforwarded: Repeated,
    /// Forwards with refused letters, logged at growing gaps.
    refusals: Repeated,
    /// Consecutive forwards that ended with the sink failing.
    broken_forwards: u32,
    stop: CancellationToken,
    abort: CancellationToken,
}

/// A letter the broker will never take: its member, the reason label, what was said.
type Refused<'a> = (&'a [u8], std::borrow::Cow<'static, str>, String);

/// What became of each letter of one forward.
#[derive(Default)]
struct Sorted<'a> {
    /// The letters to settle: confirmed; kept (confirmed, but the message could not carry
    /// the remedy: no body, the id only, which an operator completes in Redis); refused;
    /// released (not forwarded for a reason of the sink, claimable again at once).
    outcome: DeadOutcome<'a>,
    /// The refused ones with their reason: kept in Redis for good.
    refused: Vec<Refused<'a>>,
    /// Not confirmed: tried again once the lease expires (the broker may still have them).
    unconfirmed: Vec<std::borrow::Cow<'static, str>>,
    /// The sink failed: get a new publisher and back off.
    sink_broken: bool,
    /// The dead-letter destination failed: what it said (the trigger is held for it).
    held: Option<String>,
}

impl<'a> Sorted<'a> {
    /// `member` will never be taken by the broker: `label` and `why` say so.
    fn refuse(&mut self, member: &'a [u8], label: std::borrow::Cow<'static, str>, why: String) {
        self.outcome.refused.push(member);
        self.refused.push((member, label, why));
    }
}

impl Forwarder {
    async fn run(mut self) {
        while !self.stop.is_cancelled() {
            let Some(publisher) = self.publisher().await else {
                continue;
            };
            let claim = match self
                .shard
                .store()
                .claim_dead(FORWARD_BATCH, self.shard.trigger().lease())
                .await
            {
                Ok(claim) => {
                    self.redis_failures.recovered();
                    claim
                }
                Err(e) => {
                    self.redis_failed(&e, "claiming dead letters to forward failed");
                    self.pause(ERROR_BACKOFF.delay(self.redis_failures.count()))
                        .await;
                    continue;
                }
            };
            if claim.items.is_empty() {
                self.idle().await;
                continue;
            }
            let sorted = self.forward(publisher, &claim).await;
            self.settle(&claim, &sorted).await;
            // A letter kept (its body missing) was confirmed by the broker too.
            let through = !sorted.outcome.confirmed.is_empty() || !sorted.outcome.kept.is_empty();
            match &sorted.held {
                Some(why) => self.shard.hold(Route::DeadLetters, why).await,
                None if through => self.shard.release(Route::DeadLetters).await,
                None => {}
            }
            if sorted.sink_broken {
                // As a worker does: a new channel at once, the shared connection (every
                // trigger's) only when forwards keep breaking.
                self.broken_forwards += 1;
                if let Some(broken) = self.publishing.current.take() {
                    if self.broken_forwards > 1 {
                        self.shard.sink().reset(&broken).await;
                    }
                }
                self.pause(ERROR_BACKOFF.delay(self.broken_forwards)).await;
            } else {
                self.broken_forwards = 0;
                if !through && !sorted.unconfirmed.is_empty() {
                    // As a worker does: from the second forward the destination failed in
                    // full on a connection that stayed up, a fresh channel (a broker can
                    // keep nacking on one, see `Publisher::retire`).
                    if sorted.held.is_some()
                        && self.unforwarded.count() > 1
                        && self.publishing.retire().await
                    {
                        tracing::debug!(sink = %self.shard.sink().name(),
                            forwards = self.unforwarded.count(), "a held destination: a fresh channel");
                    }
                    // Nothing got through (unroutable, nacked): those wait for their lease;
                    // the next claim waits a little too, longer while it goes on.
                    self.pause(ERROR_BACKOFF.delay(self.unforwarded.count()))
                        .await;
                }
            }
        }
    }

    /// A usable publisher for the dead-letter destination, or `None` after a backoff.
    async fn publisher(&mut self) -> Option<Publisher> {
        let failed_before = self.publishing.failures.count() > 0;
        let e = match self
            .publishing
            .get(self.shard.sink(), &self.destination, &self.stop)
            .await
        {
            Ok(p) => {
                if failed_before && p.is_some() {
                    self.shard.release(Route::DeadLetters).await;
                }
                return p;
            }
            Err(e) => e,
        };
        if blame::holds_own(&e, Chosen::default()) {
            self.shard.hold(Route::DeadLetters, &e.to_string()).await;
        }
        // While the whole sink is down its own log speaks for the outage.
        let failures = &mut self.publishing.failures;
        if let Some(unlogged) = failures.failed() {
            if self.shard.sink().is_up() || failures.count() == 1 {
                tracing::warn!(destination = %self.destination, error = %e,
                    failures = failures.count(), unlogged,
                    "cannot forward dead letters; they stay in Redis meanwhile");
            }
        }
        let wait = ERROR_BACKOFF.delay(failures.count());
        self.pause(wait).await;
        None
    }

    /// Publishes the claimed letters and sorts them by what the broker said.
    async fn forward<'a>(&mut self, mut publisher: Publisher, claim: &'a DeadClaim) -> Sorted<'a> {
        let cfg = self.shard.trigger();
        let mut sorted = Sorted::default();
        let mut sendable = Vec::with_capacity(claim.items.len());
        for item in &claim.items {
            let payload = match &item.body {
                Body::TooLarge(_) => None,
                // Nothing to lose: the letter is its reason (`missing_body`).
                Body::Missing => Some(&[][..]),
                _ => item.payload(),
            };
            match payload.filter(|p| p.len() <= cfg.max_message_bytes()) {
                Some(payload) => sendable.push((
                    item,
                    payload,
                    headers(item, &self.shard.store().keys().source),
                    MessageId::new(cfg.key(), &item.member),
                )),
                None => sorted.refuse(
                    item.member.as_slice(),
                    "too_large".into(),
                    format!(
                        "larger than max_message_bytes ({})",
                        cfg.max_message_bytes()
                    ),
                ),
            }
        }
        let messages: Vec<OutMessage<'_>> = sendable
            .iter()
            .map(|(item, payload, (props, attempts), id)| OutMessage {
                payload,
                member: &item.member,
                due_ms: item.at_ms,
                attempt: (*attempts).clamp(1, u32::MAX.into()) as u32,
                id: id.as_str(),
                routing_key: None,
                properties: Some(props),
                url: None,
                topic: None,
            })
            .collect();
        let outcomes = if messages.is_empty() {
            Vec::new()
        } else {
            publisher
                .publish_batch(Batch {
                    trigger: self.shard.name(),
                    messages: &messages,
                    timeout: cfg.publish_timeout(),
                    abort: &self.abort,
                    confirms: None,
                })
                .await
        };
        for ((item, ..), outcome) in sendable.iter().zip(outcomes) {
            let member = item.member.as_slice();
            let e = match outcome {
                Ok(_) if matches!(item.body, Body::Missing) => {
                    sorted.outcome.kept.push(member);
                    continue;
                }
                Ok(_) => {
                    sorted.outcome.confirmed.push(member);
                    continue;
                }
                Err(e) => e,
            };
            sorted.sink_broken |= e.breaks_sink();
            // The dead-letter route is the trigger's own: a refusal of the letter itself keeps
            // it for good (it would be refused again), a failure of the destination leaves it
            // for later.
            match blame::judge(&e, Chosen::default(), false) {
                Verdict::DeadLetter { reason } | Verdict::Attempt { reason } => {
                    sorted.refuse(member, reason, e.to_string())
                }
                Verdict::PutBack { hold } if hold && !e.breaks_sink() => {
                    sorted.held.get_or_insert_with(|| e.to_string());
                    sorted.unconfirmed.push(e.reason())
                }
                Verdict::PutBack { hold } => {
                    if hold {
                        sorted.held.get_or_insert_with(|| e.to_string());
                    }
                    sorted.outcome.released.push(member)
                }
            }
        }
        sorted
    }

    /// Settles one forward in Redis, retrying errors until the lease would expire anyway
    /// (then the letters are forwarded again: a duplicate, never a loss).
    async fn settle(&mut self, claim: &DeadClaim, sorted: &Sorted<'_>) {
        let shard = &self.shard;
        for (_, label, _) in &sorted.refused {
            shard.metrics().dead_letter_not_forwarded(label);
        }
        for reason in &sorted.unconfirmed {
            shard.metrics().dead_letter_not_forwarded(reason);
        }
        let give_up = Instant::now() + shard.trigger().lease();
        let mut failures = 0u32;
        let settled = loop {
            match shard
                .store()
                .settle_dead(claim.deadline_ms, &sorted.outcome)
                .await
            {
                Ok(settled) => break settled,
                Err(e) => {
                    failures += 1;
                    let wait = ERROR_BACKOFF.delay(failures);
                    if Instant::now() + wait >= give_up || self.abort.is_cancelled() {
                        self.redis_failed(&e, "could not settle forwarded dead letters; they will be forwarded again after their lease");
                        return;
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        };
        shard
            .metrics()
            .dead_letters_forwarded(settled.confirmed + settled.kept);
        if settled.refused == 0 {
            self.refusals.recovered();
        } else if let Some(unlogged) = self.refusals.failed() {
            // Named by message id, never by its bytes (the member is the payload inline).
            let (member, _, why) = &sorted.refused[0];
            let first = MessageId::new(shard.trigger().key(), member);
            tracing::warn!(refused = settled.refused, first_id = first.as_str(),
                reason = %why, forwards = self.refusals.count(), unlogged,
                "the broker refuses these dead letters; they stay in Redis (list, requeue or purge them)");
        }
        if sorted.unconfirmed.is_empty() {
            self.unforwarded.recovered();
        } else if let Some(unlogged) = self.unforwarded.failed() {
            tracing::warn!(unconfirmed = sorted.unconfirmed.len(), reason = %sorted.unconfirmed[0],
                failures = self.unforwarded.count(), unlogged,
                "dead letters not confirmed by the broker; forwarded again after their lease");
        }
    }

    /// Counts a failed Redis call and logs it unless the outage is logged already.
    fn redis_failed(&mut self, e: &crate::redis::store::StoreError, what: &str) {
        let own = self.shard.redis_error(e);
        if let Some(unlogged) = self.redis_failures.failed().filter(|_| own) {
            tracing::warn!(error = %e, failures = self.redis_failures.count(), unlogged, "{what}");
        }
    }

    /// Waits until this bridge dead-letters something, the backlog gauges see letters to
    /// forward (a peer's, or ones whose lease expired), or the guard interval passes.
    async fn idle(&self) {
        tokio::select! {
            _ = tokio::time::sleep(jitter_down(self.shard.guard())) => {}
            _ = self.shard.dead_letters() => {}
            _ = self.stop.cancelled() => {}
        }
    }

    async fn pause(&self, d: std::time::Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stop.cancelled() => {}
        }
    }
}

/// The headers that say why a letter is dead (reason, detail, attempts, when) and which it
/// is (its key, and in hash mode its id), read from its reason JSON once, and its attempt
/// count.
fn headers(item: &DeadItem, key: &str) -> (Properties, i64) {
    use serde_json::Value;
    let why: Option<Value> = item
        .reason
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok());
    let field = |name: &str| why.as_ref().and_then(|v| v.get(name));
    let text = |name: &str| field(name).and_then(Value::as_str).map(str::to_string);
    let attempts = field("attempts").and_then(Value::as_i64).unwrap_or(0);
    let mut headers = vec![
        (
            HEADER_DEAD_REASON.to_string(),
            HeaderValue::Text(text("reason").unwrap_or_else(|| "unknown".into())),
        ),
        (HEADER_DEAD_ATTEMPTS.to_string(), HeaderValue::Int(attempts)),
        (HEADER_DEAD_AT_MS.to_string(), HeaderValue::Int(item.at_ms)),
        (
            HEADER_DEAD_KEY.to_string(),
            HeaderValue::Text(key.to_string()),
        ),
    ];
    // Inline, the body is the member itself; in hash mode the id says which body it was.
    if !matches!(item.body, Body::Member) {
        use base64::Engine;
        headers.push(match std::str::from_utf8(&item.member) {
            Ok(id) => (
                HEADER_DEAD_ID.to_string(),
                HeaderValue::Text(id.to_string()),
            ),
            Err(_) => (
                HEADER_DEAD_ID_B64.to_string(),
                HeaderValue::Text(base64::engine::general_purpose::STANDARD.encode(&item.member)),
            ),
        });
    }
    if let Some(detail) = text("detail") {
        headers.push((HEADER_DEAD_DETAIL.to_string(), HeaderValue::Text(detail)));
    }
    let properties = Properties {
        headers,
        ..Properties::default()
    };
    (properties, attempts)
}
