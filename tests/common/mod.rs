//! Shared helpers for the integration tests: real Redis, RabbitMQ and Kafka on loopback.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
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

/// A random name with a prefix, so parallel tests never share keys, queues or topics.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::thread_rng().gen::<u64>())
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` until it returns true or `timeout` passes; returns whether it became true.
pub async fn wait_until<F: FnMut() -> bool>(timeout: Duration, mut f: F) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An async Redis connection.
pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must run on loopback (see README)")
}

/// Redis server time in epoch ms.
pub async fn redis_now(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// Local wall clock in epoch ms.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Deletes a queue's keys (source and derived).
pub async fn cleanup_keys(conn: &mut redis::aio::MultiplexedConnection, key: &str) {
    let keys = delay_bridge::keys::QueueKeys::derive(key).unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&keys.source)
        .arg(&keys.inflight)
        .arg(&keys.attempts)
        .arg(&keys.dead)
        .arg(&keys.dead_reasons)
        .query_async(conn)
        .await
        .unwrap();
}

/// One message received by a test consumer.
#[derive(Debug, Clone)]
pub struct Received {
    /// Body bytes.
    pub body: Vec<u8>,
    /// Local receive time, epoch ms.
    pub at_ms: i64,
    /// `x-delay-due-ms` header.
    pub due_ms: Option<i64>,
    /// `x-delay-attempt` header.
    pub attempt: Option<i64>,
    /// `x-delay-trigger` header.
    pub trigger: Option<String>,
    /// Routing key it was published with.
    pub routing_key: String,
    /// AMQP delivery mode (2 = persistent).
    pub delivery_mode: Option<u8>,
    /// AMQP message id.
    pub message_id: Option<String>,
}

/// A queue bound to a fresh exchange, consumed in the background into `received`.
pub struct AmqpCapture {
    pub exchange: String,
    pub queue: String,
    pub routing_key: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    _conn: Connection,
}

impl AmqpCapture {
    /// Declares a direct exchange and an exclusive queue bound with `routing_key`, then consumes.
    pub async fn start(routing_key: &str) -> Self {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on loopback (see README)");
        let ch = conn.create_channel().await.unwrap();
        let exchange = unique("ex");
        let queue = unique("q");
        ch.exchange_declare(
            &exchange,
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_declare(
            &queue,
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            &queue,
            &exchange,
            routing_key,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let mut consumer = ch
            .basic_consume(
                &queue,
                "test",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                let headers = d.properties.headers().clone().unwrap_or_default();
                let h = headers.inner();
                let int = |k: &str| match h.get(k) {
                    Some(AMQPValue::LongLongInt(n)) => Some(*n),
                    Some(AMQPValue::LongInt(n)) => Some(i64::from(*n)),
                    _ => None,
                };
                let r = Received {
                    body: d.data.clone(),
                    at_ms: now_ms(),
                    due_ms: int("x-delay-due-ms"),
                    attempt: int("x-delay-attempt"),
                    trigger: match h.get("x-delay-trigger") {
                        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                        _ => None,
                    },
                    routing_key: d.routing_key.to_string(),
                    delivery_mode: *d.properties.delivery_mode(),
                    message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
                };
                sink.lock().unwrap().push(r);
                let _ = d.ack(BasicAckOptions::default()).await;
            }
        });
        Self {
            exchange,
            queue,
            routing_key: routing_key.to_string(),
            received,
            _conn: conn,
        }
    }

    /// Number of messages received so far.
    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// A copy of everything received so far.
    pub fn snapshot(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A running `delay-bridge run` process with its own config file and metrics port.
pub struct Bridge {
    pub child: Child,
    pub config: PathBuf,
    pub metrics_port: u16,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The `[redis]`, `[metrics]` and `[sinks.rabbit]` sections for a test bridge.
pub fn base_config(metrics_port: u16) -> String {
    format!(
        r#"
[redis]
url = "{redis}"
enable_keyspace_events = true

[metrics]
listen = "127.0.0.1:{metrics_port}"
backlog_interval = "200ms"

[log]
level = "info,delay_bridge=debug"

[shutdown]
timeout = "10s"

[sinks.rabbit]
type = "amqp"
url = "{amqp}"
reconnect_max = "1s"
"#,
        redis = redis_url(),
        amqp = amqp_url(),
    )
}

/// A `[[triggers]]` entry publishing to `capture`'s exchange, plus extra lines.
pub fn amqp_trigger(name: &str, key: &str, capture: &AmqpCapture, extra: &str) -> String {
    format!(
        r#"
[[triggers]]
name = "{name}"
key = "{key}"
sink = "rabbit"
exchange = "{exchange}"
routing_key = "{rk}"
{extra}
"#,
        exchange = capture.exchange,
        rk = capture.routing_key,
    )
}

/// Path of the binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_delay-bridge")
}

impl Bridge {
    /// Writes `config` to a temp file and starts `delay-bridge run` on it.
    pub fn start(config: &str, metrics_port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bridge.toml");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(config.as_bytes())
            .unwrap();
        Self::start_file(path, metrics_port, dir)
    }

    fn start_file(config: PathBuf, metrics_port: u16, dir: tempfile::TempDir) -> Self {
        let log = dir.path().join(format!("bridge-{}.log", unique("run")));
        let child = Command::new(binary())
            .args(["run", "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start delay-bridge");
        Self {
            child,
            config,
            metrics_port,
            log,
            _dir: dir,
        }
    }

    /// Starts a second process on the same config file (the old one must be gone or use another port).
    pub fn restart(mut self) -> Self {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self._dir, tempfile::tempdir().unwrap());
        let next = Self::start_file(self.config.clone(), self.metrics_port, dir);
        drop(self);
        next
    }

    /// Sends a signal to the process.
    pub fn signal(&self, sig: i32) {
        unsafe_kill(self.child.id() as i32, sig);
    }

    /// Waits for the process to exit, up to `timeout`; returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status.code().unwrap_or(-1));
            }
            if Instant::now() >= end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs a path on the metrics port: (status, body).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.metrics_port, path).await
    }

    /// Waits until `/metrics` answers; returns false if the process exited or it took too long.
    pub async fn wait_ready(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            if let Some((200, _)) = self.get("/readyz").await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The value of one sample in `/metrics` (e.g. `delay_bridge_messages_forwarded_total{...}`), 0 if absent.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let Some((_, body)) = self.get("/metrics").await else {
            return f64::NAN;
        };
        metric_value(&body, name, labels)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` to `pid` with the system `kill`, avoiding a libc dependency in tests.
pub fn unsafe_kill(pid: i32, sig: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Minimal HTTP/1.1 GET on loopback: (status, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .ok()?
    .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Sums the samples of `name` whose labels include every pair in `labels`.
pub fn metric_value(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut total = 0.0;
    for line in body.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let (metric, label_text) = match series.split_once('{') {
            Some((m, l)) => (m, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
        {
            total += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    total
}

/// One sample of a Prometheus text scrape: series name, labels in order, value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parses every sample line of a text scrape (label values may hold escaped quotes).
pub fn parse_samples(body: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in body.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or(f64::NAN),
        };
        let (name, rest) = match series.split_once('{') {
            Some((n, r)) => (n, r.strip_suffix('}').unwrap_or(r)),
            None => (series, ""),
        };
        let mut labels = Vec::new();
        let mut chars = rest.chars().peekable();
        while chars.peek().is_some() {
            let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
            if chars.next() != Some('"') {
                break;
            }
            let mut val = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => val.extend(chars.next()),
                    '"' => break,
                    c => val.push(c),
                }
            }
            labels.push((key.trim_start_matches(',').to_string(), val));
            if chars.peek() == Some(&',') {
                chars.next();
            }
        }
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

/// The cumulative buckets `(le, count)` of a histogram, sorted by `le`, for series matching `labels`.
pub fn histogram_buckets(body: &str, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let bucket = format!("{name}_bucket");
    let mut out: Vec<(f64, f64)> = Vec::new();
    for s in parse_samples(body) {
        if s.name != bucket
            || !labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        {
            continue;
        }
        let Some((_, le)) = s.labels.iter().find(|(k, _)| k == "le") else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        match out.iter_mut().find(|(l, _)| *l == le) {
            Some((_, c)) => *c += s.value,
            None => out.push((le, s.value)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Scrapes `/metrics` until `f` holds or `timeout` passes; returns whether it held and the last body.
pub async fn wait_scrape<F: FnMut(&str) -> bool>(
    port: u16,
    timeout: Duration,
    mut f: F,
) -> (bool, String) {
    let end = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        if let Some((200, body)) = http_get(port, "/metrics").await {
            if f(&body) {
                return (true, body);
            }
            last = body;
        }
        if Instant::now() >= end {
            return (false, last);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GETs `path` until `f(status, body)` holds or `timeout` passes; returns the last answer.
pub async fn wait_http<F: FnMut(u16, &str) -> bool>(
    port: u16,
    path: &str,
    timeout: Duration,
    mut f: F,
) -> (bool, Option<(u16, String)>) {
    let end = Instant::now() + timeout;
    loop {
        let got = http_get(port, path).await;
        if let Some((status, body)) = &got {
            if f(*status, body) {
                return (true, got);
            }
        }
        if Instant::now() >= end {
            return (false, got);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `host:port` of the test RabbitMQ.
pub fn amqp_addr() -> String {
    let url = url::Url::parse(&amqp_url()).unwrap();
    format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(5672)
    )
}

/// A TCP proxy from a loopback port to `target`: lets a test make a broker appear on a
/// port the bridge already knows; dropping it closes the listener and every connection.
pub struct TcpForwarder {
    task: tokio::task::JoinHandle<()>,
}

impl TcpForwarder {
    /// Listens on `127.0.0.1:port` and forwards each connection to `target`.
    pub async fn start(port: u16, target: String) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("forwarder port is free");
        let task = tokio::spawn(async move {
            // Owned here so aborting the accept loop also ends every proxied connection.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let target = target.clone();
                conns.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Self { task }
    }
}

impl Drop for TcpForwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AmqpCapture {
    /// Binds the capture's (exclusive) queue to another exchange, on the queue's own connection.
    pub async fn bind(&self, exchange: &str, routing_key: &str) {
        let ch = self._conn.create_channel().await.unwrap();
        ch.queue_bind(
            &self.queue,
            exchange,
            routing_key,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let _ = ch.close(200, "bound").await;
    }
}

impl Bridge {
    /// Like [`Bridge::start`], with extra environment variables (e.g. `DELAY_BRIDGE_...` overrides).
    pub fn start_with_env(config: &str, metrics_port: u16, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bridge.toml");
        std::fs::write(&path, config).unwrap();
        let log = dir.path().join(format!("bridge-{}.log", unique("run")));
        let child = Command::new(binary())
            .args(["run", "--config"])
            .arg(&path)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start delay-bridge");
        Self {
            child,
            config: path,
            metrics_port,
            log,
            _dir: dir,
        }
    }
}

/// A throwaway `redis-server` on a free loopback port (no persistence), so its config can be
/// anything the shared Redis must not be changed to; killed on drop.
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `redis-server` with `extra` arguments (e.g. `--requirepass`) and waits for PING.
    pub async fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let url = format!("redis://127.0.0.1:{port}/0");
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let client = redis::Client::open(url.as_str()).unwrap();
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut c).await;
                // With --requirepass it answers NOAUTH: up all the same.
                if pong.is_ok() || matches!(&pong, Err(e) if e.code() == Some("NOAUTH")) {
                    break;
                }
            }
            assert!(Instant::now() < end, "private redis-server did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            port,
            child,
            _dir: dir,
        }
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A connection (without credentials).
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
