//! The `x-delay-signature` header: HMAC-SHA256 of the time and the body, so a receiver can check who sent a request and when.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header's name.
pub(crate) const HEADER_SIGNATURE: &str = "x-delay-signature";

/// The header's value for `body` sent at `t_ms` (epoch ms): `t=<t_ms>,v1=<hex>`, where
/// `<hex>` is the lower-case hex HMAC-SHA256, keyed by `secret`, of `<t_ms>.` followed by
/// the body's bytes.
pub(crate) fn sign(secret: &[u8], t_ms: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    let t = t_ms.to_string();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_hmac_of_time_dot_body() {
        // Python's hmac.new(b"secret", b'1700000000000.{"a":1}', hashlib.sha256).hexdigest()
        let v = sign(b"secret", 1_700_000_000_000, br#"{"a":1}"#);
        assert_eq!(
            v,
            "t=1700000000000,v1=4ef2732b0d632a6897af3a6d02a6de287f60d6c5f15dabdb0ceb045a34e3c5a7"
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        mac.update(br#"1700000000000.{"a":1}"#);
        let expected = hex::encode(mac.finalize().into_bytes());
        assert_eq!(v, format!("t=1700000000000,v1={expected}"));
        assert_ne!(v, sign(b"other", 1_700_000_000_000, br#"{"a":1}"#));
        assert_ne!(v, sign(b"secret", 1_700_000_000_001, br#"{"a":1}"#));
    }
}
