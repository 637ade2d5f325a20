//! The `[redis]` section: the URL, the cluster's seed nodes or the sentinels, and the timeouts.

use std::collections::HashSet;

use super::super::{Invalid, Redis, RedisConfig, RedisMode};
use super::{too_long, HOUR};

impl Redis {
    /// Checks `settings` (every problem, keyed `redis.*`) and reads the files of `[redis.tls]`.
    pub fn validate(settings: RedisConfig) -> Result<Self, Invalid> {
        let mut problems = Vec::new();
        redis_problems(&settings, &mut |key, why| problems.push((key, why)));
        let (tls_problems, tls) = super::super::tls::redis(&settings);
        problems.extend(tls_problems);
        if problems.is_empty() {
            Ok(Self::new(settings, tls))
        } else {
            Err(Invalid(problems))
        }
    }
}

/// Problems of `[redis]`, each keyed `redis.*`.
fn redis_problems(redis: &RedisConfig, push: &mut impl FnMut(String, String)) {
    if redis.mode == RedisMode::Cluster {
        cluster_problems(redis, push);
    } else if !redis.nodes.is_empty() {
        push(
            "redis.nodes".into(),
            "only for mode = \"cluster\"; a standalone server is given by redis.url".into(),
        );
    }
    sentinel_problems(redis, push);
    match url::Url::parse(&redis.url) {
        Ok(u) if matches!(u.scheme(), "redis" | "rediss") => {
            if let Some(why) = redis_client_refuses(&redis.url) {
                push("redis.url".into(), why);
            }
        }
        Ok(u) => push(
            "redis.url".into(),
            format!(
                "scheme `{}` is not supported, use redis:// or rediss://",
                u.scheme()
            ),
        ),
        Err(e) => push("redis.url".into(), format!("not a valid URL: {e}")),
    }
    for (key, value) in [
        ("redis.connect_timeout", redis.connect_timeout),
        ("redis.response_timeout", redis.response_timeout),
    ] {
        if value.is_zero() {
            push(key.into(), "must be greater than zero".into());
        } else if let Some(why) = too_long(value, HOUR) {
            push(key.into(), why);
        }
    }
}

/// What the Redis client says of `url` (`rediss://` read as `redis://`: the bridge wraps TLS
/// itself), if it will not connect to it: `redis:/host:port` is a URL, but names no host.
fn redis_client_refuses(url: &str) -> Option<String> {
    use redis::IntoConnectionInfo;
    let plain = match url.strip_prefix("rediss://") {
        Some(rest) => format!("redis://{rest}"),
        None => url.to_string(),
    };
    let host_missing = url::Url::parse(&plain)
        .is_ok_and(|u| u.scheme() == "redis" && u.host_str().is_none_or(str::is_empty));
    if host_missing {
        return Some("names no host: write redis://HOST:PORT".into());
    }
    plain
        .as_str()
        .into_connection_info()
        .err()
        .map(|e| format!("the Redis client refuses it: {e}"))
}

/// The seed nodes of cluster mode: at least one, each a `redis://` or `rediss://` URL of
/// database 0, all with the same scheme; and `url` left alone.
fn cluster_problems(redis: &RedisConfig, push: &mut impl FnMut(String, String)) {
    if redis.nodes.is_empty() {
        push(
            "redis.nodes".into(),
            "cluster mode needs at least one seed node, e.g. [\"redis://10.0.0.1:6379\"]".into(),
        );
    }
    if redis.url != super::super::redis::default_redis_url() {
        push(
            "redis.url".into(),
            "standalone only; in cluster mode list seed nodes in redis.nodes".into(),
        );
    }
    let node_problem = |node: &str, u: &url::Url| {
        redis_client_refuses(node).or_else(|| {
            (!matches!(u.path(), "" | "/" | "/0"))
                .then(|| format!("`{}`: a cluster has database 0 only", u.path()))
        })
    };
    server_url_problems(
        "redis.nodes",
        &redis.nodes,
        node_problem,
        "mixes redis:// and rediss://: a cluster is reached with TLS or without",
        push,
    );
    many_servers_tls(
        redis,
        "cluster",
        "each node's certificate must carry the address it announces",
        push,
    );
}

/// Sentinel mode: the sentinels (at least one, `redis://` or `rediss://`, all alike, no
/// database), the master's name, and `url` and `nodes` left alone; outside it, none of its
/// keys.
fn sentinel_problems(redis: &RedisConfig, push: &mut impl FnMut(String, String)) {
    if redis.mode != RedisMode::Sentinel {
        let set = [
            ("redis.sentinels", !redis.sentinels.is_empty()),
            ("redis.master_name", redis.master_name.is_some()),
            ("redis.sentinel_username", redis.sentinel_username.is_some()),
            (
                "redis.sentinel_password_file",
                redis.sentinel_password_file.is_some(),
            ),
        ];
        for (key, _) in set.into_iter().filter(|(_, set)| *set) {
            push(key.into(), "only for mode = \"sentinel\"".into());
        }
        return;
    }
    if redis.sentinels.is_empty() {
        push(
            "redis.sentinels".into(),
            "sentinel mode needs at least one sentinel, e.g. [\"redis://10.0.0.1:26379\"]".into(),
        );
    }
    if redis.master_name.as_deref().is_none_or(str::is_empty) {
        push(
            "redis.master_name".into(),
            "sentinel mode needs the master's name, as in the sentinels' `sentinel monitor NAME`"
                .into(),
        );
    }
    if redis.url != super::super::redis::default_redis_url() {
        push(
            "redis.url".into(),
            "standalone only; in sentinel mode the sentinels name the master".into(),
        );
    }
    let sentinel_problem = |_: &str, u: &url::Url| {
        if !matches!(u.path(), "" | "/" | "/0") {
            Some(format!("`{}`: a sentinel has no databases", u.path()))
        } else if !u.username().is_empty() || u.password().is_some() {
            Some(
                "credentials go in redis.sentinel_username and redis.sentinel_password_file".into(),
            )
        } else {
            None
        }
    };
    server_url_problems(
        "redis.sentinels",
        &redis.sentinels,
        sentinel_problem,
        "mixes redis:// and rediss://: the sentinels are reached with TLS or without",
        push,
    );
    many_servers_tls(
        redis,
        "sentinel",
        "each server's certificate must carry the address the sentinels give",
        push,
    );
}

/// The servers listed under `key` (`redis.nodes`, `redis.sentinels`): each a `redis://` or
/// `rediss://` URL with a host and nothing `problem` finds wrong with it for its mode, all
/// with the same scheme (`mixed` says why).
fn server_url_problems(
    key: &str,
    urls: &[String],
    problem: impl Fn(&str, &url::Url) -> Option<String>,
    mixed: &str,
    push: &mut impl FnMut(String, String),
) {
    let mut schemes = HashSet::new();
    for (i, url) in urls.iter().enumerate() {
        let at = format!("{key}[{i}]");
        match url::Url::parse(url) {
            Ok(u) if !matches!(u.scheme(), "redis" | "rediss") => push(
                at,
                format!(
                    "scheme `{}` is not supported, use redis:// or rediss://",
                    u.scheme()
                ),
            ),
            Ok(u) if u.host_str().is_none_or(str::is_empty) => push(at, "names no host".into()),
            Ok(u) => match problem(url, &u) {
                Some(why) => push(at, why),
                None => {
                    schemes.insert(u.scheme().to_string());
                }
            },
            Err(e) => push(at, format!("not a valid URL: {e}")),
        }
    }
    if schemes.len() > 1 {
        push(key.into(), mixed.into());
    }
}

/// The TLS settings one name for every server cannot serve in `mode`, where the servers are
/// many and found at run time (`why`).
fn many_servers_tls(
    redis: &RedisConfig,
    mode: &str,
    why: &str,
    push: &mut impl FnMut(String, String),
) {
    let Some(tls) = &redis.tls else {
        return;
    };
    if tls.server_name.is_some() {
        push(
            "redis.tls.server_name".into(),
            format!("not supported in {mode} mode: {why}"),
        );
    }
    if tls.insecure {
        push(
            "redis.tls.insecure".into(),
            format!("not supported in {mode} mode"),
        );
    }
}
