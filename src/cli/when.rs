//! Times on the command line: epoch milliseconds, RFC 3339, `now`, or an offset from now.

use std::time::UNIX_EPOCH;

/// A time argument, resolved against the Redis clock (the one due times are on) when used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum When {
    /// An absolute time, epoch milliseconds.
    At(i64),
    /// Now plus this many milliseconds (negative: in the past).
    FromNow(i64),
}

impl When {
    /// Epoch milliseconds, with `now_ms` the Redis clock's now.
    pub(super) fn resolve(self, now_ms: i64) -> i64 {
        match self {
            When::At(ms) => ms,
            When::FromNow(offset) => now_ms.saturating_add(offset),
        }
    }

    /// True when resolving needs the Redis clock.
    pub(super) fn is_relative(self) -> bool {
        matches!(self, When::FromNow(_))
    }
}

const EXPECTED: &str = "expected epoch milliseconds (1795593600000), an RFC 3339 time \
     (2026-11-25T07:00:00Z, 2026-11-25T08:00:00+01:00), `now`, an offset from now (+5m, -1h30m), \
     `-inf` (due at once, ahead of everything) or `+inf`/`park` (parked)";

/// Parses a time argument (clap's `value_parser`).
pub(super) fn parse(text: &str) -> Result<When, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("now") {
        return Ok(When::FromNow(0));
    }
    // The infinite scores: `-inf` is due at once, ahead of every due time; `+inf` is parked
    // (never due until rescheduled or promoted).
    match t.to_ascii_lowercase().as_str() {
        "-inf" => return Ok(When::At(i64::MIN)),
        "+inf" | "inf" | "park" | "parked" => return Ok(When::At(i64::MAX)),
        _ => {}
    }
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse()
            .map(When::At)
            .map_err(|_| format!("`{t}` is too large for epoch milliseconds"));
    }
    for (sign, factor) in [('+', 1), ('-', -1)] {
        if let Some(rest) = t.strip_prefix(sign) {
            let d = humantime::parse_duration(rest.trim())
                .map_err(|e| format!("`{t}`: {e}; {EXPECTED}"))?;
            let ms = i64::try_from(d.as_millis()).map_err(|_| format!("`{t}` is too far"))?;
            return Ok(When::FromNow(factor * ms));
        }
    }
    rfc3339(t)
        .map(When::At)
        .ok_or_else(|| format!("`{t}`: {EXPECTED}"))
}

/// An RFC 3339 date and time with `Z` or a numeric offset (`+01:00`), as epoch ms.
fn rfc3339(t: &str) -> Option<i64> {
    let (local, offset_ms) = split_offset(t)?;
    let at = humantime::parse_rfc3339_weak(local).ok()?;
    let ms = i64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
    Some(ms - offset_ms)
}

/// The date and time without its zone, and the zone's offset from UTC in ms.
fn split_offset(t: &str) -> Option<(&str, i64)> {
    if let Some(local) = t.strip_suffix(['Z', 'z']) {
        return Some((local, 0));
    }
    // A numeric offset ends the text: `+HH:MM` or `-HH:MM`, after the time (past the `T`).
    let cut = t.len().checked_sub(6)?;
    let (local, zone) = t.split_at(cut);
    let sign = match zone.as_bytes()[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    if !local.contains(['T', 't', ' ']) || zone.as_bytes()[3] != b':' {
        return None;
    }
    let hours: i64 = zone[1..3].parse().ok()?;
    let minutes: i64 = zone[4..6].parse().ok()?;
    (hours < 24 && minutes < 60).then_some((local, sign * (hours * 60 + minutes) * 60_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_a_person_types() {
        assert_eq!(parse("1795593600000"), Ok(When::At(1_795_593_600_000)));
        assert_eq!(parse("now"), Ok(When::FromNow(0)));
        assert_eq!(parse("NOW"), Ok(When::FromNow(0)));
        assert_eq!(parse("+5m"), Ok(When::FromNow(300_000)));
        assert_eq!(parse("-1h30m"), Ok(When::FromNow(-5_400_000)));
        assert_eq!(parse("+250ms"), Ok(When::FromNow(250)));
        assert_eq!(parse("-inf"), Ok(When::At(i64::MIN)));
        assert_eq!(parse("+inf"), Ok(When::At(i64::MAX)));
        assert_eq!(parse("park"), Ok(When::At(i64::MAX)));
        // 2026-11-25T07:00:00Z
        let utc = 1_795_590_000_000;
        assert_eq!(parse("2026-11-25T07:00:00Z"), Ok(When::At(utc)));
        assert_eq!(parse("2026-11-25T07:00:00.250Z"), Ok(When::At(utc + 250)));
        assert_eq!(parse("2026-11-25T08:00:00+01:00"), Ok(When::At(utc)));
        assert_eq!(parse("2026-11-25T02:30:00-04:30"), Ok(When::At(utc)));
    }

    #[test]
    fn what_is_not_a_time_says_what_is() {
        for bad in [
            "",
            "tomorrow",
            "+5 parsecs",
            "2026-13-01T00:00:00Z",
            "12:00",
            "-x",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(
                e.contains("RFC 3339") || e.contains("expected"),
                "{bad}: {e}"
            );
        }
        assert!(parse("99999999999999999999")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn relative_times_resolve_on_the_given_clock() {
        assert_eq!(When::FromNow(-1000).resolve(5000), 4000);
        assert_eq!(When::At(7).resolve(5000), 7);
        assert_eq!(When::FromNow(i64::MAX).resolve(5000), i64::MAX);
        assert!(When::FromNow(0).is_relative() && !When::At(0).is_relative());
    }
}
