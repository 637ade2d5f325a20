//! The settle call (`settle.lua`): what it is asked to do with each member of a batch, the
//! call, and what it did.

use std::time::Duration;

use super::{millis, Claimed, Store, StoreError, SCRIPTS};
use crate::proof::Confirmed;

/// What to do with each member of a settled batch: a description of the settle script's
/// work, built member by member. Only a member with its sink's [`Confirmed`] is acked.
#[derive(Debug)]
pub struct Settlement<'a> {
    /// Confirmed by the broker: remove.
    pub(super) ack: Vec<&'a [u8]>,
    /// Rejected: count the attempt, then retry later or dead-letter.
    pub(super) fail: Vec<Failure<'a>>,
    /// Not attempted or interrupted: back to the source set with their original score.
    pub(super) put_back: Vec<&'a Claimed>,
    /// Expired with `on_expired = "drop"`: removed like acked members, never published.
    pub(super) drop: Vec<&'a [u8]>,
}

impl<'a> Settlement<'a> {
    /// A settlement that does nothing yet, with room for a batch of `members`.
    pub fn for_batch(members: usize) -> Self {
        Self {
            ack: Vec::with_capacity(members),
            fail: Vec::new(),
            put_back: Vec::new(),
            drop: Vec::new(),
        }
    }

    /// Removes `member`, which its sink confirmed: the proof ends here.
    pub fn ack(&mut self, member: &'a [u8], proof: Confirmed) {
        let Confirmed { .. } = proof;
        self.ack.push(member);
    }

    /// Counts an attempt of a member the sink did not take: retried later or dead-lettered.
    pub fn fail(&mut self, failure: Failure<'a>) {
        self.fail.push(failure);
    }

    /// Puts a member back with its original score: not attempted, or not its fault.
    pub fn put_back(&mut self, claimed: &'a Claimed) {
        self.put_back.push(claimed);
    }

    /// Removes an expired member unpublished (`on_expired = "drop"`).
    pub fn drop_expired(&mut self, member: &'a [u8]) {
        self.drop.push(member);
    }

    /// The members acked.
    pub fn acks(&self) -> &[&'a [u8]] {
        &self.ack
    }

    /// The members put back.
    pub fn put_backs(&self) -> &[&'a Claimed] {
        &self.put_back
    }

    /// The members dropped as expired.
    pub fn drops(&self) -> &[&'a [u8]] {
        &self.drop
    }

    /// The failures, in the order of the script's per-failure outcomes.
    pub fn failures(&self) -> &[Failure<'a>] {
        &self.fail
    }

    /// Nothing to do: every member was settled already.
    pub fn is_empty(&self) -> bool {
        self.ack.is_empty()
            && self.fail.is_empty()
            && self.put_back.is_empty()
            && self.drop.is_empty()
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

impl Store {
    /// Acks, fails and puts back the members of one batch in one script call.
    pub async fn settle(
        &self,
        deadline_ms: i64,
        max_attempts: u32,
        s: &Settlement<'_>,
    ) -> Result<Settled, StoreError> {
        let mut inv = self.keyed(&SCRIPTS.settle);
        inv.arg(deadline_ms)
            .arg(max_attempts)
            .arg(s.ack.len() + s.drop.len())
            .arg(s.fail.len())
            .arg(s.put_back.len())
            .arg(self.hash_flag());
        for m in s.ack.iter().chain(&s.drop) {
            inv.arg(*m);
        }
        for f in &s.fail {
            inv.arg(f.member)
                .arg(millis(f.retry_in))
                .arg(f.reason.as_ref())
                .arg(if f.permanent { "1" } else { "0" })
                .arg(f.detail.as_deref().unwrap_or(""));
        }
        for c in &s.put_back {
            inv.arg(c.member.as_slice()).arg(c.due_raw.as_slice());
        }
        let reply: Vec<i64> = inv.invoke_async(&mut self.conn.clone()).await?;
        if reply.len() != 3 + s.fail.len() {
            return Err(StoreError::Reply("settle reply length"));
        }
        Ok(Settled {
            acked: reply[0] as u64,
            put_back: reply[1] as u64,
            released: reply[2] as u64,
            fail_outcomes: reply[3..]
                .iter()
                .map(|o| match o {
                    1 => FailOutcome::Retried,
                    2 => FailOutcome::DeadLettered,
                    _ => FailOutcome::NotOwned,
                })
                .collect(),
        })
    }
}
