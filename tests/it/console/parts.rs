//! The parts of the console test over history, dead letters, the message drawer, search,
//! bulk actions and dark mode, each a function of the one page they drive.

use super::*;

/// History: the 40 forwarded show as a rate, and the table's p99 is the last minute's; the
/// forecast's labels clear of its bars; times relative to now.
pub(super) async fn history_and_forecast(browser: &Browser, admin_port: u16) {
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
        .wait_js(&field("more", "lateness"), WAIT, |v| {
            v.as_str()
                .is_some_and(|s| s.ends_with(" ms") || s.ends_with(" s"))
        })
        .await;
    let points = get_with_token(
        admin_port,
        "/api/v1/triggers/more/history?window=15m",
        TOKEN,
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
    let window = "return document.querySelector('#chart-due').dataset.window";
    for span in ["1h", "15m"] {
        browser.click(&format!("#window-{span}")).await;
        browser.wait_value(window, span).await;
    }
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
pub(super) async fn dead_letter_pages(browser: &Browser) {
    browser.wait_count("#dead tbody tr", 25).await;
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
        .wait_js(&texts("#dead tbody tr td:nth-child(2)"), WAIT, |v| {
            v == &serde_json::json!(["dead-25", "dead-26", "dead-27", "dead-28", "dead-29"])
        })
        .await;
    browser.click("#dead-first").await;
    browser.wait_count("#dead tbody tr", 25).await;
}

/// The drawer: an envelope's fields, headers and pretty-printed JSON body; a dead letter's
/// reason; search by member and by prefix; every control focusable.
pub(super) async fn drawer_and_search(browser: &Browser, envelope: &str) {
    // In flight: the lease's end, relative to now, and in the drawer.
    let lease = browser
        .wait_js(&texts("#inflight tbody tr td"), WAIT, |v| {
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
    browser.wait_drawer(true).await;
    browser
        .assert_text_has("#drawer-fields", "Statein flightLease ends")
        .await;
    browser.escape_drawer().await;
    let row = format!(
        "#scheduled tbody tr[data-member='{}'] td:nth-child(2)",
        envelope.replace('\\', "\\\\").replace('\'', "\\'")
    );
    browser.click(&row).await;
    browser.wait_drawer(true).await;
    let body = browser.text_of("#drawer-body").await;
    assert_eq!(
        body, "{\n  \"order\": 42,\n  \"items\": [\n    1,\n    2\n  ]\n}",
        "{body}"
    );
    browser
        .assert_text_has("#drawer-headers", "traceparent00-4bf92f35")
        .await;
    for part in ["routing_keyorders.created", "Due"] {
        browser.assert_text_has("#drawer-fields", part).await;
    }
    browser
        .screenshot(&shots().join("console-drawer.png"))
        .await;
    // Escape closes it (the focus is on its Close button).
    let focused = browser.js("return document.activeElement.id").await;
    assert_eq!(focused, "drawer-close");
    browser.escape_drawer().await;

    dead_letter_drawer(browser).await;

    // Search: an exact member opens the drawer; a prefix lists the matches it read.
    browser.type_into("#search", "later-1\u{E007}").await;
    browser.wait_drawer(true).await;
    assert_eq!(browser.text_of("#drawer-title").await, "later-1");
    browser.type_into("#drawer-close", "\u{E00C}").await;
    browser.set_value("#search", "").await;
    browser.type_into("#search", "later\u{E007}").await;
    browser
        .wait_js(&texts("#scheduled tbody tr td:nth-child(2)"), WAIT, |v| {
            v == &serde_json::json!(["later-0", "later-1", "later-2"])
        })
        .await;
    let found = browser.text_of("#found").await;
    assert!(
        found
            .as_str()
            .unwrap()
            .starts_with("3 scheduled messages start with"),
        "{found}"
    );
    browser.click("#first-page").await;
    browser.wait_count("#scheduled tbody tr", 4).await;

    // Keyboard: every button and every message row can take the focus.
    let unfocusable = browser
        .js("return [...document.querySelectorAll('button, #scheduled tbody tr, #dead tbody tr')].filter(e => e.tabIndex < 0).length")
        .await;
    assert_eq!(unfocusable, 0);
}

/// A dead letter's drawer: its reason, detail and attempts; closed by its button.
async fn dead_letter_drawer(browser: &Browser) {
    browser
        .click("#dead tbody tr:first-child button[data-action=\"show\"]")
        .await;
    browser.wait_drawer(true).await;
    let fields = browser.text_of("#drawer-fields").await;
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
    browser.wait_drawer(false).await;
}

/// Confirms the bulk action of button `css`, checking that it asked `question`, and waits
/// until trigger `more` has `left` dead letters.
async fn dead_left_after(browser: &Browser, css: &str, question: &str, left: &str) {
    browser.confirm(css, question).await;
    browser.wait_field("more", "dead", left).await;
}

/// Bulk: the oldest 5, the 10 with one reason, then all of the rest; each question names the
/// count. A purge asked and declined deletes nothing. Then dark mode.
pub(super) async fn bulk_and_dark_mode(browser: &Browser) {
    browser.set_value("#requeue-count", "5").await;
    let question = "Requeue the 5 oldest dead letters of more?";
    dead_left_after(browser, "#requeue-oldest", question, "25").await;
    // The 10 whose reason is too_large, counted before the question.
    let reasons = "return [...document.querySelectorAll('#purge-reason option')].map(o => o.value)";
    let offered = serde_json::json!(["nack", "too_large"]);
    browser.wait_value(reasons, offered).await;
    browser.set_value("#purge-reason", "too_large").await;
    let question = "Delete the 10 dead letters of more whose reason is too_large";
    dead_left_after(browser, "#purge-by-reason", question, "15").await;
    browser
        .wait_text("#purge-dead", "Purge all dead letters (15)")
        .await;
    browser
        .decline("#purge-dead", "Delete all 15 dead letters of more")
        .await;
    let question = "Requeue all 15 dead letters of more?";
    dead_left_after(browser, "#requeue-all", question, "0").await;

    // Dark mode follows the system's preference.
    browser.prefer_dark().await;
    let background = browser
        .js("return getComputedStyle(document.documentElement).backgroundColor")
        .await;
    assert_eq!(background, "rgb(20, 24, 28)");
}
