//! How the commands write members and times: pasteable back into another command, bounded,
//! and infinite scores in words.

use std::time::Duration;

/// A member as the other commands take it back (`show`, `cancel`, `reschedule`): as it is
/// when it is text without control characters, escaped (and then not pasteable) otherwise.
pub(super) fn pasteable(member: &[u8]) -> String {
    match std::str::from_utf8(member) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => String::from_utf8_lossy(member).escape_debug().to_string(),
    }
}

/// A member in a listing: [`pasteable`], or for a long one its start and its size (`show`
/// and `--json` give it whole), so that one large message does not flood the terminal.
pub(super) fn listed(member: &[u8]) -> String {
    const MOST: usize = 200;
    if member.len() <= MOST {
        return pasteable(member);
    }
    let start = String::from_utf8_lossy(&member[..MOST])
        .escape_debug()
        .to_string();
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
