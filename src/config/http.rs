//! `[sinks.NAME] type = "http"`: the HTTP sink's settings (checked in `validate::sinks`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::TlsConfig;

/// Largest `max_concurrency` of an HTTP sink.
pub(super) const MAX_HTTP_CONCURRENCY: usize = 10_000;
/// Largest `follow_redirects` of an HTTP sink.
pub(super) const MAX_REDIRECTS: u32 = 10;

/// `[sinks.NAME] type = "http"`: the client every trigger on this sink calls its URLs with.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// How long one request may take, from connecting to the end of the answer (at most 1
    /// hour). A request that takes longer is retried with backoff (reason `timeout`).
    #[serde(default = "default_http_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// How long connecting may take (TCP and the TLS handshake), shorter than `timeout`.
    /// Unset: 3 s, or half of `timeout` if that is shorter. An endpoint that does not
    /// connect in time is down: its messages wait in Redis with no attempt counted.
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// Most requests in flight at once on this sink, over all its triggers and workers
    /// (1 to 10,000); more wait for one to finish.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    /// File holding the secret of the `x-delay-signature` header (HMAC-SHA256 of the time
    /// and the body, see the HTTP sink's page). Unset: requests are not signed.
    pub signing_secret_file: Option<String>,
    /// Most redirects followed per request (0 to 10), only 307 and 308 (the same method
    /// and body). 0: none. A redirect not followed (301, 302, 303, and 307 or 308 past the
    /// last hop) is the endpoint's failure: its messages wait in Redis with no attempt
    /// counted.
    #[serde(default)]
    pub follow_redirects: u32,
    /// Allow requests to link-local addresses (`169.254.0.0/16`, `fe80::/10`) and cloud
    /// metadata addresses (`169.254.169.254`, `fd00:ec2::254`, `100.100.100.200`). Off: a
    /// URL that resolves to one is dead-lettered as `address_not_allowed`.
    #[serde(default)]
    pub allow_link_local: bool,
    /// `[sinks.NAME.tls]`: how an `https://` endpoint is verified and how the bridge
    /// identifies itself (`ca_file`, `cert_file`, `key_file`, `insecure`). Without it, the
    /// system's CAs are trusted.
    pub tls: Option<TlsConfig>,
}

/// The connect timeout when `connect_timeout` is unset, unless half of `timeout` is shorter.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

impl HttpSinkConfig {
    /// How long connecting may take: `connect_timeout`, or its default.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
            .unwrap_or_else(|| DEFAULT_CONNECT_TIMEOUT.min(self.timeout / 2))
    }
}

fn default_http_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_concurrency() -> usize {
    64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(toml: serde_json::Value) -> HttpSinkConfig {
        serde_json::from_value(toml).unwrap()
    }

    #[test]
    fn connecting_is_bounded_apart_from_the_request() {
        let default = sink(serde_json::json!({}));
        assert_eq!(default.connect_timeout(), Duration::from_secs(3));
        let short = sink(serde_json::json!({ "timeout": "2s" }));
        assert_eq!(
            short.connect_timeout(),
            Duration::from_secs(1),
            "half of it"
        );
        let set = sink(serde_json::json!({ "timeout": "2s", "connect_timeout": "250ms" }));
        assert_eq!(set.connect_timeout(), Duration::from_millis(250));
    }
}
