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
//! A [`Sealer`]'s counter is strictly increasing and follows the wall clock
//! in units of [`TICK_NS`] (1,024 ns): each datagram gets
//! `max(previous + 1, now / TICK_NS)`. While a sender sends less than one
//! datagram per tick (a million a second), its counter tracks its clock, so
//! a restarted sender starts above everything its earlier incarnation sent
//! (unless the clock was set back by more than the time it ran — then its
//! datagrams are refused as replays until the counter passes the old one;
//! counted by the receiver).
//!
//! The [`Opener`] keeps one [`ReplayWindow`] per sender: the highest
//! counter accepted and a bitmap of the [`WINDOW`] counters below it, so a
//! datagram overtaken by up to 4,096 later ones, or by about 4 ms of later
//! traffic, is still accepted once; a counter seen before, or below the
//! window, is refused.
//! - Senders known in advance (replicas) have a window each for good; their
//!   counters may be at most `max_age` old by the receiver's clock.
//! - Other senders (clients) share a table of at most `max_senders`
//!   windows. Their counters must lie within `max_age` in the past and
//!   `max_future` in the future of the receiver's clock, and a sender
//!   without a window must present a counter above the table's **floor**:
//!   the receiver's start (less `max_future`, the clock skew allowed), raised
//!   to the top of every window evicted. So neither an eviction nor a
//!   restart of the receiver lets an old datagram in again.

use crate::key::Key;
use std::collections::HashMap;

/// Bytes of the truncated tag.
pub const TAG_LEN: usize = 16;
/// Bytes of the counter.
pub const COUNTER_LEN: usize = 8;
/// Bytes a sealed datagram carries after the protocol's bytes.
pub const TRAILER_LEN: usize = COUNTER_LEN + TAG_LEN;
/// Counters a [`ReplayWindow`] remembers below its highest.
pub const WINDOW: u64 = 4096;
/// Nanoseconds per counter tick (counters follow the clock in these units).
pub const TICK_NS: u64 = 1024;
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
    /// A counter too far from the receiver's clock (in ticks), or not above
    /// the floor a new sender must pass.
    #[error("stale datagram (counter {counter}, receiver clock {now} ticks)")]
    Stale {
        /// The datagram's counter.
        counter: u64,
        /// The receiver's clock, in ticks.
        now: u64,
    },
    /// Too many senders hold recent windows: a new one cannot be tracked.
    #[error("too many senders to track")]
    Busy,
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
    /// A sealer whose first counter is the clock (in ticks) at its first seal.
    pub fn new(key: Key) -> Sealer {
        Sealer { key, last: 0 }
    }

    /// Appends the trailer to `datagram` (the protocol's bytes); returns the
    /// counter used. `now_unix_ns` is the wall clock; `context` is bound to
    /// the MAC but not sent (the receiver must supply the same).
    pub fn seal(&mut self, datagram: &mut Vec<u8>, now_unix_ns: u64, context: &[u8]) -> u64 {
        let counter = (self.last + 1).max(now_unix_ns / TICK_NS);
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayWindow {
    top: u64,
    bits: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow { top: 0, bits: [0; WORDS] }
    }
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
                self.clear(self.top + 1, counter);
            }
            self.top = counter;
        }
        self.set(counter);
    }

    /// The highest counter accepted (0: none).
    pub fn top(&self) -> u64 {
        self.top
    }

    fn bit(&self, c: u64) -> bool {
        let i = (c % WINDOW) as usize;
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Clears the bits of counters `from..=to` (fewer than [`WINDOW`]), a
    /// word at a time: a sender quiet for a while has skipped many ticks.
    fn clear(&mut self, from: u64, to: u64) {
        debug_assert!(from <= to && to - from < WINDOW);
        let mut c = from;
        while c <= to {
            let i = (c % WINDOW) as usize;
            let (word, bit) = (i / 64, i % 64);
            // WINDOW is a multiple of 64: a word never wraps around.
            let n = (64 - bit).min((to - c + 1) as usize);
            let mask = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << bit };
            self.bits[word] &= !mask;
            c += n as u64;
        }
    }

    fn set(&mut self, c: u64) {
        let i = (c % WINDOW) as usize;
        self.bits[i / 64] |= 1 << (i % 64);
    }
}

/// Verifies sealed datagrams of a set of senders under one key (see the
/// module docs for the bounds).
#[derive(Debug)]
pub struct Opener {
    key: Key,
    /// Windows of senders `0..known.len()`, kept for good.
    known: Vec<ReplayWindow>,
    /// Windows of other senders, with the receiver clock (ticks) of their last use.
    others: HashMap<u64, (ReplayWindow, u64)>,
    max_others: usize,
    /// Counters older than this many ticks are refused (0: no bound).
    max_age: u64,
    /// Counters more than this many ticks ahead are refused (0: no bound).
    max_future: u64,
    /// A sender without a window must present a counter above this.
    floor: u64,
}

impl Opener {
    /// Accepts senders `0..senders` only (replicas), one window each; with
    /// `max_age_ns` > 0, refuses counters older than that by the receiver's
    /// clock.
    pub fn for_peers(key: Key, senders: usize, max_age_ns: u64) -> Opener {
        Opener {
            key,
            known: vec![ReplayWindow::default(); senders],
            others: HashMap::new(),
            max_others: 0,
            max_age: max_age_ns / TICK_NS,
            max_future: 0,
            floor: 0,
        }
    }

    /// Accepts any sender (clients) whose counter lies between `max_age_ns`
    /// before and `max_future_ns` after the receiver's clock, remembering
    /// at most `max_senders` windows; `now_unix_ns` is the receiver's start
    /// (the first floor, less `max_future_ns`).
    pub fn for_clients(
        key: Key,
        max_senders: usize,
        max_age_ns: u64,
        max_future_ns: u64,
        now_unix_ns: u64,
    ) -> Opener {
        assert!(max_senders > 0 && max_age_ns > 0 && max_future_ns > 0, "client opener bounds are positive");
        Opener {
            key,
            known: Vec::new(),
            others: HashMap::new(),
            max_others: max_senders,
            max_age: max_age_ns / TICK_NS,
            max_future: max_future_ns / TICK_NS,
            floor: now_unix_ns.saturating_sub(max_future_ns) / TICK_NS,
        }
    }

    /// Senders whose windows are held.
    pub fn windows(&self) -> usize {
        self.known.len() + self.others.len()
    }

    /// Verifies `datagram` (protocol bytes and trailer) from `sender` — a
    /// sender id taken from inside the MACed bytes — with `context` (bound
    /// to the MAC, not sent), and records its counter; returns the protocol
    /// bytes' length. A refused datagram changes nothing.
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
        let now = now_unix_ns / TICK_NS;
        let too_old = self.max_age > 0 && counter < now.saturating_sub(self.max_age);
        let too_new = self.max_future > 0 && counter > now.saturating_add(self.max_future);
        if too_old || too_new {
            return Err(OpenError::Stale { counter, now });
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
            *used = now;
            return Ok(body.len());
        }
        if counter <= self.floor {
            return Err(OpenError::Replayed(counter));
        }
        if self.others.len() >= self.max_others {
            // The least recently used window goes, and the floor rises to
            // its top: whatever that sender sent before stays out. A window
            // used within max_age is kept (a flood of new senders, which
            // needs the key, is refused rather than evicting live ones).
            let (oldest, (window, used)) = self
                .others
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(s, w)| (*s, w.clone()))
                .expect("the table is full");
            if now.saturating_sub(used) <= self.max_age {
                return Err(OpenError::Busy);
            }
            self.others.remove(&oldest);
            self.floor = self.floor.max(window.top());
            if counter <= self.floor {
                return Err(OpenError::Replayed(counter));
            }
        }
        let mut window = ReplayWindow::default();
        window.record(counter);
        self.others.insert(sender, (window, now));
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
        let d = sealed(&mut s, b"hello", 1000 * TICK_NS);
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
        let old = sealed(&mut s, b"old", 1_000 * TICK_NS);
        let mut restarted = Opener::for_peers(key(), 1, 500 * TICK_NS);
        assert!(matches!(restarted.open(0, &old, 10_000 * TICK_NS, b"to 1"), Err(OpenError::Stale { .. })));
        let fresh = sealed(&mut s, b"new", 9_900 * TICK_NS);
        assert!(restarted.open(0, &fresh, 10_000 * TICK_NS, b"to 1").is_ok());
    }

    #[test]
    fn counters_follow_the_clock_and_never_go_back() {
        let mut s = Sealer::new(key());
        assert_eq!(s.seal(&mut vec![], 100 * TICK_NS, b""), 100);
        assert_eq!(s.seal(&mut vec![], 100 * TICK_NS, b""), 101);
        assert_eq!(s.seal(&mut vec![], 50 * TICK_NS, b""), 102, "clock went back");
        assert_eq!(s.seal(&mut vec![], 5000 * TICK_NS + 5, b""), 5000);
    }

    #[test]
    fn a_restarted_sender_is_accepted_and_its_old_datagrams_are_not() {
        let mut o = Opener::for_peers(key(), 1, 0);
        let mut first = Sealer::new(key());
        let old = sealed(&mut first, b"old", 1_000 * TICK_NS);
        assert!(o.open(0, &old, 0, b"to 1").is_ok());
        let mut second = Sealer::new(key()); // later incarnation, later clock
        let new = sealed(&mut second, b"new", 9_000 * TICK_NS);
        assert!(o.open(0, &new, 0, b"to 1").is_ok());
        assert_eq!(o.open(0, &old, 0, b"to 1"), Err(OpenError::Replayed(1_000)));
    }

    #[test]
    fn client_windows_are_bounded_and_evictions_or_restarts_let_no_replay_in() {
        const SEC: u64 = 1_000_000_000;
        let boot = 1_000 * SEC;
        let (age, future) = (120 * SEC, 5 * SEC);
        let mut o = Opener::for_clients(key(), 4, age, future, boot);
        // Sent before the receiver started (more than the skew allowed): refused.
        let mut early = Sealer::new(key());
        let before = sealed(&mut early, b"before", boot - 10 * SEC);
        assert_eq!(o.open(99, &before, boot, b"to 1"), Err(OpenError::Replayed((boot - 10 * SEC) / TICK_NS)));
        // Four clients fill the table; a fifth is refused while they are recent.
        let mut kept = Vec::new();
        for client in 0..4u64 {
            let d = sealed(&mut Sealer::new(key()), &client.to_be_bytes(), boot + client * SEC);
            assert!(o.open(client, &d, boot + client * SEC, b"to 1").is_ok());
            kept.push(d);
        }
        let fifth = sealed(&mut Sealer::new(key()), b"fifth", boot + 5 * SEC);
        assert_eq!(o.open(4, &fifth, boot + 5 * SEC, b"to 1"), Err(OpenError::Busy));
        // Much later, the oldest window goes; the floor keeps its datagram out.
        let later = boot + 200 * SEC;
        let fresh = sealed(&mut Sealer::new(key()), b"fresh", later);
        assert!(o.open(4, &fresh, later, b"to 1").is_ok());
        assert!(o.windows() <= 4);
        assert!(o.open(0, &kept[0], later, b"to 1").is_err(), "an evicted sender's old datagram");
        // Within max_age and still held: refused as a replay.
        let now = boot + 3 * SEC + 10;
        assert_eq!(o.open(3, &kept[3], now, b"to 1"), Err(OpenError::Replayed((boot + 3 * SEC) / TICK_NS)));
        // Too far in the future, or too old: stale.
        let ahead = sealed(&mut Sealer::new(key()), b"ahead", later + 60 * SEC);
        assert!(matches!(o.open(7, &ahead, later, b"to 1"), Err(OpenError::Stale { .. })));
        let old = sealed(&mut Sealer::new(key()), b"old", later - 130 * SEC);
        assert!(matches!(o.open(8, &old, later, b"to 1"), Err(OpenError::Stale { .. })));
        // A restarted receiver (new floor) refuses what was sent before it.
        let mut restarted = Opener::for_clients(key(), 4, age, future, later + 30 * SEC);
        assert!(restarted.open(4, &fresh, later + 30 * SEC, b"to 1").is_err());
    }

    #[test]
    fn datagrams_reordered_by_milliseconds_are_each_accepted_once() {
        let mut s = Sealer::new(key());
        let start = 1_000_000_000u64;
        // One datagram every 100 µs for 3 ms, delivered in reverse.
        let batch: Vec<Vec<u8>> = (0..30).map(|i| sealed(&mut s, b"x", start + i * 100_000)).collect();
        let mut o = Opener::for_peers(key(), 1, 0);
        for d in batch.iter().rev() {
            assert!(o.open(0, d, start, b"to 1").is_ok());
        }
        for d in &batch {
            assert!(o.open(0, d, start, b"to 1").is_err());
        }
    }

    proptest! {
        /// Any arrival order of distinct counters within the window is
        /// accepted exactly once each; duplicates never.
        #[test]
        fn window_accepts_each_counter_once(mut counters in proptest::collection::vec(1u64..12_000, 1..300)) {
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
