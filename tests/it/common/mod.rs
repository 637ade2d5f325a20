//! The integration tests' toolkit: real Redis, RabbitMQ, Kafka and HTTP endpoints on loopback, the bridge as a
//! process, and what it answers.
//!
//! Every test binary writes `mod common;` and `use common::*;`, which brings the everyday
//! helpers; the specialised ones are imported by module:
//!
//! | module | what it starts or reads |
//! | --- | --- |
//! | [`redis`](self::redis) | connections, any command in one call, the server clock, sorted-set writes and reads, a queue's sizes |
//! | [`amqp`] | a capturing consumer on the shared RabbitMQ |
//! | `hashes` | one field of a Redis hash read, written or deleted |
//! | `shell` | a command run from the repository, its success, or its output |
//! | `reads` | a sorted set's members (with their scores), a page's members, a metric, read back in one call |
//! | `scene` | what most end-to-end tests start from: Redis, a capture, a fresh key and a bridge |
//! | [`bridge`] | `delay-bridge run` as a process: signals, exit, log, HTTP endpoints |
//! | [`cli`] | the other subcommands (`check`, `stats`, ...) run once |
//! | [`config`] | bridge configs as TOML |
//! | [`metrics`] | the one Prometheus text parser |
//! | [`servers`] | private `redis-server` and RabbitMQ nodes, TLS ones too (`use common::servers::...`) |
//! | [`sentinel`] | a private master, replica and three Redis Sentinels (`use common::sentinel::...`) |
//! | [`redis_cluster`] | a private Redis Cluster, three masters with a replica each (`use common::redis_cluster::...`) |
//! | [`rabbit_cluster`] | a private RabbitMQ cluster of such nodes (`use common::rabbit_cluster::...`) |
//! | [`proxy`] | a fault-injecting TCP proxy (`use common::proxy::...`) |
//! | [`outage`] | the steps fault tests share: detection timed, what went back, progress, the drain (`use common::outage::*`) |
//! | [`tally`] | fault-test bookkeeping on a durable queue (`use common::tally::*`) |
//! | [`kafka`] | Kafka topics and a capturing consumer (`use common::kafka::*`) |
//! | [`ingress`] | an ingress's exchange, a confirming publisher on it, its queue's depth (`use common::ingress::*`) |
//! | [`tls`] | a private PKI made with `openssl` (`use common::tls::*`) |
//! | [`webhook`] | an HTTP endpoint that records requests and answers as scripted (`use common::webhook::*`) |
#![allow(dead_code)]

pub mod amqp;
pub mod bridge;
pub mod browser;
pub mod cli;
pub mod config;
mod hashes;
pub mod http;
pub mod ingress;
pub mod kafka;
pub mod metrics;
pub mod outage;
pub mod proxy;
pub mod rabbit_cluster;
mod reads;
mod redis;
pub mod redis_cluster;
mod scene;
pub mod sentinel;
pub mod servers;
mod shell;
pub mod tally;
pub mod tls;
pub mod webhook;

// The everyday helpers, for `use common::*` (not every test binary uses every one).
#[allow(unused_imports)]
pub use hashes::*;
#[allow(unused_imports)]
pub use reads::*;
#[allow(unused_imports)]
pub use scene::*;
#[allow(unused_imports)]
pub use shell::*;
#[allow(unused_imports)]
pub use {self::redis::*, amqp::*, bridge::*, cli::*, config::*, metrics::*};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::Rng;

/// Redis URL for tests (`DELAY_BRIDGE_TEST_REDIS`).
pub fn redis_url() -> String {
    std::env::var("DELAY_BRIDGE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// AMQP URL for tests (`DELAY_BRIDGE_TEST_AMQP`).
pub fn amqp_url() -> String {
    std::env::var("DELAY_BRIDGE_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Kafka bootstrap servers for tests (`DELAY_BRIDGE_TEST_KAFKA`).
pub fn kafka_brokers() -> String {
    std::env::var("DELAY_BRIDGE_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The socket address of a server URL's host (`localhost` as 127.0.0.1), for a proxy in front of it.
pub fn socket_addr(url: &str, default_port: u16) -> SocketAddr {
    let url = url::Url::parse(url).unwrap();
    let host = match url.host_str() {
        Some("localhost") | None => "127.0.0.1",
        Some(h) => h,
    };
    SocketAddr::new(host.parse().unwrap(), url.port().unwrap_or(default_port))
}

/// A random name with a prefix, so parallel tests never share keys, queues or topics.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::thread_rng().gen::<u64>())
}

/// A free loopback port for a server a test starts: below the kernel's ephemeral range
/// (32768..), so that no outgoing connection of a parallel test holds it by the time the
/// server binds it.
pub fn free_port() -> u16 {
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(20_000..30_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Local wall clock in epoch ms.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Runs `probe` every `every` until `done` accepts what it returned or `timeout` passes;
/// returns whether it was accepted and the last value. Every waiting helper is built on it.
pub async fn poll<T>(
    timeout: Duration,
    every: Duration,
    mut probe: impl AsyncFnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> (bool, T) {
    let end = Instant::now() + timeout;
    loop {
        let value = probe().await;
        if done(&value) {
            return (true, value);
        }
        if Instant::now() >= end {
            return (false, value);
        }
        tokio::time::sleep(every).await;
    }
}

/// Asserts that a check found nothing: else panics with `what` and what it found, one a line.
pub fn assert_none_found<T: std::fmt::Display>(what: &str, found: &[T]) {
    let lines: Vec<String> = found.iter().map(T::to_string).collect();
    assert!(found.is_empty(), "{what}:\n  {}", lines.join("\n  "));
}

/// The last `n` lines of `log`, for a failed assertion.
pub fn tail(log: &str, n: usize) -> String {
    let mut lines: Vec<&str> = log.lines().rev().take(n).collect();
    lines.reverse();
    lines.join("\n")
}

/// Polls `f` until it returns true or `timeout` passes; returns whether it became true.
pub async fn wait_until<F: FnMut() -> bool>(timeout: Duration, mut f: F) -> bool {
    poll(timeout, Duration::from_millis(20), async || f(), |ok| *ok)
        .await
        .0
}

/// Sends `sig` to `pid` with the system `kill`, avoiding a libc dependency in tests.
pub fn kill(pid: i32, sig: i32) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}
