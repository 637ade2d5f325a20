//! What the bridge needs of the Redis engine it runs on, read from every server: which engine and version, that its scripts load and run, a `maxmemory-policy` that keeps queued messages, and keyspace notifications.
//!
//! [`inspect`] only reads (and loads the bridge's scripts, which changes nothing): the
//! daemon runs it at start, `check --connect` prints what it found.

use std::collections::HashMap;

use crate::config::RedisConfig;
use crate::redis::checks::{config_get, flags_suffice};
use crate::redis::conn::Conn;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Said for the record: the engine and its version, notifications on.
    Info,
    /// The bridge runs, with a fallback or a risk it names.
    Warning,
    /// The bridge cannot keep its promise here: it refuses to start.
    Error,
}

/// One thing [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// What was found, and what to do about it.
    pub message: String,
}

impl Finding {
    fn new(severity: Severity, message: impl Into<String>) -> Self {
        Self {
            severity,
            message: message.into(),
        }
    }
}

/// The bridge refuses this engine: the [`Severity::Error`] findings, each on its own.
#[derive(Debug)]
pub struct EngineRefused(pub Vec<String>);

impl std::fmt::Display for EngineRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "this Redis cannot run the bridge: {}", self.0.join("; "))
    }
}

impl std::error::Error for EngineRefused {}

/// The engine's name and version, from `INFO server`: Valkey says `server_name:valkey` and
/// `valkey_version`; Dragonfly `dragonfly_version`; Redis (and KeyDB) `redis_version`.
pub fn engine_of(info: &str) -> String {
    let fields = info_fields(info);
    let get = |k: &str| fields.get(k).map(String::as_str);
    if let Some(v) = get("valkey_version") {
        return format!("Valkey {v}");
    }
    if let Some(v) = get("dragonfly_version") {
        return format!("Dragonfly {v}");
    }
    let name = match get("server_name") {
        Some("valkey") => "Valkey",
        Some("keydb") => "KeyDB",
        _ => "Redis",
    };
    format!(
        "{name} {}",
        get("redis_version").unwrap_or("(version unknown)")
    )
}

/// The `field:value` lines of an `INFO` reply.
fn info_fields(info: &str) -> HashMap<String, String> {
    info.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// What a `maxmemory-policy` means for queued messages.
pub fn policy_finding(node: &str, policy: &str, require: bool) -> Option<Finding> {
    if policy == "noeviction" {
        return None;
    }
    if policy.starts_with("volatile-") {
        return Some(Finding::new(
            Severity::Warning,
            format!(
                "{node}: maxmemory-policy {policy} evicts only keys with a time to live; the \
                 bridge sets none on its keys, so queued messages stay unless something gives \
                 their keys one (noeviction is safer)"
            ),
        ));
    }
    let message = format!(
        "{node}: maxmemory-policy {policy} may evict queued messages (lose them) under memory \
         pressure; set it to noeviction"
    );
    Some(if require {
        Finding::new(
            Severity::Error,
            format!("{message}, or set [redis] require_noeviction = false to run anyway"),
        )
    } else {
        Finding::new(Severity::Warning, message)
    })
}

/// Reads every server (every node of a cluster): engine and version, scripts, eviction
/// policy, and with `notify` keyspace notifications (the daemon checks those itself, turning
/// them on where allowed). Errors are reasons to refuse to start.
pub async fn inspect(conn: &Conn, redis: &RedisConfig, notify: bool) -> Vec<Finding> {
    let mut found = Vec::new();
    let infos = each_text(conn, &["INFO", "server"]).await;
    for (node, info) in &infos {
        match info {
            Ok(info) => found.push(Finding::new(
                Severity::Info,
                format!("{node}: {}", engine_of(info)),
            )),
            Err(e) => found.push(Finding::new(
                Severity::Warning,
                format!("{node}: cannot read INFO server: {e}"),
            )),
        }
    }
    found.extend(scripts(conn).await);
    found.extend(eviction(conn, redis.require_noeviction).await);
    if notify {
        found.extend(notifications(conn, redis.enable_keyspace_events).await);
    }
    found
}

/// `check --connect`'s Redis part: connects as the daemon would and inspects every server,
/// notifications included; an unreachable Redis is an error finding.
pub async fn connect_check(config: &crate::config::Config) -> Vec<Finding> {
    let endpoint = match crate::redis::conn::Endpoint::new(&config.redis) {
        Ok(endpoint) => std::sync::Arc::new(endpoint),
        Err(e) => return vec![Finding::new(Severity::Error, format!("redis: {e:#}"))],
    };
    match endpoint.connect().await {
        Ok(conn) => inspect(&conn, config.redis.settings(), true).await,
        Err(e) => vec![Finding::new(
            Severity::Error,
            format!("{endpoint}: not reached: {e}"),
        )],
    }
}

/// Every server's reply to `args` as text, or why it did not answer.
async fn each_text(conn: &Conn, args: &[&str]) -> Vec<(String, Result<String, String>)> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    conn.each_node_as(cmd).await
}

/// Each of the bridge's scripts loads (`SCRIPT LOAD`: it compiles here), and a loaded script
/// runs by its SHA1 (`EVALSHA`): a server's refusal on any server is a reason to refuse to
/// start; a connection that broke meanwhile is only a warning (it says nothing of the engine).
async fn scripts(conn: &Conn) -> Vec<Finding> {
    let mut failed: Vec<(Severity, String)> = Vec::new();
    for text in crate::redis::scripts::all_texts() {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(text);
        failed.extend(each_failure(conn, cmd, "SCRIPT LOAD").await);
    }
    let probe = redis::Script::new("return 1");
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg("return 1");
    failed.extend(each_failure(conn, load, "SCRIPT LOAD").await);
    let mut run = redis::cmd("EVALSHA");
    run.arg(probe.get_hash()).arg(0);
    failed.extend(each_failure(conn, run, "EVALSHA").await);
    failed.sort_by(|a, b| a.1.cmp(&b.1));
    failed.dedup();
    failed
        .into_iter()
        .map(|(severity, f)| match severity {
            Severity::Error => Finding::new(
                severity,
                format!("{f}: the bridge runs every change to a queue as a Lua script"),
            ),
            _ => Finding::new(severity, format!("{f}: the scripts could not be checked")),
        })
        .collect()
}

/// The servers on which `cmd` failed, each with the error: a refusal of the command or the
/// script (`ERR`: unknown command, a compile error; `NOPERM`) is [`Severity::Error`]; anything
/// else (a broken connection, `LOADING`, `CLUSTERDOWN`, ...) says nothing of the engine and
/// is [`Severity::Warning`].
async fn each_failure(conn: &Conn, cmd: redis::Cmd, what: &str) -> Vec<(Severity, String)> {
    let judged = |node: &str, e: redis::RedisError| {
        let severity = match e.code() {
            Some("ERR" | "NOPERM") => Severity::Error,
            _ => Severity::Warning,
        };
        (severity, format!("{node}: {what} failed: {e}"))
    };
    match conn.each_node(cmd).await {
        // A server's error may come back as an error or as an error value.
        Ok(replies) => replies
            .into_iter()
            .filter_map(|(node, reply)| match reply {
                Err(e) => Some(judged(&node, e)),
                Ok(redis::Value::ServerError(e)) => Some(judged(&node, e.into())),
                Ok(_) => None,
            })
            .collect(),
        Err(e) => vec![(
            Severity::Warning,
            format!("{}: {what} failed: {e}", conn.endpoint()),
        )],
    }
}

/// `maxmemory-policy` of every server: from `CONFIG GET`, or from `INFO memory` where
/// `CONFIG` is renamed or forbidden (managed services).
async fn eviction(conn: &Conn, require: bool) -> Vec<Finding> {
    let from_info: HashMap<String, Result<String, String>> = each_text(conn, &["INFO", "memory"])
        .await
        .into_iter()
        .collect();
    let mut found = Vec::new();
    for (node, policy) in config_get(conn, "maxmemory-policy").await {
        let policy = policy.or_else(|config_error| {
            match from_info
                .get(&node)
                .cloned()
                .unwrap_or_else(|| Err(String::new()))
            {
                Ok(info) => info_fields(&info)
                    .remove("maxmemory_policy")
                    .ok_or(config_error),
                Err(_) => Err(config_error),
            }
        });
        match policy {
            Ok(policy) => found.extend(policy_finding(&node, &policy, require)),
            Err(e) => found.push(Finding::new(
                Severity::Warning,
                format!("{node}: cannot read maxmemory-policy ({e}); make sure it is noeviction"),
            )),
        }
    }
    found
}

/// What idle workers do without keyspace notifications.
pub const FALLBACK: &str = "idle workers fall back to the queue head's timer and guard_interval: \
                            a message added earlier than the head may wait up to guard_interval";

/// Logs each finding at its level; the refusal if any is an error.
pub fn log_and_judge(found: &[Finding]) -> Result<(), EngineRefused> {
    let mut refused = Vec::new();
    for f in found {
        match f.severity {
            Severity::Info => tracing::info!("redis: {}", f.message),
            Severity::Warning => tracing::warn!("redis: {}", f.message),
            Severity::Error => refused.push(f.message.clone()),
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(EngineRefused(refused))
    }
}

/// Keyspace notifications of every server: on, off but the bridge may turn them on, or off
/// for good (then idle workers wake on the queue head's timer and every guard interval).
async fn notifications(conn: &Conn, enable: bool) -> Vec<Finding> {
    let fallback = FALLBACK;
    config_get(conn, "notify-keyspace-events")
        .await
        .into_iter()
        .map(|(node, flags)| match flags {
            Ok(flags) if flags_suffice(&flags) => Finding::new(
                Severity::Info,
                format!("{node}: keyspace notifications on (notify-keyspace-events {flags})"),
            ),
            Ok(flags) if enable => Finding::new(
                Severity::Info,
                format!(
                    "{node}: keyspace notifications off (notify-keyspace-events `{flags}`); \
                     enable_keyspace_events turns them on with CONFIG SET"
                ),
            ),
            Ok(flags) => Finding::new(
                Severity::Warning,
                format!(
                    "{node}: keyspace notifications off (notify-keyspace-events `{flags}`): \
                     {fallback}; set [redis] enable_keyspace_events = true or \
                     notify-keyspace-events Kz"
                ),
            ),
            Err(e) => Finding::new(
                Severity::Warning,
                format!(
                    "{node}: cannot read notify-keyspace-events ({e}): {fallback}; turn on Kz \
                     in the server's own configuration"
                ),
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_are_told_apart() {
        assert_eq!(
            engine_of("# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n"),
            "Redis 7.0.15"
        );
        assert_eq!(
            engine_of("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n"),
            "Valkey 9.1.2"
        );
        assert_eq!(
            engine_of("redis_version:7.4.0\r\ndragonfly_version:df-v1.25.0\r\n"),
            "Dragonfly df-v1.25.0"
        );
        assert_eq!(engine_of(""), "Redis (version unknown)");
    }

    #[test]
    fn only_evicting_policies_are_refused() {
        assert_eq!(policy_finding("n", "noeviction", true), None);
        let volatile = policy_finding("n", "volatile-lru", true).unwrap();
        assert_eq!(volatile.severity, Severity::Warning);
        let all = policy_finding("n", "allkeys-lru", true).unwrap();
        assert_eq!(all.severity, Severity::Error);
        assert!(all.message.contains("allkeys-lru"));
        let lenient = policy_finding("n", "allkeys-lru", false).unwrap();
        assert_eq!(lenient.severity, Severity::Warning);
    }
}
