//! `rate_limit` and `rate_burst`: a rate as written (`"500/s"`), read once at load.

use serde::Serialize;

/// Largest `rate_limit`, per second.
pub(crate) const MAX_RATE: f64 = 1_000_000.0;

/// A trigger's rate limit: messages per second, by every bridge on the trigger together, and
/// the most sent at once after a quiet spell (the token bucket's size).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rate {
    per_second: f64,
    burst: u32,
}

impl Rate {
    /// `rate_limit` read, with `rate_burst` or its default: one second's worth, at least 1.
    pub(super) fn new(rate_limit: &str, rate_burst: Option<u32>) -> Result<Self, String> {
        let per_second = parse_rate(rate_limit)?;
        let burst = rate_burst
            .unwrap_or_else(|| per_second.ceil().min(u32::MAX as f64) as u32)
            .max(1);
        Ok(Self { per_second, burst })
    }

    /// Messages per second.
    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    /// The bucket's size: the most messages sent at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

/// `"500/s"`, `"30/m"` (or `/min`), `"100/h"`: messages per second.
pub(super) fn parse_rate(text: &str) -> Result<f64, String> {
    let bad = || format!("`{text}` is not a rate like \"500/s\", \"30/m\" or \"100/h\"");
    let (count, unit) = text.split_once('/').ok_or_else(bad)?;
    let count: f64 = count.trim().parse().map_err(|_| bad())?;
    let seconds = match unit.trim() {
        "s" | "sec" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let per_second = count / seconds;
    if !(per_second.is_finite() && per_second > 0.0 && per_second <= MAX_RATE) {
        return Err(format!(
            "`{text}` must be more than 0 and at most {MAX_RATE} per second"
        ));
    }
    Ok(per_second)
}
