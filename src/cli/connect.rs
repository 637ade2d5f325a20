//! `check --connect`: connects with the configuration's credentials and lists every destination that is missing or cannot be reached (RabbitMQ passive declares, Kafka metadata, an HTTP connect) and keyspace notifications that are off and cannot be turned on; nothing is published, declared or changed.

use std::time::Duration;

use futures_util::future::join_all;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};
use rdkafka::producer::{BaseProducer, Producer};

use crate::config::{
    AmqpSinkConfig, Config, Destination, HttpSinkConfig, KafkaSinkConfig, SinkConfig, Tls, Trigger,
};
use crate::secret::redact_url;

use super::reach;

/// Exit code when `check --connect` found a problem (EX_UNAVAILABLE): the configuration is
/// valid, but a destination or Redis is not ready for it.
pub(crate) const EXIT_UNAVAILABLE: i32 = 69;

/// How long the Kafka brokers have to answer the metadata request.
const KAFKA_METADATA: Duration = Duration::from_secs(10);
/// The longest an HTTP connect (and TLS handshake) is given, when the sink's `timeout` is
/// longer.
const HTTP_CONNECT: Duration = Duration::from_secs(5);

/// Every problem found, one line each, naming the trigger, the sink and the destination, with
/// what to do.
pub(super) async fn problems(config: &Config) -> Vec<String> {
    // The sinks are looked at side by side: one that does not answer costs its timeout once.
    let sinks = config.sinks.iter().map(|(name, sink)| async move {
        let triggers: Vec<&Trigger> = config
            .triggers
            .iter()
            .filter(|t| t.sink() == *name)
            .collect();
        if triggers.is_empty() {
            return Vec::new();
        }
        match sink.settings() {
            SinkConfig::Amqp(a) => amqp_problems(name, a, sink.tls(), &triggers).await,
            SinkConfig::Kafka(k) => kafka_problems(name, k, &triggers).await,
            SinkConfig::Http(h) => http_problems(name, h, &sink.tls(), &triggers).await,
        }
    });
    let (mut found, sinks) = tokio::join!(redis_problems(config), join_all(sinks));
    found.extend(sinks.into_iter().flatten());
    found
}

/// Redis unreachable, keyspace notifications off and not to be turned on, or an engine the
/// bridge cannot keep its promise on (scripts refused, an evicting policy).
async fn redis_problems(config: &Config) -> Vec<String> {
    match reach::connect(config).await {
        Ok(conn) => {
            let mut found = crate::redis::checks::notification_problems(
                &conn,
                config.redis.settings().enable_keyspace_events,
            )
            .await;
            let engine = crate::redis::engine::connect_check(config).await;
            found.extend(
                engine
                    .into_iter()
                    .filter(|f| f.severity == crate::redis::engine::Severity::Error)
                    .map(|f| format!("redis: {}", f.message)),
            );
            found
        }
        Err(e) => vec![format!(
            "redis: {e:#}: start it, or fix [redis] (url, credentials, tls)"
        )],
    }
}

/// The names of `triggers`, for a problem that concerns them all.
fn names(triggers: &[&Trigger]) -> String {
    let names: Vec<&str> = triggers.iter().map(|t| t.name()).collect();
    names.join(", ")
}

/// RabbitMQ: each trigger's exchange and dead-letter exchange, passively declared on a
/// channel of its own (a refusal closes the channel); exchanges the sink declares itself
/// (`declare`) are not looked for.
async fn amqp_problems(
    name: &str,
    config: &AmqpSinkConfig,
    tls: Tls,
    triggers: &[&Trigger],
) -> Vec<String> {
    let sink = match crate::sink::amqp::AmqpSink::new(name, config, tls) {
        Ok(sink) => sink,
        Err(e) => return vec![format!("sink {name}: {e:#}")],
    };
    let conn = match sink.consumer_connection("/check").await {
        Ok(conn) => conn,
        Err(e) => {
            return vec![format!(
                "sink {name} (triggers {}): cannot connect to RabbitMQ: {e}: start it, or fix \
                 sinks.{name} (url, credentials, vhost, tls)",
                names(triggers)
            )]
        }
    };
    let declared = |exchange: &str| config.declare.iter().any(|d| d.exchange == exchange);
    let mut found = Vec::new();
    for t in triggers {
        let routes = [
            ("exchange", Some(t.destination())),
            ("dead_letter_exchange", t.dead_letter()),
        ];
        for (key, route) in routes {
            let Some(Destination::Amqp(route)) = route else {
                continue;
            };
            let exchange = route.exchange.as_str();
            if exchange.is_empty() || declared(exchange) {
                continue;
            }
            if let Some(why) = exchange_problem(&conn, exchange).await {
                found.push(format!(
                    "trigger {} (sink {name}): {key} `{exchange}` {why}",
                    t.name()
                ));
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(200, "checked")).await;
    found
}

/// Why `exchange` cannot be published to, from a passive declare on a new channel.
async fn exchange_problem(conn: &Connection, exchange: &str) -> Option<String> {
    let channel = match conn.create_channel().await {
        Ok(channel) => channel,
        Err(e) => return Some(format!("cannot be looked for (no channel: {e})")),
    };
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = channel
        .exchange_declare(
            exchange,
            ExchangeKind::Direct,
            passive,
            FieldTable::default(),
        )
        .await;
    let why = match declared {
        Ok(()) => {
            let _ = channel.close(200, "checked").await;
            return None;
        }
        Err(lapin::Error::ProtocolError(e)) => match e.get_id() {
            404 => "does not exist (404): declare it, or list it under the sink's `declare`"
                .to_string(),
            403 => format!(
                "may not be used by this user (403 {}): grant the user's permissions on it",
                e.get_message()
            ),
            code => format!("was refused ({code} {})", e.get_message()),
        },
        Err(e) => format!("cannot be looked for ({e})"),
    };
    Some(why)
}

/// Kafka: each trigger's topic, dead-letter topic and ingress topic, in the brokers' list of
/// topics (read for every topic, so that none is created by asking for it).
async fn kafka_problems(
    name: &str,
    config: &KafkaSinkConfig,
    triggers: &[&Trigger],
) -> Vec<String> {
    let cc = match crate::sink::kafka::client_config(config) {
        Ok(cc) => cc,
        Err(e) => return vec![format!("sink {name}: {e:#}")],
    };
    let topics =
        tokio::task::spawn_blocking(move || -> Result<Vec<(String, Option<String>)>, String> {
            let producer: BaseProducer = cc.create().map_err(|e| e.to_string())?;
            let metadata = producer
                .client()
                .fetch_metadata(None, KAFKA_METADATA)
                .map_err(|e| e.to_string())?;
            Ok(metadata
                .topics()
                .iter()
                .map(|t| (t.name().to_string(), t.error().map(|e| format!("{e:?}"))))
                .collect())
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    let topics = match topics {
        Ok(topics) => topics,
        Err(e) => {
            return vec![format!(
                "sink {name} (triggers {}): cannot read the topics from Kafka ({}): {e}: start \
                 the brokers, or fix sinks.{name} (brokers, properties)",
                names(triggers),
                config.brokers
            )]
        }
    };
    let mut found = Vec::new();
    for t in triggers {
        let mut wanted = Vec::new();
        if let Destination::Kafka(route) = t.destination() {
            wanted.push(("topic", route.topic.as_str()));
        }
        if let Some(Destination::Kafka(route)) = t.dead_letter() {
            wanted.push(("dead_letter_topic", route.topic.as_str()));
        }
        if let Some(topic) = t.ingress().as_ref().and_then(|i| i.topic.as_deref()) {
            wanted.push(("ingress.topic", topic));
        }
        for (key, topic) in wanted {
            let why = match topics.iter().find(|(n, _)| n == topic) {
                None => "does not exist (or this user may not describe it): create it, or \
                         grant the user's ACLs on it"
                    .to_string(),
                Some((_, Some(error))) => format!("is not usable: {error}"),
                Some((_, None)) => continue,
            };
            found.push(format!(
                "trigger {} (sink {name}): {key} `{topic}` {why}",
                t.name()
            ));
        }
    }
    found
}

/// HTTP: a TCP connect (and TLS handshake for `https`) to each trigger's own URL's host and
/// port, within the sink's timeout (at most [`HTTP_CONNECT`]); no request is sent. A URL each
/// message names (`url_pointer`) is not known before: not looked at.
async fn http_problems(
    name: &str,
    config: &HttpSinkConfig,
    tls: &Tls,
    triggers: &[&Trigger],
) -> Vec<String> {
    let limit = config.timeout.min(HTTP_CONNECT);
    let mut found = Vec::new();
    for t in triggers {
        let Destination::Http(route) = t.destination() else {
            continue;
        };
        let Some(url) = route.fixed_url() else {
            continue;
        };
        if let Err(why) = http_connect(url, tls, limit).await {
            found.push(format!(
                "trigger {} (sink {name}): url {} cannot be reached: {why}: start the \
                 endpoint, or fix the trigger's url (or the sink's tls)",
                t.name(),
                redact_url(url)
            ));
        }
    }
    found
}

/// Connects to `url`'s host and port (a TLS handshake with `tls` for `https`) within `limit`.
async fn http_connect(url: &str, tls: &Tls, limit: Duration) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("not a URL ({e})"))?;
    let host = parsed.host_str().ok_or("the URL has no host")?.to_string();
    let port = parsed
        .port_or_known_default()
        .ok_or("the URL has no port")?;
    let addr = (host.trim_start_matches('[').trim_end_matches(']'), port);
    let tcp = match tokio::time::timeout(limit, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return Err(format!("connecting to {host}:{port}: {e}")),
        Err(_) => {
            return Err(format!(
                "connecting to {host}:{port}: no answer within {}",
                humantime::format_duration(limit)
            ))
        }
    };
    if parsed.scheme() != "https" {
        return Ok(());
    }
    let server = rustls::pki_types::ServerName::try_from(tls.name_for(&host).to_string())
        .map_err(|e| format!("server name: {e}"))?;
    let handshake = tokio_rustls::TlsConnector::from(tls.config()).connect(server, tcp);
    match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("TLS handshake with {host}:{port}: {e}")),
        Err(_) => Err(format!(
            "TLS handshake with {host}:{port}: not finished within {}",
            humantime::format_duration(limit)
        )),
    }
}
