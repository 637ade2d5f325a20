//! Unit tests of the envelope's parser, its schema and the AMQP topic patterns.

use super::*;

#[test]
fn a_full_envelope_parses_and_the_body_stays_byte_exact() {
    let e = parse(
        br#"{"body_b64":"/wD+Cg==","headers":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","n":3,"ok":true},
            "content_type":"application/octet-stream","correlation_id":"c-1","priority":5,
            "expiration_ms":60000,"id":"order-7","routing_key":"orders.eu","kafka_key":"k",
            "expires_at_ms":1700000000000,"type":"order.created","reply_to":"replies"}"#,
        Broker::Amqp,
    )
    .unwrap();
    assert_eq!(e.body, vec![0xff, 0x00, 0xfe, b'\n']);
    let p = &e.properties;
    let header = |name: &str| {
        p.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("traceparent"),
        Some(HeaderValue::Text(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()
        ))
    );
    assert_eq!(header("n"), Some(HeaderValue::Int(3)));
    assert_eq!(header("ok"), Some(HeaderValue::Bool(true)));
    assert_eq!(p.priority, Some(5));
    assert_eq!(p.kafka_key, None, "a Kafka field, skipped for AMQP");
    assert_eq!(p.expires_at_ms, Some(1_700_000_000_000));
    assert_eq!(p.kind.as_deref(), Some("order.created"));
    assert_eq!(
        parse(br#"{"body":"hi"}"#, Broker::Kafka).unwrap().body,
        b"hi"
    );
}

#[test]
fn malformed_envelopes_say_why() {
    for (raw, why) in [
        (&b"not json"[..], "expected"),
        (br#"{"headers":{}}"#, "missing `body`"),
        (br#"{"body":"a","body_b64":"YQ=="}"#, "not both"),
        (br#"{"body_b64":"%%%"}"#, "not base64"),
        (br#"{"body":"a","priority":300}"#, "u8"),
        (br#"{"body":"a","headers":{"x":[1]}}"#, "headers.x"),
        (br#"{"body":"a","colour":"red"}"#, "unknown field"),
        (br#"{"body":"a","headers":{"f":1.5}}"#, "whole numbers"),
        (br#"{"body":"a","headers":{"BCC":"q"}}"#, "BCC"),
        (
            br#"{"body":"a","expiration_ms":5000000000}"#,
            "expiration_ms",
        ),
        (br#"{"body":"a","id":""}"#, "id"),
    ] {
        let e = parse(raw, Broker::Amqp).unwrap_err();
        assert!(e.contains(why), "{}: {e}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn the_other_brokers_fields_are_skipped_without_being_decoded() {
    let amqp_only = br#"{"body":"a","reply_to":1,"type":[],"priority":300,
        "expiration_ms":"soon","routing_key":{},"headers":{"CC":"q"},"timestamp":-1,"app_id":2}"#;
    let kafka_only = br#"{"body":"a","kafka_key":7,"kafka_key_b64":"%%%"}"#;
    let e = parse(amqp_only, Broker::Kafka).unwrap();
    assert_eq!(
        e.properties,
        Properties {
            headers: vec![("CC".into(), HeaderValue::Text("q".into()))],
            ..Properties::default()
        }
    );
    assert_eq!(
        parse(kafka_only, Broker::Amqp).unwrap().properties,
        Properties::default()
    );
    // Each is still read, and refused, for its own broker.
    for (raw, field) in [(&amqp_only[..], "reply_to"), (&kafka_only[..], "kafka_key")] {
        let broker = if field == "reply_to" {
            Broker::Amqp
        } else {
            Broker::Kafka
        };
        assert!(parse(raw, broker).unwrap_err().contains(field));
    }
    let key = br#"{"body":"a","kafka_key_b64":"eA=="}"#;
    let e = parse(key, Broker::Kafka).unwrap();
    assert_eq!(e.properties.kafka_key.as_deref(), Some(&b"x"[..]));
}

#[test]
fn the_json_schema_lists_exactly_the_fields_the_parser_takes() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../schema/envelope.schema.json")).unwrap();
    let properties = schema["properties"].as_object().unwrap();
    assert_eq!(properties.len(), 19);
    for (name, spec) in properties {
        let sample = match spec["type"].as_str() {
            Some("integer") => serde_json::json!(1),
            Some("object") => serde_json::json!({"traceparent": "00-x"}),
            _ if name.ends_with("_b64") => serde_json::json!("eA=="),
            _ => serde_json::json!("x"),
        };
        let mut e = serde_json::Map::new();
        if name != "body" && name != "body_b64" {
            e.insert("body".into(), serde_json::json!("x"));
        }
        e.insert(name.clone(), sample);
        let raw = serde_json::Value::Object(e).to_string();
        assert!(
            parse(raw.as_bytes(), Broker::Amqp).is_ok(),
            "{raw}: {:?}",
            parse(raw.as_bytes(), Broker::Amqp)
        );
    }
}

#[test]
fn a_kafka_envelope_may_name_a_valid_topic() {
    let e = parse(br#"{"body":"a","topic":"orders.eu_1-x"}"#, Broker::Kafka).unwrap();
    assert_eq!(e.properties.topic.as_deref(), Some("orders.eu_1-x"));
    for bad in ["", ".", "..", "a b", "ordres/eu"] {
        let raw = serde_json::json!({"body": "a", "topic": bad}).to_string();
        let why = parse(raw.as_bytes(), Broker::Kafka).unwrap_err();
        assert!(why.starts_with("topic: a Kafka topic"), "{bad:?}: {why}");
        assert_eq!(
            parse(raw.as_bytes(), Broker::Amqp)
                .unwrap()
                .properties
                .topic,
            None
        );
    }
    let long = serde_json::json!({"body": "a", "topic": "t".repeat(250)}).to_string();
    assert!(parse(long.as_bytes(), Broker::Kafka).is_err());
    assert!(parse(br#"{"body":"a","topic":7}"#, Broker::Kafka)
        .unwrap_err()
        .starts_with("topic:"));
}

#[test]
fn an_http_envelope_reads_its_url_and_skips_the_brokers_fields() {
    let raw = br#"{"body":"a","url":"https://hooks.internal/x","routing_key":{},"kafka_key":7}"#;
    let e = parse(raw, Broker::Http).unwrap();
    assert_eq!(
        e.properties.url.as_deref(),
        Some("https://hooks.internal/x")
    );
    assert_eq!(e.properties.routing_key, None);
    assert_eq!(
        parse(raw, Broker::Amqp).err(),
        Some("routing_key: invalid type: map, expected a string".into())
    );
    assert_eq!(
        parse(br#"{"body":"a","url":"x"}"#, Broker::Kafka)
            .unwrap()
            .properties
            .url,
        None
    );
    assert!(parse(br#"{"body":"a","url":7}"#, Broker::Http)
        .unwrap_err()
        .contains("url"));
    let long = serde_json::json!({"body": "a", "url": "x".repeat(MAX_URL + 1)}).to_string();
    assert!(parse(long.as_bytes(), Broker::Http)
        .unwrap_err()
        .contains("url"));
}

#[test]
fn headers_are_bounded_to_fit_one_amqp_frame() {
    let big = "x".repeat(MAX_HEADER_BYTES);
    let raw = serde_json::json!({"body": "a", "headers": {"h": big}}).to_string();
    assert!(parse(raw.as_bytes(), Broker::Amqp)
        .unwrap_err()
        .contains("bytes"));
    let fits = "x".repeat(MAX_HEADER_BYTES - 1);
    let raw = serde_json::json!({"body": "a", "headers": {"h": fits}}).to_string();
    assert!(parse(raw.as_bytes(), Broker::Amqp).is_ok());
}

#[test]
fn topic_patterns_match_like_rabbitmq() {
    assert!(topic_match("orders.*", "orders.eu"));
    assert!(!topic_match("orders.*", "orders.eu.paid"));
    assert!(topic_match("orders.#", "orders"));
    assert!(topic_match("orders.#", "orders.eu.paid"));
    assert!(topic_match("#", ""));
    assert!(!topic_match("*", ""), "the empty key has no word for `*`");
    assert!(topic_match("", ""));
    assert!(topic_match("*.paid", "eu.paid"));
    assert!(!topic_match("billing.*", "orders.eu"));
    assert!(topic_match("exact", "exact"));
}
