//! From a claimed batch and what the broker said of each message to what the settle script does.

use crate::backoff::Backoff;
use crate::config::OnExpired;
use crate::redis::store::{Claimed, Failure, Settlement};
use crate::sink::blame::{self, Chosen, Verdict};
use crate::sink::{Outcome, PublishError};

/// The settlement of one batch and what it tells the worker.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    /// What the settle script does with each member.
    pub settlement: Settlement<'a>,
    /// Due times of the confirmed members, for the lateness histogram.
    pub confirmed_due_ms: Vec<i64>,
    /// The sink failed, not a message: the worker gets a new publisher and backs off.
    pub sink_broken: bool,
    /// The trigger's own destination failed in this batch: what it said (the hold's reason).
    pub hold: Option<String>,
    /// Members blamed for their own failure (an attempt counted), for the log.
    pub refused: Option<Refusals>,
}

/// The members of a batch blamed for their own failure.
#[derive(Debug)]
pub(super) struct Refusals {
    pub count: usize,
    /// The position of the first in the batch.
    pub first: usize,
    /// What the broker or endpoint said of the first.
    pub reply: String,
}

/// How a batch's failures are settled: the trigger's settings.
pub(super) struct Policy<'p> {
    pub backoff: &'p Backoff,
    pub on_expired: OnExpired,
}

/// Builds the settlement of `items` from `outcomes` (one per item, by position) by the one
/// rule of [`blame`], given what each message chose of its destination (`chosen`, by
/// position; a message missing there chose nothing). A member with no outcome, or with a
/// slot left `None`, was not confirmed: it counts as a timeout, never an ack. Only a
/// [`crate::sink::Confirmed`] outcome acks. An expired member is dead-lettered, or with
/// `on_expired = "drop"` removed unpublished. Members marked in `early` were acked while the
/// rest of the batch was in flight: left out.
pub(super) fn plan<'a>(
    items: &'a [Claimed],
    outcomes: Vec<Option<Outcome>>,
    chosen: &[Chosen],
    early: &[bool],
    policy: &Policy<'_>,
) -> Plan<'a> {
    const UNCONFIRMED: Outcome = Err(PublishError::Timeout);
    let outcome_of = |i: usize| {
        outcomes
            .get(i)
            .and_then(Option::as_ref)
            .unwrap_or(&UNCONFIRMED)
    };
    let chosen_of = |i: usize| chosen.get(i).copied().unwrap_or_default();
    let pending = |i: &usize| !early.get(*i).copied().unwrap_or(false);
    // The trigger's own destination is held by a failure of it in this batch: evidence of
    // this batch only, so that messages whose own destinations refuse them cannot wedge the
    // head by being put back forever on an older hold.
    let own_failure = (0..items.len())
        .filter(pending)
        .find_map(|i| match outcome_of(i) {
            Err(e) if blame::holds_own(e, chosen_of(i)) => Some(e.to_string()),
            _ => None,
        });
    let held = own_failure.is_some();
    let mut plan = Plan {
        settlement: Settlement::for_batch(items.len()),
        confirmed_due_ms: Vec::with_capacity(items.len()),
        sink_broken: false,
        hold: own_failure,
        refused: None,
    };
    let mut outcomes = outcomes.into_iter();
    for (i, c) in items.iter().enumerate() {
        let outcome = outcomes.next().flatten().unwrap_or(UNCONFIRMED);
        if !pending(&i) {
            continue;
        }
        let e = match outcome {
            Ok(proof) => {
                plan.settlement.ack(&c.member, proof);
                plan.confirmed_due_ms.push(c.due_ms);
                continue;
            }
            Err(e) => e,
        };
        let e = &e;
        plan.sink_broken |= e.breaks_sink();
        if matches!(e, PublishError::Expired) && policy.on_expired == OnExpired::Drop {
            plan.settlement.drop_expired(&c.member);
            continue;
        }
        let mut detail = e.detail();
        let (reason, permanent) = match blame::judge(e, chosen_of(i), held) {
            Verdict::PutBack { .. } => {
                plan.settlement.put_back(c);
                continue;
            }
            Verdict::Attempt { reason } => {
                note_refusal(&mut plan.refused, i, e);
                if reason == blame::DESTINATION_REFUSED {
                    // Its own destination's words: the reason alone says too little.
                    detail = Some(detail.unwrap_or_else(|| e.to_string()));
                }
                (reason, false)
            }
            Verdict::DeadLetter { reason } => (reason, true),
        };
        plan.settlement.fail(Failure {
            member: &c.member,
            retry_in: retry_in(policy.backoff, c.attempt, e),
            reason,
            permanent,
            detail,
        });
    }
    plan
}

/// Counts a message blamed for its own failure.
fn note_refusal(refused: &mut Option<Refusals>, i: usize, e: &PublishError) {
    match refused {
        Some(r) => r.count += 1,
        None => {
            *refused = Some(Refusals {
                count: 1,
                first: i,
                reply: e.to_string(),
            })
        }
    }
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

    fn run<'a>(
        items: &'a [Claimed],
        outcomes: impl Into<Vec<Option<Outcome>>>,
        early: &[bool],
        on_expired: OnExpired,
    ) -> Plan<'a> {
        let policy = Policy {
            backoff: &BACKOFF,
            on_expired,
        };
        plan(items, outcomes.into(), &[], early, &policy)
    }

    fn members<'a>(v: impl IntoIterator<Item = &'a [u8]>) -> Vec<&'a str> {
        v.into_iter()
            .map(|m| std::str::from_utf8(m).unwrap())
            .collect()
    }

    #[test]
    fn expired_members_are_dead_lettered_or_dropped_as_configured() {
        let items = [item("old", 1), item("ok", 1)];
        let outcomes = || {
            [
                Some(Err(PublishError::Expired)),
                Some(Ok(crate::sink::Confirmed::for_tests())),
            ]
        };
        let dead = run(&items, outcomes(), &[], OnExpired::DeadLetter);
        assert_eq!(dead.settlement.failures().len(), 1);
        assert_eq!(dead.settlement.failures()[0].reason, "expired");
        assert!(dead.settlement.failures()[0].permanent);
        assert!(dead.settlement.drops().is_empty());
        let dropped = run(&items, outcomes(), &[], OnExpired::Drop);
        assert_eq!(members(dropped.settlement.drops().iter().copied()), ["old"]);
        assert_eq!(members(dropped.settlement.acks().iter().copied()), ["ok"]);
        assert!(dropped.settlement.failures().is_empty());
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
        let p = run(&items, outcomes, &[], OnExpired::DeadLetter);
        assert_eq!(members(p.settlement.acks().iter().copied()), ["a"]);
        let back = members(p.settlement.put_backs().iter().map(|c| c.member.as_slice()));
        assert_eq!(back, ["b", "c"], "unanswered: the broker's, no attempt");
        assert!(p.settlement.failures().is_empty());
        assert!(p.sink_broken);
        assert!(p.hold.is_some());

        // A slot left empty counts the same as a missing one.
        let outcomes = [None, Some(Ok(crate::sink::Confirmed::for_tests())), None];
        let p = run(&items, outcomes, &[], OnExpired::DeadLetter);
        assert_eq!(members(p.settlement.acks().iter().copied()), ["b"]);
        assert_eq!(p.settlement.put_backs().len(), 2);
    }

    #[test]
    fn each_error_lands_where_the_rule_says() {
        let items = [
            item("ok", 1),
            item("nack", 3),
            item("big", 1),
            item("down", 2),
            item("refused", 1),
            item("blocked", 1),
            item("own-key", 3),
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
            Some(Err(PublishError::DestinationRefused {
                code: 403,
                text: "ACCESS_REFUSED - write access to topic".into(),
                part: crate::sink::blame::Part::RoutingKey,
            })),
        ];
        // The last one chose its routing key.
        let mut chosen = vec![Chosen::default(); items.len()];
        chosen[6] = chosen_key();
        let policy = Policy {
            backoff: &BACKOFF,
            on_expired: OnExpired::DeadLetter,
        };
        let p = plan(&items, outcomes.into(), &chosen, &[], &policy);
        assert_eq!(members(p.settlement.acks().iter().copied()), ["ok"]);
        assert_eq!(p.confirmed_due_ms, [1000]);
        let fail: Vec<(&str, &str, bool)> = p
            .settlement
            .failures()
            .iter()
            .map(|f| {
                (
                    std::str::from_utf8(f.member).unwrap(),
                    f.reason.as_ref(),
                    f.permanent,
                )
            })
            .collect();
        // The batch held the trigger's destination (the nack, the lost connection): the
        // message's own routing key is refused while it is held, so no attempt for it.
        assert_eq!(
            fail,
            [
                ("big", "too_large", true),
                ("refused", "broker_refused", false)
            ]
        );
        assert_eq!(
            p.settlement.failures()[1].detail.as_deref(),
            Some("406 PRECONDITION_FAILED"),
            "the broker's reply is the dead letter's detail"
        );
        assert_eq!(p.refused.as_ref().map(|r| r.count), Some(1));
        assert!(p.hold.as_deref().unwrap().contains("nacked"));
        let back = members(p.settlement.put_backs().iter().map(|c| c.member.as_slice()));
        assert_eq!(
            back,
            ["nack", "down", "blocked", "own-key"],
            "a destination's failure costs no attempt"
        );
        assert!(p.sink_broken);
    }

    fn chosen_key() -> Chosen {
        let m = crate::sink::OutMessage {
            payload: b"",
            member: b"",
            due_ms: 0,
            attempt: 1,
            id: "",
            routing_key: Some("own"),
            properties: None,
            url: None,
            topic: None,
        };
        Chosen::of(&m)
    }

    #[test]
    fn a_chosen_destination_refused_counts_an_attempt_while_the_triggers_flows() {
        let items = [item("ok", 1), item("own-key", 2)];
        let refused = || {
            Some(Err(PublishError::DestinationRefused {
                code: 403,
                text: "ACCESS_REFUSED - write access to topic".into(),
                part: crate::sink::blame::Part::RoutingKey,
            }))
        };
        let outcomes = vec![Some(Ok(crate::sink::Confirmed::for_tests())), refused()];
        let chosen = [Chosen::default(), chosen_key()];
        let policy = Policy {
            backoff: &BACKOFF,
            on_expired: OnExpired::DeadLetter,
        };
        let p = plan(&items, outcomes, &chosen, &[], &policy);
        assert!(
            p.hold.is_none(),
            "a confirmation of the trigger's: not held"
        );
        assert_eq!(p.settlement.failures().len(), 1);
        assert_eq!(p.settlement.failures()[0].reason, "destination_refused");
        assert!(!p.settlement.failures()[0].permanent);
        assert!(p.settlement.failures()[0]
            .detail
            .as_deref()
            .unwrap()
            .contains("403"));
        // Alone in its batch too: it moves away from the head with its backoff.
        let p = plan(&items[1..], vec![refused()], &chosen[1..], &[], &policy);
        assert_eq!(p.settlement.failures().len(), 1);
        assert!(p.settlement.put_backs().is_empty());
    }

    #[test]
    fn members_acked_early_are_left_out() {
        let items = [item("a", 1), item("b", 1), item("c", 1)];
        let ok = || Some(Ok(crate::sink::Confirmed::for_tests()));
        let outcomes = [ok(), ok(), None];
        let p = run(
            &items,
            &outcomes,
            &[true, false, false],
            OnExpired::DeadLetter,
        );
        assert_eq!(members(p.settlement.acks().iter().copied()), ["b"]);
        assert_eq!(p.confirmed_due_ms.len(), 1, "counted when acked early");
        let back = members(p.settlement.put_backs().iter().map(|c| c.member.as_slice()));
        assert_eq!(back, ["c"], "unanswered: back without an attempt");
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
        let p = run(&items, outcomes, &[], OnExpired::DeadLetter);
        assert!(!p.sink_broken);
        assert!(p.settlement.acks().is_empty());
        assert_eq!(p.settlement.failures().len(), 2);
    }
}
