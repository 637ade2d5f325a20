//! The message envelope (`format = "envelope"`): a JSON object holding the body and the message's own properties, headers, routing and expiry.

use serde::Deserialize;
use serde_json::Value;

/// What an envelope asks for besides its body: AMQP properties and headers, the Kafka
/// record key, the routing key, the id and the expiry. The body is published alone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    /// Headers, by name (AMQP headers, Kafka headers), W3C `traceparent` and `tracestate`
    /// included: they pass through unchanged.
    pub headers: Vec<(String, HeaderValue)>,
    /// AMQP `content_type`; Kafka header `content-type`.
    pub content_type: Option<String>,
    /// AMQP `content_encoding`; Kafka header `content-encoding`.
    pub content_encoding: Option<String>,
    /// AMQP `correlation_id`; Kafka header `correlation-id`.
    pub correlation_id: Option<String>,
    /// AMQP `reply_to`.
    pub reply_to: Option<String>,
    /// AMQP `type`.
    pub kind: Option<String>,
    /// AMQP `priority` (0-255).
    pub priority: Option<u8>,
    /// AMQP per-message TTL (`expiration`), milliseconds.
    pub expiration_ms: Option<u64>,
    /// AMQP `timestamp`, epoch seconds.
    pub timestamp: Option<u64>,
    /// AMQP `app_id`.
    pub app_id: Option<String>,
    /// The message id (AMQP `message_id`, Kafka header `x-delay-id`) instead of the
    /// bridge's hash of key and member.
    pub id: Option<String>,
    /// AMQP routing key instead of the trigger's (subject to `allowed_routing_keys`).
    pub routing_key: Option<String>,
    /// Kafka record key instead of the trigger's `kafka_key`.
    pub kafka_key: Option<Vec<u8>>,
    /// Kafka topic instead of the trigger's (subject to `allowed_topics`).
    pub topic: Option<String>,
    /// Not delivered after this time (epoch ms): dead-lettered or dropped as expired.
    pub expires_at_ms: Option<i64>,
    /// HTTP: the URL instead of the trigger's (subject to `allowed_urls`).
    pub url: Option<String>,
}

impl Properties {
    /// The properties Kafka and HTTP carry as headers, by header name.
    pub fn header_properties(&self) -> [(&'static str, &Option<String>); 3] {
        [
            ("content-type", &self.content_type),
            ("content-encoding", &self.content_encoding),
            ("correlation-id", &self.correlation_id),
        ]
    }

    /// Whether a property the envelope sets goes out as the header `name` (any case): it
    /// wins over an envelope header of that name.
    pub fn sets_header(&self, name: &str) -> bool {
        self.header_properties()
            .iter()
            .any(|(n, v)| v.is_some() && n.eq_ignore_ascii_case(name))
    }
}

/// A header value: AMQP keeps the type, Kafka gets the text.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    /// A string.
    Text(String),
    /// A whole number.
    Int(i64),
    /// `true` or `false`.
    Bool(bool),
}

impl HeaderValue {
    /// The value as Kafka header bytes.
    pub fn to_text(&self) -> String {
        match self {
            HeaderValue::Text(s) => s.clone(),
            HeaderValue::Int(i) => i.to_string(),
            HeaderValue::Bool(b) => b.to_string(),
        }
    }
}

/// A parsed envelope: the body to publish and the rest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Envelope {
    /// The body, byte for byte (`body` as UTF-8, or `body_b64` decoded).
    pub body: Vec<u8>,
    /// Everything else the envelope says.
    pub properties: Properties,
}

/// The JSON shape; `schema/envelope.schema.json` describes the same.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    body: Option<String>,
    body_b64: Option<String>,
    #[serde(default)]
    headers: serde_json::Map<String, serde_json::Value>,
    content_type: Option<String>,
    content_encoding: Option<String>,
    correlation_id: Option<String>,
    id: Option<String>,
    expires_at_ms: Option<i64>,
    // The fields of one broker: kept as parsed JSON until the destination is known, so a
    // message for the other broker never fails on them.
    reply_to: Option<Value>,
    #[serde(rename = "type")]
    kind: Option<Value>,
    priority: Option<Value>,
    expiration_ms: Option<Value>,
    timestamp: Option<Value>,
    app_id: Option<Value>,
    routing_key: Option<Value>,
    kafka_key: Option<Value>,
    kafka_key_b64: Option<Value>,
    topic: Option<Value>,
    url: Option<Value>,
}

/// The broker an envelope is published to: only its fields are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Broker {
    /// RabbitMQ: `reply_to`, `type`, `priority`, `expiration_ms`, `timestamp`, `app_id`,
    /// `routing_key`.
    Amqp,
    /// Kafka: `kafka_key`, `kafka_key_b64`, `topic`.
    Kafka,
    /// An HTTP endpoint: `url`.
    Http,
}

/// Decodes one broker field, named in the error, if `read` (its broker's); else skips it.
fn field<T: serde::de::DeserializeOwned>(
    read: bool,
    name: &str,
    raw: Option<Value>,
) -> Result<Option<T>, String> {
    raw.filter(|_| read)
        .map(|v| serde_json::from_value(v).map_err(|e| format!("{name}: {e}")))
        .transpose()
}

/// AMQP short strings (property values, routing keys) hold at most 255 bytes.
const SHORT: usize = 255;
/// Most bytes of headers (names and values) one envelope may carry: an AMQP content header
/// travels in one frame, and RabbitMQ closes the whole connection over a frame larger than
/// its `frame_max` (128 KiB by default).
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Longest URL a message may choose (an envelope's `url`, a `url_pointer`'s string).
pub(crate) const MAX_URL: usize = 8 * 1024;

/// Parses an envelope for `broker`; the error is the reason it is dead-lettered with
/// (`bad_envelope`). The other broker's fields are skipped without being decoded.
pub(crate) fn parse(raw: &[u8], broker: Broker) -> Result<Envelope, String> {
    use base64::Engine;
    let r: Raw = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
    let b64 = |field: &str, v: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(v)
            .map_err(|e| format!("{field}: not base64: {e}"))
    };
    let body = match (r.body, r.body_b64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(encoded)) => b64("body_b64", &encoded)?,
        (Some(_), Some(_)) => return Err("give `body` or `body_b64`, not both".into()),
        (None, None) => return Err("missing `body` (or `body_b64`)".into()),
    };
    let amqp = broker == Broker::Amqp;
    let kafka = broker == Broker::Kafka;
    let url: Option<String> = field(broker == Broker::Http, "url", r.url)?;
    if url.as_ref().is_some_and(|u| u.len() > MAX_URL) {
        return Err(format!("url: longer than {MAX_URL} bytes"));
    }
    let reply_to: Option<String> = field(amqp, "reply_to", r.reply_to)?;
    let kind: Option<String> = field(amqp, "type", r.kind)?;
    let priority: Option<u8> = field(amqp, "priority", r.priority)?;
    let expiration_ms: Option<u64> = field(amqp, "expiration_ms", r.expiration_ms)?;
    let timestamp: Option<u64> = field(amqp, "timestamp", r.timestamp)?;
    let app_id: Option<String> = field(amqp, "app_id", r.app_id)?;
    let routing_key: Option<String> = field(amqp, "routing_key", r.routing_key)?;
    let kafka_key: Option<String> = field(kafka, "kafka_key", r.kafka_key)?;
    let kafka_key_b64: Option<String> = field(kafka, "kafka_key_b64", r.kafka_key_b64)?;
    let topic: Option<String> = field(kafka, "topic", r.topic)?;
    if let Some(why) = topic.as_deref().and_then(kafka_topic_problem) {
        return Err(format!("topic: {why}"));
    }
    let kafka_key = match (kafka_key, kafka_key_b64) {
        (Some(text), None) => Some(text.into_bytes()),
        (None, Some(encoded)) => Some(b64("kafka_key_b64", &encoded)?),
        (None, None) => None,
        (Some(_), Some(_)) => return Err("give `kafka_key` or `kafka_key_b64`, not both".into()),
    };
    let headers = parse_headers(r.headers, amqp)?;
    if expiration_ms.is_some_and(|ms| ms > u64::from(u32::MAX)) {
        return Err(format!(
            "expiration_ms: at most {} (about 49 days)",
            u32::MAX
        ));
    }
    if r.id.as_deref() == Some("") {
        return Err("id: must not be empty".into());
    }
    for (field, value) in [
        ("content_type", &r.content_type),
        ("content_encoding", &r.content_encoding),
        ("correlation_id", &r.correlation_id),
        ("reply_to", &reply_to),
        ("type", &kind),
        ("app_id", &app_id),
        ("id", &r.id),
        ("routing_key", &routing_key),
    ] {
        if value.as_ref().is_some_and(|v| v.len() > SHORT) {
            return Err(format!("{field}: longer than {SHORT} bytes"));
        }
    }
    Ok(Envelope {
        body,
        properties: Properties {
            headers,
            content_type: r.content_type,
            content_encoding: r.content_encoding,
            correlation_id: r.correlation_id,
            reply_to,
            kind,
            priority,
            expiration_ms,
            timestamp,
            app_id,
            id: r.id,
            routing_key,
            kafka_key,
            topic,
            expires_at_ms: r.expires_at_ms,
            url,
        },
    })
}

/// An envelope's headers, checked: no CC or BCC for AMQP, values a string, a whole number
/// or a boolean, names of at most [`SHORT`] bytes, at most [`MAX_HEADER_BYTES`] in all.
fn parse_headers(
    raw: serde_json::Map<String, serde_json::Value>,
    amqp: bool,
) -> Result<Vec<(String, HeaderValue)>, String> {
    let mut headers = Vec::with_capacity(raw.len());
    let mut header_bytes = 0;
    for (name, value) in raw {
        // RabbitMQ's sender-selected distribution: these route copies to other queues.
        if amqp && (name.eq_ignore_ascii_case("CC") || name.eq_ignore_ascii_case("BCC")) {
            return Err(format!(
                "headers.{name}: CC and BCC route copies to other queues and are not accepted"
            ));
        }
        let value = match value {
            serde_json::Value::String(s) => HeaderValue::Text(s),
            serde_json::Value::Bool(b) => HeaderValue::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => HeaderValue::Int(i),
                None => return Err(format!("headers.{name}: only whole numbers")),
            },
            _ => {
                return Err(format!(
                    "headers.{name}: must be a string, a whole number or a boolean"
                ))
            }
        };
        if name.len() > SHORT {
            return Err(format!("headers: a name is longer than {SHORT} bytes"));
        }
        header_bytes += name.len()
            + match &value {
                HeaderValue::Text(s) => s.len(),
                _ => 8,
            };
        if header_bytes > MAX_HEADER_BYTES {
            return Err(format!(
                "headers: more than {MAX_HEADER_BYTES} bytes of names and values"
            ));
        }
        headers.push((name, value));
    }
    Ok(headers)
}

/// Why `name` cannot be a Kafka topic, if it cannot: Kafka's rule is 1 to 249 of
/// `[A-Za-z0-9._-]`, and not `.` or `..`.
pub(crate) fn kafka_topic_problem(name: &str) -> Option<&'static str> {
    let valid = (1..=249).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    (!valid).then_some("a Kafka topic: 1 to 249 of A-Z, a-z, 0-9, `.`, `_`, `-`")
}

/// Whether `key` matches an AMQP topic pattern: words split on `.`, `*` is exactly one
/// word, `#` zero or more.
pub(crate) fn topic_match(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => go(&p[1..], k) || (!k.is_empty() && go(p, &k[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &k[1..]),
            (Some(w), Some(x)) if w == x => go(&p[1..], &k[1..]),
            _ => false,
        }
    }
    // As RabbitMQ splits them: the empty key (or pattern) has no words at all.
    fn words(s: &str) -> Vec<&str> {
        if s.is_empty() {
            Vec::new()
        } else {
            s.split('.').collect()
        }
    }
    go(&words(pattern), &words(key))
}

#[cfg(test)]
mod tests;
