//! Authentication for every ordo port: the cluster secret, keys derived
//! from it, a mutual challenge-response for stream set-up, and per-datagram
//! MACs with a replay window for datagram protocols.
//!
//! Built on well-kept crates (`hmac` + `sha2` for HMAC-SHA-256, `getrandom`
//! for nonces, `zeroize` for secret bytes); nothing here is a new primitive.
//!
//! # Invariants
//! - **A secret never leaves its [`Secret`]**: it is read from a file or an
//!   environment variable (never a command-line argument), its `Debug` and
//!   `Display` print `<redacted>`, its bytes are zeroed on drop, and a file
//!   readable by group or others is refused.
//! - **One key per purpose.** Every use derives its own [`Key`] from the
//!   secret with a distinct label ([`Secret::derive`]), so a MAC made for
//!   one protocol (or one role of a handshake) is never valid for another.
//! - **Every tag comparison is constant-time** (`hmac`'s `verify_*`).
//! - **Handshakes are fresh and mutual** ([`handshake`]): each side sends a
//!   random 16-byte nonce and proves the key over both nonces and both
//!   hellos, with a role label, so neither a replayed nor a reflected proof
//!   verifies.
//! - **A sealed datagram is accepted at most once** ([`datagram`]): its MAC
//!   covers every byte before the tag (header, payload, counter), counters
//!   are strictly increasing per sender, and the receiver's [`ReplayWindow`]
//!   refuses a counter it saw or one older than its window. Receiver memory
//!   is bounded: one window per known sender, and a fixed number of windows
//!   for senders not known in advance (clients), evicted oldest-first, with
//!   a floor that keeps an evicted sender's (or, after a restart, anyone's)
//!   old datagrams out.

#![warn(missing_docs)]

pub mod datagram;
pub mod handshake;
mod key;
mod secret;

pub use datagram::{OpenError, Opener, ReplayWindow, Sealer, TAG_LEN, TRAILER_LEN};
pub use key::Key;
pub use secret::{MIN_SECRET_LEN, Secret, SecretError, SecretSource};
