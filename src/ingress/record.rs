//! A Kafka record made into what the bridge stores: the envelope that produces it later with its key and headers (to its own topic if it names one), its id (topic/partition/offset), and when it is due.

use base64::Engine;
use serde_json::{Map, Value};

use super::delay::{self, Raw, HEADER_DELAY, HEADER_DELAY_TOPIC, HEADER_DELAY_UNTIL};
use super::message::Incoming;
use crate::envelope;

/// Where a record was read: its id is `topic/partition/offset`, the same whoever reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    /// The ingress topic.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
}

/// The record's value, key and headers as an envelope, with its id and due time. Header
/// values are kept as text (base64 when not UTF-8; a null value as `""`); of several headers
/// with one name, the last. `x-delay-topic` becomes the envelope's `topic` (a value that is
/// not UTF-8 or null cannot name a topic and is refused as `bad_envelope`).
pub(crate) fn incoming(
    at: At<'_>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
) -> Incoming {
    let header = |name: &str| {
        headers
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| match v.map(std::str::from_utf8) {
                Some(Ok(text)) => Raw::Text(text),
                Some(Err(_)) => Raw::Other("byte string"),
                None => Raw::Other("null"),
            })
    };
    let due = delay::due(header(HEADER_DELAY), header(HEADER_DELAY_UNTIL));
    let topic = headers
        .iter()
        .rev()
        .find(|(n, _)| *n == HEADER_DELAY_TOPIC)
        .map(|(_, v)| String::from_utf8_lossy(v.unwrap_or_default()).into_owned());
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut e = Map::new();
    let value = value.unwrap_or_default();
    match std::str::from_utf8(value) {
        Ok(text) => e.insert("body".into(), text.into()),
        Err(_) => e.insert("body_b64".into(), b64(value).into()),
    };
    match key.map(|k| (k, std::str::from_utf8(k))) {
        Some((_, Ok(text))) => e.insert("kafka_key".into(), text.into()),
        Some((k, Err(_))) => e.insert("kafka_key_b64".into(), b64(k).into()),
        None => None,
    };
    let kept: Map<String, Value> = headers
        .iter()
        .filter(|(name, _)| ![HEADER_DELAY, HEADER_DELAY_UNTIL, HEADER_DELAY_TOPIC].contains(name))
        .map(|(name, v)| {
            let text = match v.map(|v| (v, std::str::from_utf8(v))) {
                Some((_, Ok(t))) => t.to_string(),
                Some((v, Err(_))) => b64(v),
                None => String::new(),
            };
            (name.to_string(), Value::String(text))
        })
        .collect();
    if !kept.is_empty() {
        e.insert("headers".into(), Value::Object(kept));
    }
    if let Some(topic) = &topic {
        e.insert("topic".into(), topic.clone().into());
    }
    let id = format!("{}/{}/{}", at.topic, at.partition, at.offset);
    e.insert("id".into(), id.clone().into());
    let envelope = Value::Object(e).to_string().into_bytes();
    let refused = envelope::parse(&envelope, envelope::Broker::Kafka).err();
    Incoming {
        id: id.into_bytes(),
        envelope,
        due,
        refused,
        topic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::delay::Due;

    const AT: At<'static> = At {
        topic: "orders.delayed",
        partition: 2,
        offset: 41,
    };

    #[test]
    fn a_record_keeps_its_key_value_and_headers_and_is_named_by_its_place() {
        let headers = [
            ("x-delay", Some(&b"1500"[..])),
            ("traceparent", Some(&b"00-ab"[..])),
            ("raw", Some(&b"\xff"[..])),
            ("none", None),
            ("dup", Some(&b"1"[..])),
            ("dup", Some(&b"2"[..])),
        ];
        let i = incoming(AT, Some(b"customer-9"), Some(b"\x00\xff"), &headers);
        assert_eq!(i.id, b"orders.delayed/2/41");
        assert_eq!(i.due, Ok(Due::In(1500)));
        let e = i.taken(envelope::Broker::Kafka);
        assert_eq!(e.body, b"\x00\xff");
        let p = &e.properties;
        assert_eq!(p.kafka_key.as_deref(), Some(&b"customer-9"[..]));
        assert_eq!(p.id.as_deref(), Some("orders.delayed/2/41"));
        let text = |n: &str| {
            p.headers
                .iter()
                .find(|(h, _)| h == n)
                .map(|(_, v)| v.to_text())
        };
        assert_eq!(text("traceparent").as_deref(), Some("00-ab"));
        assert_eq!(text("raw").as_deref(), Some("/w=="));
        assert_eq!(text("none").as_deref(), Some(""));
        assert_eq!(text("dup").as_deref(), Some("2"));
        assert_eq!(text("x-delay"), None);
        assert_eq!((i.topic, p.topic.as_deref()), (None, None));
    }

    #[test]
    fn x_delay_topic_becomes_the_envelopes_topic_and_is_not_passed_on() {
        let headers = [
            ("x-delay-topic", Some(&b"first"[..])),
            ("x-delay-topic", Some(&b"orders.eu"[..])),
            ("tenant", Some(&b"t-1"[..])),
        ];
        let i = incoming(AT, Some(b"k"), Some(b"v"), &headers);
        assert_eq!(i.topic.as_deref(), Some("orders.eu"), "the last one");
        let e = i.taken(envelope::Broker::Kafka);
        assert_eq!(e.properties.topic.as_deref(), Some("orders.eu"));
        let names: Vec<&str> = e
            .properties
            .headers
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["tenant"]);
        for bad in [None, Some(&b"\xff"[..]), Some(&b""[..]), Some(&b"a b"[..])] {
            let i = incoming(AT, None, None, &[("x-delay-topic", bad)]);
            let why = i.refused.unwrap_or_default();
            assert!(why.starts_with("topic: a Kafka topic"), "{bad:?}: {why}");
        }
    }

    #[test]
    fn delays_and_missing_values() {
        let until = [("x-delay-until", Some(&b"1700000000000"[..]))];
        let i = incoming(AT, None, None, &until);
        assert_eq!(i.due, Ok(Due::At(1_700_000_000_000)));
        let e = envelope::parse(&i.envelope, envelope::Broker::Kafka).unwrap();
        assert_eq!((e.body.len(), e.properties.kafka_key), (0, None));
        let bad = [("x-delay", Some(&b"soon"[..]))];
        assert!(incoming(AT, None, None, &bad).due.is_err());
        let null = [("x-delay", None)];
        assert!(incoming(AT, None, None, &null)
            .due
            .unwrap_err()
            .contains("null"));
    }
}
