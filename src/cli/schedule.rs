//! `delay-bridge schedule next`: a cron expression's next fire times, what `check` says of a
//! trigger's schedules, and the run-time schedule commands (`schedule_runtime`).

use clap::Subcommand;

use super::text::rfc3339;
use crate::config::{Config, Trigger};
use crate::cron::Cron;

/// `schedule` subcommands.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Print the next fire times of a cron expression in RFC 3339 (local time and UTC), to
    /// check an expression before deploying it.
    Next {
        /// The expression: 6 fields with seconds, or 5 from minutes.
        #[arg(long)]
        cron: String,
        /// IANA time zone the fields are read in.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Start after this time (RFC 3339; default: now).
        #[arg(long)]
        from: Option<String>,
        /// How many fire times.
        #[arg(long, default_value_t = 5)]
        count: usize,
    },
    /// Add a schedule to a trigger at run time: stored in Redis, run by every bridge serving
    /// the trigger from its next tick on (a name of the config's is refused).
    Add(super::schedule_runtime::AddArgs),
    /// List a trigger's schedules, the config's and those added at run time, with their last
    /// and next fire.
    List {
        #[command(flatten)]
        config: super::ConfigArg,
        /// Trigger to look at.
        #[arg(long, short)]
        trigger: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule added at run time (a tick already enqueued still fires).
    Remove {
        #[command(flatten)]
        config: super::ConfigArg,
        /// Trigger whose schedule it is.
        #[arg(long, short)]
        trigger: String,
        /// The schedule's name.
        #[arg(long)]
        name: String,
    },
}

/// Runs a `schedule` subcommand; returns the exit code.
pub(super) async fn schedule(command: ScheduleCommand) -> anyhow::Result<i32> {
    use super::schedule_runtime as runtime;
    match command {
        ScheduleCommand::Add(a) => {
            let config = a.config.clone();
            super::with_config(&config, |c| runtime::add(c, a)).await
        }
        ScheduleCommand::List {
            config,
            trigger,
            json,
        } => super::with_config(&config, |c| runtime::list(c, trigger, json)).await,
        ScheduleCommand::Remove {
            config,
            trigger,
            name,
        } => super::with_config(&config, |c| runtime::remove(c, trigger, name)).await,
        ScheduleCommand::Next {
            cron,
            timezone,
            from,
            count,
        } => {
            let lines =
                next_lines(&cron, &timezone, from.as_deref(), count).map_err(anyhow::Error::msg)?;
            for line in lines {
                say!("{line}");
            }
            Ok(0)
        }
    }
}

/// The next `count` fire times of `cron` in `timezone` after `from` (RFC 3339, default now),
/// each as local time and UTC.
pub(crate) fn next_lines(
    cron: &str,
    timezone: &str,
    from: Option<&str>,
    count: usize,
) -> Result<Vec<String>, String> {
    let parsed = Cron::parse(cron, timezone)?;
    let tz = crate::cron::zone(timezone)?;
    let mut at = match from {
        Some(text) => chrono::DateTime::parse_from_rfc3339(text)
            .map_err(|e| format!("--from `{text}` is not an RFC 3339 time: {e}"))?
            .timestamp_millis(),
        None => crate::cron::now_ms(),
    };
    let mut lines = Vec::with_capacity(count);
    for _ in 0..count {
        let Some(next) = parsed.next_after(at) else {
            break;
        };
        lines.push(format!(
            "{} ({})",
            rfc3339(next, Some(tz)),
            rfc3339(next, None)
        ));
        at = next;
    }
    Ok(lines)
}

/// What `check` says of a trigger's schedules: each with its next fire.
pub(super) fn schedule_lines(t: &Trigger) {
    for s in t.schedules() {
        let next = Cron::parse(&s.cron, &s.timezone)
            .ok()
            .and_then(|c| c.next_after(crate::cron::now_ms()))
            .map_or_else(|| "none".to_string(), |ms| rfc3339(ms, None));
        say!(
            "trigger {} schedule {}: cron=\"{}\" timezone={} misfire={} misfire_grace={} catch_up_limit={} next={next}",
            t.name(),
            s.name,
            s.cron,
            s.timezone,
            s.misfire.as_str(),
            humantime::format_duration(s.misfire_grace),
            s.catch_up_limit,
        );
    }
}

/// `check`'s line on the time-zone data, when some trigger has schedules.
pub(super) fn tzdata_line(config: &Config) {
    if config.triggers.iter().any(|t| !t.schedules().is_empty()) {
        say!(
            "time zones: IANA tzdb {} (built in)",
            crate::cron::tz_version()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::next_lines;

    #[test]
    fn next_prints_local_time_and_utc() {
        let lines = next_lines(
            "0 30 2 * * *",
            "Europe/Berlin",
            Some("2026-10-24T12:00:00Z"),
            2,
        )
        .unwrap();
        assert_eq!(
            lines,
            [
                "2026-10-25T02:30:00+02:00 (2026-10-25T00:30:00Z)",
                "2026-10-26T02:30:00+01:00 (2026-10-26T01:30:00Z)"
            ]
        );
        let spring = next_lines(
            "0 30 2 * * *",
            "Europe/Berlin",
            Some("2026-03-28T12:00:00Z"),
            1,
        );
        assert_eq!(
            spring.unwrap(),
            ["2026-03-29T03:00:00+02:00 (2026-03-29T01:00:00Z)"]
        );
        let ny = next_lines(
            "30 2 * * *",
            "America/New_York",
            Some("2026-03-07T12:00:00Z"),
            1,
        );
        assert_eq!(
            ny.unwrap(),
            ["2026-03-08T03:00:00-04:00 (2026-03-08T07:00:00Z)"]
        );
        let tokyo = next_lines("0 9 * * *", "Asia/Tokyo", Some("2026-10-24T12:00:00Z"), 1);
        assert_eq!(
            tokyo.unwrap(),
            ["2026-10-25T09:00:00+09:00 (2026-10-25T00:00:00Z)"]
        );
        assert!(next_lines("0 30 2 * * *", "Nowhere/City", None, 1).is_err());
        assert!(next_lines("0 30 2 * * *", "UTC", Some("yesterday"), 1).is_err());
    }
}
