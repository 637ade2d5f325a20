//! The admin API of a running bridge against real Redis and RabbitMQ: the token, every
//! route acting on the queue, bad input, audit lines, read-only mode, and the OpenAPI file
//! checked against what the server answered.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::http::{request, Response};
use common::*;
use delay_bridge::keys::{shard_key, shard_of, QueueKeys};
use serde_json::{json, Value};

const TOKEN: &str = "a-token-of-32-characters-exactly";

/// Calls the API, recording (method, route, status) to check against the OpenAPI file.
struct Api {
    port: u16,
    calls: Vec<(String, String, u16)>,
}

impl Api {
    async fn call(
        &mut self,
        method: &str,
        route: &str,
        trigger: &str,
        tail: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> Response {
        let path = route.replace("{trigger}", trigger) + tail;
        let path = match path.split_once("{member}") {
            Some(_) => path.replace("{member}", ""),
            None => path,
        };
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        let body = body.map(|b| b.to_string());
        let r = request(self.port, method, &path, &headers, body.as_deref()).await;
        self.calls
            .push((method.to_lowercase(), route.to_string(), r.status));
        r
    }

    async fn get(&mut self, route: &str, trigger: &str, tail: &str) -> Response {
        self.call("GET", route, trigger, tail, None, Some(TOKEN))
            .await
    }

    async fn post(&mut self, route: &str, trigger: &str, body: Value) -> Response {
        self.call("POST", route, trigger, "", Some(body), Some(TOKEN))
            .await
    }
}

const TRIGGERS: &str = "/api/v1/triggers";
const SCHEDULED: &str = "/api/v1/triggers/{trigger}/scheduled";
const MESSAGE: &str = "/api/v1/triggers/{trigger}/messages/{member}";
const FORECAST: &str = "/api/v1/triggers/{trigger}/forecast";
const DEAD: &str = "/api/v1/triggers/{trigger}/dead";
const PAUSE: &str = "/api/v1/triggers/{trigger}/pause";
const RESUME: &str = "/api/v1/triggers/{trigger}/resume";
const PROMOTE: &str = "/api/v1/triggers/{trigger}/promote";
const RESCHEDULE: &str = "/api/v1/triggers/{trigger}/reschedule";
const CANCEL: &str = "/api/v1/triggers/{trigger}/cancel";
const PURGE: &str = "/api/v1/triggers/{trigger}/purge";
const REQUEUE: &str = "/api/v1/triggers/{trigger}/dead/requeue";
const INFLIGHT: &str = "/api/v1/triggers/{trigger}/inflight";
const HISTORY: &str = "/api/v1/triggers/{trigger}/history";

fn admin_config(
    metrics_port: u16,
    admin_port: u16,
    key: &str,
    capture: &AmqpCapture,
    extra: &str,
) -> String {
    admin_config_with(metrics_port, admin_port, key, capture, extra, "")
}

/// [`admin_config`] with `trigger_extra` lines in the trigger `api`.
fn admin_config_with(
    metrics_port: u16,
    admin_port: u16,
    key: &str,
    capture: &AmqpCapture,
    extra: &str,
    trigger_extra: &str,
) -> String {
    base_config(metrics_port)
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n{extra}\n")
        + &amqp_trigger("api", key, capture, trigger_extra)
}

/// Starts a bridge on `config` with the admin token set, and a client for its API.
async fn start_with_api(config: &str, port: u16, admin_port: u16) -> (Bridge, Api) {
    let bridge = Bridge::start_with_env(config, port, &[("DELAY_BRIDGE_ADMIN_TOKEN", TOKEN)])
        .ready(Duration::from_secs(20))
        .await;
    let api = Api {
        port: admin_port,
        calls: Vec::new(),
    };
    (bridge, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_reads_and_acts_on_a_queue_as_its_openapi_file_says() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("admin").await;
    let key = format!("{}:{{admin}}", unique("api"));
    let (port, admin_port) = (free_port(), free_port());
    let config = admin_config(port, admin_port, &key, &capture, "");
    let (bridge, mut api) = start_with_api(&config, port, admin_port).await;

    // The token: missing or wrong is 401 with a challenge, and counted.
    let r401 = api.call("GET", TRIGGERS, "", "", None, None).await;
    assert_eq!(r401.status, 401);
    assert_eq!(r401.header("www-authenticate"), Some("Bearer"));
    assert!(r401.json()["error"].as_str().unwrap().contains("Bearer"));
    let wrong = api
        .call(
            "POST",
            PAUSE,
            "api",
            "",
            None,
            Some("a-token-of-32-characters-exactlY"),
        )
        .await;
    assert_eq!(wrong.status, 401);

    // Far-future messages, one dead letter: the numbers match Redis.
    let now = redis_now(&mut r).await;
    let later: Vec<(i64, String)> = (0..5)
        .map(|i| (now + 3_600_000 + i, format!("later-{i}")))
        .collect();
    zadd_all(&mut r, &key, later.iter().cloned()).await;
    dead_letter(
        &mut r,
        &key,
        "dead-0",
        now,
        r#"{"reason":"nack","attempts":3}"#,
    )
    .await;
    let list = api.get(TRIGGERS, "", "").await;
    assert_eq!(list.status, 200, "{}", list.body);
    let t = &list.json()["triggers"][0];
    assert_eq!(t["name"], "api");
    assert_eq!(t["key"], key.as_str());
    assert_eq!(t["stats"]["scheduled"], 5);
    assert_eq!(t["stats"]["dead"], 1);
    assert_eq!(t["stats"]["paused"], false);

    let page = api.get(SCHEDULED, "api", "?limit=2").await;
    let p = page.json();
    assert_eq!(p["items"][0]["member"], "later-0");
    assert_eq!(p["items"].as_array().unwrap().len(), 2);
    let next = p["next"].as_str().unwrap().to_string();
    let page2 = api
        .get(SCHEDULED, "api", &format!("?limit=10&after={next}"))
        .await;
    let members: Vec<String> = page2.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["member"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(members, ["later-2", "later-3", "later-4"]);
    let shown = api.get(MESSAGE, "api", "later-1").await;
    assert_eq!(shown.json()["places"][0]["state"], "scheduled");
    let none = api.get(MESSAGE, "api", "nobody").await;
    assert_eq!(none.status, 404);
    let f = api
        .get(FORECAST, "api", "?bucket_ms=3600000&buckets=2")
        .await
        .json();
    assert_eq!(
        (f["overdue"].clone(), f["buckets"].clone()),
        (json!(0), json!([5, 0]))
    );
    let dead = api.get(DEAD, "api", "?limit=10").await.json();
    assert_eq!(dead["items"][0]["reason"]["reason"], "nack");
    assert_eq!(dead["next"], Value::Null);
    // A page of one: its cursor leads to an empty last page.
    let first = api.get(DEAD, "api", "?limit=1").await.json();
    assert_eq!(first["items"][0]["member"], "dead-0");
    let after = first["next"].as_str().unwrap().to_string();
    let rest = api
        .get(DEAD, "api", &format!("?limit=1&after={after}"))
        .await
        .json();
    assert_eq!(
        (rest["items"].clone(), rest["next"].clone()),
        (json!([]), Value::Null)
    );
    // In flight: a member leased for the next 5 minutes, with its deadline.
    let inflight_key = QueueKeys::derive(&key).unwrap().inflight;
    let lease = redis_now(&mut r).await + 300_000;
    zadd(&mut r, &inflight_key, lease, "leased-0").await;
    let inflight = api.get(INFLIGHT, "api", "?limit=10").await.json();
    assert_eq!(
        inflight["items"],
        json!([{"member": "leased-0", "lease_deadline_ms": lease}])
    );
    assert!(inflight["now_ms"].as_i64().unwrap() > 0);
    let _: () = redis::cmd("DEL")
        .arg(&inflight_key)
        .query_async(&mut r)
        .await
        .unwrap();
    let history = api.get(HISTORY, "api", "?window=1h").await.json();
    assert_eq!(history["interval_ms"], 10_000);
    assert!(history["points"].is_array());
    assert_eq!(api.get(HISTORY, "nope", "").await.status, 404);

    // Bad input: a clear 4xx, never a panic or an unbounded call.
    for (route, tail) in [
        (SCHEDULED, "?limit=5000"),
        (SCHEDULED, "?after=nonsense"),
        (SCHEDULED, "?limit=x"),
        (FORECAST, "?buckets=100000"),
        (DEAD, "?limit=0"),
        (DEAD, "?after=nonsense"),
        (INFLIGHT, "?limit=5000"),
        (HISTORY, "?window=2d"),
    ] {
        let bad = api.get(route, "api", tail).await;
        assert_eq!(bad.status, 400, "{route}{tail}: {}", bad.body);
        assert!(bad.json()["error"].is_string());
    }
    assert_eq!(api.get(SCHEDULED, "nope", "").await.status, 404);
    assert_eq!(
        api.post(PROMOTE, "api", json!({"members": []}))
            .await
            .status,
        400
    );
    assert_eq!(
        api.post(PROMOTE, "api", json!({"member": "x"}))
            .await
            .status,
        400
    );
    assert_eq!(
        api.post(PURGE, "api", json!({"what": "scheduled"}))
            .await
            .status,
        400
    );
    let unknown = request(
        admin_port,
        "GET",
        "/api/v2/x",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        None,
    )
    .await;
    assert_eq!(unknown.status, 404);

    // Pause, then promote a message: nothing goes until resume.
    let paused = api.post(PAUSE, "api", json!(null)).await;
    assert_eq!(paused.json(), json!({"paused": true, "changed": true}));
    bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, "delay_bridge_trigger_paused", &[("trigger", "api")]) == 1.0
        })
        .await;
    let promoted = api
        .post(PROMOTE, "api", json!({"members": ["later-0", "nobody"]}))
        .await;
    assert_eq!(promoted.json(), json!({"changed": 1}));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(capture.count(), 0, "paused");
    let resumed = api.post(RESUME, "api", json!(null)).await;
    assert_eq!(resumed.json()["changed"], true);
    bridge
        .expect_arrivals(1, Duration::from_secs(10), || capture.count())
        .await;
    assert_eq!(capture.snapshot()[0].body, b"later-0");

    // Reschedule, cancel, requeue, purge.
    let moved = api
        .post(
            RESCHEDULE,
            "api",
            json!({"members": ["later-1"], "due_ms": now + 7_200_000}),
        )
        .await;
    assert_eq!(moved.json(), json!({"changed": 1}));
    let cancelled = api
        .post(CANCEL, "api", json!({"members": ["later-2", "nobody"]}))
        .await;
    assert_eq!(cancelled.json(), json!({"cancelled": 1}));
    let requeued = api
        .post(REQUEUE, "api", json!({"members": ["dead-0"]}))
        .await;
    assert_eq!(requeued.json(), json!({"requeued": 1}));
    bridge
        .expect_arrivals(2, Duration::from_secs(10), || capture.count())
        .await;
    let purged = api
        .post(
            PURGE,
            "api",
            json!({"what": "scheduled", "to_ms": now + 3_700_000, "confirm": true}),
        )
        .await;
    assert_eq!(purged.json(), json!({"deleted": 2}), "later-3 and later-4");
    // By reason: counted first (a dry run), then only those deleted.
    let now = redis_now(&mut r).await;
    for (i, reason) in ["nack", "too_large", "nack"].iter().enumerate() {
        let json = format!(r#"{{"reason":"{reason}","attempts":1}}"#);
        dead_letter(&mut r, &key, &format!("dead-r{i}"), now + i as i64, &json).await;
    }
    // A cursor whose member has left since still leads to the letters after it.
    let first = api.get(DEAD, "api", "?limit=1").await.json();
    assert_eq!(first["items"][0]["member"], "dead-r0");
    let _: () = redis::cmd("ZREM")
        .arg(QueueKeys::derive(&key).unwrap().dead)
        .arg("dead-r0")
        .query_async(&mut r)
        .await
        .unwrap();
    let after = first["next"].as_str().unwrap().to_string();
    let rest = api
        .get(DEAD, "api", &format!("?limit=5&after={after}"))
        .await
        .json();
    let members: Vec<&str> = rest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["member"].as_str().unwrap())
        .collect();
    assert_eq!(members, ["dead-r1", "dead-r2"]);
    dead_letter(
        &mut r,
        &key,
        "dead-r0",
        now,
        r#"{"reason":"nack","attempts":1}"#,
    )
    .await;
    let count = json!({"what": "dead", "reason": "nack", "dry_run": true});
    assert_eq!(
        api.post(PURGE, "api", count).await.json(),
        json!({"matching": 2})
    );
    let all = json!({"what": "dead", "dry_run": true});
    assert_eq!(
        api.post(PURGE, "api", all).await.json(),
        json!({"matching": 3})
    );
    let wrong = json!({"what": "scheduled", "reason": "nack", "confirm": true});
    assert_eq!(api.post(PURGE, "api", wrong).await.status, 400);
    let purged = api
        .post(
            PURGE,
            "api",
            json!({"what": "dead", "reason": "nack", "confirm": true}),
        )
        .await;
    assert_eq!(purged.json(), json!({"deleted": 2}));
    let dead_left: Vec<String> = redis::cmd("ZRANGE")
        .arg(QueueKeys::derive(&key).unwrap().dead)
        .arg(0)
        .arg(-1)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(dead_left, ["dead-r1"]);
    let purged = api
        .post(PURGE, "api", json!({"what": "dead", "confirm": true}))
        .await;
    assert_eq!(purged.json(), json!({"deleted": 1}));
    let left: Vec<String> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(left, ["later-1"]);

    // Audit lines: one per change, with the count, never a member.
    let log = bridge.log();
    let audit: Vec<&str> = log.lines().filter(|l| l.contains("admin call")).collect();
    for action in [
        "pause",
        "resume",
        "promote",
        "reschedule",
        "cancel",
        "requeue",
        "purge",
    ] {
        assert!(
            audit
                .iter()
                .any(|l| l.contains(&format!("action=\"{action}\""))
                    || l.contains(&format!("action={action}"))),
            "no audit line for {action}:\n{}",
            audit.join("\n")
        );
    }
    assert!(
        audit.iter().all(|l| !l.contains("later-")),
        "members in audit lines"
    );
    assert!(log.contains("refused: no valid bearer token"));
    let counted = bridge
        .metric(
            "delay_bridge_admin_requests_total",
            &[("action", "read"), ("code", "401")],
        )
        .await;
    assert_eq!(counted, 1.0);
    let purges = bridge
        .metric(
            "delay_bridge_admin_requests_total",
            &[("action", "purge"), ("code", "200")],
        )
        .await;
    assert_eq!(purges, 5.0, "three purges and two dry runs");

    let reload = api
        .call(
            "POST",
            "/api/v1/reload",
            "",
            "",
            Some(json!(null)),
            Some(TOKEN),
        )
        .await;
    assert_eq!(reload.json(), json!({"reload": "requested"}));
    let ok = wait_until(Duration::from_secs(10), || {
        bridge.log().contains("configuration reloaded")
    })
    .await;
    assert!(ok, "{}", bridge.log());

    check_openapi(&api.calls);
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

/// Every call answered with a status the file documents for that route and method, every
/// documented operation was called, and 200 bodies had been checked above.
fn check_openapi(calls: &[(String, String, u16)]) {
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schema/admin.openapi.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let paths = spec["paths"].as_object().unwrap();
    let mut documented = BTreeSet::new();
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let mut called = BTreeSet::new();
    for (method, route, status) in calls {
        let op = &paths
            .get(route)
            .unwrap_or_else(|| panic!("{route} is not in the OpenAPI file"))[method];
        assert!(
            op.is_object(),
            "{method} {route} is not in the OpenAPI file"
        );
        assert!(
            op["responses"].get(status.to_string()).is_some(),
            "{method} {route} answered {status}, which the OpenAPI file does not list"
        );
        called.insert((method.clone(), route.clone()));
    }
    let missed: Vec<_> = documented.difference(&called).collect();
    assert!(missed.is_empty(), "documented but never called: {missed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_admin_api_needs_no_token_and_refuses_every_change() {
    let mut r = redis().await;
    let capture = AmqpCapture::start("admin-ro").await;
    let key = format!("{}:{{admin}}", unique("ro"));
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
    let paused: Option<String> = redis::cmd("HGET")
        .arg(QueueKeys::derive(&key).unwrap().control)
        .arg("paused")
        .query_async(&mut r)
        .await
        .unwrap();
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
    let mut r = redis().await;
    let capture = AmqpCapture::start("admin-host").await;
    let key = format!("{}:{{admin}}", unique("host"));
    let (port, admin_port) = (free_port(), free_port());
    let extra = "read_only = true\nallowed_hosts = [\"Bridge.Internal\"]";
    let config = admin_config(port, admin_port, &key, &capture, extra);
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    let _: () = redis::cmd("ZADD")
        .arg(&key)
        .arg("+inf")
        .arg("secret-body")
        .query_async(&mut r)
        .await
        .unwrap();
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

/// A trigger of 4 shards through the admin API: the list sums the shards, browsing pages
/// through all of them in due order (ties by member) without skipping or repeating, a member
/// is found and cancelled on whichever shard holds it, and pause holds every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_serves_a_sharded_trigger_as_one_queue() {
    const SHARDS: u32 = 4;
    let mut r = redis().await;
    let capture = AmqpCapture::start("admin-shards").await;
    let key = format!("{}:{{admin}}", unique("sharded"));
    let (port, admin_port) = (free_port(), free_port());
    let trigger = format!("shards = {SHARDS}");
    let config = admin_config_with(port, admin_port, &key, &capture, "", &trigger);
    let (bridge, mut api) = start_with_api(&config, port, admin_port).await;
    // 30 members far ahead, spread by the shard hash, with ties in due time.
    let later = now_ms() + 3_600_000;
    let mut expected: Vec<(i64, String)> = Vec::new();
    for i in 0..30 {
        let member = format!("m-{i:02}");
        let due = later + (i % 7) as i64;
        let shard = shard_key(&key, shard_of(member.as_bytes(), SHARDS), SHARDS).unwrap();
        zadd(&mut r, &shard, due, &member).await;
        expected.push((due, member));
    }
    expected.sort();
    let used: BTreeSet<u32> = expected
        .iter()
        .map(|(_, m)| shard_of(m.as_bytes(), SHARDS))
        .collect();
    assert_eq!(used.len(), SHARDS as usize, "every shard holds some");

    let list = api.get(TRIGGERS, "", "").await.json();
    assert_eq!(list["triggers"][0]["stats"]["scheduled"], 30, "{list}");
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = api.get(SCHEDULED, "api", &format!("?limit=7{after}")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let p = page.json();
        for item in p["items"].as_array().unwrap() {
            seen.push((
                item["due_ms"].as_i64().unwrap(),
                item["member"].as_str().unwrap().to_string(),
            ));
        }
        match p["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(
        seen, expected,
        "every member once, in due order, ties by member"
    );

    let found = api.get(MESSAGE, "api", "m-13").await;
    assert_eq!(found.status, 200, "{}", found.body);
    let cancelled = api
        .post(
            CANCEL,
            "api",
            json!({"members": ["m-13", "m-22", "nobody"]}),
        )
        .await;
    assert_eq!(cancelled.json(), json!({"cancelled": 2}));
    let paused = api.post(PAUSE, "api", json!({})).await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    for i in 0..SHARDS {
        let keys = QueueKeys::derive(&shard_key(&key, i, SHARDS).unwrap()).unwrap();
        let flag: Option<String> = redis::cmd("HGET")
            .arg(&keys.control)
            .arg("paused")
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(flag.is_some(), "shard {i} paused");
        cleanup_keys(&mut r, &keys.source).await;
    }
    bridge.assert_no_panic();
}

/// Bytes a Redis server has sent to its clients so far.
async fn net_output(r: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(r)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// The bridge's resident memory in bytes.
fn rss(bridge: &Bridge) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// Lists over large bodies cost Redis, the bridge and the network a bounded amount: 50 dead
/// letters of 8 MB and 400 scheduled bodies of 1 MiB (hash mode), and 8 inline dead letters
/// of 2 MB, listed again and again, block no Redis call for more than a few milliseconds
/// (Redis's own slow log) nor send more than a bounded number of bytes, answer in bounded
/// responses, and leave the bridge's memory flat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_stay_bounded_whatever_the_bodies_weigh() {
    use common::servers::RedisServer;
    let server = RedisServer::start(&[]).await;
    let mut r = server.conn().await;
    let capture = AmqpCapture::start("bounded").await;
    let (port, admin_port) = (free_port(), free_port());
    let (big, inline) = ("delay:{bounded}", "delay:{bounded-inline}");
    let config = ConfigToml::base(port)
        .set_str("redis", "url", &server.url())
        .to_string()
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\nread_only = true\n")
        + &amqp_trigger("big", big, &capture, "payload = \"hash\"\n")
        + &amqp_trigger("inline", inline, &capture, "");
    let keys = QueueKeys::derive(big).unwrap();
    let eight_mb = vec![b'x'; 8 << 20];
    for i in 0..50 {
        let id = format!("dead-{i}");
        let _: () = redis::pipe()
            .zadd(&keys.dead, &id, i)
            .hset(
                &keys.dead_reasons,
                &id,
                r#"{"reason":"too_large","attempts":0}"#,
            )
            .hset(&keys.bodies, &id, &eight_mb)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let one_mib = vec![b'y'; 1 << 20];
    let later = 4_000_000_000_000i64;
    for i in 0..400 {
        let id = format!("later-{i}");
        let _: () = redis::pipe()
            .zadd(&keys.source, &id, later + i)
            .hset(&keys.bodies, &id, &one_mib)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let inline_dead = QueueKeys::derive(inline).unwrap().dead;
    for i in 0..8u8 {
        let mut member = vec![b'z'; 2 << 20];
        member[0] = b'0' + i;
        let _: () = redis::AsyncCommands::zadd(&mut r, &inline_dead, &member, i)
            .await
            .unwrap();
        let _: () = redis::AsyncCommands::zadd(&mut r, inline, &member, later + i64::from(i))
            .await
            .unwrap();
    }
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    // Redis's own measure of each call, and the bytes it sent: copying the stored bodies
    // (the old way) takes hundreds of milliseconds and moves hundreds of MiB; the bound is
    // generous for a machine busy with other tests.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(100_000)
        .query_async(&mut r)
        .await
        .unwrap();
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut r)
        .await
        .unwrap();
    let sent_before = net_output(&mut r).await;

    let calls = [
        ("/api/v1/triggers/big/dead?limit=50", 64 << 10),
        ("/api/v1/triggers/big/scheduled?limit=400", 128 << 10),
        ("/api/v1/triggers/inline/dead?limit=50", 6 << 20),
        ("/api/v1/triggers/inline/scheduled?limit=50", 6 << 20),
    ];
    let mut before = 0;
    for round in 0..6 {
        for (path, most) in calls {
            let got = request(admin_port, "GET", path, &[], None).await;
            assert_eq!(
                got.status,
                200,
                "{path}: {}\n{}",
                &got.body[..got.body.len().min(300)],
                bridge.log()
            );
            assert!(
                got.body.len() <= most,
                "{path}: {} bytes in one response",
                got.body.len()
            );
        }
        if round == 0 {
            before = rss(&bridge);
        }
    }
    let after = rss(&bridge);
    assert!(
        after < before + (64 << 20),
        "the bridge's memory grew from {before} to {after} bytes"
    );
    // Hash mode: every id listed, with its body's size and no body read.
    let page = request(admin_port, "GET", calls[1].0, &[], None)
        .await
        .json();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 400);
    assert_eq!(items[0]["body_size"], 1 << 20, "{}", items[0]);
    // Inline, a member is the message: the page ends at the budget, with a cursor to the rest.
    let page = request(admin_port, "GET", calls[3].0, &[], None)
        .await
        .json();
    let items = page["items"].as_array().unwrap();
    assert!((1..8).contains(&items.len()), "{} items", items.len());
    assert!(
        page["next"].is_string(),
        "a cursor to the rest: {}",
        page["next"]
    );
    let inline_page = request(admin_port, "GET", calls[2].0, &[], None)
        .await
        .json();
    let letters = inline_page["items"].as_array().unwrap().len();
    assert!(
        (1..8).contains(&letters),
        "{letters} inline letters of 2 MB in one page"
    );
    let slow: Vec<Vec<redis::Value>> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(100)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(slow.is_empty(), "Redis calls over 100 ms: {slow:?}");
    let sent = net_output(&mut r).await - sent_before;
    assert!(sent < 64 << 20, "Redis sent {sent} bytes for 20 list calls");
    bridge.assert_no_panic();
}

/// With Redis down at start, the admin listener is open and answers 503 saying why; once
/// Redis is up, it serves the triggers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_503_until_redis_is_reached() {
    use common::servers::RedisServer;
    let mut server = RedisServer::start(&[]).await;
    server.shutdown().await;
    let capture = AmqpCapture::start("admin-503").await;
    let (port, admin_port) = (free_port(), free_port());
    let config = ConfigToml::base(port)
        .set_str("redis", "url", &server.url())
        .to_string()
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\nread_only = true\n")
        + &amqp_trigger("early", "delay:{early}", &capture, "");
    let bridge = Bridge::start(&config, port);
    assert!(
        common::servers::wait_port(admin_port, true, Duration::from_secs(15)).await,
        "the admin listener opens before Redis is reached"
    );
    let (answered, got) = poll(
        Duration::from_secs(15),
        Duration::from_millis(100),
        async || request(admin_port, "GET", TRIGGERS, &[], None).await,
        |r| r.status == 503,
    )
    .await;
    assert!(answered, "{} {}", got.status, got.body);
    assert!(
        got.json()["error"].as_str().unwrap().contains("starting"),
        "{}",
        got.body
    );
    server.restart().await;
    let (served, got) = poll(
        Duration::from_secs(20),
        Duration::from_millis(200),
        async || request(admin_port, "GET", TRIGGERS, &[], None).await,
        |r| r.status == 200,
    )
    .await;
    assert!(served, "{} {}", got.status, got.body);
    assert_eq!(got.json()["triggers"][0]["name"], "early", "{}", got.body);
    bridge.assert_no_panic();
}
