//! The steps the fault tests share: a fault's detection timed, what the sink gave back while it
//! was down, the progress once it healed, and the drain at the end.

use std::fmt::Display;
use std::time::{Duration, Instant};

use super::proxy::{Mode, Proxy};
use super::tally::{assert_not_claiming, report, FaultConfig, Tally};
use super::{
    amqp_url, redis, schedule, unique, wait_drained, wait_sizes, wait_until, Bridge, Conn,
};

/// Where most fault tests start: the shared Redis, a tally on the shared RabbitMQ, and a fresh
/// key (see [`fault_key`]).
pub async fn fault_scene(prefix: &str) -> (Conn, Tally, String) {
    (
        redis().await,
        Tally::start(&amqp_url()).await,
        fault_key(prefix),
    )
}

/// A fresh queue key in the `{faults}` hash slot.
pub fn fault_key(prefix: &str) -> String {
    format!("{}:{{faults}}", unique(prefix))
}

/// Starts a bridge on `cfg` and waits (30 s at most) until `first` messages reached the tally.
pub async fn start_draining(tally: &Tally, cfg: &str, port: u16, first: usize) -> Bridge {
    let bridge = Bridge::start(cfg, port);
    tally
        .expect_distinct(first, Duration::from_secs(30), &bridge)
        .await;
    bridge
}

/// Starts a bridge on `cfg` publishing through `proxy`, which turns to `mode` by itself once
/// `bytes` went through it (see [`Proxy::set_after`]): the fault lands mid-stream even when
/// the bridge outruns the test's own tasks on a loaded host.
pub async fn start_until_fault(
    tally: &Tally,
    cfg: &str,
    port: u16,
    proxy: &Proxy,
    (mode, bytes): (Mode, usize),
) -> Bridge {
    proxy.set_after(mode, bytes);
    let bridge = Bridge::start(cfg, port);
    assert!(
        tokio::time::timeout(Duration::from_secs(30), proxy.reached(mode))
            .await
            .is_ok(),
        "{} delivered, and the fault never came\n{}",
        tally.distinct(),
        bridge.log()
    );
    bridge
}

/// Asserts that `/readyz` answers `status` within `timeout`; returns how long it took.
pub async fn time_readyz(bridge: &Bridge, status: u16, timeout: Duration) -> Duration {
    let since = Instant::now();
    bridge.expect_readyz(status, timeout).await;
    since.elapsed()
}

/// Asserts that what the sink did not confirm went back: the in-flight set is empty within
/// `within`.
pub async fn assert_given_back(r: &mut Conn, key: &str, within: Duration, bridge: &Bridge) {
    let (_, inflight, _) = wait_sizes(r, key, within, |s| s.1 == 0).await;
    assert_eq!(
        inflight,
        0,
        "unconfirmed messages go back to the source set\n{}",
        bridge.log()
    );
}

/// Asserts that nothing is claimed for `window` while members wait in the source set (`what`
/// says why some must).
pub async fn assert_held(r: &mut Conn, key: &str, window: Duration, bridge: &Bridge, what: &str) {
    let queued = assert_not_claiming(r, key, window, bridge).await;
    assert!(queued > 0, "{what}");
}

/// Asserts that `more` messages beyond the `from` seen arrive within 30 s of a fault healing.
pub async fn expect_progress(tally: &Tally, from: usize, more: usize, bridge: &Bridge) {
    assert!(
        wait_until(Duration::from_secs(30), || tally.distinct() >= from + more).await,
        "no progress after the cut healed\n{}",
        bridge.log()
    );
}

/// Waits for all `n` messages at the consumer (120 s at most), then for `key` to drain (30 s
/// at most); returns the queue's sizes.
pub async fn delivered_and_drained(
    tally: &Tally,
    n: usize,
    bridge: &Bridge,
    r: &mut Conn,
    key: &str,
) -> (i64, i64, i64) {
    tally
        .expect_distinct(n, Duration::from_secs(120), bridge)
        .await;
    wait_drained(r, key, Duration::from_secs(30)).await
}

/// Bodies padded to 8 KiB: two batches of 500 (8 MB) overflow the socket buffers of a
/// stalled connection (4 MB at most on Linux), so the publish itself blocks, not only its
/// confirmation.
pub const BIG: usize = 8192;

/// Schedules `n` [`BIG`] messages on `key`; returns the config of a bridge that publishes them
/// through `proxy` in batches of 500 (two workers), with no heartbeat: a stalled broker looks
/// alive, only slow.
pub async fn big_batches_through(
    r: &mut Conn,
    tally: &Tally,
    key: &str,
    n: usize,
    port: u16,
    proxy: &Proxy,
) -> FaultConfig {
    schedule(r, key, n, BIG).await;
    tally
        .config(port, key, "workers = 2\nbatch = 500")
        .amqp(&proxy.url(&amqp_url(), ""))
}

/// Once the queue drained (to `sizes`): [`report_figures`], then asserts that nothing is left
/// in Redis.
pub fn report_drained(
    fault: &str,
    n: usize,
    tally: &Tally,
    sizes: (i64, i64, i64),
    figures: &[(&str, &dyn Display)],
) {
    report_figures(fault, n, tally, figures);
    assert_eq!(sizes, (0, 0, 0), "nothing may stay in Redis");
}

/// [`report`]s a run with its `figures`, each printed as `name=value`.
pub fn report_figures(fault: &str, n: usize, tally: &Tally, figures: &[(&str, &dyn Display)]) {
    let extra: Vec<String> = figures.iter().map(|(k, v)| format!("{k}={v}")).collect();
    report(fault, n, 0, tally, &extra.join(" "));
}
