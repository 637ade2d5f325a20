//! The operator's commands against real Redis: browse pages through ties and a member
//! claimed mid-way, show finds every copy, forecast counts per bucket, promote and
//! reschedule keep attempt counts, purge asks first and keeps what is in flight.

use crate::common;

use std::collections::BTreeSet;

use common::*;
use delay_bridge::keys::QueueKeys;

/// The due time of scheduled `member`, epoch ms.
async fn due_of(r: &mut Conn, key: &str, member: &str) -> i64 {
    let due: f64 = redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(r)
        .await
        .unwrap();
    due as i64
}

/// A fresh queue key in the `{ops}` hash slot, and a config whose trigger `ops` drains it
/// (with `extra` lines in the trigger).
fn ops_queue(prefix: &str, extra: &str) -> (String, String) {
    let key = format!("{}:{{ops}}", unique(prefix));
    let trigger = trigger("ops", &key, "rabbit", &format!("exchange = \"x\"\n{extra}"));
    (base_config(free_port()) + &trigger, key)
}

fn run(args: &[&str], config: &str) -> Output {
    let mut all = args.to_vec();
    all.extend(["-t", "ops"]);
    cli(&all, config, &[])
}

/// Every page of `browse --json` from the start: the members in order.
fn browse_all(config: &str, extra: &[&str], limit: usize) -> (Vec<String>, usize) {
    let mut members = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let limit_text = limit.to_string();
        let mut args = vec!["browse", "--json", "--limit", &limit_text];
        args.extend(extra);
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let out = run(&args, config);
        assert_eq!(out.code, 0, "{}", out.text());
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        pages += 1;
        for item in v["items"].as_array().unwrap() {
            members.push(item["member"].as_str().unwrap().to_string());
        }
        match v["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return (members, pages),
        }
        assert!(pages < 100, "paging does not end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browse_pages_through_ties_and_survives_a_claimed_cursor() {
    let mut r = redis().await;
    let (config, key) = ops_queue("browse", "");
    let now = redis_now(&mut r).await;
    // 250 members on 25 due times: ten share each, so pages end mid-tie.
    let members: Vec<(i64, String)> = (0..250)
        .map(|i| (now + 60_000 + (i / 10) * 1000, format!("m-{i:03}")))
        .collect();
    zadd_all(&mut r, &key, members.iter().cloned()).await;

    let (seen, pages) = browse_all(&config, &[], 40);
    let want: Vec<String> = members.iter().map(|(_, m)| m.clone()).collect();
    assert_eq!(seen, want, "every member once, in due order");
    assert_eq!(pages, 7);

    // A due-time window.
    let from = (now + 60_000 + 5_000).to_string();
    let to = (now + 60_000 + 6_000).to_string();
    let (window, _) = browse_all(&config, &["--from", &from, "--to", &to], 7);
    assert_eq!(window, want[50..70].to_vec());

    // The cursor's member is claimed between two pages: the next page starts right after
    // where it was, and nothing after it is lost or repeated.
    let first = run(&["browse", "--json", "--limit", "35"], &config);
    let v: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    let cursor = v["next"].as_str().unwrap().to_string();
    let last = v["items"][34]["member"].as_str().unwrap().to_string();
    assert_eq!(last, "m-034");
    let _: i64 = redis::cmd("ZREM")
        .arg(&key)
        .arg(&last)
        .query_async(&mut r)
        .await
        .unwrap();
    let next = run(
        &["browse", "--json", "--limit", "10", "--after", &cursor],
        &config,
    );
    let v: serde_json::Value = serde_json::from_str(&next.stdout).unwrap();
    let next = item_members(&v);
    assert_eq!(
        next,
        want[35..45].to_vec(),
        "the rest of the cursor's tie, then on"
    );

    let table = run(&["browse", "--limit", "2"], &config);
    assert!(table.stdout.contains("m-000") && table.stdout.contains("next page: --after "));
    let bad = run(&["browse", "--limit", "5000"], &config);
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr.contains("--limit must be between 1 and 1000"),
        "{}",
        bad.text()
    );
    let bad = run(&["browse", "--after", "nonsense"], &config);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("not a cursor"), "{}", bad.text());
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forecast_show_promote_reschedule_and_purge() {
    let mut r = redis().await;
    let (config, key) = ops_queue("act", "");
    let now = redis_now(&mut r).await;
    let schedule: Vec<(i64, &str)> = vec![
        (now - 5_000, "late-1"),
        (now - 4_000, "late-2"),
        (now + 20_000, "soon-1"),
        (now + 30_000, "soon-2"),
        (now + 90_000, "next-1"),
        (now + 7_200_000, "far-1"),
    ];
    zadd_all(&mut r, &key, schedule.iter().cloned()).await;
    // far-1 failed twice already (its attempt entry names its due time).
    let keys = QueueKeys::derive(&key).unwrap();
    hset(
        &mut r,
        &keys.attempts,
        "far-1",
        format!("2:{}", now + 7_200_000),
    )
    .await;

    forecast_and_show(&config);
    promote_and_reschedule(&mut r, &key, &config, now).await;
    purge_a_range(&mut r, &key, &config, now).await;

    dead_letter(&mut r, &key, "dead-1", now, r#"{"reason":"nack"}"#).await;
    assert!(run(&["show", "dead-1"], &config).stdout.contains("nack"));
    let purged = run(&["purge", "--dead", "--yes"], &config);
    assert!(
        purged.stdout.contains("deleted 1 dead letters"),
        "{}",
        purged.stdout
    );
    assert_eq!(zcard(&mut r, &keys.dead).await, 0);
    assert_eq!(hlen(&mut r, &keys.dead_reasons).await, 0);
    cleanup_keys(&mut r, &key).await;
}

/// `forecast` counts the overdue, the buckets and the later ones; `show` tells a member's
/// attempts, and that an unknown one is nowhere.
fn forecast_and_show(config: &str) {
    let out = run(
        &["forecast", "--json", "--bucket", "1m", "--buckets", "3"],
        config,
    );
    assert_eq!(out.code, 0, "{}", out.text());
    let f: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(f["overdue"], 2);
    assert_eq!(f["buckets"], serde_json::json!([2, 1, 0]));
    assert_eq!(f["later"], 1);
    assert_eq!(f["bucket_ms"], 60_000);

    let shown = run(&["show", "far-1"], config);
    assert_eq!(shown.code, 0);
    assert!(
        shown.stdout.contains("scheduled: due") && shown.stdout.contains("2 failed attempts"),
        "{}",
        shown.stdout
    );
    let missing = run(&["show", "nobody"], config);
    assert_eq!(missing.code, 1);
    assert!(
        missing
            .stdout
            .contains("is no member and no consumer id of a message scheduled, in flight or dead"),
        "{}",
        missing.stdout
    );
}

/// Promote: due now, attempts kept; an already-due member is left alone. Reschedule: an hour
/// from `now`, attempts kept.
async fn promote_and_reschedule(r: &mut Conn, key: &str, config: &str, now: i64) {
    let promoted = run(&["promote", "far-1", "late-1", "nobody"], config);
    assert_eq!(
        promoted.code,
        1,
        "not every member moved: {}",
        promoted.text()
    );
    assert!(
        promoted.stdout.contains("promoted 1 of 3"),
        "{}",
        promoted.stdout
    );
    let due = due_of(r, key, "far-1").await;
    assert!(due <= redis_now(r).await);
    assert!(run(&["show", "far-1"], config)
        .stdout
        .contains("2 failed attempts"));
    let late = due_of(r, key, "late-1").await;
    assert_eq!(late, now - 5_000);

    // Reschedule: an hour from now.
    let moved = run(&["reschedule", "--delay", "1h", "far-1"], config);
    assert_eq!(moved.code, 0, "{}", moved.text());
    let due = due_of(r, key, "far-1").await;
    assert!((due - (now + 3_600_000)).abs() < 60_000);
    assert!(run(&["show", "far-1"], config)
        .stdout
        .contains("2 failed attempts"));
}

/// Purge asks first; deletes only the range; a copy in flight stays.
async fn purge_a_range(r: &mut Conn, key: &str, config: &str, now: i64) {
    let keys = QueueKeys::derive(key).unwrap();
    zadd(r, &keys.inflight, now + 30_000, "soon-1").await;
    let asked = run(
        &["purge", "--scheduled", "--to", &(now + 60_000).to_string()],
        config,
    );
    assert_eq!(asked.code, 1);
    assert!(
        asked.stdout.contains("would delete 4 scheduled messages"),
        "{}",
        asked.stdout
    );
    assert_eq!(zcard(r, key).await, 6, "nothing deleted without --yes");
    let purged = run(
        &[
            "purge",
            "--scheduled",
            "--to",
            &(now + 60_000).to_string(),
            "--yes",
        ],
        config,
    );
    assert_eq!(purged.code, 0, "{}", purged.text());
    assert!(
        purged.stdout.contains("deleted 4 scheduled messages"),
        "{}",
        purged.stdout
    );
    let left = zmembers(r, key).await;
    assert_eq!(
        left.into_iter().collect::<BTreeSet<_>>(),
        BTreeSet::from(["next-1".to_string(), "far-1".to_string()])
    );
    assert_eq!(
        zcard(r, &keys.inflight).await,
        1,
        "in flight is not the operator's to purge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_mode_browses_bodies_and_purge_keeps_a_body_still_needed() {
    let mut r = redis().await;
    let (config, key) = ops_queue("hash", "payload = \"hash\"\n");
    let keys = QueueKeys::derive(&key).unwrap();
    let now = redis_now(&mut r).await;
    for (id, body) in [("a", "body of a"), ("b", "body of b")] {
        let _: () = redis::cmd("HSET")
            .arg(&keys.bodies)
            .arg(id)
            .arg(body)
            .query_async(&mut r)
            .await
            .unwrap();
        zadd(&mut r, &key, now + 60_000, id).await;
    }
    let out = run(&["browse", "--json"], &config);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["items"][0]["body_preview"], "body of a");
    assert_eq!(v["items"][1]["body_size"], 9);
    assert!(run(&["show", "b"], &config)
        .stdout
        .contains("body (9 B): body of b"));

    // `a` is also dead-lettered (an earlier copy): its body stays; `b`'s goes.
    zadd(&mut r, &keys.dead, now, "a").await;
    let purged = run(&["purge", "--scheduled", "--yes"], &config);
    assert!(
        purged.stdout.contains("deleted 2 scheduled messages"),
        "{}",
        purged.stdout
    );
    let bodies: Vec<String> = redis::cmd("HKEYS")
        .arg(&keys.bodies)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(bodies, ["a"]);
    cleanup_keys(&mut r, &key).await;
}

/// Every time argument takes what a person types: RFC 3339 (with `Z` or an offset), epoch
/// ms, `now` and offsets from now, relative ones on the Redis clock; a wrong one is one line
/// saying what is accepted, exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_arguments_take_rfc3339_now_and_offsets() {
    let mut r = redis().await;
    let (config, key) = ops_queue("when", "");
    let out = run(&["enqueue", "--at", "2030-01-01T00:00:00Z", "rfc"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(due_of(&mut r, &key, "rfc").await, 1_893_456_000_000);
    let out = run(
        &["enqueue", "--at", "2030-01-01T01:00:00+01:00", "offset"],
        &config,
    );
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(due_of(&mut r, &key, "offset").await, 1_893_456_000_000);
    let before = redis_now(&mut r).await;
    let out = run(&["enqueue", "--at", "+5m", "later"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    let after = redis_now(&mut r).await;
    let due = due_of(&mut r, &key, "later").await;
    assert!((before + 300_000..=after + 300_000).contains(&due), "{due}");
    let out = run(&["enqueue", "--at", "now", "now"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    let out = run(&["reschedule", "--at", "-1h", "later"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    let due = due_of(&mut r, &key, "later").await;
    assert!(due < redis_now(&mut r).await - 3_500_000, "{due}");
    // Due before now: `later` and `now`; not the two due in 2030.
    let (members, _) = browse_all(&config, &["--to", "now"], 10);
    assert_eq!(members, ["later", "now"]);
    let (members, _) = browse_all(&config, &["--from", "2029-12-31T23:59:59Z"], 10);
    assert_eq!(members.len(), 2, "{members:?}");
    let out = run(
        &["purge", "--scheduled", "--from", "now", "--to", "+3650d"],
        &config,
    );
    assert!(out.stdout.contains("would delete 2 "), "{}", out.text());
    let out = run(&["browse", "--from", "tomorrow"], &config);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(
        out.stderr.contains("RFC 3339") && !out.stderr.contains("invalid digit"),
        "{}",
        out.text()
    );
    let out = cli(&["promote", "--help"], &config, &[]);
    assert!(
        !out.stdout.contains("--at") && !out.stdout.contains("--delay"),
        "{}",
        out.text()
    );
    cleanup_keys(&mut r, &key).await;
}

/// With Redis down, a command says so in one line, naming the address once.
#[test]
fn redis_down_is_one_line_naming_the_address_once() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let config = base_config(free_port()).replace(&redis_url(), &url)
        + &trigger("ops", "k", "rabbit", "exchange = \"x\"\n");
    let out = cli(&["stats"], &config, &[]);
    assert_eq!(out.code, 1, "{}", out.text());
    let line = out.stderr.trim();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.starts_with("error: cannot reach Redis"), "{line}");
    assert_eq!(line.matches(&url).count(), 1, "{line}");
}

/// `browse` prints a member the way `show` takes it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browsed_member_pastes_into_show() {
    let mut r = redis().await;
    let (config, key) = ops_queue("paste", "");
    let member = r#"{"x":"paste-test"}"#;
    let due = redis_now(&mut r).await + 60_000;
    zadd(&mut r, &key, due, member).await;
    let out = run(&["browse"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    let printed = out
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .rsplit("  ")
        .next()
        .unwrap();
    assert_eq!(printed, member, "{}", out.text());
    let out = run(&["show", printed], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("scheduled"), "{}", out.text());
    cleanup_keys(&mut r, &key).await;
}
