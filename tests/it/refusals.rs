//! What the broker refuses: a message that chose its own routing key pays for it alone (an
//! attempt, then a dead letter with the broker's words), innocent neighbours and other
//! triggers go through, and a refusal of the trigger's own destination (an exchange deleted,
//! permissions revoked, with channels that still cache them or not) holds the trigger and
//! dead-letters nothing, however long, and resumes when fixed.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeleteOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};

use common::servers::RabbitServer;
use common::*;

/// A topic exchange and a queue bound to it with `pattern`, consumed in the background: how
/// many copies of each body arrived.
pub(crate) struct Topic {
    pub(crate) exchange: String,
    queue: String,
    pattern: String,
    url: String,
    seen: Arc<Mutex<HashMap<Vec<u8>, usize>>>,
    conn: Connection,
}

impl Topic {
    pub(crate) async fn start(url: &str, pattern: &str) -> Self {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on loopback (see README)");
        let me = Self {
            exchange: unique("refusals-ex"),
            queue: unique("refusals-q"),
            pattern: pattern.to_string(),
            url: url.to_string(),
            seen: Arc::default(),
            conn,
        };
        me.declare().await;
        let ch = me.conn.create_channel().await.unwrap();
        let mut consumer = ch
            .basic_consume(
                &me.queue,
                "refusals",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let seen = me.seen.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                *seen.lock().unwrap().entry(d.data.clone()).or_default() += 1;
                let _ = d.ack(BasicAckOptions::default()).await;
            }
        });
        me
    }

    /// Declares the exchange and the queue and binds them (again, after a delete).
    pub(crate) async fn declare(&self) {
        let ch = self.conn.create_channel().await.unwrap();
        let queue_options = QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        };
        declare_bound_queue(
            &ch,
            (&self.exchange, ExchangeKind::Topic, Default::default()),
            (&self.queue, queue_options),
            &self.pattern,
        )
        .await;
        let _ = ch.close(200, "declared").await;
    }

    pub(crate) async fn delete_exchange(&self) {
        let ch = self.conn.create_channel().await.unwrap();
        ch.exchange_delete(&self.exchange, ExchangeDeleteOptions::default())
            .await
            .unwrap();
        let _ = ch.close(200, "deleted").await;
    }

    pub(crate) fn distinct(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub(crate) fn copies(&self, body: &[u8]) -> usize {
        self.seen.lock().unwrap().get(body).copied().unwrap_or(0)
    }

    pub(crate) async fn expect_distinct(&self, n: usize, timeout: Duration, bridge: &Bridge) {
        let done = wait_until(timeout, || self.distinct() >= n).await;
        assert!(done, "{} of {n} arrived\n{}", self.distinct(), bridge.log());
    }

    /// Trigger `name` on `key`, publishing to this exchange with `routing_key` (and `lines`).
    pub(crate) fn trigger(&self, name: &str, key: &str, routing_key: &str, lines: &str) -> String {
        let to = format!(
            "exchange = \"{}\"\nrouting_key = \"{routing_key}\"\n",
            self.exchange
        );
        trigger(name, key, "rabbit", &(to + lines))
    }

    /// Starts a bridge on `cfg` and waits until `first` bodies arrived within `timeout`.
    pub(crate) async fn bridge_past(
        &self,
        cfg: &str,
        port: u16,
        first: usize,
        timeout: Duration,
    ) -> Bridge {
        let bridge = Bridge::start(cfg, port);
        self.expect_distinct(first, timeout, &bridge).await;
        bridge
    }
}

impl Drop for Topic {
    fn drop(&mut self) {
        // The exchange is durable: delete it on a connection of its own (the test's runtime
        // may be gone by now, so on a thread with one of its own).
        let (url, exchange) = (self.url.clone(), self.exchange.clone());
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                if let Ok(c) = Connection::connect(&url, ConnectionProperties::default()).await {
                    if let Ok(ch) = c.create_channel().await {
                        let _ = ch
                            .exchange_delete(&exchange, ExchangeDeleteOptions::default())
                            .await;
                    }
                    let _ = c.close(200, "done").await;
                }
            })
        })
        .join();
    }
}

/// A private RabbitMQ with a user `bridge` who may publish to `exchange` only with routing
/// keys matching `topic` (topic permissions): its URL for the bridge.
pub(crate) async fn broker_with_user(rabbit: &RabbitServer, exchange: &str, topic: &str) -> String {
    rabbit.ctl(&["add_user", "bridge", "bridge-pw"]).await;
    rabbit
        .ctl(&["set_permissions", "-p", "/", "bridge", ".*", ".*", ".*"])
        .await;
    set_topic_permissions(rabbit, exchange, topic).await;
    format!("amqp://bridge:bridge-pw@{}/%2f", rabbit.addr())
}

/// A private RabbitMQ, a [`Topic`] on it bound with `binding`, and the URL of a user
/// `bridge` who may publish to that topic's exchange with the routing keys matching `allowed`
/// only.
pub(crate) async fn restricted(binding: &str, allowed: &str) -> (RabbitServer, Topic, String) {
    let rabbit = RabbitServer::start().await;
    let topic = Topic::start(&rabbit.url(), binding).await;
    let url = broker_with_user(&rabbit, &topic.exchange, allowed).await;
    (rabbit, topic, url)
}

/// Closes the connections of user `bridge`: its channels are made anew, and ask the broker
/// for their permissions again (a channel caches what it was allowed).
pub(crate) async fn close_bridge_connections(rabbit: &RabbitServer) {
    let connections = rabbit
        .ctl_output(&["list_connections", "user", "pid"])
        .await
        .unwrap();
    for line in connections.lines().filter(|l| l.starts_with("bridge\t")) {
        let pid = line.trim_start_matches("bridge\t");
        rabbit
            .ctl(&["close_connection", pid, "permissions changed"])
            .await;
    }
}

/// Lets user `bridge` publish to `exchange` with the routing keys matching `pattern` only.
pub(crate) async fn set_topic_permissions(rabbit: &RabbitServer, exchange: &str, pattern: &str) {
    let args = [
        "set_topic_permissions",
        "-p",
        "/",
        "bridge",
        exchange,
        pattern,
        pattern,
    ];
    rabbit.ctl(&args).await;
}

/// A fresh queue key in the `{refusals}` hash slot.
pub(crate) fn refusal_key(prefix: &str) -> String {
    format!("{}:{{refusals}}", unique(prefix))
}

/// Schedules `poison` at the head of `key` (due a minute ago), `count` members made by `ok`
/// just behind it, and as many on `other`: one batch holds the poison and its neighbours.
pub(crate) async fn poison_first(
    r: &mut Conn,
    (key, other): (&str, &str),
    poison: &str,
    count: i64,
    ok: impl Fn(i64) -> String,
) {
    let now = redis_now(r).await;
    zadd(r, key, now - 60_000, poison).await;
    for i in 0..count {
        zadd(r, key, now - 50_000 + i, ok(i)).await;
        zadd(r, other, now - 50_000 + i, format!("other-{i}")).await;
    }
}

/// The reason `member` of `key` was dead-lettered, within `timeout`.
pub(crate) async fn dead_within(
    r: &mut Conn,
    key: &str,
    member: &str,
    timeout: Duration,
    bridge: &Bridge,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + timeout;
    wait_dead_reason(r, key, member.as_bytes(), deadline)
        .await
        .unwrap_or_else(|| panic!("not dead-lettered\n{}", bridge.log()))
}

/// Asserts that nothing of `key` is dead-lettered.
pub(crate) async fn assert_none_dead(r: &mut Conn, key: &str, bridge: &Bridge) {
    let dead = zcard(r, &format!("{key}:dead")).await;
    assert_eq!(dead, 0, "{}", bridge.log());
}

/// The end of every test here: no panic in the bridge's log, the bridge stopped, its keys gone.
pub(crate) async fn done(bridge: Bridge, r: &mut Conn, keys: &[&str]) {
    bridge.assert_no_panic();
    drop(bridge);
    for key in keys {
        cleanup_keys(r, key).await;
    }
}

pub(crate) fn envelope(body: &str, routing_key: &str) -> String {
    format!(r#"{{"body": "{body}", "routing_key": "{routing_key}"}}"#)
}

/// A routing key the message chose, outside the user's topic permissions, makes RabbitMQ
/// close the channel (403) on every try. It is the message's own destination: it pays
/// attempts and is dead-lettered as `destination_refused` with the broker's reply, while the
/// ten allowed messages behind it and another trigger on the same connection are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routing_key_outside_the_permissions_is_refused_alone_and_the_rest_flows() {
    let (_rabbit, topic, url) = restricted("allowed.#", "^allowed\\..*").await;
    let mut r = redis().await;
    let key = refusal_key("acl");
    let other = refusal_key("acl-other");
    let poison = envelope("poison", "denied.x");
    // The poison is the head: claimed first, in one batch with the allowed ones.
    let ok = |i| envelope(&format!("ok-{i}"), "allowed.x");
    poison_first(&mut r, (&key, &other), &poison, 10, ok).await;
    let port = free_port();
    let lines = "format = \"envelope\"\nworkers = 1\nbatch = 100\nmax_attempts = 2\n\
                 backoff_initial = \"100ms\"\nbackoff_max = \"200ms\"\n";
    let cfg = ConfigToml::base(port).amqp_sink("rabbit", &url).to_string()
        + &topic.trigger("acl", &key, "allowed.default", lines)
        + &topic.trigger("other", &other, "allowed.other", "workers = 1\n");
    let bridge = topic
        .bridge_past(&cfg, port, 20, Duration::from_secs(30))
        .await;
    let reason = dead_within(&mut r, &key, &poison, Duration::from_secs(30), &bridge).await;
    assert_eq!(reason["reason"], "destination_refused", "{reason}");
    assert_eq!(reason["attempts"], 2, "{reason}");
    let detail = reason["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("403 ") && detail.contains("ACCESS_REFUSED"),
        "{reason}"
    );
    assert_eq!(topic.copies(b"poison"), 0);
    assert_eq!(
        wait_drained(&mut r, &key, Duration::from_secs(10)).await,
        (0, 0, 1)
    );
    assert_eq!(
        wait_drained(&mut r, &other, Duration::from_secs(10)).await,
        (0, 0, 0)
    );
    let log = bridge.log();
    assert!(
        log.contains("messages failed for a reason of their own") && log.contains("403"),
        "the broker's words reach the log:\n{log}"
    );
    done(bridge, &mut r, &[&key, &other]).await;
}

/// ~21,000 short header names are 63,000 bytes of names and values but ~189,000 bytes as an
/// AMQP field table, over RabbitMQ's frame_max: published, RabbitMQ would close the whole
/// connection. Measured as the broker will, the message is dead-lettered `too_large` before
/// it is sent, the connection stays up, and the messages behind it and another trigger's flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_the_frame_size_are_dead_lettered_without_cutting_the_connection() {
    let capture = AmqpCapture::start("frame").await;
    let mut r = redis().await;
    let key = refusal_key("frame");
    let other = refusal_key("frame-other");
    // Three-character names (but `bcc`, which envelopes may not carry).
    let names: Vec<String> = (36 * 36..)
        .map(|i: u32| {
            let digits: Vec<u8> = [i / 1296, (i / 36) % 36, i % 36]
                .iter()
                .map(|&d| b"0123456789abcdefghijklmnopqrstuvwxyz"[d as usize])
                .collect();
            String::from_utf8(digits).unwrap()
        })
        .filter(|name| name != "bcc")
        .take(21_000)
        .map(|name| format!("\"{name}\": \"\""))
        .collect();
    let poison = format!(
        r#"{{"body": "poison", "headers": {{{}}}}}"#,
        names.join(", ")
    );
    let ok = |i| format!(r#"{{"body": "ok-{i}"}}"#);
    poison_first(&mut r, (&key, &other), &poison, 20, ok).await;
    let port = free_port();
    let cfg = ConfigToml::base(port).to_string()
        + &amqp_trigger(
            "frame",
            &key,
            &capture,
            "format = \"envelope\"\nworkers = 1\nbatch = 100",
        )
        + &amqp_trigger("other", &other, &capture, "workers = 1");
    let bridge = Bridge::start(&cfg, port);
    bridge
        .expect_arrivals(40, Duration::from_secs(30), || capture.count())
        .await;
    let reason = dead_within(&mut r, &key, &poison, Duration::from_secs(10), &bridge).await;
    assert_eq!(reason["reason"], "too_large", "{reason}");
    assert_eq!(reason["attempts"], 1, "{reason}");
    assert!(
        reason["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("frame_max"),
        "{reason}"
    );
    let log = bridge.log();
    assert_eq!(
        log.matches("connected to RabbitMQ").count(),
        1,
        "one connection, never cut:\n{log}"
    );
    done(bridge, &mut r, &[&key, &other]).await;
}

/// The exchange deleted mid-stream: every message is refused (404), alone too. Nothing is
/// dead-lettered and no attempt is counted; once the exchange is back, everything arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_deleted_mid_stream_dead_letters_nothing_and_resumes() {
    let n = 400;
    let topic = Topic::start(&amqp_url(), "#").await;
    let mut r = redis().await;
    let key = refusal_key("deleted");
    schedule_over(&mut r, &key, n, Duration::from_secs(6)).await;
    let port = free_port();
    let lines = "workers = 2\nmax_attempts = 1\npublish_timeout = \"2s\"";
    let cfg = ConfigToml::base(port).to_string() + &topic.trigger("deleted", &key, "k", lines);
    let bridge = topic
        .bridge_past(&cfg, port, 20, Duration::from_secs(20))
        .await;
    topic.delete_exchange().await;
    // Long enough for every message to fall due and be tried against the missing exchange.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        topic.distinct() < n,
        "the exchange was deleted before the end"
    );
    assert_none_dead(&mut r, &key, &bridge).await;
    topic.declare().await;
    topic
        .expect_distinct(n, Duration::from_secs(60), &bridge)
        .await;
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(10)).await;
    assert_eq!(sizes, (0, 0, 0), "nothing dead-lettered\n{}", bridge.log());
    done(bridge, &mut r, &[&key]).await;
}

/// The user's permissions revoked for every routing key: each message, alone too, is refused
/// (403). That is the destination's failure: the trigger is held, nothing is dead-lettered, no
/// attempt counted, `/readyz` says why; once the permissions are back, everything arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_revoked_for_every_key_dead_letter_nothing_and_resume() {
    let n = 300;
    let (rabbit, topic, url) = restricted("#", ".*").await;
    let mut r = redis().await;
    let key = refusal_key("revoked");
    schedule(&mut r, &key, 20, 0).await;
    let port = free_port();
    let cfg = ConfigToml::base(port).amqp_sink("rabbit", &url).to_string()
        + &topic.trigger("revoked", &key, "k", "workers = 2\nmax_attempts = 1\n");
    let bridge = topic
        .bridge_past(&cfg, port, 20, Duration::from_secs(20))
        .await;
    // No routing key is allowed any more; the bridge's channels are made anew (a channel
    // caches what it was allowed).
    set_topic_permissions(&rabbit, &topic.exchange, "^$").await;
    close_bridge_connections(&rabbit).await;
    let now = redis_now(&mut r).await;
    let bodies: Vec<Vec<u8>> = (20..n).map(|i| body(i, 0)).collect();
    for (i, b) in bodies.iter().enumerate() {
        zadd(&mut r, &key, now - 1000 + i as i64, b.as_slice()).await;
    }
    let (refused, _) = bridge
        .wait_http("/readyz", Duration::from_secs(30), |status, text| {
            status == 503 && text.contains("trigger revoked: held") && text.contains("403")
        })
        .await;
    assert!(refused, "/readyz says why\n{}", bridge.log());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_none_dead(&mut r, &key, &bridge).await;
    assert!(topic.distinct() < n);
    set_topic_permissions(&rabbit, &topic.exchange, ".*").await;
    topic
        .expect_distinct(n, Duration::from_secs(60), &bridge)
        .await;
    assert_eq!(
        wait_drained(&mut r, &key, Duration::from_secs(10)).await,
        (0, 0, 0)
    );
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
    let log = bridge.log();
    assert_eq!(
        log.matches("destination held").count(),
        1,
        "said once per hold:\n{log}"
    );
    done(bridge, &mut r, &[&key]).await;
}

/// A wrong password is a refused login, named as such (not an unreachable broker), and
/// `/readyz` says the sink is not connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_named_a_refused_login() {
    let mut url = url::Url::parse(&amqp_url()).unwrap();
    url.set_password(Some("not-the-password")).unwrap();
    let key = refusal_key("login");
    let port = free_port();
    let cfg = ConfigToml::base(port)
        .amqp_sink("rabbit", url.as_str())
        .to_string()
        + &trigger(
            "login",
            &key,
            "rabbit",
            "exchange = \"\"\nrouting_key = \"q\"\n",
        );
    let bridge = Bridge::start(&cfg, port);
    let (said, _) = bridge
        .wait_http("/readyz", Duration::from_secs(20), |status, _| {
            status == 503 && bridge.log().contains("refused the bridge's login")
        })
        .await;
    let log = bridge.log();
    assert!(said, "{log}");
    assert!(log.contains("check the user and password"), "{log}");
    assert!(!log.contains("RabbitMQ unreachable"), "{log}");
    assert!(
        !log.contains("not-the-password"),
        "no secret in the log:\n{log}"
    );
}
