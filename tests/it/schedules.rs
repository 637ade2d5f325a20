//! Recurring schedules against real Redis and RabbitMQ: one fire per tick across bridges and a
//! SIGKILL, the misfire policies after every bridge stopped, a reload that changes the cron,
//! a pause around ticks, and schedules added and removed at run time.

use crate::common;

use std::time::Duration;

use common::*;
use delay_bridge::keys::QueueKeys;

/// The trigger with `schedules` (TOML `[[triggers.schedules]]` tables) for a bridge whose
/// metrics listen on `port`.
fn config(port: u16, key: &str, capture: &AmqpCapture, schedules: &str) -> String {
    base_config(port) + &amqp_trigger("sched", key, capture, "") + schedules
}

/// A `[[triggers.schedules]]` table.
fn schedule(name: &str, cron: &str, extra: &str) -> String {
    format!("\n[[triggers.schedules]]\nname = \"{name}\"\ncron = \"{cron}\"\nbody = \"{name}\"\n{extra}\n")
}

/// The ticks received from schedule `name`: (tick, local receive time), both epoch ms.
fn ticks(capture: &AmqpCapture, name: &str) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = capture
        .snapshot()
        .into_iter()
        .filter(|m| m.body == name.as_bytes())
        .filter(|m| {
            m.properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("x-delay-schedule").cloned())
                .is_some_and(|v| match v {
                    lapin::types::AMQPValue::LongString(s) => s.as_bytes() == name.as_bytes(),
                    _ => false,
                })
        })
        .map(|m| (m.due_ms.expect("x-delay-due-ms"), m.at_ms))
        .collect();
    out.sort();
    out
}

/// The queue's keys and its schedules' removed ([`cleanup_keys`]).
async fn clean(r: &mut Conn, key: &str) {
    cleanup_keys(r, key).await;
}

/// The end: no panic in `bridge`'s log, the bridge stopped, the queue's keys and schedule keys
/// removed.
async fn done(bridge: Bridge, r: &mut Conn, key: &str) {
    finish(bridge, r, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_bridges_fire_every_second_once_through_a_sigkill() {
    let (mut r, capture, key) = amqp_scene("sched", "sched", "sched").await;
    let every = schedule("every", "* * * * * *", "");
    let mut bridges = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        let b = Bridge::start(&config(port, &key, &capture, &every), port);
        bridges.push(b.ready(Duration::from_secs(20)).await);
    }
    let from = now_ms() + 1000;
    // The SIGKILL lands half-way between two ticks, when no tick is claimed: what is tested
    // is that the schedule fires each tick once while a bridge dies, not a claimed tick's
    // lease (a tick the dead bridge held would wait for its lease to expire, like any member).
    let kill_at = (from + 6000) / 1000 * 1000 + 500;
    tokio::time::sleep(Duration::from_millis((kill_at - now_ms()).max(0) as u64)).await;
    let _ = bridges[1].child.kill();
    let until = from + 15_000;
    assert!(
        wait_until(Duration::from_secs(25), || ticks(&capture, "every")
            .iter()
            .any(|(t, _)| *t > until + 1000))
        .await,
        "ticks stopped: {:?}",
        ticks(&capture, "every")
    );
    let seen: Vec<(i64, i64)> = ticks(&capture, "every")
        .into_iter()
        .filter(|(t, _)| (from..=until).contains(t))
        .collect();
    let expected: Vec<i64> = ((from / 1000 + 1)..=(until / 1000))
        .map(|s| s * 1000)
        .collect();
    let got: Vec<i64> = seen.iter().map(|(t, _)| *t).collect();
    assert_eq!(got, expected, "each second exactly once");
    let mut late: Vec<i64> = seen.iter().map(|(t, at)| at - t).collect();
    late.sort();
    assert!(late[0] >= -5, "fired early: {late:?}");
    let p99 = late[(late.len() * 99).div_ceil(100) - 1];
    assert!(p99 < 200, "p99 late {p99} ms: {late:?}");
    for b in &bridges {
        b.assert_no_panic();
    }
    drop(bridges);
    clean(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_and_all_after_every_bridge_stopped() {
    let (mut r, capture, key) = amqp_scene("misfire", "misfire", "misfire").await;
    let port = free_port();
    let schedules = schedule(
        "skip",
        "* * * * * *",
        "misfire = \"skip\"\nmisfire_grace = \"1s\"",
    ) + &schedule(
        "all",
        "* * * * * *",
        "misfire = \"all\"\nmisfire_grace = \"1s\"",
    );
    let cfg = config(port, &key, &capture, &schedules);
    let mut bridge = Bridge::start(&cfg, port)
        .ready(Duration::from_secs(20))
        .await;
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&capture, "all").len()
            >= 2)
        .await
    );
    let _ = bridge.child.kill();
    let _ = bridge.child.wait();
    let stopped = now_ms();
    // The outage itself: every bridge stopped for 6 s.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let bridge = Bridge::start(&cfg, port)
        .ready(Duration::from_secs(20))
        .await;
    let back = now_ms();
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&capture, "skip")
            .iter()
            .any(|(t, _)| *t > back + 2000))
        .await
    );
    let all: Vec<i64> = ticks(&capture, "all").iter().map(|(t, _)| *t).collect();
    let first = all[0];
    let last = *all.last().unwrap();
    let every_second: Vec<i64> = (first / 1000..=last / 1000).map(|s| s * 1000).collect();
    assert_eq!(
        all, every_second,
        "all: every tick fired once, the missed ones late"
    );
    let skip: Vec<i64> = ticks(&capture, "skip").iter().map(|(t, _)| *t).collect();
    let in_gap = skip
        .iter()
        .filter(|t| (stopped + 1000..back - 2000).contains(*t))
        .count();
    assert_eq!(
        in_gap, 0,
        "skip: no missed tick fired: {skip:?} stopped {stopped} back {back}"
    );
    let missed = bridge
        .metric(
            "delay_bridge_schedule_missed_ticks_total",
            &[("trigger", "sched"), ("schedule", "skip")],
        )
        .await;
    assert!(missed >= 3.0, "missed ticks counted: {missed}");
    let dup = skip.windows(2).any(|w| w[0] == w[1]);
    assert!(!dup, "skip fired a tick twice: {skip:?}");
    done(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_cron() {
    let (mut r, capture, key) = amqp_scene("recron", "recron", "recron").await;
    let port = free_port();
    let even = config(port, &key, &capture, &schedule("s", "*/2 * * * * *", ""));
    let bridge = Bridge::start(&even, port)
        .ready(Duration::from_secs(20))
        .await;
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&capture, "s").len() >= 2).await,
        "no ticks: {:?}\n{}",
        capture.snapshot().first(),
        bridge.log()
    );
    assert!(ticks(&capture, "s")
        .iter()
        .all(|(t, _)| (t / 1000) % 2 == 0));
    // `stats` shows the schedule's last and next fire; `check` the tzdb release.
    let stats = cli(&["stats", "--json"], &even, &[]);
    let v: serde_json::Value = serde_json::from_str(&stats.stdout).expect("stats --json");
    let row = &v[0]["schedules"][0];
    assert_eq!(row["name"], "s", "{v}");
    let (last, next) = (row["last_fire_ms"].as_i64(), row["next_fire_ms"].as_i64());
    assert!(
        last.is_some_and(|l| l % 2000 == 0)
            && next.is_some_and(|n| n % 2000 == 0 && n > last.unwrap()),
        "{v}"
    );
    let (code, said) = check(&even);
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("time zones: IANA tzdb 20")
            && said.contains("schedule s: cron=\"*/2 * * * * *\""),
        "{said}"
    );
    let odd = config(port, &key, &capture, &schedule("s", "1-59/2 * * * * *", ""));
    bridge.reload(&odd).await;
    let reloaded = now_ms();
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&capture, "s")
            .iter()
            .filter(|(t, _)| *t > reloaded + 2500)
            .count()
            >= 2)
        .await
    );
    let after: Vec<i64> = ticks(&capture, "s")
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t > reloaded + 2500)
        .collect();
    assert!(
        after.iter().all(|t| (t / 1000) % 2 == 1),
        "odd seconds after the reload: {after:?}"
    );
    done(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_ticks_and_skip_drops_the_missed_ones() {
    let (mut r, capture, key) = amqp_scene("schedpause", "schedpause", "schedpause").await;
    let port = free_port();
    let cfg = config(
        port,
        &key,
        &capture,
        &schedule("p", "* * * * * *", "misfire_grace = \"1s\""),
    );
    let bridge = Bridge::start(&cfg, port)
        .ready(Duration::from_secs(20))
        .await;
    assert!(wait_until(Duration::from_secs(10), || ticks(&capture, "p").len() >= 2).await);
    let control = QueueKeys::derive(&key).unwrap().control;
    hset(&mut r, &control, "paused", "1").await;
    let paused = now_ms();
    // Ticks fall due for 5 s while the trigger is paused.
    tokio::time::sleep(Duration::from_secs(5)).await;
    hdel(&mut r, &control, "paused").await;
    let resumed = now_ms();
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&capture, "p")
            .iter()
            .any(|(t, _)| *t > resumed + 1000))
        .await,
        "ticks resume"
    );
    let held: Vec<(i64, i64)> = ticks(&capture, "p")
        .into_iter()
        .filter(|(t, _)| (paused + 1000..resumed - 2000).contains(t))
        .collect();
    assert!(
        held.is_empty(),
        "ticks missed during the pause fired: {held:?}"
    );
    let fired_while_paused = ticks(&capture, "p")
        .iter()
        .filter(|(_, at)| (paused + 200..resumed).contains(at))
        .count();
    assert_eq!(fired_while_paused, 0, "nothing fires while paused");
    done(bridge, &mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_added_at_run_time_fires_until_removed() {
    let (mut r, capture, key) = amqp_scene("rtsched", "rtsched", "rtsched").await;
    clean(&mut r, &key).await;
    let port = free_port();
    let conf = config(port, &key, &capture, &schedule("yearly", "0 0 0 1 1 *", ""));
    let bridge = Bridge::start(&conf, port)
        .ready(Duration::from_secs(20))
        .await;
    let add = |extra: &[&str]| {
        let mut args = vec!["schedule", "add", "-t", "sched"];
        args.extend_from_slice(extra);
        cli(&args, &conf, &[])
    };
    // The config's checks, every problem at once; a name of the config's is refused.
    let bad = add(&[
        "--name",
        "a b",
        "--cron",
        "61 * * * * *",
        "--timezone",
        "Nowhere/City",
        "--catch-up-limit",
        "0",
        "--body",
        "x",
    ]);
    assert_eq!(bad.code, 65, "{}", bad.text());
    for option in ["--name", "--cron", "--timezone", "--catch-up-limit"] {
        assert!(
            bad.stderr.contains(&format!("error: {option}: ")),
            "{option}: {}",
            bad.stderr
        );
    }
    let taken = add(&["--name", "yearly", "--cron", "* * * * * *", "--body", "x"]);
    assert_eq!(taken.code, 65, "{}", taken.text());
    assert!(taken.stderr.contains("in its config"), "{}", taken.stderr);
    // Added: every running bridge picks it up and its ticks reach the broker.
    let added = add(&["--name", "rt", "--cron", "* * * * * *", "--body", "rt"]);
    assert_eq!(added.code, 0, "{}", added.text());
    let at = now_ms();
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&capture, "rt").len() >= 3).await,
        "no ticks: {:?}\n{}",
        capture.snapshot().first(),
        bridge.log()
    );
    let first = ticks(&capture, "rt")[0].0;
    assert!(
        first > at - 1000 && first <= at + 3000,
        "first tick {first}, added at {at}"
    );
    let again = add(&["--name", "rt", "--cron", "*/5 * * * * *", "--body", "rt"]);
    assert_eq!(again.code, 65, "{}", again.text());
    // `list` shows both with their source and fires.
    let list = cli(&["schedule", "list", "-t", "sched", "--json"], &conf, &[]);
    let v: serde_json::Value =
        serde_json::from_str(&list.stdout).unwrap_or_else(|_| panic!("{}", list.text()));
    assert_eq!(v[0]["name"], "yearly", "{v}");
    assert_eq!(v[0]["source"], "config", "{v}");
    assert_eq!(v[1]["name"], "rt", "{v}");
    assert_eq!(v[1]["source"], "runtime", "{v}");
    assert!(
        v[1]["last_fire_ms"].as_i64().is_some_and(|l| l % 1000 == 0),
        "{v}"
    );
    assert!(
        v[1]["next_fire_ms"].as_i64() > v[1]["last_fire_ms"].as_i64(),
        "{v}"
    );
    // Removed: no tick after the one already enqueued.
    let removed = cli(
        &["schedule", "remove", "-t", "sched", "--name", "rt"],
        &conf,
        &[],
    );
    assert_eq!(removed.code, 0, "{}", removed.text());
    let gone = now_ms();
    let missing = cli(
        &["schedule", "remove", "-t", "sched", "--name", "rt"],
        &conf,
        &[],
    );
    assert_eq!(missing.code, 65, "{}", missing.text());
    let late = |t: &(i64, i64)| t.0 > gone + 1000;
    assert!(
        !wait_until(Duration::from_secs(4), || ticks(&capture, "rt")
            .iter()
            .any(late))
        .await,
        "ticks after the removal at {gone}: {:?}",
        ticks(&capture, "rt")
    );
    let list = cli(&["schedule", "list", "-t", "sched"], &conf, &[]);
    assert!(!list.stdout.contains("\nrt\t"), "{}", list.stdout);
    bridge.assert_no_panic();
    done(bridge, &mut r, &key).await;
}

/// A trigger without schedules has no schedule task while it has nothing to fire: the change
/// notification of an added schedule starts one, and again after the last one was removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_without_schedules_fires_one_added_at_run_time() {
    let (mut r, capture, key) = amqp_scene("rtnone", "rtnone", "rtnone").await;
    clean(&mut r, &key).await;
    let port = free_port();
    let conf = config(port, &key, &capture, "");
    let bridge = Bridge::start(&conf, port)
        .ready(Duration::from_secs(20))
        .await;
    let run = |args: &[&str]| {
        let out = cli(args, &conf, &[]);
        assert_eq!(out.code, 0, "{}", out.text());
    };
    for round in ["first", "again"] {
        run(&[
            "schedule",
            "add",
            "-t",
            "sched",
            "--name",
            round,
            "--cron",
            "* * * * * *",
            "--body",
            round,
        ]);
        assert!(
            wait_until(Duration::from_secs(10), || ticks(&capture, round).len()
                >= 2)
            .await,
            "{round}: no ticks\n{}",
            bridge.log()
        );
        run(&["schedule", "remove", "-t", "sched", "--name", round]);
        // The tick already enqueued may still fire; none after it.
        let gone = now_ms();
        let late = |t: &(i64, i64)| t.0 > gone + 1000;
        assert!(
            !wait_until(Duration::from_secs(4), || ticks(&capture, round)
                .iter()
                .any(late))
            .await,
            "{round}: ticks after the removal at {gone}: {:?}",
            ticks(&capture, round)
        );
    }
    bridge.assert_no_panic();
    done(bridge, &mut r, &key).await;
}
