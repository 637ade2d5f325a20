//! The schedules added at run time, as the schedule task sees them: read from Redis when a
//! keyspace notification says that the change counter moved (and every few minutes whatever
//! it says), checked as the config's are; a config schedule wins over a stored one of its name.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::config::{schedule_problems, ScheduleConfig};
use crate::redis::store::{Store, StoreError};

/// The field of a stored definition that says when it was added (epoch ms), beside the
/// fields of `[[triggers.schedules]]`.
pub(crate) const ADDED_MS: &str = "added_ms";

/// A stored definition as checked: the schedule and when it was added, or why it is left out.
pub(crate) fn parse(name: &str, json: &[u8]) -> Result<(ScheduleConfig, Option<i64>), String> {
    let bad = |e: serde_json::Error| format!("not a schedule definition: {e}");
    let mut v: serde_json::Value = serde_json::from_slice(json).map_err(bad)?;
    let added_ms = v
        .as_object_mut()
        .and_then(|o| o.remove(ADDED_MS))
        .and_then(|a| a.as_i64());
    let s: ScheduleConfig = serde_json::from_value(v).map_err(bad)?;
    if s.name != name {
        return Err(format!("stored under `{name}` but named `{}`", s.name));
    }
    if let Some((field, why)) = schedule_problems(&s).into_iter().next() {
        return Err(format!("{field}: {why}"));
    }
    Ok((s, added_ms))
}

/// The stored schedules to run beside `config` (those of the config): `None` when the
/// change counter has not moved since the last read (`seen`, kept across the task's runs;
/// unless `full`).
pub(super) async fn read(
    seen: &AtomicI64,
    trigger: &str,
    store: &Store,
    config: &[ScheduleConfig],
    full: bool,
) -> Result<Option<Vec<ScheduleConfig>>, StoreError> {
    let rev = store.schedule_rev().await?;
    let moved = seen.load(Ordering::Relaxed) != rev;
    if !moved && !full {
        return Ok(None);
    }
    let defs = store.schedule_defs().await?;
    seen.store(rev, Ordering::Relaxed);
    let mut out = Vec::with_capacity(defs.len());
    for (name, json) in defs {
        let why = match parse(&name, &json) {
            Ok(_) if config.iter().any(|c| c.name == name) => {
                "the config has a schedule of that name".to_string()
            }
            Ok((s, _)) => {
                out.push(s);
                continue;
            }
            Err(why) => why,
        };
        if moved {
            tracing::warn!(trigger, schedule = %name, reason = %why,
                "schedules: a stored schedule is left out");
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn stored_definitions_are_checked_as_the_config_is() {
        let json = br#"{"name":"n","cron":"* * * * * *","body":"b","added_ms":5}"#;
        let (s, added) = parse("n", json).unwrap();
        assert_eq!(
            (s.timezone.as_str(), s.catch_up_limit, added),
            ("UTC", 100, Some(5))
        );
        assert!(parse("m", json).unwrap_err().contains("stored under `m`"));
        let bad = br#"{"name":"n","cron":"61 * * * * *","body":"b"}"#;
        assert!(parse("n", bad).unwrap_err().starts_with("cron: "));
        let unknown = br#"{"name":"n","cron":"* * * * * *","body":"b","colour":"red"}"#;
        assert!(parse("n", unknown).is_err());
        assert!(parse("n", b"not json").is_err());
    }
}
