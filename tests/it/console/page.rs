//! The console's page as the tests drive and read it: opened on an admin API, its fields,
//! tables, dialogs and drawer.

use super::*;

/// How long the page may take to show what a step expects.
pub(super) const WAIT: Duration = Duration::from_secs(15);

/// A queue for a console test: a connection to Redis, a capture bound to the routing key
/// `name`, a fresh key with the hash tag `name`, and the key's derived keys.
pub(super) async fn console_queue(name: &str) -> (Conn, AmqpCapture, String, QueueKeys) {
    let r = redis().await;
    let capture = AmqpCapture::start(name).await;
    let key = format!("{}:{{{name}}}", unique("ui"));
    let keys = QueueKeys::derive(&key).unwrap();
    (r, capture, key, keys)
}

/// Three messages `later-0` to `later-2`, due 10, 11 and 12 minutes after `now`.
pub(super) async fn schedule_later(r: &mut Conn, key: &str, now: i64) {
    let later = (0..3).map(|i| (now + 600_000 + i * 60_000, format!("later-{i}")));
    zadd_all(r, key, later).await;
}

/// A bridge with the admin API on a port of its own, behind [`TOKEN`], and the trigger
/// `trigger` from `key` to `capture` sampled every 200 ms; ready. Returns the admin port too.
pub(super) async fn start_with_token(
    trigger: &str,
    key: &str,
    capture: &AmqpCapture,
) -> (Bridge, u16) {
    let (port, admin_port) = (free_port(), free_port());
    let config = base_config(port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n")
        + &amqp_trigger(trigger, key, capture, "guard_interval = \"200ms\"\n");
    let bridge = Bridge::start_with_env(&config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)])
        .ready(Duration::from_secs(20))
        .await;
    (bridge, admin_port)
}

/// A browser on the console of the admin API at `admin_port`; with a `token`, signed in by
/// keyboard only: the token, then Enter submits the form.
pub(super) async fn open_console(admin_port: u16, token: Option<&str>) -> Browser {
    let browser = Browser::start().await;
    browser
        .goto(&format!("http://127.0.0.1:{admin_port}/"))
        .await;
    if let Some(token) = token {
        browser
            .type_into("#token", &format!("{token}\u{E007}"))
            .await;
    }
    browser
}

/// What the console tests read and do on the page.
pub(super) trait Page {
    /// Waits until the cell `name` of trigger `trigger` reads `want`.
    async fn wait_field(&self, trigger: &str, name: &str, want: &str);
    /// Waits until `css` selects `n` elements.
    async fn wait_count(&self, css: &str, n: u64);
    /// Waits until the message drawer is shown (`true`) or hidden.
    async fn wait_drawer(&self, open: bool);
    /// Presses Escape on the drawer's Close button, and waits until the drawer is hidden.
    async fn escape_drawer(&self);
    /// The text of the element `css` selects (null if none).
    async fn text_of(&self, css: &str) -> Value;
    /// Waits until the text of the element `css` selects is `want`.
    async fn wait_text(&self, css: &str, want: &str);
    /// Waits until `script` returns `want`.
    async fn wait_value(&self, script: &str, want: impl Into<Value>);
    /// Sets the value of the input or select `css` selects.
    async fn set_value(&self, css: &str, value: &str);
    /// Asserts that the text of the element `css` selects holds `part`.
    async fn assert_text_has(&self, css: &str, part: &str);
    /// Clicks `css`, accepts the dialog it opens, and checks that the dialog asked `question`.
    async fn confirm(&self, css: &str, question: &str);
    /// Clicks `css`, dismisses the dialog it opens, and checks that the dialog asked
    /// `question`.
    async fn decline(&self, css: &str, question: &str);
    /// The status line shows no error.
    async fn assert_no_error(&self);
}

impl Page for Browser {
    async fn wait_field(&self, trigger: &str, name: &str, want: &str) {
        self.wait_js(&field(trigger, name), WAIT, |v| v == want)
            .await;
    }

    async fn wait_count(&self, css: &str, n: u64) {
        self.wait_js(
            &format!("return document.querySelectorAll('{css}').length"),
            WAIT,
            |v| v == n,
        )
        .await;
    }

    async fn wait_drawer(&self, open: bool) {
        self.wait_js(&shown("#drawer"), WAIT, |v| v == open).await;
    }

    async fn escape_drawer(&self) {
        self.type_into("#drawer-close", "\u{E00C}").await;
        self.wait_drawer(false).await;
    }

    async fn text_of(&self, css: &str) -> Value {
        self.js(&text_script(css)).await
    }

    async fn wait_text(&self, css: &str, want: &str) {
        self.wait_js(&text_script(css), WAIT, |v| v == want).await;
    }

    async fn wait_value(&self, script: &str, want: impl Into<Value>) {
        let want = want.into();
        self.wait_js(script, WAIT, |v| *v == want).await;
    }

    async fn set_value(&self, css: &str, value: &str) {
        self.js(&format!(
            "document.querySelector('{css}').value = '{value}'"
        ))
        .await;
    }

    async fn assert_text_has(&self, css: &str, part: &str) {
        let text = self.text_of(css).await;
        assert!(
            text.as_str().is_some_and(|t| t.contains(part)),
            "{css}: {text}"
        );
    }

    async fn confirm(&self, css: &str, question: &str) {
        self.click(css).await;
        let asked = self.accept_dialog().await;
        assert!(asked.contains(question), "{asked}");
    }

    async fn decline(&self, css: &str, question: &str) {
        self.click(css).await;
        let asked = self.dismiss_dialog().await;
        assert!(asked.contains(question), "{asked}");
    }

    async fn assert_no_error(&self) {
        let errors: Value = self
            .js("return document.querySelector('#status.error')?.textContent ?? null")
            .await;
        assert_eq!(errors, Value::Null);
    }
}

/// The script that reads the text of the element `css` selects (null if none).
fn text_script(css: &str) -> String {
    format!("return document.querySelector('{css}')?.textContent ?? null")
}
