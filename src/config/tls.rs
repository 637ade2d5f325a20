//! Checks of the TLS settings: `[redis.tls]`, `[sinks.NAME.tls]` and Kafka's `ssl.*` files, and the warnings they deserve.

use std::path::Path;

use super::{Config, KafkaSinkConfig, RedisConfig, RedisMode, SinkConfig, TlsConfig};
use crate::tls::{shared_mode, Tls};

/// librdkafka properties that name files it reads when TLS is on.
const KAFKA_FILES: [&str; 5] = [
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.crl.location",
];

/// The TLS problems of `[redis]`, as (key, message): a TLS table on a plain URL, `#insecure`
/// in a URL, files that cannot be read or do not hold what they should; and the client of
/// `[redis.tls]`, built from its files now, so that they are read once.
pub(super) fn redis(redis: &RedisConfig) -> (Vec<(String, String)>, Option<Tls>) {
    let mut out = Vec::new();
    let url = url::Url::parse(&redis.url).ok();
    let scheme = url.as_ref().map(url::Url::scheme);
    if url.as_ref().and_then(url::Url::fragment) == Some("insecure") {
        out.push((
            "redis.url".into(),
            "`#insecure` is not accepted: set `redis.tls.insecure = true` to turn \
             verification off (it is warned about), or better, `redis.tls.ca_file`"
                .into(),
        ));
    }
    if let Some(rest) = redis.url.strip_prefix("rediss://") {
        // The bridge does TLS itself and parses the rest as a plain address.
        use ::redis::IntoConnectionInfo;
        if let Err(e) = format!("redis://{rest}").as_str().into_connection_info() {
            out.push(("redis.url".into(), format!("not a usable Redis URL: {e}")));
        }
    }
    let Some(tls) = &redis.tls else {
        return (out, None);
    };
    let (plain, what) = match redis.mode {
        RedisMode::Cluster => (
            redis.nodes.iter().any(|n| n.starts_with("redis://")),
            "redis.nodes are",
        ),
        RedisMode::Sentinel => (
            redis.sentinels.iter().any(|n| n.starts_with("redis://")),
            "redis.sentinels are",
        ),
        RedisMode::Standalone => (scheme == Some("redis"), "redis.url is"),
    };
    if plain {
        out.push((
            "redis.tls".into(),
            format!("TLS settings are given but {what} redis:// (plain text): use rediss://"),
        ));
    }
    let client = table("redis.tls", tls, &mut out);
    (out, client)
}

/// The TLS problems of the sink `name`, as (key, message): a TLS table on a plain address,
/// its files, Kafka `ssl.*` files that librdkafka would fail to read; and the client of its
/// `[sinks.NAME.tls]`, built from its files now.
pub(super) fn sink(name: &str, sink: &SinkConfig) -> (Vec<(String, String)>, Option<Tls>) {
    let mut out = Vec::new();
    let key = format!("sinks.{name}.tls");
    let client = match sink {
        SinkConfig::Amqp(amqp) => {
            let Some(tls) = &amqp.tls else {
                return (out, None);
            };
            let plain = amqp
                .addresses()
                .iter()
                .any(|a| url::Url::parse(a).is_ok_and(|u| u.scheme() == "amqp"));
            if plain {
                out.push((
                    key.clone(),
                    "TLS settings are given but the address is amqp:// (plain text): use amqps://"
                        .into(),
                ));
            }
            table(&key, tls, &mut out)
        }
        SinkConfig::Kafka(kafka) => {
            out.extend(kafka_files(name, kafka));
            None
        }
        SinkConfig::Http(http) => match &http.tls {
            Some(tls) => table(&key, tls, &mut out),
            None => None,
        },
    };
    (out, client)
}

/// Builds the TLS client of the table at `prefix`, reading its files; what is wrong goes to
/// `out`.
fn table(prefix: &str, tls: &TlsConfig, out: &mut Vec<(String, String)>) -> Option<Tls> {
    match Tls::new(tls) {
        Ok(client) => Some(client),
        Err(problems) => {
            out.extend(
                problems
                    .into_iter()
                    .map(|p| (format!("{prefix}.{}", p.field), p.message)),
            );
            None
        }
    }
}

/// Whether a Kafka sink speaks TLS (`security.protocol` SSL or SASL_SSL).
fn kafka_tls(kafka: &KafkaSinkConfig) -> bool {
    kafka
        .properties
        .get("security.protocol")
        .is_some_and(|p| matches!(p.to_ascii_lowercase().as_str(), "ssl" | "sasl_ssl"))
}

/// With TLS on, every `ssl.*` file property must name a file (or, for the CA, a directory)
/// the bridge can read; librdkafka would otherwise fail later, far from the config.
fn kafka_files(name: &str, kafka: &KafkaSinkConfig) -> Vec<(String, String)> {
    if !kafka_tls(kafka) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for property in KAFKA_FILES {
        let Some(value) = kafka.properties.get(property) else {
            continue;
        };
        if property == "ssl.ca.location" && value == "probe" {
            continue;
        }
        let path = Path::new(value);
        let readable = if path.is_dir() {
            std::fs::read_dir(path).map(drop)
        } else {
            std::fs::File::open(path).map(drop)
        };
        if let Err(e) = readable {
            out.push((
                format!("sinks.{name}.properties.{property}"),
                format!("security.protocol is TLS but {value} cannot be read: {e}"),
            ));
        }
    }
    out
}

impl Config {
    /// What an operator should hear before the TLS settings are used: verification turned
    /// off, private keys readable by others. Logged at start and printed by `check`.
    pub fn tls_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let table = |out: &mut Vec<String>, prefix: &str, tls: &TlsConfig| {
            for w in crate::tls::warnings(tls) {
                out.push(format!("{prefix}: {w}"));
            }
        };
        if let Some(tls) = &self.redis.settings().tls {
            table(&mut out, "redis.tls", tls);
        }
        for (name, sink) in &self.sinks {
            match sink.settings() {
                SinkConfig::Amqp(amqp) => {
                    if let Some(tls) = &amqp.tls {
                        table(&mut out, &format!("sinks.{name}.tls"), tls);
                    }
                }
                SinkConfig::Http(http) => {
                    if let Some(tls) = &http.tls {
                        table(&mut out, &format!("sinks.{name}.tls"), tls);
                    }
                }
                SinkConfig::Kafka(kafka) => {
                    if !kafka_tls(kafka) {
                        continue;
                    }
                    for property in ["ssl.key.location", "ssl.keystore.location"] {
                        let Some(key) = kafka.properties.get(property) else {
                            continue;
                        };
                        if let Some(mode) = shared_mode(Path::new(key)) {
                            out.push(format!(
                                "sinks.{name}.properties.{property}: {key} is readable by \
                                 group or others (mode {mode:o}): `chmod 600` it"
                            ));
                        }
                    }
                    let off = |property: &str, values: &[&str]| {
                        kafka.properties.get(property).is_some_and(|v| {
                            values.iter().any(|off| v.trim().eq_ignore_ascii_case(off))
                        })
                    };
                    if off(
                        "enable.ssl.certificate.verification",
                        &["false", "f", "0", "no", "off"],
                    ) {
                        out.push(format!(
                            "sinks.{name}.properties.enable.ssl.certificate.verification: \
                             the broker's certificate is not verified"
                        ));
                    }
                    if off("ssl.endpoint.identification.algorithm", &["none"]) {
                        out.push(format!(
                            "sinks.{name}.properties.ssl.endpoint.identification.algorithm = none: \
                             the broker's host name is not checked against its certificate"
                        ));
                    }
                }
            }
        }
        out
    }
}
