//! How the API writes members and times in JSON and reads members back: bytes that are not
//! UTF-8 travel as base64, infinite scores as words.

use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use serde_json::{Map, Value};

use super::ApiError;

/// Writes `bytes` as `name` (the text; replacement characters where it is not UTF-8) and,
/// when it is not UTF-8, as `{name}_b64` too: the standard base64 that names it exactly.
pub(super) fn put_bytes(out: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            out.insert(name.into(), Value::from(text));
        }
        Err(_) => {
            out.insert(
                name.into(),
                Value::from(String::from_utf8_lossy(bytes).into_owned()),
            );
            out.insert(format!("{name}_b64"), Value::from(STANDARD.encode(bytes)));
        }
    }
}

/// Writes the epoch-ms time `ms` as `{name}_ms`; a saturated score (`-inf` or `+inf`) is
/// written `null` there and as `{name}`: `"now"` or `"parked"`, never as a huge number.
pub(super) fn put_time(out: &mut Map<String, Value>, name: &str, ms: i64) {
    let word = match ms {
        i64::MIN => Some("now"),
        i64::MAX => Some("parked"),
        _ => None,
    };
    match word {
        Some(word) => {
            out.insert(format!("{name}_ms"), Value::Null);
            out.insert(name.into(), Value::from(word));
        }
        None => {
            out.insert(format!("{name}_ms"), Value::from(ms));
        }
    }
}

/// Decodes base64, standard or URL-safe, padded or not.
pub(super) fn from_b64(text: &str) -> Result<Vec<u8>, ApiError> {
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .or_else(|_| URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')))
        .map_err(|_| ApiError::bad(format!("`{}` is not base64", short(text))))
}

/// The members a call names: `members` as UTF-8 text and `members_b64` as base64 (for
/// members that are not UTF-8), in that order.
pub(super) fn members_of(text: Vec<String>, b64: Vec<String>) -> Result<Vec<Vec<u8>>, ApiError> {
    let mut out: Vec<Vec<u8>> = text.into_iter().map(String::into_bytes).collect();
    for m in &b64 {
        out.push(from_b64(m)?);
    }
    Ok(out)
}

/// The start of `text`, for an error message.
fn short(text: &str) -> String {
    crate::shorten::shorten(text, 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: impl FnOnce(&mut Map<String, Value>)) -> Value {
        let mut m = Map::new();
        f(&mut m);
        Value::Object(m)
    }

    #[test]
    fn bytes_that_are_not_utf8_travel_as_base64_and_come_back() {
        let v = written(|m| put_bytes(m, "member", b"bin-\xff\xfe"));
        assert_eq!(v["member"], "bin-\u{fffd}\u{fffd}");
        assert_eq!(v["member_b64"], "YmluLf/+");
        assert_eq!(from_b64("YmluLf/+").unwrap(), b"bin-\xff\xfe");
        assert_eq!(from_b64("YmluLf_-").unwrap(), b"bin-\xff\xfe");
        assert_eq!(from_b64("YQ").unwrap(), b"a");
        assert!(from_b64("not base64!").is_err());
        let v = written(|m| put_bytes(m, "member", "é".as_bytes()));
        assert_eq!(v, serde_json::json!({ "member": "é" }));
    }

    #[test]
    fn infinite_scores_are_words() {
        let v = written(|m| put_time(m, "due", i64::MIN));
        assert_eq!(v, serde_json::json!({ "due_ms": null, "due": "now" }));
        let v = written(|m| put_time(m, "due", i64::MAX));
        assert_eq!(v, serde_json::json!({ "due_ms": null, "due": "parked" }));
        let v = written(|m| put_time(m, "at", 5));
        assert_eq!(v, serde_json::json!({ "at_ms": 5 }));
    }

    #[test]
    fn members_come_as_text_or_base64() {
        let m = members_of(vec!["a".into()], vec!["/w==".into()]).unwrap();
        assert_eq!(m, vec![b"a".to_vec(), vec![0xff]]);
    }
}
