//! A headless Chromium driven over the WebDriver protocol (chromedriver on a free port),
//! with just the commands the console test needs.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use super::http::request;

/// The W3C WebDriver key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (a 1366x900 window).
    pub async fn start() -> Self {
        let port = super::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that the browser it starts goes with it.
            .process_group(0)
            .spawn()
            .expect("chromedriver (Debian's chromium-driver) must be installed");
        assert!(
            super::servers::wait_port(port, true, Duration::from_secs(20)).await,
            "chromedriver did not listen"
        );
        let mut me = Self {
            driver,
            port,
            session: String::new(),
        };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1366,900"]
            }
        }}});
        let v = me.cmd("POST", "/session", Some(caps)).await;
        me.session = v["sessionId"].as_str().expect("a session").to_string();
        me
    }

    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let r = request(self.port, method, path, &[], body.as_deref()).await;
        let v = r.json();
        assert_eq!(r.status, 200, "webdriver {method} {path}: {}", r.body);
        v["value"].clone()
    }

    async fn session(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.cmd(method, &path, body).await
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.session("POST", "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub async fn js(&self, script: &str) -> Value {
        self.session(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Runs `script` until `pred` holds for its result, or panics after `timeout`.
    pub async fn wait_js(
        &self,
        script: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let end = std::time::Instant::now() + timeout;
        loop {
            let v = self.js(script).await;
            if pred(&v) {
                return v;
            }
            assert!(std::time::Instant::now() < end, "{script} stayed {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn find(&self, css: &str) -> String {
        let v = self
            .session(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT].as_str().expect("an element").to_string()
    }

    /// Clicks the element `css` selects.
    pub async fn click(&self, css: &str) {
        self.act_on(css, "click", json!({})).await;
    }

    /// Types `text` into the element `css` selects, as keystrokes (`\u{E007}` is Enter).
    pub async fn type_into(&self, css: &str, text: &str) {
        self.act_on(css, "value", json!({ "text": text })).await;
    }

    /// Posts `action` to the element `css` selects. A page that redraws itself (the console
    /// refreshes its tables) may replace the element between finding and acting: then it is
    /// found again, a few times at most.
    async fn act_on(&self, css: &str, action: &str, body: Value) {
        let body = body.to_string();
        for _ in 0..5 {
            let e = self.find(css).await;
            let path = format!("/session/{}/element/{e}/{action}", self.session);
            let r = request(self.port, "POST", &path, &[], Some(&body)).await;
            if r.status == 200 {
                return;
            }
            assert!(
                r.body.contains("stale element reference"),
                "webdriver POST {path}: {}",
                r.body
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css} was replaced five times in a row before it could take a {action}");
    }

    /// The text of the `confirm()` dialog, once one is open (a page may ask after a call of
    /// its own); panics after 10 s without one.
    async fn dialog_text(&self) -> String {
        let path = format!("/session/{}/alert/text", self.session);
        let end = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = request(self.port, "GET", &path, &[], None).await;
            if r.status == 200 {
                return r.json()["value"].as_str().unwrap_or_default().to_string();
            }
            assert!(std::time::Instant::now() < end, "no dialog: {}", r.body);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Accepts the open `confirm()` dialog, returning its text.
    pub async fn accept_dialog(&self) -> String {
        let text = self.dialog_text().await;
        self.session("POST", "/alert/accept", Some(json!({}))).await;
        text
    }

    /// Dismisses the open `confirm()` dialog (Cancel), returning its text.
    pub async fn dismiss_dialog(&self) -> String {
        let text = self.dialog_text().await;
        self.session("POST", "/alert/dismiss", Some(json!({})))
            .await;
        text
    }

    /// Makes the page see `prefers-color-scheme: dark` (Chromium's DevTools emulation).
    pub async fn prefer_dark(&self) {
        let params = json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]});
        self.session(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": params})),
        )
        .await;
    }

    /// Makes the page's viewport `width` x `height` CSS pixels (Chromium's DevTools emulation).
    pub async fn viewport(&self, width: u32, height: u32) {
        let params =
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        self.session(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": params})),
        )
        .await;
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let v = self.session("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64"))
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver and the browser it started share the process group.
        let _ = Command::new("kill")
            .args(["-9", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.wait();
    }
}
