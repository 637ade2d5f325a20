//! Who may call the admin API: read-only mode without a token, and the hosts and headers
//! that keep a browser from being turned against it.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_admin_api_needs_no_token_and_refuses_every_change() {
    let (mut r, capture, key) = amqp_scene("admin-ro", "ro", "admin").await;
    let (port, admin_port) = (free_port(), free_port());
    let config = admin_config(port, admin_port, &key, &capture, "read_only = true");
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    let read = request(admin_port, "GET", TRIGGERS, &[], None).await;
    assert_eq!(read.status, 200, "{}", read.body);
    let refused = request(
        admin_port,
        "POST",
        "/api/v1/triggers/api/pause",
        &[],
        Some("{}"),
    )
    .await;
    assert_eq!(refused.status, 403);
    assert!(refused.json()["error"]
        .as_str()
        .unwrap()
        .contains("read-only"));
    let paused: Option<String> =
        hget(&mut r, &QueueKeys::derive(&key).unwrap().control, "paused").await;
    assert_eq!(paused, None);

    // Without read_only, a missing token is a config error naming the key.
    let out = check(&admin_config(free_port(), free_port(), &key, &capture, ""));
    assert_eq!(out.0, 78, "{}", out.1);
    assert!(out.1.contains("admin.token_file"), "{}", out.1);
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

/// DNS rebinding and the browser's defences: a read-only API without a token answers only
/// requests naming an IP address, `localhost` or an `allowed_hosts` name; every response,
/// refusals included, carries the security headers, API replies are never cached, and the
/// console's page holds no inline script. A `NaN` cursor (and its neighbours) is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_refuses_foreign_hosts_and_sends_security_headers() {
    let (mut r, capture, key) = amqp_scene("admin-host", "host", "admin").await;
    let (port, admin_port) = (free_port(), free_port());
    let extra = "read_only = true\nallowed_hosts = [\"Bridge.Internal\"]";
    let config = admin_config(port, admin_port, &key, &capture, extra);
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    zadd(&mut r, &key, "+inf", "secret-body").await;
    let scheduled = "/api/v1/triggers/api/scheduled";
    for host in [
        "attacker.example",
        "attacker.example:80",
        "127.0.0.1.attacker.example",
    ] {
        let got = request(admin_port, "GET", scheduled, &[("Host", host)], None).await;
        assert_eq!(got.status, 421, "{host}: {}", got.body);
        assert!(!got.body.contains("secret-body"), "{host}: {}", got.body);
        assert_eq!(got.header("x-frame-options"), Some("DENY"), "{host}");
    }
    let page = format!("127.0.0.1:{admin_port}");
    for host in [
        page.as_str(),
        "localhost",
        "[::1]:1",
        "bridge.internal:8080",
    ] {
        let got = request(admin_port, "GET", scheduled, &[("Host", host)], None).await;
        assert_eq!(got.status, 200, "{host}: {}", got.body);
        assert!(got.body.contains("secret-body"), "{host}: {}", got.body);
    }
    for path in [
        "/console",
        "/console.js",
        "/console.css",
        TRIGGERS,
        "/nowhere",
    ] {
        let got = request(admin_port, "GET", path, &[], None).await;
        let csp = got.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        assert_eq!(got.header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(
            got.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(got.header("referrer-policy"), Some("no-referrer"), "{path}");
        let api = path.starts_with("/api/") || path == "/nowhere";
        if path.starts_with("/api/") {
            assert_eq!(got.header("cache-control"), Some("no-store"), "{path}");
        }
        assert!(api || got.status == 200, "{path}: {}", got.status);
    }
    let html = request(admin_port, "GET", "/console", &[], None).await.body;
    assert!(html.contains("<script src=\"/console.js\">"), "{html}");
    assert!(
        !html.contains("<script>") && !html.contains("<style>"),
        "{html}"
    );
    for cursor in ["NaN:", "nan:AA", "NaN:bWVtYmVy", "x:AA", "1:%%", ":"] {
        let path = format!("{scheduled}?after={}", cursor.replace('%', "%25"));
        let got = request(admin_port, "GET", &path, &[], None).await;
        assert_eq!(got.status, 400, "{cursor}: {}", got.body);
    }
    for cursor in ["inf:AA", "-inf:AA", "1e400:AA"] {
        let path = format!("{scheduled}?after={cursor}");
        let got = request(admin_port, "GET", &path, &[], None).await;
        assert_eq!(got.status, 200, "{cursor}: {}", got.body);
    }
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}
