//! Semantic checks that serde cannot express: ranges, references and cross-field rules.

use std::collections::HashSet;
use std::time::Duration;

use super::load::Parsed;
use super::{Problem, SinkConfig};
use crate::keys::QueueKeys;

/// Largest claim batch: bounds how long one claim script may block Redis.
pub const MAX_BATCH: usize = 10_000;
/// Most workers per trigger.
pub const MAX_WORKERS: usize = 1024;

/// Returns every problem in `config`; `source` names where a key came from.
pub(super) fn validate(parsed: &Parsed, source: &dyn Fn(&str) -> String) -> Vec<Problem> {
    let config = &parsed.config;
    let mut out = Vec::new();
    if parsed.unparsable {
        return out;
    }
    let mut push = |key: String, message: String| {
        let src = source(&key);
        out.push(Problem {
            key,
            message,
            source: src,
        });
    };

    match url::Url::parse(&config.redis.url) {
        _ if parsed.broken_redis => {}
        Ok(u) if matches!(u.scheme(), "redis" | "rediss") => {}
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
                match url::Url::parse(&amqp.url) {
                    Ok(u) if matches!(u.scheme(), "amqp" | "amqps") => {}
                    Ok(u) => push(
                        format!("sinks.{name}.url"),
                        format!(
                            "scheme `{}` is not supported, use amqp:// or amqps://",
                            u.scheme()
                        ),
                    ),
                    Err(e) => push(format!("sinks.{name}.url"), format!("not a valid URL: {e}")),
                }
                for (i, d) in amqp.declare.iter().enumerate() {
                    if !matches!(d.kind.as_str(), "direct" | "topic" | "fanout" | "headers") {
                        push(
                            format!("sinks.{name}.declare[{i}].kind"),
                            format!("unknown exchange type `{}`, expected direct, topic, fanout or headers", d.kind),
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
            Some(SinkConfig::Amqp(_)) => {
                if let Some(p) = &t.routing_key_pointer {
                    if let Err(why) = check_pointer(p) {
                        push(k("routing_key_pointer"), why);
                    }
                }
                if t.exchange.is_none() {
                    push(
                        k("exchange"),
                        "required for an amqp sink (use \"\" for the default exchange)".into(),
                    );
                }
                if t.topic.is_some() {
                    push(
                        k("topic"),
                        "only for kafka sinks; this trigger's sink is amqp".into(),
                    );
                }
                if t.kafka_key.is_some() {
                    push(
                        k("kafka_key"),
                        "only for kafka sinks; this trigger's sink is amqp".into(),
                    );
                }
            }
            Some(SinkConfig::Kafka(_)) => {
                match &t.topic {
                    None => push(k("topic"), "required for a kafka sink".into()),
                    Some(topic) if topic.is_empty() => push(k("topic"), "must not be empty".into()),
                    Some(_) => {}
                }
                if t.exchange.is_some() {
                    push(
                        k("exchange"),
                        "only for amqp sinks; this trigger's sink is kafka".into(),
                    );
                }
                if t.routing_key.is_some() {
                    push(
                        k("routing_key"),
                        "only for amqp sinks; this trigger's sink is kafka".into(),
                    );
                }
                if t.routing_key_pointer.is_some() {
                    push(
                        k("routing_key_pointer"),
                        "only for amqp sinks; this trigger's sink is kafka".into(),
                    );
                }
            }
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
        if t.max_message_bytes == 0 {
            push(k("max_message_bytes"), "must be greater than zero".into());
        }
    }
    out
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
