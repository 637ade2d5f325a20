//! The web console in a real headless Chromium against a running bridge, real Redis and
//! RabbitMQ: the numbers match Redis, pause holds everything, resume delivers, a dead letter
//! is requeued from the page; history charts, paged dead letters, bulk actions, the message
//! drawer, search, stale numbers and dark mode; links, the search by the id consumers see and
//! the page's width (`links.rs`); screenshots land in `target/tmp/console/`.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::browser::Browser;
use common::proxy::{Mode, Proxy};
use common::*;
use delay_bridge::keys::QueueKeys;
use serde_json::Value;

mod links;
mod page;
mod parts;

use page::*;
use parts::*;

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
    let (mut r, capture, key, keys) = console_queue("console").await;
    let now = redis_now(&mut r).await;
    schedule_later(&mut r, &key, now).await;
    let nack = r#"{"reason":"nack","attempts":3}"#;
    dead_letter(&mut r, &key, "dead-0", now, nack).await;
    let (bridge, admin_port) = start_with_token("ui", &key, &capture).await;

    let browser = open_console(admin_port, Some(TOKEN)).await;
    let redis_sizes = (zcard(&mut r, &key).await, zcard(&mut r, &keys.dead).await);
    assert_eq!(redis_sizes, (3, 1));
    browser.wait_field("ui", "scheduled", "3").await;
    browser.wait_field("ui", "dead", "1").await;
    assert_eq!(browser.js(&field("ui", "state")).await, "active");
    browser
        .click("#triggers button[data-action=\"select\"]")
        .await;
    browser.wait_count("#scheduled tbody tr", 3).await;
    browser.wait_count("#forecast rect", 60).await;
    browser.screenshot(&shots().join("console.png")).await;

    // Pause from the console: the dialog asks first; nothing is forwarded meanwhile.
    let pause = "#triggers button[data-action=\"pause\"][data-trigger=\"ui\"]";
    browser.confirm(pause, "Pause ui?").await;
    browser.wait_field("ui", "state", "paused").await;
    let paused: Option<String> = hget(&mut r, &keys.control, "paused").await;
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
    bridge.expect_arrivals(5, WAIT, || capture.count()).await;

    // Requeue the dead letter from its row.
    browser
        .wait_text("#dead tbody tr td:nth-child(3)", "nack")
        .await;
    browser
        .confirm("#dead button[data-action=\"requeue\"]", "Requeue dead-0?")
        .await;
    bridge.expect_arrivals(6, WAIT, || capture.count()).await;
    assert!(capture.tally().contains_key(b"dead-0".as_slice()));
    browser.wait_field("ui", "dead", "0").await;
    let status = browser.text_of("#status").await;
    assert!(
        status.as_str().is_some_and(|s| s.starts_with("Requeued")),
        "{status}"
    );
    browser.assert_no_error().await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

/// Every documented score and any member renders: `+inf` ("park") and `-inf` scores, a
/// member that is not UTF-8, and a 1.1 MB inline message, in the scheduled and dead-letter
/// tables, with the actions still on screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_renders_infinite_scores_and_huge_or_binary_members() {
    let (mut r, capture, key, keys) = console_queue("console-odd").await;
    let huge = "h".repeat(1_100_000);
    // Paused, so that the member due at -inf ("now") stays to be shown.
    hset(&mut r, &keys.control, "paused", 1).await;
    zadd(&mut r, &key, "-inf", "now").await;
    zadd(&mut r, &key, "+inf", "parked").await;
    zadd(&mut r, &key, "+inf", &huge).await;
    zadd(&mut r, &key, "+inf", b"bin-\xff\xfe".as_slice()).await;
    let now = redis_now(&mut r).await;
    let too_large = r#"{"reason":"too_large","attempts":0}"#;
    dead_letter(&mut r, &key, &huge, now, too_large).await;
    let broker_refused = r#"{"reason":"broker_refused","attempts":2}"#;
    dead_letter(&mut r, &key, "a-refused", now, broker_refused).await;
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
    let browser = open_console(admin_port, None).await;
    browser.wait_field("odd", "scheduled", "3").await;
    browser.wait_field("odd", "due", "1").await;
    browser
        .click("#triggers button[data-action=\"select\"]")
        .await;
    browser.wait_count("#scheduled tbody tr", 3).await;
    browser.wait_count("#dead tbody tr", 2).await;
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
    let members = "return [...document.querySelectorAll('#scheduled tbody tr td:nth-child(2)')].map(td => td.textContent).join()";
    browser.wait_value(members, "parked").await;
    // The API is read-only: the console offers no action that would be refused.
    let offered: Value = browser
        .js("return [...document.querySelectorAll('button.changes, .changes button')].filter(b => b.offsetParent !== null).length")
        .await;
    assert_eq!(offered, 0, "actions offered on a read-only API");
    let shown: Value = browser
        .js("return [...document.querySelectorAll('button[data-action=\"show\"]')].filter(b => b.offsetParent !== null).length")
        .await;
    assert!(shown.as_u64().unwrap() > 0, "reading stays: {shown}");
    browser.assert_no_error().await;
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
    let (mut r, capture, key, keys) = console_queue("console-more").await;
    let now = redis_now(&mut r).await;
    schedule_later(&mut r, &key, now).await;
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
    let (bridge, admin_port) = start_with_token("more", &key, &capture).await;
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

    let browser = open_console(admin_port, Some(TOKEN)).await;
    browser.wait_field("more", "scheduled", "4").await;
    browser
        .click("#triggers button[data-action=\"select\"]")
        .await;

    // Each part's steps on the heap: together they outgrow a test thread's stack.
    Box::pin(history_and_forecast(&browser, admin_port)).await;
    Box::pin(dead_letter_pages(&browser)).await;
    Box::pin(drawer_and_search(&browser, &envelope)).await;
    Box::pin(bulk_and_dark_mode(&browser)).await;
    bridge.expect_arrivals(60, WAIT, || capture.count()).await;
    assert_eq!(zcard(&mut r, &keys.dead).await, 0);
    browser.assert_no_error().await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

/// A refresh that fails greys the numbers out under a banner saying since when and why:
/// Redis gone (the API answers 503), then back, then the bridge gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_marks_its_numbers_stale_when_redis_or_the_bridge_is_gone() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("console-stale").await;
    let key = format!("{}:{{console-stale}}", unique("ui"));
    let now = redis_now(&mut r).await;
    schedule_crowd(&mut r, &key, "later", 2, now + 600_000).await;
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
    let browser = open_console(admin_port, None).await;
    browser.wait_field("stale", "scheduled", "2").await;
    assert_eq!(browser.js(&shown("#stale")).await, false);
    let banner = "return document.querySelector('#stale').hidden ? null : document.querySelector('#stale').textContent";
    let greyed = "return document.querySelector('#triggers').classList.contains('stale')";

    proxy.set(Mode::Drop);
    let text = browser.wait_js(banner, WAIT, |v| v.is_string()).await;
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
    let text = browser.wait_js(banner, WAIT, |v| v.is_string()).await;
    assert!(
        text.as_str().unwrap().contains("(bridge unreachable)"),
        "{text}"
    );
    cleanup_keys(&mut r, &key).await;
}

/// A trigger whose exchange is missing is held: its row says `held` and names the exchange
/// within 10 s, and says `active` again once the exchange exists and the message went out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_held_trigger_and_why() {
    let (mut r, capture, key, _) = console_queue("held").await;
    let exchange = unique("console-missing");
    let (port, admin_port) = (free_port(), free_port());
    let to =
        format!("exchange = \"{exchange}\"\nrouting_key = \"held\"\nguard_interval = \"200ms\"\n");
    let config = base_config(port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n")
        + &trigger("held", &key, "rabbit", &to);
    // Never ready while held: `/readyz` names the trigger.
    let bridge = Bridge::start_with_env(&config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)]);
    schedule_now(&mut r, &key, ["waiting"]).await;
    let browser = open_console(admin_port, Some(TOKEN)).await;
    let want = format!("held: exchange `{exchange}` does not exist");
    browser
        .wait_js(&field("held", "state"), Duration::from_secs(10), |v| {
            v.as_str().is_some_and(|s| s.starts_with(&want))
        })
        .await;
    browser.screenshot(&shots().join("console-held.png")).await;

    let ch = declare_direct_exchange(&exchange).await;
    capture.bind(&exchange, "held").await;
    bridge.expect_arrivals(1, WAIT, || capture.count()).await;
    browser.wait_field("held", "state", "active").await;
    bridge.expect_readyz(200, WAIT).await;
    browser.assert_no_error().await;
    ch.exchange_delete(&exchange, Default::default())
        .await
        .unwrap();
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_a_triggers_schedules_with_their_last_and_next_fire() {
    let (mut r, capture, key, keys) = console_queue("console-sched").await;
    let (port, admin_port) = (free_port(), free_port());
    let config = base_config(port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n")
        + &amqp_trigger("sched", &key, &capture, "")
        + "\n[[triggers.schedules]]\nname = \"every\"\ncron = \"* * * * * *\"\nbody = \"every\"\n";
    let bridge = Bridge::start_with_env(&config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)])
        .ready(Duration::from_secs(20))
        .await;
    let added = cli(
        &["schedule", "add", "-t", "sched", "--name", "yearly"]
            .into_iter()
            .chain(["--cron", "0 0 0 1 1 *", "--timezone", "Europe/Berlin"])
            .chain(["--body", "happy new year"])
            .collect::<Vec<_>>(),
        &config,
        &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)],
    );
    assert_eq!(added.code, 0, "{}", added.text());
    bridge.expect_arrivals(1, WAIT, || capture.count()).await;
    let browser = open_console(admin_port, Some(TOKEN)).await;
    browser.wait_field("sched", "state", "active").await;
    browser
        .click("#triggers button[data-action=\"select\"]")
        .await;
    browser.wait_count("#schedules tbody tr", 2).await;
    let cell = |name: &str, field: &str| {
        format!(
            "return document.querySelector('#schedules tr[data-schedule=\"{name}\"] td[data-field=\"{field}\"]')?.textContent ?? null"
        )
    };
    let fired = |v: &Value| {
        v.as_str()
            .is_some_and(|s| s.contains(" ago)") || s.contains("(now)"))
    };
    browser.wait_js(&cell("every", "last"), WAIT, fired).await;
    browser
        .wait_js(&cell("every", "source"), WAIT, |v| v == "config")
        .await;
    browser
        .wait_js(&cell("yearly", "source"), WAIT, |v| v == "runtime")
        .await;
    assert_eq!(browser.js(&cell("yearly", "last")).await, "-");
    let next = browser.js(&cell("yearly", "next")).await;
    assert!(
        next.as_str()
            .is_some_and(|s| s.contains("(in ") && s.ends_with(" days)")),
        "{next}"
    );
    browser.assert_no_error().await;
    bridge.assert_no_panic();
    let marks = keys.control.replace(":control", ":schedules");
    let _: () = redis::cmd("DEL")
        .arg(&marks)
        .arg(format!("{marks}:defs"))
        .arg(format!("{marks}:rev"))
        .query_async(&mut r)
        .await
        .unwrap();
    cleanup_keys(&mut r, &key).await;
}
