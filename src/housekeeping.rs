//! The tasks that keep a bridge's queues in order beside the claim loops: the backlog gauges
//! and lease recovery of every trigger, dead-letter forwarding, and keys no longer served.

mod forward;
mod maintenance;
mod unserved;

pub(crate) use forward::forward_dead_letters;
pub(crate) use maintenance::maintain;
pub(crate) use unserved::watch_unserved;
