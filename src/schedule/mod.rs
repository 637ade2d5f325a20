//! Recurring schedules: the plan of one run of the schedule script, the tick members and the
//! task that fires a trigger's schedules (expressions and time zones are `cron`'s).

pub mod defs;
mod plan;
mod run;
pub mod stored;
pub mod tick;

pub use plan::{plan, Plan, Policy};
pub(crate) use run::run;
