//! Cron expressions read in an IANA time zone: croner over chrono-tz, whose time-zone data is
//! built into the binary. Which library, by test: the DST cases in `tests.rs`.

#[cfg(test)]
mod tests;

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

/// The IANA time-zone database release built into the binary.
pub(crate) fn tz_version() -> &'static str {
    chrono_tz::IANA_TZDB_VERSION
}

/// The time zone named `name` (IANA, e.g. `Europe/Berlin`, or `UTC`).
pub(crate) fn zone(name: &str) -> Result<Tz, String> {
    Tz::from_str(name).map_err(|_| {
        format!("`{name}` is not an IANA time zone (e.g. \"UTC\", \"Europe/Berlin\", \"America/New_York\")")
    })
}

/// A parsed cron expression and the time zone its fields are read in.
#[derive(Debug, Clone)]
pub(crate) struct Cron {
    cron: croner::Cron,
    tz: Tz,
}

impl Cron {
    /// Parses `expr` (5 fields from minutes or 6 with seconds, or a `@` nickname) for zone `tz`.
    pub(crate) fn parse(expr: &str, tz: &str) -> Result<Self, String> {
        let tz = zone(tz)?;
        let cron = croner::Cron::from_str(expr.trim())
            .map_err(|e| format!("`{expr}` is not a cron expression: {e}"))?;
        Ok(Self { cron, tz })
    }

    /// The first tick strictly after `ms` (epoch ms), epoch ms; `None` when there is none.
    pub(crate) fn next_after(&self, ms: i64) -> Option<i64> {
        let at: DateTime<Utc> = Utc.timestamp_millis_opt(ms).single()?;
        let local = at.with_timezone(&self.tz);
        let next = self.cron.find_next_occurrence(&local, false).ok()?;
        Some(next.timestamp_millis())
    }
}

impl Cron {
    /// The last tick strictly before `ms` (epoch ms), epoch ms; `None` when there is none.
    pub(crate) fn prev_before(&self, ms: i64) -> Option<i64> {
        let at: DateTime<Utc> = Utc.timestamp_millis_opt(ms).single()?;
        let local = at.with_timezone(&self.tz);
        let prev = self.cron.find_previous_occurrence(&local, false).ok()?;
        Some(prev.timestamp_millis())
    }
}

/// The local clock, epoch ms.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
