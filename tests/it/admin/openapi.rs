//! The admin API read and acted on route by route, every answer checked against the
//! OpenAPI file.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_reads_and_acts_on_a_queue_as_its_openapi_file_says() {
    let (mut r, capture, key) = amqp_scene("admin", "api", "admin").await;
    let (port, admin_port) = (free_port(), free_port());
    let config = admin_config(port, admin_port, &key, &capture, "");
    let (bridge, mut api) = start_with_api(&config, port, admin_port).await;
    token_is_required(&mut api).await;
    let now = reads_match_redis(&mut api, &mut r, &key).await;
    reads_of_dead_letters_leases_and_history(&mut api, &mut r, &key).await;
    bad_input_is_refused(&mut api, admin_port).await;
    pause_holds_a_promoted_message(&mut api, &bridge, &capture).await;
    changes_act_on_the_queue(&mut api, &bridge, &capture, now).await;
    purges_by_reason(&mut api, &mut r, &key).await;
    audit_lines_metrics_and_reload(&mut api, &bridge).await;
    schedules_are_added_listed_and_removed(&mut api, &mut r, &key).await;

    check_openapi(&api.calls);
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

/// The token: missing or wrong is 401 with a challenge, and counted.
async fn token_is_required(api: &mut Api) {
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
}

/// Far-future messages, one dead letter: the numbers match Redis, page by page. Returns
/// the Redis time the messages are scheduled from.
async fn reads_match_redis(api: &mut Api, r: &mut Conn, key: &str) -> i64 {
    let now = redis_now(r).await;
    let later: Vec<(i64, String)> = (0..5)
        .map(|i| (now + 3_600_000 + i, format!("later-{i}")))
        .collect();
    zadd_all(r, key, later.iter().cloned()).await;
    dead_letter(r, key, "dead-0", now, r#"{"reason":"nack","attempts":3}"#).await;
    let list = api.get(TRIGGERS, "", "").await;
    assert_eq!(list.status, 200, "{}", list.body);
    let t = &list.json()["triggers"][0];
    assert_eq!(t["name"], "api");
    assert_eq!(t["key"], key);
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
    let page2 = page2.json();
    let members = item_members(&page2);
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
    now
}

/// Dead letters a page at a time, the leases in flight, and the history.
async fn reads_of_dead_letters_leases_and_history(api: &mut Api, r: &mut Conn, key: &str) {
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
    let inflight_key = QueueKeys::derive(key).unwrap().inflight;
    let lease = redis_now(r).await + 300_000;
    zadd(r, &inflight_key, lease, "leased-0").await;
    let inflight = api.get(INFLIGHT, "api", "?limit=10").await.json();
    assert_eq!(
        inflight["items"],
        json!([{"member": "leased-0", "lease_deadline_ms": lease,
                "id": delay_bridge::wire::MessageId::new(key, b"leased-0").as_str()}])
    );
    assert!(inflight["now_ms"].as_i64().unwrap() > 0);
    let _: () = redis::cmd("DEL")
        .arg(&inflight_key)
        .query_async(r)
        .await
        .unwrap();
    let history = api.get(HISTORY, "api", "?window=1h").await.json();
    assert_eq!(history["interval_ms"], 10_000);
    assert!(history["points"].is_array());
    assert_eq!(api.get(HISTORY, "nope", "").await.status, 404);
}

/// Bad input: a clear 4xx, never a panic or an unbounded call.
async fn bad_input_is_refused(api: &mut Api, admin_port: u16) {
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
    let unknown = get_with_token(admin_port, "/api/v2/x", TOKEN).await;
    assert_eq!(unknown.status, 404);
}

/// Pause, then promote a message: nothing goes until resume.
async fn pause_holds_a_promoted_message(api: &mut Api, bridge: &Bridge, capture: &AmqpCapture) {
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
}

/// Reschedule, cancel, requeue, purge (`now`: when the messages were scheduled from).
async fn changes_act_on_the_queue(api: &mut Api, bridge: &Bridge, capture: &AmqpCapture, now: i64) {
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
}

/// By reason: counted first (a dry run), then only those deleted; a cursor whose member has
/// left since still leads to the letters after it.
async fn purges_by_reason(api: &mut Api, r: &mut Conn, key: &str) {
    let now = redis_now(r).await;
    for (i, reason) in ["nack", "too_large", "nack"].iter().enumerate() {
        let json = format!(r#"{{"reason":"{reason}","attempts":1}}"#);
        dead_letter(r, key, &format!("dead-r{i}"), now + i as i64, &json).await;
    }
    // A cursor whose member has left since still leads to the letters after it.
    let first = api.get(DEAD, "api", "?limit=1").await.json();
    assert_eq!(first["items"][0]["member"], "dead-r0");
    let _: () = redis::cmd("ZREM")
        .arg(QueueKeys::derive(key).unwrap().dead)
        .arg("dead-r0")
        .query_async(r)
        .await
        .unwrap();
    let after = first["next"].as_str().unwrap().to_string();
    let rest = api
        .get(DEAD, "api", &format!("?limit=5&after={after}"))
        .await
        .json();
    let members = item_members(&rest);
    assert_eq!(members, ["dead-r1", "dead-r2"]);
    dead_letter(r, key, "dead-r0", now, r#"{"reason":"nack","attempts":1}"#).await;
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
    let dead_left = zmembers(r, QueueKeys::derive(key).unwrap().dead).await;
    assert_eq!(dead_left, ["dead-r1"]);
    let purged = api
        .post(PURGE, "api", json!({"what": "dead", "confirm": true}))
        .await;
    assert_eq!(purged.json(), json!({"deleted": 1}));
    let left = zmembers(r, key).await;
    assert_eq!(left, ["later-1"]);
}

/// Audit lines: one per change, with the count, never a member; the requests counted; a
/// reload asked through the API.
async fn audit_lines_metrics_and_reload(api: &mut Api, bridge: &Bridge) {
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
    let requests = async |action: &str, code: &str| {
        let labels = [("action", action), ("code", code)];
        bridge
            .metric("delay_bridge_admin_requests_total", &labels)
            .await
    };
    assert_eq!(requests("read", "401").await, 1.0);
    let purges = requests("purge", "200").await;
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
}

/// Every call answered with a status the file documents for that route and method, every
/// documented operation was called, and 200 bodies had been checked above.
/// Schedules added at run time: the config's checks, a name taken, listed with their source
/// and next fire, removed once.
async fn schedules_are_added_listed_and_removed(api: &mut Api, r: &mut Conn, key: &str) {
    let none = api.get(SCHEDULES, "api", "").await;
    assert_eq!(none.status, 200, "{}", none.body);
    assert_eq!(none.json()["schedules"], json!([]));
    let bad = api
        .post(
            SCHEDULES,
            "api",
            json!({"name": "n", "cron": "61 * * * * *", "body": "x"}),
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        bad.json()["error"].as_str().unwrap().starts_with("cron: "),
        "{}",
        bad.body
    );
    let yearly = json!({"name": "yearly", "cron": "0 0 0 1 1 *", "body": "x", "misfire": "once"});
    let added = api.post(SCHEDULES, "api", yearly.clone()).await;
    assert_eq!(added.status, 200, "{}", added.body);
    assert!(
        added.json()["next_fire_ms"].as_i64().is_some(),
        "{}",
        added.body
    );
    let taken = api.post(SCHEDULES, "api", yearly).await;
    assert_eq!(taken.status, 409, "{}", taken.body);
    let listed = api.get(SCHEDULES, "api", "").await;
    let s = &listed.json()["schedules"][0];
    assert_eq!(s["name"], "yearly", "{}", listed.body);
    assert_eq!(s["source"], "runtime", "{}", listed.body);
    assert_eq!(s["misfire"], "once", "{}", listed.body);
    assert_eq!(s["misfire_grace"], "1m", "{}", listed.body);
    assert!(s["next_fire_ms"].as_i64().is_some(), "{}", listed.body);
    for status in [200, 404] {
        let removed = api
            .call("DELETE", SCHEDULE, "api", "yearly", None, Some(TOKEN))
            .await;
        assert_eq!(removed.status, status, "{}", removed.body);
    }
    cleanup_schedules(r, key).await;
}

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
