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
    /// Most requests in flight at once on this sink, over all its triggers and workers
    /// (1 to 10,000); more wait for one to finish.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    /// File holding the secret of the `x-delay-signature` header (HMAC-SHA256 of the time
    /// and the body, see the HTTP sink's page). Unset: requests are not signed.
    pub signing_secret_file: Option<String>,
    /// Most redirects followed per request (0 to 10). 0: none, a 3xx answer is the
    /// message's fault (dead-lettered as `http_<status>`).
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

fn default_http_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_concurrency() -> usize {
    64
}
