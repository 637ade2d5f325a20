//! An AMQP delivery made into what the bridge stores: the envelope that publishes it later as it was published, its id, and when it is due.

use base64::Engine;
use lapin::protocol::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::delay::{self, Due, Raw, HEADER_DELAY, HEADER_DELAY_UNTIL};
use crate::envelope;

/// Headers not stored: the delay headers (read, not passed on) and a quorum queue's
/// redelivery count, which changes with every redelivery and would change the digest.
const NOT_STORED: [&str; 3] = [HEADER_DELAY, HEADER_DELAY_UNTIL, "x-delivery-count"];

/// What one delivery becomes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Incoming {
    /// The member: the producer's `message_id`, or the hex SHA-256 of the envelope.
    pub id: Vec<u8>,
    /// The envelope (JSON) to store as the body.
    pub envelope: Vec<u8>,
    /// When it is due, or why that cannot be read (`bad_delay`).
    pub due: Result<Due, String>,
    /// Why the envelope would not publish (`bad_envelope`): the publisher's own check, run
    /// now so the message is refused while the producer's broker still knows it.
    pub refused: Option<String>,
    /// Kafka: the topic the record asked to be produced to (`x-delay-topic`), if any.
    pub topic: Option<String>,
}

#[cfg(test)]
impl Incoming {
    /// The envelope of a message the publisher's check would take, read back as `broker`
    /// reads it.
    pub(crate) fn taken(&self, broker: envelope::Broker) -> envelope::Envelope {
        assert_eq!(self.refused, None);
        envelope::parse(&self.envelope, broker).unwrap()
    }
}

/// The delivery's body, routing key and properties as an envelope, with its id and due time.
pub(crate) fn incoming(body: &[u8], routing_key: &str, props: &BasicProperties) -> Incoming {
    let empty = FieldTable::default();
    let headers = props.headers().as_ref().unwrap_or(&empty);
    let header = |name: &str| headers.inner().get(name).map(raw);
    let due = delay::due(header(HEADER_DELAY), header(HEADER_DELAY_UNTIL));
    let mut e = Map::new();
    match std::str::from_utf8(body) {
        Ok(text) => e.insert("body".into(), text.into()),
        Err(_) => e.insert(
            "body_b64".into(),
            base64::engine::general_purpose::STANDARD
                .encode(body)
                .into(),
        ),
    };
    let kept: Map<String, Value> = headers
        .inner()
        .iter()
        .filter(|(name, _)| !NOT_STORED.contains(&name.as_str()))
        .filter_map(|(name, v)| Some((name.to_string(), header_value(v)?)))
        .collect();
    if !kept.is_empty() {
        e.insert("headers".into(), Value::Object(kept));
    }
    let text = |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.to_string());
    for (field, value) in [
        ("content_type", text(props.content_type())),
        ("content_encoding", text(props.content_encoding())),
        ("correlation_id", text(props.correlation_id())),
        ("reply_to", text(props.reply_to())),
        ("type", text(props.kind())),
        ("app_id", text(props.app_id())),
        ("id", text(props.message_id()).filter(|id| !id.is_empty())),
        ("routing_key", Some(routing_key.to_string())),
    ] {
        if let Some(v) = value {
            e.insert(field.into(), v.into());
        }
    }
    if let Some(p) = props.priority() {
        e.insert("priority".into(), (*p).into());
    }
    if let Some(t) = props.timestamp() {
        e.insert("timestamp".into(), (*t).into());
    }
    // RabbitMQ checks `expiration` on publish: a whole number of milliseconds.
    if let Some(ms) = props
        .expiration()
        .as_ref()
        .and_then(|x| x.as_str().parse::<u64>().ok())
    {
        e.insert("expiration_ms".into(), ms.into());
    }
    let id = match e.get("id").and_then(Value::as_str) {
        Some(id) => id.as_bytes().to_vec(),
        None => digest(&e),
    };
    let envelope = Value::Object(e).to_string().into_bytes();
    let refused = envelope::parse(&envelope, envelope::Broker::Amqp).err();
    Incoming {
        id,
        envelope,
        due,
        refused,
        topic: None,
    }
}

/// The hex SHA-256 of the envelope (body, routing key, properties, headers): the same for
/// every redelivery of one delivery.
fn digest(e: &Map<String, Value>) -> Vec<u8> {
    let hash = Sha256::digest(Value::Object(e.clone()).to_string().as_bytes());
    hash.iter()
        .flat_map(|b| {
            let hex = b"0123456789abcdef";
            [hex[usize::from(b >> 4)], hex[usize::from(b & 0xf)]]
        })
        .collect()
}

/// A delay header's value for [`delay::due`].
fn raw(v: &AMQPValue) -> Raw<'_> {
    match v {
        AMQPValue::ShortShortInt(n) => Raw::Int((*n).into()),
        AMQPValue::ShortShortUInt(n) => Raw::Int((*n).into()),
        AMQPValue::ShortInt(n) => Raw::Int((*n).into()),
        AMQPValue::ShortUInt(n) => Raw::Int((*n).into()),
        AMQPValue::LongInt(n) => Raw::Int((*n).into()),
        AMQPValue::LongUInt(n) => Raw::Int((*n).into()),
        AMQPValue::LongLongInt(n) => Raw::Int(*n),
        AMQPValue::Timestamp(n) => Raw::Int(i64::try_from(*n).unwrap_or(i64::MAX)),
        AMQPValue::Float(f) => Raw::Float((*f).into()),
        AMQPValue::Double(f) => Raw::Float(*f),
        AMQPValue::ShortString(s) => Raw::Text(s.as_str()),
        AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
            Ok(t) => Raw::Text(t),
            Err(_) => Raw::Other("byte string"),
        },
        AMQPValue::Boolean(_) => Raw::Other("boolean"),
        AMQPValue::DecimalValue(_) => Raw::Other("decimal"),
        AMQPValue::FieldArray(_) => Raw::Other("array"),
        AMQPValue::FieldTable(_) => Raw::Other("table"),
        AMQPValue::ByteArray(_) => Raw::Other("byte array"),
        AMQPValue::Void => Raw::Other("void"),
    }
}

/// A header as the envelope keeps it: strings, whole numbers and booleans as they are;
/// other types as text (numbers written out, arrays and tables as JSON, bytes that are not
/// UTF-8 as base64); a void header is left out.
fn header_value(v: &AMQPValue) -> Option<Value> {
    Some(match json(v)? {
        v @ (Value::String(_) | Value::Bool(_)) => v,
        Value::Number(n) if n.is_i64() => Value::Number(n),
        Value::Number(n) => Value::String(n.to_string()),
        other => Value::String(other.to_string()),
    })
}

/// Any AMQP value as JSON (`None` for void).
fn json(v: &AMQPValue) -> Option<Value> {
    let bytes = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(t) => Value::String(t.to_string()),
        Err(_) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
    };
    Some(match v {
        AMQPValue::Boolean(b) => (*b).into(),
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => (*n).into(),
        AMQPValue::Timestamp(n) => (*n).into(),
        AMQPValue::Float(f) => Value::String(f.to_string()),
        AMQPValue::Double(f) => Value::String(f.to_string()),
        AMQPValue::DecimalValue(d) => Value::String(format!("{}e-{}", d.value, d.scale)),
        AMQPValue::ShortString(s) => s.as_str().into(),
        AMQPValue::LongString(s) => bytes(s.as_bytes()),
        AMQPValue::ByteArray(b) => bytes(b.as_slice()),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().filter_map(json).collect()),
        AMQPValue::FieldTable(t) => Value::Object(
            t.inner()
                .iter()
                .filter_map(|(k, v)| Some((k.to_string(), json(v)?)))
                .collect(),
        ),
        AMQPValue::Void => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldArray, LongString, ShortString};

    fn props() -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), AMQPValue::LongInt(1500));
        h.insert("x-delivery-count".into(), AMQPValue::LongLongInt(2));
        h.insert(
            "traceparent".into(),
            AMQPValue::LongString(LongString::from("00-ab")),
        );
        h.insert("n".into(), AMQPValue::ShortInt(-3));
        h.insert("ok".into(), AMQPValue::Boolean(true));
        h.insert("ratio".into(), AMQPValue::Double(0.5));
        let mut list = FieldArray::default();
        list.push(AMQPValue::LongInt(1));
        h.insert("list".into(), AMQPValue::FieldArray(list));
        BasicProperties::default()
            .with_headers(h)
            .with_content_type(ShortString::from("application/json"))
            .with_correlation_id(ShortString::from("c-1"))
            .with_reply_to(ShortString::from("replies"))
            .with_type(ShortString::from("order.created"))
            .with_app_id(ShortString::from("shop"))
            .with_priority(5)
            .with_timestamp(1_700_000_000)
            .with_expiration(ShortString::from("60000"))
    }

    #[test]
    fn a_delivery_becomes_an_envelope_that_publishes_as_it_was_published() {
        let props = props().with_message_id(ShortString::from("order-7"));
        let i = incoming(b"{\"n\":1}", "orders.eu", &props);
        assert_eq!(i.id, b"order-7");
        assert_eq!(i.due, Ok(Due::In(1500)));
        let e = i.taken(envelope::Broker::Amqp);
        assert_eq!(e.body, b"{\"n\":1}");
        let p = &e.properties;
        assert_eq!(p.routing_key.as_deref(), Some("orders.eu"));
        assert_eq!(p.id.as_deref(), Some("order-7"));
        assert_eq!(p.content_type.as_deref(), Some("application/json"));
        assert_eq!(p.correlation_id.as_deref(), Some("c-1"));
        assert_eq!(p.reply_to.as_deref(), Some("replies"));
        assert_eq!(p.kind.as_deref(), Some("order.created"));
        assert_eq!(p.app_id.as_deref(), Some("shop"));
        assert_eq!(p.priority, Some(5));
        assert_eq!(p.timestamp, Some(1_700_000_000));
        assert_eq!(p.expiration_ms, Some(60_000));
        let names: Vec<&str> = p.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["list", "n", "ok", "ratio", "traceparent"]);
        let get = |n: &str| p.headers.iter().find(|(h, _)| h == n).unwrap().1.clone();
        assert_eq!(get("n"), envelope::HeaderValue::Int(-3));
        assert_eq!(get("ok"), envelope::HeaderValue::Bool(true));
        assert_eq!(get("ratio"), envelope::HeaderValue::Text("0.5".into()));
        assert_eq!(get("list"), envelope::HeaderValue::Text("[1]".into()));
    }

    #[test]
    fn without_a_message_id_the_id_is_a_digest_stable_across_redeliveries() {
        let a = incoming(b"\xff\x00", "k", &props());
        assert_eq!(a.id.len(), 64);
        let mut again = props().headers().clone().unwrap();
        again.insert("x-delivery-count".into(), AMQPValue::LongLongInt(7));
        let b = incoming(b"\xff\x00", "k", &props().with_headers(again));
        assert_eq!(a.id, b.id, "the redelivery count is not part of the id");
        assert_ne!(a.id, incoming(b"\xff\x01", "k", &props()).id);
        assert_ne!(a.id, incoming(b"\xff\x00", "k2", &props()).id);
        let e = envelope::parse(&a.envelope, envelope::Broker::Amqp).unwrap();
        assert_eq!(e.body, b"\xff\x00");
        assert_eq!(e.properties.id, None);
    }

    #[test]
    fn what_would_not_publish_is_refused_now() {
        let mut h = FieldTable::default();
        h.insert("BCC".into(), AMQPValue::LongString("q".into()));
        h.insert("x-delay".into(), AMQPValue::LongString("soon".into()));
        let i = incoming(b"a", "", &BasicProperties::default().with_headers(h));
        assert!(i.refused.unwrap().contains("BCC"));
        assert!(i.due.unwrap_err().contains("not a number"));
    }
}
