//! One message as an HTTP request: the body byte for byte, the envelope's headers, the bridge's own, and the signature.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::signature::{sign, HEADER_SIGNATURE};
use crate::sink::{OutMessage, PublishError};
use crate::wire::{HEADER_ATTEMPT, HEADER_DUE_MS, HEADER_ID, HEADER_TRIGGER};

/// The message id again, for receivers that de-duplicate by the common header.
pub(crate) const HEADER_IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Names an envelope cannot set: the bridge's own, and those that belong to the connection.
const RESERVED: &[&str] = &[
    HEADER_TRIGGER,
    HEADER_DUE_MS,
    HEADER_ATTEMPT,
    HEADER_ID,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_SIGNATURE,
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
];

/// What a request is made of besides its URL and method.
pub(super) struct Parts {
    /// The envelope's headers, the bridge's own and the signature.
    pub headers: HeaderMap,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

/// The headers and body of `m`'s request; an envelope header that HTTP cannot carry is
/// the message's fault (`bad_envelope`).
pub(super) fn parts(
    trigger: &str,
    m: &OutMessage<'_>,
    secret: Option<&[u8]>,
    now_ms: i64,
) -> Result<Parts, PublishError> {
    let mut headers = HeaderMap::new();
    if let Some(p) = m.properties {
        for (name, value) in &p.headers {
            let lower = name.to_ascii_lowercase();
            if RESERVED.contains(&lower.as_str()) || p.sets_header(&lower) {
                continue;
            }
            let name = HeaderName::from_bytes(lower.as_bytes()).map_err(|_| {
                PublishError::BadEnvelope(format!("headers.{name}: not a valid HTTP header name"))
            })?;
            headers.append(name.clone(), value_of(name.as_str(), &value.to_text())?);
        }
        for (name, value) in p.header_properties() {
            if let Some(value) = value {
                headers.insert(name, value_of(name, value)?);
            }
        }
    }
    let mut due = itoa::Buffer::new();
    let mut attempt = itoa::Buffer::new();
    let id = value_of("id", m.id)?;
    // The names are made at compile time: a `&str` name is checked again on every insert.
    headers.insert(
        const { HeaderName::from_static(HEADER_TRIGGER) },
        value_of(HEADER_TRIGGER, trigger)?,
    );
    headers.insert(
        const { HeaderName::from_static(HEADER_DUE_MS) },
        HeaderValue::from_str(due.format(m.due_ms)).expect("digits"),
    );
    headers.insert(
        const { HeaderName::from_static(HEADER_ATTEMPT) },
        HeaderValue::from_str(attempt.format(m.attempt)).expect("digits"),
    );
    headers.insert(const { HeaderName::from_static(HEADER_ID) }, id.clone());
    headers.insert(
        const { HeaderName::from_static(HEADER_IDEMPOTENCY_KEY) },
        id,
    );
    if let Some(secret) = secret {
        let signature = sign(secret, now_ms, m.payload);
        headers.insert(
            const { HeaderName::from_static(HEADER_SIGNATURE) },
            HeaderValue::from_str(&signature).expect("ascii"),
        );
    }
    Ok(Parts {
        headers,
        body: m.payload.to_vec(),
    })
}

/// `value` as a header value, or the envelope's fault.
fn value_of(field: &str, value: &str) -> Result<HeaderValue, PublishError> {
    HeaderValue::from_str(value)
        .map_err(|_| PublishError::BadEnvelope(format!("{field}: not a valid HTTP header value")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{HeaderValue as Value, Properties};

    fn message<'a>(properties: Option<&'a Properties>) -> OutMessage<'a> {
        OutMessage {
            payload: b"{\"a\":1}",
            member: b"m",
            due_ms: 1000,
            attempt: 2,
            id: "abc",
            routing_key: None,
            properties,
            url: None,
            topic: None,
        }
    }

    #[test]
    fn the_bridge_names_win_and_properties_replace_headers() {
        let p = Properties {
            headers: vec![
                ("X-Delay-Id".into(), Value::Text("forged".into())),
                ("Content-Type".into(), Value::Text("text/plain".into())),
                ("X-Tenant".into(), Value::Int(7)),
                ("Host".into(), Value::Text("evil".into())),
            ],
            content_type: Some("application/json".into()),
            ..Properties::default()
        };
        let parts = parts("t", &message(Some(&p)), Some(b"0123456789abcdef"), 5).unwrap();
        let h = &parts.headers;
        assert_eq!(h["x-delay-id"], "abc");
        assert_eq!(h["idempotency-key"], "abc");
        assert_eq!(h["x-delay-attempt"], "2");
        assert_eq!(h["x-delay-due-ms"], "1000");
        assert_eq!(h["x-delay-trigger"], "t");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h.get_all("content-type").iter().count(), 1);
        assert_eq!(h["x-tenant"], "7");
        assert!(h.get("host").is_none());
        assert!(h["x-delay-signature"]
            .to_str()
            .unwrap()
            .starts_with("t=5,v1="));
        assert_eq!(parts.body, b"{\"a\":1}");
    }

    #[test]
    fn headers_http_cannot_carry_are_bad_envelopes() {
        for (name, value) in [("bad name", "x"), ("x-ok", "line\nbreak")] {
            let p = Properties {
                headers: vec![(name.into(), Value::Text(value.into()))],
                ..Properties::default()
            };
            let e = parts("t", &message(Some(&p)), None, 0).err().unwrap();
            assert_eq!(e.reason(), "bad_envelope");
        }
    }
}
