//! The dead-letter forwarder's side of a queue: claiming dead letters under a lease, and
//! settling what the broker did with them.

use std::time::Duration;

use redis::Value;

use super::{millis, score_ms, Body, Store, StoreError};
use crate::redis::scripts::SCRIPTS;

/// Dead letters claimed for forwarding to the trigger's dead-letter destination.
#[derive(Debug, Default)]
pub struct DeadClaim {
    /// Redis server time of the claim, epoch ms.
    pub now_ms: i64,
    /// Lease deadline of every letter of this claim; also its ownership token.
    pub deadline_ms: i64,
    /// The letters, oldest first.
    pub items: Vec<DeadItem>,
}

/// One dead letter claimed for forwarding.
#[derive(Debug, Clone)]
pub struct DeadItem {
    /// The member (the id in hash payload mode).
    pub member: Vec<u8>,
    /// When it was dead-lettered, epoch ms.
    pub at_ms: i64,
    /// JSON with the reason, the attempt count and maybe a detail.
    pub reason: Option<String>,
    /// Its message body (as for a claimed member).
    pub body: Body,
}

impl DeadItem {
    /// The bytes to forward, or `None` when the body is missing or too large to read.
    pub fn payload(&self) -> Option<&[u8]> {
        self.body.bytes(&self.member)
    }
}

/// The letters of one dead-letter forward, by what became of them.
#[derive(Debug, Default)]
pub struct DeadOutcome<'a> {
    /// The broker has them: they leave Redis.
    pub confirmed: Vec<&'a [u8]>,
    /// The broker has them, but the remedy lives in Redis (`missing_body`): kept for good.
    pub kept: Vec<&'a [u8]>,
    /// The broker will never take them: kept for good.
    pub refused: Vec<&'a [u8]>,
    /// Not forwarded for a reason of the sink: claimable again at once.
    pub released: Vec<&'a [u8]>,
}

/// What one dead-letter settle did: letters that were still this claim's.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DeadSettled {
    /// Deleted from Redis: the broker confirmed them.
    pub confirmed: u64,
    /// Confirmed by the broker but kept for good: what a remedy needs is only in Redis.
    pub kept: u64,
    /// Kept for good: the broker refused them.
    pub refused: u64,
    /// Free to claim again at once.
    pub released: u64,
}

impl Store {
    /// Claims up to `limit` dead letters (at most 1,000) for forwarding, with a lease of
    /// `lease`; nothing while the queue is paused.
    pub async fn claim_dead(&self, limit: usize, lease: Duration) -> Result<DeadClaim, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .keyed(&SCRIPTS.dead_claim)
            .arg(limit)
            .arg(millis(lease))
            .arg(self.hash_flag())
            .arg(self.largest_body)
            .invoke_async(&mut conn)
            .await?;
        parse_dead_claim(reply, self.hash_bodies())
    }

    /// Settles forwarded dead letters of the claim whose lease is `deadline_ms`: deletes the
    /// `confirmed`, keeps the `kept` (forwarded) and the `refused` for good, and frees the
    /// `released`.
    pub async fn settle_dead(
        &self,
        deadline_ms: i64,
        outcome: &DeadOutcome<'_>,
    ) -> Result<DeadSettled, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.keyed(&SCRIPTS.dead_settle);
        inv.arg(deadline_ms)
            .arg(self.hash_flag())
            .arg(outcome.confirmed.len())
            .arg(outcome.kept.len())
            .arg(outcome.refused.len())
            .arg(outcome.released.len());
        for m in [
            &outcome.confirmed,
            &outcome.kept,
            &outcome.refused,
            &outcome.released,
        ]
        .into_iter()
        .flatten()
        {
            inv.arg(*m);
        }
        let (confirmed, kept, refused, released): (u64, u64, u64, u64) =
            inv.invoke_async(&mut conn).await?;
        Ok(DeadSettled {
            confirmed,
            kept,
            refused,
            released,
        })
    }
}

fn parse_dead_claim(reply: Value, hash: bool) -> Result<DeadClaim, StoreError> {
    let Value::Array(items) = reply else {
        return Err(StoreError::Reply("dead-letter claim reply is not an array"));
    };
    let width = if hash { 4 } else { 3 };
    if items.len() < 2 || (items.len() - 2) % width != 0 {
        return Err(StoreError::Reply("dead-letter claim reply length"));
    }
    let mut it = items.into_iter();
    let (Some(Value::Int(now_ms)), Some(Value::Int(deadline_ms))) = (it.next(), it.next()) else {
        return Err(StoreError::Reply("dead-letter claim reply header"));
    };
    let mut out = Vec::with_capacity(it.len() / width);
    while let (Some(m), Some(at), Some(reason)) = (it.next(), it.next(), it.next()) {
        let (Value::BulkString(member), Value::BulkString(at), Value::BulkString(reason)) =
            (m, at, reason)
        else {
            return Err(StoreError::Reply("claimed dead letter"));
        };
        let body = Body::from_reply(hash, &mut it)?;
        out.push(DeadItem {
            member,
            at_ms: score_ms(&at).ok_or(StoreError::Reply("dead letter score"))?,
            reason: (!reason.is_empty()).then(|| String::from_utf8_lossy(&reason).into_owned()),
            body,
        });
    }
    Ok(DeadClaim {
        now_ms,
        deadline_ms,
        items: out,
    })
}
