//! Redis over TLS: delivery with a private CA, client certificates in every key format, and
//! the refusals (another CA, another name, no client certificate) that leave the queue alone.

use super::*;

/// A private PKI, a Redis over TLS serving its loopback certificate (demanding a client
/// certificate with `client_auth`), and a connection to it.
async fn loopback_redis(client_auth: bool) -> (Pki, RedisServer, Conn) {
    let pki = Pki::new();
    let redis = RedisServer::start_tls(&pki, ServerCert::Loopback, client_auth).await;
    let r = redis.conn().await;
    (pki, redis, r)
}

/// Asserts that the `n` messages reach `capture` within 30 s, then that they left `key`
/// (`what` names the case).
async fn expect_all_then_drained(
    capture: &AmqpCapture,
    n: usize,
    bridge: &Bridge,
    (r, key): (&mut Conn, &str),
    what: &str,
) {
    expect_all(capture, n, Duration::from_secs(30), bridge).await;
    assert_eq!(
        wait_drained(r, key, Duration::from_secs(10)).await,
        (0, 0, 0),
        "{what}: forwarded members leave Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_private_ca_delivers_everything() {
    let n = 300;
    let (pki, redis, mut r) = loopback_redis(false).await;
    let capture = AmqpCapture::start("tls").await;
    let key = unique("tls-redis");
    schedule(&mut r, &key, n, 0).await;
    let port = free_port();
    let config = with_tls(on_redis(port, &redis), "redis", &[("ca_file", &pki.ca())]);
    let trigger = amqp_trigger("tls", &key, &capture, "workers = 2\nbatch = 50");
    let mut bridge = start_ready(&config, &trigger, port).await;

    expect_all_then_drained(&capture, n, &bridge, (&mut r, &key), "tls").await;
    let forwarded = bridge
        .trigger_metric("delay_bridge_messages_forwarded_total", "tls")
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
    let (pki, redis, mut r) = loopback_redis(true).await;
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
        let mut bridge = start_ready(&config, &trigger, port).await;
        expect_all_then_drained(&capture, n, &bridge, (&mut r, &key), format).await;
        bridge.terminate(Duration::from_secs(15)).await;
        bridge.assert_no_panic();
    }
}

/// A Redis over TLS serving `cert` (demanding a client certificate with `client_auth`), `n`
/// messages due on a fresh key written through `redis-cli`, and a trigger from that key to a
/// capture.
struct TlsBacklog {
    pki: Pki,
    redis: RedisServer,
    capture: AmqpCapture,
    key: String,
    n: usize,
    trigger: String,
}

impl TlsBacklog {
    /// The server, and `n` messages on a key named after `prefix`.
    async fn start(cert: ServerCert, client_auth: bool, prefix: &str, n: usize) -> Self {
        let pki = Pki::new();
        let redis = RedisServer::start_tls(&pki, cert, client_auth).await;
        let capture = AmqpCapture::start("tls").await;
        let key = unique(prefix);
        schedule_cli(&redis, &key, n).await;
        let trigger = amqp_trigger("tls", &key, &capture, "");
        Self {
            pki,
            redis,
            capture,
            key,
            n,
            trigger,
        }
    }

    /// The config of a bridge with metrics on `port` reaching this Redis over TLS with `files`.
    fn over_tls(&self, port: u16, files: &[(&str, &Path)]) -> ConfigToml {
        with_tls(on_redis(port, &self.redis), "redis", files)
    }

    /// [`Self::over_tls`] trusting the test CA.
    fn trusting_the_ca(&self, port: u16) -> ConfigToml {
        self.over_tls(port, &[("ca_file", &self.pki.ca())])
    }

    /// A bridge on what `config` makes of its metrics port does not get through (see
    /// [`expect_redis_refused`]), and is stopped.
    async fn expect_refused(&self, config: impl FnOnce(u16) -> ConfigToml, reasons: &[&str]) {
        let port = free_port();
        let mut bridge = Bridge::start(&(config(port).to_string() + &self.trigger), port);
        expect_redis_refused(&mut bridge, &self.redis, &self.key, self.n, reasons).await;
        drop(bridge);
    }

    /// A bridge on what `config` makes of its metrics port gets ready and delivers every
    /// message, which leaves Redis.
    async fn expect_delivered(&self, config: impl FnOnce(u16) -> ConfigToml) -> Bridge {
        let port = free_port();
        let bridge = start_ready(&config(port), &self.trigger, port).await;
        expect_all(&self.capture, self.n, Duration::from_secs(30), &bridge).await;
        expect_drained_cli(&self.redis, &self.key, &bridge).await;
        bridge
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_signed_by_another_ca_is_refused() {
    let b = TlsBacklog::start(ServerCert::Loopback, false, "tls-other-ca", 50).await;
    // A CA that signed something else.
    let other_ca = |port| b.over_tls(port, &[("ca_file", &b.pki.other_ca())]);
    b.expect_refused(other_ca, &["UnknownIssuer"]).await;
    // No ca_file: the system's trust store, which has never heard of the private CA.
    b.expect_refused(|port| on_redis(port, &b.redis), &["UnknownIssuer"])
        .await;
    assert_eq!(b.capture.count(), 0, "nothing was published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_certificate_for_another_name_is_refused_unless_server_name_says_so() {
    let b = TlsBacklog::start(ServerCert::Named, false, "tls-name", 50).await;
    let ca = |port| b.trusting_the_ca(port);
    b.expect_refused(ca, &["NotValidForName", "not valid for name"])
        .await;
    let named = |port| {
        b.trusting_the_ca(port)
            .set_str("redis.tls", "server_name", NAMED_HOST)
    };
    let mut bridge = b.expect_delivered(named).await;
    bridge.terminate(Duration::from_secs(15)).await;
    bridge.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_demanding_a_client_certificate_refuses_a_bridge_without_one() {
    let b = TlsBacklog::start(ServerCert::Loopback, true, "tls-no-client-cert", 50).await;
    b.expect_refused(|port| b.trusting_the_ca(port), PEER_REFUSED)
        .await;
    assert!(
        b.redis.log().contains("peer did not return a certificate"),
        "the server refused for want of a certificate:\n{}",
        b.redis.log()
    );

    // The same members go once the bridge presents one.
    let pki = &b.pki;
    let files = [
        ("ca_file", pki.ca()),
        ("cert_file", pki.client_cert()),
        ("key_file", pki.client_key()),
    ];
    let files: Vec<(&str, &Path)> = files.iter().map(|(k, p)| (*k, p.as_path())).collect();
    let mut bridge = b.expect_delivered(|port| b.over_tls(port, &files)).await;
    bridge.terminate(Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_redis_verifies_nothing_and_says_so() {
    // Neither the CA nor the name would pass verification.
    let b = TlsBacklog::start(ServerCert::Named, false, "tls-insecure", 50).await;
    let mut bridge = b
        .expect_delivered(|port| on_redis(port, &b.redis).set("redis.tls", "insecure", "true"))
        .await;
    let log = bridge.log();
    assert!(
        log.lines()
            .any(|l| l.contains("insecure") && l.contains("WARN")),
        "a warning about insecure at start:\n{log}"
    );
    bridge.terminate(Duration::from_secs(15)).await;
}
