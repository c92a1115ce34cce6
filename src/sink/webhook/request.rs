//! Building a webhook request: the body exactly as stored, Standard Webhooks headers
//! (`webhook-id`, `webhook-timestamp`, `webhook-signature`) and `Idempotency-Key`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::config::Secret;

/// The HMAC key for a secret: the base64-decoded bytes after `whsec_` (the Standard Webhooks
/// form), or the secret's own bytes otherwise. `None` if a `whsec_` secret is not base64.
pub fn signing_key(secret: &Secret) -> Option<Vec<u8>> {
    match secret.expose().strip_prefix("whsec_") {
        Some(b64) => STANDARD.decode(b64).ok(),
        None => Some(secret.expose().as_bytes().to_vec()),
    }
}

/// `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`.
pub fn sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks test vector (published with the Standard Webhooks specification).
    #[test]
    fn matches_the_standard_webhooks_test_vector() {
        let key = signing_key(&Secret::new("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")).unwrap();
        let sig = sign(
            &key,
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            br#"{"email":"test@example.com","username":"test_user"}"#,
        );
        assert_eq!(sig, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
    }

    #[test]
    fn plain_secrets_are_raw_key_bytes() {
        assert_eq!(signing_key(&Secret::new("abc")).unwrap(), b"abc");
        assert!(signing_key(&Secret::new("whsec_***")).is_none());
    }
}
