//! Recurring schedules: the plan of one run of the schedule script, the tick members and the
//! task that fires a trigger's schedules (expressions and time zones are `cron`'s).

pub(crate) mod defs;
mod plan;
mod run;
pub(crate) mod stored;
pub mod tick;
pub(crate) mod wake;

pub(crate) use run::run;
