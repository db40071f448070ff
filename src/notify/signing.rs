//! Standard Webhooks v1 signatures.
//!
//! A secret is `whsec_` followed by the base64 of 24 to 64 random bytes; the HMAC key is the
//! decoded bytes. A signature is `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")),
//! where `timestamp` is the `webhook-timestamp` header (Unix seconds of the attempt).
//! The secret never appears in logs or `Debug` output.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Fewest and most random bytes a secret may hold (the specification's range).
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// A webhook signing secret, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret {
    key: Vec<u8>,
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(redacted)")
    }
}

impl FromStr for WebhookSecret {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let encoded = text.strip_prefix(SECRET_PREFIX).ok_or_else(|| {
            format!("a webhook secret starts with `{SECRET_PREFIX}` (Standard Webhooks format)")
        })?;
        let key = BASE64
            .decode(encoded)
            .map_err(|error| format!("the part after `{SECRET_PREFIX}` is not base64: {error}"))?;
        if !SECRET_BYTES.contains(&key.len()) {
            return Err(format!(
                "a webhook secret holds {} to {} random bytes, this one {}",
                SECRET_BYTES.start(),
                SECRET_BYTES.end(),
                key.len()
            ));
        }
        Ok(Self { key })
    }
}

impl WebhookSecret {
    /// The `webhook-signature` header value for one attempt.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // `new_from_slice` accepts a key of any length for HMAC; the length was checked at parse.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector published with the Standard Webhooks specification (and its reference
    /// libraries).
    #[test]
    fn signs_the_specification_test_vector() {
        let secret: WebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let signature = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn refuses_secrets_outside_the_format() {
        let refused = |text: &str| text.parse::<WebhookSecret>().unwrap_err();
        assert!(refused("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").contains("whsec_"));
        assert!(refused("whsec_not*base64").contains("base64"));
        // 23 bytes: one short.
        let short = format!("whsec_{}", BASE64.encode([7u8; 23]));
        assert!(refused(&short).contains("24 to 64"));
        let long = format!("whsec_{}", BASE64.encode([7u8; 65]));
        assert!(refused(&long).contains("24 to 64"));
        let longest = format!("whsec_{}", BASE64.encode([7u8; 64]));
        assert!(longest.parse::<WebhookSecret>().is_ok());
    }

    #[test]
    fn debug_output_hides_the_key() {
        let secret: WebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        assert_eq!(format!("{secret:?}"), "WebhookSecret(redacted)");
    }
}
