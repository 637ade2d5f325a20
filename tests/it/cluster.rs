//! Redis Cluster mode against a private cluster of three masters with a replica each: every
//! master's queues delivered and woken by notifications, and draining through a manual
//! failover and through a killed master without losing a message.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::redis_cluster::RedisCluster;
use common::*;
use delay_bridge::keys::{shard_key, shard_of, QueueKeys};
use redis::AsyncCommands;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(20);

/// A bridge config on `cluster` with the shared RabbitMQ as sink `rabbit`.
fn cluster_config(cluster: &RedisCluster, metrics_port: u16) -> String {
    let nodes: Vec<String> = cluster.seeds().iter().map(|s| quoted(s)).collect();
    ConfigToml::base(metrics_port)
        .without("redis")
        .set_str("redis", "mode", "cluster")
        .set("redis", "nodes", &format!("[{}]", nodes.join(", ")))
        .set("redis", "enable_keyspace_events", "true")
        .to_string()
}

/// Waits until the bridge is subscribed and every trigger in `names` made its first (empty)
/// claim: its idle workers then sleep their notified guard.
async fn wait_idle(bridge: &Bridge, names: &[&str]) {
    let (settled, body) = bridge
        .wait_scrape(Duration::from_secs(15), |b| {
            metric_value(b, "delay_bridge_keyspace_notifications_enabled", &[]) == 1.0
                && names.iter().all(|n| {
                    metric_value(b, "delay_bridge_empty_claims_total", &[("trigger", n)]) >= 1.0
                })
        })
        .await;
    assert!(settled, "not subscribed and idle: {body}\n{}", bridge.log());
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Asserts that `trigger`'s notification wake-ups rose above `before`.
async fn assert_woken(bridge: &Bridge, trigger: &str, before: f64, when: &str) {
    let now = bridge
        .metric("delay_bridge_notify_wakeups_total", &[("trigger", trigger)])
        .await;
    assert!(
        now > before,
        "woken by a notification {when}: {before} -> {now}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_master_delivers_on_time_woken_by_notifications_with_cancel_and_reschedule() {
    let cluster = RedisCluster::start().await;
    let mut r = cluster.conn().await;
    let tags = cluster.tag_per_master(&unique("q")).await;
    let capture = AmqpCapture::start("cluster").await;
    let port = free_port();
    let mut cfg = cluster_config(&cluster, port);
    let names = ["m0", "m1", "m2"];
    for (name, tag) in names.iter().zip(&tags) {
        cfg += &amqp_trigger(
            name,
            &format!("delay:{{{tag}}}"),
            &capture,
            "guard_interval = \"60s\"",
        );
    }
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    wait_idle(&bridge, &names).await;
    let woken_before: Vec<f64> = {
        let body = bridge.scrape().await;
        names
            .iter()
            .map(|n| {
                metric_value(
                    &body,
                    "delay_bridge_notify_wakeups_total",
                    &[("trigger", n)],
                )
            })
            .collect()
    };

    // Due now on every master; one to cancel and one to reschedule earlier, on each.
    let now = now_ms();
    let mut expected = Vec::new();
    for (i, tag) in tags.iter().enumerate() {
        let key = format!("delay:{{{tag}}}");
        let members: Vec<String> = (0..100).map(|j| format!("m{i}-{j}")).collect();
        RedisCluster::zadd_all(&mut r, &key, now, &members).await;
        expected.extend(members);
        let _: i64 = r
            .zadd(&key, format!("cancelled-{i}"), now + 1500)
            .await
            .unwrap();
        let _: i64 = r
            .zadd(&key, format!("moved-{i}"), now + 3_600_000)
            .await
            .unwrap();
    }
    for (i, tag) in tags.iter().enumerate() {
        let key = format!("delay:{{{tag}}}");
        let _: i64 = r.zrem(&key, format!("cancelled-{i}")).await.unwrap();
        let _: i64 = r
            .zadd(&key, format!("moved-{i}"), now + 1000)
            .await
            .unwrap();
        expected.push(format!("moved-{i}"));
    }
    assert!(
        wait_until(Duration::from_secs(30), || capture.count()
            >= expected.len())
        .await,
        "{} of {} delivered: {}",
        capture.count(),
        expected.len(),
        bridge.log()
    );
    // Past the cancelled members' due time: they stay undelivered.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tally = capture.tally();
    for member in &expected {
        assert_eq!(
            tally.get(member.as_bytes()),
            Some(&1),
            "{member} delivered once"
        );
    }
    assert_eq!(tally.len(), expected.len(), "nothing else: {tally:?}");
    let body = bridge.scrape().await;
    for (n, before) in names.iter().zip(woken_before) {
        assert!(
            metric_value(
                &body,
                "delay_bridge_notify_wakeups_total",
                &[("trigger", n)]
            ) > before,
            "trigger {n} woken by a notification from its own master"
        );
    }
    bridge.assert_no_panic();
}

/// The scenario the failure tests share: `n` members due now on one queue, `fail` applied to
/// its master mid-drain, then every member delivered at least once and a later write still
/// woken by a notification. `fail` calls its third argument the moment its failure holds
/// (before waiting for the cluster to recover): fewer than `n` must be delivered then.
/// Returns how many were delivered twice.
pub(crate) async fn drain_through(
    cluster: &mut RedisCluster,
    n: usize,
    fail: impl AsyncFnOnce(&mut RedisCluster, u16, &(dyn Fn() + Sync)),
) -> usize {
    let mut r = cluster.conn().await;
    let tag = unique("f");
    let key = format!("delay:{{{tag}}}");
    let capture = AmqpCapture::start("failover").await;
    let port = free_port();
    let cfg = cluster_config(cluster, port)
        + &amqp_trigger(
            "f",
            &key,
            &capture,
            "guard_interval = \"60s\"\nlease = \"12s\"\npublish_timeout = \"6s\"\nworkers = 4\nbatch = 50",
        );
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    wait_idle(&bridge, &["f"]).await;
    let members: Vec<String> = (0..n).map(|i| format!("{i:06}")).collect();
    RedisCluster::zadd_all(&mut r, &key, now_ms(), &members).await;
    bridge
        .expect_arrivals(n / 10, Duration::from_secs(30), || capture.count())
        .await;
    let master = cluster.master_of(&key).await;
    let held = std::sync::OnceLock::new();
    fail(cluster, master, &|| {
        let _ = held.set(capture.count());
    })
    .await;
    let at = *held.get().expect("the drill says when its failure held");
    assert!(
        at < n,
        "the failure must land mid-drain ({at} of {n} delivered when it held)"
    );
    let delivered = |tally: &HashMap<Vec<u8>, usize>| {
        members
            .iter()
            .filter(|m| tally.contains_key(m.as_bytes()))
            .count()
    };
    let (all, _) = poll(
        Duration::from_secs(150),
        Duration::from_millis(200),
        async || delivered(&capture.tally()),
        |d| *d == n,
    )
    .await;
    if !all {
        // Where the rest are, and what the bridge was doing, for a drain that stopped.
        let mut r = cluster.conn().await;
        let due: Result<usize, _> = r.zcard(&key).await;
        let inflight: Result<usize, _> = r.zcard(QueueKeys::derive(&key).unwrap().inflight).await;
        let counters: Vec<String> = bridge
            .scrape()
            .await
            .lines()
            .filter(|l| l.starts_with("delay_bridge_") && !l.contains("_bucket"))
            .map(str::to_string)
            .collect();
        panic!(
            "{} of {n} delivered after the failure; in Redis: {due:?} waiting, {inflight:?} \
             in flight; {}\n{}\n{}",
            delivered(&capture.tally()),
            capture.state().await,
            counters.join("\n"),
            bridge.log()
        );
    }
    let duplicates = capture.tally().values().filter(|c| **c > 1).count();

    // After the topology change a write still wakes the idle worker (its guard is 60 s).
    let (idle, _) = bridge
        .wait_scrape(Duration::from_secs(30), |b| {
            metric_value(b, "delay_bridge_keyspace_notifications_enabled", &[]) == 1.0
                && metric_value(
                    b,
                    "delay_bridge_backlog_messages",
                    &[("trigger", "f"), ("state", "inflight")],
                ) == 0.0
        })
        .await;
    assert!(idle, "settled after the failure: {}", bridge.log());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let woken = bridge
        .metric("delay_bridge_notify_wakeups_total", &[("trigger", "f")])
        .await;
    let _: i64 = r.zadd(&key, "after", now_ms()).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || capture
            .tally()
            .contains_key(b"after".as_slice()))
        .await,
        "a write after the failure delivered before the 60 s guard: {}",
        bridge.log()
    );
    assert_woken(&bridge, "f", woken, "after the failure").await;
    assert!(
        bridge
            .metric("delay_bridge_redis_topology_changes_total", &[])
            .await
            >= 1.0,
        "the topology change is counted"
    );
    bridge.assert_no_panic();
    duplicates
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_mid_drain_loses_nothing_and_notifications_follow() {
    let mut cluster = RedisCluster::start().await;
    let duplicates = drain_through(&mut cluster, 20_000, async |cluster, master, held| {
        let replica = cluster.replica_of(master).await;
        cluster.failover(replica, held).await;
    })
    .await;
    println!("manual failover: {duplicates} duplicates of 20000");
}

/// Asserts that `replica` becomes a master within 30 s (`what` says why it must).
async fn expect_promoted(cluster: &RedisCluster, replica: u16, what: &str) {
    assert!(
        cluster
            .wait_promoted(replica, Duration::from_secs(30))
            .await,
        "{what}: {}",
        cluster.log(replica)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_mid_drain_loses_nothing_and_notifications_follow() {
    let mut cluster = RedisCluster::start().await;
    let duplicates = drain_through(&mut cluster, 20_000, async |cluster, master, held| {
        // Past the node timeout (2 s): its replica takes over while it sleeps, and it comes
        // back as a replica.
        let replica = cluster.replica_of(master).await;
        let sleeping = cluster.cli_detached(master, &["DEBUG", "SLEEP", "6"]);
        cluster.wait_unanswering(master).await;
        held();
        expect_promoted(
            cluster,
            replica,
            "the replica took over from the hung master",
        )
        .await;
        let _ = sleeping.await;
    })
    .await;
    println!("hung master: {duplicates} duplicates of 20000");
}

/// A trigger of 6 shards: `check` places them on all three masters, 100,000 messages scheduled
/// through the shard hash drain through two bridges at once (workers serve several shards
/// each), none delivered by both, and `stats` sums the shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_drain_a_sharded_trigger_over_every_master_never_delivering_twice() {
    const SHARDS: u32 = 6;
    let cluster = RedisCluster::start().await;
    let mut r = cluster.conn().await;
    // Slots follow the keys' names: a tag whose 6 shards land 1 to 3 per master (a random tag
    // leaves a master without a shard about one time in four, which `check` warns about).
    let mut key = String::new();
    for _ in 0..100 {
        key = format!("delay:{{{}}}", unique("two"));
        let mut per_master = std::collections::HashMap::new();
        for i in 0..SHARDS {
            let shard = shard_key(&key, i, SHARDS).unwrap();
            *per_master
                .entry(cluster.master_of(&shard).await)
                .or_insert(0) += 1;
        }
        if per_master.len() == 3 && per_master.values().all(|&n| n <= 3) {
            break;
        }
    }
    let capture = AmqpCapture::start("two").await;
    let (p1, p2) = (free_port(), free_port());
    let trigger = amqp_trigger(
        "two",
        &key,
        &capture,
        &format!("shards = {SHARDS}\nworkers = 4\nbatch = 200"),
    );
    let config = cluster_config(&cluster, p1) + &trigger;

    // `check` reads the cluster: each shard, its slot and its master; every master has some.
    let (code, out) = check(&config);
    assert_eq!(code, 0, "{out}");
    let mut masters_used = std::collections::BTreeSet::new();
    for i in 0..SHARDS {
        let shard = shard_key(&key, i, SHARDS).unwrap();
        let slot = cluster.keyslot(&shard).await;
        let master = cluster.master_of(&shard).await;
        let line = format!("shard {shard} -> slot {slot} -> 127.0.0.1:{master}");
        assert!(out.contains(&line), "`{line}` in:\n{out}");
        masters_used.insert(master);
    }
    assert_eq!(masters_used.len(), 3, "6 shards over 3 masters: {out}");
    assert!(!out.contains("unevenly"), "{out}");

    let one = Bridge::start(&config, p1).ready(READY).await;
    let two = Bridge::start(&(cluster_config(&cluster, p2) + &trigger), p2)
        .ready(READY)
        .await;
    let n = 100_000;
    let mut by_shard: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..n {
        let member = format!("{i:06}");
        let shard = shard_key(&key, shard_of(member.as_bytes(), SHARDS), SHARDS).unwrap();
        by_shard.entry(shard).or_default().push(member);
    }
    assert_eq!(by_shard.len(), SHARDS as usize, "every shard gets members");
    let now = now_ms();
    for (shard, members) in &by_shard {
        RedisCluster::zadd_all(&mut r, shard, now, members).await;
    }
    // Liveness, not speed: a slow two-core machine drained this in about 100 s alone and
    // 200 s beside the rest of the suite.
    assert!(
        wait_until(Duration::from_secs(300), || capture.count() >= n).await,
        "{} of {n} delivered: {}",
        capture.count(),
        one.log()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tally = capture.tally();
    assert_eq!(tally.len(), n, "every message delivered");
    assert!(
        tally.values().all(|c| *c == 1),
        "no message delivered by both: {} twice",
        tally.values().filter(|c| **c > 1).count()
    );
    let labels = [("trigger", "two")];
    let forwarded = "delay_bridge_messages_forwarded_total";
    let [a, b] = metric_of_each([&one, &two], forwarded, &labels).await;
    println!("two bridges: {a} and {b} forwarded");
    assert!(a > 0.0 && b > 0.0, "both bridges took a share: {a} and {b}");

    // One more on each shard, far ahead: `stats` sums them, `--shards` shows each.
    for shard in by_shard.keys() {
        let _: i64 = r.zadd(shard, "later", now + 3_600_000).await.unwrap();
    }
    let out = cli(&["stats", "--json", "--shards"], &config, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v[0]["stats"]["scheduled"], SHARDS, "{v}");
    assert_eq!(v[0]["stats"]["due"], 0, "{v}");
    let each = v[0]["shards"].as_array().unwrap();
    assert_eq!(each.len(), SHARDS as usize, "{v}");
    assert!(each.iter().all(|s| s["stats"]["scheduled"] == 1), "{v}");
    one.assert_no_panic();
    two.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_mid_drain_loses_nothing_and_notifications_follow() {
    let mut cluster = RedisCluster::start().await;
    let duplicates = drain_through(&mut cluster, 20_000, async |cluster, master, held| {
        let replica = cluster.replica_of(master).await;
        cluster.kill(master);
        held();
        expect_promoted(cluster, replica, "the replica took over").await;
    })
    .await;
    println!("killed master: {duplicates} duplicates of 20000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_behind_a_password_and_tls_delivers_and_notifies() {
    use common::redis_cluster::{Options, Tls};
    use common::tls::{Pki, ServerCert};
    let pki = Pki::new();
    let (cert, key) = pki.server(ServerCert::Loopback);
    let password = "cluster-secret-7f3a";
    let cluster = RedisCluster::start_with(Options {
        password: Some(password.into()),
        tls: Some(Tls {
            ca: pki.ca(),
            cert,
            key,
            client_cert: pki.client_cert(),
            client_key: pki.client_key(),
        }),
        ..Options::default()
    })
    .await;
    let mut r = cluster.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("redis-password");
    std::fs::write(&password_file, password).unwrap();
    let key = format!("delay:{{{}}}", unique("sec"));
    let capture = AmqpCapture::start("secure").await;
    let port = free_port();
    let nodes: Vec<String> = cluster.seeds().iter().map(|s| quoted(s)).collect();
    let cfg = ConfigToml::base(port)
        .without("redis")
        .set_str("redis", "mode", "cluster")
        .set("redis", "nodes", &format!("[{}]", nodes.join(", ")))
        .set("redis", "enable_keyspace_events", "true")
        .set_str("redis", "password_file", password_file.to_str().unwrap())
        .set_str("redis.tls", "ca_file", pki.ca().to_str().unwrap())
        .to_string()
        + &amqp_trigger("sec", &key, &capture, "guard_interval = \"60s\"");
    assert!(cluster.seeds()[0].starts_with("rediss://"));
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    wait_idle(&bridge, &["sec"]).await;
    let woken = bridge
        .metric("delay_bridge_notify_wakeups_total", &[("trigger", "sec")])
        .await;
    let members: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
    RedisCluster::zadd_all(&mut r, &key, now_ms(), &members).await;
    assert!(
        wait_until(Duration::from_secs(20), || capture.count() >= members.len()).await,
        "{} of {} delivered over TLS with a password: {}",
        capture.count(),
        members.len(),
        bridge.log()
    );
    assert_woken(&bridge, "sec", woken, "over TLS").await;
    assert!(
        !bridge.log().contains(password),
        "the password stays out of the log"
    );
    bridge.assert_no_panic();
}
