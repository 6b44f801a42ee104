//! Mutual challenge-response for stream protocols.
//!
//! ```text
//! dialer                                   acceptor
//!   HELLO_d (…, nonce_d)          ──────▶
//!                                 ◀──────  HELLO_a (…, nonce_a), PROOF_a
//!   PROOF_d                       ──────▶
//! PROOF_a = HMAC(K, "acceptor" ‖ len ‖ HELLO_d ‖ len ‖ HELLO_a)
//! PROOF_d = HMAC(K, "dialer"   ‖ len ‖ HELLO_d ‖ len ‖ HELLO_a)
//! ```
//! `K` is the protocol's key ([`Secret::derive`](crate::Secret::derive)),
//! the nonces are 16 fresh random bytes each, and each hello is the
//! protocol's whole encoded hello frame (so every field of it, ids and
//! incarnations included, is bound to the proof).
//!
//! Why it holds: the acceptor's proof covers the dialer's fresh nonce, the
//! dialer's covers the acceptor's, so a captured handshake replayed to
//! either side fails; the role label makes a proof useless in the other
//! direction (reflection); the acceptor applies nothing before PROOF_d has
//! verified, and the dialer sends PROOF_d only after PROOF_a verified.

use crate::key::Key;

/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (a full HMAC-SHA-256 tag).
pub const PROOF_LEN: usize = 32;

/// Which side of a handshake made a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that opened the connection.
    Dialer,
    /// The side that accepted it.
    Acceptor,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Dialer => b"ordo handshake dialer",
            Role::Acceptor => b"ordo handshake acceptor",
        }
    }
}

/// 16 fresh random bytes from the operating system.
pub fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).expect("the operating system's random source works");
    n
}

/// The proof `role` sends, over both hellos.
pub fn proof(key: &Key, role: Role, dialer_hello: &[u8], acceptor_hello: &[u8]) -> [u8; PROOF_LEN] {
    let (a, b) = lengths(dialer_hello, acceptor_hello);
    key.tag(&[role.label(), &a, dialer_hello, &b, acceptor_hello])
}

/// Whether `proof` is the proof `role` must send (constant-time).
pub fn verify(key: &Key, role: Role, dialer_hello: &[u8], acceptor_hello: &[u8], proof: &[u8]) -> bool {
    let (a, b) = lengths(dialer_hello, acceptor_hello);
    proof.len() == PROOF_LEN && key.verify(&[role.label(), &a, dialer_hello, &b, acceptor_hello], proof)
}

fn lengths(d: &[u8], a: &[u8]) -> ([u8; 4], [u8; 4]) {
    ((d.len() as u32).to_be_bytes(), (a.len() as u32).to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;

    fn key(s: &[u8]) -> Key {
        Secret::from_bytes(s).unwrap().derive("test handshake")
    }

    #[test]
    fn a_proof_verifies_only_for_its_role_key_and_hellos() {
        let k = key(b"0123456789abcdef0123");
        let (d, a) = (b"hello from dialer".as_slice(), b"hello from acceptor".as_slice());
        let p = proof(&k, Role::Acceptor, d, a);
        assert!(verify(&k, Role::Acceptor, d, a, &p));
        assert!(!verify(&k, Role::Dialer, d, a, &p), "reflected proof");
        assert!(!verify(&key(b"another secret of 16+"), Role::Acceptor, d, a, &p), "wrong secret");
        assert!(!verify(&k, Role::Acceptor, b"hello from dialer!", a, &p), "other dialer hello");
        assert!(!verify(&k, Role::Acceptor, d, b"hello from acceptoR", &p), "other acceptor hello");
        assert!(!verify(&k, Role::Acceptor, d, a, &p[..31]), "short proof");
        let mut bad = p;
        bad[0] ^= 1;
        assert!(!verify(&k, Role::Acceptor, d, a, &bad));
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn labels_separate_keys() {
        let s = Secret::from_bytes(b"0123456789abcdef").unwrap();
        let (a, b) = (s.derive("one"), s.derive("two"));
        assert_ne!(a.tag(&[b"x"]), b.tag(&[b"x"]));
    }
}
