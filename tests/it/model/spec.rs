//! The in-memory model: what every step should do to the queue, the specification of the scripts.

use super::*;

/// The control hash's fields, and values a stray write may leave in each: canonical ones,
/// out of range, NaN, infinities, words.
pub(super) const CONTROL: [(&str, &[&str]); 3] = [
    ("paused", &["1", "0", "", "false", "no", "yes", "TRUE", "2"]),
    (
        "tokens",
        &[
            "-inf", "inf", "nan", "-1e12", "-1", "0", "0.5", "1.5", "3", "1e12", "1e400", "many",
        ],
    ),
    (
        "at",
        &["nan", "-inf", "inf", "9e18", "0", "1e12", "-5", "soon"],
    ),
];

/// `pause_value` in the prelude: whether a `paused` value pauses, and whether the claim
/// rewrites it (it is not canonical).
pub(super) fn pause_value(v: &Option<String>) -> (bool, bool) {
    match v.as_deref() {
        None => (false, false),
        Some(v) if matches!(v.to_ascii_lowercase().as_str(), "0" | "false" | "no" | "") => {
            (false, true)
        }
        Some(v) => (true, v != "1"),
    }
}

/// A control value as the scripts read it: a finite number, or None.
pub(super) fn finite(v: &Option<String>) -> Option<f64> {
    v.as_deref()?.parse::<f64>().ok().filter(|x| x.is_finite())
}

/// Schedules: each producer `ZADD` of a member that is not scheduled starts one; a copy of
/// the member (scheduled, in flight or dead) carries the schedules it stands for.
pub(super) type Schedules = Vec<u64>;

/// Where a dead letter stands in being forwarded to the dead-letter destination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Forward {
    /// Leased by dead-letter claim `claim` until `deadline` (taken again once that is due).
    Leased {
        claim: u64,
        deadline: i64,
        short: bool,
    },
    /// The broker refused it: no lease, its dead-letter score `+inf`, never claimed again.
    Refused,
}

impl Forward {
    /// Its score in the dead_inflight set, if it is there.
    pub(super) fn lease(self) -> Option<f64> {
        match self {
            Forward::Leased { deadline, .. } => Some(deadline as f64),
            Forward::Refused => None,
        }
    }
}

/// The fields of a dead letter's reason JSON: when, why, the detail, and the attempts.
pub(super) type Reason = (f64, String, Option<String>, i64);

impl DeadEntry {
    /// Its score in the dead-letter set: when it was dead-lettered, `+inf` once refused.
    pub(super) fn score(&self) -> f64 {
        match self.forward {
            Some(Forward::Refused) => f64::INFINITY,
            _ => self.at,
        }
    }

    /// The reason JSON's fields this entry should have.
    pub(super) fn reason(&self) -> Reason {
        (
            self.at,
            self.reason.clone(),
            self.detail.clone(),
            self.attempts,
        )
    }
}

/// The fields of a reason JSON, as the dead_reasons hash holds it.
pub(super) fn parse_reason(json: &str) -> Reason {
    let v: serde_json::Value = serde_json::from_str(json).expect("reason is JSON");
    (
        v["at"].as_f64().unwrap_or(f64::NAN),
        v["reason"].as_str().unwrap_or("?").to_string(),
        v["detail"].as_str().map(str::to_string),
        v["attempts"].as_i64().unwrap_or(-1),
    )
}

/// The detail a failing settle gives with `reason` (as a sink would: the broker's or the
/// parser's words for some failures, nothing for others), so the model sees both kinds.
pub(super) fn detail_of(reason: &str) -> Option<&'static str> {
    match reason {
        "too_large" => Some("4 MiB over max_message_bytes \"quoted\"\n"),
        "returned" => Some("NO_ROUTE"),
        _ => None,
    }
}

impl Model {
    /// The member's entry went stale carrying `failures` under `stamp`.
    pub(super) fn leave(&mut self, member: &[u8], failures: i64, stamp: f64) {
        if failures > 0 {
            self.left.insert(member.to_vec(), (failures, stamp));
        }
    }

    /// The count the member's stale entry gives back to a copy scheduled at `score`.
    pub(super) fn revive(&mut self, member: &[u8], score: f64) -> i64 {
        match self.left.get(member) {
            Some(&(count, stamp)) if stamp == score => {
                self.left.remove(member);
                count
            }
            _ => 0,
        }
    }

    /// A script deleted the member's entry (an ack or a dead letter): a scheduled copy's
    /// count, if it had one, went with it.
    pub(super) fn entry_deleted(&mut self, member: &[u8]) {
        self.left.remove(member);
        if let Some(s) = self.source.get_mut(member) {
            s.failures = 0;
        }
    }

    /// What `f` makes of each dead letter, by member.
    pub(super) fn dead_with<T>(&self, f: impl Fn(&DeadEntry) -> T) -> BTreeMap<Vec<u8>, T> {
        self.dead.iter().map(|(m, e)| (m.clone(), f(e))).collect()
    }

    /// The dead letters with their `K:dead` scores, in Redis's order.
    pub(super) fn dead_by_score(&self) -> Vec<(Vec<u8>, f64)> {
        let mut dead: Vec<(Vec<u8>, f64)> = self
            .dead
            .iter()
            .map(|(m, e)| (m.clone(), e.score()))
            .collect();
        dead.sort_by(by_score);
        dead
    }

    /// Moves a copy that left its lease back to the source set, unless the producer
    /// scheduled the member again meanwhile: then that schedule stays and the two merge.
    /// Returns whether it merged.
    pub(super) fn reschedule(
        &mut self,
        member: &[u8],
        score: f64,
        failures: i64,
        schedules: Schedules,
    ) -> bool {
        // The script rewrites the member's entry (or deletes it): nothing stale is left.
        self.left.remove(member);
        match self.source.get_mut(member) {
            Some(s) => {
                s.schedules.extend(schedules);
                s.failures = 0;
                true
            }
            None => {
                self.source.insert(
                    member.to_vec(),
                    Scheduled {
                        score,
                        failures,
                        schedules,
                    },
                );
                false
            }
        }
    }
}

/// Redis orders equal scores by member bytes.
pub(super) fn by_score(a: &(Vec<u8>, f64), b: &(Vec<u8>, f64)) -> std::cmp::Ordering {
    a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0))
}

pub(super) fn parse_score(raw: &[u8]) -> f64 {
    let s = std::str::from_utf8(raw).expect("scores are ASCII");
    match s {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        s => s.parse().expect("a number"),
    }
}
