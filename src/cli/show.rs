//! `show` and `in-flight`: one message found by what an operator holds (its member, its id
//! in hash mode, the id consumers were sent), and the messages in flight with their lease ends.

use std::ffi::OsString;
use std::time::Duration;

use super::bytes::ByteForms;
use super::operate::{config_arg, open, Target, Targeted};
use super::text::{due_number, listed, member_json, ms_text, pasteable, say_json};
use super::*;
use crate::redis::store::{Place, MAX_PAGE};

/// `show`: where one message is and what it holds.
#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    target: Target,
    /// The member (the id in hash payload mode), or the id consumers were sent (AMQP
    /// `message_id`, `x-delay-id`, `Idempotency-Key`); `-` reads it from standard input.
    #[arg(required_unless_present = "file", allow_hyphen_values = true)]
    member: Option<OsString>,
    #[command(flatten)]
    bytes: ByteForms,
    /// Print JSON (a member that is not UTF-8 as `member_b64`).
    #[arg(long)]
    json: bool,
}

/// `in-flight`: the messages claimed and not yet confirmed, by lease end.
#[derive(Debug, Args)]
pub struct InFlightArgs {
    #[command(flatten)]
    target: Target,
    /// At most this many, earliest lease end first.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(super) async fn show(config: Config, a: ShowArgs) -> anyhow::Result<i32> {
    let text = a.bytes.value(a.member.as_ref())?;
    let queue = open(&a.target, &config).await?;
    let Some(hit) = queue.lookup(&text).await? else {
        say!(
            "{} is no member and no consumer id of a message scheduled, in flight or dead on {}",
            pasteable(&text),
            queue.place()
        );
        return Ok(1);
    };
    let found = &hit.found;
    let consumer_id = queue.consumer_id(&hit.member, found.body.as_deref());
    if a.json {
        return say_json(&show_json(&hit, &consumer_id));
    }
    say!("member: {}", pasteable(&hit.member));
    if std::str::from_utf8(&hit.member).is_err() {
        say!(
            "member (base64, for --base64): {}",
            super::bytes::encode_base64(&hit.member)
        );
    }
    say!("consumer id: {consumer_id} (AMQP message_id, x-delay-id, Idempotency-Key)");
    for place in &found.places {
        match place {
            Place::Scheduled { due_ms, attempts } => say!(
                "scheduled: due {} ({}), {attempts} failed attempts",
                ms_text(*due_ms),
                due_number(*due_ms)
            ),
            Place::InFlight { lease_deadline_ms } => say!(
                "in flight: leased until {} ({lease_deadline_ms})",
                ms_text(*lease_deadline_ms)
            ),
            Place::Dead { at_ms, reason } => say!(
                "dead since {} ({at_ms}): {}",
                ms_text(*at_ms),
                reason.as_deref().unwrap_or("no reason recorded")
            ),
        }
    }
    if queue.hash_bodies() {
        match (&found.body, found.body_size) {
            (Some(body), _) => say!("body ({} B): {}", body.len(), pasteable(body)),
            (None, Some(size)) => say!(
                "body ({size} B): over the {} B that show reads; read it with HGET",
                crate::redis::store::SHOW_BODY_MAX
            ),
            (None, None) => say!("no body"),
        }
    }
    Ok(0)
}

/// What `show --json` prints: the member (base64 when not UTF-8), the consumer id, each
/// place, and the body in hash mode (base64 when not UTF-8).
fn show_json(hit: &crate::redis::store::Lookup, consumer_id: &str) -> serde_json::Value {
    let (field, member) = member_json(&hit.member);
    let mut v = serde_json::json!({
        field: member,
        "found_by": hit.by,
        "consumer_id": consumer_id,
        "places": hit.found.places,
        "body_size": hit.found.body_size,
    });
    if let Some(body) = &hit.found.body {
        let (field, body) = member_json(body);
        v[if field == "member" {
            "body"
        } else {
            "body_b64"
        }] = body;
    }
    v
}

pub(super) async fn in_flight(config: Config, a: InFlightArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        (1..=MAX_PAGE).contains(&a.limit),
        "--limit must be between 1 and {MAX_PAGE}"
    );
    let queue = open(&a.target, &config).await?;
    let now = queue.now_ms().await?;
    let items = queue.list_inflight(a.limit).await?;
    if a.json {
        let items: Vec<serde_json::Value> = items
            .iter()
            .map(|(m, lease)| {
                let (field, member) = member_json(m);
                serde_json::json!({
                    field: member,
                    "lease_deadline_ms": lease,
                    "lease_deadline": ms_text(*lease),
                    "consumer_id": queue.consumer_id(m, None),
                })
            })
            .collect();
        return say_json(&serde_json::json!({ "items": items }));
    }
    say!(
        "{:<24} {:>12}  {:<16}  MEMBER",
        "LEASE_ENDS",
        "IN",
        "CONSUMER_ID"
    );
    for (m, lease) in &items {
        let left = lease.saturating_sub(now);
        let left = if left >= 0 {
            humantime::format_duration(Duration::from_millis(left as u64 / 1000 * 1000)).to_string()
        } else {
            "expired".to_string()
        };
        say!(
            "{:<24} {:>12}  {:<16}  {}",
            ms_text(*lease),
            left,
            queue.consumer_id(m, None),
            listed(m)
        );
    }
    if items.is_empty() {
        say!("(nothing in flight on {})", queue.place());
    }
    Ok(0)
}

config_arg!(ShowArgs, InFlightArgs);
