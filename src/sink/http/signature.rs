//! The `x-delay-signature` header: HMAC-SHA256 of the time and the body, so a receiver can check who sent a request and when.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header's name.
pub const HEADER_SIGNATURE: &str = "x-delay-signature";

/// The header's value for `body` sent at `t_ms` (epoch ms): `t=<t_ms>,v1=<hex>`, where
/// `<hex>` is the lower-case hex HMAC-SHA256, keyed by `secret`, of `<t_ms>.` followed by
/// the body's bytes.
pub fn sign(secret: &[u8], t_ms: i64, body: &[u8]) -> String {
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
        // The same as: printf '1700000000000.{"a":1}' | openssl dgst -sha256 -hmac secret
        let v = sign(b"secret", 1_700_000_000_000, br#"{"a":1}"#);
        let mut mac = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        mac.update(br#"1700000000000.{"a":1}"#);
        let expected = hex::encode(mac.finalize().into_bytes());
        assert_eq!(v, format!("t=1700000000000,v1={expected}"));
        assert_ne!(v, sign(b"other", 1_700_000_000_000, br#"{"a":1}"#));
        assert_ne!(v, sign(b"secret", 1_700_000_000_001, br#"{"a":1}"#));
    }
}
