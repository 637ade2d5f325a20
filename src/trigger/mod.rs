//! The running trigger: its shards' shared state, the wake-ups of their idle workers, its held state.

mod hold;
mod shard;
mod timer;
mod wake;

pub(crate) use hold::Route;
pub(crate) use shard::{Refused, Shard, StartWorkers};
pub(crate) use timer::head_or_guard;
pub(crate) use wake::Woken;
