//! The counters and histograms forwarding moves, those exported from start-up, and the
//! metrics listener describing itself.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_n_messages_moves_counters_and_histograms_by_exactly_n() {
    let (mut r, capture, key) = amqp_scene("obs", "delay", "obs").await;
    let port = free_port();
    let batch = 4;
    let trigger = amqp_trigger(
        "obs",
        &key,
        &capture,
        &format!("workers = 2\nbatch = {batch}"),
    );
    let mut bridge = Bridge::start(&(base_config(port) + &trigger), port)
        .ready(Duration::from_secs(15))
        .await;
    let fwd = [("trigger", "obs"), ("sink", "rabbit")];
    let obs = [("trigger", "obs")];
    for (name, labels) in [
        ("delay_bridge_messages_forwarded_total", &fwd[..]),
        ("delay_bridge_lateness_seconds_count", &obs[..]),
    ] {
        assert_eq!(bridge.metric(name, labels).await, 0.0, "{name}");
    }

    // 10 members overdue by at least 6 s and 20 due shortly: all must be counted, and the
    // overdue ones must show up as late by at least their age.
    let overdue = 10;
    let n = 30;
    let now = redis_now(&mut r).await;
    let due = |i: usize| {
        if i < overdue {
            now - 6000 - i as i64
        } else {
            now + 200 + 20 * i as i64
        }
    };
    let members = (0..n).map(|i| (due(i), format!("obs-secret-payload-{i}")));
    zadd_all(&mut r, &key, members).await;
    bridge
        .expect_arrivals(n, Duration::from_secs(20), || capture.count())
        .await;
    let (settled, body) = bridge
        .wait_scrape(Duration::from_secs(10), |b| {
            metric_value(b, "delay_bridge_messages_forwarded_total", &fwd) >= n as f64
        })
        .await;
    assert!(settled, "forwarded counter never reached {n}:\n{body}");

    assert_eq!(
        metric_value(&body, "delay_bridge_messages_forwarded_total", &fwd),
        n as f64
    );
    assert_lateness(&body, n, overdue);

    assert_claims_and_publishes(&body, n, batch);

    assert_eq!(
        metric_value(
            &body,
            "delay_bridge_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert_eq!(metric_value(&body, "delay_bridge_redis_up", &[]), 1.0);
    assert_eq!(
        metric_value(&body, "delay_bridge_sink_up", &[("sink", "rabbit")]),
        1.0
    );
    assert_eq!(
        bridge.get("/healthz").await.map(|(s, _)| s),
        Some(200),
        "/healthz"
    );

    assert_bounded_labels(&body, &key);

    // Nothing is counted twice later on.
    assert_eq!(capture.count(), n, "each message once");
    assert_eq!(
        bridge
            .metric("delay_bridge_messages_forwarded_total", &fwd)
            .await,
        n as f64
    );
    bridge.terminate(Duration::from_secs(15)).await;
    cleanup_keys(&mut r, &key).await;
}

/// The lateness histogram of `n` messages forwarded by trigger `obs`, `overdue` of them
/// overdue by at least 6 s when scheduled.
fn assert_lateness(body: &str, n: usize, overdue: usize) {
    let obs = [("trigger", "obs")];
    let late_count = metric_value(body, "delay_bridge_lateness_seconds_count", &obs);
    let late_sum = metric_value(body, "delay_bridge_lateness_seconds_sum", &obs);
    assert_eq!(late_count, n as f64, "one lateness observation per message");
    assert!(
        late_sum >= 6.0 * overdue as f64,
        "overdue members count as late by their age: sum {late_sum}"
    );
    let lateness = histogram_buckets(body, "delay_bridge_lateness_seconds", &obs);
    assert_eq!(lateness.last().map(|b| b.1), Some(n as f64), "+Inf bucket");
    assert!(
        lateness.first().map(|b| b.0) <= Some(0.001)
            && lateness.iter().any(|b| b.0.is_finite() && b.0 >= 300.0),
        "buckets span 1 ms to 5 min: {lateness:?}"
    );
    assert!(
        n as f64 - count_le(&lateness, 5.9) >= overdue as f64,
        "the overdue members fall in buckets above 6 s: {lateness:?}"
    );
}

/// One publish observation per batch of at most `batch` claimed, of the `n` messages
/// trigger `obs` forwarded.
fn assert_claims_and_publishes(body: &str, n: usize, batch: usize) {
    let fwd = [("trigger", "obs"), ("sink", "rabbit")];
    let obs = [("trigger", "obs")];
    let publishes = metric_value(body, "delay_bridge_publish_duration_seconds_count", &fwd);
    assert!(
        publishes >= (n / batch) as f64 && publishes <= n as f64,
        "one publish observation per batch: {publishes}"
    );
    assert!(metric_value(body, "delay_bridge_publish_duration_seconds_sum", &fwd) > 0.0);
    let claims = metric_value(body, "delay_bridge_claim_duration_seconds_count", &obs);
    assert!(
        claims >= publishes,
        "every publish follows a claim: {claims} claims"
    );
    let sizes = histogram_buckets(body, "delay_bridge_claim_batch_size", &obs);
    let size_count = metric_value(body, "delay_bridge_claim_batch_size_count", &obs);
    assert_eq!(
        metric_value(body, "delay_bridge_claim_batch_size_sum", &obs),
        n as f64,
        "every member claimed exactly once"
    );
    assert_eq!(
        count_le(&sizes, batch as f64),
        size_count,
        "no claim above batch = {batch}: {sizes:?}"
    );
    assert_eq!(size_count, publishes, "one non-empty claim per publish");
}

/// Labels stay bounded: known names only, never a payload or a Redis key (`key`).
fn assert_bounded_labels(body: &str, key: &str) {
    for s in parse_samples(body) {
        assert!(
            s.name.starts_with("delay_bridge_") || s.name.starts_with("process_"),
            "{}",
            s.name
        );
        for (k, v) in &s.labels {
            assert!(
                ALLOWED_LABELS.contains(&k.as_str()),
                "unexpected label {k} on {}",
                s.name
            );
            assert!(
                !v.contains("secret-payload") && !v.contains(key) && !v.contains("delay-"),
                "{}{{{k}={v:?}}} carries message data",
                s.name
            );
        }
    }
    let forwarded_series: BTreeSet<_> = parse_samples(body)
        .into_iter()
        .filter(|s| s.name == "delay_bridge_messages_forwarded_total")
        .map(|s| s.labels)
        .collect();
    assert_eq!(forwarded_series.len(), 1, "{forwarded_series:?}");
}

/// Series whose labels are known at start-up are exported from start-up with 0, so an
/// `increase(...) > 0` alert sees the first dead letter of each reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_counters_are_exported_at_zero_from_start_up() {
    let capture = AmqpCapture::start("zero").await;
    let key = format!("{}:{{zero}}", unique("delay"));
    let port = free_port();
    let bridge = Bridge::start(
        &(base_config(port) + &amqp_trigger("zero", &key, &capture, "")),
        port,
    )
    .ready(Duration::from_secs(15))
    .await;
    let body = bridge.scrape().await;
    let samples = parse_samples(&body);
    let present = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .any(|s| s.name == name && s.has(labels) && s.value == 0.0)
    };
    for reason in [
        "broker_refused",
        "destination_refused",
        "too_large",
        "bad_payload",
    ] {
        for name in [
            "delay_bridge_messages_retried_total",
            "delay_bridge_messages_dead_lettered_total",
        ] {
            assert!(
                present(name, &[("trigger", "zero"), ("reason", reason)]),
                "{name}{{reason={reason}}} missing at start-up:\n{body}"
            );
        }
    }
    for kind in ["connection", "timeout", "wrong_type", "script"] {
        assert!(
            present(
                "delay_bridge_redis_errors_total",
                &[("trigger", "zero"), ("kind", kind)]
            ),
            "redis_errors_total{{kind={kind}}} missing at start-up"
        );
    }
    for name in [
        "delay_bridge_messages_forwarded_total",
        "delay_bridge_messages_redelivered_total",
        "delay_bridge_messages_put_back_total",
        "delay_bridge_empty_claims_total",
        "delay_bridge_head_reads_total",
    ] {
        assert!(
            samples
                .iter()
                .any(|s| s.name == name && s.has(&[("trigger", "zero")])),
            "{name} missing at start-up"
        );
    }
    // Histograms of deliveries appear with the first one: an idle trigger holds no buckets.
    for name in [
        "delay_bridge_lateness_seconds_bucket",
        "delay_bridge_publish_duration_seconds_bucket",
        "delay_bridge_claim_batch_size_bucket",
    ] {
        assert!(
            !samples
                .iter()
                .any(|s| s.name == name && s.has(&[("trigger", "zero")])),
            "{name} exported before any delivery"
        );
    }
}

/// The metrics listener describes itself: the process's own metrics from start-up, the
/// build's revision, and a page at `/` that links the endpoints and names the admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_metrics_revision_and_a_landing_page_are_served_from_start_up() {
    let capture = AmqpCapture::start("proc").await;
    let key = format!("{}:{{proc}}", unique("delay"));
    let (port, admin_port) = (free_port(), free_port());
    let admin = format!("127.0.0.1:{admin_port}");
    let settings = ConfigToml::base(port)
        .set_str("admin", "listen", &admin)
        .set("admin", "read_only", "true");
    let mut bridge = Bridge::start(
        &(settings.to_string() + &amqp_trigger("proc", &key, &capture, "")),
        port,
    )
    .ready(Duration::from_secs(15))
    .await;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let body = bridge.scrape().await;
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_threads",
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} ")),
            "{name} missing at start-up:\n{body}"
        );
    }
    assert!(metric_value(&body, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(metric_value(&body, "process_open_fds", &[]) >= 3.0);
    let start = metric_value(&body, "process_start_time_seconds", &[]);
    assert!(
        (started - 120.0..=started + 1.0).contains(&start),
        "start time {start}, now {started}"
    );
    let revision = parse_samples(&body)
        .into_iter()
        .find(|s| s.name == "delay_bridge_build_info")
        .and_then(|s| s.labels.into_iter().find(|(k, _)| k == "revision"))
        .map(|(_, v)| v);
    let expected = option_env!("DELAY_BRIDGE_REVISION").unwrap_or("unknown");
    assert_eq!(revision.as_deref(), Some(expected), "{body}");

    let (status, page) = bridge.get("/").await.expect("GET / answers");
    assert_eq!(status, 200, "{page}");
    for link in ["href=\"metrics\"", "href=\"healthz\"", "href=\"readyz\""] {
        assert!(page.contains(link), "{link} missing:\n{page}");
    }
    assert!(page.contains(&admin), "the admin API's address:\n{page}");
    assert!(page.contains(env!("CARGO_PKG_VERSION")), "{page}");
    bridge.terminate(Duration::from_secs(15)).await;

    // Without an admin API the page says so.
    let port = free_port();
    let mut bridge = Bridge::start(
        &(base_config(port) + &amqp_trigger("proc", &key, &capture, "")),
        port,
    )
    .ready(Duration::from_secs(15))
    .await;
    let (status, page) = bridge.get("/").await.expect("GET / answers");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("not enabled"), "{page}");
    bridge.terminate(Duration::from_secs(15)).await;
}
