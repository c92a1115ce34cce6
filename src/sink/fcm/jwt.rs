//! RS256 JSON Web Tokens for the OAuth2 service-account flow, signed with `ring` (already in
//! the tree through rustls). Only signing with our own key happens here; nothing is verified
//! or decrypted.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use serde::Serialize;

/// A service account's RSA private key, ready to sign.
pub struct RsaSigner {
    key: RsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for RsaSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RsaSigner([REDACTED])")
    }
}

impl RsaSigner {
    /// Parses a PEM key: PKCS#8 (`BEGIN PRIVATE KEY`, what Google issues) or PKCS#1
    /// (`BEGIN RSA PRIVATE KEY`). `None` if it is neither (the error never echoes the key).
    pub fn from_pem(pem: &str) -> Option<RsaSigner> {
        let (der, pkcs8) = if let Some(der) = pem_body(pem, "PRIVATE KEY") {
            (der, true)
        } else {
            (pem_body(pem, "RSA PRIVATE KEY")?, false)
        };
        let key = if pkcs8 {
            RsaKeyPair::from_pkcs8(&der).ok()?
        } else {
            RsaKeyPair::from_der(&der).ok()?
        };
        Some(RsaSigner {
            key,
            rng: SystemRandom::new(),
        })
    }

    /// `base64url(header).base64url(claims).base64url(RS256 signature)`.
    pub fn sign<C: Serialize>(&self, key_id: Option<&str>, claims: &C) -> Option<String> {
        let header = match key_id {
            Some(kid) => serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": kid}),
            None => serde_json::json!({"alg": "RS256", "typ": "JWT"}),
        };
        let mut token = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).ok()?);
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).ok()?));
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &self.rng, token.as_bytes(), &mut sig)
            .ok()?;
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(sig));
        Some(token)
    }
}

/// The DER bytes between `-----BEGIN {label}-----` and `-----END {label}-----`.
fn pem_body(pem: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem.find(&begin)? + begin.len();
    let stop = start + pem[start..].find(&end)?;
    let b64: String = pem[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    STANDARD.decode(b64).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_an_rsa_key() {
        assert!(RsaSigner::from_pem("not a key").is_none());
        assert!(
            RsaSigner::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----")
                .is_none()
        );
    }
}
