//! From a claimed batch and what the broker said of each message to what the settle script does.

use crate::backoff::Backoff;
use crate::config::OnExpired;
use crate::redis::store::{Claimed, Failure, Settlement};
use crate::sink::{Disposition, Outcome, PublishError};

/// The settlement of one batch and what it tells the worker.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    /// What the settle script does with each member.
    pub settlement: Settlement<'a>,
    /// Due times of the confirmed members, for the lateness histogram.
    pub confirmed_due_ms: Vec<i64>,
    /// The sink failed, not a message: the worker gets a new publisher and backs off.
    pub sink_broken: bool,
    /// The broker refused every message of the batch, each alone: what it said.
    pub sink_refusal: Option<String>,
    /// Members the broker refused alone while others went through.
    pub refused: Option<Refusals>,
}

/// The members of a batch the broker refused alone.
#[derive(Debug)]
pub(super) struct Refusals {
    pub count: usize,
    /// The position of the first in the batch.
    pub first: usize,
    /// What the broker said of the first.
    pub reply: String,
}

/// Builds the settlement of `items` from `outcomes` (one per item, by position). A member
/// with no outcome, or with a slot left `None`, was not confirmed: it is failed like a
/// timeout, never acked. Only a [`crate::sink::Confirmed`] outcome acks.
/// An expired member is dead-lettered, or with `on_expired = "drop"` removed unpublished.
/// Members marked in `early` were acked while the rest of the batch was in flight: left out.
pub(super) fn plan<'a>(
    items: &'a [Claimed],
    outcomes: &[Option<Outcome>],
    early: &[bool],
    backoff: &Backoff,
    on_expired: OnExpired,
) -> Plan<'a> {
    let mut plan = Plan {
        settlement: Settlement::default(),
        confirmed_due_ms: Vec::with_capacity(items.len()),
        sink_broken: false,
        sink_refusal: None,
        refused: None,
    };
    const UNCONFIRMED: Outcome = Err(PublishError::Timeout);
    for (i, c) in items.iter().enumerate() {
        if early.get(i).copied().unwrap_or(false) {
            continue;
        }
        let outcome = outcomes
            .get(i)
            .and_then(Option::as_ref)
            .unwrap_or(&UNCONFIRMED);
        let e = match outcome {
            Ok(_confirmed) => {
                plan.settlement.ack.push(&c.member);
                plan.confirmed_due_ms.push(c.due_ms);
                continue;
            }
            Err(e) => e,
        };
        plan.sink_broken |= e.breaks_sink();
        match e {
            PublishError::SinkRefused { .. } if plan.sink_refusal.is_none() => {
                plan.sink_refusal = Some(e.to_string());
            }
            PublishError::BrokerRefused { .. } => match &mut plan.refused {
                Some(r) => r.count += 1,
                None => {
                    plan.refused = Some(Refusals {
                        count: 1,
                        first: i,
                        reply: e.to_string(),
                    })
                }
            },
            _ => {}
        }
        if matches!(e, PublishError::Expired) && on_expired == OnExpired::Drop {
            plan.settlement.drop.push(&c.member);
            continue;
        }
        match e.disposition() {
            Disposition::PutBack => plan.settlement.put_back.push(c),
            d => plan.settlement.fail.push(Failure {
                member: &c.member,
                retry_in: retry_in(backoff, c.attempt, e),
                reason: e.reason(),
                permanent: d == Disposition::DeadLetter,
                detail: e.detail(),
            }),
        }
    }
    plan
}

/// The backoff before attempt `attempt + 1`, but not sooner than the endpoint's
/// `Retry-After` (itself capped at the backoff's maximum).
fn retry_in(backoff: &Backoff, attempt: u32, e: &PublishError) -> std::time::Duration {
    let delay = backoff.delay(attempt);
    match e.retry_after() {
        Some(asked) => delay.max(asked.min(backoff.max)),
        None => delay,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn item(member: &str, attempt: u32) -> Claimed {
        Claimed {
            body: crate::redis::store::Body::Member,
            member: member.as_bytes().to_vec(),
            due_raw: b"1000".to_vec(),
            due_ms: 1000,
            attempt,
        }
    }

    const BACKOFF: Backoff = Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(60),
    };

    fn members<'a>(v: impl IntoIterator<Item = &'a [u8]>) -> Vec<&'a str> {
        v.into_iter()
            .map(|m| std::str::from_utf8(m).unwrap())
            .collect()
    }

    #[test]
    fn expired_members_are_dead_lettered_or_dropped_as_configured() {
        let items = [item("old", 1), item("ok", 1)];
        let outcomes = [
            Some(Err(PublishError::Expired)),
            Some(Ok(crate::sink::Confirmed::for_tests())),
        ];
        let dead = plan(&items, &outcomes, &[], &BACKOFF, OnExpired::DeadLetter);
        assert_eq!(dead.settlement.fail.len(), 1);
        assert_eq!(dead.settlement.fail[0].reason, "expired");
        assert!(dead.settlement.fail[0].permanent);
        assert!(dead.settlement.drop.is_empty());
        let dropped = plan(&items, &outcomes, &[], &BACKOFF, OnExpired::Drop);
        assert_eq!(members(dropped.settlement.drop.iter().copied()), ["old"]);
        assert_eq!(members(dropped.settlement.ack.iter().copied()), ["ok"]);
        assert!(dropped.settlement.fail.is_empty());
        assert_eq!(
            dropped.confirmed_due_ms.len(),
            1,
            "a drop is not a delivery"
        );
    }

    #[test]
    fn missing_outcomes_are_never_acked() {
        let items = [item("a", 1), item("b", 1), item("c", 1)];
        // A publisher that answered for the first member only.
        let outcomes = [Some(Ok(crate::sink::Confirmed::for_tests()))];
        let p = plan(&items, &outcomes, &[], &BACKOFF, OnExpired::DeadLetter);
        assert_eq!(members(p.settlement.ack.iter().copied()), ["a"]);
        let failed = members(p.settlement.fail.iter().map(|f| f.member));
        assert_eq!(failed, ["b", "c"]);
        assert!(p.settlement.fail.iter().all(|f| f.reason == "timeout"));
        assert!(p.sink_broken);

        // A slot left empty counts the same as a missing one.
        let outcomes = [None, Some(Ok(crate::sink::Confirmed::for_tests())), None];
        let p = plan(&items, &outcomes, &[], &BACKOFF, OnExpired::DeadLetter);
        assert_eq!(members(p.settlement.ack.iter().copied()), ["b"]);
        assert_eq!(p.settlement.fail.len(), 2);
    }

    #[test]
    fn each_error_lands_where_its_disposition_says() {
        let items = [
            item("ok", 1),
            item("nack", 3),
            item("big", 1),
            item("down", 2),
            item("refused", 1),
            item("blocked", 1),
            item("every", 1),
        ];
        let outcomes = [
            Some(Ok(crate::sink::Confirmed::for_tests())),
            Some(Err(PublishError::Nack)),
            Some(Err(PublishError::TooLarge)),
            Some(Err(PublishError::Connection("gone".into()))),
            Some(Err(PublishError::BrokerRefused {
                code: 406,
                text: "PRECONDITION_FAILED".into(),
            })),
            Some(Err(PublishError::Blocked)),
            Some(Err(PublishError::SinkRefused {
                code: 403,
                text: "ACCESS_REFUSED".into(),
            })),
        ];
        let p = plan(&items, &outcomes, &[], &BACKOFF, OnExpired::DeadLetter);
        assert_eq!(members(p.settlement.ack.iter().copied()), ["ok"]);
        assert_eq!(p.confirmed_due_ms, [1000]);
        let fail: Vec<(&str, &str, bool)> = p
            .settlement
            .fail
            .iter()
            .map(|f| {
                (
                    std::str::from_utf8(f.member).unwrap(),
                    f.reason.as_ref(),
                    f.permanent,
                )
            })
            .collect();
        assert_eq!(
            fail,
            [
                ("nack", "nack", false),
                ("big", "too_large", true),
                ("refused", "broker_refused", false),
            ]
        );
        assert_eq!(
            p.settlement.fail[2].detail.as_deref(),
            Some("406 PRECONDITION_FAILED"),
            "the broker's reply is the dead letter's detail"
        );
        assert_eq!(p.refused.as_ref().map(|r| r.count), Some(1));
        assert!(p.sink_refusal.as_deref().unwrap().contains("403"));
        // The third attempt waits longer than the first (the backoff doubles per attempt).
        assert!(p.settlement.fail[0].retry_in >= Duration::from_secs(2));
        assert!(p.settlement.fail[1].retry_in <= Duration::from_secs(1));
        let back = members(p.settlement.put_back.iter().map(|c| c.member.as_slice()));
        assert_eq!(
            back,
            ["down", "blocked", "every"],
            "a sink's refusal costs no attempt"
        );
        assert!(p.sink_broken);
    }

    #[test]
    fn members_acked_early_are_left_out() {
        let items = [item("a", 1), item("b", 1), item("c", 1)];
        let ok = || Some(Ok(crate::sink::Confirmed::for_tests()));
        let outcomes = [ok(), ok(), None];
        let p = plan(
            &items,
            &outcomes,
            &[true, false, false],
            &BACKOFF,
            OnExpired::DeadLetter,
        );
        assert_eq!(members(p.settlement.ack.iter().copied()), ["b"]);
        assert_eq!(p.confirmed_due_ms.len(), 1, "counted when acked early");
        assert_eq!(members(p.settlement.fail.iter().map(|f| f.member)), ["c"]);
    }

    #[test]
    fn a_message_error_does_not_break_the_sink() {
        let items = [item("a", 1), item("b", 1)];
        let outcomes = [
            Some(Err(PublishError::BrokerRefused {
                code: 406,
                text: "PRECONDITION_FAILED".into(),
            })),
            Some(Err(PublishError::BadPayload("x".into()))),
        ];
        let p = plan(&items, &outcomes, &[], &BACKOFF, OnExpired::DeadLetter);
        assert!(!p.sink_broken);
        assert!(p.settlement.ack.is_empty());
        assert_eq!(p.settlement.fail.len(), 2);
    }
}
