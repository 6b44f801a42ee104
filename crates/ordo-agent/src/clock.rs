//! Time as an input: the [`Clock`] that feeds `now_ns` to agents.

use std::cell::Cell;

/// A source of monotonic nanoseconds. The runner reads it once per duty cycle
/// and passes the value to every agent's `do_work`. The simulator supplies
/// its own (virtual) time instead.
pub trait Clock {
    /// Nanoseconds since an arbitrary, fixed origin; never decreases.
    fn now_ns(&self) -> u64;
}

/// The real monotonic clock: the CPU's time-stamp counter scaled to
/// `CLOCK_MONOTONIC` nanoseconds where the CPU has an invariant one
/// (`quanta`'s calibrated counter: ~10 ns a read here, where a vDSO
/// `clock_gettime` costs ~25 ns, once per duty cycle), else
/// `CLOCK_MONOTONIC` itself.
///
/// Clones share the origin, so every thread of one runner reads the same
/// time scale. Each clone never goes back: counters of different cores
/// may differ by a little, so a clone keeps the largest value it returned.
#[derive(Clone, Debug)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    /// The raw counter at the origin.
    origin: u64,
    /// The largest value this clone returned.
    last: Cell<u64>,
}

impl MonotonicClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        MonotonicClock { clock, origin, last: Cell::new(0) }
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
        let now = self.clock.delta_as_nanos(self.origin, self.clock.raw()).max(self.last.get());
        self.last.set(now);
        now
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

    /// It keeps time with `std::time::Instant` (within 1 %, over 50 ms).
    #[test]
    fn monotonic_clock_keeps_time() {
        let clock = MonotonicClock::new();
        let (t0, c0) = (std::time::Instant::now(), clock.now_ns());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (real, ours) = (t0.elapsed().as_nanos() as f64, (clock.now_ns() - c0) as f64);
        assert!((ours / real - 1.0).abs() < 0.01, "{ours} ns vs {real} ns");
    }

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
