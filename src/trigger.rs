//! The running trigger: its shards' shared state behind methods, the wake-ups of their idle
//! workers, the start-up gate, its held, paused or active state.

mod claims;
mod hold;
mod shard;
mod startup;
mod state;
mod timer;
mod wake;

pub(crate) use claims::Refused;
pub(crate) use hold::Route;
pub(crate) use shard::Shard;
pub(crate) use startup::{Pass, Startup, Turn};
pub(crate) use state::State;
pub(crate) use wake::Woken;
