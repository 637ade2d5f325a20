//! Rules several sections share: what a name may contain, and durations bounded from above.

use std::time::Duration;

/// Whether `name` is non-empty and only `A-Z`, `a-z`, `0-9`, `_`, `-` and `.` (trigger, sink
/// and schedule names: they appear in keys, labels and headers).
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `Some(reason)` when `value` exceeds `max` (durations are bounded so that deadline
/// arithmetic cannot overflow).
pub(super) fn too_long(value: Duration, max: Duration) -> Option<String> {
    (value > max).then(|| {
        format!(
            "must be at most {}, got {}",
            humantime::format_duration(max),
            humantime::format_duration(value)
        )
    })
}
