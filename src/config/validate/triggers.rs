//! The `[[triggers]]` entries: name, key, sink and destination, bounds; and keys two
//! triggers would share.

use std::collections::HashSet;
use std::time::Duration;

use super::super::route::{resolve, resolve_dead_letter, Destination};
use super::super::{SinkConfig, TriggerConfig};
use super::{
    check_pointer, pos, suggested_tag, too_long, too_long_name, valid_name, Parsed, DAY, HOUR,
    MAX_BATCH, MAX_CLAIM_BYTES, MAX_MESSAGE_BYTES, MAX_SHARDS, MAX_WORKERS,
};
use crate::keys::QueueKeys;

/// Each trigger's destination and dead-letter destination (`None` where it could not be
/// resolved), in the order of `parsed.triggers`.
pub(super) type Routes = (Vec<Option<Destination>>, Vec<Option<Destination>>);

/// Problems of every trigger, and the routes of those that resolve.
pub(super) fn trigger_problems(
    parsed: &Parsed,
    cluster: bool,
    push: &mut impl FnMut(String, String),
) -> Routes {
    let mut destinations = Vec::new();
    let mut dead_letters = Vec::new();
    if !parsed.had_triggers {
        push(
            "triggers".into(),
            "at least one [[triggers]] entry is required".into(),
        );
    }
    let mut names = HashSet::new();
    for (&i, t) in parsed.trigger_index.iter().zip(&parsed.triggers) {
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
        let (destination, dead_letter) = routes(t, parsed, &k, push);
        destinations.push(destination);
        dead_letters.push(dead_letter);
        bounds(t, &k, push);
        super::super::schedule::schedule_problems(i, &t.schedules, push);
    }
    for (a, b, key) in key_overlaps(&parsed.triggers, &parsed.trigger_index) {
        push(
            format!("triggers[{a}].key"),
            format!(
                "trigger `{}` and trigger `{}` (triggers[{b}]) both use the Redis key `{key}`; \
                 each trigger needs keys of its own (source and derived: KEY:inflight, KEY:dead, ...)",
                parsed.triggers[pos(&parsed.trigger_index, a)].name,
                parsed.triggers[pos(&parsed.trigger_index, b)].name,
            ),
        );
    }
    (destinations, dead_letters)
}

/// The trigger's sink, and its destination and dead-letter destination resolved against it.
fn routes(
    t: &TriggerConfig,
    parsed: &Parsed,
    k: &impl Fn(&str) -> String,
    push: &mut impl FnMut(String, String),
) -> (Option<Destination>, Option<Destination>) {
    let config = &parsed.config;
    let mut destination = None;
    let mut dead_letter = None;
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
            if let (SinkConfig::Http(_), Some(p)) = (sink, &t.url_pointer) {
                if let Err(why) = check_pointer(p) {
                    push(k("url_pointer"), why);
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
            for (field, why) in super::super::ingress::problems(t, sink) {
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
    (destination, dead_letter)
}

/// The trigger's counts and sizes within their bounds.
fn bounds(t: &TriggerConfig, k: &impl Fn(&str) -> String, push: &mut impl FnMut(String, String)) {
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
    timings(t, k, push);
}

/// The trigger's durations within their bounds and consistent with each other, and its rate
/// limit.
fn timings(t: &TriggerConfig, k: &impl Fn(&str) -> String, push: &mut impl FnMut(String, String)) {
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
        if let Err(e) = super::super::parse_rate(rate) {
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

/// Pairs of triggers (by their index in the file) whose source or derived keys coincide,
/// with one shared key each: two triggers on one key would split its messages at random,
/// and one trigger's source being another's in-flight set would deliver leases.
fn key_overlaps(triggers: &[TriggerConfig], index: &[usize]) -> Vec<(usize, usize, String)> {
    let mut owner: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut pairs = std::collections::BTreeMap::new();
    for (&i, t) in index.iter().zip(triggers) {
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
