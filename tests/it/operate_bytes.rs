//! The operator's commands with any bytes against real Redis: payloads from standard input,
//! a file or base64 (1 MB included), members that are not UTF-8 given back the same three
//! ways to every command that takes one, the infinite due times in words; the listing of
//! what is in flight, and purging dead letters by reason.

use crate::common;

use std::time::Duration;

use common::*;
use delay_bridge::keys::QueueKeys;
use delay_bridge::wire::MessageId;

/// A fresh inline queue key in the `{bytes}` slot, and a config whose trigger `ops` drains it.
fn bytes_queue(prefix: &str) -> (String, String) {
    let key = format!("{}:{{bytes}}", unique(prefix));
    let trigger = trigger("ops", &key, "rabbit", "exchange = \"x\"\n");
    (base_config(free_port()) + &trigger, key)
}

fn run(args: &[&str], config: &str) -> Output {
    let mut all = args.to_vec();
    all.extend(["-t", "ops"]);
    cli(&all, config, &[])
}

fn run_stdin(args: &[&str], config: &str, stdin: &[u8]) -> Output {
    let mut all = args.to_vec();
    all.extend(["-t", "ops"]);
    cli_stdin(&all, config, stdin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_payload_goes_in_by_standard_input_or_file_and_out_by_the_same_forms() {
    let mut r = redis().await;
    let (config, key) = bytes_queue("bytes-big");
    let big: Vec<u8> = (0..1_048_576u32).map(|i| b'a' + (i % 26) as u8).collect();
    let out = run_stdin(&["enqueue", "--delay", "1h", "-"], &config, &big);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("1048576 B"), "{}", out.stdout);
    assert!(
        zscore_text(&mut r, &key, &big).await.is_some(),
        "stored byte for byte"
    );

    // From a file: another megabyte, not UTF-8.
    let mut other = big.clone();
    other[0] = 0xff;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, &other).unwrap();
    let path = file.to_str().unwrap();
    let out = run(&["enqueue", "--delay", "1h", "--file", path], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(zscore_text(&mut r, &key, &other).await.is_some());
    assert_eq!(zcard(&mut r, &key).await, 2);

    // `show` takes the member the same ways; it is listed cut, with its size.
    let out = run_stdin(&["show", "-"], &config, &big);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("scheduled: due"), "{}", out.stdout);
    let out = run(&["browse"], &config);
    assert!(out.stdout.contains("(1048576 B)"), "{}", out.stdout);

    // Cancel by standard input and by file.
    let out = run_stdin(&["cancel", "-"], &config, &big);
    assert_eq!(out.code, 0, "{}", out.text());
    let out = run(&["cancel", "--file", path], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(zcard(&mut r, &key).await, 0);
    // A literal `-` is never the payload.
    let out = run_stdin(&["enqueue", "-"], &config, b"from stdin");
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(zscore_text(&mut r, &key, b"from stdin").await.is_some());
    assert!(zscore_text(&mut r, &key, b"-").await.is_none());
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_member_is_printed_pasteable_and_parked_or_now_in_words() {
    let mut r = redis().await;
    let (config, key) = bytes_queue("bytes-bin");
    let member = b"\xff\x00bin\n".to_vec();
    let b64 = "/wBiaW4K";
    let out = run(&["enqueue", "--at", "+inf", "--base64", b64], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(
        zscore_text(&mut r, &key, &member).await.as_deref(),
        Some("inf")
    );

    // Listed escaped for a shell, in base64 with --json, parked in words.
    let out = run(&["browse"], &config);
    assert!(out.stdout.contains(r"$'\xff\x00bin\n'"), "{}", out.stdout);
    assert!(out.stdout.contains("parked (+inf)"), "{}", out.stdout);
    assert!(
        !out.stdout.contains("9223372036854775807"),
        "{}",
        out.stdout
    );
    let out = run(&["browse", "--json"], &config);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["items"][0]["member_b64"], b64, "{v}");
    assert_eq!(v["items"][0]["due"], "parked (+inf)");

    // `show` by base64: the member, its consumer id, parked.
    let id = MessageId::new(&key, &member).as_str().to_string();
    let out = run(&["show", "--base64", b64], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    for needle in [r"$'\xff\x00bin\n'", b64, &id, "parked (+inf)"] {
        assert!(out.stdout.contains(needle), "{needle}: {}", out.stdout);
    }
    let out = run(&["show", "--json", "--base64", b64], &config);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        (&v["member_b64"], &v["consumer_id"]),
        (&b64.into(), &id.clone().into())
    );

    // Promote: due now; reschedule to `-inf` (now, ahead of all) and back to `park`.
    let out = run(&["promote", "--base64", b64], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    let now = redis_now(&mut r).await;
    let due: f64 = zscore_text(&mut r, &key, &member)
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!((due as i64) <= now && (due as i64) > now - 60_000, "{due}");
    let out = run(&["reschedule", "--at", "-inf", "--base64", b64], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(
        zscore_text(&mut r, &key, &member).await.as_deref(),
        Some("-inf")
    );
    let out = run(&["show", "--base64", b64], &config);
    assert!(out.stdout.contains("now (-inf)"), "{}", out.stdout);
    let out = run(&["browse", "--from", "-inf", "--to", "-inf"], &config);
    assert!(out.stdout.contains("-inf"), "{}", out.stdout);
    assert!(out.stdout.contains(r"$'\xff"), "{}", out.stdout);
    let out = run(&["reschedule", "--at", "park", "--base64", b64], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(
        zscore_text(&mut r, &key, &member).await.as_deref(),
        Some("inf")
    );

    // A dead letter with that member: listed in base64, requeued by base64.
    let keys = QueueKeys::derive(&key).unwrap();
    let _: () = redis::pipe()
        .zrem(&key, &member)
        .zadd(&keys.dead, &member, now)
        .hset(
            &keys.dead_reasons,
            &member,
            r#"{"reason":"nack","attempts":1}"#,
        )
        .query_async(&mut r)
        .await
        .unwrap();
    let out = cli(
        &["dead-letter", "list", "-t", "ops", "--json"],
        &config,
        &[],
    );
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["items"][0]["member_b64"], b64, "{v}");
    let out = cli(
        &[
            "dead-letter",
            "requeue",
            "-t",
            "ops",
            "--base64",
            "--member",
            b64,
        ],
        &config,
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(zscore_text(&mut r, &key, &member).await.is_some());

    // Cancel by base64.
    let out = run(&["cancel", "--base64", b64], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(zcard(&mut r, &key).await, 0);
    // What is not base64 is refused, naming the flag.
    let out = run(&["show", "--base64", "***"], &config);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("--base64"), "{}", out.text());
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_messages_are_listed_with_their_lease_ends_and_dead_letters_purged_by_reason() {
    let mut r = redis().await;
    let (config, key) = bytes_queue("bytes-lease");
    schedule_now(&mut r, &key, ["leased-1", "leased-2"]).await;
    let store = store(&key).await;
    let claimed = store.claim(10, Duration::from_secs(600)).await.unwrap();
    assert_eq!(claimed.items.len(), 2);
    let out = run(&["in-flight"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    let id = MessageId::new(&key, b"leased-1").as_str().to_string();
    for needle in ["LEASE_ENDS", "leased-1", "leased-2", &id, "Z", "9m"] {
        assert!(out.stdout.contains(needle), "{needle}: {}", out.stdout);
    }
    let out = run(&["in-flight", "--json"], &config);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 2, "{v}");

    let now = redis_now(&mut r).await;
    for (member, reason) in [("n1", "nack"), ("n2", "nack"), ("t1", "too_large")] {
        let why = format!(r#"{{"reason":"{reason}","attempts":1}}"#);
        dead_letter(&mut r, &key, member, now, &why).await;
    }
    let out = run(&["purge", "--dead", "--reason", "nack"], &config);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stdout
            .contains("would delete 2 dead letters with reason `nack`"),
        "{}",
        out.stdout
    );
    let out = run(&["purge", "--dead", "--reason", "nack", "--yes"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("deleted 2"), "{}", out.stdout);
    let keys = QueueKeys::derive(&key).unwrap();
    assert_eq!(zcard(&mut r, &keys.dead).await, 1, "too_large stays");
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_due_at_minus_infinity_has_no_age_and_hides_none_behind_it() {
    let mut r = redis().await;
    let key = format!("{}:{{bytes}}", unique("bytes-age"));
    zadd(&mut r, &key, "-inf", "at-once").await;
    let s = store(&key).await;
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.due, stats.oldest_due_age_seconds), (1, 0.0));
    let now = redis_now(&mut r).await;
    zadd(&mut r, &key, now - 5_000, "five-seconds-late").await;
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.due, 2);
    let age = stats.oldest_due_age_seconds;
    assert!(
        (5.0..60.0).contains(&age),
        "the finite member's age, not -inf's: {age}"
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_is_shown_and_found_by_the_id_it_sets() {
    let mut r = redis().await;
    let key = format!("{}:{{bytes}}", unique("bytes-env"));
    let lines = "exchange = \"x\"\nformat = \"envelope\"\n";
    let config = base_config(free_port()) + &trigger("ops", &key, "rabbit", lines);
    let envelope = r#"{"body":"hello","id":"order-9"}"#;
    let out = run(&["enqueue", "--delay", "1h", envelope], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    let out = run(&["show", "order-9"], &config);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(
        out.stdout.contains("consumer id: order-9"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains(envelope), "{}", out.stdout);
    let out = run(&["browse", "--json"], &config);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["items"][0]["consumer_id"], "order-9", "{v}");
    cleanup_keys(&mut r, &key).await;
}
