//! Semantic checks that serde cannot express: ranges, references and cross-field rules.

use std::collections::HashSet;
use std::time::Duration;

use super::route::{resolve, resolve_dead_letter, Destination};
use super::{AmqpSinkConfig, Config, SinkConfig};
use crate::keys::QueueKeys;

/// Largest claim batch: bounds how long one claim script may block Redis.
pub const MAX_BATCH: usize = 10_000;
/// Most shards per trigger.
pub const MAX_SHARDS: u32 = 1024;
/// Most workers per trigger.
pub const MAX_WORKERS: usize = 1024;
/// Largest `max_unconfirmed` of an AMQP sink.
pub const MAX_UNCONFIRMED: usize = 1_000_000;
/// Largest `channels` of an AMQP sink (RabbitMQ's default `channel_max` is 2,047).
pub const MAX_CHANNELS: usize = 2000;
/// Largest `max_message_bytes`: RabbitMQ's own ceiling for `max_message_size` (a claim
/// holds up to `batch` such members in memory).
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024 * 1024;
/// AMQP names (exchanges, queues, routing and binding keys) are short strings.
const AMQP_SHORT_STRING: usize = 255;
/// Largest `max_claim_bytes`: what one claim script may return in bodies.
pub const MAX_CLAIM_BYTES: usize = 512 * 1024 * 1024;
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// What extraction produced: a config whose broken parts hold defaults, and what was broken.
pub(super) struct Parsed {
    pub config: Config,
    /// Position in the file of each entry of `config.triggers`.
    pub trigger_index: Vec<usize>,
    /// Sinks that failed to parse (already reported).
    pub broken_sinks: Vec<String>,
    /// `[redis]` failed to parse (already reported).
    pub broken_redis: bool,
    /// The file itself does not parse (already reported); nothing else is checked.
    pub unparsable: bool,
    /// The file has at least one `[[triggers]]` entry, parsed or not.
    pub had_triggers: bool,
}

/// What validation found: every problem as (key, message), and each trigger's destination
/// (`None` where it could not be resolved).
pub(super) struct Validated {
    pub problems: Vec<(String, String)>,
    pub destinations: Vec<Option<Destination>>,
    /// Each trigger's dead-letter destination, where it has one.
    pub dead_letters: Vec<Option<Destination>>,
    /// The TLS clients built while checking their files, by table.
    pub tls_clients: Vec<super::tls::Built>,
}

/// `delay:orders` as `delay:{orders}`: the part after the last `:` as the tag.
pub(super) fn suggested_tag(key: &str) -> String {
    match key.rsplit_once(':') {
        Some((head, tail)) if !tail.is_empty() => format!("{head}:{{{tail}}}"),
        _ => format!("{{{key}}}"),
    }
}

/// What the Redis client says of `url` (`rediss://` read as `redis://`: the bridge wraps TLS
/// itself), if it will not connect to it: `redis:/host:port` is a URL, but names no host.
fn redis_client_refuses(url: &str) -> Option<String> {
    use redis::IntoConnectionInfo;
    let plain = match url.strip_prefix("rediss://") {
        Some(rest) => format!("redis://{rest}"),
        None => url.to_string(),
    };
    let host_missing = url::Url::parse(&plain)
        .is_ok_and(|u| u.scheme() == "redis" && u.host_str().is_none_or(str::is_empty));
    if host_missing {
        return Some("names no host: write redis://HOST:PORT".into());
    }
    plain
        .as_str()
        .into_connection_info()
        .err()
        .map(|e| format!("the Redis client refuses it: {e}"))
}

/// The seed nodes of cluster mode: at least one, each a `redis://` or `rediss://` URL of
/// database 0, all with the same scheme; and `url` left alone.
fn cluster_problems(redis: &super::RedisConfig, push: &mut impl FnMut(String, String)) {
    if redis.nodes.is_empty() {
        push(
            "redis.nodes".into(),
            "cluster mode needs at least one seed node, e.g. [\"redis://10.0.0.1:6379\"]".into(),
        );
    }
    if redis.url != super::default_redis_url() {
        push(
            "redis.url".into(),
            "standalone only; in cluster mode list seed nodes in redis.nodes".into(),
        );
    }
    let mut schemes = HashSet::new();
    for (i, node) in redis.nodes.iter().enumerate() {
        let key = format!("redis.nodes[{i}]");
        match url::Url::parse(node) {
            Ok(u) if !matches!(u.scheme(), "redis" | "rediss") => push(
                key,
                format!(
                    "scheme `{}` is not supported, use redis:// or rediss://",
                    u.scheme()
                ),
            ),
            Ok(u) if u.host_str().is_none_or(str::is_empty) => push(key, "names no host".into()),
            Ok(_) if redis_client_refuses(node).is_some() => {
                push(key, redis_client_refuses(node).unwrap_or_default())
            }
            Ok(u) if !matches!(u.path(), "" | "/" | "/0") => push(
                key,
                format!("`{}`: a cluster has database 0 only", u.path()),
            ),
            Ok(u) => {
                schemes.insert(u.scheme().to_string());
            }
            Err(e) => push(key, format!("not a valid URL: {e}")),
        }
    }
    if schemes.len() > 1 {
        push(
            "redis.nodes".into(),
            "mixes redis:// and rediss://: a cluster is reached with TLS or without".into(),
        );
    }
    if let Some(tls) = &redis.tls {
        if tls.server_name.is_some() {
            push(
                "redis.tls.server_name".into(),
                "not supported in cluster mode: each node's certificate must carry the address it announces".into(),
            );
        }
        if tls.insecure {
            push(
                "redis.tls.insecure".into(),
                "not supported in cluster mode".into(),
            );
        }
    }
}

/// Checks everything serde cannot and resolves each trigger's destination.
pub(super) fn validate(parsed: &Parsed) -> Validated {
    let config = &parsed.config;
    let mut out = Vec::new();
    let mut destinations = Vec::new();
    let mut dead_letters = Vec::new();
    if parsed.unparsable {
        return Validated {
            problems: out,
            destinations,
            dead_letters,
            tls_clients: Vec::new(),
        };
    }
    let mut push = |key: String, message: String| out.push((key, message));

    let cluster = config.redis.mode == super::RedisMode::Cluster;
    if cluster && !parsed.broken_redis {
        cluster_problems(&config.redis, &mut push);
    } else if !config.redis.nodes.is_empty() && !parsed.broken_redis {
        push(
            "redis.nodes".into(),
            "only for mode = \"cluster\"; a standalone server is given by redis.url".into(),
        );
    }
    match url::Url::parse(&config.redis.url) {
        _ if parsed.broken_redis => {}
        Ok(u) if matches!(u.scheme(), "redis" | "rediss") => {
            if let Some(why) = redis_client_refuses(&config.redis.url) {
                push("redis.url".into(), why);
            }
        }
        Ok(u) => push(
            "redis.url".into(),
            format!(
                "scheme `{}` is not supported, use redis:// or rediss://",
                u.scheme()
            ),
        ),
        Err(e) => push("redis.url".into(), format!("not a valid URL: {e}")),
    }
    if config.redis.connect_timeout.is_zero() {
        push(
            "redis.connect_timeout".into(),
            "must be greater than zero".into(),
        );
    }
    if config.redis.response_timeout.is_zero() {
        push(
            "redis.response_timeout".into(),
            "must be greater than zero".into(),
        );
    }
    if config.shutdown.timeout.is_zero() {
        push(
            "shutdown.timeout".into(),
            "must be greater than zero".into(),
        );
    }
    if let Some(listen) = config.admin.listen {
        if listen == config.metrics.listen {
            push(
                "admin.listen".into(),
                format!("{listen} is metrics.listen already: the admin API needs its own"),
            );
        }
        match config.admin.token() {
            Err(e) => push("admin.token_file".into(), format!("{e:#}")),
            Ok(Some(t)) if t.chars().count() < 16 => push(
                "admin.token_file".into(),
                format!(
                    "the token is {} characters; use at least 16 (e.g. `openssl rand -hex 24`)",
                    t.chars().count()
                ),
            ),
            Ok(None) if !config.admin.read_only => push(
                "admin.token_file".into(),
                format!(
                    "the admin API changes queues only with a token: set token_file or {}, or read_only = true",
                    super::ADMIN_TOKEN_ENV
                ),
            ),
            _ => {}
        }
    }
    for (key, value, max) in [
        ("redis.connect_timeout", config.redis.connect_timeout, HOUR),
        (
            "redis.response_timeout",
            config.redis.response_timeout,
            HOUR,
        ),
        ("shutdown.timeout", config.shutdown.timeout, HOUR),
        (
            "metrics.backlog_interval",
            config.metrics.backlog_interval,
            HOUR,
        ),
    ] {
        if let Some(why) = too_long(value, max) {
            push(key.into(), why);
        }
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&config.log.level) {
        push("log.level".into(), format!("not a valid log filter: {e}"));
    }
    if config.metrics.backlog_interval < Duration::from_millis(100) {
        push(
            "metrics.backlog_interval".into(),
            "must be at least 100ms".into(),
        );
    }

    for (name, sink) in &config.sinks {
        if !valid_name(name) {
            push(
                format!("sinks.{name}"),
                "sink names may only contain A-Z, a-z, 0-9, `_`, `-` and `.`".into(),
            );
        }
        match sink {
            SinkConfig::Amqp(amqp) => {
                for (key, why) in amqp_addresses(name, amqp) {
                    push(key, why);
                }
                if let Some(why) = too_long(amqp.reconnect_max, HOUR) {
                    push(format!("sinks.{name}.reconnect_max"), why);
                }
                if amqp.channels == 0 || amqp.channels > MAX_CHANNELS {
                    push(
                        format!("sinks.{name}.channels"),
                        format!(
                            "must be between 1 and {MAX_CHANNELS}, got {}",
                            amqp.channels
                        ),
                    );
                }
                if amqp.max_unconfirmed == 0 || amqp.max_unconfirmed > MAX_UNCONFIRMED {
                    push(
                        format!("sinks.{name}.max_unconfirmed"),
                        format!(
                            "must be between 1 and {MAX_UNCONFIRMED}, got {}",
                            amqp.max_unconfirmed
                        ),
                    );
                }
                for (i, d) in amqp.declare.iter().enumerate() {
                    for (field, value) in [
                        ("exchange", Some(&d.exchange)),
                        ("queue", d.queue.as_ref()),
                        ("binding_key", d.binding_key.as_ref()),
                    ] {
                        if let Some(why) = value.and_then(|v| too_long_name(v)) {
                            push(format!("sinks.{name}.declare[{i}].{field}"), why);
                        }
                    }
                    if d.queue_type.is_some() && d.queue.is_none() {
                        push(
                            format!("sinks.{name}.declare[{i}].queue_type"),
                            "needs a `queue` to declare".into(),
                        );
                    }
                    if d.exchange.is_empty() {
                        push(
                            format!("sinks.{name}.declare[{i}].exchange"),
                            "must not be empty".into(),
                        );
                    }
                }
            }
            SinkConfig::Kafka(kafka) => {
                if kafka.brokers.trim().is_empty() {
                    push(format!("sinks.{name}.brokers"), "must not be empty".into());
                }
                if !kafka.accept_possible_loss {
                    for (property, why) in unsafe_kafka_properties(&kafka.properties) {
                        push(format!("sinks.{name}.properties.{property}"), why);
                    }
                }
            }
        }
    }

    if !parsed.had_triggers {
        push(
            "triggers".into(),
            "at least one [[triggers]] entry is required".into(),
        );
    }
    let mut names = HashSet::new();
    for (&i, t) in parsed.trigger_index.iter().zip(&config.triggers) {
        let k = |field: &str| format!("triggers[{i}].{field}");
        let mut destination = None;
        let mut dead_letter = None;
        if !valid_name(&t.name) {
            push(
                k("name"),
                "must be non-empty and contain only A-Z, a-z, 0-9, `_`, `-` and `.`".into(),
            );
        } else if !names.insert(t.name.as_str()) {
            push(k("name"), format!("duplicate trigger name `{}`", t.name));
        }
        if t.key.is_empty() {
            push(k("key"), "must not be empty".into());
        } else if let Err(e) = QueueKeys::derive(&t.key) {
            push(k("key"), e.to_string());
        } else if cluster && crate::keys::hash_tag(&t.key).is_none() {
            push(
                k("key"),
                format!(
                    "in cluster mode a key needs a hash tag, e.g. `{}`: without one its keyspace \
                     notifications are published in another slot than the key's",
                    suggested_tag(&t.key)
                ),
            );
        }
        match config.sinks.get(&t.sink) {
            None if parsed.broken_sinks.contains(&t.sink) => {}
            None => push(
                k("sink"),
                format!(
                    "no sink named `{}` (defined: {})",
                    t.sink,
                    if config.sinks.is_empty() {
                        "none".to_string()
                    } else {
                        config.sinks.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ),
            ),
            Some(sink) => {
                if let (SinkConfig::Amqp(_), Some(p)) = (sink, &t.routing_key_pointer) {
                    if let Err(why) = check_pointer(p) {
                        push(k("routing_key_pointer"), why);
                    }
                }
                for (field, value) in [
                    ("exchange", &t.exchange),
                    ("routing_key", &t.routing_key),
                    ("dead_letter_exchange", &t.dead_letter_exchange),
                    ("dead_letter_routing_key", &t.dead_letter_routing_key),
                ] {
                    if let Some(why) = value.as_deref().and_then(too_long_name) {
                        push(k(field), why);
                    }
                }
                for (field, why) in super::ingress::problems(t, sink) {
                    push(k(&field), why);
                }
                match resolve(t, sink) {
                    Ok(d) => destination = Some(d),
                    Err(problems) => {
                        for (field, why) in problems {
                            push(k(field), why);
                        }
                    }
                }
                match resolve_dead_letter(t, sink) {
                    Ok(d) => dead_letter = d,
                    Err(problems) => {
                        for (field, why) in problems {
                            push(k(field), why);
                        }
                    }
                }
            }
        }
        destinations.push(destination);
        dead_letters.push(dead_letter);
        for (field, n) in [("shards", Some(t.shards)), ("drain_shards", t.drain_shards)] {
            let Some(n) = n else { continue };
            if n == 0 || n > MAX_SHARDS {
                push(
                    k(field),
                    format!("must be between 1 and {MAX_SHARDS}, got {n}"),
                );
            } else if n > 1 && crate::keys::hash_tag(&t.key).is_none() {
                push(
                    k(field),
                    format!(
                        "a sharded key needs a hash tag for the shard number, e.g. `{}`",
                        suggested_tag(&t.key)
                    ),
                );
            }
        }
        if t.drain_shards == Some(t.shards) {
            push(
                k("drain_shards"),
                "equals `shards`: nothing is being changed; remove it".into(),
            );
        }
        if t.workers == 0 || t.workers > MAX_WORKERS {
            push(
                k("workers"),
                format!("must be between 1 and {MAX_WORKERS}, got {}", t.workers),
            );
        }
        if t.batch == 0 || t.batch > MAX_BATCH {
            push(
                k("batch"),
                format!("must be between 1 and {MAX_BATCH}, got {}", t.batch),
            );
        }
        if t.max_attempts == 0 {
            push(k("max_attempts"), "must be at least 1".into());
        }
        if t.guard_interval < Duration::from_millis(10) {
            push(k("guard_interval"), "must be at least 10ms".into());
        }
        if t.notified_guard_interval < Duration::from_millis(10) {
            push(k("notified_guard_interval"), "must be at least 10ms".into());
        }
        if t.publish_timeout.is_zero() {
            push(k("publish_timeout"), "must be greater than zero".into());
        }
        if t.lease <= t.publish_timeout {
            push(
                k("lease"),
                format!(
                    "must be longer than publish_timeout ({}), or leases expire while the broker is still confirming",
                    humantime::format_duration(t.publish_timeout)
                ),
            );
        }
        if t.backoff_initial.is_zero() {
            push(k("backoff_initial"), "must be greater than zero".into());
        }
        if t.backoff_max < t.backoff_initial {
            push(
                k("backoff_max"),
                "must not be shorter than backoff_initial".into(),
            );
        }
        if t.expire_after.is_some_and(|d| d.is_zero()) {
            push(
                k("expire_after"),
                "must be greater than zero (unset: messages never expire)".into(),
            );
        }
        if let Some(rate) = &t.rate_limit {
            if let Err(e) = super::parse_rate(rate) {
                push(k("rate_limit"), e);
            }
        }
        match (t.rate_burst, &t.rate_limit) {
            (Some(0), _) => push(k("rate_burst"), "must be at least 1".into()),
            (Some(_), None) => push(
                k("rate_burst"),
                "has no effect without rate_limit; set both or neither".into(),
            ),
            _ => {}
        }
        if t.max_claim_bytes == 0 || t.max_claim_bytes > MAX_CLAIM_BYTES {
            push(
                k("max_claim_bytes"),
                format!(
                    "must be between 1 and {MAX_CLAIM_BYTES} (512 MiB), got {}",
                    t.max_claim_bytes
                ),
            );
        }
        if t.max_message_bytes == 0 || t.max_message_bytes > MAX_MESSAGE_BYTES {
            push(
                k("max_message_bytes"),
                format!(
                    "must be between 1 and {MAX_MESSAGE_BYTES} (128 MiB), got {}",
                    t.max_message_bytes
                ),
            );
        }
        for (field, value, max) in [
            ("lease", t.lease, DAY),
            ("guard_interval", t.guard_interval, HOUR),
            ("notified_guard_interval", t.notified_guard_interval, HOUR),
            ("publish_timeout", t.publish_timeout, HOUR),
            ("backoff_initial", t.backoff_initial, DAY),
            ("backoff_max", t.backoff_max, DAY),
        ] {
            if let Some(why) = too_long(value, max) {
                push(k(field), why);
            }
        }
    }
    let (tls_problems, tls_clients) = super::tls::problems(config, parsed.broken_redis);
    for (key, why) in tls_problems {
        push(key, why);
    }
    for (a, b, key) in key_overlaps(config, &parsed.trigger_index) {
        push(
            format!("triggers[{a}].key"),
            format!(
                "trigger `{}` and trigger `{}` (triggers[{b}]) both use the Redis key `{key}`; \
                 each trigger needs keys of its own (source and derived: KEY:inflight, KEY:dead, ...)",
                config.triggers[pos(&parsed.trigger_index, a)].name,
                config.triggers[pos(&parsed.trigger_index, b)].name,
            ),
        );
    }
    Validated {
        problems: out,
        destinations,
        dead_letters,
        tls_clients,
    }
}

/// Where the trigger written as `triggers[i]` sits in the parsed list.
fn pos(index: &[usize], i: usize) -> usize {
    index.iter().position(|&j| j == i).unwrap_or(0)
}

/// Problems with an AMQP sink's addresses: exactly one of `url` and `urls`, each a valid
/// amqp(s) URL, and the nodes of one cluster: only host, port and query may differ, since the
/// credentials, `password_file` and the vhost apply to whichever node the bridge is on.
fn amqp_addresses(name: &str, amqp: &AmqpSinkConfig) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let keys: Vec<String> = match (&amqp.url, &amqp.urls) {
        (Some(_), Some(_)) => {
            out.push((
                format!("sinks.{name}.urls"),
                "give `url` (one node) or `urls` (the nodes of a cluster), not both".into(),
            ));
            return out;
        }
        (None, None) => {
            out.push((
                format!("sinks.{name}.url"),
                "missing: give `url` (one node) or `urls` (the nodes of a cluster)".into(),
            ));
            return out;
        }
        (Some(_), None) => vec![format!("sinks.{name}.url")],
        (None, Some(urls)) if urls.is_empty() => {
            out.push((
                format!("sinks.{name}.urls"),
                "must list at least one address".into(),
            ));
            return out;
        }
        (None, Some(urls)) => (0..urls.len())
            .map(|i| format!("sinks.{name}.urls[{i}]"))
            .collect(),
    };
    let mut first: Option<url::Url> = None;
    let mut seen = HashSet::new();
    for (key, raw) in keys.into_iter().zip(amqp.addresses()) {
        let u = match url::Url::parse(raw) {
            Ok(u) if matches!(u.scheme(), "amqp" | "amqps") => {
                // What the AMQP client will make of it (it reads the vhost and the query).
                if let Err(e) = raw.parse::<lapin::uri::AMQPUri>() {
                    out.push((key, format!("the AMQP client refuses it: {e}")));
                    continue;
                }
                if u.host_str().is_none_or(str::is_empty) {
                    out.push((
                        key,
                        "names no host: write amqp://USER@HOST:PORT/VHOST".into(),
                    ));
                    continue;
                }
                u
            }
            Ok(u) => {
                let why = format!(
                    "scheme `{}` is not supported, use amqp:// or amqps://",
                    u.scheme()
                );
                out.push((key, why));
                continue;
            }
            Err(e) => {
                out.push((key, format!("not a valid URL: {e}")));
                continue;
            }
        };
        let node = (u.host_str().map(str::to_string), u.port());
        if !seen.insert(node.clone()) {
            let host = node.0.unwrap_or_default();
            let port = node.1.map_or_else(String::new, |p| format!(":{p}"));
            out.push((key, format!("`{host}{port}` is listed twice")));
            continue;
        }
        match &first {
            None => first = Some(u),
            Some(f) => {
                let differs: Vec<&str> = [
                    ("the scheme", f.scheme() != u.scheme()),
                    ("the user", f.username() != u.username()),
                    ("the password", f.password() != u.password()),
                    ("the vhost", f.path() != u.path()),
                ]
                .into_iter()
                .filter_map(|(what, differs)| differs.then_some(what))
                .collect();
                if !differs.is_empty() {
                    out.push((
                        key,
                        format!(
                            "{} {} from urls[0]: the addresses are the nodes of one cluster and \
                             share scheme, credentials and vhost (only host, port and query may differ)",
                            differs.join(", "),
                            if differs.len() == 1 { "differs" } else { "differ" }
                        ),
                    ));
                }
            }
        }
    }
    out
}

/// Pairs of triggers (by their index in the file) whose source or derived keys coincide,
/// with one shared key each: two triggers on one key would split its messages at random,
/// and one trigger's source being another's in-flight set would deliver leases.
fn key_overlaps(config: &Config, index: &[usize]) -> Vec<(usize, usize, String)> {
    let mut owner: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut pairs = std::collections::BTreeMap::new();
    for (&i, t) in index.iter().zip(&config.triggers) {
        for shard in t.shard_keys() {
            let Ok(keys) = QueueKeys::derive(&shard) else {
                continue;
            };
            for key in keys.all() {
                match owner.get(key) {
                    Some(&other) if other != i => {
                        pairs.entry((other, i)).or_insert_with(|| key.to_string());
                    }
                    Some(_) => {}
                    None => {
                        owner.insert(key.to_string(), i);
                    }
                }
            }
        }
    }
    pairs.into_iter().map(|((a, b), k)| (b, a, k)).collect()
}

/// Properties under which a Kafka delivery report no longer proves the record is stored.
fn unsafe_kafka_properties(
    properties: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in properties {
        let value = v.trim().to_ascii_lowercase();
        let unsafe_value = match k.as_str() {
            "acks" | "request.required.acks" => !matches!(value.as_str(), "all" | "-1"),
            "enable.idempotence" => value != "true",
            _ => false,
        };
        if unsafe_value {
            out.push((
                k.clone(),
                format!(
                    "`{v}` lets the broker confirm records it may lose, and the bridge deletes a \
                     member once its record is confirmed; remove it, or set accept_possible_loss = true \
                     on this sink to accept that"
                ),
            ));
        }
    }
    out
}

/// `Some(reason)` when `value` exceeds `max` (durations are bounded so that deadline
/// arithmetic cannot overflow).
fn too_long(value: Duration, max: Duration) -> Option<String> {
    (value > max).then(|| {
        format!(
            "must be at most {}, got {}",
            humantime::format_duration(max),
            humantime::format_duration(value)
        )
    })
}

/// `Some(reason)` when an AMQP name does not fit the protocol's 255-byte short string.
fn too_long_name(value: &str) -> Option<String> {
    (value.len() > AMQP_SHORT_STRING).then(|| {
        format!(
            "is {} bytes; AMQP names are at most {AMQP_SHORT_STRING} bytes",
            value.len()
        )
    })
}

/// A JSON Pointer (RFC 6901) naming a field: `/a/b`, with `~` only in `~0` and `~1`.
fn check_pointer(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!(
            "`{p}` is not a JSON Pointer: it must start with `/`, e.g. \"/type\""
        ));
    }
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!("`{p}`: `~` must be followed by 0 or 1 (RFC 6901)"));
        }
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl Config {
    /// Everything an operator should hear before the configuration is used: the TLS
    /// warnings, and envelope routing that reaches further than the operator may think.
    /// Logged at start and printed by `check`.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.tls_warnings();
        if let Some(listen) = self.admin.listen.filter(|l| !l.ip().is_loopback()) {
            out.push(format!(
                "admin.listen {listen} is not loopback: the admin API's token and messages travel in clear"
            ));
        }
        for (i, t) in self.triggers.iter().enumerate() {
            let Some(Destination::Amqp(route)) = &t.destination else {
                continue;
            };
            let own_keys = t.format == super::MessageFormat::Envelope
                || matches!(route.routing, super::AmqpRouting::Pointer(_));
            if own_keys && route.exchange.is_empty() && route.allowed_routing_keys.is_none() {
                out.push(format!(
                    "triggers[{i}]: messages choose their own routing key on the default exchange, \
                     which reaches every queue of the vhost: set allowed_routing_keys"
                ));
            }
            let headers_exchange = self.sinks.get(&t.sink).is_some_and(|s| match s {
                SinkConfig::Amqp(a) => a.declare.iter().any(|d| {
                    d.exchange == route.exchange && d.kind == super::ExchangeType::Headers
                }),
                SinkConfig::Kafka(_) => false,
            });
            if t.format == super::MessageFormat::Envelope && headers_exchange {
                out.push(format!(
                    "triggers[{i}]: `{}` is a headers exchange and envelopes set headers: \
                     messages choose their own queues, allowed_routing_keys does not apply",
                    route.exchange
                ));
            }
        }
        out
    }
}
