//! `check`: the configuration validated, then what it will do, said line by line: Redis,
//! the sinks, each trigger with its keys, the shard map of a cluster, members stranded on
//! keys no longer served.

use crate::config::{Config, Destination, SinkConfig, Trigger};
use crate::keys::QueueKeys;
use crate::secret::redact_url;

use super::{find_and_load, reach, ConfigArg, EXIT_CONFIG};

/// The TLS settings in a `check` line: which files and names are used, never their contents.
fn tls_summary(tls: Option<&crate::config::TlsConfig>) -> String {
    let Some(tls) = tls else {
        return String::new();
    };
    let mut parts = Vec::new();
    if tls.insecure {
        parts.push("insecure: nothing verified".to_string());
    }
    if let Some(ca) = &tls.ca_file {
        parts.push(format!("ca_file={}", ca.display()));
    }
    if let Some(cert) = &tls.cert_file {
        parts.push(format!("client certificate {}", cert.display()));
    }
    if let Some(name) = &tls.server_name {
        parts.push(format!("server_name={name}"));
    }
    format!(" [tls: {}]", parts.join(", "))
}

/// Validates and describes the configuration; with `connect`, also reports what
/// [`super::connect::problems`] finds (exit [`super::connect::EXIT_UNAVAILABLE`] if anything).
pub(super) async fn check(arg: &ConfigArg, connect: bool) -> i32 {
    let (path, config) = match find_and_load(arg) {
        Ok(found) => found,
        Err(code) => return code,
    };
    say!("config {} is valid", path.display());
    for warning in config.warnings() {
        say!("warning: {warning}");
    }
    let settings = config.redis.settings();
    let listed = |urls: &[String]| {
        let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
        urls.join(", ")
    };
    let redis = match settings.mode {
        crate::config::RedisMode::Standalone => redact_url(&settings.url),
        crate::config::RedisMode::Cluster => format!("cluster via {}", listed(&settings.nodes)),
        crate::config::RedisMode::Sentinel => format!(
            "master `{}` via sentinels {}",
            settings.master_name.as_deref().unwrap_or_default(),
            listed(&settings.sentinels)
        ),
    };
    say!("redis: {redis}{}", tls_summary(settings.tls.as_ref()));
    say!("metrics: http://{}/metrics", config.metrics.listen);
    for (name, sink) in &config.sinks {
        say!("sink {name}: {}", sink_line(sink.settings()));
    }
    for t in &config.triggers {
        trigger_line(&config, t);
        super::schedule::schedule_lines(t);
    }
    super::schedule::tzdata_line(&config);
    if settings.mode == crate::config::RedisMode::Cluster {
        shard_map(&config).await;
    }
    let code = unserved_keys(&config).await;
    if !connect || code != 0 {
        return code;
    }
    connected(&config).await
}

/// `--connect`: every problem found, one line each, or that everything was found.
async fn connected(config: &Config) -> i32 {
    let problems = super::connect::problems(config).await;
    for p in &problems {
        say!("problem: {p}");
    }
    if problems.is_empty() {
        say!("connect: Redis and every trigger's destination reached");
        return 0;
    }
    say!("connect: {} problem(s) found", problems.len());
    super::connect::EXIT_UNAVAILABLE
}

/// What `check` says of a sink: its addresses (passwords hidden) and TLS, its brokers and
/// properties (secrets hidden), or its HTTP client's settings.
fn sink_line(sink: &SinkConfig) -> String {
    match sink {
        SinkConfig::Amqp(a) => {
            let addresses: Vec<String> = a.addresses().into_iter().map(redact_url).collect();
            format!(
                "amqp {}{}",
                addresses.join(", "),
                tls_summary(a.tls.as_ref())
            )
        }
        SinkConfig::Kafka(k) => {
            let props: Vec<String> = k
                .properties
                .iter()
                .map(|(key, v)| {
                    let secret = ["password", "secret", "key.pem", "token"]
                        .iter()
                        .any(|s| key.contains(s));
                    format!("{key}={}", if secret { "***" } else { v.as_str() })
                })
                .collect();
            format!("kafka {} [{}]", k.brokers, props.join(", "))
        }
        SinkConfig::Http(h) => format!(
            "http timeout={} max_concurrency={}{}{}",
            humantime::format_duration(h.timeout),
            h.max_concurrency,
            if h.signing_secret_file.is_some() {
                " signed"
            } else {
                ""
            },
            tls_summary(h.tls.as_ref())
        ),
    }
}

/// What `check` says of a trigger: its keys, options and destination.
fn trigger_line(config: &Config, t: &Trigger) {
    let keys = QueueKeys::derive(t.key()).expect("validated");
    let mut payload = match t.payload() {
        crate::config::PayloadMode::Inline => String::new(),
        crate::config::PayloadMode::Hash => format!(
            " payload=hash bodies={} max_claim_bytes={}",
            keys.bodies,
            t.max_claim_bytes()
        ),
    };
    if t.format() == crate::config::MessageFormat::Envelope {
        payload.push_str(" format=envelope");
    }
    if let Some(after) = t.expire_after() {
        let on_expired = match t.on_expired() {
            crate::config::OnExpired::DeadLetter => "dead_letter",
            crate::config::OnExpired::Drop => "drop",
        };
        payload.push_str(&format!(
            " expire_after={} on_expired={on_expired}",
            humantime::format_duration(after)
        ));
    }
    match t.destination() {
        Destination::Amqp(route) => {
            if let Some(allowed) = &route.allowed_routing_keys {
                payload.push_str(&format!(" allowed_routing_keys={allowed:?}"));
            }
        }
        Destination::Kafka(route) => {
            if let Some(allowed) = &route.allowed_topics {
                payload.push_str(&format!(" allowed_topics={:?}", allowed.patterns()));
            }
        }
        Destination::Http(_) => {}
    }
    if let Some(rate) = t.rate() {
        payload.push_str(&format!(
            " rate_limit={}/s burst={} (bucket in {})",
            rate.per_second(),
            rate.burst(),
            keys.control
        ));
    }
    if let Some(dead) = t.dead_letter() {
        payload.push_str(&format!(
            " dead_letters_to=({dead}) (leases in {})",
            keys.dead_inflight
        ));
    }
    if config.redis.settings().mode == crate::config::RedisMode::Cluster {
        payload.push_str(&format!(
            " slot={}",
            crate::redis::conn::slot(keys.source.as_bytes())
        ));
    }
    let dest = t.destination();
    say!(
        "trigger {}: key={} inflight={} dead={}{payload} -> sink {} {dest} workers={} batch={} lease={} guard_interval={} \
         notified_guard_interval={} publish_timeout={} max_attempts={} backoff={}..{} max_message_bytes={}",
        t.name(),
        keys.source,
        keys.inflight,
        keys.dead,
        t.sink(),
        t.workers(),
        t.batch(),
        humantime::format_duration(t.lease()),
        humantime::format_duration(t.guard_interval()),
        humantime::format_duration(t.notified_guard()),
        humantime::format_duration(t.publish_timeout()),
        t.max_attempts(),
        humantime::format_duration(t.backoff_initial()),
        humantime::format_duration(t.backoff_max()),
        t.max_message_bytes(),
    );
    if let Some(i) = t.ingress() {
        ingress_line(t, i);
    }
}

/// What `check` says of a trigger's ingress: where producers publish, and how ids are made.
fn ingress_line(t: &Trigger, i: &crate::config::IngressConfig) {
    if i.topic.is_some() {
        say!(
            "trigger {} ingress: kafka topic={} group={} -> key={} (x-delay ms or x-delay-until epoch ms; \
             id = topic/partition/offset)",
            t.name(),
            i.topic.as_deref().unwrap_or_default(),
            i.group_name(t.name()),
            t.key(),
        );
        return;
    }
    say!(
        "trigger {} ingress: amqp exchange={} ({}) queue={} ({}) binding_keys={:?} prefetch={} -> key={} \
         (x-delay ms or x-delay-until epoch ms; id = message_id, else a digest)",
        t.name(),
        i.exchange_name(),
        serde_json::to_value(i.exchange_type)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        i.queue_name(),
        i.queue_type.map_or("classic", |q| q.as_str()),
        i.binding_keys,
        i.prefetch,
        t.key(),
    );
}

/// Members on keys of a trigger that this configuration does not serve (an earlier shard
/// count's): the bridge would refuse to start; `EXIT_CONFIG` if there are some.
async fn unserved_keys(config: &Config) -> i32 {
    let conn = match reach::connect(config).await {
        Ok(conn) => conn,
        Err(e) => {
            say!(
                "redis: not reached, so members on keys no longer served are not looked for: {e:#}"
            );
            return 0;
        }
    };
    match crate::redis::queue::take_layouts_dry(&config.triggers, &conn).await {
        Ok(()) => 0,
        Err(refused) => {
            for e in &refused.0 {
                say!("error: {e}");
            }
            EXIT_CONFIG
        }
    }
}

/// In cluster mode, each sharded trigger's shard -> slot -> master, read from the cluster, with
/// a warning when its shards land unevenly over the masters.
async fn shard_map(config: &Config) {
    let sharded: Vec<_> = config
        .triggers
        .iter()
        .filter(|t| t.shard_keys().len() > 1)
        .collect();
    if sharded.is_empty() {
        return;
    }
    let conn = match reach::connect(config).await {
        Ok(conn) => conn,
        Err(e) => return say!("shards: cannot reach the cluster to place them: {e:#}"),
    };
    let topology = match conn.topology().await {
        Some(Ok(topology)) => topology,
        Some(Err(e)) => return say!("shards: cannot read the cluster's slots: {e}"),
        None => return,
    };
    let masters = topology.masters();
    for t in sharded {
        let keys = t.shard_keys();
        let mut per_master: std::collections::BTreeMap<&str, usize> =
            masters.iter().map(|m| (*m, 0)).collect();
        for key in keys {
            let slot = crate::redis::conn::slot(key.as_bytes());
            let master = topology.master_of(slot).unwrap_or("(no master)");
            *per_master.entry(master).or_default() += 1;
            say!(
                "trigger {}: shard {key} -> slot {slot} -> {master}",
                t.name()
            );
        }
        let (n, m) = (keys.len(), per_master.len().max(1));
        let most = per_master.values().copied().max().unwrap_or(0);
        let fewest = per_master.values().copied().min().unwrap_or(0);
        if (n >= m && fewest == 0) || most > (n.div_ceil(m) * 3).div_ceil(2) {
            let spread: Vec<String> = per_master
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            say!(
                "warning: trigger {}: its {n} shards land unevenly over the {m} masters ({}); \
                 more shards (a multiple of the masters) spread them better",
                t.name(),
                spread.join(", ")
            );
        }
    }
}
