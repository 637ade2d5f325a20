//! The delay headers producers set: `x-delay` (milliseconds from now) and `x-delay-until` (epoch milliseconds), read as the delayed-message plugin reads `x-delay`; on Kafka also `x-delay-topic`, the topic the record is due on.

/// Milliseconds from the bridge's receipt until the message is due.
pub(crate) const HEADER_DELAY: &str = "x-delay";
/// The epoch millisecond the message is due at (wins over `x-delay` when both are set).
pub(crate) const HEADER_DELAY_UNTIL: &str = "x-delay-until";
/// Kafka: the topic the record is produced to when due, instead of the trigger's (subject to
/// the trigger's `allowed_topics`).
pub(crate) const HEADER_DELAY_TOPIC: &str = "x-delay-topic";
/// Longest delay, and latest due time, taken: about 285,000 years in milliseconds, so that
/// every due time stays an exact integer in a Redis score (a double).
pub(crate) const MAX_MS: i64 = 1 << 53;

/// When a message is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// This many milliseconds from now on the Redis clock (0 or less: now).
    In(i64),
    /// At this epoch millisecond.
    At(i64),
}

/// A header's value as a broker gives it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Raw<'a> {
    /// A whole number.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// Text (an AMQP string, a Kafka header's bytes as UTF-8).
    Text(&'a str),
    /// Anything else, by its type's name.
    Other(&'static str),
}

/// The due time the headers ask for: `x-delay-until` if set, else `x-delay`, else now. A
/// number may be an integer, a float (cut to whole milliseconds) or a numeric string, as the
/// plugin takes; a negative `x-delay` (the plugin's mark on a message it delivered) means
/// now. The error is the detail of the `bad_delay` dead letter.
pub(crate) fn due(delay: Option<Raw<'_>>, until: Option<Raw<'_>>) -> Result<Due, String> {
    if let Some(raw) = until {
        let at = millis(HEADER_DELAY_UNTIL, raw)?;
        if at < 0 {
            return Err(format!("{HEADER_DELAY_UNTIL}: {at} is before 1970"));
        }
        return Ok(Due::At(at));
    }
    match delay {
        Some(raw) => Ok(Due::In(millis(HEADER_DELAY, raw)?.max(0))),
        None => Ok(Due::In(0)),
    }
}

/// A header's whole milliseconds, within ±[`MAX_MS`].
fn millis(name: &str, raw: Raw<'_>) -> Result<i64, String> {
    let n = match raw {
        Raw::Int(n) => n,
        Raw::Float(f) if f.is_finite() && f.abs() <= MAX_MS as f64 => f.trunc() as i64,
        Raw::Float(f) => return Err(format!("{name}: {f} is out of range")),
        Raw::Text(t) => {
            let t = t.trim();
            match t.parse::<i64>() {
                Ok(n) => n,
                Err(_) => match t.parse::<f64>() {
                    Ok(f) if f.is_finite() && f.abs() <= MAX_MS as f64 => f.trunc() as i64,
                    _ => return Err(format!("{name}: `{}` is not a number", shorten(t))),
                },
            }
        }
        Raw::Other(kind) => return Err(format!("{name}: a {kind} is not a number")),
    };
    if n.abs() > MAX_MS {
        return Err(format!("{name}: {n} is out of range (at most {MAX_MS})"));
    }
    Ok(n)
}

/// At most 64 characters of a bad value, for the dead letter's detail.
fn shorten(t: &str) -> String {
    crate::shorten::shorten(t, 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_read_like_the_plugin() {
        assert_eq!(due(None, None), Ok(Due::In(0)));
        assert_eq!(due(Some(Raw::Int(1500)), None), Ok(Due::In(1500)));
        assert_eq!(due(Some(Raw::Text(" 2000 ")), None), Ok(Due::In(2000)));
        assert_eq!(due(Some(Raw::Text("2.9")), None), Ok(Due::In(2)));
        assert_eq!(due(Some(Raw::Float(10.7)), None), Ok(Due::In(10)));
        assert_eq!(due(Some(Raw::Int(-5000)), None), Ok(Due::In(0)));
        assert_eq!(due(Some(Raw::Int(0)), None), Ok(Due::In(0)));
        assert_eq!(
            due(Some(Raw::Int(5)), Some(Raw::Int(1_700_000_000_000))),
            Ok(Due::At(1_700_000_000_000))
        );
        assert_eq!(
            due(None, Some(Raw::Text("1700000000000"))),
            Ok(Due::At(1_700_000_000_000))
        );
    }

    #[test]
    fn bad_delays_say_why() {
        for (delay, until, why) in [
            (Some(Raw::Text("soon")), None, "`soon` is not a number"),
            (Some(Raw::Text("")), None, "not a number"),
            (Some(Raw::Float(f64::NAN)), None, "out of range"),
            (Some(Raw::Int(i64::MAX)), None, "out of range"),
            (Some(Raw::Other("table")), None, "a table is not a number"),
            (None, Some(Raw::Int(-1)), "before 1970"),
            (Some(Raw::Int(1)), Some(Raw::Text("x")), "x-delay-until"),
        ] {
            let e = due(delay, until).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let long = "9".repeat(100) + "x";
        assert!(due(Some(Raw::Text(&long)), None)
            .unwrap_err()
            .ends_with("...` is not a number"));
    }
}
