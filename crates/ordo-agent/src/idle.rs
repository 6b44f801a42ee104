//! Idle strategies: what a runner thread does after a duty cycle that found
//! no work (Agrona's `IdleStrategy`, crossbeam's `Backoff`).
//!
//! The strategy is a pure state machine, [`Idler`]: it is told how much work
//! each duty cycle did and answers with an [`IdleAction`]. The runner
//! ([`AgentLoop`](crate::AgentLoop)) carries the action out; parking follows
//! the doorbell protocol of [`ordo_fabric::Doorbell`].
//!
//! # Why spin first
//! Waking a thread parked on a futex costs about **40 µs on this VM** (a few
//! µs on bare metal): the ringer's `futex_wake` syscall, the scheduler and the
//! wakee's context switch. A message that arrives while the poller spins is
//! seen in well under a microsecond. So the hot path spins, then yields, and
//! parks only once the member has really gone idle; any work resets the
//! backoff to spinning.
//!
//! # When threads outnumber cores: hand the core off
//! Spinning assumes the thread that will produce the work runs on another
//! core. When a host's polling threads outnumber its cores (three member
//! processes on two cores, `ordo demo`), the member a round waits on is
//! often runnable but not running, and every idle spin keeps it off the
//! core; the scheduler's time slice (milliseconds) then paces the total
//! order. [`IdleStrategy::HAND_OFF`] yields almost at once instead, so the
//! waiting member gets the core within a duty cycle — `ordo demo` went
//! from 15 % to 86-97 % of the same group in one process (measured on a
//! 2-vCPU VM; see BENCHMARKS.md). [`IdleStrategy::for_threads_on_host`]
//! picks it when the threads that poll on this host exceed its CPUs.
//!
//! # Invariants
//! - Any duty cycle with work resets the backoff (spins, yields, timeout).
//! - [`IdleStrategy::BackoffPark`] never busy-spins without bound: after
//!   `spins + yields` idle cycles every idle cycle parks, with a timeout of at
//!   least [`IdleStrategy::MIN_PARK`], doubling from `park_min` to
//!   `park_max`.
//! - No park lasts longer than `park_max`, so a runner re-checks its agents
//!   (timers, agents with no doorbell) at least every `park_max`.

use std::time::Duration;

/// What a runner thread does when its agents are idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStrategy {
    /// Never give the core up: lowest latency, one full core per thread.
    BusySpin,
    /// Spin for `spins` idle duty cycles, then `yield` the core on every idle
    /// cycle. Still burns CPU when idle, but lets other threads run.
    SpinThenYield {
        /// Idle duty cycles spent spinning before yielding.
        spins: u32,
    },
    /// Spin for `spins` idle cycles, yield for `yields` more, then park on the
    /// agent's doorbell with a timeout doubling from `park_min` to
    /// `park_max`. An idle member then costs (almost) no CPU, and a write
    /// landing wakes it through the doorbell.
    BackoffPark {
        /// Idle duty cycles spent spinning.
        spins: u32,
        /// Idle duty cycles spent yielding after the spins.
        yields: u32,
        /// First park timeout (raised to [`IdleStrategy::MIN_PARK`] if below).
        park_min: Duration,
        /// Longest park timeout (raised to `park_min` if below).
        park_max: Duration,
    },
}

impl IdleStrategy {
    /// The shortest park timeout a [`BackoffPark`](Self::BackoffPark) uses,
    /// whatever `park_min` says: a zero timeout would be an unbounded spin
    /// through syscalls.
    pub const MIN_PARK: Duration = Duration::from_micros(1);

    /// The default: `BackoffPark { spins: 200, yields: 50, park_min: 20 µs,
    /// park_max: 1 ms }` (the same as the config defaults).
    pub const DEFAULT: IdleStrategy = IdleStrategy::BackoffPark {
        spins: 200,
        yields: 50,
        park_min: Duration::from_micros(20),
        park_max: Duration::from_millis(1),
    };

    /// For hosts whose polling threads outnumber their cores (see the module
    /// docs): `BackoffPark { spins: 10, yields: 100, park_min: 20 µs,
    /// park_max: 500 µs }`.
    pub const HAND_OFF: IdleStrategy = IdleStrategy::BackoffPark {
        spins: 10,
        yields: 100,
        park_min: Duration::from_micros(20),
        park_max: Duration::from_micros(500),
    };

    /// [`HAND_OFF`](Self::HAND_OFF) when `threads` polling threads on this
    /// host outnumber its online CPUs, else `otherwise`.
    pub fn for_threads_on_host(threads: usize, otherwise: IdleStrategy) -> IdleStrategy {
        if Self::crowded(threads) { Self::HAND_OFF } else { otherwise }
    }

    /// Whether `threads` polling threads outnumber this host's online CPUs
    /// (the rule [`for_threads_on_host`](Self::for_threads_on_host) applies;
    /// for callers whose crowded strategy is not `HAND_OFF`).
    pub fn crowded(threads: usize) -> bool {
        threads > online_cpus()
    }

    /// The longest a thread with this strategy sleeps before re-checking its
    /// agents; `None` for strategies that never park.
    pub fn park_max(&self) -> Option<Duration> {
        match *self {
            IdleStrategy::BackoffPark { park_min, park_max, .. } => {
                Some(park_max.max(park_min).max(Self::MIN_PARK))
            }
            _ => None,
        }
    }
}

/// Online CPUs of this host (at least 1).
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for IdleStrategy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What to do after an idle duty cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleAction {
    /// A spin-loop hint, then the next duty cycle.
    Spin,
    /// `std::thread::yield_now`, then the next duty cycle.
    Yield,
    /// Park on the doorbell (prepare, re-check, park) for at most this long.
    Park(Duration),
}

impl IdleAction {
    /// Carries out `Spin` and `Yield`; `Park` needs a doorbell and a re-check
    /// and is done by the [`AgentLoop`](crate::AgentLoop).
    #[inline]
    pub fn spin_or_yield(self) {
        match self {
            IdleAction::Spin => std::hint::spin_loop(),
            IdleAction::Yield => std::thread::yield_now(),
            IdleAction::Park(_) => {}
        }
    }
}

/// The state of an [`IdleStrategy`] on one thread: how far the backoff got.
#[derive(Clone, Debug)]
pub struct Idler {
    strategy: IdleStrategy,
    spins_done: u32,
    yields_done: u32,
    next_park: Duration,
}

impl Idler {
    /// A fresh idler (backoff reset) for `strategy`.
    pub fn new(strategy: IdleStrategy) -> Self {
        let mut idler = Idler { strategy, spins_done: 0, yields_done: 0, next_park: Duration::ZERO };
        idler.reset();
        idler
    }

    /// The strategy this idler follows.
    pub fn strategy(&self) -> IdleStrategy {
        self.strategy
    }

    /// Back to the start of the backoff (spinning, shortest park).
    #[inline]
    pub fn reset(&mut self) {
        self.spins_done = 0;
        self.yields_done = 0;
        self.next_park = match self.strategy {
            IdleStrategy::BackoffPark { park_min, .. } => park_min.max(IdleStrategy::MIN_PARK),
            _ => Duration::ZERO,
        };
    }

    /// Told how much work a duty cycle did, answers what to do next: `None`
    /// after work (the backoff is reset; run the next cycle at once), else
    /// the idle action.
    #[inline]
    pub fn idle(&mut self, work_count: usize) -> Option<IdleAction> {
        if work_count > 0 {
            self.reset();
            return None;
        }
        let action = match self.strategy {
            IdleStrategy::BusySpin => IdleAction::Spin,
            IdleStrategy::SpinThenYield { spins } => {
                if self.spins_done < spins {
                    self.spins_done += 1;
                    IdleAction::Spin
                } else {
                    IdleAction::Yield
                }
            }
            IdleStrategy::BackoffPark { spins, yields, .. } => {
                if self.spins_done < spins {
                    self.spins_done += 1;
                    IdleAction::Spin
                } else if self.yields_done < yields {
                    self.yields_done += 1;
                    IdleAction::Yield
                } else {
                    let timeout = self.next_park;
                    let park_max = self.strategy.park_max().expect("BackoffPark parks");
                    self.next_park = (timeout * 2).min(park_max);
                    debug_assert!(timeout >= IdleStrategy::MIN_PARK && timeout <= park_max);
                    IdleAction::Park(timeout)
                }
            }
        };
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn busy_spin_always_spins() {
        let mut idler = Idler::new(IdleStrategy::BusySpin);
        for _ in 0..1000 {
            assert_eq!(idler.idle(0), Some(IdleAction::Spin));
        }
        assert_eq!(idler.idle(3), None);
    }

    #[test]
    fn spin_then_yield_spins_then_yields_and_resets_on_work() {
        let mut idler = Idler::new(IdleStrategy::SpinThenYield { spins: 3 });
        for _ in 0..2 {
            for _ in 0..3 {
                assert_eq!(idler.idle(0), Some(IdleAction::Spin));
            }
            for _ in 0..10 {
                assert_eq!(idler.idle(0), Some(IdleAction::Yield));
            }
            assert_eq!(idler.idle(1), None);
        }
    }

    #[test]
    fn backoff_park_goes_spins_yields_parks_doubling_to_max_and_resets() {
        let strategy = IdleStrategy::BackoffPark { spins: 2, yields: 3, park_min: us(10), park_max: us(70) };
        let mut idler = Idler::new(strategy);
        for _ in 0..2 {
            let actions: Vec<_> = (0..10).map(|_| idler.idle(0).unwrap()).collect();
            use IdleAction::*;
            assert_eq!(
                actions,
                [
                    Spin,
                    Spin,
                    Yield,
                    Yield,
                    Yield,
                    Park(us(10)),
                    Park(us(20)),
                    Park(us(40)),
                    Park(us(70)),
                    Park(us(70))
                ]
            );
            assert_eq!(idler.idle(5), None, "work resets");
        }
    }

    #[test]
    fn backoff_park_never_parks_for_zero_or_beyond_max() {
        let strategy = IdleStrategy::BackoffPark {
            spins: 0,
            yields: 0,
            park_min: Duration::ZERO,
            park_max: Duration::ZERO,
        };
        let mut idler = Idler::new(strategy);
        for _ in 0..5 {
            assert_eq!(idler.idle(0), Some(IdleAction::Park(IdleStrategy::MIN_PARK)));
        }
        let inverted = IdleStrategy::BackoffPark { spins: 0, yields: 0, park_min: us(50), park_max: us(5) };
        assert_eq!(inverted.park_max(), Some(us(50)));
        let mut idler = Idler::new(inverted);
        assert_eq!(idler.idle(0), Some(IdleAction::Park(us(50))));
        assert_eq!(idler.idle(0), Some(IdleAction::Park(us(50))));
    }
}
