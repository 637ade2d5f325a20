//! `delay-bridge health` against a real running bridge and a real listener: 0 on a 200 from
//! `/healthz`, 1 on anything else, one line either way.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::*;

/// Runs `delay-bridge health ARGS` in `dir` (so the search path finds nothing there);
/// its exit code and output.
fn health(args: &[&str], dir: &std::path::Path) -> (i32, String) {
    let out = Command::new(binary())
        .arg("health")
        .args(args)
        .current_dir(dir)
        .env_remove("DELAY_BRIDGE_CONFIG")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_zero_while_the_bridge_runs_and_one_after() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let capture = AmqpCapture::start("health").await;
    let key = format!("{}:{{health}}", unique("delay"));
    let config = base_config(port) + &amqp_trigger("health", &key, &capture, "");
    let mut bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(15))
        .await;
    let url = format!("http://127.0.0.1:{port}/healthz");

    let (code, text) = health(&["--url", &url], dir.path());
    assert_eq!(code, 0, "{text}");
    let ready = format!("http://127.0.0.1:{port}/readyz");
    assert_eq!(
        text.trim(),
        format!("healthy: {url} answered 200\nready: {ready} answered 200"),
        "alive, then ready"
    );
    // Without --url: the config's [metrics] listen.
    let config = bridge.config.to_str().unwrap().to_string();
    let (code, text) = health(&["--config", &config], dir.path());
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(&url), "{text}");
    // Found on the search path through the variable.
    let out = Command::new(binary())
        .arg("health")
        .current_dir(dir.path())
        .env("DELAY_BRIDGE_CONFIG", &config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // A path that is not served answers 404: unhealthy.
    let missing = format!("http://127.0.0.1:{port}/nothing-here");
    let (code, text) = health(&["--url", &missing], dir.path());
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("answered 404"), "{text}");

    bridge.terminate(Duration::from_secs(15)).await;
    let (code, text) = health(&["--url", &url], dir.path());
    assert_eq!(code, 1, "{text}");
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    assert!(text.starts_with("unhealthy: "), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_never_answers_is_unhealthy_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts and holds the connection without a word.
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let url = format!("http://{addr}/healthz");
    let started = std::time::Instant::now();
    let (code, text) = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        move || health(&["--url", &url, "--timeout", "500ms"], &dir)
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("no answer within 500ms"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    held.abort();
}

#[test]
fn without_a_config_the_default_listener_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = health(&["--timeout", "1s"], dir.path());
    // Whether or not something listens there, the line names the default URL.
    assert!(
        text.contains("http://127.0.0.1:9464/healthz"),
        "{code}: {text}"
    );
    let (code, text) = health(&["--config", "/does/not/exist.toml"], dir.path());
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("/does/not/exist.toml"), "{text}");
}
