//! The recorded history of a run and the checkers that judge it.
//!
//! # Invariants
//! - Entries are appended in the order the simulator executed them, so their
//!   times never decrease; each names the member and the incarnation that
//!   recorded it.
//! - Faults the simulator injected (crashes, restarts, partitions, heals) are
//!   recorded alongside, with their times, so checkers can tell which
//!   incarnation was the last and whether everything healed.
//! - A [`Checker`] is a pure function of the history: it reads no simulator
//!   state, so a history can be fed to it directly (tests build bad
//!   histories by hand to prove a checker catches what it should).

use ordo_fabric::MemberId;
use std::hash::{Hash, Hasher};

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry<E> {
    /// Simulated time it was recorded at.
    pub time_ns: u64,
    /// The member that recorded it.
    pub member: MemberId,
    /// That member's incarnation (the first is 1).
    pub incarnation: u64,
    /// What happened.
    pub event: E,
}

/// A fault the simulator injected.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum FaultNote {
    /// A member's current incarnation crashed.
    Crash {
        /// The member.
        member: MemberId,
    },
    /// A member restarted.
    Restart {
        /// The member.
        member: MemberId,
        /// Its new incarnation.
        incarnation: u64,
    },
    /// The pair `a`-`b` was partitioned.
    Cut {
        /// One end.
        a: MemberId,
        /// The other end.
        b: MemberId,
    },
    /// One cut of the pair `a`-`b` healed.
    Heal {
        /// One end.
        a: MemberId,
        /// The other end.
        b: MemberId,
    },
    /// `side` was partitioned from the rest of the group.
    Split {
        /// The members on one side.
        side: Vec<MemberId>,
    },
    /// One split of `side` healed.
    HealSplit {
        /// The members on one side.
        side: Vec<MemberId>,
    },
    /// Faults stopped: every partition healed, every crashed member restarted,
    /// random network faults switched off.
    Calm,
}

/// A fault and when it happened.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FaultRecord {
    /// Simulated time.
    pub time_ns: u64,
    /// The fault.
    pub fault: FaultNote,
}

/// Everything a run recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History<E> {
    /// Number of members (ids `0..members`).
    pub members: u32,
    /// Recorded events in execution order.
    pub entries: Vec<Entry<E>>,
    /// Injected faults in execution order.
    pub faults: Vec<FaultRecord>,
    /// Simulated time at which the run stopped.
    pub end_ns: u64,
}

impl<E> History<E> {
    /// An empty history of a group of `members`.
    pub fn new(members: u32) -> History<E> {
        History { members, entries: Vec::new(), faults: Vec::new(), end_ns: 0 }
    }

    /// Appends an event (times must not decrease).
    pub fn record(&mut self, time_ns: u64, member: MemberId, incarnation: u64, event: E) {
        debug_assert!(self.entries.last().is_none_or(|e| e.time_ns <= time_ns), "history went back in time");
        self.entries.push(Entry { time_ns, member, incarnation, event });
    }

    /// Appends a fault.
    pub fn note(&mut self, time_ns: u64, fault: FaultNote) {
        self.faults.push(FaultRecord { time_ns, fault });
    }

    /// The incarnation `member` ended the run in (1 plus its restarts).
    pub fn final_incarnation(&self, member: MemberId) -> u64 {
        1 + self
            .faults
            .iter()
            .filter(|f| matches!(f.fault, FaultNote::Restart { member: m, .. } if m == member))
            .count() as u64
    }

    /// Whether `member` was alive when the run ended.
    pub fn alive_at_end(&self, member: MemberId) -> bool {
        let mut alive = true;
        for f in &self.faults {
            match f.fault {
                FaultNote::Crash { member: m } if m == member => alive = false,
                FaultNote::Restart { member: m, .. } if m == member => alive = true,
                _ => {}
            }
        }
        alive
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<E: Hash> History<E> {
    /// A 64-bit digest of the whole history (entries and faults), stable for
    /// a given build: two runs with equal digests recorded the same history.
    pub fn digest(&self) -> u64 {
        let mut h = Fnv64::default();
        self.members.hash(&mut h);
        self.entries.hash(&mut h);
        self.faults.hash(&mut h);
        self.end_ns.hash(&mut h);
        h.finish()
    }
}

/// FNV-1a, 64 bits: a fixed hasher (std's `DefaultHasher` may change).
#[derive(Clone, Copy, Debug)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xCBF2_9CE4_8422_2325)
    }
}

impl Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
}

/// FNV-1a of `bytes`.
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h = Fnv64::default();
    h.write(bytes);
    h.finish()
}

/// A property that a history must have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{checker}: {message}")]
pub struct Violation {
    /// The checker that found it.
    pub checker: &'static str,
    /// What is wrong, naming the entries involved.
    pub message: String,
}

impl Violation {
    /// A violation found by `checker`.
    pub fn new(checker: &'static str, message: impl Into<String>) -> Violation {
        Violation { checker, message: message.into() }
    }
}

/// Judges a history after a run.
pub trait Checker<E> {
    /// Short name, shown in failures.
    fn name(&self) -> &'static str;

    /// `Err` with the first violation found.
    fn check(&self, history: &History<E>) -> Result<(), Violation>;
}

/// Runs `checkers` in order; the first violation wins.
pub fn check_all<E>(history: &History<E>, checkers: &[Box<dyn Checker<E>>]) -> Result<(), Violation> {
    checkers.iter().try_for_each(|c| c.check(history))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incarnations_and_liveness_follow_the_fault_notes() {
        let mut h: History<()> = History::new(3);
        h.note(5, FaultNote::Crash { member: 1 });
        assert!(!h.alive_at_end(1));
        h.note(9, FaultNote::Restart { member: 1, incarnation: 2 });
        h.note(10, FaultNote::Crash { member: 1 });
        h.note(11, FaultNote::Restart { member: 1, incarnation: 3 });
        assert_eq!(h.final_incarnation(1), 3);
        assert_eq!(h.final_incarnation(0), 1);
        assert!(h.alive_at_end(1) && h.alive_at_end(2));
    }

    #[test]
    fn digest_sees_every_entry() {
        let mut a: History<u32> = History::new(2);
        a.record(1, 0, 1, 7);
        let mut b = a.clone();
        assert_eq!(a.digest(), b.digest());
        b.record(2, 1, 1, 8);
        a.record(2, 1, 1, 9);
        assert_ne!(a.digest(), b.digest());
        assert_eq!(fnv64(b""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv64(b"a"), 0xAF63_DC4C_8601_EC8C);
    }
}
