//! Redis behind Sentinel: the bridge asks the sentinels for the master, names it in `/readyz`, and follows a failover when the master is SIGKILLed mid-stream, losing nothing.

use crate::common;

use std::time::{Duration, Instant};

use common::sentinel::{SentinelSet, MASTER_NAME};
use common::*;

/// How long a bridge may take to become ready.
const READY: Duration = Duration::from_secs(20);

/// The `[redis]` of a bridge that finds the master through `set`'s sentinels.
fn through_sentinels(port: u16, set: &SentinelSet) -> ConfigToml {
    ConfigToml::base(port)
        .unset("redis", "url")
        .set_str("redis", "mode", "sentinel")
        .set("redis", "sentinels", &set.toml_array())
        .set_str("redis", "master_name", MASTER_NAME)
}

/// How `/readyz` and `stats` name the master at `port`.
fn at(port: u16) -> String {
    format!("master `{MASTER_NAME}` at 127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_sigkilled_mid_stream_is_followed_to_its_replica_and_nothing_is_lost() {
    // No notifications configured: the bridge (enable_keyspace_events) turns them on, on the
    // master at start and on the replica once it is the master.
    let mut set = SentinelSet::start(&[]).await;
    let mut r = set.master.conn().await;
    let capture = AmqpCapture::start("sentinel.rk").await;
    let key = format!("{}:{{sentinel}}", unique("delay"));
    let n = 20_000;
    schedule_over(&mut r, &key, n, Duration::from_secs(10)).await;
    // Every message on the replica before anything is claimed: what is lost with the master is
    // then only the bridge's own later writes.
    let replicas: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(replicas, 1);

    let port = free_port();
    let options = "workers = 4\nbatch = 25\nlease = \"2s\"\npublish_timeout = \"1s\"";
    let cfg =
        through_sentinels(port, &set).to_string() + &amqp_trigger("ha", &key, &capture, options);
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    bridge
        .expect_readyz_saying(200, &at(set.master.port), Duration::from_secs(5))
        .await;

    // Mid-stream: a third delivered, the master SIGKILLed.
    bridge
        .expect_arrivals(n / 3, Duration::from_secs(20), || capture.count())
        .await;
    set.master.sigkill();
    let killed = Instant::now();
    let before = capture.count();
    assert!(before < n, "the kill must land mid-stream");

    if !wait_until(Duration::from_secs(60), || capture.tally().len() >= n).await {
        panic!(
            "only {} of {n} delivered; {}\n{}\n{}",
            capture.tally().len(),
            capture.state().await,
            bridge.log(),
            set.logs()
        );
    }
    let seen = capture.tally();
    let duplicates = assert_none_lost(&seen, n);
    println!(
        "sentinel failover: {n} messages, lost 0, duplicates {duplicates} \
         (killed after {before}, all in {:?} after the kill)",
        killed.elapsed()
    );
    assert!(duplicates * 20 < n, "{duplicates} duplicates of {n}");

    // The replica is the master now, and /readyz and the sentinels say so.
    assert_eq!(
        set.master_port().await,
        Some(set.replica.as_ref().unwrap().port)
    );
    let at_replica = at(set.replica.as_ref().unwrap().port);
    bridge
        .expect_readyz_saying(200, &at_replica, Duration::from_secs(5))
        .await;
    let mut promoted = set.replica.as_ref().unwrap().conn().await;
    let (enabled, flags) = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            let (_, flags): (String, String) = redis::cmd("CONFIG")
                .arg("GET")
                .arg("notify-keyspace-events")
                .query_async(&mut promoted)
                .await
                .unwrap();
            flags
        },
        |flags| flags.contains('K') && (flags.contains('z') || flags.contains('A')),
    )
    .await;
    assert!(
        enabled,
        "the new master's notify-keyspace-events: {flags:?}"
    );
    let (subscribed, _) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, "delay_bridge_keyspace_notifications_enabled", &[]) == 1.0
        })
        .await;
    assert!(subscribed, "{}", bridge.log());
    let stats = cli(&["stats"], &cfg, &[]);
    assert!(stats.stdout.contains(&at_replica), "{}", stats.text());
    bridge.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_and_a_master_over_tls_deliver() {
    use common::tls::Pki;
    let pki = Pki::new();
    let set = SentinelSet::start_tls(&pki).await;
    let mut r = set.master.conn().await;
    let capture = AmqpCapture::start("sentinel-tls.rk").await;
    let key = format!("{}:{{sentinel-tls}}", unique("delay"));
    let port = free_port();
    let cfg = through_sentinels(port, &set)
        .set_str("redis.tls", "ca_file", &pki.ca().display().to_string())
        .set_str(
            "redis.tls",
            "cert_file",
            &pki.client_cert().display().to_string(),
        )
        .set_str(
            "redis.tls",
            "key_file",
            &pki.client_key().display().to_string(),
        )
        .to_string()
        + &amqp_trigger("ha-tls", &key, &capture, "");
    let bridge = Bridge::start(&cfg, port).ready(READY).await;
    expect_three_forwarded(&bridge, &mut r, &key, &capture).await;
    bridge
        .expect_readyz_saying(200, &at(set.master.port), Duration::from_secs(5))
        .await;
    bridge.assert_no_panic();
}
