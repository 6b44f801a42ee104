//! Time as an input: the [`Clock`] that feeds `now_ns` to agents.

use std::time::Instant;

/// A source of monotonic nanoseconds. The runner reads it once per duty cycle
/// and passes the value to every agent's `do_work`. The simulator supplies
/// its own (virtual) time instead.
pub trait Clock {
    /// Nanoseconds since an arbitrary, fixed origin; never decreases.
    fn now_ns(&self) -> u64;
}

/// The real monotonic clock (`CLOCK_MONOTONIC` through [`Instant`]).
///
/// Clones share the origin, so every thread of one runner reads the same
/// time scale.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        MonotonicClock { origin: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        // u64 nanoseconds last 584 years from the origin.
        self.origin.elapsed().as_nanos() as u64
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_never_goes_back() {
        let clock = MonotonicClock::new();
        let mut last = clock.now_ns();
        for _ in 0..1000 {
            let now = clock.now_ns();
            assert!(now >= last);
            last = now;
        }
    }
}
