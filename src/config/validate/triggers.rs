//! The `[[triggers]]` entries: name, key, sink and destination, bounds; keys two triggers
//! would share; and each valid entry made a [`Trigger`].

use std::collections::HashSet;
use std::time::Duration;

use super::super::rate::Rate;
use super::super::route::{resolve, resolve_dead_letter, Destination};
use super::super::trigger::Resolved;
use super::super::{RedisMode, SinkConfig, Trigger, TriggerConfig};
use super::{
    check_pointer, pos, suggested_tag, too_long, too_long_name, valid_name, Parsed, DAY, HOUR,
    MAX_BATCH, MAX_CLAIM_BYTES, MAX_MESSAGE_BYTES, MAX_SHARDS, MAX_WORKERS,
};
use crate::keys::QueueKeys;

/// Every trigger, validated; `None` when one of them is not valid (every problem of every
/// trigger is pushed, each with its key).
pub(super) fn triggers(
    parsed: &Parsed,
    push: &mut impl FnMut(String, String),
) -> Option<Vec<Trigger>> {
    if !parsed.had_triggers {
        push(
            "triggers".into(),
            "at least one [[triggers]] entry is required".into(),
        );
    }
    let mut valid = Some(Vec::new());
    let mut names = HashSet::new();
    for (&i, t) in parsed.trigger_index.iter().zip(&parsed.triggers) {
        let mut problems = Vec::new();
        let built = trigger(t, i, parsed, &mut |key, why| problems.push((key, why)));
        let duplicate = valid_name(&t.name) && !names.insert(t.name.as_str());
        if duplicate {
            problems.push((
                format!("triggers[{i}].name"),
                format!("duplicate trigger name `{}`", t.name),
            ));
        }
        match (built, &mut valid) {
            (Some(built), Some(all)) if problems.is_empty() => all.push(built),
            _ => valid = None,
        }
        for (key, why) in problems {
            push(key, why);
        }
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
        valid = None;
    }
    valid
}

/// The trigger `t`, written as `triggers[i]`, checked on its own, its routes resolved and its
/// rate read: the validated [`Trigger`], or `None` with its problems pushed.
fn trigger(
    t: &TriggerConfig,
    i: usize,
    parsed: &Parsed,
    push: &mut impl FnMut(String, String),
) -> Option<Trigger> {
    let mut problems = 0;
    let mut push = |key: String, why: String| {
        problems += 1;
        push(key, why);
    };
    let k = |field: &str| format!("triggers[{i}].{field}");
    if !valid_name(&t.name) {
        push(
            k("name"),
            "must be non-empty and contain only A-Z, a-z, 0-9, `_`, `-` and `.`".into(),
        );
    }
    if t.key.is_empty() {
        push(k("key"), "must not be empty".into());
    } else if let Err(e) = QueueKeys::derive(&t.key) {
        push(k("key"), e.to_string());
    } else if parsed.redis.mode == RedisMode::Cluster && crate::keys::hash_tag(&t.key).is_none() {
        push(
            k("key"),
            format!(
                "in cluster mode a key needs a hash tag, e.g. `{}`: without one its keyspace \
                 notifications are published in another slot than the key's",
                suggested_tag(&t.key)
            ),
        );
    }
    let (destination, dead_letter) = routes(t, parsed, &k, &mut push);
    bounds(t, &k, &mut push);
    let rate = rate(t, &k, &mut push);
    super::super::schedule::schedule_problems(i, &t.schedules, &mut push);
    match destination {
        Some(destination) if problems == 0 => Some(Trigger::new(
            t.clone(),
            Resolved {
                destination,
                dead_letter,
                rate,
            },
        )),
        _ => None,
    }
}

/// The trigger's sink, and its destination and dead-letter destination resolved against it.
fn routes(
    t: &TriggerConfig,
    parsed: &Parsed,
    k: &impl Fn(&str) -> String,
    push: &mut impl FnMut(String, String),
) -> (Option<Destination>, Option<Destination>) {
    let mut destination = None;
    let mut dead_letter = None;
    match parsed.sinks.get(&t.sink) {
        None if parsed.broken_sinks.contains(&t.sink) => {}
        None => push(
            k("sink"),
            format!(
                "no sink named `{}` (defined: {})",
                t.sink,
                if parsed.sinks.is_empty() {
                    "none".to_string()
                } else {
                    parsed.sinks.keys().cloned().collect::<Vec<_>>().join(", ")
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

/// The trigger's durations within their bounds and consistent with each other.
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

/// The trigger's rate limit, read once (`None` without one, or with its problems pushed).
fn rate(
    t: &TriggerConfig,
    k: &impl Fn(&str) -> String,
    push: &mut impl FnMut(String, String),
) -> Option<Rate> {
    match (t.rate_burst, &t.rate_limit) {
        (Some(0), _) => push(k("rate_burst"), "must be at least 1".into()),
        (Some(_), None) => push(
            k("rate_burst"),
            "has no effect without rate_limit; set both or neither".into(),
        ),
        _ => {}
    }
    let limit = t.rate_limit.as_deref()?;
    Rate::new(limit, t.rate_burst)
        .inspect_err(|why| push(k("rate_limit"), why.clone()))
        .ok()
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
