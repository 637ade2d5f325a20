//! `health`: asks a running bridge's `/healthz` whether it is alive, for container and
//! service-manager health checks (exit 0 when it answers 200), and prints what `/readyz`
//! says (ready, or the reasons it is not).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context;
use figment::providers::{Format, Toml};
use figment::Figment;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// `health` arguments.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// URL to ask (default: `/healthz` on the `[metrics] listen` address of the config, or
    /// `http://127.0.0.1:9464/healthz` when no config is found).
    #[arg(long)]
    url: Option<String>,
    /// Exit 0 only when `/readyz` answers 200 too (ready: Redis and every sink connected).
    #[arg(long)]
    ready: bool,
    /// Give up after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    timeout: Duration,
    #[command(flatten)]
    config: ConfigArg,
}

/// The metrics listener's address when no config says otherwise.
const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9464);

/// Runs the check: prints one line and returns 0 when the answer is 200, else 1.
pub(super) async fn health(args: HealthArgs) -> i32 {
    let url = match &args.url {
        Some(url) => url.clone(),
        None => match default_url(&args.config) {
            Ok(url) => url,
            Err(e) => {
                say!("unhealthy: {}", one_line(&e));
                return 1;
            }
        },
    };
    let alive = match ask(&url, args.timeout).await {
        Ok((200, _)) => {
            say!("healthy: {url} answered 200");
            true
        }
        Ok((status, _)) => {
            say!("unhealthy: {url} answered {status}");
            false
        }
        Err(why) => {
            say!("unhealthy: {url}: {why}");
            false
        }
    };
    if !alive {
        return 1;
    }
    let ready = readiness(&url, args.timeout).await;
    i32::from(args.ready && !ready)
}

/// `get` within `timeout`; a failure or no answer in time as one line to print.
async fn ask(url: &str, timeout: Duration) -> Result<(u16, String), String> {
    match tokio::time::timeout(timeout, get(url)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(one_line(&e)),
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// Asks `/readyz` next to `healthz` and prints its answer: `ready` and its notes, or each
/// reason the bridge is not ready. Returns whether it answered 200.
async fn readiness(healthz: &str, timeout: Duration) -> bool {
    let Ok(mut url) = url::Url::parse(healthz) else {
        return false;
    };
    url.set_path("/readyz");
    url.set_query(None);
    match ask(url.as_str(), timeout).await {
        Ok((status, body)) => {
            let ready = status == 200;
            say!(
                "{}: {url} answered {status}",
                if ready { "ready" } else { "not ready" }
            );
            for line in body
                .lines()
                .filter(|l| !l.trim().is_empty() && *l != "ready")
            {
                say!("  {line}");
            }
            ready
        }
        Err(why) => {
            say!("readiness unknown: {url}: {why}");
            false
        }
    }
}

/// `/healthz` on the config's metrics listener. Only `[metrics] listen` is read (with its
/// `DELAY_BRIDGE_METRICS__LISTEN` override), so a check never touches secrets or brokers.
fn default_url(arg: &ConfigArg) -> anyhow::Result<String> {
    let listen = match config::find_config(arg.explicit()) {
        Ok(path) => {
            anyhow::ensure!(path.is_file(), "{}: no such file", path.display());
            let figment = Figment::new()
                .merge(Toml::file_exact(&path))
                .merge(config::env_overrides());
            if figment.contains("metrics.listen") {
                figment
                    .extract_inner::<SocketAddr>("metrics.listen")
                    .with_context(|| format!("{}: metrics.listen", path.display()))?
            } else {
                DEFAULT_LISTEN
            }
        }
        // Nothing on the search path: the default listener.
        Err(_) => DEFAULT_LISTEN,
    };
    Ok(format!("http://{}/healthz", reachable(listen)))
}

/// A listener on every interface is asked on loopback.
fn reachable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port())
        }
        _ => listen,
    }
}

/// Most of an answer read: a status line and `/readyz`'s reasons fit many times over.
const MAX_ANSWER: usize = 64 * 1024;

/// `GET url` over plain HTTP/1.1; the response's status code and its body (as text, cut at
/// [`MAX_ANSWER`] bytes).
async fn get(url: &str) -> anyhow::Result<(u16, String)> {
    let parsed = url::Url::parse(url).with_context(|| format!("not a URL: {url}"))?;
    anyhow::ensure!(parsed.scheme() == "http", "only http:// URLs are supported");
    let host = parsed.host_str().context("the URL has no host")?;
    let port = parsed.port_or_known_default().unwrap_or(80);
    let target = match parsed.query() {
        Some(q) => format!("{}?{q}", parsed.path()),
        None => parsed.path().to_string(),
    };
    let authority = match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    // `[::1]` in a URL is `::1` to the resolver.
    let dial = host.trim_start_matches('[').trim_end_matches(']');
    let mut stream = tokio::net::TcpStream::connect((dial, port))
        .await
        .context("connecting")?;
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: delay-bridge-health\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::with_capacity(512);
    let mut buf = [0u8; 4096];
    while answer.len() < MAX_ANSWER {
        let n = stream.read(&mut buf).await.context("reading the answer")?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&answer);
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    let status = match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(status))) if version.starts_with("HTTP/") => status,
        _ => anyhow::bail!("not an HTTP answer: {line:?}"),
    };
    let body = text
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, body)| body.to_string());
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interface_is_asked_on_loopback() {
        let any4: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let any6: SocketAddr = "[::]:9000".parse().unwrap();
        let one: SocketAddr = "10.1.2.3:80".parse().unwrap();
        assert_eq!(reachable(any4), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(reachable(any6), "[::1]:9000".parse().unwrap());
        assert_eq!(reachable(one), one);
    }
}
