//! The HTTP client of a sink: pooled keep-alive connections, HTTP/2 where the endpoint offers it (ALPN), the sink's TLS table, its redirect policy (307 and 308 only), and a resolver that refuses link-local and metadata addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::config::HttpSinkConfig;
use crate::tls::Tls;

/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(90);

/// Why a request was not sent: its host is, or resolves only to, an address the sink does
/// not call (link-local or metadata).
#[derive(Debug)]
pub(super) struct Blocked(pub String);

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Blocked {}

/// The client of a sink, built from its settings and its TLS client, and the TLS
/// configuration (for the probes of an endpoint that is down).
pub(super) fn build(
    config: &HttpSinkConfig,
    tls: &Tls,
) -> anyhow::Result<(reqwest::Client, Arc<rustls::ClientConfig>)> {
    let mut rustls = (*tls.config()).clone();
    rustls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let probe = Arc::new(rustls.clone());
    let allow = config.allow_link_local;
    let hops = config.follow_redirects as usize;
    let redirect = if hops == 0 {
        reqwest::redirect::Policy::none()
    } else {
        reqwest::redirect::Policy::custom(move |attempt| {
            if !keeps_method_and_body(attempt.status()) || attempt.previous().len() > hops {
                // 301, 302 and 303 would turn the request into a GET without its body, and
                // a redirect past the last hop is not followed either: the answer comes back
                // as it is (the endpoint's failure), and no 2xx to another request confirms.
                attempt.stop()
            } else if let Some(why) = (!allow).then(|| literal_blocked(attempt.url())).flatten() {
                attempt.error(Blocked(why))
            } else {
                attempt.follow()
            }
        })
    };
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(rustls)
        .redirect(redirect)
        .timeout(config.timeout)
        .connect_timeout(config.connect_timeout())
        .pool_idle_timeout(POOL_IDLE)
        .pool_max_idle_per_host(config.max_concurrency)
        .tcp_nodelay(true)
        .no_proxy()
        .dns_resolver(Arc::new(Guarded { allow }))
        .user_agent(concat!("delay-bridge/", env!("CARGO_PKG_VERSION")))
        .build()?;
    Ok((client, probe))
}

/// Whether a redirect with `status` is followed with the request's own method and body
/// (307, 308): the others are never followed.
fn keeps_method_and_body(status: reqwest::StatusCode) -> bool {
    matches!(
        status,
        reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
    )
}

/// Whether the sink refuses to call `ip` unless `allow_link_local`: link-local addresses
/// and the cloud metadata services.
pub(super) fn blocked(ip: IpAddr) -> bool {
    const ALIBABA_METADATA: Ipv4Addr = Ipv4Addr::new(100, 100, 100, 200);
    const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4 == ALIBABA_METADATA,
        IpAddr::V6(v6) => {
            v6.segments()[0] & 0xffc0 == 0xfe80
                || v6 == AWS_METADATA_V6
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| blocked(IpAddr::V4(v4)))
        }
    }
}

/// Why `url` must not be called, when its host is an address literal the sink refuses.
pub(super) fn literal_blocked(url: &url::Url) -> Option<String> {
    let ip = match url.host()? {
        url::Host::Ipv4(ip) => IpAddr::V4(ip),
        url::Host::Ipv6(ip) => IpAddr::V6(ip),
        url::Host::Domain(_) => return None,
    };
    blocked(ip).then(|| refusal(&ip.to_string()))
}

fn refusal(what: &str) -> String {
    format!("{what} is a link-local or metadata address (allow_link_local is off)")
}

/// The system resolver, without the addresses the sink refuses: a name that resolves
/// only to those fails with [`Blocked`].
struct Guarded {
    allow: bool,
}

impl Resolve for Guarded {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if allow {
                return Ok(Box::new(all.into_iter()) as Addrs);
            }
            let usable: Vec<SocketAddr> =
                all.iter().copied().filter(|a| !blocked(a.ip())).collect();
            if usable.is_empty() && !all.is_empty() {
                let why = refusal(&format!("{host} resolves to {}", all[0].ip()));
                return Err(Box::new(Blocked(why)) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(usable.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_and_metadata_addresses_are_refused() {
        for refused in [
            "169.254.169.254",
            "169.254.1.1",
            "100.100.100.200",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
        ] {
            assert!(blocked(refused.parse().unwrap()), "{refused}");
        }
        for allowed in ["127.0.0.1", "10.0.0.1", "::1", "fd00::1", "8.8.8.8"] {
            assert!(!blocked(allowed.parse().unwrap()), "{allowed}");
        }
        let url = url::Url::parse("http://169.254.169.254/latest/meta-data").unwrap();
        assert!(literal_blocked(&url).is_some());
        let url = url::Url::parse("http://[fe80::1]:8080/").unwrap();
        assert!(literal_blocked(&url).is_some());
        let url = url::Url::parse("http://hooks.internal/").unwrap();
        assert!(literal_blocked(&url).is_none());
    }
}
