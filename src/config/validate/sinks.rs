//! The `[sinks.NAME]` sections: AMQP addresses and bounds, declared topology, Kafka
//! brokers and the producer properties that would void a delivery report's proof.

use std::collections::HashSet;

use super::super::http::{MAX_HTTP_CONCURRENCY, MAX_REDIRECTS};
use super::super::{AmqpSinkConfig, HttpSinkConfig, Invalid, Sink, SinkConfig};
use super::{too_long, too_long_name, valid_name, HOUR, MAX_CHANNELS, MAX_UNCONFIRMED};

impl Sink {
    /// Checks the settings of the sink `name` (every problem, keyed `sinks.NAME.*`) and reads
    /// the files of its `tls` table.
    pub fn validate(name: &str, settings: SinkConfig) -> Result<Self, Invalid> {
        let mut problems = Vec::new();
        sink_problems(name, &settings, &mut |key, why| problems.push((key, why)));
        let (tls_problems, tls) = super::super::tls::sink(name, &settings);
        problems.extend(tls_problems);
        if problems.is_empty() {
            Ok(Self::new(name, settings, tls))
        } else {
            Err(Invalid(problems))
        }
    }
}

/// Problems of the sink `name`, each keyed `sinks.NAME.*`.
fn sink_problems(name: &str, sink: &SinkConfig, push: &mut impl FnMut(String, String)) {
    if !valid_name(name) {
        push(
            format!("sinks.{name}"),
            "sink names may only contain A-Z, a-z, 0-9, `_`, `-` and `.`".into(),
        );
    }
    match sink {
        SinkConfig::Amqp(amqp) => {
            for (key, why) in amqp_addresses(name, amqp) {
                push(key, why);
            }
            if let Some(why) = too_long(amqp.reconnect_max, HOUR) {
                push(format!("sinks.{name}.reconnect_max"), why);
            }
            if amqp.channels == 0 || amqp.channels > MAX_CHANNELS {
                push(
                    format!("sinks.{name}.channels"),
                    format!(
                        "must be between 1 and {MAX_CHANNELS}, got {}",
                        amqp.channels
                    ),
                );
            }
            if amqp.max_unconfirmed == 0 || amqp.max_unconfirmed > MAX_UNCONFIRMED {
                push(
                    format!("sinks.{name}.max_unconfirmed"),
                    format!(
                        "must be between 1 and {MAX_UNCONFIRMED}, got {}",
                        amqp.max_unconfirmed
                    ),
                );
            }
            for (i, d) in amqp.declare.iter().enumerate() {
                for (field, value) in [
                    ("exchange", Some(&d.exchange)),
                    ("queue", d.queue.as_ref()),
                    ("binding_key", d.binding_key.as_ref()),
                ] {
                    if let Some(why) = value.and_then(|v| too_long_name(v)) {
                        push(format!("sinks.{name}.declare[{i}].{field}"), why);
                    }
                }
                if d.queue_type.is_some() && d.queue.is_none() {
                    push(
                        format!("sinks.{name}.declare[{i}].queue_type"),
                        "needs a `queue` to declare".into(),
                    );
                }
                if d.exchange.is_empty() {
                    push(
                        format!("sinks.{name}.declare[{i}].exchange"),
                        "must not be empty".into(),
                    );
                }
            }
        }
        SinkConfig::Http(http) => {
            for (key, why) in http_problems(http) {
                push(format!("sinks.{name}.{key}"), why);
            }
        }
        SinkConfig::Kafka(kafka) => {
            if kafka.brokers.trim().is_empty() {
                push(format!("sinks.{name}.brokers"), "must not be empty".into());
            }
            if !kafka.accept_possible_loss {
                for (property, why) in unsafe_kafka_properties(&kafka.properties) {
                    push(format!("sinks.{name}.properties.{property}"), why);
                }
            }
        }
    }
}

/// Problems with an AMQP sink's addresses: exactly one of `url` and `urls`, each a valid
/// amqp(s) URL, and the nodes of one cluster: only host, port and query may differ, since the
/// credentials, `password_file` and the vhost apply to whichever node the bridge is on.
fn amqp_addresses(name: &str, amqp: &AmqpSinkConfig) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let keys: Vec<String> = match (&amqp.url, &amqp.urls) {
        (Some(_), Some(_)) => {
            out.push((
                format!("sinks.{name}.urls"),
                "give `url` (one node) or `urls` (the nodes of a cluster), not both".into(),
            ));
            return out;
        }
        (None, None) => {
            out.push((
                format!("sinks.{name}.url"),
                "missing: give `url` (one node) or `urls` (the nodes of a cluster)".into(),
            ));
            return out;
        }
        (Some(_), None) => vec![format!("sinks.{name}.url")],
        (None, Some(urls)) if urls.is_empty() => {
            out.push((
                format!("sinks.{name}.urls"),
                "must list at least one address".into(),
            ));
            return out;
        }
        (None, Some(urls)) => (0..urls.len())
            .map(|i| format!("sinks.{name}.urls[{i}]"))
            .collect(),
    };
    let mut first: Option<url::Url> = None;
    let mut seen = HashSet::new();
    for (key, raw) in keys.into_iter().zip(amqp.addresses()) {
        let u = match url::Url::parse(raw) {
            Ok(u) if matches!(u.scheme(), "amqp" | "amqps") => {
                // What the AMQP client will make of it (it reads the vhost and the query).
                if let Err(e) = raw.parse::<lapin::uri::AMQPUri>() {
                    out.push((key, format!("the AMQP client refuses it: {e}")));
                    continue;
                }
                if u.host_str().is_none_or(str::is_empty) {
                    out.push((
                        key,
                        "names no host: write amqp://USER@HOST:PORT/VHOST".into(),
                    ));
                    continue;
                }
                u
            }
            Ok(u) => {
                let why = format!(
                    "scheme `{}` is not supported, use amqp:// or amqps://",
                    u.scheme()
                );
                out.push((key, why));
                continue;
            }
            Err(e) => {
                out.push((key, format!("not a valid URL: {e}")));
                continue;
            }
        };
        let node = (u.host_str().map(str::to_string), u.port());
        if !seen.insert(node.clone()) {
            let host = node.0.unwrap_or_default();
            let port = node.1.map_or_else(String::new, |p| format!(":{p}"));
            out.push((key, format!("`{host}{port}` is listed twice")));
            continue;
        }
        match &first {
            None => first = Some(u),
            Some(f) => {
                let differs: Vec<&str> = [
                    ("the scheme", f.scheme() != u.scheme()),
                    ("the user", f.username() != u.username()),
                    ("the password", f.password() != u.password()),
                    ("the vhost", f.path() != u.path()),
                ]
                .into_iter()
                .filter_map(|(what, differs)| differs.then_some(what))
                .collect();
                if !differs.is_empty() {
                    out.push((
                        key,
                        format!(
                            "{} {} from urls[0]: the addresses are the nodes of one cluster and \
                             share scheme, credentials and vhost (only host, port and query may differ)",
                            differs.join(", "),
                            if differs.len() == 1 { "differs" } else { "differ" }
                        ),
                    ));
                }
            }
        }
    }
    out
}

/// Properties under which a Kafka delivery report no longer proves the record is stored.
fn unsafe_kafka_properties(
    properties: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in properties {
        let value = v.trim().to_ascii_lowercase();
        let unsafe_value = match k.as_str() {
            "acks" | "request.required.acks" => !matches!(value.as_str(), "all" | "-1"),
            "enable.idempotence" => value != "true",
            _ => false,
        };
        if unsafe_value {
            out.push((
                k.clone(),
                format!(
                    "`{v}` lets the broker confirm records it may lose, and the bridge deletes a \
                     member once its record is confirmed; remove it, or set accept_possible_loss = true \
                     on this sink to accept that"
                ),
            ));
        }
    }
    out
}

/// Problems with an HTTP sink's settings, as (field, message).
fn http_problems(http: &HttpSinkConfig) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if http.timeout.is_zero() {
        out.push(("timeout", "must be greater than zero".into()));
    }
    if let Some(why) = too_long(http.timeout, HOUR) {
        out.push(("timeout", why));
    }
    match http.connect_timeout {
        Some(c) if c.is_zero() => {
            out.push(("connect_timeout", "must be greater than zero".into()));
        }
        Some(c) if c >= http.timeout => out.push((
            "connect_timeout",
            format!(
                "must be shorter than timeout ({}), got {}",
                humantime::format_duration(http.timeout),
                humantime::format_duration(c)
            ),
        )),
        _ => {}
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
