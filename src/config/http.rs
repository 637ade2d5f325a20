//! `[sinks.NAME] type = "http"`: the HTTP sink's settings and the checks serde cannot make.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::{too_long, HOUR};
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
    #[serde(default)]
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
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

fn default_http_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_concurrency() -> usize {
    64
}

/// Problems with an HTTP sink's settings, as (field, message).
pub(super) fn problems(http: &HttpSinkConfig) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if http.timeout.is_zero() {
        out.push(("timeout", "must be greater than zero".into()));
    }
    if let Some(why) = too_long(http.timeout, HOUR) {
        out.push(("timeout", why));
    }
    if http.max_concurrency == 0 || http.max_concurrency > MAX_HTTP_CONCURRENCY {
        out.push((
            "max_concurrency",
            format!(
                "must be between 1 and {MAX_HTTP_CONCURRENCY}, got {}",
                http.max_concurrency
            ),
        ));
    }
    if http.follow_redirects > MAX_REDIRECTS {
        out.push((
            "follow_redirects",
            format!(
                "must be between 0 and {MAX_REDIRECTS}, got {}",
                http.follow_redirects
            ),
        ));
    }
    if let Some(file) = &http.signing_secret_file {
        match crate::secret::read_file(file) {
            Ok(secret) if secret.len() < 16 => out.push((
                "signing_secret_file",
                format!(
                    "the secret is {} bytes; use at least 16 (e.g. `openssl rand -hex 32`)",
                    secret.len()
                ),
            )),
            Ok(_) => {}
            Err(e) => out.push(("signing_secret_file", format!("{e:#}"))),
        }
    }
    if http.tls.as_ref().is_some_and(|t| t.server_name.is_some()) {
        out.push((
            "tls.server_name",
            "not supported on an http sink: the URL's host is the name verified".into(),
        ));
    }
    out
}
