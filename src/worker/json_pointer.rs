//! A message's own routing key or URL, read at a JSON Pointer in its payload.

use crate::sink::PublishError;

/// The string at JSON Pointer `pointer` in a JSON payload: a per-message routing key.
pub(super) fn routing_key_at(payload: &[u8], pointer: &str) -> Result<String, PublishError> {
    string_at(payload, pointer, 255)
}

/// The string at JSON Pointer `pointer` in a JSON payload: a per-message HTTP URL.
pub(super) fn url_at(payload: &[u8], pointer: &str) -> Result<String, PublishError> {
    string_at(payload, pointer, crate::envelope::MAX_URL)
}

/// The string of at most `max` bytes at `pointer` in a JSON payload.
fn string_at(payload: &[u8], pointer: &str, max: usize) -> Result<String, PublishError> {
    let value: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| PublishError::BadPayload(format!("not JSON: {e}")))?;
    match value.pointer(pointer) {
        Some(serde_json::Value::String(s)) if s.len() <= max => Ok(s.clone()),
        Some(serde_json::Value::String(_)) => Err(PublishError::BadPayload(format!(
            "{pointer} is longer than {max} bytes"
        ))),
        Some(_) => Err(PublishError::BadPayload(format!(
            "{pointer} is not a string"
        ))),
        None => Err(PublishError::BadPayload(format!("{pointer} is missing"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::blame::Fault;

    #[test]
    fn routing_keys_come_from_the_pointer() {
        assert_eq!(
            routing_key_at(br#"{"type":"a.b"}"#, "/type").unwrap(),
            "a.b"
        );
        assert_eq!(routing_key_at(br#"{"m":{"k":"x"}}"#, "/m/k").unwrap(), "x");
        for bad in [
            &b"not json"[..],
            br#"{"type":1}"#,
            br#"{"other":"x"}"#,
            b"\xff",
        ] {
            let e = routing_key_at(bad, "/type").unwrap_err();
            assert_eq!(e.reason(), "bad_payload");
            assert_eq!(e.fault(), Fault::Unfit);
        }
    }
}
