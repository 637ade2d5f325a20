//! TLS to Redis and RabbitMQ with a private CA: delivery, client certificates in every key
//! format, server names, refusals that leave the queue alone, and what `check` says about TLS
//! settings (Kafka's included).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::servers::{RabbitServer, RedisServer};
use common::tally::*;
use common::tls::*;
use common::*;
use delay_bridge::keys::QueueKeys;

mod check;
mod to_rabbitmq;
mod to_redis;

/// How long a bridge may take to become ready (TLS handshakes included).
const READY: Duration = Duration::from_secs(30);

/// How long a refused bridge has to say why in its log (a few connection attempts).
const REFUSAL: Duration = Duration::from_secs(20);

/// Words one of which the log line of a handshake the server refused holds. Without the client
/// certificate it demands, a TLS 1.3 server sends its alert after the client's side of the
/// handshake is done, so the client may see the alert, a failed handshake, or only the
/// connection going away under its first write or read.
const PEER_REFUSED: &[&str] = &[
    "certificaterequired",
    "handshakefailure",
    "alert",
    "certificate",
    "handshake",
    "reset",
    "closed",
    "aborted",
    "broken pipe",
    "eof",
];

/// `[SECTION.tls]` of `config` pointing `key = path` for each of `files`.
fn with_tls(config: ConfigToml, section: &str, files: &[(&str, &Path)]) -> ConfigToml {
    let table = format!("{section}.tls");
    files.iter().fold(config, |c, (key, path)| {
        c.set_str(&table, key, path.to_str().unwrap())
    })
}

/// A test bridge on `redis` (its `rediss://` URL, short timeouts so refusals repeat quickly)
/// and the shared RabbitMQ.
fn on_redis(port: u16, redis: &RedisServer) -> ConfigToml {
    ConfigToml::base(port)
        .set_str("redis", "url", &redis.url())
        .set_str("redis", "connect_timeout", "2s")
        .set_str("redis", "response_timeout", "2s")
}

/// A bridge on `config` and `trigger`, ready.
async fn start_ready(config: &ConfigToml, trigger: &str, port: u16) -> Bridge {
    Bridge::start(&(config.to_string() + trigger), port)
        .ready(READY)
        .await
}

/// `ZADD key` of messages `0..n` (see [`body`]) due long ago, through `redis-cli`, which
/// reaches a server whose certificate is for another name.
async fn schedule_cli(redis: &RedisServer, key: &str, n: usize) {
    let bodies: Vec<(String, String)> = (0..n)
        .map(|i| {
            let body = String::from_utf8(body(i, 0)).unwrap();
            ((i + 1).to_string(), body)
        })
        .collect();
    let mut args = vec!["ZADD", key];
    for (score, body) in &bodies {
        args.push(score);
        args.push(body);
    }
    let added = redis.cli(&args).await.expect("ZADD through redis-cli");
    assert_eq!(added.trim(), n.to_string(), "ZADD answered {added}");
}

/// The sizes of `key`'s source and in-flight sets, through `redis-cli`.
async fn sizes_cli(redis: &RedisServer, key: &str) -> (i64, i64) {
    let keys = QueueKeys::derive(key).unwrap();
    let mut sizes = [0; 2];
    for (size, set) in sizes.iter_mut().zip([&keys.source, &keys.inflight]) {
        let out = redis.cli(&["ZCARD", set]).await.expect("ZCARD");
        *size = out
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("ZCARD: {out}"));
    }
    (sizes[0], sizes[1])
}

/// Waits up to `timeout` until a line of the bridge's log holds every one of `all` and at
/// least one of `any` (ignoring case), or the bridge exits; returns whether a line did and
/// the log.
async fn wait_log(
    bridge: &mut Bridge,
    timeout: Duration,
    all: &[&str],
    any: &[&str],
) -> (bool, String) {
    let all: Vec<String> = all.iter().map(|w| w.to_lowercase()).collect();
    let any: Vec<String> = any.iter().map(|w| w.to_lowercase()).collect();
    let said = |log: &str| {
        log.to_lowercase().lines().any(|line| {
            all.iter().all(|w| line.contains(w.as_str()))
                && any.iter().any(|w| line.contains(w.as_str()))
        })
    };
    let (_, (_, log)) = poll(
        timeout,
        Duration::from_millis(100),
        async || (bridge.child.try_wait().unwrap().is_some(), bridge.log()),
        |(exited, log)| *exited || said(log),
    )
    .await;
    (said(&log), log)
}

/// Asserts that `bridge` does not get through to Redis at `redis`: a line of its log names the
/// endpoint, TLS and one of `reasons`; it keeps running; `/readyz` answers 503; and for two
/// seconds the `n` members scheduled on `key` all stay in the source set, none claimed.
async fn expect_redis_refused(
    bridge: &mut Bridge,
    redis: &RedisServer,
    key: &str,
    n: usize,
    reasons: &[&str],
) {
    let endpoint = format!("127.0.0.1:{}", redis.port);
    let (said, log) = wait_log(bridge, REFUSAL, &[&endpoint, "tls"], reasons).await;
    assert!(
        said,
        "a log line should name {endpoint}, TLS and one of {reasons:?}:\n{log}"
    );
    bridge.expect_readyz(503, Duration::from_secs(5)).await;
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        assert_eq!(
            sizes_cli(redis, key).await,
            (n as i64, 0),
            "(source, in-flight) while refused\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bridge.assert_alive();
}

/// Asserts that `capture` received each of messages `0..n` (see [`body`]) at least once within
/// `timeout`: nothing lost.
async fn expect_all(capture: &AmqpCapture, n: usize, timeout: Duration, bridge: &Bridge) {
    bridge.expect_arrivals(n, timeout, || capture.count()).await;
    let seen = capture.tally();
    let lost: Vec<usize> = (0..n)
        .filter(|i| !seen.contains_key(&body(*i, 0)))
        .collect();
    assert!(
        lost.is_empty(),
        "lost={} e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
}

/// Waits until `key`'s source and in-flight sets are empty, through `redis-cli`.
async fn expect_drained_cli(redis: &RedisServer, key: &str, bridge: &Bridge) {
    let (drained, sizes) = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || sizes_cli(redis, key).await,
        |sizes| *sizes == (0, 0),
    )
    .await;
    assert!(drained, "(source, in-flight) = {sizes:?}\n{}", bridge.log());
}

/// Whether a RabbitMQ node's TLS listener at `port` completes an AMQP greeting (the protocol
/// header answered by `connection.start`, which names the product) with `openssl s_client`
/// trusting `pki`'s CA and presenting `client` (certificate, key) if given.
fn amqps_greets(pki: &Pki, port: u16, client: Option<(PathBuf, PathBuf)>) -> bool {
    use std::io::{Read, Write};
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-verify_return_error", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-CAfile")
        .arg(pki.ca());
    if let Some((cert, key)) = client {
        cmd.arg("-cert").arg(cert).arg("-key").arg(key);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the openssl CLI must be installed (see README)");
    // The stdin pipe stays open (held here) so that s_client waits for the answer.
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"AMQP\x00\x00\x09\x01");
    let _ = stdin.flush();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if seen.windows(8).any(|w| w == b"RabbitMQ") {
                let _ = tx.send(());
                return;
            }
        }
    });
    let greeted = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    drop(stdin);
    greeted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_servers_speak_tls_as_configured() {
    let pki = Pki::new();
    // start_tls waits until redis-cli --tls gets PONG, whatever the certificate's name.
    let named = RedisServer::start_tls(&pki, ServerCert::Named, true).await;
    assert!(named.url().starts_with("rediss://127.0.0.1:"));
    drop(named);
    let redis = RedisServer::start_tls(&pki, ServerCert::Loopback, true).await;
    // The redis crate's rustls client: the chain, the IP address and the client certificate.
    let mut r = redis.conn().await;
    let pong: String = redis::cmd("PING").query_async(&mut r).await.unwrap();
    assert_eq!(pong, "PONG");

    let rabbit = RabbitServer::start_tls(&pki).await;
    let port = rabbit.tls_port();
    assert!(
        amqps_greets(&pki, port, Some((pki.client_cert(), pki.client_key()))),
        "the node's TLS listener takes the client certificate:\n{}",
        rabbit.log()
    );
    assert!(
        !amqps_greets(&pki, port, None),
        "the node demands a client certificate"
    );
}
