//! Simulated time.
//!
//! # Invariants
//! - Time is a count of simulated nanoseconds in a `u64`, starting at 0.
//! - Only the simulator advances it, and never backwards: a process reads it
//!   (through its [`crate::Ctx`]) and cannot change it.
//! - No wall clock is read anywhere in a simulated run, so a run's history is
//!   a function of its seed alone.

/// Nanoseconds per microsecond, for readable constants.
pub const MICROS: u64 = 1_000;
/// Nanoseconds per millisecond.
pub const MILLIS: u64 = 1_000_000;

/// The simulated clock of one world.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct SimClock {
    now_ns: u64,
}

impl SimClock {
    /// A clock at time 0.
    pub fn new() -> SimClock {
        SimClock { now_ns: 0 }
    }

    /// The current simulated time in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Moves the clock to `t_ns`. Panics if that is in the past (a bug in
    /// the scheduler: events are taken in time order).
    pub(crate) fn advance_to(&mut self, t_ns: u64) {
        assert!(t_ns >= self.now_ns, "simulated time went back from {} to {t_ns}", self.now_ns);
        self.now_ns = t_ns;
    }
}
