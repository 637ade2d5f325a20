//! Which ticks one run of the schedule script is offered: those after the mark up to the
//! first future one, the missed ones thinned as the policy allows (the script judges again on
//! the Redis clock; this only keeps its arguments small).

use crate::config::Misfire;

/// Most ticks walked in one plan: a schedule every second stopped for a day has 86,400
/// missed ticks; past this many the rest of the gap is counted as missed without walking it.
const MAX_WALK: u64 = 200_000;

/// Most ticks not yet missed offered at once (a long grace over a gap): the rest follow in
/// the next runs, the mark moving each time.
const MAX_OFFER: usize = 1000;

/// The ticks to offer the script.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Ticks after the mark, ascending, ending with the first after `now` (if any).
    pub ticks: Vec<i64>,
    /// Missed ticks left out of `ticks` (skipped, or dropped by `once` and `catch_up_limit`).
    pub left_out: u64,
}

/// What a schedule does with missed ticks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// The misfire policy.
    pub misfire: Misfire,
    /// A tick is missed once `grace_ms` past it.
    pub grace_ms: i64,
    /// With `all`: the most missed ticks fired.
    pub limit: u32,
}

/// The plan from `mark` (the last tick enqueued; `None`: a new schedule, which starts with
/// its first tick from `now` on) at `now`, with `next(t)` the first tick after `t`.
pub(crate) fn plan(
    mark: Option<i64>,
    now: i64,
    policy: Policy,
    next: impl Fn(i64) -> Option<i64>,
) -> Plan {
    if mark.is_some_and(|m| m > now) {
        // The next tick is already enqueued: nothing to do until it fires.
        return Plan::default();
    }
    let mut from = mark.unwrap_or(now - 1);
    let mut left_out = 0u64;
    let mut missed = std::collections::VecDeque::new();
    let mut on_time: Vec<i64> = Vec::new();
    let keep = match policy.misfire {
        Misfire::Skip => 0,
        Misfire::Once => 1,
        Misfire::All => policy.limit.max(1) as usize,
    };
    let mut walked = 0u64;
    while let Some(t) = next(from) {
        walked += 1;
        if t > now {
            on_time.push(t);
            break;
        }
        if t + policy.grace_ms < now {
            missed.push_back(t);
            if missed.len() > keep {
                missed.pop_front();
                left_out += 1;
            }
        } else {
            on_time.push(t);
            if on_time.len() >= MAX_OFFER {
                break;
            }
        }
        from = t;
        if walked >= MAX_WALK && t + policy.grace_ms < now {
            // Jump to the end of the gap: what lies between is missed, counted as one more.
            left_out += 1;
            from = now - policy.grace_ms - 1;
            walked = 0;
        }
    }
    let mut ticks: Vec<i64> = missed.into();
    ticks.extend(on_time);
    Plan { ticks, left_out }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `step` ms.
    fn every(step: i64) -> impl Fn(i64) -> Option<i64> {
        move |t| Some((t.div_euclid(step) + 1) * step)
    }

    fn policy(misfire: Misfire, limit: u32) -> Policy {
        Policy {
            misfire,
            grace_ms: 1000,
            limit,
        }
    }

    #[test]
    fn a_new_schedule_starts_at_its_next_tick() {
        let p = plan(None, 10_500, policy(Misfire::Skip, 100), every(1000));
        assert_eq!(p.ticks, vec![11_000]);
        let p = plan(None, 11_000, policy(Misfire::Skip, 100), every(1000));
        assert_eq!(p.ticks, vec![11_000, 12_000]);
    }

    #[test]
    fn missed_ticks_follow_the_policy() {
        // Mark 3000, now 10500: 4000..9000 missed (grace 1 s), 10000 on time, 11000 next.
        let skip = plan(Some(3000), 10_500, policy(Misfire::Skip, 100), every(1000));
        assert_eq!(skip.ticks, vec![10_000, 11_000]);
        assert_eq!(skip.left_out, 6);
        let once = plan(Some(3000), 10_500, policy(Misfire::Once, 100), every(1000));
        assert_eq!(once.ticks, vec![9000, 10_000, 11_000]);
        assert_eq!(once.left_out, 5);
        let all = plan(Some(3000), 10_500, policy(Misfire::All, 100), every(1000));
        assert_eq!(all.ticks, (4..=11).map(|s| s * 1000).collect::<Vec<_>>());
        assert_eq!(all.left_out, 0);
        let capped = plan(Some(3000), 10_500, policy(Misfire::All, 2), every(1000));
        assert_eq!(capped.ticks, vec![8000, 9000, 10_000, 11_000]);
        assert_eq!(capped.left_out, 4);
        // A mark still to come: nothing to offer.
        assert_eq!(
            plan(Some(12_000), 10_500, policy(Misfire::All, 2), every(1000)),
            Plan::default()
        );
    }

    #[test]
    fn a_long_gap_is_not_walked_tick_by_tick() {
        let now = 10 * MAX_WALK as i64;
        let skip = Policy {
            grace_ms: 0,
            ..policy(Misfire::Skip, 100)
        };
        let p = plan(Some(0), now, skip, every(1));
        assert_eq!(p.ticks.last(), Some(&(now + 1)));
        assert!(p.left_out > MAX_WALK);
    }
}
