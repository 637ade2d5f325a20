//! What a settle call is asked to do with each member of a batch, and what it did.

use std::time::Duration;

use super::Claimed;

/// What to do with each member of a settled batch: a description of the settle script's
/// work. The worker builds it only from the sink's outcomes (`worker::settlement`).
#[derive(Debug, Default)]
pub struct Settlement<'a> {
    /// Confirmed by the broker: remove.
    pub ack: Vec<&'a [u8]>,
    /// Rejected: count the attempt, then retry later or dead-letter.
    pub fail: Vec<Failure<'a>>,
    /// Not attempted or interrupted: back to the source set with their original score.
    pub put_back: Vec<&'a Claimed>,
    /// Expired with `on_expired = "drop"`: removed like acked members, never published.
    pub drop: Vec<&'a [u8]>,
}

impl<'a> Settlement<'a> {
    /// Nothing to do: every member was settled already.
    pub fn is_empty(&self) -> bool {
        self.ack.is_empty()
            && self.fail.is_empty()
            && self.put_back.is_empty()
            && self.drop.is_empty()
    }

    /// Acks every member without anything having been published: only for measuring what
    /// the scripts alone can do (the benchmark's Redis ceiling), never for delivery. Built
    /// only with the `bench-hooks` feature, which the daemon's builds leave out.
    #[cfg(feature = "bench-hooks")]
    pub fn ack_unpublished(items: &'a [Claimed]) -> Self {
        Self {
            ack: items.iter().map(|c| c.member.as_slice()).collect(),
            ..Self::default()
        }
    }
}

/// A member the broker did not take.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// The member.
    pub member: &'a [u8],
    /// Wait before it is due again, if it is retried.
    pub retry_in: Duration,
    /// Bounded label, also the dead-letter reason.
    pub reason: std::borrow::Cow<'static, str>,
    /// Dead-letter now: retrying cannot help.
    pub permanent: bool,
    /// Kept with the dead letter's reason: what exactly was wrong (a parser's message).
    pub detail: Option<String>,
}

/// What the settle script did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Members removed from the in-flight set.
    pub acked: u64,
    /// Members put back.
    pub put_back: u64,
    /// Failed or put-back members whose scheduled copy (the producer added them again while
    /// in flight) became claimable because this batch let go of them: the workers should
    /// look again. Acks are not counted here (see [`ClaimBatch::skipped`]).
    pub released: u64,
    /// Per entry of `Settlement::fail`: whether it was retried, dead-lettered, or no longer ours.
    pub fail_outcomes: Vec<FailOutcome>,
}

/// Fate of one failed member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Its lease had expired and someone else holds it now, or it was already recovered.
    NotOwned,
    /// Back in the source set after its backoff.
    Retried,
    /// Moved to the dead-letter set.
    DeadLettered,
}
