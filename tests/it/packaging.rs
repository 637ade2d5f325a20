//! The shipped packaging agrees with the binary: compose config, dashboard and alert queries, promtool.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Every `delay_bridge_...` name in `text`, scanned by hand (metric names are `[a-z_]`).
fn metric_names(text: &str) -> BTreeSet<String> {
    names_with(text, "delay_bridge_")
}

/// Every name in `text` that starts with `prefix`.
fn names_with(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let tail = &rest[at..];
        let end = tail[prefix.len()..]
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .map_or(tail.len(), |i| i + prefix.len());
        out.insert(tail[..end].trim_end_matches('_').to_string());
        rest = &tail[end..];
    }
    out
}

/// The names of `names` in neither `a` nor `b`.
fn in_neither<'n>(
    names: &'n BTreeSet<String>,
    a: &BTreeSet<String>,
    b: &BTreeSet<String>,
) -> Vec<&'n String> {
    names
        .iter()
        .filter(|n| !a.contains(*n) && !b.contains(*n))
        .collect()
}

/// Every metric family the bridge registers, read from `src/metrics.rs` and every file of
/// `src/metrics/`: the trigger
/// families' `name: "..."` and the literals given to the registering helpers, with the prefix.
fn registered_families() -> BTreeSet<String> {
    const OPENERS: [&str; 7] = [
        "name: ",
        "counter(",
        "by_label(",
        "histogram(",
        "HistogramOpts::new(",
        "gauge(",
        "Gauge::new(",
    ];
    let mut out = BTreeSet::new();
    let folder = std::fs::read_dir(repo("src/metrics")).unwrap();
    let files = folder.map(|e| e.unwrap().path());
    for file in std::iter::once(repo("src/metrics.rs")).chain(files) {
        let text = std::fs::read_to_string(file).unwrap();
        for opener in OPENERS {
            for (at, _) in text.match_indices(opener) {
                let rest = text[at + opener.len()..].trim_start();
                let Some(literal) = rest.strip_prefix('"') else {
                    continue;
                };
                let name = &literal[..literal.find('"').unwrap()];
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    out.insert(format!("delay_bridge_{name}"));
                }
            }
        }
    }
    out
}

/// Each panel's title and the metric families its queries read (a histogram by its family).
fn panel_metrics(dashboard: &serde_json::Value) -> Vec<(String, BTreeSet<String>)> {
    let panels = dashboard["panels"].as_array().expect("panels");
    panels
        .iter()
        .chain(
            panels
                .iter()
                .flat_map(|p| p["panels"].as_array().into_iter().flatten()),
        )
        .map(|panel| {
            let (mut queries, mut prose) = (Vec::new(), Vec::new());
            dashboard_text(&panel["targets"], &mut queries, &mut prose);
            let text = queries.join("\n");
            let names = names_with(&text, "delay_bridge_")
                .into_iter()
                .chain(names_with(&text, "process_"))
                .map(|m| {
                    ["_bucket", "_sum", "_count"]
                        .iter()
                        .fold(m, |m, s| m.strip_suffix(s).map(str::to_string).unwrap_or(m))
                })
                .collect();
            (
                panel["title"].as_str().unwrap_or_default().to_string(),
                names,
            )
        })
        .collect()
}

/// The PromQL of a dashboard (panel targets and variable queries) and all its other text.
fn dashboard_text(v: &serde_json::Value, queries: &mut Vec<String>, prose: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                        queries.push(s.clone())
                    }
                    (_, serde_json::Value::String(s)) => prose.push(s.clone()),
                    (_, v) => dashboard_text(v, queries, prose),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                dashboard_text(v, queries, prose);
            }
        }
        _ => {}
    }
}

#[test]
fn the_compose_bridge_config_is_mounted_and_accepted_by_check() {
    let compose = std::fs::read_to_string(repo("docker/compose.yaml")).unwrap();
    // The `bridge:` service block: from its header to the next service at the same indent.
    let start = compose
        .lines()
        .position(|l| l == "  bridge:")
        .expect("compose has a bridge service");
    let block: Vec<&str> = compose
        .lines()
        .skip(start + 1)
        .take_while(|l| l.is_empty() || l.starts_with("   ") || l.starts_with("  #"))
        .collect();
    let mount = block
        .iter()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .find(|m| m.contains("bridge.toml:"))
        .expect("the bridge service mounts a bridge.toml");
    let mut parts = mount.split(':');
    let (host, target) = (parts.next().unwrap(), parts.next().unwrap());
    assert_eq!(
        repo("docker").join(host).canonicalize().unwrap(),
        repo("docker/bridge.toml").canonicalize().unwrap(),
        "{mount}"
    );
    let command = block
        .iter()
        .find(|l| l.trim_start().starts_with("command:"))
        .expect("the bridge service has a command");
    assert!(
        command.contains(&format!("\"{target}\"")),
        "the command reads the mounted file {target}: {command}"
    );
    let dockerfile = std::fs::read_to_string(repo("docker/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("CMD [\"run\", \"--config\", \"{target}\"]")),
        "the image's default command reads {target} as well"
    );

    // The admin token is the compose secret compose mounts at bridge.toml's token_file.
    assert!(
        block.iter().any(|l| l.trim() == "- admin_token")
            && compose.contains("file: ./admin-token")
            && std::fs::read_to_string(repo("docker/bridge.toml"))
                .unwrap()
                .contains("token_file = \"/run/secrets/admin_token\""),
        "the bridge service mounts the admin_token secret where bridge.toml reads it"
    );
    let token = repo("docker/admin-token");
    let out = run_cli(
        &["check"],
        &repo("docker/bridge.toml"),
        &[("DELAY_BRIDGE_ADMIN__TOKEN_FILE", token.to_str().unwrap())],
    );
    let stdout = &out.stdout;
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(
        stdout.contains("metrics: http://0.0.0.0:9464/metrics"),
        "{stdout}"
    );
    assert!(stdout.contains("sink rabbit: amqp") && stdout.contains("sink kafka: kafka"));
    assert!(
        stdout.contains("trigger orders:") && stdout.contains("trigger reminders:"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("guest:guest"),
        "password redacted: {stdout}"
    );
}

/// A `key = "30s"`-style duration of `text`, in seconds.
fn seconds_of(text: &str, key: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {text}"));
    let value = line
        .split(['=', '#'])
        .nth(1)
        .unwrap()
        .trim()
        .trim_matches('"');
    humantime::parse_duration(value)
        .or_else(|_| humantime::parse_duration(&format!("{value}s")))
        .unwrap_or_else(|e| panic!("{line}: {e}"))
        .as_secs_f64()
}

#[test]
fn the_debian_package_config_is_valid_and_its_unit_outlasts_the_drain() {
    let config = repo("packaging/deb/config.toml");
    let out = run_cli(&["check"], &config, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(
        out.stdout.contains("redis: redis://127.0.0.1:6379")
            && out
                .stdout
                .contains("sink rabbit: amqp amqp://guest:***@127.0.0.1:5672")
            && !out.stdout.contains("kafka"),
        "Redis and RabbitMQ on localhost only: {}",
        out.stdout
    );
    let unit = std::fs::read_to_string(repo("packaging/deb/delay-bridge.service")).unwrap();
    let toml = std::fs::read_to_string(&config).unwrap();
    // The drain takes [shutdown] timeout plus the sinks' flush and the listeners' close.
    let drain = seconds_of(&toml, "timeout =");
    let stop = seconds_of(&unit, "TimeoutStopSec=");
    assert!(
        stop >= drain + 7.0,
        "TimeoutStopSec={stop} for a {drain} s drain"
    );
    for line in [
        "ExecStart=/usr/bin/delay-bridge run --config /etc/delay-bridge/config.toml",
        "EnvironmentFile=-/etc/default/delay-bridge",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "Restart=on-failure",
        "RestartPreventExitStatus=78",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line}");
    }
}

#[test]
fn the_static_packaging_checks_pass() {
    for script in [
        "tests/static/check_compose.py",
        "tests/static/check_workflows.py",
    ] {
        let out = run_in_repo("python3", &[script]);
        assert_success(&out, &format!("{script}:\n"));
    }
}

#[test]
fn prometheus_config_and_alert_rules_pass_promtool() {
    let promtool = |args: &[&str]| {
        // From the Debian package `prometheus`.
        let out = run_in_repo("promtool", args);
        assert_success(&out, &format!("promtool {args:?}:\n"));
    };
    promtool(&["check", "config", "docker/prometheus.yml"]);
    promtool(&["check", "rules", "docker/alerts.yml"]);
    promtool(&["test", "rules", "tests/static/alerts_test.yml"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_query_only_metrics_the_bridge_exports() {
    let (mut r, capture, key) = amqp_scene("dash", "delay", "dash").await;
    let bad_key = format!("{}:{{dash-bad}}", unique("delay"));
    let (mut bridge, body) = every_series_moved(&mut r, &key, &bad_key, &capture).await;

    let samples: BTreeSet<String> = parse_samples(&body).into_iter().map(|s| s.name).collect();
    let families: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo("grafana/dashboards/delay-bridge.json")).unwrap(),
    )
    .expect("dashboard JSON parses");
    let (mut queries, mut prose) = (Vec::new(), Vec::new());
    dashboard_text(&dashboard, &mut queries, &mut prose);
    let alerts = std::fs::read_to_string(repo("docker/alerts.yml")).unwrap();
    // PromQL must name series as scraped (a histogram only by its _bucket/_sum/_count);
    // descriptions may name a histogram by its family.
    let queried = metric_names(&(queries.join("\n") + "\n" + &alerts));
    let mentioned = metric_names(&prose.join("\n"));
    // Series the scrape may lack (no admin call, no dead-letter forwarding here) are known by
    // their registration.
    let registered = registered_families();
    // A histogram the scrape lacks (no ingress here) is registered by its family.
    let known = |m: &str| samples.contains(m) || registered.contains(m.trim_end_matches("_bucket"));
    let missing: Vec<_> = queried.iter().filter(|m| !known(m)).collect();
    assert!(
        missing.is_empty(),
        "queried but not exported: {missing:?}\nexported: {samples:?}"
    );
    let unknown = in_neither(&mentioned, &samples, &families);
    assert_none_found("described but not exported", &unknown);

    assert_dashboard_shows_what_operators_need(&queries, &queried);
    assert_every_metric_on_one_panel(&dashboard, &registered, &families);
    assert_scoped_to_instances(&dashboard, &queries);

    bridge.terminate(Duration::from_secs(15)).await;
    cleanup_keys(&mut r, &key).await;
    cleanup_keys(&mut r, &bad_key).await;
}

/// A bridge with a healthy trigger `dash` on `key` and one, `dash-bad` on `bad_key`, whose
/// messages choose a routing key no queue takes (a retry, then a dead letter), an expired lease recovered: every
/// counter and histogram has a series. Returns the bridge and its scrape once all moved.
async fn every_series_moved(
    r: &mut Conn,
    key: &str,
    bad_key: &str,
    capture: &AmqpCapture,
) -> (Bridge, String) {
    let port = free_port();
    // Its messages choose a routing key no queue is bound to: their own destination, so
    // each pays its attempts.
    let unroutable = format!(
        "exchange = \"{}\"\nrouting_key = \"{}\"\nformat = \"envelope\"\nmax_attempts = 2\n\
         backoff_initial = \"50ms\"\nbackoff_max = \"50ms\"\nlease = \"2s\"\npublish_timeout = \"1s\"",
        capture.exchange, capture.routing_key
    );
    let own = |body: &str| format!(r#"{{"body": "{body}", "routing_key": "nobody-listens"}}"#);
    let config = base_config(port)
        + &amqp_trigger("dash", key, capture, "batch = 8")
        + &trigger("dash-bad", bad_key, "rabbit", &unroutable);
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(15))
        .await;
    let now = redis_now(r).await;
    zadd_all(r, key, (0..5).map(|i| (now - i, format!("dash-{i}")))).await;
    let bad = delay_bridge::keys::QueueKeys::derive(bad_key).unwrap();
    // An expired lease, as a crashed bridge leaves it: recovered and redelivered.
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(bad_key)
        .arg(now)
        .arg(own("unroutable"))
        .cmd("ZADD")
        .arg(&bad.inflight)
        .arg(now - 60_000)
        .arg(own("orphan"))
        .query_async(r)
        .await
        .unwrap();
    let bad_t = [("trigger", "dash-bad")];
    let (all_there, body) = bridge
        .wait_scrape(Duration::from_secs(20), |b| {
            metric_value(
                b,
                "delay_bridge_messages_forwarded_total",
                &[("trigger", "dash")],
            ) == 5.0
                && metric_value(b, "delay_bridge_messages_retried_total", &bad_t) >= 1.0
                && metric_value(b, "delay_bridge_messages_dead_lettered_total", &bad_t) >= 2.0
                && metric_value(b, "delay_bridge_messages_redelivered_total", &bad_t) >= 1.0
                && metric_value(
                    b,
                    "delay_bridge_backlog_messages",
                    &[("trigger", "dash-bad"), ("state", "dead")],
                ) == 2.0
        })
        .await;
    assert!(
        all_there,
        "not every metric moved:\n{body}\n{}",
        bridge.log()
    );
    (bridge, body)
}

/// The dashboard shows everything an operator needs at a glance, and the scan found the
/// queries.
fn assert_dashboard_shows_what_operators_need(queries: &[String], queried: &BTreeSet<String>) {
    let shown: BTreeSet<String> = metric_names(&queries.join("\n"))
        .into_iter()
        .map(|m| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .fold(m, |m, s| m.strip_suffix(s).map(str::to_string).unwrap_or(m))
        })
        .collect();
    for needed in [
        "delay_bridge_messages_forwarded_total",
        "delay_bridge_messages_retried_total",
        "delay_bridge_messages_dead_lettered_total",
        "delay_bridge_messages_redelivered_total",
        "delay_bridge_lateness_seconds",
        "delay_bridge_publish_duration_seconds",
        "delay_bridge_claim_duration_seconds",
        "delay_bridge_claim_batch_size",
        "delay_bridge_backlog_messages",
        "delay_bridge_oldest_due_age_seconds",
        "delay_bridge_sink_up",
        "delay_bridge_redis_up",
        "delay_bridge_build_info",
    ] {
        assert!(
            shown.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
    assert!(
        queried.len() >= 15,
        "the scan found the queries: {queried:?}"
    );
}

/// Every metric the bridge exports (found in src/metrics/ or the process's) is on exactly one
/// panel of the dashboard.
fn assert_every_metric_on_one_panel(
    dashboard: &serde_json::Value,
    registered: &BTreeSet<String>,
    families: &BTreeSet<String>,
) {
    assert!(
        registered.len() >= 34,
        "the scan of src/metrics/ found the metrics: {registered:?}"
    );
    let process: BTreeSet<String> = families
        .iter()
        .filter(|f| f.starts_with("process_"))
        .cloned()
        .collect();
    assert!(
        process.contains("process_resident_memory_bytes"),
        "{families:?}"
    );
    let unregistered = in_neither(families, registered, &process);
    assert_none_found("exported but not found in src/metrics/", &unregistered);
    let panels = panel_metrics(dashboard);
    for metric in registered.iter().chain(&process) {
        let on: Vec<&str> = panels
            .iter()
            .filter(|(_, names)| names.contains(metric))
            .map(|(title, _)| title.as_str())
            .collect();
        assert_eq!(
            on.len(),
            1,
            "{metric} must be on exactly one panel of the dashboard, is on {on:?}"
        );
    }
}

/// Every query is scoped to the chosen instances, so that a shared Prometheus's other jobs
/// never show; the variables exist.
fn assert_scoped_to_instances(dashboard: &serde_json::Value, queries: &[String]) {
    for query in queries {
        let reads_metrics = !metric_names(query).is_empty();
        if !reads_metrics || query.contains("label_values(delay_bridge_build_info") {
            continue;
        }
        assert!(
            query.contains("$instance"),
            "not scoped to $instance: {query}"
        );
    }
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for needed in ["instance", "trigger"] {
        assert!(
            variables.contains(&needed),
            "variable {needed}: {variables:?}"
        );
    }
}
