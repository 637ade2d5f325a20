//! delay-bridge turns Redis sorted sets into delayed message queues for RabbitMQ, Kafka and HTTP endpoints.
//!
//! Producers `ZADD key <due-epoch-ms> <member>`; each configured trigger runs workers that
//! atomically claim due members (`redis::store`, Lua scripts in `redis/scripts/`), publish
//! them to a sink (`sink::amqp`, `sink::kafka`, `sink::http`) and remove them from Redis only
//! after the sink confirmed.
//!
//! Layout: `config` (schema, loading, validation, resolved routes), `keys` (the key layout
//! producers share), `redis` (the connection, the scripts, the calls on a queue, checks,
//! keyspace notifications), `sink`
//! (brokers and endpoints), `worker` (claim/publish/settle loop), `housekeeping` (recovery,
//! dead-letter forwarding), `ingress` (delayed messages taken in from brokers), `schedule`
//! (recurring schedules whose ticks are enqueued once across bridges; `cron`, their
//! expressions and time zones), `bridge` (the
//! daemon), `health` (readiness and the endpoint that shows it), `metrics` and `repeat`
//! (observability), `cli` (commands), `runtime` (the async runtime's size). See
//! ARCHITECTURE.md.
//!
//! Delivery guarantee: at-least-once. A member leaves Redis only after its broker
//! confirmation; a crash between confirmation and ack, or an expired lease, redelivers it.
//! Duplicates are possible, loss is not.

#![warn(unreachable_pub)]

pub(crate) mod admin;
pub(crate) mod backoff;
pub(crate) mod bridge;
pub(crate) mod cli;
pub(crate) mod config;
pub(crate) mod cron;
pub(crate) mod envelope;
pub(crate) mod health;
#[cfg(feature = "bench-hooks")]
pub mod hooks;
pub(crate) mod housekeeping;
pub(crate) mod ingress;
pub mod keys;
pub(crate) mod metrics;
pub mod parts;
pub(crate) mod proof;
pub(crate) mod redis;
pub(crate) mod repeat;
pub(crate) mod runtime;
pub(crate) mod schedule;
pub(crate) mod secret;
pub(crate) mod shorten;
pub(crate) mod sink;
pub(crate) mod tls;
pub(crate) mod trigger;
pub mod wire;
pub(crate) mod worker;

// What the binary, the benchmark and the integration tests reach: the command line, the key
// layout producers share (`keys`) and the headers consumers see (`wire`), and the small face
// of the rest in `parts` (configuration, the store and its connection, the sinks, the metrics
// registry, the daemon's `run`), with `hooks` for the benchmark alone. The rest is the
// crate's own.
/// The command line: parsed by the binary, then run.
pub use cli::{dispatch, Cli};
/// The async runtime the binary builds before it dispatches.
pub use runtime::new_runtime;
/// The allocator of every binary built on this crate (the daemon, the benchmark, the tests):
/// jemalloc, which keeps per-thread caches where glibc's malloc took about a quarter of the
/// publish path's CPU.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How many batches one worker keeps in flight: the benchmark sizes its windows by it.
pub use worker::MAX_IN_FLIGHT;
