//! Reloading the configuration (SIGHUP and the admin API) against real Redis and RabbitMQ:
//! triggers added, replaced mid-drain and removed, and configurations that change nothing.

use crate::common;

use std::time::Duration;

use common::http::request;
use common::*;
use delay_bridge::keys::{shard_key, shard_of};

const TOKEN: &str = "reload-token-0123456789abcdef";

struct Setup {
    port: u16,
    admin_port: u16,
    a_key: String,
    b_key: String,
}

impl Setup {
    /// The config with trigger `a` (with `a_extra`, or none when `None`) and optionally `b`.
    fn config(&self, a: &AmqpCapture, a_extra: Option<&str>, b: Option<&AmqpCapture>) -> String {
        let mut c = base_config(self.port)
            + &format!("\n[admin]\nlisten = \"127.0.0.1:{}\"\n", self.admin_port);
        if let Some(extra) = a_extra {
            c += &amqp_trigger("a", &self.a_key, a, extra);
        }
        if let Some(b) = b {
            c += &amqp_trigger("b", &self.b_key, b, "");
        }
        c
    }
}

async fn reloaded(bridge: &Bridge, times: usize, what: &str) {
    let ok = wait_until(Duration::from_secs(15), || {
        bridge.log().matches(what).count() >= times
    })
    .await;
    assert!(ok, "`{what}` not logged {times} times:\n{}", bridge.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_the_api_add_replace_and_remove_triggers_and_refuse_bad_configs() {
    let mut r = redis().await;
    let a = AmqpCapture::start("reload-a").await;
    let b = AmqpCapture::start("reload-b").await;
    let s = Setup {
        port: free_port(),
        admin_port: free_port(),
        a_key: format!("{}:{{reload}}", unique("a")),
        b_key: format!("{}:{{reload}}", unique("b")),
    };
    let bridge = Bridge::start_with_env(
        &s.config(&a, Some(""), None),
        s.port,
        &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)],
    )
    .ready(Duration::from_secs(20))
    .await;
    schedule(&mut r, &s.a_key, 20, 0).await;
    bridge
        .expect_arrivals(20, Duration::from_secs(20), || a.count())
        .await;

    // Added: b starts.
    bridge.rewrite_config(&s.config(&a, Some(""), Some(&b)));
    bridge.signal(1);
    reloaded(&bridge, 1, "configuration reloaded").await;
    let now = redis_now(&mut r).await;
    zadd_all(&mut r, &s.b_key, (0..20).map(|i| (now, format!("b-{i}")))).await;
    bridge
        .expect_arrivals(20, Duration::from_secs(20), || b.count())
        .await;

    replace_mid_drain(&bridge, &mut r, &s, &a, &b).await;
    bad_configurations_change_nothing(&bridge, &mut r, &s, &a, &b).await;

    // Removed, through the admin API this time: a stops claiming, b goes on.
    bridge.rewrite_config(&s.config(&a, None, Some(&b)));
    let asked = request(
        s.admin_port,
        "POST",
        "/api/v1/reload",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        None,
    )
    .await;
    assert_eq!(asked.status, 200, "{}", asked.body);
    reloaded(&bridge, 3, "configuration reloaded").await;
    assert!(bridge.log().contains("removed [\"a\"]"), "{}", bridge.log());
    let before = a.count();
    let now = redis_now(&mut r).await;
    zadd(&mut r, &s.a_key, now, "not-claimed").await;
    zadd(&mut r, &s.b_key, now, "b-after").await;
    bridge
        .expect_arrivals(21, Duration::from_secs(10), || b.count())
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(a.count(), before, "a removed trigger claims nothing");
    assert_eq!(zcard(&mut r, &s.a_key).await, 1);
    let reloads = bridge
        .metric("delay_bridge_config_reloads_total", &[])
        .await;
    assert_eq!(reloads, 3.0);
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &s.a_key).await;
    cleanup_keys(&mut r, &s.b_key).await;
}

/// Replaced mid-drain: the old workers settle their batches while the new ones claim, so
/// nothing of the 5,000 on `a`'s key is lost and nothing is sent twice.
async fn replace_mid_drain(
    bridge: &Bridge,
    r: &mut Conn,
    s: &Setup,
    a: &AmqpCapture,
    b: &AmqpCapture,
) {
    let n = 5_000;
    let now = redis_now(r).await;
    zadd_all(
        r,
        &s.a_key,
        (0..n).map(|i| (now + (i as i64) * 5000 / n as i64, format!("drain-{i}"))),
    )
    .await;
    bridge
        .expect_arrivals(20 + n / 5, Duration::from_secs(20), || a.count())
        .await;
    bridge.rewrite_config(&s.config(a, Some("workers = 2\nbatch = 50\n"), Some(b)));
    bridge.signal(1);
    reloaded(bridge, 2, "configuration reloaded").await;
    assert!(a.count() < 20 + n, "the replacement must land mid-drain");
    bridge
        .expect_arrivals(20 + n, Duration::from_secs(30), || a.count())
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = a.tally();
    assert!(
        (0..n).all(|i| seen.get(format!("drain-{i}").as_bytes()) == Some(&1)),
        "every message of the drain exactly once"
    );
    assert!(
        bridge.log().contains("replaced [\"a\"]"),
        "{}",
        bridge.log()
    );
}

/// A configuration that does not validate changes nothing, and says which key; nor does one
/// that changes more than triggers; the failures are counted and `a` keeps running.
async fn bad_configurations_change_nothing(
    bridge: &Bridge,
    r: &mut Conn,
    s: &Setup,
    a: &AmqpCapture,
    b: &AmqpCapture,
) {
    bridge.rewrite_config(&s.config(a, Some("workers = 0\n"), Some(b)));
    bridge.signal(1);
    reloaded(bridge, 1, "configuration not reloaded").await;
    assert!(
        bridge.log().contains("triggers[0].workers"),
        "{}",
        bridge.log()
    );
    // Nor does one that changes more than triggers.
    let other = s
        .config(a, Some("workers = 2\nbatch = 50\n"), Some(b))
        .replace(
            "backlog_interval = \"200ms\"",
            "backlog_interval = \"300ms\"",
        );
    bridge.rewrite_config(&other);
    bridge.signal(1);
    reloaded(bridge, 2, "configuration not reloaded").await;
    assert!(
        bridge.log().contains("[metrics] changed"),
        "{}",
        bridge.log()
    );
    let failures = bridge
        .metric("delay_bridge_config_reload_failures_total", &[])
        .await;
    assert_eq!(failures, 2.0);
    let before = a.count();
    let now = redis_now(r).await;
    zadd(r, &s.a_key, now, "still-running").await;
    bridge
        .expect_arrivals(before + 1, Duration::from_secs(10), || a.count())
        .await;
}

/// Changing a trigger's shard count as the book's procedure says (docs/cluster.md), by reload: an
/// unsharded trigger becomes 3 shards with `drain_shards = 1`, so the old key keeps being served
/// while producers write to the new shards. Messages scheduled before and after the change all
/// arrive, once each; a cancel and a reschedule by the CLI find members on the old key; `stats
/// --shards` shows the old key empty, and `drain_shards` is then removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_count_changes_by_reload_without_losing_a_message() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("reshard").await;
    let port = free_port();
    let key = format!("delay:{{{}}}", unique("reshard"));
    let config = |extra: &str| base_config(port) + &amqp_trigger("re", &key, &capture, extra);
    let bridge = Bridge::start(&config(""), port)
        .ready(Duration::from_secs(20))
        .await;
    let now = redis_now(&mut r).await;
    // Before: on the one key, some due during the change, one to cancel and one to move later.
    zadd_all(
        &mut r,
        &key,
        (0..300).map(|i| (now + 2_000, format!("old-{i}"))),
    )
    .await;
    zadd(&mut r, &key, now + 3_600_000, "old-cancelled").await;
    zadd(&mut r, &key, now + 3_600_000, "old-moved").await;

    let sharded = config("shards = 3\ndrain_shards = 1");
    bridge.rewrite_config(&sharded);
    bridge.signal(1);
    reloaded(&bridge, 1, "configuration reloaded").await;
    // After: producers write by the shard hash over 3 shards (here through the CLI).
    for i in 0..30 {
        let out = cli(
            &["enqueue", "-t", "re", "--delay", "1s", &format!("new-{i}")],
            &sharded,
            &[],
        );
        assert_eq!(out.code, 0, "{}", out.text());
        let shard = shard_key(&key, shard_of(format!("new-{i}").as_bytes(), 3), 3).unwrap();
        assert!(
            out.stdout.contains(&shard),
            "new-{i} on {shard}: {}",
            out.text()
        );
    }
    let out = cli(&["cancel", "-t", "re", "old-cancelled"], &sharded, &[]);
    assert_eq!(out.code, 0, "the old key is searched too: {}", out.text());
    let out = cli(&["promote", "-t", "re", "old-moved"], &sharded, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    bridge
        .expect_arrivals(331, Duration::from_secs(30), || capture.count())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tally = capture.tally();
    assert_eq!(tally.len(), 331, "{}", bridge.log());
    assert!(tally.values().all(|c| *c == 1), "none twice");
    assert!(!tally.contains_key(&b"old-cancelled"[..]));

    // The old key is drained: `stats --shards` says so, and `drain_shards` goes.
    let out = cli(&["stats", "--json", "--shards"], &sharded, &[]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let old = v[0]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{key} among the shards: {v}"));
    assert_eq!(old["stats"]["scheduled"], 0, "{v}");
    assert_eq!(old["stats"]["inflight"], 0, "{v}");
    bridge.rewrite_config(&config("shards = 3"));
    bridge.signal(1);
    reloaded(&bridge, 2, "configuration reloaded").await;
    bridge.assert_no_panic();
    cleanup_with_shards(&mut r, &key, 3).await;
}

/// A pause belongs to the trigger: a reload from 1 to 3 shards (draining the plain key)
/// keeps the new shards paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_on_the_keys_a_new_shard_count_adds() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("repause").await;
    let port = free_port();
    let key = format!("delay:{{{}}}", unique("repause"));
    let config = |extra: &str| base_config(port) + &amqp_trigger("rp", &key, &capture, extra);
    let bridge = Bridge::start(&config(""), port)
        .ready(Duration::from_secs(20))
        .await;
    let plain = config("");
    let out = cli(&["pause", "-t", "rp"], &plain, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    let sharded = config("shards = 3\ndrain_shards = 1");
    bridge.rewrite_config(&sharded);
    bridge.signal(1);
    reloaded(&bridge, 1, "configuration reloaded").await;
    for i in 0..30 {
        let out = cli(&["enqueue", "-t", "rp", &format!("new-{i}")], &sharded, &[]);
        assert_eq!(out.code, 0, "{}", out.text());
    }
    let out = cli(&["stats", "--json"], &sharded, &[]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v[0]["stats"]["paused"], true, "{v}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(capture.count(), 0, "nothing delivered while paused");
    let out = cli(&["resume", "-t", "rp"], &sharded, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    bridge
        .expect_arrivals(30, Duration::from_secs(20), || capture.count())
        .await;
    bridge.assert_no_panic();
    cleanup_with_shards(&mut r, &key, 3).await;
}

/// A reload from 4 shards to 2 without `drain_shards` while shards 2 and 3 hold members is
/// refused (and so are a start and `check` with that configuration), naming the keys; once
/// they are empty it goes through, and a member written later to a retired key shows in the
/// `unserved_members` gauge and in `stats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_configuration_strands_members_on_keys_it_does_not_serve() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("strand").await;
    let port = free_port();
    let key = format!("delay:{{{}}}", unique("strand"));
    let config =
        |port: u16, extra: &str| base_config(port) + &amqp_trigger("st", &key, &capture, extra);
    let four = config(port, "shards = 4");
    let bridge = Bridge::start(&four, port)
        .ready(Duration::from_secs(20))
        .await;
    for i in 0..40 {
        let out = cli(
            &["enqueue", "-t", "st", "--delay", "4s", &format!("m-{i}")],
            &four,
            &[],
        );
        assert_eq!(out.code, 0, "{}", out.text());
    }
    let two = config(port, "shards = 2");
    bridge.rewrite_config(&two);
    bridge.signal(1);
    reloaded(&bridge, 1, "configuration not reloaded").await;
    let log = bridge.log();
    let retired = shard_key(&key, 3, 4).unwrap();
    assert!(
        log.contains(&retired) && log.contains("drain_shards = 4"),
        "the refusal names the keys and the remedy:\n{log}"
    );
    // Another bridge with that configuration does not start; `check` says why.
    let other = free_port();
    let mut refused = Bridge::start(&config(other, "shards = 2"), other);
    let said = refused.expect_exit(78, Duration::from_secs(20)).await;
    assert!(said.contains(&retired), "{said}");
    let (code, said) = check(&two);
    assert_eq!(code, 78, "{said}");
    assert!(said.contains(&retired), "{said}");
    // The running bridge still serves every key: all 40 arrive.
    bridge
        .expect_arrivals(40, Duration::from_secs(30), || capture.count())
        .await;
    let (empty, _) = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || check(&two).0,
        |code| *code == 0,
    )
    .await;
    assert!(empty, "the old keys are empty: check passes");
    bridge.signal(1);
    reloaded(&bridge, 1, "configuration reloaded").await;
    // A producer still on 4 shards writes to a key nothing serves now: it shows.
    zadd(&mut r, &retired, 0, "late").await;
    let (seen, body) = bridge
        .wait_scrape(Duration::from_secs(10), |body| {
            metric_value(body, "delay_bridge_unserved_members", &[("trigger", "st")]) == 1.0
        })
        .await;
    assert!(seen, "delay_bridge_unserved_members:\n{body}");
    let out = cli(&["stats"], &two, &[]);
    assert!(
        out.stdout.contains(&retired) && out.stdout.contains("does not serve"),
        "{}",
        out.text()
    );
    bridge.assert_no_panic();
    for i in 0..4 {
        cleanup_keys(&mut r, &shard_key(&key, i, 4).unwrap()).await;
    }
}

/// Removes the keys of `key` and of its `shards` shards.
async fn cleanup_with_shards(r: &mut Conn, key: &str, shards: u32) {
    for i in 0..shards {
        cleanup_keys(r, &shard_key(key, i, shards).unwrap()).await;
    }
    cleanup_keys(r, key).await;
}
