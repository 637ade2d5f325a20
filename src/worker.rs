//! A trigger's workers: the claim loop over a worker's shards, each batch prepared, delivered
//! in its own task and settled by a plan made from the sink's outcomes.

use std::time::Duration;

use crate::backoff::Backoff;

mod batch;
mod claim;
mod deliver;
mod json_pointer;
mod prepare;
mod publishing;
mod settlement;
// The `Worker` type in a file of its name, as the other folders' main types are.
#[allow(clippy::module_inception)]
mod worker;

pub(crate) use publishing::Publishing;
pub(crate) use worker::{assign, run, First};

/// Batches one worker keeps publishing or confirming at once: it claims the next batch
/// while the broker confirms the previous ones.
pub const MAX_IN_FLIGHT: usize = 4;

/// Shortest wait for the rate limit's next token: below it, a low rate would cost one claim
/// per message.
const RATE_TICK: Duration = Duration::from_millis(10);

pub(crate) const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};
