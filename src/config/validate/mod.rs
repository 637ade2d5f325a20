//! Semantic checks that serde cannot express: ranges, references and cross-field rules, one
//! file per section (`redis`, `service`, `sinks`, `triggers`), every problem with its key.

mod redis;
mod service;
mod sinks;
mod triggers;

use std::time::Duration;

use super::route::Destination;
pub(super) use super::rules::{too_long, valid_name};
use super::Config;

/// Largest claim batch: bounds how long one claim script may block Redis.
pub(super) const MAX_BATCH: usize = 10_000;
/// Most shards per trigger.
pub const MAX_SHARDS: u32 = 1024;
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

/// What extraction produced: a config whose broken parts hold defaults, and what was broken.
pub(super) struct Parsed {
    /// Every section but the triggers (`config.triggers` stays empty until they are validated).
    pub config: Config,
    /// The `[[triggers]]` entries that parsed, as written.
    pub triggers: Vec<super::TriggerConfig>,
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

/// Checks everything serde cannot and resolves each trigger's destination.
pub(super) fn validate(parsed: &Parsed) -> Validated {
    let mut problems = Vec::new();
    if parsed.unparsable {
        return Validated {
            problems,
            destinations: Vec::new(),
            dead_letters: Vec::new(),
            tls_clients: Vec::new(),
        };
    }
    let config = &parsed.config;
    let mut push = |key: String, message: String| problems.push((key, message));
    redis::redis_problems(parsed, &mut push);
    service::service_problems(config, &mut push);
    sinks::sink_problems(config, &mut push);
    let cluster = config.redis.mode == super::RedisMode::Cluster;
    let (destinations, dead_letters) = triggers::trigger_problems(parsed, cluster, &mut push);
    let (tls_problems, tls_clients) = super::tls::problems(config, parsed.broken_redis);
    for (key, why) in tls_problems {
        push(key, why);
    }
    Validated {
        problems,
        destinations,
        dead_letters,
        tls_clients,
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
