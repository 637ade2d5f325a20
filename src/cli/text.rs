//! How the commands write members and times: pasteable back into another command, bounded,
//! infinite scores in words, and times in RFC 3339.

use std::time::Duration;

/// A member as the other commands take it back (`show`, `cancel`, `reschedule`): as it is
/// when it is text without control characters, else quoted for a shell as `$'...'` with
/// every other byte escaped (`\xff`, `\n`), which a shell turns back into the same bytes
/// (`--json` gives such a member in base64 for `--base64`).
pub(super) fn pasteable(member: &[u8]) -> String {
    match std::str::from_utf8(member) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => format!("$'{}'", member.escape_ascii()),
    }
}

/// A member in JSON: `"member"` when it is UTF-8, else `"member_b64"` (standard base64, for
/// `--base64`), so that nothing is lost.
pub(super) fn member_json(member: &[u8]) -> (&'static str, serde_json::Value) {
    match std::str::from_utf8(member) {
        Ok(text) => ("member", text.into()),
        Err(_) => ("member_b64", super::bytes::encode_base64(member).into()),
    }
}

/// Lateness of a message due at `due_ms` and seen at `now_ms`, in words for an infinite due
/// time (`now` for `-inf`, `parked` for `+inf`): never a huge number, never an overflow.
pub(super) fn late_text(now_ms: i64, due_ms: i64) -> String {
    match due_ms {
        i64::MIN => "now".to_string(),
        i64::MAX => "parked".to_string(),
        due => format!("{}ms", now_ms.saturating_sub(due)),
    }
}

/// A due time in epoch ms as a number, or `-inf` / `+inf` for the saturated infinite scores.
pub(super) fn due_number(ms: i64) -> String {
    match ms {
        i64::MIN => "-inf".to_string(),
        i64::MAX => "+inf".to_string(),
        ms => ms.to_string(),
    }
}

/// A member in a listing: [`pasteable`], or for a long one its start and its size (`show`
/// and `--json` give it whole), so that one large message does not flood the terminal.
pub(super) fn listed(member: &[u8]) -> String {
    const MOST: usize = 200;
    if member.len() <= MOST {
        return pasteable(member);
    }
    let start = match std::str::from_utf8(member) {
        Ok(_) => String::from_utf8_lossy(&member[..MOST])
            .escape_debug()
            .to_string(),
        Err(_) => member[..MOST].escape_ascii().to_string(),
    };
    format!("{start}... ({} B)", member.len())
}

/// An epoch-ms time as RFC 3339 UTC, and the saturated infinite scores in words.
pub(super) fn ms_text(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) if ms < 253_402_300_800_000 => {
            let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
            humantime::format_rfc3339_millis(at).to_string()
        }
        _ if ms == i64::MIN => "now (-inf)".to_string(),
        _ if ms == i64::MAX => "parked (+inf)".to_string(),
        _ => ms.to_string(),
    }
}

/// `ms` in RFC 3339, in `tz` or in UTC (`Z`).
pub(super) fn rfc3339(ms: i64, tz: Option<chrono_tz::Tz>) -> String {
    let Some(at) = chrono::DateTime::from_timestamp_millis(ms) else {
        return ms.to_string();
    };
    match tz {
        Some(tz) => at
            .with_timezone(&tz)
            .format("%Y-%m-%dT%H:%M:%S%:z")
            .to_string(),
        None => at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    }
}

/// A schedule's fire time in RFC 3339 UTC, `-` when there is none.
pub(super) fn fire_text(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_string(), |ms| rfc3339(ms, None))
}

/// `--json`: `value` pretty-printed on standard output; the command's exit code.
pub(super) fn say_json(value: &impl serde::Serialize) -> anyhow::Result<i32> {
    say!("{}", serde_json::to_string_pretty(value)?);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_print_so_that_they_can_be_given_back() {
        assert_eq!(pasteable(b"order-7"), "order-7");
        assert_eq!(pasteable(b"\xff\x00a'b\n"), "$'\\xff\\x00a\\'b\\n'");
        assert_eq!(member_json(b"caf\xc3\xa9").1, "caf\u{e9}");
        assert_eq!(member_json(b"\xff").0, "member_b64");
        assert_eq!(member_json(b"\xff").1, "/w==");
    }

    #[test]
    fn infinite_due_times_are_words() {
        assert_eq!(late_text(1_000, i64::MIN), "now");
        assert_eq!(late_text(1_000, i64::MAX), "parked");
        assert_eq!(late_text(1_000, 750), "250ms");
        assert_eq!(late_text(i64::MIN, 5), format!("{}ms", i64::MIN));
        assert_eq!(ms_text(i64::MIN), "now (-inf)");
        assert_eq!(ms_text(i64::MAX), "parked (+inf)");
        assert_eq!(due_number(i64::MIN), "-inf");
        assert_eq!(due_number(7), "7");
    }
}
