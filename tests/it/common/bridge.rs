//! `delay-bridge run` as a child process: its own config file, log and metrics port.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{kill, metric_value, poll, unique, wait_until};

/// Path of the binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_delay-bridge")
}

/// A running `delay-bridge run` process with its own config file and metrics port; killed on drop.
pub struct Bridge {
    pub child: Child,
    pub config: PathBuf,
    pub metrics_port: u16,
    pub log: PathBuf,
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
}

impl Bridge {
    /// Writes `config` to a temp file and starts `delay-bridge run` on it.
    pub fn start(config: &str, metrics_port: u16) -> Self {
        Self::start_with_env(config, metrics_port, &[])
    }

    /// Like [`Bridge::start`], with extra environment variables (e.g. `DELAY_BRIDGE_...` overrides).
    pub fn start_with_env(config: &str, metrics_port: u16, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bridge.toml");
        std::fs::write(&path, config).unwrap();
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::spawn(path, metrics_port, env, dir)
    }

    fn spawn(
        config: PathBuf,
        metrics_port: u16,
        env: Vec<(String, String)>,
        dir: tempfile::TempDir,
    ) -> Self {
        let log = dir.path().join(format!("bridge-{}.log", unique("run")));
        let child = Command::new(binary())
            .args(["run", "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start delay-bridge");
        Self {
            child,
            config,
            metrics_port,
            log,
            env,
            dir,
        }
    }

    /// Waits until the bridge is ready (asserting it is within `timeout`) and returns it.
    pub async fn ready(mut self, timeout: Duration) -> Self {
        assert!(
            self.wait_ready(timeout).await,
            "bridge not ready:\n{}",
            self.log()
        );
        self
    }

    /// Kills the process and starts a second one on the same config file, port and environment.
    pub fn restart(mut self) -> Self {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let next = Self::spawn(
            self.config.clone(),
            self.metrics_port,
            std::mem::take(&mut self.env),
            dir,
        );
        drop(self);
        next
    }

    /// Replaces the configuration file the process was started with (for a reload).
    pub fn rewrite_config(&self, config: &str) {
        std::fs::write(&self.config, config).unwrap();
    }

    /// Rewrites the config file with `config`, sends SIGHUP and asserts that
    /// `delay_bridge_config_reloads_total` counts the reload within 10 s.
    pub async fn reload(&self, config: &str) {
        const RELOADS: &str = "delay_bridge_config_reloads_total";
        let before = self.metric(RELOADS, &[]).await;
        self.rewrite_config(config);
        self.signal(1);
        let (reloaded, body) = self
            .wait_scrape(Duration::from_secs(10), |body| {
                metric_value(body, RELOADS, &[]) > before
            })
            .await;
        assert!(reloaded, "not reloaded:\n{body}\n{}", self.log());
    }

    /// Sends a signal to the process.
    pub fn signal(&self, sig: i32) {
        kill(self.child.id() as i32, sig);
    }

    /// Sends SIGTERM and asserts that the process exits 0 within `timeout`.
    pub async fn terminate(&mut self, timeout: Duration) {
        self.signal(15);
        let code = self.wait_exit(timeout).await;
        assert_eq!(code, Some(0), "exit after SIGTERM\n{}", self.log());
    }

    /// Waits for the process to exit, up to `timeout`; returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let (_, status) = poll(
            timeout,
            Duration::from_millis(20),
            async || self.child.try_wait().unwrap(),
            Option::is_some,
        )
        .await;
        status.map(|s| s.code().unwrap_or(-1))
    }

    /// Asserts that the process exits with `code` within `timeout`; returns its log.
    pub async fn expect_exit(&mut self, code: i32, timeout: Duration) -> String {
        let exited = self.wait_exit(timeout).await;
        let log = self.log();
        assert_eq!(exited, Some(code), "{log}");
        log
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Asserts that the process has not logged a panic.
    pub fn assert_no_panic(&self) {
        let log = self.log();
        assert!(!log.contains("panicked"), "{log}");
    }

    /// Asserts that the process still runs and has not logged a panic.
    pub fn assert_alive(&mut self) {
        let exited = self.child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "the bridge died: {exited:?}\n{}",
            self.log()
        );
        self.assert_no_panic();
    }

    /// GETs a path on the metrics port: (status, body).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.metrics_port, path).await
    }

    /// The body of `/metrics` (which must answer).
    pub async fn scrape(&self) -> String {
        self.get("/metrics").await.expect("/metrics answers").1
    }

    /// Waits until `/readyz` answers 200; returns false if the process exited or it took too long.
    pub async fn wait_ready(&mut self, timeout: Duration) -> bool {
        let (_, ready) = poll(
            timeout,
            Duration::from_millis(50),
            async || {
                if self.child.try_wait().unwrap().is_some() {
                    return Some(false);
                }
                matches!(self.get("/readyz").await, Some((200, _))).then_some(true)
            },
            Option::is_some,
        )
        .await;
        ready == Some(true)
    }

    /// Polls `/readyz` until it answers `status`.
    pub async fn wait_readyz(&self, status: u16, timeout: Duration) -> bool {
        self.wait_http("/readyz", timeout, |s, _| s == status)
            .await
            .0
    }

    /// Asserts that a consumer's `count` of what arrived from this bridge reaches `n` within
    /// `timeout`.
    pub async fn expect_arrivals(&self, n: usize, timeout: Duration, count: impl Fn() -> usize) {
        assert!(
            wait_until(timeout, || count() >= n).await,
            "only {} of {n} arrived\n{}",
            count(),
            self.log()
        );
    }

    /// Asserts that `/readyz` answers `status` within `timeout`.
    pub async fn expect_readyz(&self, status: u16, timeout: Duration) {
        assert!(
            self.wait_readyz(status, timeout).await,
            "/readyz did not answer {status}\n{}",
            self.log()
        );
    }

    /// Asserts that `/readyz` answers `status` with a body holding `text` within `timeout`.
    pub async fn expect_readyz_saying(&self, status: u16, text: &str, timeout: Duration) {
        let (said, answer) = self
            .wait_http("/readyz", timeout, |s, body| {
                s == status && body.contains(text)
            })
            .await;
        assert!(
            said,
            "/readyz did not answer {status} with {text:?}: {answer:?}\n{}",
            self.log()
        );
    }

    /// The value of one sample in `/metrics` (e.g. `delay_bridge_messages_forwarded_total{...}`),
    /// 0 if absent, NaN if `/metrics` does not answer.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let Some((_, body)) = self.get("/metrics").await else {
            return f64::NAN;
        };
        metric_value(&body, name, labels)
    }

    /// [`metric`](Self::metric) for the label `trigger` alone.
    pub async fn trigger_metric(&self, name: &str, trigger: &str) -> f64 {
        self.metric(name, &[("trigger", trigger)]).await
    }

    /// Several samples from one scrape of `/metrics`, in the order of `names` (as
    /// [`metric`](Self::metric): 0 if absent, NaN if `/metrics` does not answer).
    pub async fn metrics<const N: usize>(
        &self,
        names: [&str; N],
        labels: &[(&str, &str)],
    ) -> [f64; N] {
        let body = self.get("/metrics").await.map(|(_, body)| body);
        names.map(|name| match &body {
            Some(body) => metric_value(body, name, labels),
            None => f64::NAN,
        })
    }

    /// Scrapes `/metrics` until `f` holds or `timeout` passes; returns whether it held and the
    /// last body scraped.
    pub async fn wait_scrape<F: FnMut(&str) -> bool>(
        &self,
        timeout: Duration,
        mut f: F,
    ) -> (bool, String) {
        let mut last = String::new();
        let (held, _) = poll(
            timeout,
            Duration::from_millis(50),
            async || match self.get("/metrics").await {
                Some((200, body)) => {
                    let held = f(&body);
                    last = body;
                    held
                }
                _ => false,
            },
            |held| *held,
        )
        .await;
        (held, last)
    }

    /// Scrapes `/metrics` until `trigger`'s `delay_bridge_trigger_held` gauge says `held` or
    /// `timeout` passes; returns whether it did and the last body scraped.
    pub async fn wait_held(&self, trigger: &str, held: bool, timeout: Duration) -> (bool, String) {
        let labels = [("trigger", trigger)];
        let want = if held { 1.0 } else { 0.0 };
        self.wait_scrape(timeout, |body| {
            metric_value(body, "delay_bridge_trigger_held", &labels) == want
        })
        .await
    }

    /// GETs `path` until `f(status, body)` holds or `timeout` passes; returns the last answer.
    pub async fn wait_http<F: FnMut(u16, &str) -> bool>(
        &self,
        path: &str,
        timeout: Duration,
        mut f: F,
    ) -> (bool, Option<(u16, String)>) {
        poll(
            timeout,
            Duration::from_millis(50),
            async || self.get(path).await,
            |got| matches!(got, Some((status, body)) if f(*status, body)),
        )
        .await
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Minimal HTTP/1.1 GET on loopback: (status, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .ok()?
    .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// The same sample of `/metrics` from each of `bridges` (as [`Bridge::metric`]).
pub async fn metric_of_each<const N: usize>(
    bridges: [&Bridge; N],
    name: &str,
    labels: &[(&str, &str)],
) -> [f64; N] {
    let mut values = [0.0; N];
    for (value, bridge) in values.iter_mut().zip(bridges) {
        *value = bridge.metric(name, labels).await;
    }
    values
}
