//! `allowed_urls` patterns: which URLs a message may choose for itself on an HTTP trigger.

use url::Url;

/// Why `pattern` cannot be used as an `allowed_urls` entry, if it cannot.
pub(super) fn pattern_problem(pattern: &str) -> Option<String> {
    let parsed = match Url::parse(&pattern.replacen("://*.", "://wildcard.", 1)) {
        Ok(u) => u,
        Err(e) => return Some(format!("`{pattern}` is not a URL: {e}")),
    };
    if !matches!(parsed.scheme(), "http" | "https") {
        return Some(format!("`{pattern}`: only http:// and https:// URLs"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Some(format!("`{pattern}` names no host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Some(format!("`{pattern}`: no query or fragment in a pattern"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Some(format!("`{pattern}`: no user or password in a pattern"));
    }
    None
}

/// Whether `url` matches the `allowed_urls` entry `pattern`: the same scheme, the same host
/// (a pattern host `*.example.com` matches any subdomain of `example.com`, not the domain
/// itself), the same port (defaults included), no user or password, and a path at or under
/// the pattern's path (`/orders` and `/orders/` both allow `/orders/7`, neither
/// `/orders-old`). A URL that does not parse matches nothing.
pub(crate) fn url_match(pattern: &str, url: &str) -> bool {
    let (wildcard, pattern) = match pattern.split_once("://*.") {
        Some((scheme, rest)) => (true, format!("{scheme}://{rest}")),
        None => (false, pattern.to_string()),
    };
    let (Ok(p), Ok(u)) = (Url::parse(&pattern), Url::parse(url)) else {
        return false;
    };
    if !u.username().is_empty() || u.password().is_some() {
        return false;
    }
    let (Some(ph), Some(uh)) = (p.host_str(), u.host_str()) else {
        return false;
    };
    let host_ok = if wildcard {
        uh.len() > ph.len() + 1
            && uh.ends_with(ph)
            && uh.as_bytes()[uh.len() - ph.len() - 1] == b'.'
    } else {
        uh == ph
    };
    if p.scheme() != u.scheme()
        || !host_ok
        || p.port_or_known_default() != u.port_or_known_default()
    {
        return false;
    }
    let base = p.path().trim_end_matches('/');
    let path = u.path();
    path == base || path.strip_prefix(base).is_some_and(|r| r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_scheme_host_port_and_path_prefix() {
        let p = "https://hooks.internal/orders";
        assert!(url_match(p, "https://hooks.internal/orders"));
        assert!(url_match(p, "https://hooks.internal/orders/7?x=1"));
        assert!(url_match(p, "https://hooks.internal:443/orders/7"));
        assert!(url_match(
            "https://hooks.internal/orders/",
            "https://hooks.internal/orders/7"
        ));
        for refused in [
            "https://hooks.internal/orders-old",
            "https://hooks.internal/other",
            "http://hooks.internal/orders",
            "https://hooks.internal:8443/orders",
            "https://hooks.internal.evil.com/orders",
            "https://evil.com/hooks.internal/orders",
            "https://user:pw@hooks.internal/orders",
            "not a url",
        ] {
            assert!(!url_match(p, refused), "{refused}");
        }
        assert!(url_match(
            "https://hooks.internal",
            "https://hooks.internal/anything"
        ));
    }

    #[test]
    fn a_wildcard_host_matches_subdomains_only() {
        let p = "https://*.hooks.internal/";
        assert!(url_match(p, "https://a.hooks.internal/x"));
        assert!(url_match(p, "https://a.b.hooks.internal/"));
        assert!(!url_match(p, "https://hooks.internal/x"));
        assert!(!url_match(p, "https://evilhooks.internal/x"));
    }

    #[test]
    fn bad_patterns_are_named() {
        assert!(pattern_problem("https://*.hooks.internal/a").is_none());
        assert!(pattern_problem("http://127.0.0.1:8080/").is_none());
        assert!(pattern_problem("ftp://x/").is_some());
        assert!(pattern_problem("hooks.internal").is_some());
        assert!(pattern_problem("https://x/?a=1").is_some());
        assert!(pattern_problem("https://u:p@x/").is_some());
    }
}
