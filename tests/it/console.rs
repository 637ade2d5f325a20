//! The web console in a real headless Chromium against a running bridge, real Redis and
//! RabbitMQ: the numbers match Redis, pause holds everything, resume delivers, a dead letter
//! is requeued from the page; history charts, paged dead letters, bulk actions, the message
//! drawer, search, stale numbers and dark mode; screenshots land in `target/tmp/console/`.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::browser::Browser;
use common::http::request;
use common::proxy::{Mode, Proxy};
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

/// Every documented score and any member renders: `+inf` ("park") and `-inf` scores, a
/// member that is not UTF-8, and a 1.1 MB inline message, in the scheduled and dead-letter
/// tables, with the actions still on screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_renders_infinite_scores_and_huge_or_binary_members() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("console-odd").await;
    let key = format!("{}:{{console-odd}}", unique("ui"));
    let keys = QueueKeys::derive(&key).unwrap();
    let huge = "h".repeat(1_100_000);
    // Paused, so that the member due at -inf ("now") stays to be shown.
    let _: () = redis::cmd("HSET")
        .arg(&keys.control)
        .arg("paused")
        .arg(1)
        .query_async(&mut r)
        .await
        .unwrap();
    zadd(&mut r, &key, "-inf", "now").await;
    zadd(&mut r, &key, "+inf", "parked").await;
    zadd(&mut r, &key, "+inf", &huge).await;
    zadd(&mut r, &key, "+inf", b"bin-\xff\xfe".as_slice()).await;
    let now = redis_now(&mut r).await;
    dead_letter(
        &mut r,
        &key,
        &huge,
        now,
        r#"{"reason":"too_large","attempts":0}"#,
    )
    .await;
    dead_letter(
        &mut r,
        &key,
        "a-refused",
        now,
        r#"{"reason":"broker_refused","attempts":2}"#,
    )
    .await;
    // Dead letters the broker refused when forwarded have the score +inf (byte order among
    // equal scores puts this one first, before the page's byte budget ends the list).
    zadd(&mut r, &keys.dead, "+inf", "a-refused").await;
    zadd(&mut r, &keys.dead, "+inf", &huge).await;
    let (port, admin_port) = (free_port(), free_port());
    let config = base_config(port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\nread_only = true\n")
        + &amqp_trigger("odd", &key, &capture, "");
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    let browser = Browser::start().await;
    browser
        .goto(&format!("http://127.0.0.1:{admin_port}/"))
        .await;
    let wait = Duration::from_secs(15);
    browser
        .wait_js(&field("odd", "scheduled"), wait, |v| v == "3")
        .await;
    browser
        .wait_js(&field("odd", "due"), wait, |v| v == "1")
        .await;
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
            "return document.querySelectorAll('#dead tbody tr').length",
            wait,
            |v| v == 2,
        )
        .await;
    let when: Value = browser
        .js("return [...document.querySelectorAll('#scheduled tbody tr td:first-child')].map(td => td.textContent)")
        .await;
    // The page ends after the 1.1 MB message (a page's byte budget), with a next page.
    assert_eq!(
        when,
        serde_json::json!(["now (-inf)", "parked (+inf)", "parked (+inf)"]),
        "{when}"
    );
    let dead_when: Value = browser
        .js("return [...document.querySelectorAll('#dead tbody tr td:first-child')].map(td => td.textContent)")
        .await;
    assert!(
        dead_when.as_array().unwrap().iter().all(|t| {
            let t = t.as_str().unwrap();
            !t.contains("Invalid") && !t.is_empty()
        }),
        "{dead_when}"
    );
    // The huge member is shown by its start and length; every row's text stays short.
    let longest: Value = browser
        .js("return Math.max(...[...document.querySelectorAll('#scheduled tbody tr, #dead tbody tr')].map(tr => tr.textContent.length))")
        .await;
    assert!(
        longest.as_f64().unwrap() < 1000.0,
        "a row of {longest} characters"
    );
    let huge_shown: Value = browser
        .js("return [...document.querySelectorAll('#scheduled tbody td')].some(td => td.textContent.includes('1,100,000 characters'))")
        .await;
    assert_eq!(huge_shown, Value::Bool(true));
    browser.click("#next-page").await;
    browser
        .wait_js(
            "return [...document.querySelectorAll('#scheduled tbody tr td:nth-child(2)')].map(td => td.textContent).join()",
            wait,
            |v| v == "parked",
        )
        .await;
    // The API is read-only: the console offers no action that would be refused.
    let offered: Value = browser
        .js("return [...document.querySelectorAll('button.changes, .changes button')].filter(b => b.offsetParent !== null).length")
        .await;
    assert_eq!(offered, 0, "actions offered on a read-only API");
    let shown: Value = browser
        .js("return [...document.querySelectorAll('button[data-action=\"show\"]')].filter(b => b.offsetParent !== null).length")
        .await;
    assert!(shown.as_u64().unwrap() > 0, "reading stays: {shown}");
    let errors: Value = browser
        .js("return document.querySelector('#status.error')?.textContent ?? null")
        .await;
    assert_eq!(errors, Value::Null);
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

/// Whether the element `css` selects is shown (not `hidden`).
fn shown(css: &str) -> String {
    format!("const e = document.querySelector('{css}'); return !!e && !e.hidden")
}

/// The texts of the cells `css` selects.
fn texts(css: &str) -> String {
    format!("return [...document.querySelectorAll('{css}')].map(e => e.textContent)")
}

/// History charts over messages forwarded while the page is open, the last minute's lateness
/// in the table, the forecast's labels clear of its bars, dead letters a page at a time with
/// attempts and detail, bulk requeue naming its count, the message drawer (an envelope's
/// fields, headers and pretty body; a dead letter's reason) closed by Escape, search by id and
/// by prefix, times relative to now, and dark mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_charts_history_pages_dead_letters_and_opens_a_message_drawer() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("console-more").await;
    let key = format!("{}:{{console-more}}", unique("ui"));
    let keys = QueueKeys::derive(&key).unwrap();
    let now = redis_now(&mut r).await;
    zadd_all(
        &mut r,
        &key,
        (0..3).map(|i| (now + 600_000 + i * 60_000, format!("later-{i}"))),
    )
    .await;
    let envelope = serde_json::json!({
        "body": "{\"order\":42,\"items\":[1,2]}",
        "headers": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        "routing_key": "orders.created",
    })
    .to_string();
    zadd(&mut r, &key, now + 1_800_000, &envelope).await;
    // Leased by no bridge, for the next 5 minutes: the in-flight table shows it.
    zadd(&mut r, &keys.inflight, now + 300_000, "leased-0").await;
    for i in 0..30 {
        let reason = if i < 20 {
            r#"{"reason":"nack","attempts":3,"detail":"broker said no"}"#
        } else {
            r#"{"reason":"too_large","attempts":0}"#
        };
        dead_letter(
            &mut r,
            &key,
            &format!("dead-{i:02}"),
            now - 180_000 + i,
            reason,
        )
        .await;
    }
    let (port, admin_port) = (free_port(), free_port());
    let config = base_config(port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n")
        + &amqp_trigger("more", &key, &capture, "guard_interval = \"200ms\"\n");
    let bridge = Bridge::start_with_env(&config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)])
        .ready(Duration::from_secs(20))
        .await;
    // Due over the next 20 s, after the bridge's first sample: the next ones see them.
    let now = redis_now(&mut r).await;
    zadd_all(
        &mut r,
        &key,
        (0..40).map(|i| (now + i * 500, format!("now-{i}"))),
    )
    .await;
    bridge
        .expect_arrivals(40, Duration::from_secs(30), || capture.count())
        .await;

    let browser = Browser::start().await;
    browser
        .goto(&format!("http://127.0.0.1:{admin_port}/"))
        .await;
    browser
        .type_into("#token", &format!("{TOKEN}\u{E007}"))
        .await;
    let wait = Duration::from_secs(15);
    browser
        .wait_js(&field("more", "scheduled"), wait, |v| v == "4")
        .await;
    browser
        .click("#triggers button[data-action=\"select\"]")
        .await;

    // Each part's steps on the heap: together they outgrow a test thread's stack.
    Box::pin(history_and_forecast(&browser, admin_port)).await;
    Box::pin(dead_letter_pages(&browser)).await;
    Box::pin(drawer_and_search(&browser, &envelope)).await;
    Box::pin(bulk_and_dark_mode(&browser)).await;
    bridge.expect_arrivals(60, wait, || capture.count()).await;
    assert_eq!(zcard(&mut r, &keys.dead).await, 0);
    let errors: Value = browser
        .js("return document.querySelector('#status.error')?.textContent ?? null")
        .await;
    assert_eq!(errors, Value::Null);
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

/// History: the 40 forwarded show as a rate, and the table's p99 is the last minute's; the
/// forecast's labels clear of its bars; times relative to now.
async fn history_and_forecast(browser: &Browser, admin_port: u16) {
    let wait = Duration::from_secs(15);
    // Three windows of 10 s after the first sample have seen all 40 forwarded.
    let history = Duration::from_secs(45);
    browser
        .wait_js(
            "return Number(document.querySelector('#chart-forwarded').dataset.points ?? 0)",
            history,
            |v| v.as_u64().is_some_and(|n| n >= 3),
        )
        .await;
    assert_eq!(
        browser
            .js("return document.querySelectorAll('#chart-forwarded path.line').length")
            .await,
        1
    );
    browser
        .wait_js(&field("more", "lateness"), wait, |v| {
            v.as_str()
                .is_some_and(|s| s.ends_with(" ms") || s.ends_with(" s"))
        })
        .await;
    let points = request(
        admin_port,
        "GET",
        "/api/v1/triggers/more/history?window=15m",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        None,
    )
    .await
    .json();
    let forwarded: f64 = points["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["forwarded_per_second"].as_f64().unwrap() * 10.0)
        .sum();
    assert!((forwarded - 40.0).abs() < 2.0, "{points}");
    for chart in ["forwarded", "dead", "due", "lateness"] {
        let n = browser
            .js(&format!(
                "return document.querySelectorAll('#chart-{chart} text').length"
            ))
            .await;
        assert!(n.as_u64().unwrap() >= 4, "#chart-{chart}: {n}");
    }
    browser.click("#window-1h").await;
    browser
        .wait_js(
            "return document.querySelector('#chart-due').dataset.window",
            wait,
            |v| v == "1h",
        )
        .await;
    browser.click("#window-15m").await;
    browser
        .wait_js(
            "return document.querySelector('#chart-due').dataset.window",
            wait,
            |v| v == "15m",
        )
        .await;
    // The forecast's labels cover neither its bars nor its axis.
    let overlaps = browser
        .js("const box = (e) => e.getBoundingClientRect();
             const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
             const texts = [...document.querySelectorAll('#forecast text')].map(box);
             const shapes = [...document.querySelectorAll('#forecast rect, #forecast line')].map(box);
             return texts.length < 4 ? -1 : texts.filter(t => shapes.some(s => s.height > 0 && hit(t, s))).length")
        .await;
    assert_eq!(overlaps, 0);
    browser
        .screenshot(&shots().join("console-history.png"))
        .await;

    // Times in the browser's zone, relative to now; -inf and +inf as before.
    let due = browser
        .js(&texts("#scheduled tbody tr td:first-child"))
        .await;
    let soon = due[0].as_str().unwrap();
    assert!(
        soon.ends_with("(in 10 min)") || soon.ends_with("(in 9 min)"),
        "{due}"
    );
}

/// Dead letters, 25 a page: attempts and detail columns, then the next page.
async fn dead_letter_pages(browser: &Browser) {
    let wait = Duration::from_secs(15);
    browser
        .wait_js(
            "return document.querySelectorAll('#dead tbody tr').length",
            wait,
            |v| v == 25,
        )
        .await;
    let first = browser.js(&texts("#dead tbody tr:first-child td")).await;
    let since = first[0].as_str().unwrap();
    assert!(
        since.ends_with("(3 min ago)") || since.ends_with("(4 min ago)"),
        "{first}"
    );
    assert_eq!(first[1], "dead-00");
    assert_eq!(first[2], "nack");
    assert_eq!(first[3], "3");
    assert_eq!(first[4], "broker said no");
    browser.click("#dead-next").await;
    browser
        .wait_js(&texts("#dead tbody tr td:nth-child(2)"), wait, |v| {
            v == &serde_json::json!(["dead-25", "dead-26", "dead-27", "dead-28", "dead-29"])
        })
        .await;
    browser.click("#dead-first").await;
    browser
        .wait_js(
            "return document.querySelectorAll('#dead tbody tr').length",
            wait,
            |v| v == 25,
        )
        .await;
}

/// The drawer: an envelope's fields, headers and pretty-printed JSON body; a dead letter's
/// reason; search by member and by prefix; every control focusable.
async fn drawer_and_search(browser: &Browser, envelope: &str) {
    let wait = Duration::from_secs(15);
    // In flight: the lease's end, relative to now, and in the drawer.
    let lease = browser
        .wait_js(&texts("#inflight tbody tr td"), wait, |v| {
            v.as_array().is_some_and(|a| a.len() == 3)
        })
        .await;
    assert_eq!(lease[1], "leased-0");
    let ends = lease[0].as_str().unwrap();
    assert!(
        ends.ends_with("(in 5 min)") || ends.ends_with("(in 4 min)"),
        "{lease}"
    );
    browser.click("#inflight tbody tr td:nth-child(2)").await;
    browser
        .wait_js(&shown("#drawer"), wait, |v| v == true)
        .await;
    let fields = browser
        .js("return document.querySelector('#drawer-fields').textContent")
        .await;
    assert!(
        fields
            .as_str()
            .unwrap()
            .contains("Statein flightLease ends"),
        "{fields}"
    );
    browser.type_into("#drawer-close", "\u{E00C}").await;
    browser
        .wait_js(&shown("#drawer"), wait, |v| v == false)
        .await;
    let row = format!(
        "#scheduled tbody tr[data-member='{}'] td:nth-child(2)",
        envelope.replace('\\', "\\\\").replace('\'', "\\'")
    );
    browser.click(&row).await;
    browser
        .wait_js(&shown("#drawer"), wait, |v| v == true)
        .await;
    let body = browser
        .js("return document.querySelector('#drawer-body').textContent")
        .await;
    assert_eq!(
        body, "{\n  \"order\": 42,\n  \"items\": [\n    1,\n    2\n  ]\n}",
        "{body}"
    );
    let headers = browser
        .js("return document.querySelector('#drawer-headers').textContent")
        .await;
    assert!(
        headers.as_str().unwrap().contains("traceparent00-4bf92f35"),
        "{headers}"
    );
    let fields = browser
        .js("return document.querySelector('#drawer-fields').textContent")
        .await;
    assert!(
        fields
            .as_str()
            .unwrap()
            .contains("routing_keyorders.created"),
        "{fields}"
    );
    assert!(fields.as_str().unwrap().contains("Due"), "{fields}");
    browser
        .screenshot(&shots().join("console-drawer.png"))
        .await;
    // Escape closes it (the focus is on its Close button).
    let focused = browser.js("return document.activeElement.id").await;
    assert_eq!(focused, "drawer-close");
    browser.type_into("#drawer-close", "\u{E00C}").await;
    browser
        .wait_js(&shown("#drawer"), wait, |v| v == false)
        .await;

    // A dead letter's drawer: its reason, detail and attempts.
    browser
        .click("#dead tbody tr:first-child button[data-action=\"show\"]")
        .await;
    browser
        .wait_js(&shown("#drawer"), wait, |v| v == true)
        .await;
    let fields = browser
        .js("return document.querySelector('#drawer-fields').textContent")
        .await;
    let fields = fields.as_str().unwrap();
    for part in [
        "Statedead letter",
        "Attempts3",
        "Reasonnack",
        "Detailbroker said no",
    ] {
        assert!(fields.contains(part), "{part}: {fields}");
    }
    browser.click("#drawer-close").await;
    browser
        .wait_js(&shown("#drawer"), wait, |v| v == false)
        .await;

    // Search: an exact member opens the drawer; a prefix lists the matches it read.
    browser.type_into("#search", "later-1\u{E007}").await;
    browser
        .wait_js(&shown("#drawer"), wait, |v| v == true)
        .await;
    assert_eq!(
        browser
            .js("return document.querySelector('#drawer-title').textContent")
            .await,
        "later-1"
    );
    browser.type_into("#drawer-close", "\u{E00C}").await;
    browser
        .js("document.querySelector('#search').value = ''")
        .await;
    browser.type_into("#search", "later\u{E007}").await;
    browser
        .wait_js(&texts("#scheduled tbody tr td:nth-child(2)"), wait, |v| {
            v == &serde_json::json!(["later-0", "later-1", "later-2"])
        })
        .await;
    let found = browser
        .js("return document.querySelector('#found').textContent")
        .await;
    assert!(
        found
            .as_str()
            .unwrap()
            .starts_with("3 scheduled messages start with"),
        "{found}"
    );
    browser.click("#first-page").await;
    browser
        .wait_js(
            "return document.querySelectorAll('#scheduled tbody tr').length",
            wait,
            |v| v == 4,
        )
        .await;

    // Keyboard: every button and every message row can take the focus.
    let unfocusable = browser
        .js("return [...document.querySelectorAll('button, #scheduled tbody tr, #dead tbody tr')].filter(e => e.tabIndex < 0).length")
        .await;
    assert_eq!(unfocusable, 0);
}

/// Bulk: the oldest 5, the 10 with one reason, then all of the rest; each question names the
/// count. A purge asked and declined deletes nothing. Then dark mode.
async fn bulk_and_dark_mode(browser: &Browser) {
    let wait = Duration::from_secs(15);
    browser
        .js("document.querySelector('#requeue-count').value = '5'")
        .await;
    browser.click("#requeue-oldest").await;
    let asked = browser.accept_dialog().await;
    assert!(
        asked.contains("Requeue the 5 oldest dead letters of more?"),
        "{asked}"
    );
    browser
        .wait_js(&field("more", "dead"), wait, |v| v == "25")
        .await;
    // The 10 whose reason is too_large, counted before the question.
    browser
        .wait_js(
            "return [...document.querySelectorAll('#purge-reason option')].map(o => o.value)",
            wait,
            |v| v == &serde_json::json!(["nack", "too_large"]),
        )
        .await;
    browser
        .js("const s = document.querySelector('#purge-reason'); s.value = 'too_large'; return s.value")
        .await;
    browser.click("#purge-by-reason").await;
    let asked = browser.accept_dialog().await;
    assert!(
        asked.contains("Delete the 10 dead letters of more whose reason is too_large"),
        "{asked}"
    );
    browser
        .wait_js(&field("more", "dead"), wait, |v| v == "15")
        .await;
    browser
        .wait_js(
            "return document.querySelector('#purge-dead').textContent",
            wait,
            |v| v == "Purge all dead letters (15)",
        )
        .await;
    browser.click("#purge-dead").await;
    let asked = browser.dismiss_dialog().await;
    assert!(
        asked.contains("Delete all 15 dead letters of more"),
        "{asked}"
    );
    browser.click("#requeue-all").await;
    let asked = browser.accept_dialog().await;
    assert!(
        asked.contains("Requeue all 15 dead letters of more?"),
        "{asked}"
    );
    browser
        .wait_js(&field("more", "dead"), wait, |v| v == "0")
        .await;

    // Dark mode follows the system's preference.
    browser.prefer_dark().await;
    let background = browser
        .js("return getComputedStyle(document.documentElement).backgroundColor")
        .await;
    assert_eq!(background, "rgb(20, 24, 28)");
}

/// A refresh that fails greys the numbers out under a banner saying since when and why:
/// Redis gone (the API answers 503), then back, then the bridge gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_marks_its_numbers_stale_when_redis_or_the_bridge_is_gone() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("console-stale").await;
    let key = format!("{}:{{console-stale}}", unique("ui"));
    let now = redis_now(&mut r).await;
    zadd_all(
        &mut r,
        &key,
        (0..2).map(|i| (now + 600_000 + i, format!("later-{i}"))),
    )
    .await;
    let proxy = Proxy::start(shared_redis_addr()).await;
    let (port, admin_port) = (free_port(), free_port());
    let config = ConfigToml::base(port)
        .set_str("redis", "url", &proxy.url(&redis_url(), ""))
        .set_str("admin", "listen", &format!("127.0.0.1:{admin_port}"))
        .set("admin", "read_only", "true")
        .to_string()
        + &amqp_trigger("stale", &key, &capture, "");
    let mut bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    let browser = Browser::start().await;
    browser
        .goto(&format!("http://127.0.0.1:{admin_port}/"))
        .await;
    let wait = Duration::from_secs(15);
    browser
        .wait_js(&field("stale", "scheduled"), wait, |v| v == "2")
        .await;
    assert_eq!(browser.js(&shown("#stale")).await, false);
    let banner = "return document.querySelector('#stale').hidden ? null : document.querySelector('#stale').textContent";
    let greyed = "return document.querySelector('#triggers').classList.contains('stale')";

    proxy.set(Mode::Drop);
    let text = browser.wait_js(banner, wait, |v| v.is_string()).await;
    let text = text.as_str().unwrap();
    let clock = text.strip_prefix("stale since ").unwrap_or_default();
    let digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    let hms: Vec<&str> = clock.get(..8).unwrap_or_default().split(':').collect();
    assert!(hms.len() == 3 && hms.iter().all(|p| digits(p)), "{text}");
    assert!(clock[8..].starts_with(" (HTTP 503: redis: "), "{text}");
    assert_eq!(browser.js(greyed).await, true);
    // The last numbers stay, marked; a rate is not shown as live.
    assert_eq!(browser.js(&field("stale", "scheduled")).await, "2");
    assert_eq!(browser.js(&field("stale", "rate")).await, "-");
    browser.screenshot(&shots().join("console-stale.png")).await;

    proxy.set(Mode::Pass);
    browser
        .wait_js(banner, Duration::from_secs(30), |v| v.is_null())
        .await;
    assert_eq!(browser.js(greyed).await, false);

    bridge.terminate(Duration::from_secs(15)).await;
    let text = browser.wait_js(banner, wait, |v| v.is_string()).await;
    assert!(
        text.as_str().unwrap().contains("(bridge unreachable)"),
        "{text}"
    );
    cleanup_keys(&mut r, &key).await;
}
