//! The operator's commands on what a trigger holds: browse, show, forecast, promote, reschedule, purge.

use std::time::Duration;

use std::ffi::OsString;

use super::bytes::ByteForms;
use super::reach::{connect, queue_for};
use super::text::{due_number, listed, member_json, ms_text, say_json};
use super::when::{self, When};
use super::*;
use crate::redis::queue::Queue;
use crate::redis::store::{Cursor, Purge, MAX_BUCKETS, MAX_PAGE};

/// `--config FILE -t TRIGGER`, shared by every command here.
#[derive(Debug, Args)]
pub(super) struct Target {
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Trigger whose queue to work on.
    #[arg(long, short)]
    pub(super) trigger: String,
}

/// `browse`: scheduled messages by due time, a page at a time.
#[derive(Debug, Args)]
pub struct BrowseArgs {
    #[command(flatten)]
    target: Target,
    /// Earliest due time: RFC 3339, epoch ms, `now`, `-1h` (default: the earliest).
    #[arg(long, value_parser = when::parse, allow_hyphen_values = true)]
    from: Option<When>,
    /// Latest due time: RFC 3339, epoch ms, `now`, `+1h` (default: the latest).
    #[arg(long, value_parser = when::parse, allow_hyphen_values = true)]
    to: Option<When>,
    /// Entries per page (at most 1000).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Start after this cursor, printed at the end of the previous page.
    #[arg(long)]
    after: Option<Cursor>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `forecast`: how many messages fall due per bucket from now on.
#[derive(Debug, Args)]
pub struct ForecastArgs {
    #[command(flatten)]
    target: Target,
    /// Width of a bucket.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
    bucket: Duration,
    /// Number of buckets (at most 1440).
    #[arg(long, default_value_t = 60)]
    buckets: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `promote`: scheduled messages due now.
#[derive(Debug, Args)]
pub struct PromoteArgs {
    #[command(flatten)]
    target: Target,
    /// Members (ids in hash payload mode); `-` reads one from standard input.
    #[arg(required_unless_present = "file")]
    members: Vec<OsString>,
    #[command(flatten)]
    bytes: ByteForms,
}

/// `reschedule`: new due times for scheduled messages.
#[derive(Debug, Args)]
pub struct RescheduleArgs {
    #[command(flatten)]
    target: Target,
    /// New due time: RFC 3339, epoch ms, `now`, `+5m`, `-inf` (due at once, ahead of
    /// everything) or `+inf`/`park` (parked until rescheduled).
    #[arg(long, conflicts_with = "delay", value_parser = when::parse, allow_hyphen_values = true)]
    at: Option<When>,
    /// New due time from now, e.g. `5m`.
    #[arg(long, value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// Members (ids in hash payload mode); `-` reads one from standard input.
    #[arg(required_unless_present = "file")]
    members: Vec<OsString>,
    #[command(flatten)]
    bytes: ByteForms,
}

/// `purge`: delete scheduled messages or dead letters, counted.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    target: Target,
    /// Delete scheduled messages (all, or those due within --from/--to).
    #[arg(long, conflicts_with = "dead", required_unless_present = "dead")]
    scheduled: bool,
    /// Delete dead letters: every one, or with --reason those dead-lettered for it.
    #[arg(long)]
    dead: bool,
    /// With --dead: only the dead letters whose reason is this (`nack`, `too_large`, ...).
    #[arg(long, requires = "dead")]
    reason: Option<String>,
    /// With --scheduled: earliest due time (RFC 3339, epoch ms, `now`, `-1h`).
    #[arg(long, requires = "scheduled", value_parser = when::parse, allow_hyphen_values = true)]
    from: Option<When>,
    /// With --scheduled: latest due time (RFC 3339, epoch ms, `now`, `+1h`).
    #[arg(long, requires = "scheduled", value_parser = when::parse, allow_hyphen_values = true)]
    to: Option<When>,
    /// Confirms the deletion: without it, only the count is printed.
    #[arg(long)]
    yes: bool,
}

/// `from` and `to` in epoch ms, on the Redis clock when either is relative.
async fn range(
    queue: &Queue,
    from: Option<When>,
    to: Option<When>,
) -> anyhow::Result<(Option<i64>, Option<i64>)> {
    let now = if from.into_iter().chain(to).any(When::is_relative) {
        queue.now_ms().await?
    } else {
        0
    };
    Ok((from.map(|w| w.resolve(now)), to.map(|w| w.resolve(now))))
}

pub(super) async fn open(target: &Target, config: &Config) -> anyhow::Result<Queue> {
    let conn = connect(config).await?;
    queue_for(config, conn, &target.trigger)
}

/// A listed entry's body when the list read all of it (hash payload mode).
fn whole_body(e: &crate::redis::store::ScheduledEntry) -> Option<&[u8]> {
    (e.body_size == Some(e.body_preview.len() as u64)).then_some(e.body_preview.as_slice())
}

pub(super) async fn browse(config: Config, a: BrowseArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        (1..=MAX_PAGE).contains(&a.limit),
        "--limit must be between 1 and {MAX_PAGE}"
    );
    let queue = open(&a.target, &config).await?;
    let (from, to) = range(&queue, a.from, a.to).await?;
    let page = queue.browse(from, to, a.after.as_ref(), a.limit).await?;
    if a.json {
        let items: Vec<serde_json::Value> = page
            .items
            .iter()
            .map(|e| {
                let (field, member) = member_json(&e.member);
                let mut v = serde_json::json!({
                    field: member,
                    "due_ms": e.due_ms,
                    "due": ms_text(e.due_ms),
                    "attempts": e.attempts,
                    "consumer_id": queue.consumer_id(&e.member, whole_body(e)),
                });
                if queue.hash_bodies() {
                    v["body_size"] = e.body_size.into();
                    v["body_preview"] = String::from_utf8_lossy(&e.body_preview).into();
                }
                v
            })
            .collect();
        let v = serde_json::json!({
            "items": items,
            "next": page.next.as_ref().map(ToString::to_string),
        });
        return say_json(&v);
    }
    say!("{:<24} {:>14} {:>8}  MEMBER", "DUE", "DUE_MS", "ATTEMPTS");
    for e in &page.items {
        let body = match e.body_size {
            Some(size) if queue.hash_bodies() => format!(
                "  body {size} B: {}",
                String::from_utf8_lossy(&e.body_preview).escape_debug()
            ),
            None if queue.hash_bodies() => "  (no body)".to_string(),
            _ => String::new(),
        };
        say!(
            "{:<24} {:>14} {:>8}  {}{body}",
            ms_text(e.due_ms),
            due_number(e.due_ms),
            e.attempts,
            listed(&e.member)
        );
    }
    match page.next {
        Some(next) => say!("next page: --after {next}"),
        None => say!("(end)"),
    }
    Ok(0)
}

pub(super) async fn forecast(config: Config, a: ForecastArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        (1..=MAX_BUCKETS).contains(&a.buckets),
        "--buckets must be between 1 and {MAX_BUCKETS}"
    );
    anyhow::ensure!(
        a.bucket >= Duration::from_millis(1),
        "--bucket must be at least 1ms"
    );
    let queue = open(&a.target, &config).await?;
    let f = queue.forecast(a.bucket, a.buckets).await?;
    if a.json {
        return say_json(&f);
    }
    say!("{:<24} {:>10}", "FROM", "DUE");
    say!("{:<24} {:>10}", "overdue", f.overdue);
    for (i, n) in f.buckets.iter().enumerate() {
        let from = f.now_ms + (f.bucket_ms * i as u64) as i64;
        say!("{:<24} {:>10}", ms_text(from), n);
    }
    say!("{:<24} {:>10}", "later", f.later);
    Ok(0)
}

pub(super) async fn promote(config: Config, a: PromoteArgs) -> anyhow::Result<i32> {
    let args = RescheduleArgs {
        target: a.target,
        at: None,
        delay: None,
        members: a.members,
        bytes: a.bytes,
    };
    reschedule(config, args, true).await
}

pub(super) async fn reschedule(
    config: Config,
    a: RescheduleArgs,
    promote: bool,
) -> anyhow::Result<i32> {
    let members = a.bytes.values(&a.members)?;
    let queue = open(&a.target, &config).await?;
    let due = match (a.at, a.delay, promote) {
        (_, _, true) => None,
        (Some(at), None, false) if !at.is_relative() => Some(at.resolve(0)),
        (Some(at), None, false) => Some(at.resolve(queue.now_ms().await?)),
        (None, Some(delay), false) => {
            let delay = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
            Some(queue.now_ms().await?.saturating_add(delay))
        }
        _ => anyhow::bail!("reschedule needs --at TIME or --delay DURATION"),
    };
    let changed = queue.reschedule(&members, due, promote).await?;
    let verb = if promote { "promoted" } else { "rescheduled" };
    say!(
        "{verb} {changed} of {} on {} (members not scheduled, or already due then, are left alone)",
        members.len(),
        queue.place()
    );
    Ok(if changed == members.len() as u64 {
        0
    } else {
        1
    })
}

pub(super) async fn purge(config: Config, a: PurgeArgs) -> anyhow::Result<i32> {
    let queue = open(&a.target, &config).await?;
    let what = match (&a.reason, a.dead) {
        (Some(reason), _) => format!("dead letters with reason `{reason}`"),
        (None, true) => "dead letters".to_string(),
        (None, false) => "scheduled messages".to_string(),
    };
    let trigger = &a.target.trigger;
    if let Some(reason) = &a.reason {
        let n = queue.purge_dead_reason(reason, !a.yes).await?;
        return Ok(purged(n, &what, trigger, a.yes));
    }
    let purge = if a.dead {
        Purge::Dead
    } else {
        let (from, to) = range(&queue, a.from, a.to).await?;
        Purge::Scheduled { from, to }
    };
    let n = match (purge, a.yes) {
        (_, true) => queue.purge(purge).await?,
        (Purge::Dead, false) => queue.stats().await?.dead,
        (Purge::Scheduled { from, to }, false) => queue.count_scheduled(from, to).await?,
    };
    Ok(purged(n, &what, trigger, a.yes))
}

/// Says what a purge deleted, or without `done` what it would delete; the exit code.
fn purged(n: u64, what: &str, trigger: &str, done: bool) -> i32 {
    if done {
        say!("deleted {n} {what} from trigger `{trigger}`");
        0
    } else {
        say!("would delete {n} {what} from trigger `{trigger}`: add --yes to delete them");
        1
    }
}

/// The arguments of a command on one trigger's queue.
pub(super) trait Targeted {
    /// The `--config` argument.
    fn config_arg(&self) -> &ConfigArg;
}

/// Implements [`Targeted`] for argument structs with a `target` field.
macro_rules! config_arg {
    ($($t:ty),*) => {$(
        impl Targeted for $t {
            fn config_arg(&self) -> &ConfigArg {
                &self.target.config
            }
        }
    )*};
}
pub(super) use config_arg;
config_arg!(
    BrowseArgs,
    ForecastArgs,
    PromoteArgs,
    RescheduleArgs,
    PurgeArgs
);
