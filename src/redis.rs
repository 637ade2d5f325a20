//! The Redis side: the connection, the Lua scripts by name, the calls on one queue, a trigger's queue over its shards, the settings checked on every node, the engine's abilities, and keyspace notifications.
//!
//! Nothing here knows the sinks or the worker: notifications reach their listeners through
//! [`notify::Listener`]. Key names (`crate::keys`) stand beside this folder, not in it: the
//! configuration's checks derive them too, and the configuration is below the Redis side.

pub mod checks;
pub mod conn;
pub mod engine;
pub(crate) mod notify;
pub(crate) mod queue;
mod scripts;
pub mod store;
