//! The HTTP sink against a real HTTP endpoint on loopback: delivery, retries, dead letters,
//! `Retry-After`, timeouts, `max_concurrency`, a trickle beside a herd (here); an endpoint
//! down, SIGKILL (`faults`); allowed URLs, link-local addresses, the signature and TLS
//! (`safety`).

mod blame;
mod faults;
mod safety;

use crate::common;

use std::time::Duration;

use common::webhook::*;
use common::*;
use delay_bridge::keys::QueueKeys;

/// A config with the HTTP sink `hooks` (`settings` as TOML values) and one trigger `hooks`
/// on `key` with `lines`.
pub(super) fn http_config(port: u16, settings: &[(&str, &str)], key: &str, lines: &str) -> String {
    ConfigToml::base(port)
        .without("sinks.rabbit")
        .http_sink("hooks", settings)
        .to_string()
        + &trigger("hooks", key, "hooks", lines)
}

/// A bridge on a free port with [`http_config`]'s sink and trigger.
pub(super) fn http_bridge(key: &str, lines: &str) -> Bridge {
    http_bridge_with(&[], key, lines)
}

/// [`http_bridge`] with `settings` for the sink.
pub(super) fn http_bridge_with(settings: &[(&str, &str)], key: &str, lines: &str) -> Bridge {
    let port = free_port();
    Bridge::start(&http_config(port, settings, key, lines), port)
}

/// A fresh key with a hash tag.
pub(super) fn new_key(tag: &str) -> String {
    format!("{}:{{{tag}}}", unique("delay"))
}

/// A fresh key with a hash tag and `n` messages ([`body`]) due now.
pub(super) async fn scheduled(r: &mut Conn, tag: &str, n: usize) -> String {
    let key = new_key(tag);
    schedule(r, &key, n, 0).await;
    key
}

/// A trigger's lines: `hook`'s `/` as the URL, then `extra`.
pub(super) fn hook_lines(hook: &Webhook, extra: &str) -> String {
    format!("url = {}\n{extra}", quoted(&hook.url("/")))
}

/// Waits until the queue is empty with nothing dead-lettered, and asserts that `hook` got
/// each of the `n` messages ([`body`]).
pub(super) async fn expect_all_delivered(
    r: &mut Conn,
    key: &str,
    n: usize,
    hook: &Webhook,
    bridge: &Bridge,
) {
    expect_settled(r, key, 0, bridge).await;
    assert_none_lost(&hook.tally(), n);
}

/// Asserts that all `n` messages of `key` are still in Redis (waiting or in flight), none
/// dead-lettered and no attempt counted: what an endpoint's own failure leaves.
pub(super) async fn expect_kept(r: &mut Conn, key: &str, n: i64) {
    let (waiting, inflight, dead) = queue_sizes(r, key).await;
    assert_eq!(dead, 0, "nothing dead-lettered");
    assert_eq!(waiting + inflight, n, "every message still in Redis");
    let keys = QueueKeys::derive(key).unwrap();
    assert_eq!(hlen(r, &keys.attempts).await, 0, "no attempt counted");
}

/// Quick retries, for tests that watch them.
pub(super) const FAST_RETRY: &str = "backoff_initial = \"100ms\"\nbackoff_max = \"200ms\"\n";

/// Waits until the queue's source and in-flight sets are empty and `dead` are dead letters.
pub(super) async fn expect_settled(r: &mut Conn, key: &str, dead: i64, bridge: &Bridge) {
    let sizes = wait_sizes(r, key, Duration::from_secs(30), |s| *s == (0, 0, dead)).await;
    assert_eq!(sizes, (0, 0, dead), "{}", bridge.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_delivers_every_message_once_with_the_bridge_headers() {
    let mut r = redis().await;
    let hook = Webhook::ok().await;
    let n = 50;
    let key = scheduled(&mut r, "ok", n).await;
    let lines = format!("url = {}\nbatch = 10", quoted(&hook.url("/orders")));
    let bridge = http_bridge(&key, &lines)
        .ready(Duration::from_secs(20))
        .await;
    expect_settled(&mut r, &key, 0, &bridge).await;
    let tally = hook.tally();
    for i in 0..n {
        assert_eq!(tally.get(&body(i, 0)), Some(&1), "message {i} once");
    }
    for rq in hook.received() {
        assert_eq!(rq.method, "POST");
        assert_eq!(rq.path, "/orders");
        assert_eq!(rq.header("x-delay-trigger"), "hooks");
        assert_eq!(rq.header("x-delay-attempt"), "1");
        assert_eq!(rq.header("x-delay-id").len(), 16);
        assert_eq!(rq.header("x-delay-id"), rq.header("idempotency-key"));
        assert!(rq.header("x-delay-due-ms").parse::<i64>().unwrap() > 0);
        assert!(
            rq.header("x-delay-signature").is_empty(),
            "no secret, no signature"
        );
    }
    let scrape = bridge.scrape().await;
    let samples = parse_samples(&scrape);
    let class = |c: &str| {
        samples
            .iter()
            .find(|s| {
                s.name == "delay_bridge_http_responses_total"
                    && s.has(&[("sink", "hooks"), ("class", c)])
            })
            .map(|s| s.value)
    };
    assert_eq!(class("2xx"), Some(n as f64));
    assert_eq!(
        class("5xx"),
        Some(0.0),
        "every class exported from the start"
    );
    assert_eq!(class("timeout"), Some(0.0));
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_tried_again_without_an_attempt_and_then_delivered() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, before| match before {
        0 => Answer::status(503).body("try later"),
        _ => Answer::status(200),
    })
    .await;
    let n = 10;
    let key = scheduled(&mut r, "retry", n).await;
    let lines = hook_lines(&hook, FAST_RETRY);
    let bridge = http_bridge(&key, &lines);
    expect_settled(&mut r, &key, 0, &bridge).await;
    let tally = hook.tally();
    for i in 0..n {
        assert_eq!(
            tally.get(&body(i, 0)),
            Some(&2),
            "message {i}: a 503, then a 200"
        );
    }
    // The endpoint's failure: the trigger was held, no attempt counted.
    for i in 0..n {
        let attempts: Vec<String> = hook
            .received()
            .iter()
            .filter(|rq| rq.body == body(i, 0))
            .map(|rq| rq.header("x-delay-attempt").to_string())
            .collect();
        assert_eq!(attempts, ["1", "1"]);
    }
    let retried = bridge
        .metric(
            "delay_bridge_messages_retried_total",
            &[("trigger", "hooks"), ("reason", "http_503")],
        )
        .await;
    assert_eq!(retried, 0.0, "{}", bridge.scrape().await);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_is_dead_lettered_with_an_excerpt_of_the_answer() {
    let mut r = redis().await;
    let answer = format!("invalid order: field `sku` missing {}", "x".repeat(4000));
    // Three bad messages among good ones: the 400 is theirs, not the endpoint's.
    let n = 3;
    let bad: Vec<Vec<u8>> = (0..n).map(|i| body(i, 0)).collect();
    let hook = Webhook::start(move |rq, _| match bad.contains(&rq.body) {
        true => Answer::status(400).body(&answer),
        false => Answer::status(200),
    })
    .await;
    let key = scheduled(&mut r, "bad", 10).await;
    let lines = hook_lines(
        &hook,
        &format!("max_attempts = 1\nbatch = 10\n{FAST_RETRY}"),
    );
    let bridge = http_bridge(&key, &lines);
    expect_settled(&mut r, &key, n as i64, &bridge).await;
    for i in 0..n {
        let why = dead_reason(&mut r, &key, body(i, 0)).await.unwrap();
        assert_eq!(why["reason"], "http_400", "{why}");
        let detail = why["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("invalid order: field `sku` missing"),
            "{detail}"
        );
        assert!(
            detail.len() <= 512,
            "a bounded excerpt: {} bytes",
            detail.len()
        );
    }
    assert!(hook.tally().values().all(|&n| n == 1), "not retried");
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, before| match before {
        0 => Answer::status(429).header("retry-after", "2"),
        _ => Answer::status(200),
    })
    .await;
    let n = 3;
    let key = scheduled(&mut r, "later", n).await;
    let lines = hook_lines(&hook, "backoff_initial = \"100ms\"\nbackoff_max = \"30s\"");
    let bridge = http_bridge(&key, &lines);
    expect_settled(&mut r, &key, 0, &bridge).await;
    for i in 0..n {
        let at: Vec<_> = hook
            .received()
            .iter()
            .filter(|rq| rq.body == body(i, 0))
            .map(|rq| rq.at)
            .collect();
        assert_eq!(at.len(), 2);
        let gap = at[1] - at[0];
        assert!(
            gap >= Duration::from_millis(1900),
            "retried after {gap:?}, not the 2 s the endpoint asked for"
        );
    }
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_hangs_times_out_and_is_retried() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, before| match before {
        0 => Answer::status(200).after(Duration::from_secs(60)),
        _ => Answer::status(200),
    })
    .await;
    let n = 3;
    let key = scheduled(&mut r, "hang", n).await;
    let lines = hook_lines(&hook, FAST_RETRY);
    let settings = [("timeout", "\"500ms\"")];
    let bridge = http_bridge_with(&settings, &key, &lines);
    expect_settled(&mut r, &key, 0, &bridge).await;
    for i in 0..n {
        let received: Vec<Request> = hook
            .received()
            .into_iter()
            .filter(|rq| rq.body == body(i, 0))
            .collect();
        assert_eq!(received.len(), 2, "a timeout, then a 200");
        // The endpoint's failure: no attempt counted.
        assert_eq!(received[1].header("x-delay-attempt"), "1");
        assert!(received[1].at - received[0].at >= Duration::from_millis(500));
    }
    let timeouts = bridge
        .metric(
            "delay_bridge_http_responses_total",
            &[("sink", "hooks"), ("class", "timeout")],
        )
        .await;
    assert_eq!(timeouts, n as f64);
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_does_not_hold_the_fast_ones_of_its_batch() {
    let mut r = redis().await;
    let slow = body(0, 0);
    let hook = Webhook::start(move |rq, _| match rq.body == slow {
        true => Answer::status(200).after(Duration::from_secs(4)),
        false => Answer::status(200),
    })
    .await;
    let n = 10;
    let key = scheduled(&mut r, "early", n).await;
    // One worker, one batch of all ten.
    let lines = hook_lines(&hook, "workers = 1\nbatch = 10");
    let bridge = http_bridge(&key, &lines);
    assert!(
        wait_until(Duration::from_secs(20), || hook.count() == n).await,
        "{}",
        bridge.log()
    );
    let all_sent = std::time::Instant::now();
    let sizes = wait_sizes(&mut r, &key, Duration::from_secs(3), |s| *s == (0, 1, 0)).await;
    assert_eq!(
        sizes,
        (0, 1, 0),
        "the nine fast answers acked while the slow one is out"
    );
    assert!(
        all_sent.elapsed() < Duration::from_secs(3),
        "acked before the slow answer"
    );
    expect_settled(&mut r, &key, 0, &bridge).await;
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_bounds_the_requests_in_flight() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, _| Answer::status(200).after(Duration::from_millis(200))).await;
    let n = 12;
    let key = scheduled(&mut r, "bounded", n).await;
    let lines = hook_lines(&hook, "workers = 4\nbatch = 6");
    let settings = [("max_concurrency", "3")];
    let bridge = http_bridge_with(&settings, &key, &lines);
    expect_settled(&mut r, &key, 0, &bridge).await;
    assert_eq!(hook.tally().len(), n);
    assert_eq!(
        hook.peak_in_flight(),
        3,
        "at most max_concurrency, and that many"
    );
    cleanup_keys(&mut r, &key).await;
}

/// A herd of a few thousand requests due at once on one trigger, two requests at a time to
/// a slow endpoint, and a few messages on another trigger of the same sink: those arrive
/// behind a request or two of the herd, not behind every request its batches have queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_is_not_held_behind_a_herd_on_the_same_sink() {
    let mut r = redis().await;
    let hook = Webhook::start(|_, _| Answer::status(200).after(Duration::from_millis(20))).await;
    let (herd_key, trickle_key) = (new_key("herd"), new_key("trickle"));
    let herd = 3000;
    schedule(&mut r, &herd_key, herd, 0).await;
    let port = free_port();
    let config = ConfigToml::base(port)
        .without("sinks.rabbit")
        .http_sink("hooks", &[("max_concurrency", "2")])
        .to_string()
        + &trigger(
            "herd",
            &herd_key,
            "hooks",
            &format!("url = {}", quoted(&hook.url("/herd"))),
        )
        + &trigger(
            "trickle",
            &trickle_key,
            "hooks",
            &format!("url = {}", quoted(&hook.url("/trickle"))),
        );
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    let on = |path: &str| -> Vec<Request> {
        let received = hook.received().into_iter();
        received.filter(|rq| rq.path == path).collect()
    };
    // The herd's batches have queued their requests (at most 100 a second go out).
    assert!(
        wait_until(Duration::from_secs(10), || on("/herd").len() >= 50).await,
        "{}",
        bridge.log()
    );
    let written = std::time::Instant::now();
    let trickle = 3;
    schedule(&mut r, &trickle_key, trickle, 0).await;
    let arrived = wait_until(Duration::from_secs(5), || on("/trickle").len() == trickle).await;
    let herd_sent = on("/herd").len();
    assert!(
        arrived,
        "the trickle not there after 5 s ({herd_sent} of the herd's {herd} sent)"
    );
    let last = on("/trickle").iter().map(|rq| rq.at).max().unwrap();
    let waited = last - written;
    assert!(
        waited < Duration::from_secs(1),
        "the trickle waited {waited:?} behind the herd ({herd_sent} of {herd} sent)"
    );
    assert!(
        herd_sent < herd / 2,
        "{herd_sent} of the herd sent: it must still be draining"
    );
    drop(bridge);
    cleanup_keys(&mut r, &herd_key).await;
    cleanup_keys(&mut r, &trickle_key).await;
}

/// One request of a batch hangs: the others, answered at once, leave Redis while it is still
/// in flight (acked early, a few at a time), so a crash then would re-send that one alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_messages_are_acked_while_one_of_their_batch_hangs() {
    let mut r = redis().await;
    let slow = body(0, 0);
    let hook = Webhook::start(move |rq, _| {
        let answer = Answer::status(200);
        if rq.body == slow {
            answer.after(Duration::from_secs(8))
        } else {
            answer
        }
    })
    .await;
    let n = 40;
    let key = scheduled(&mut r, "early", n).await;
    let bridge = http_bridge(&key, &hook_lines(&hook, ""));
    let sizes = wait_sizes(&mut r, &key, Duration::from_secs(5), |s| *s == (0, 1, 0)).await;
    assert_eq!(
        sizes,
        (0, 1, 0),
        "the answered messages still in flight beside the hanging one; {}",
        bridge.log()
    );
    expect_all_delivered(&mut r, &key, n, &hook, &bridge).await;
    cleanup_keys(&mut r, &key).await;
}
