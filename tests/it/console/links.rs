//! The console as an operator links and searches it: a wrong token, a deep link opened and
//! reloaded, a message found by the id its consumers see past the first 1,000, a binary
//! member promoted, the status line of one trigger, the drawer's actions, and no element
//! wider than the window with a 1.2 MB member on the page, at 1,024 and 1,400 px (with a
//! screenshot of each view at both widths).

use super::*;

use delay_bridge::wire::MessageId;

/// Elements wider than the viewport or reaching past its right edge (the drawer's own
/// scrolling content aside), as `tag#id.class` strings.
const OVERFLOWING: &str = "const w = document.documentElement.clientWidth;
    const out = [...document.querySelectorAll('body *')].filter(e => {
      const r = e.getBoundingClientRect();
      return r.width > 0 && (r.width > w + 1 || r.right > w + 1);
    }).map(e => e.tagName + '#' + e.id + '.' + e.className);
    if (document.documentElement.scrollWidth > w + 1) out.push('page ' + document.documentElement.scrollWidth);
    return out";

/// The queue: paused, so that what is due stays to be shown; `-inf` and `+inf` members, one
/// that is not UTF-8, a 1.2 MB one scheduled and dead-lettered as `too_large`, 1,500 due
/// before the one the search looks for, and a dead letter with a detail. Returns Redis's
/// time.
async fn fill(r: &mut Conn, key: &str, keys: &QueueKeys, huge: &str) -> i64 {
    hset(r, &keys.control, "paused", 1).await;
    zadd(r, key, "-inf", "now").await;
    zadd(r, key, "+inf", "parked").await;
    let now = redis_now(r).await;
    // Both on the first page, which ends after the 1.2 MB one (a page's byte budget).
    zadd(r, key, now + 300_000, b"bin-\xff\xfe".as_slice()).await;
    zadd(r, key, now + 301_000, huge).await;
    schedule_later(r, key, now).await;
    schedule_crowd(r, key, "fill", 1500, now + 900_000).await;
    zadd(r, key, now + 7_200_000, "deep-target").await;
    let nack = r#"{"reason":"nack","attempts":3,"detail":"broker said no"}"#;
    dead_letter(r, key, "dead-0", now - 60_000, nack).await;
    let too_large = r#"{"reason":"too_large","attempts":0}"#;
    dead_letter(r, key, huge, now - 30_000, too_large).await;
    now
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_links_finds_by_consumer_id_and_fits_the_window() {
    let (mut r, capture, key, keys) = console_queue("console-links").await;
    let other_key = format!("{}:{{console-links}}", unique("ui-other"));
    let huge = "h".repeat(1_200_000);
    fill(&mut r, &key, &keys, &huge).await;
    let now = redis_now(&mut r).await;
    zadd(&mut r, &other_key, now + 3_600_000, "elsewhere").await;
    let (port, admin_port) = (free_port(), free_port());
    let config = base_config(port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n")
        + &amqp_trigger("links", &key, &capture, "")
        + &amqp_trigger("other", &other_key, &capture, "");
    let bridge = Bridge::start_with_env(&config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)])
        .ready(Duration::from_secs(20))
        .await;

    // A wrong token says so, and never "Connected".
    let deep = format!("http://127.0.0.1:{admin_port}/console#t=links&m=later-1");
    let browser = Browser::start().await;
    browser.viewport(1400, 900).await;
    browser.goto(&deep).await;
    browser.type_into("#token", "not-the-token\u{E007}").await;
    let status = browser
        .wait_js(
            "return document.querySelector('#status').textContent",
            WAIT,
            |v| {
                v.as_str()
                    .is_some_and(|s| !s.is_empty() && !s.starts_with("Type"))
            },
        )
        .await;
    assert!(
        status.as_str().unwrap().starts_with("unauthorized"),
        "{status}"
    );
    browser.set_value("#token", "").await;

    // The deep link opens the trigger and the message, and a reload keeps both.
    browser
        .type_into("#token", &format!("{TOKEN}\u{E007}"))
        .await;
    browser.wait_text("#status", "Connected").await;
    deep_link_opens(&browser, "later-1").await;
    browser.js("window.before = true; location.reload()").await;
    browser
        .wait_js("return window.before ?? false", WAIT, |v| v == false)
        .await;
    deep_link_opens(&browser, "later-1").await;
    assert_eq!(
        browser.js("return location.hash").await,
        "#t=links&m=later-1"
    );
    browser.escape_drawer().await;
    assert_eq!(browser.js("return location.hash").await, "#t=links");

    Box::pin(found_by_consumer_id(&browser, &key)).await;
    Box::pin(binary_promoted_and_status_per_trigger(
        &browser, &mut r, &key,
    ))
    .await;
    Box::pin(drawer_actions_and_details(&browser)).await;
    Box::pin(fits_and_screenshots(&browser)).await;
    browser.assert_no_error().await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
    cleanup_keys(&mut r, &other_key).await;
}

/// The drawer shows `member` with the id its consumers see, in trigger `links`.
async fn deep_link_opens(browser: &Browser, member: &str) {
    browser.wait_drawer(true).await;
    browser.wait_text("#drawer-title", member).await;
    assert_eq!(browser.text_of("#detail-name").await, "links");
    let fields = browser.text_of("#drawer-fields").await;
    assert!(
        fields
            .as_str()
            .unwrap()
            .contains(&format!("Member{member}Id")),
        "{fields}"
    );
}

/// The search finds `deep-target` by the id consumers see, though 1,500 are due before it.
async fn found_by_consumer_id(browser: &Browser, key: &str) {
    let id = MessageId::new(key, b"deep-target").as_str().to_string();
    browser.type_into("#search", &format!("{id}\u{E007}")).await;
    deep_link_opens(browser, "deep-target").await;
    browser
        .assert_text_has("#drawer-fields", &format!("Id{id}"))
        .await;
    browser
        .assert_text_has("#found", "the id its consumers see")
        .await;
    let hash = browser.js("return location.hash").await;
    assert_eq!(hash, format!("#t=links&q={id}&m=deep-target"));
    browser.escape_drawer().await;
    browser.click("#first-page").await;
}

/// Promote on the member that is not UTF-8 promotes it and says 1; the line goes when
/// another trigger is chosen.
async fn binary_promoted_and_status_per_trigger(browser: &Browser, r: &mut Conn, key: &str) {
    let binary = "#scheduled tbody tr[data-member-b64='YmluLf/+'] button[data-action='promote']";
    let listed = format!("return !!document.querySelector(\"{binary}\")");
    browser.wait_value(&listed, true).await;
    browser.click(binary).await;
    let status = browser
        .wait_js(
            "return document.querySelector('#status').textContent",
            WAIT,
            |v| v.as_str().is_some_and(|s| s.starts_with("Promoted")),
        )
        .await;
    assert_eq!(status, "Promoted on links: 1 message");
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(key)
        .arg(b"bin-\xff\xfe".as_slice())
        .query_async(r)
        .await
        .unwrap();
    let now = redis_now(r).await as f64;
    assert!(score.is_some_and(|s| s <= now), "{score:?}");
    browser
        .click("#triggers tr[data-trigger='other'] button[data-action='select']")
        .await;
    browser.wait_text("#status", "").await;
    assert_eq!(browser.js("return location.hash").await, "#t=other");
    browser
        .click("#triggers tr[data-trigger='links'] button[data-action='select']")
        .await;
    browser.wait_count("#dead tbody tr", 2).await;
}

/// A scheduled message's drawer offers Promote and Cancel, a dead letter's Requeue; a
/// `too_large` letter's detail says its size.
async fn drawer_actions_and_details(browser: &Browser) {
    let detail = browser
        .wait_js("return [...document.querySelectorAll('#dead tbody tr')].map(tr => tr.querySelector('[data-field=detail]').textContent)", WAIT, |v| {
            v.as_array().is_some_and(|a| a.len() == 2)
        })
        .await;
    assert_eq!(detail[0], "broker said no");
    let too_large = detail[1].as_str().unwrap();
    assert!(
        too_large.starts_with("1200000 bytes, over the trigger's max_message_bytes"),
        "{detail}"
    );
    browser
        .click("#dead tbody tr:nth-child(2) button[data-action='show']")
        .await;
    browser.wait_drawer(true).await;
    let actions = "return [...document.querySelectorAll('#drawer-actions button')].map(b => b.dataset.action)";
    browser
        .wait_js(actions, WAIT, |v| v == &serde_json::json!(["requeue"]))
        .await;
    browser
        .assert_text_has("#drawer-fields", "Detail1200000 bytes")
        .await;
    // The 1.2 MB member is too long for a URL: the link names it by its id.
    let hash = browser.js("return location.hash").await;
    assert!(hash.as_str().unwrap().starts_with("#t=links&id="), "{hash}");
    browser.escape_drawer().await;
    browser
        .click("#scheduled tbody tr[data-member-b64='YmluLf/+'] button[data-action='show']")
        .await;
    browser
        .wait_js(actions, WAIT, |v| {
            v == &serde_json::json!(["promote", "cancel"])
        })
        .await;
    browser.escape_drawer().await;
}

/// At 1,024 and 1,400 px, with the 1.2 MB member in both tables, no element is wider than
/// the window; each view is saved as a screenshot at both widths.
async fn fits_and_screenshots(browser: &Browser) {
    for width in [1024, 1400] {
        browser.viewport(width, 900).await;
        browser.wait_count("#scheduled tbody tr", 3).await;
        let over = browser
            .wait_js(OVERFLOWING, WAIT, |v| v == &serde_json::json!([]))
            .await;
        assert_eq!(over, serde_json::json!([]), "at {width} px");
        // The triggers and history at the top; the scheduled, in-flight and dead tables below.
        for (name, at) in [("triggers", "h1"), ("messages", "#scheduled")] {
            browser
                .js(&format!("document.querySelector('{at}').scrollIntoView()"))
                .await;
            browser
                .screenshot(&shots().join(format!("console-{name}-{width}.png")))
                .await;
        }
        browser
            .click("#dead tbody tr:nth-child(2) button[data-action='show']")
            .await;
        browser.wait_drawer(true).await;
        let over = browser.js(OVERFLOWING).await;
        assert_eq!(over, serde_json::json!([]), "drawer at {width} px");
        browser
            .screenshot(&shots().join(format!("console-drawer-{width}.png")))
            .await;
        browser.escape_drawer().await;
        browser.js("window.scrollTo(0, 0)").await;
    }
}
