//! The web console in a real headless Chromium against a running bridge, real Redis and
//! RabbitMQ: the numbers match Redis, pause holds everything, resume delivers, a dead letter
//! is requeued from the page; screenshots land in `target/console/`.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::browser::Browser;
use common::*;
use delay_bridge::keys::QueueKeys;
use serde_json::Value;

const TOKEN: &str = "console-token-0123456789abcdef";

fn field(trigger: &str, name: &str) -> String {
    format!(
        "return document.querySelector('#triggers tr[data-trigger=\"{trigger}\"] td[data-field=\"{name}\"]')?.textContent ?? null"
    )
}

fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_redis_pauses_resumes_and_requeues_in_a_real_browser() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("console").await;
    let key = format!("{}:{{console}}", unique("ui"));
    let keys = QueueKeys::derive(&key).unwrap();
    let now = redis_now(&mut r).await;
    zadd_all(
        &mut r,
        &key,
        (0..3).map(|i| (now + 600_000 + i * 60_000, format!("later-{i}"))),
    )
    .await;
    dead_letter(
        &mut r,
        &key,
        "dead-0",
        now,
        r#"{"reason":"nack","attempts":3}"#,
    )
    .await;
    let (port, admin_port) = (free_port(), free_port());
    let config = base_config(port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n")
        + &amqp_trigger("ui", &key, &capture, "guard_interval = \"200ms\"\n");
    let bridge = Bridge::start_with_env(&config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)])
        .ready(Duration::from_secs(20))
        .await;

    let browser = Browser::start().await;
    browser
        .goto(&format!("http://127.0.0.1:{admin_port}/"))
        .await;
    // Keyboard only: the token, then Enter submits the form.
    browser
        .type_into("#token", &format!("{TOKEN}\u{E007}"))
        .await;
    let wait = Duration::from_secs(15);
    let redis_sizes = (zcard(&mut r, &key).await, zcard(&mut r, &keys.dead).await);
    assert_eq!(redis_sizes, (3, 1));
    browser
        .wait_js(&field("ui", "scheduled"), wait, |v| v == "3")
        .await;
    browser
        .wait_js(&field("ui", "dead"), wait, |v| v == "1")
        .await;
    assert_eq!(browser.js(&field("ui", "state")).await, "active");
    browser
        .click("#triggers button[data-action=\"select\"]")
        .await;
    browser
        .wait_js(
            "return document.querySelectorAll('#scheduled tbody tr').length",
            wait,
            |v| v == 3,
        )
        .await;
    browser
        .wait_js(
            "return document.querySelectorAll('#forecast rect').length",
            wait,
            |v| v == 60,
        )
        .await;
    browser.screenshot(&shots().join("console.png")).await;

    // Pause from the console: the dialog asks first; nothing is forwarded meanwhile.
    browser
        .click("#triggers button[data-action=\"pause\"][data-trigger=\"ui\"]")
        .await;
    let asked = browser.accept_dialog().await;
    assert!(asked.contains("Pause ui?"), "{asked}");
    browser
        .wait_js(&field("ui", "state"), wait, |v| v == "paused")
        .await;
    let paused: Option<String> = redis::cmd("HGET")
        .arg(&keys.control)
        .arg("paused")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(paused.as_deref(), Some("1"));
    let now = redis_now(&mut r).await;
    zadd_all(&mut r, &key, (0..5).map(|i| (now, format!("now-{i}")))).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(capture.count(), 0, "forwarded while paused");
    browser
        .screenshot(&shots().join("console-paused.png"))
        .await;

    // Resume: the five go out.
    browser
        .click("#triggers button[data-action=\"resume\"][data-trigger=\"ui\"]")
        .await;
    bridge.expect_arrivals(5, wait, || capture.count()).await;

    // Requeue the dead letter from its row.
    browser
        .wait_js(
            "return document.querySelector('#dead tbody tr td:nth-child(3)')?.textContent ?? null",
            wait,
            |v| v == "nack",
        )
        .await;
    browser.click("#dead button[data-action=\"requeue\"]").await;
    assert!(browser.accept_dialog().await.contains("Requeue dead-0?"));
    bridge.expect_arrivals(6, wait, || capture.count()).await;
    assert!(capture.tally().contains_key(b"dead-0".as_slice()));
    browser
        .wait_js(&field("ui", "dead"), wait, |v| v == "0")
        .await;
    let status = browser
        .js("return document.querySelector('#status').textContent")
        .await;
    assert!(
        status.as_str().is_some_and(|s| s.starts_with("Requeued")),
        "{status}"
    );
    let errors: Value = browser
        .js("return document.querySelector('#status.error')?.textContent ?? null")
        .await;
    assert_eq!(errors, Value::Null);
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}
