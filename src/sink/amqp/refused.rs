//! Whose fault a refusal is: a message the broker refused alone twice, with a message to the
//! same exchange confirmed between the two refusals, is refused for what it is.
//!
//! One refusal says nothing on its own: permissions can be revoked, or given back, between
//! any two messages, so a confirmation before a refusal or after it can each be of another
//! state of the broker. A confirmation between two refusals of the same message cannot: the
//! broker took messages to that exchange while it refused this one on both sides (only two
//! changes of permissions in that time could make it the sink's).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// Messages confirmed on one exchange by the sink's publishers: the clock refusals are
/// read against.
#[derive(Clone, Default)]
pub(crate) struct Taken(Arc<AtomicU64>);

impl Taken {
    /// Counts `n` more messages the broker confirmed.
    pub(super) fn add(&self, n: u64) {
        if n > 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(super) fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a refusal alone proves so far.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Refused on both sides of a confirmation: the message's fault.
    Culprit,
    /// Not yet proven: to be tried alone again once another message went through.
    Unproven,
}

/// The first refusal of a message alone, and whether it has been proven the culprit since.
struct Seen {
    /// [`Taken::now`] when it was first refused.
    taken: u64,
    culprit: bool,
}

/// The sink's memory of refusals, by message id, for an hour (a culprit retried alone later,
/// with nothing else due, is still the culprit) and of the confirmations per exchange.
/// Bounded: the oldest are forgotten first.
#[derive(Default)]
pub(crate) struct Refused {
    clocks: Mutex<HashMap<String, Taken>>,
    seen: Mutex<Memory>,
}

#[derive(Default)]
struct Memory {
    by_id: HashMap<String, Seen>,
    /// Each id of `by_id` once, oldest first, with when it was first refused.
    order: VecDeque<(String, Instant)>,
}

impl Refused {
    const KEEP: Duration = Duration::from_secs(3600);
    const MOST: usize = 10_000;

    /// The confirmation clock of `exchange`, shared by every publisher to it.
    pub(super) fn clock(&self, exchange: &str) -> Taken {
        let mut clocks = self.clocks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(clock) = clocks.get(exchange) {
            return clock.clone();
        }
        clocks.entry(exchange.to_string()).or_default().clone()
    }

    /// Judges a refusal of message `id` alone, `taken` being its exchange's clock read when
    /// the refusal came.
    pub(super) fn judge(&self, id: &str, taken: u64) -> Verdict {
        let mut memory = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        memory.expire();
        if let Some(seen) = memory.by_id.get_mut(id) {
            seen.culprit |= seen.taken < taken;
            return if seen.culprit {
                Verdict::Culprit
            } else {
                Verdict::Unproven
            };
        }
        if memory.order.len() >= Self::MOST {
            if let Some((oldest, _)) = memory.order.pop_front() {
                memory.by_id.remove(&oldest);
            }
        }
        memory.order.push_back((id.to_string(), Instant::now()));
        let seen = Seen {
            taken,
            culprit: false,
        };
        memory.by_id.insert(id.to_string(), seen);
        Verdict::Unproven
    }
}

impl Memory {
    fn expire(&mut self) {
        while self
            .order
            .front()
            .is_some_and(|(_, at)| at.elapsed() > Refused::KEEP)
        {
            if let Some((id, _)) = self.order.pop_front() {
                self.by_id.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order of events in one isolation pass or across passes: `R(id)` a refusal alone,
    /// `C` another message confirmed.
    enum Event {
        R(&'static str),
        C,
    }
    use Event::{C, R};

    fn run(events: &[Event]) -> Vec<(&'static str, Verdict)> {
        let refused = Refused::default();
        let clock = refused.clock("ex");
        let mut verdicts = Vec::new();
        for e in events {
            match e {
                R(id) => verdicts.push((*id, refused.judge(id, clock.now()))),
                C => clock.add(1),
            }
        }
        verdicts
    }

    #[test]
    fn permissions_revoked_mid_pass_prove_nothing() {
        // Confirmed before the revocation, refused after it, tried again: still refused.
        let v = run(&[C, C, R("a"), R("b"), R("a"), R("b")]);
        assert!(v.iter().all(|(_, v)| *v == Verdict::Unproven), "{v:?}");
    }

    #[test]
    fn permissions_given_back_mid_pass_prove_nothing() {
        // Refused before, others confirmed after: `a` is confirmed when tried again, so it
        // is never judged again; what was judged is unproven.
        let v = run(&[R("a"), R("b"), C, C]);
        assert!(v.iter().all(|(_, v)| *v == Verdict::Unproven), "{v:?}");
    }

    #[test]
    fn a_message_refused_on_both_sides_of_a_confirmation_is_the_culprit() {
        let v = run(&[R("bad"), C, R("bad")]);
        assert_eq!(v[1], ("bad", Verdict::Culprit));
        // Remembered: alone later, with nothing else to tell, it is still the culprit.
        let refused = Refused::default();
        let clock = refused.clock("ex");
        refused.judge("bad", clock.now());
        clock.add(1);
        assert_eq!(refused.judge("bad", clock.now()), Verdict::Culprit);
        assert_eq!(refused.judge("bad", clock.now()), Verdict::Culprit);
    }

    #[test]
    fn the_last_of_a_pass_is_proven_by_a_later_confirmation() {
        // Last in its pass (nothing after it), then a later pass or another worker's batch.
        let v = run(&[C, C, R("bad"), C, R("bad")]);
        assert_eq!(
            v,
            vec![("bad", Verdict::Unproven), ("bad", Verdict::Culprit)]
        );
    }

    #[test]
    fn clocks_are_per_exchange() {
        let refused = Refused::default();
        let a = refused.clock("a");
        refused.judge("m", a.now());
        refused.clock("b").add(5);
        assert_eq!(refused.judge("m", a.now()), Verdict::Unproven);
        refused.clock("a").add(1);
        assert_eq!(refused.judge("m", a.now()), Verdict::Culprit);
    }

    #[test]
    fn memory_is_bounded() {
        let refused = Refused::default();
        for i in 0..Refused::MOST + 10 {
            refused.judge(&i.to_string(), 0);
        }
        let memory = refused.seen.lock().unwrap();
        assert_eq!(memory.by_id.len(), Refused::MOST);
        assert!(!memory.by_id.contains_key("0"));
    }
}
