//! Semantic checks that serde cannot express: ranges, references and cross-field rules, one
//! file per section (`redis`, `service`, `sinks`, `triggers`), every problem with its key.

mod redis;
mod service;
mod sinks;
mod triggers;

use std::collections::BTreeMap;
use std::time::Duration;

use super::problem::Invalid;
pub(super) use super::rules::{too_long, valid_name};
use super::{
    AdminConfig, Config, LogConfig, MetricsConfig, Redis, RedisConfig, ShutdownConfig, Sink,
    SinkConfig, TriggerConfig,
};

/// Largest claim batch: bounds how long one claim script may block Redis.
pub(super) const MAX_BATCH: usize = 10_000;
/// Most shards per trigger.
pub(crate) const MAX_SHARDS: u32 = 1024;
/// Most workers per trigger.
pub(super) const MAX_WORKERS: usize = 1024;
/// Largest `max_unconfirmed` of an AMQP sink.
pub(super) const MAX_UNCONFIRMED: usize = 1_000_000;
/// Largest `channels` of an AMQP sink (RabbitMQ's default `channel_max` is 2,047).
pub(super) const MAX_CHANNELS: usize = 2000;
/// Largest `max_message_bytes`: RabbitMQ's own ceiling for `max_message_size` (a claim
/// holds up to `batch` such members in memory).
pub(super) const MAX_MESSAGE_BYTES: usize = 128 * 1024 * 1024;
/// AMQP names (exchanges, queues, routing and binding keys) are short strings.
const AMQP_SHORT_STRING: usize = 255;
/// Largest `max_claim_bytes`: what one claim script may return in bodies.
pub(super) const MAX_CLAIM_BYTES: usize = 512 * 1024 * 1024;
pub(super) const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// What extraction produced: every section as written, broken ones replaced by their
/// defaults, and what was broken.
#[derive(Default)]
pub(super) struct Parsed {
    pub redis: RedisConfig,
    pub metrics: MetricsConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    pub shutdown: ShutdownConfig,
    /// The sinks that parsed, as written.
    pub sinks: BTreeMap<String, SinkConfig>,
    /// The `[[triggers]]` entries that parsed, as written.
    pub triggers: Vec<TriggerConfig>,
    /// Position in the file of each entry of `triggers`.
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

/// What validation found: every problem as (key, message), and the validated configuration
/// when there is none (`None` too when a section was broken: extraction reported why).
pub(super) struct Validated {
    pub problems: Vec<(String, String)>,
    pub config: Option<Config>,
}

/// `delay:orders` as `delay:{orders}`: the part after the last `:` as the tag.
pub(super) fn suggested_tag(key: &str) -> String {
    match key.rsplit_once(':') {
        Some((head, tail)) if !tail.is_empty() => format!("{head}:{{{tail}}}"),
        _ => format!("{{{key}}}"),
    }
}

/// Checks everything serde cannot, and makes each section its validated type.
pub(super) fn validate(parsed: Parsed) -> Validated {
    let mut problems = Vec::new();
    if parsed.unparsable {
        return Validated {
            problems,
            config: None,
        };
    }
    let mut push = |key: String, message: String| problems.push((key, message));
    let redis = if parsed.broken_redis {
        None
    } else {
        keep(Redis::validate(parsed.redis.clone()), &mut push)
    };
    let mut sinks = BTreeMap::new();
    for (name, settings) in &parsed.sinks {
        if let Some(sink) = keep(Sink::validate(name, settings.clone()), &mut push) {
            sinks.insert(name.clone(), sink);
        }
    }
    service::service_problems(&parsed, &mut push);
    let triggers = triggers::triggers(&parsed, &mut push);
    let config = match (redis, triggers) {
        (Some(redis), Some(triggers)) if problems.is_empty() => Some(Config {
            redis,
            metrics: parsed.metrics,
            admin: parsed.admin,
            log: parsed.log,
            shutdown: parsed.shutdown,
            sinks,
            triggers,
        }),
        _ => None,
    };
    Validated { problems, config }
}

/// The validated section, or `None` with its problems pushed.
fn keep<T>(result: Result<T, Invalid>, push: &mut impl FnMut(String, String)) -> Option<T> {
    match result {
        Ok(valid) => Some(valid),
        Err(Invalid(problems)) => {
            for (key, why) in problems {
                push(key, why);
            }
            None
        }
    }
}

/// Where the trigger written as `triggers[i]` sits in the parsed list.
fn pos(index: &[usize], i: usize) -> usize {
    index.iter().position(|&j| j == i).unwrap_or(0)
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
