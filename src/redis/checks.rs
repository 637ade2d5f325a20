//! The settings the bridge needs of every Redis server (every node of a cluster): keyspace notifications and no eviction.

use crate::redis::conn::Conn;

/// Flags the bridge needs in `notify-keyspace-events`: keyspace channel (K), sorted-set events (z).
const NEEDED: [char; 2] = ['K', 'z'];

/// True when the flags deliver sorted-set events on the keyspace channel (`A` includes `z`).
pub fn flags_suffice(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('z') || flags.contains('A'))
}

/// The flags with what the bridge needs added, keeping the existing ones.
pub fn with_needed_flags(flags: &str) -> String {
    let mut out = flags.to_string();
    for c in NEEDED {
        if c == 'z' && flags.contains('A') {
            continue;
        }
        if !out.contains(c) {
            out.push(c);
        }
    }
    out
}

/// One setting of every server (every node of a cluster, replicas included): each node's
/// address and the value or why it could not be read.
pub async fn config_get(conn: &Conn, name: &str) -> Vec<(String, Result<String, String>)> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(name);
    let replies = conn.each_node_as::<(String, String)>(cmd).await;
    replies
        .into_iter()
        .map(|(node, reply)| (node, reply.map(|(_, value)| value)))
        .collect()
}

/// Checks `notify-keyspace-events` on every server, enabling it where allowed; returns whether
/// notifications will arrive from all of them.
pub async fn ensure_enabled(conn: &Conn, enable: bool) -> bool {
    let mut all = true;
    for (node, flags) in config_get(conn, "notify-keyspace-events").await {
        let flags = match flags {
            Ok(flags) => flags,
            Err(e) => {
                tracing::warn!(%node, error = %e, "cannot read notify-keyspace-events; idle workers will rely on guard_interval");
                all = false;
                continue;
            }
        };
        if flags_suffice(&flags) {
            continue;
        }
        if !enable {
            tracing::warn!(
                %node,
                current = %flags,
                "Redis keyspace notifications for sorted sets are off (notify-keyspace-events lacks Kz): \
                 messages added earlier than the queue head may wait up to guard_interval; \
                 set [redis] enable_keyspace_events = true or run CONFIG SET notify-keyspace-events Kz"
            );
            all = false;
            continue;
        }
        all &= enable_on(conn, &node, &with_needed_flags(&flags)).await;
    }
    all
}

/// What keeps notifications from arriving, one line per server (every node of a cluster):
/// flags that lack `Kz` while `enable` (`[redis] enable_keyspace_events`) is off, or that the
/// bridge may not set (`CONFIG SET` of the current flags, which changes nothing, is refused).
/// Nothing is changed.
pub async fn notification_problems(conn: &Conn, enable: bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (node, flags) in config_get(conn, "notify-keyspace-events").await {
        let flags = match flags {
            Ok(flags) if flags_suffice(&flags) => continue,
            Ok(flags) => flags,
            Err(e) => {
                problems.push(format!(
                    "redis {node}: cannot read notify-keyspace-events ({e}): allow CONFIG GET, \
                     or set notify-keyspace-events Kz on the server and check by hand"
                ));
                continue;
            }
        };
        if !enable {
            problems.push(format!(
                "redis {node}: keyspace notifications are off (notify-keyspace-events `{flags}` \
                 lacks Kz) and [redis] enable_keyspace_events is false: set it true, or run \
                 CONFIG SET notify-keyspace-events {}",
                with_needed_flags(&flags)
            ));
            continue;
        }
        let mut same = redis::cmd("CONFIG");
        same.arg("SET").arg("notify-keyspace-events").arg(&flags);
        let refused = match conn.set_on(&node, same).await {
            Ok(redis::Value::Okay) => continue,
            Ok(other) => format!("{other:?}"),
            Err(e) => e.to_string(),
        };
        problems.push(format!(
            "redis {node}: keyspace notifications are off (notify-keyspace-events `{flags}`) \
             and cannot be turned on (CONFIG SET refused: {refused}): set \
             notify-keyspace-events {} in the server's configuration",
            with_needed_flags(&flags)
        ));
    }
    problems
}

/// Sets `notify-keyspace-events` to `wanted` on `node` (or on the one server).
async fn enable_on(conn: &Conn, node: &str, wanted: &str) -> bool {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET").arg("notify-keyspace-events").arg(wanted);
    let set = match conn.set_on(node, cmd).await {
        Ok(redis::Value::Okay) => Ok(()),
        Ok(other) => Err(format!("unexpected reply {other:?}")),
        Err(e) => Err(e.to_string()),
    };
    match set {
        Ok(()) => {
            tracing::info!(%node, flags = %wanted, "enabled Redis keyspace notifications");
            true
        }
        Err(e) => {
            tracing::warn!(%node, error = %e, "could not enable keyspace notifications; idle workers will rely on guard_interval");
            false
        }
    }
}

/// Warns (or refuses to start) when Redis may evict queued messages under memory pressure:
/// asks every server (every node of a cluster).
pub async fn check_eviction_policy(conn: &Conn, require: bool) -> anyhow::Result<()> {
    let (mut evicting, mut unreadable) = (Vec::new(), Vec::new());
    for (node, reply) in config_get(conn, "maxmemory-policy").await {
        match reply {
            Ok(p) if p == "noeviction" => {}
            Ok(p) => evicting.push(format!("{node}: {p}")),
            Err(e) => unreadable.push(format!("{node}: {e}")),
        }
    }
    if !evicting.is_empty() {
        let list = evicting.join(", ");
        if require {
            anyhow::bail!(
                "Redis maxmemory-policy is not noeviction ({list}): queued messages may be evicted \
                 under memory pressure; set it to noeviction or turn off [redis] require_noeviction"
            );
        }
        tracing::warn!(policy = %list, "Redis maxmemory-policy is not noeviction: queued messages may be evicted (lost) under memory pressure");
    }
    if !unreadable.is_empty() {
        let list = unreadable.join(", ");
        if require {
            anyhow::bail!("cannot read maxmemory-policy to verify noeviction: {list}");
        }
        tracing::warn!(error = %list, "cannot read maxmemory-policy; make sure it is noeviction");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_added_not_replaced() {
        assert!(!flags_suffice(""));
        assert!(!flags_suffice("Ex"));
        assert!(flags_suffice("KA"));
        assert!(flags_suffice("Kz"));
        assert_eq!(with_needed_flags(""), "Kz");
        assert_eq!(with_needed_flags("Ex"), "ExKz");
        assert_eq!(with_needed_flags("EA"), "EAK");
    }
}
