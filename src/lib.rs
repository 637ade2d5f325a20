//! delay-bridge turns Redis sorted sets into delayed message queues for RabbitMQ, Kafka and HTTP endpoints.
//!
//! Producers `ZADD key <due-epoch-ms> <member>`; each configured trigger runs workers that
//! atomically claim due members (`store`, Lua scripts in `scripts/`), publish them to a sink
//! (`sink::amqp`, `sink::kafka`) and remove them from Redis only after the broker confirmed.
//!
//! Layout: `config` (schema, loading, validation, resolved routes), `keys` (derived key
//! names), `scripts` (the Lua scripts by name), `store` (the calls on a queue), `sink`
//! (brokers), `worker` (claim/publish/settle loop), `notify` (keyspace wake-ups), `ingress`
//! (delayed messages taken in from brokers), `redis_conn` and `redis_checks` (connections, settings
//! checked on every node), `bridge` (the daemon), `http`, `health`, `metrics` and
//! `repeat` (observability), `cli` (commands). See ARCHITECTURE.md.
//!
//! Delivery guarantee: at-least-once. A member leaves Redis only after its broker
//! confirmation; a crash between confirmation and ack, or an expired lease, redelivers it.
//! Duplicates are possible, loss is not.

#![warn(unreachable_pub)]

pub(crate) mod admin;
pub(crate) mod backoff;
pub mod bridge;
pub(crate) mod cli;
pub mod config;
pub(crate) mod envelope;
pub(crate) mod health;
pub(crate) mod housekeeping;
pub(crate) mod http;
pub(crate) mod ingress;
pub mod keys;
pub mod metrics;
pub(crate) mod notify;
pub(crate) mod queue;
pub mod redis_checks;
pub mod redis_conn;
pub(crate) mod repeat;
mod scripts;
pub mod secret;
pub mod sink;
pub mod store;
pub(crate) mod tls;
pub mod wire;
pub(crate) mod worker;

// What the binary, the benchmark and the integration tests reach: the command line, and the
// public modules above (configuration, keys, the store and its connection, the sinks, the
// metrics registry, the daemon's `run`). The rest is the crate's own.
/// The command line: parsed by the binary, then run.
pub use cli::{dispatch, Cli};
/// How many batches one worker keeps in flight: the benchmark sizes its windows by it.
pub use worker::MAX_IN_FLIGHT;
