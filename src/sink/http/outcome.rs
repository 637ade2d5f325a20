//! What an answer, or the lack of one, says: a 2xx confirms; any other status, with its `Retry-After` and an excerpt, or no answer at all (whose fault each is, is `sink::blame`'s).

use std::time::{Duration, SystemTime};

use super::client::Blocked;
use crate::sink::{Confirmed, Outcome, PublishError};

/// Most bytes of an answer's body read; the rest is not read (and the connection closed).
pub(crate) const MAX_BODY: usize = 64 * 1024;
/// Most bytes of the answer's body kept in a dead letter's detail.
pub(crate) const MAX_EXCERPT: usize = 512;

/// How a request ended, for the metrics: the status class, `timeout` or `error`.
pub(super) type Class = &'static str;

/// What a request came to: its outcome, its class, and whether it failed to connect at all
/// (refused, not resolved, no TLS handshake): the endpoint, not the message, may be at fault.
pub(super) struct Ended {
    /// Confirmed, or why not.
    pub outcome: Outcome,
    /// For `http_responses_total`.
    pub class: Class,
    /// No connection at all: the endpoint may be down.
    pub unreachable: bool,
}

/// Reads (at most [`MAX_BODY`] of) an answer and judges it.
pub(super) async fn answered(mut response: reqwest::Response) -> Ended {
    let status = response.status().as_u16();
    let class = match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    };
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, SystemTime::now()));
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    while body.len() < MAX_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            // A 2xx head is the confirmation, whatever becomes of its body.
            Ok(None) | Err(_) => break,
        }
    }
    if (200..300).contains(&status) {
        return Ended {
            outcome: Ok(Confirmed::by_broker()),
            class,
            unreachable: false,
        };
    }
    let mut excerpt = String::from_utf8_lossy(&body[..body.len().min(MAX_EXCERPT)]).into_owned();
    if let Some(location) = location.filter(|_| class == "3xx") {
        excerpt = format!("location: {location}; {excerpt}");
    }
    Ended {
        outcome: Err(PublishError::HttpStatus {
            status,
            excerpt: truncate(excerpt, MAX_EXCERPT),
            retry_after,
            every_request: false,
        }),
        class,
        unreachable: false,
    }
}

/// Judges a request that got no answer.
pub(super) fn failed(e: &reqwest::Error) -> Ended {
    let text = chain(e);
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(b) = s.downcast_ref::<Blocked>() {
            return Ended {
                outcome: Err(PublishError::AddressNotAllowed(b.to_string())),
                class: "error",
                unreachable: false,
            };
        }
        source = s.source();
    }
    if e.is_connect() {
        Ended {
            outcome: Err(PublishError::HttpConnect(text)),
            class: "error",
            unreachable: true,
        }
    } else if e.is_timeout() {
        Ended {
            outcome: Err(PublishError::HttpTimeout),
            class: "timeout",
            unreachable: false,
        }
    } else {
        Ended {
            outcome: Err(PublishError::HttpConnect(text)),
            class: "error",
            unreachable: false,
        }
    }
}

/// The error and its causes, `: `-joined (reqwest's own words say little alone).
fn chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let next = s.to_string();
        if !out.contains(&next) {
            out.push_str(": ");
            out.push_str(&next);
        }
        source = s.source();
    }
    truncate(out, 1024)
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// A `Retry-After` value: seconds, or an HTTP date (the wait until then from `now`).
pub(crate) fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(120));
        assert_eq!(retry_after(&later, now), Some(Duration::from_secs(120)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(120));
        assert_eq!(retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-1", now), None);
    }
}
