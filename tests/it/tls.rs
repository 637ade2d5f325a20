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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_private_ca_delivers_everything() {
    let n = 300;
    let pki = Pki::new();
    let redis = RedisServer::start_tls(&pki, ServerCert::Loopback, false).await;
    let mut r = redis.conn().await;
    let capture = AmqpCapture::start("tls").await;
    let key = unique("tls-redis");
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let config = with_tls(on_redis(port, &redis), "redis", &[("ca_file", &pki.ca())]);
    let trigger = amqp_trigger("tls", &key, &capture, "workers = 2\nbatch = 50");
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port)
        .ready(READY)
        .await;

    expect_all(&capture, n, Duration::from_secs(30), &bridge).await;
    assert_eq!(
        wait_drained(&mut r, &key, Duration::from_secs(10)).await,
        (0, 0, 0),
        "forwarded members leave Redis"
    );
    let forwarded = bridge
        .metric(
            "delay_bridge_messages_forwarded_total",
            &[("trigger", "tls")],
        )
        .await;
    assert!(forwarded >= n as f64, "forwarded_total = {forwarded}");
    println!(
        "tls=redis messages={n} lost=0 duplicates={}",
        capture.count() - n
    );
    bridge.terminate(Duration::from_secs(15)).await;
    bridge.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_demanding_client_certificates_accepts_pkcs8_sec1_and_pkcs1_keys() {
    let n = 100;
    let pki = Pki::new();
    let redis = RedisServer::start_tls(&pki, ServerCert::Loopback, true).await;
    let mut r = redis.conn().await;
    let (rsa_cert, rsa_key) = pki.client_rsa();
    let clients: [(&str, PathBuf, PathBuf); 3] = [
        ("pkcs8", pki.client_cert(), pki.client_key()),
        ("sec1", pki.client_cert(), pki.client_key_sec1()),
        ("pkcs1", rsa_cert, rsa_key),
    ];
    for (format, cert, key_file) in &clients {
        let capture = AmqpCapture::start(format).await;
        let key = unique(&format!("tls-client-{format}"));
        schedule(&mut r, &key, n, 0).await;
        let port = free_port();
        let config = with_tls(
            on_redis(port, &redis),
            "redis",
            &[
                ("ca_file", &pki.ca()),
                ("cert_file", cert),
                ("key_file", key_file),
            ],
        );
        let trigger = amqp_trigger("tls", &key, &capture, "");
        let mut bridge = Bridge::start(&(config.to_string() + &trigger), port)
            .ready(READY)
            .await;
        expect_all(&capture, n, Duration::from_secs(30), &bridge).await;
        assert_eq!(
            wait_drained(&mut r, &key, Duration::from_secs(10)).await,
            (0, 0, 0),
            "{format}: forwarded members leave Redis"
        );
        bridge.terminate(Duration::from_secs(15)).await;
        bridge.assert_no_panic();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_signed_by_another_ca_is_refused() {
    let n = 50;
    let pki = Pki::new();
    let redis = RedisServer::start_tls(&pki, ServerCert::Loopback, false).await;
    let capture = AmqpCapture::start("tls").await;
    let key = unique("tls-other-ca");
    schedule_cli(&redis, &key, n).await;
    let trigger = amqp_trigger("tls", &key, &capture, "");

    // A CA that signed something else.
    let port = free_port();
    let config = with_tls(
        on_redis(port, &redis),
        "redis",
        &[("ca_file", &pki.other_ca())],
    );
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port);
    expect_redis_refused(&mut bridge, &redis, &key, n, &["UnknownIssuer"]).await;
    drop(bridge);

    // No ca_file: the system's trust store, which has never heard of the private CA.
    let port = free_port();
    let config = on_redis(port, &redis);
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port);
    expect_redis_refused(&mut bridge, &redis, &key, n, &["UnknownIssuer"]).await;
    drop(bridge);
    assert_eq!(capture.count(), 0, "nothing was published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_certificate_for_another_name_is_refused_unless_server_name_says_so() {
    let n = 50;
    let pki = Pki::new();
    let redis = RedisServer::start_tls(&pki, ServerCert::Named, false).await;
    let capture = AmqpCapture::start("tls").await;
    let key = unique("tls-name");
    schedule_cli(&redis, &key, n).await;
    let trigger = amqp_trigger("tls", &key, &capture, "");

    let port = free_port();
    let config = with_tls(on_redis(port, &redis), "redis", &[("ca_file", &pki.ca())]);
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port);
    expect_redis_refused(
        &mut bridge,
        &redis,
        &key,
        n,
        &["NotValidForName", "not valid for name"],
    )
    .await;
    drop(bridge);

    let port = free_port();
    let config = with_tls(on_redis(port, &redis), "redis", &[("ca_file", &pki.ca())]).set_str(
        "redis.tls",
        "server_name",
        NAMED_HOST,
    );
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port)
        .ready(READY)
        .await;
    expect_all(&capture, n, Duration::from_secs(30), &bridge).await;
    expect_drained_cli(&redis, &key, &bridge).await;
    bridge.terminate(Duration::from_secs(15)).await;
    bridge.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_demanding_a_client_certificate_refuses_a_bridge_without_one() {
    let n = 50;
    let pki = Pki::new();
    let redis = RedisServer::start_tls(&pki, ServerCert::Loopback, true).await;
    let capture = AmqpCapture::start("tls").await;
    let key = unique("tls-no-client-cert");
    schedule_cli(&redis, &key, n).await;
    let trigger = amqp_trigger("tls", &key, &capture, "");

    let port = free_port();
    let config = with_tls(on_redis(port, &redis), "redis", &[("ca_file", &pki.ca())]);
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port);
    expect_redis_refused(&mut bridge, &redis, &key, n, PEER_REFUSED).await;
    drop(bridge);
    assert!(
        redis.log().contains("peer did not return a certificate"),
        "the server refused for want of a certificate:\n{}",
        redis.log()
    );

    // The same members go once the bridge presents one.
    let port = free_port();
    let config = with_tls(
        on_redis(port, &redis),
        "redis",
        &[
            ("ca_file", &pki.ca()),
            ("cert_file", &pki.client_cert()),
            ("key_file", &pki.client_key()),
        ],
    );
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port)
        .ready(READY)
        .await;
    expect_all(&capture, n, Duration::from_secs(30), &bridge).await;
    expect_drained_cli(&redis, &key, &bridge).await;
    bridge.terminate(Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_redis_verifies_nothing_and_says_so() {
    let n = 50;
    let pki = Pki::new();
    // Neither the CA nor the name would pass verification.
    let redis = RedisServer::start_tls(&pki, ServerCert::Named, false).await;
    let capture = AmqpCapture::start("tls").await;
    let key = unique("tls-insecure");
    schedule_cli(&redis, &key, n).await;
    let port = free_port();
    let config = on_redis(port, &redis).set("redis.tls", "insecure", "true");
    let trigger = amqp_trigger("tls", &key, &capture, "");
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port)
        .ready(READY)
        .await;
    expect_all(&capture, n, Duration::from_secs(30), &bridge).await;
    expect_drained_cli(&redis, &key, &bridge).await;
    let log = bridge.log();
    assert!(
        log.lines()
            .any(|l| l.contains("insecure") && l.contains("WARN")),
        "a warning about insecure at start:\n{log}"
    );
    bridge.terminate(Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_over_tls_needs_the_client_certificate_then_delivers_everything() {
    let n = 300;
    let pki = Pki::new();
    let rabbit = RabbitServer::start_tls(&pki).await;
    // The test's own consumer uses the node's plain listener.
    let tally = Tally::start(&rabbit.url()).await;
    let mut r = redis().await;
    let key = unique("tls-amqp");
    schedule(&mut r, &key, n, 0).await;
    let to = format!(
        "exchange = \"{}\"\nrouting_key = \"{}\"\n",
        tally.exchange, tally.routing_key
    );
    let trigger = trigger("tls", &key, "rabbit", &(to + "workers = 2\nbatch = 50"));
    let sink = |port| ConfigToml::base(port).set_str("sinks.rabbit", "url", &rabbit.tls_url());

    // The CA but no client certificate: the node refuses the handshake.
    let port = free_port();
    let config = with_tls(sink(port), "sinks.rabbit", &[("ca_file", &pki.ca())]);
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port);
    let endpoint = format!("127.0.0.1:{}", rabbit.tls_port());
    let (said, log) = wait_log(&mut bridge, REFUSAL, &[&endpoint, "tls"], PEER_REFUSED).await;
    assert!(
        said,
        "a log line should name {endpoint}, TLS and one of {PEER_REFUSED:?}:\n{log}"
    );
    bridge.expect_readyz(503, Duration::from_secs(5)).await;
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(2), &bridge).await;
    assert_eq!(queued, n as i64, "every member stays in Redis");
    bridge.assert_alive();
    drop(bridge);

    let port = free_port();
    let config = with_tls(
        sink(port),
        "sinks.rabbit",
        &[
            ("ca_file", &pki.ca()),
            ("cert_file", &pki.client_cert()),
            ("key_file", &pki.client_key()),
        ],
    );
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port)
        .ready(READY)
        .await;
    tally
        .expect_distinct(n, Duration::from_secs(60), &bridge)
        .await;
    assert_eq!(
        wait_drained(&mut r, &key, Duration::from_secs(10)).await,
        (0, 0, 0),
        "confirmed members leave Redis"
    );
    report("amqps_client_certificate", n, 0, &tally, "");
    bridge.terminate(Duration::from_secs(15)).await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
}

/// A config for `check` with `redis` as the `[redis]` section (and its subtables) and `sink`
/// as sink `r`, plus a trigger on it.
fn check_config(redis: &str, sink: &str) -> String {
    format!("{redis}\n{sink}\n{MINIMAL_TRIGGER}")
}

/// `[redis]` at a `rediss://` URL, plus `tls` lines in `[redis.tls]`.
fn rediss(tls: &str) -> String {
    format!("[redis]\nurl = \"rediss://127.0.0.1:6380/0\"\n[redis.tls]\n{tls}\n")
}

/// `[sinks.r]` at an `amqps://` URL, plus `tls` lines in `[sinks.r.tls]`.
fn amqps(tls: &str) -> String {
    format!(
        "[sinks.r]\ntype = \"amqp\"\nurl = \"amqps://guest:guest@127.0.0.1:5671/%2f\"\n\
         [sinks.r.tls]\n{tls}\n"
    )
}

/// `key = "path"` as a TOML line.
fn file_line(key: &str, path: &Path) -> String {
    format!("{key} = {}\n", quoted(path.to_str().unwrap()))
}

#[test]
fn check_accepts_tls_files_and_warns_when_verification_is_off() {
    let pki = Pki::new();
    let files = file_line("ca_file", &pki.ca())
        + &file_line("cert_file", &pki.client_cert())
        + &file_line("key_file", &pki.client_key());
    let (code, text) = check(&check_config(&rediss(&files), &amqps(&files)));
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("insecure"), "{text}");

    for (what, config) in [
        (
            "redis",
            check_config(&rediss("insecure = true"), MINIMAL_SINK),
        ),
        ("sink", check_config("", &amqps("insecure = true"))),
    ] {
        let (code, text) = check(&config);
        assert_eq!(code, 0, "{what}: {text}");
        assert!(
            text.lines().any(|l| l.contains("insecure")),
            "{what}: a warning line about insecure:\n{text}"
        );
    }
}

#[test]
fn check_warns_about_a_private_key_others_can_read_and_never_prints_it() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let shared = pki.dir().join("shared.key");
    std::fs::copy(pki.client_key(), &shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    let files = file_line("ca_file", &pki.ca())
        + &file_line("cert_file", &pki.client_cert())
        + &file_line("key_file", &shared);
    let (code, text) = check(&check_config(&rediss(&files), MINIMAL_SINK));
    assert_eq!(code, 0, "{text}");
    let warning = text
        .lines()
        .find(|l| l.contains("redis.tls") && l.contains("readable by group or others"))
        .unwrap_or_else(|| panic!("a warning about the key's mode:\n{text}"));
    assert!(warning.contains("644"), "{warning}");
    let key = std::fs::read_to_string(&shared).unwrap();
    let secret_line = key.lines().nth(1).unwrap();
    assert!(
        !text.contains(secret_line),
        "the key's contents are never printed"
    );
}

#[test]
fn tls_files_are_read_once_when_the_configuration_is_loaded() {
    let pki = Pki::new();
    let key = pki.dir().join("read-once.key");
    std::fs::copy(pki.client_key(), &key).unwrap();
    let files = file_line("ca_file", &pki.ca())
        + &file_line("cert_file", &pki.client_cert())
        + &file_line("key_file", &key);
    let path = pki.dir().join("read-once.toml");
    std::fs::write(&path, check_config(&rediss(&files), MINIMAL_SINK)).unwrap();
    let config = delay_bridge::config::load(&path).unwrap();
    std::fs::remove_file(&key).unwrap();
    // The connection uses the client built at load, not the files, which are gone now.
    delay_bridge::redis_conn::Endpoint::new(&config.redis).expect("the client loaded once");
    let mut unloaded = config.redis.clone();
    unloaded.tls.as_mut().unwrap().client = None;
    let e = delay_bridge::redis_conn::Endpoint::new(&unloaded).unwrap_err();
    assert!(e.to_string().contains("redis.tls.key_file"), "{e}");
}

#[test]
fn check_names_the_tls_key_that_is_wrong() {
    let pki = Pki::new();
    let missing = pki.dir().join("missing.pem");
    let cert_only = file_line("cert_file", &pki.client_cert());
    let no_ca = file_line("ca_file", &missing);
    let mismatched = file_line("cert_file", &pki.client_cert())
        + &file_line("key_file", &pki.server(ServerCert::Loopback).1);
    for (what, config, key) in [
        (
            "redis cert without key",
            check_config(&rediss(&cert_only), MINIMAL_SINK),
            "redis.tls.key_file",
        ),
        (
            "redis ca_file missing",
            check_config(&rediss(&no_ca), MINIMAL_SINK),
            "redis.tls.ca_file",
        ),
        (
            "sink cert without key",
            check_config("", &amqps(&cert_only)),
            "sinks.r.tls.key_file",
        ),
        (
            "sink ca_file missing",
            check_config("", &amqps(&no_ca)),
            "sinks.r.tls.ca_file",
        ),
        (
            "redis key of another certificate",
            check_config(&rediss(&mismatched), MINIMAL_SINK),
            "redis.tls.key_file: ",
        ),
    ] {
        let (code, text) = check(&config);
        assert_eq!(code, 78, "{what}: {text}");
        assert!(text.contains(key), "{what}: {key} missing from:\n{text}");
    }
}

#[test]
fn check_refuses_redis_tls_settings_on_a_plain_url() {
    let pki = Pki::new();
    let redis = format!(
        "[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[redis.tls]\n{}",
        file_line("ca_file", &pki.ca())
    );
    let (code, text) = check(&check_config(&redis, MINIMAL_SINK));
    assert_eq!(code, 78, "{text}");
    assert!(
        text.contains("redis.tls") || text.contains("redis.url"),
        "{text}"
    );
    let (code, text) = check(&check_config(
        &redis.replace("redis://", "rediss://"),
        MINIMAL_SINK,
    ));
    assert_eq!(code, 0, "the same settings with rediss://: {text}");
}

#[test]
fn check_refuses_a_kafka_ssl_ca_location_that_does_not_exist() {
    let pki = Pki::new();
    let kafka = |ca: &Path| {
        format!(
            "[sinks.k]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9093\"\n\
             [sinks.k.properties]\n\"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = {}\n\
             [[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"k\"\ntopic = \"t\"\n",
            quoted(ca.to_str().unwrap())
        )
    };
    let (code, text) = check(&kafka(&pki.dir().join("missing.pem")));
    assert_eq!(code, 78, "{text}");
    assert!(
        text.contains("sinks.k.properties.ssl.ca.location"),
        "{text}"
    );
    let (code, text) = check(&kafka(&pki.ca()));
    assert_eq!(code, 0, "{text}");
}
