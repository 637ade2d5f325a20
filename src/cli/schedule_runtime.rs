//! `delay-bridge schedule add|list|remove`: a trigger's schedules added at run time, stored in
//! Redis beside its keys and run by every bridge serving the trigger, and the list of all of
//! its schedules with their source, last and next fire.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;

use super::bytes::ByteForms;
use super::reach::{connect, queue_for, trigger};
use super::text::{fire_text, rfc3339, say_json};
use super::ConfigArg;
use crate::config::{Config, Misfire, ScheduleConfig};
use crate::schedule::stored::{self, ChangeError};

/// Exit code for a schedule refused (bad field, name taken, none of that name): EX_DATAERR.
const EXIT_REFUSED: i32 = 65;

/// `schedule add`: the fields of a `[[triggers.schedules]]` table.
#[derive(Debug, Args)]
pub struct AddArgs {
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Trigger whose schedule it is.
    #[arg(long, short)]
    trigger: String,
    /// Unique within the trigger, config and run-time schedules together (`[A-Za-z0-9_.-]`).
    #[arg(long)]
    name: String,
    /// 6 fields with seconds, or 5 from minutes (see `schedule next`).
    #[arg(long)]
    cron: String,
    /// IANA time zone the fields are read in.
    #[arg(long, default_value = "UTC")]
    timezone: String,
    /// The message each tick sends (text); `-` reads it from standard input.
    #[arg(long, required_unless_present = "file", allow_hyphen_values = true)]
    body: Option<OsString>,
    #[command(flatten)]
    bytes: ByteForms,
    /// What a missed tick becomes: skip, once or all.
    #[arg(long, value_parser = misfire, default_value = "skip")]
    misfire: Misfire,
    /// A tick is missed when no bridge could fire it within this of its time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
    misfire_grace: Duration,
    /// With `--misfire all`: the most missed ticks fired after a gap.
    #[arg(long, default_value_t = 100)]
    catch_up_limit: u32,
}

fn misfire(text: &str) -> Result<Misfire, String> {
    serde_json::from_value(serde_json::Value::String(text.to_string()))
        .map_err(|_| format!("`{text}` is not one of skip, once, all"))
}

/// Says why a change was refused (each bad field as its option) and returns its exit code.
fn refused(e: ChangeError) -> anyhow::Result<i32> {
    match e {
        ChangeError::Invalid(problems) => {
            for (field, why) in problems {
                eprintln!("error: --{}: {why}", field.replace('_', "-"));
            }
        }
        ChangeError::Conflict(why) | ChangeError::Missing(why) => eprintln!("error: {why}"),
        ChangeError::Store(e) => return Err(e.into()),
    }
    Ok(EXIT_REFUSED)
}

/// `schedule add`.
pub(super) async fn add(config: Config, a: AddArgs) -> anyhow::Result<i32> {
    let body = a.bytes.value(a.body.as_ref())?;
    let body = String::from_utf8(body).map_err(|_| {
        anyhow::anyhow!("the body must be UTF-8 text, as in a config file's `body`")
    })?;
    let t = trigger(&config, &a.trigger)?;
    let s = ScheduleConfig {
        name: a.name,
        cron: a.cron,
        timezone: a.timezone,
        body,
        misfire: a.misfire,
        misfire_grace: a.misfire_grace,
        catch_up_limit: a.catch_up_limit,
    };
    let queue = queue_for(&config, connect(&config).await?, t.name())?;
    if let Err(e) = stored::add(&queue.shards()[0], t, &s).await {
        return refused(e);
    }
    let next = crate::cron::Cron::parse(&s.cron, &s.timezone)
        .ok()
        .and_then(|c| c.next_after(crate::cron::now_ms()))
        .map_or_else(|| "none".to_string(), |ms| rfc3339(ms, None));
    say!(
        "added schedule {} to trigger {} (first fire {next})",
        s.name,
        t.name()
    );
    Ok(0)
}

/// `schedule remove`.
pub(super) async fn remove(
    config: Config,
    trigger_name: String,
    name: String,
) -> anyhow::Result<i32> {
    let t = trigger(&config, &trigger_name)?;
    let queue = queue_for(&config, connect(&config).await?, t.name())?;
    if let Err(e) = stored::remove(&queue.shards()[0], t, &name).await {
        return refused(e);
    }
    say!(
        "removed schedule {name} from trigger {} (a tick already enqueued still fires)",
        t.name()
    );
    Ok(0)
}

/// `schedule list`.
pub(super) async fn list(config: Config, trigger_name: String, json: bool) -> anyhow::Result<i32> {
    let t = trigger(&config, &trigger_name)?;
    let queue = queue_for(&config, connect(&config).await?, t.name())?;
    let rows = stored::list(&queue.shards()[0], t).await?;
    if json {
        return say_json(&rows);
    }
    say!("NAME\tSOURCE\tCRON\tTIMEZONE\tMISFIRE\tLAST FIRE\tNEXT FIRE");
    for r in &rows {
        let s = &r.schedule;
        say!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            s.name,
            r.source,
            s.cron,
            s.timezone,
            s.misfire.as_str(),
            fire_text(r.last_fire_ms),
            fire_text(r.next_fire_ms)
        );
    }
    Ok(0)
}
