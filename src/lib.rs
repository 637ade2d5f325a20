//! delay-bridge turns Redis sorted sets into delayed message queues for RabbitMQ and Kafka.
//!
//! Producers `ZADD key <due-epoch-ms> <member>`; each configured trigger runs workers that
//! atomically claim due members (`store`, Lua scripts in `scripts/`), publish them to a sink
//! (`sink::amqp`, `sink::kafka`) and remove them from Redis only after the broker confirmed.
//!
//! Layout: `config` (schema, loading, validation, resolved routes), `keys` (derived key
//! names), `scripts` (the Lua scripts by name), `store` (the calls on a queue), `sink` (brokers), `worker` (claim/publish/settle loop),
//! `notify` (keyspace wake-ups), `ingress` (delayed messages taken in from brokers), `redis_conn` and `redis_checks` (connections, settings
//! checked on every node), `bridge` (the daemon), `http`, `health`, `metrics` and
//! `repeat` (observability), `cli` (commands). See ARCHITECTURE.md.
//!
//! Delivery guarantee: at-least-once. A member leaves Redis only after its broker
//! confirmation; a crash between confirmation and ack, or an expired lease, redelivers it.
//! Duplicates are possible, loss is not.

pub mod admin;
pub mod backoff;
pub mod bridge;
pub mod cli;
pub mod config;
pub mod envelope;
pub mod health;
pub mod http;
pub mod ingress;
pub mod keys;
pub mod metrics;
pub mod notify;
pub mod queue;
pub mod redis_checks;
pub mod redis_conn;
pub mod repeat;
mod scripts;
pub mod secret;
pub mod sink;
pub mod store;
pub mod tls;
pub mod wire;
pub mod worker;
