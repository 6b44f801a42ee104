//! Keys derived from the secret, and the MAC they make.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use zeroize::Zeroizing;

type HmacSha256 = Hmac<Sha256>;

/// A 32-byte HMAC-SHA-256 key for one purpose (see [`Secret::derive`](crate::Secret::derive)).
///
/// It keeps the HMAC state already keyed (the inner and outer pads
/// absorbed), so each MAC costs only the message's blocks; the key bytes
/// themselves are zeroed as soon as the state is made.
#[derive(Clone)]
pub struct Key {
    keyed: HmacSha256,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Key {
    pub(crate) fn derive(secret: &[u8], label: &str) -> Key {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
        mac.update(b"ordo key v1\0");
        mac.update(label.as_bytes());
        let bytes: Zeroizing<[u8; 32]> = Zeroizing::new(mac.finalize().into_bytes().into());
        Key { keyed: HmacSha256::new_from_slice(&*bytes).expect("32-byte key") }
    }

    /// A MAC computation under this key (feed it with `update`).
    pub fn mac(&self) -> MacState {
        MacState { mac: self.keyed.clone() }
    }

    /// HMAC-SHA-256 of the concatenation of `parts`.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut m = self.mac();
        for part in parts {
            m.update(part);
        }
        m.finish()
    }

    /// Whether `tag` (32 bytes, or a left-truncated tag of at least 16) is
    /// the MAC of `parts`; the comparison is constant-time.
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        let mut m = self.mac();
        for part in parts {
            m.update(part);
        }
        m.verify(tag)
    }
}

/// An HMAC computation in progress.
pub struct MacState {
    mac: HmacSha256,
}

impl MacState {
    /// Feeds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.mac.update(bytes);
    }

    /// The full 32-byte tag.
    pub fn finish(self) -> [u8; 32] {
        self.mac.finalize().into_bytes().into()
    }

    /// Constant-time check of a full or left-truncated (≥ 16 bytes) tag.
    pub fn verify(self, tag: &[u8]) -> bool {
        match tag.len() {
            32 => self.mac.verify_slice(tag).is_ok(),
            16..32 => self.mac.verify_truncated_left(tag).is_ok(),
            _ => false,
        }
    }
}
