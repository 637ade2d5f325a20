//! `[[triggers.schedules]]`: a recurring schedule whose ticks become messages of its trigger,
//! and its checks (every problem with its key).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What becomes of a tick no bridge could fire within `misfire_grace` of its time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Misfire {
    /// None of the missed ticks fires; the schedule goes on with its next tick.
    #[default]
    Skip,
    /// One message, for the latest missed tick, fires now for all of them.
    Once,
    /// Each missed tick fires, oldest first, at most `catch_up_limit` of them.
    All,
}

impl Misfire {
    /// The policy's name in config and scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::Skip => "skip",
            Misfire::Once => "once",
            Misfire::All => "all",
        }
    }
}

/// `[[triggers.schedules]]`: a cron expression whose every tick is one message in the trigger's
/// queue, due at the tick, enqueued once whatever the number of bridges.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Unique within the trigger (`[A-Za-z0-9_.-]`); the header `x-delay-schedule` of every
    /// message it fires.
    pub name: String,
    /// 6 fields with seconds (`sec min hour day-of-month month day-of-week`), or 5 from
    /// minutes (second 0); ranges, steps, lists, names, `L`, `W`, `#`, and `@yearly`,
    /// `@monthly`, `@weekly`, `@daily`, `@hourly`.
    pub cron: String,
    /// IANA time zone the expression's fields are read in (`Europe/Berlin`); default `UTC`.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    /// The message each tick sends: the member in inline payload mode, the body in hash
    /// payload mode; with `format = "envelope"`, an envelope as producers write it.
    pub body: String,
    /// What a missed tick becomes: `skip`, `once` or `all`.
    #[serde(default)]
    pub misfire: Misfire,
    /// A tick is missed when no bridge could fire it within this of its time.
    #[serde(default = "default_misfire_grace", with = "humantime_serde")]
    pub misfire_grace: Duration,
    /// With `misfire = "all"`: the most missed ticks fired after a gap; older ones are
    /// dropped and counted as missed.
    #[serde(default = "default_catch_up_limit")]
    pub catch_up_limit: u32,
}

fn default_timezone() -> String {
    "UTC".into()
}
fn default_misfire_grace() -> Duration {
    Duration::from_secs(60)
}
fn default_catch_up_limit() -> u32 {
    100
}

/// Largest `catch_up_limit`: what one schedule script may enqueue at once.
pub(crate) const MAX_CATCH_UP: u32 = 1000;
/// Longest `misfire_grace`.
const MAX_GRACE: Duration = Duration::from_secs(7 * 86_400);
/// Most schedules per trigger.
pub(crate) const MAX_SCHEDULES: usize = 1000;

/// Problems of one trigger's schedules, keyed `triggers[i].schedules[j].field`.
pub(super) fn schedule_problems(
    trigger: usize,
    schedules: &[ScheduleConfig],
    push: &mut impl FnMut(String, String),
) {
    if schedules.len() > MAX_SCHEDULES {
        push(
            format!("triggers[{trigger}].schedules"),
            format!("at most {MAX_SCHEDULES} schedules per trigger"),
        );
    }
    let mut names = std::collections::HashSet::new();
    for (j, s) in schedules.iter().enumerate() {
        let k = |field: &str| format!("triggers[{trigger}].schedules[{j}].{field}");
        let problems = problems(s);
        let bad_name = problems.iter().any(|(field, _)| *field == "name");
        for (field, why) in problems {
            push(k(field), why);
        }
        if !bad_name && !names.insert(s.name.as_str()) {
            push(k("name"), format!("duplicate schedule name `{}`", s.name));
        }
    }
}

/// The problems of one schedule, each with its field: the checks of the config, also made
/// of a schedule added at run time.
pub(crate) fn problems(s: &ScheduleConfig) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if !super::rules::valid_name(&s.name) {
        out.push((
            "name",
            "must be non-empty and contain only A-Z, a-z, 0-9, `_`, `-` and `.`".into(),
        ));
    }
    if let Err(why) = crate::cron::Cron::parse(&s.cron, "UTC") {
        out.push(("cron", why));
    }
    if let Err(why) = crate::cron::zone(&s.timezone) {
        out.push(("timezone", why));
    }
    if s.misfire_grace.is_zero() {
        out.push(("misfire_grace", "must be more than 0".into()));
    } else if let Some(why) = super::rules::too_long(s.misfire_grace, MAX_GRACE) {
        out.push(("misfire_grace", why));
    }
    if s.catch_up_limit == 0 || s.catch_up_limit > MAX_CATCH_UP {
        out.push((
            "catch_up_limit",
            format!("must be 1 to {MAX_CATCH_UP}, got {}", s.catch_up_limit),
        ));
    }
    out
}
