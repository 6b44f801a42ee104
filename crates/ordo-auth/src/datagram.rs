//! Per-datagram MACs with a replay window, for datagram protocols.
//!
//! # Wire format
//! A sealed datagram is the protocol's bytes followed by a 24-byte trailer:
//! ```text
//! +-------------------------+---------------------+-------------------------------+
//! | protocol bytes (header, | counter: u64, big-  | tag: HMAC-SHA-256(K, context ‖|
//! | payload)                | endian              | protocol bytes ‖ counter)[..16]|
//! +-------------------------+---------------------+-------------------------------+
//! ```
//! The protocol marks sealed datagrams itself (R2P2: a header flag) and
//! names the sender inside the MACed bytes (R2P2: the header's client id),
//! so the sender's identity is authenticated with everything else. The
//! `context` is not sent: both sides supply it (R2P2 RAFT: the destination
//! replica's id, length-prefixed), so a datagram sealed for one receiver
//! does not verify at another.
//!
//! # Counters and the replay window
//! A [`Sealer`]'s counter is strictly increasing: each datagram gets
//! `max(previous + 1, now)` with `now` the wall clock in nanoseconds since
//! the Unix epoch. A restarted sender therefore starts above everything its
//! earlier incarnation sent (unless the clock was set back by more than the
//! time it ran — then its datagrams are refused as replays until the
//! counter passes the old one; logged and counted by the receiver).
//!
//! The [`Opener`] keeps one [`ReplayWindow`] per sender: the highest
//! counter accepted and a bitmap of the [`WINDOW`] counters below it. A
//! counter seen before, or below the window, is refused; datagrams
//! reordered by less than the window are accepted once each.
//! Senders known in advance (replicas) have a window each for good. Other
//! senders (clients) share a table of at most `max_senders` windows,
//! evicted least-recently-used; their counters must also lie within
//! `max_age` of the receiver's clock, so a datagram replayed after its
//! sender's window was evicted is still refused.

use crate::key::Key;
use std::collections::HashMap;

/// Bytes of the truncated tag.
pub const TAG_LEN: usize = 16;
/// Bytes of the counter.
pub const COUNTER_LEN: usize = 8;
/// Bytes a sealed datagram carries after the protocol's bytes.
pub const TRAILER_LEN: usize = COUNTER_LEN + TAG_LEN;
/// Counters a [`ReplayWindow`] remembers below its highest.
pub const WINDOW: u64 = 1024;
const WORDS: usize = (WINDOW / 64) as usize;

/// Why a sealed datagram was refused. Each has its own counter at the
/// receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Shorter than a trailer.
    #[error("datagram too short for its authentication trailer")]
    Truncated,
    /// The tag does not verify: forged, corrupted, or made with another secret.
    #[error("authentication tag does not verify")]
    BadTag,
    /// The counter was accepted before, or is below the sender's window.
    #[error("replayed datagram (counter {0})")]
    Replayed(u64),
    /// A client counter too far from the receiver's clock.
    #[error("stale datagram (counter {counter}, receiver clock {now})")]
    Stale {
        /// The datagram's counter.
        counter: u64,
        /// The receiver's clock.
        now: u64,
    },
    /// The sender is not one this opener accepts.
    #[error("unknown sender {0}")]
    UnknownSender(u64),
}

/// Seals datagrams of one sender under one key.
#[derive(Debug)]
pub struct Sealer {
    key: Key,
    last: u64,
}

impl Sealer {
    /// A sealer whose first counter is the clock at its first seal.
    pub fn new(key: Key) -> Sealer {
        Sealer { key, last: 0 }
    }

    /// Appends the trailer to `datagram` (the protocol's bytes); returns the
    /// counter used. `now_unix_ns` is the wall clock; `context` is bound to
    /// the MAC but not sent (the receiver must supply the same).
    pub fn seal(&mut self, datagram: &mut Vec<u8>, now_unix_ns: u64, context: &[u8]) -> u64 {
        let counter = (self.last + 1).max(now_unix_ns);
        debug_assert!(counter > self.last, "counters strictly increase");
        self.last = counter;
        let counter_bytes = counter.to_be_bytes();
        let context_len = (context.len() as u32).to_be_bytes();
        let tag = self.key.tag(&[&context_len, context, datagram, &counter_bytes]);
        datagram.extend_from_slice(&counter_bytes);
        datagram.extend_from_slice(&tag[..TAG_LEN]);
        counter
    }
}

/// Splits a sealed datagram into (protocol bytes, counter, tag).
pub fn split_trailer(datagram: &[u8]) -> Result<(&[u8], u64, &[u8]), OpenError> {
    let body_len = datagram.len().checked_sub(TRAILER_LEN).ok_or(OpenError::Truncated)?;
    let (body, trailer) = datagram.split_at(body_len);
    let counter = u64::from_be_bytes(trailer[..COUNTER_LEN].try_into().expect("8 bytes"));
    Ok((body, counter, &trailer[COUNTER_LEN..]))
}

/// The counters one sender has had accepted (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    top: u64,
    bits: [u64; WORDS],
}

impl ReplayWindow {
    /// Whether `counter` would be accepted (not recorded).
    pub fn check(&self, counter: u64) -> Result<(), OpenError> {
        if counter == 0 {
            return Err(OpenError::Replayed(0));
        }
        if counter > self.top {
            return Ok(());
        }
        if self.top - counter >= WINDOW || self.bit(counter) {
            return Err(OpenError::Replayed(counter));
        }
        Ok(())
    }

    /// Records an accepted `counter` (after [`check`](Self::check) passed).
    pub fn record(&mut self, counter: u64) {
        debug_assert!(self.check(counter).is_ok());
        if counter > self.top {
            if counter - self.top >= WINDOW {
                self.bits = [0; WORDS];
            } else {
                for c in self.top + 1..=counter {
                    self.set(c, false);
                }
            }
            self.top = counter;
        }
        self.set(counter, true);
    }

    /// The highest counter accepted (0: none).
    pub fn top(&self) -> u64 {
        self.top
    }

    fn bit(&self, c: u64) -> bool {
        let i = (c % WINDOW) as usize;
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, c: u64, on: bool) {
        let i = (c % WINDOW) as usize;
        if on {
            self.bits[i / 64] |= 1 << (i % 64);
        } else {
            self.bits[i / 64] &= !(1 << (i % 64));
        }
    }
}

/// Verifies sealed datagrams of a set of senders under one key.
#[derive(Debug)]
pub struct Opener {
    key: Key,
    /// Windows of senders `0..known.len()`, kept for good.
    known: Vec<ReplayWindow>,
    /// Windows of other senders, with the receiver clock of their last use.
    others: HashMap<u64, (ReplayWindow, u64)>,
    max_others: usize,
    /// Counters must lie within this of the receiver's clock (0: no check).
    max_age_ns: u64,
}

impl Opener {
    /// Accepts senders `0..senders` only (replicas), one window each; with
    /// `max_age_ns` > 0, also refuses counters further than that from the
    /// receiver's clock (what keeps old datagrams out of a window that a
    /// restart emptied).
    pub fn for_peers(key: Key, senders: usize, max_age_ns: u64) -> Opener {
        Opener {
            key,
            known: vec![ReplayWindow::default(); senders],
            others: HashMap::new(),
            max_others: 0,
            max_age_ns,
        }
    }

    /// Accepts any sender (clients) whose counter is within `max_age_ns` of
    /// the receiver's clock, remembering at most `max_senders` windows.
    pub fn for_clients(key: Key, max_senders: usize, max_age_ns: u64) -> Opener {
        assert!(max_senders > 0 && max_age_ns > 0, "client opener bounds are positive");
        Opener { key, known: Vec::new(), others: HashMap::new(), max_others: max_senders, max_age_ns }
    }

    /// Senders whose windows are held.
    pub fn windows(&self) -> usize {
        self.known.len() + self.others.len()
    }

    /// Verifies `datagram` (protocol bytes and trailer) from `sender` — a
    /// sender id taken from inside the MACed bytes — and records its
    /// counter; returns the protocol bytes' length. A refused datagram
    /// changes nothing.
    pub fn open(
        &mut self,
        sender: u64,
        datagram: &[u8],
        now_unix_ns: u64,
        context: &[u8],
    ) -> Result<usize, OpenError> {
        let (body, counter, tag) = split_trailer(datagram)?;
        let fixed = !self.known.is_empty() || self.max_others == 0;
        if fixed && sender >= self.known.len() as u64 {
            return Err(OpenError::UnknownSender(sender));
        }
        let context_len = (context.len() as u32).to_be_bytes();
        if !self.key.verify(&[&context_len, context, body, &counter.to_be_bytes()], tag) {
            return Err(OpenError::BadTag);
        }
        if self.max_age_ns > 0 && counter.abs_diff(now_unix_ns) > self.max_age_ns {
            return Err(OpenError::Stale { counter, now: now_unix_ns });
        }
        if fixed {
            let window = &mut self.known[sender as usize];
            window.check(counter)?;
            window.record(counter);
            return Ok(body.len());
        }
        if let Some((window, used)) = self.others.get_mut(&sender) {
            window.check(counter)?;
            window.record(counter);
            *used = now_unix_ns;
            return Ok(body.len());
        }
        if self.others.len() >= self.max_others {
            // Least recently used goes; its old datagrams stay out because
            // they are older than max_age by the time they could matter,
            // or carry counters this sender will never reuse.
            if let Some(oldest) = self.others.iter().min_by_key(|(_, (_, used))| *used).map(|(s, _)| *s) {
                self.others.remove(&oldest);
            }
        }
        let mut window = ReplayWindow::default();
        window.record(counter);
        self.others.insert(sender, (window, now_unix_ns));
        Ok(body.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;
    use proptest::prelude::*;

    fn key() -> Key {
        Secret::from_bytes(b"datagram test secret").unwrap().derive("test datagram")
    }

    fn sealed(sealer: &mut Sealer, body: &[u8], now: u64) -> Vec<u8> {
        let mut d = body.to_vec();
        sealer.seal(&mut d, now, b"to 1");
        d
    }

    #[test]
    fn a_sealed_datagram_opens_once() {
        let mut s = Sealer::new(key());
        let mut o = Opener::for_peers(key(), 3, 0);
        let d = sealed(&mut s, b"hello", 1000);
        assert_eq!(d.len(), 5 + TRAILER_LEN);
        assert_eq!(o.open(1, &d, 0, b"to 1"), Ok(5));
        assert_eq!(o.open(1, &d, 0, b"to 1"), Err(OpenError::Replayed(1000)));
        assert_eq!(o.open(3, &d, 0, b"to 1"), Err(OpenError::UnknownSender(3)));
    }

    #[test]
    fn any_changed_byte_or_other_key_fails_and_changes_nothing() {
        let mut s = Sealer::new(key());
        let d = sealed(&mut s, b"append entries", 7);
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 0x40;
            let mut o = Opener::for_peers(key(), 1, 0);
            assert!(o.open(0, &bad, 0, b"to 1").is_err(), "byte {i}");
            assert_eq!(o.open(0, &d, 0, b"to 1"), Ok(14), "the refusal recorded nothing");
        }
        let other = Secret::from_bytes(b"some other secret!!").unwrap().derive("test datagram");
        assert_eq!(Opener::for_peers(other, 1, 0).open(0, &d, 0, b"to 1"), Err(OpenError::BadTag));
        assert_eq!(Opener::for_peers(key(), 1, 0).open(0, &d[..10], 0, b"to 1"), Err(OpenError::Truncated));
    }

    #[test]
    fn a_datagram_sealed_for_one_receiver_does_not_open_at_another() {
        let mut s = Sealer::new(key());
        let d = sealed(&mut s, b"for replica 1", 5);
        let mut o = Opener::for_peers(key(), 2, 0);
        assert_eq!(o.open(0, &d, 0, b"to 2"), Err(OpenError::BadTag));
        assert_eq!(o.open(0, &d, 0, b"to 1"), Ok(13));
    }

    #[test]
    fn peer_freshness_keeps_old_datagrams_out_of_an_emptied_window() {
        let mut s = Sealer::new(key());
        let old = sealed(&mut s, b"old", 1_000);
        let mut restarted = Opener::for_peers(key(), 1, 500);
        assert!(matches!(restarted.open(0, &old, 10_000, b"to 1"), Err(OpenError::Stale { .. })));
        let fresh = sealed(&mut s, b"new", 9_900);
        assert!(restarted.open(0, &fresh, 10_000, b"to 1").is_ok());
    }

    #[test]
    fn counters_follow_the_clock_and_never_go_back() {
        let mut s = Sealer::new(key());
        assert_eq!(s.seal(&mut vec![], 100, b""), 100);
        assert_eq!(s.seal(&mut vec![], 100, b""), 101);
        assert_eq!(s.seal(&mut vec![], 50, b""), 102, "clock went back");
        assert_eq!(s.seal(&mut vec![], 5000, b""), 5000);
    }

    #[test]
    fn a_restarted_sender_is_accepted_and_its_old_datagrams_are_not() {
        let mut o = Opener::for_peers(key(), 1, 0);
        let mut first = Sealer::new(key());
        let old = sealed(&mut first, b"old", 1_000);
        assert!(o.open(0, &old, 0, b"to 1").is_ok());
        let mut second = Sealer::new(key()); // later incarnation, later clock
        let new = sealed(&mut second, b"new", 9_000);
        assert!(o.open(0, &new, 0, b"to 1").is_ok());
        assert_eq!(o.open(0, &old, 0, b"to 1"), Err(OpenError::Replayed(1_000)));
    }

    #[test]
    fn client_windows_are_bounded_and_stale_counters_refused() {
        let mut o = Opener::for_clients(key(), 4, 1_000_000);
        let now = 10_000_000;
        let mut kept = Vec::new();
        for client in 0..10u64 {
            let mut s = Sealer::new(key());
            let d = sealed(&mut s, &client.to_be_bytes(), now + client);
            assert!(o.open(client, &d, now + client, b"to 1").is_ok());
            kept.push(d);
            assert!(o.windows() <= 4);
        }
        // Client 0's window was evicted; its datagram is replayed long after.
        assert!(matches!(o.open(0, &kept[0], now + 5_000_000, b"to 1"), Err(OpenError::Stale { .. })));
        // Within max_age and still held: refused as a replay.
        assert_eq!(o.open(9, &kept[9], now + 10, b"to 1"), Err(OpenError::Replayed(now + 9)));
    }

    proptest! {
        /// Any arrival order of distinct counters within the window is
        /// accepted exactly once each; duplicates never.
        #[test]
        fn window_accepts_each_counter_once(mut counters in proptest::collection::vec(1u64..3000, 1..300)) {
            let mut w = ReplayWindow::default();
            let mut seen = std::collections::HashSet::new();
            let mut top = 0u64;
            for c in counters.drain(..) {
                let verdict = w.check(c);
                let expect_ok = !seen.contains(&c) && (c > top || top - c < WINDOW);
                prop_assert_eq!(verdict.is_ok(), expect_ok, "counter {} top {}", c, top);
                if verdict.is_ok() {
                    w.record(c);
                    seen.insert(c);
                    top = top.max(c);
                }
            }
        }
    }
}
