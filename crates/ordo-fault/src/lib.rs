//! Fault-injection points for deterministic simulation.
//!
//! Production code marks a rare path with [`fault!`]:
//!
//! ```
//! # fn push_everything() {} fn push_part() {}
//! if ordo_fault::fault!("ring.send.partial_batch") {
//!     push_part(); // the rare path, exercised on purpose under simulation
//! } else {
//!     push_everything();
//! }
//! ```
//!
//! # Invariants
//! - Without the `enabled` feature, `fault!` expands to a call of a `const fn`
//!   returning `false`: the optimiser removes the branch, so release builds of
//!   a library that does not enable simulation pay nothing.
//! - With the feature (turned on by `ordo-sim`), a fault point fires only on a
//!   thread that has installed an [`Injector`] with [`install`], and only as
//!   often as that injector's probability and its seeded generator decide.
//!   Everywhere else (a real run of a binary that links the simulator) it is a
//!   thread-local read that returns `false`.
//! - Decisions are a pure function of the injector's seed and the sequence of
//!   fault points reached, so a simulation that reaches the same points in the
//!   same order replays exactly.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

/// Marks a rare path. Evaluates to `true` when the simulator decides that this
/// fault point fires now; always `false` outside simulation.
#[macro_export]
macro_rules! fault {
    ($name:expr) => {
        $crate::hit($name)
    };
}

#[cfg(not(feature = "enabled"))]
mod imp {
    /// Outside simulation builds no fault ever fires.
    #[inline(always)]
    pub const fn hit(_name: &'static str) -> bool {
        false
    }
}

#[cfg(feature = "enabled")]
mod imp {
    use super::Injector;
    use std::cell::RefCell;

    thread_local! {
        static INJECTOR: RefCell<Option<Injector>> = const { RefCell::new(None) };
    }

    /// Asks the injector installed on this thread, if any.
    #[inline]
    pub fn hit(name: &'static str) -> bool {
        INJECTOR.with(|cell| match cell.borrow_mut().as_mut() {
            Some(injector) => injector.decide(name),
            None => false,
        })
    }

    pub(super) fn swap(new: Option<Injector>) -> Option<Injector> {
        INJECTOR.with(|cell| std::mem::replace(&mut *cell.borrow_mut(), new))
    }
}

pub use imp::hit;

/// The seeded decision maker behind fault points on one thread.
///
/// Uses SplitMix64 so that a seed gives the same decisions on every platform
/// and every version of ordo's dependencies.
#[derive(Debug, Clone)]
pub struct Injector {
    state: u64,
    /// Probability, in parts per million, that a reached fault point fires.
    pub probability_ppm: u32,
    /// How many times each named point fired (for reports and coverage).
    pub fired: std::collections::BTreeMap<&'static str, u64>,
    /// How many times each named point was reached.
    pub reached: std::collections::BTreeMap<&'static str, u64>,
}

impl Injector {
    /// An injector that fires each reached point with `probability_ppm / 1e6`.
    pub fn new(seed: u64, probability_ppm: u32) -> Self {
        assert!(probability_ppm <= 1_000_000, "probability is in parts per million");
        Injector {
            state: seed ^ 0x6A09_E667_F3BC_C908,
            probability_ppm,
            fired: Default::default(),
            reached: Default::default(),
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Decides whether the point `name` fires now and records it.
    pub fn decide(&mut self, name: &'static str) -> bool {
        *self.reached.entry(name).or_default() += 1;
        let fire = (self.next_u64() % 1_000_000) < u64::from(self.probability_ppm);
        if fire {
            *self.fired.entry(name).or_default() += 1;
        }
        fire
    }
}

/// Installs `injector` on the current thread until the returned guard is
/// dropped (then the previous one, usually none, is restored). Without the
/// `enabled` feature this does nothing and fault points stay off.
pub fn install(injector: Injector) -> InstallGuard {
    #[cfg(feature = "enabled")]
    {
        let previous = imp::swap(Some(injector));
        InstallGuard { previous: Some(previous) }
    }
    #[cfg(not(feature = "enabled"))]
    {
        drop(injector);
        InstallGuard { previous: None }
    }
}

/// Restores the previous injector when dropped; [`InstallGuard::finish`]
/// returns the injector with its counts.
#[must_use = "the injector is removed when the guard is dropped"]
pub struct InstallGuard {
    #[allow(dead_code)]
    previous: Option<Option<Injector>>,
}

impl InstallGuard {
    /// Removes the injector now and returns it (with its fired/reached counts).
    pub fn finish(mut self) -> Option<Injector> {
        self.take()
    }

    fn take(&mut self) -> Option<Injector> {
        #[cfg(feature = "enabled")]
        {
            let previous = self.previous.take()?;
            imp::swap(previous)
        }
        #[cfg(not(feature = "enabled"))]
        {
            None
        }
    }
}

impl Drop for InstallGuard {
    fn drop(&mut self) {
        let _ = self.take();
    }
}

/// Whether fault points are compiled in.
pub const ENABLED: bool = cfg!(feature = "enabled");

#[cfg(test)]
mod tests {
    #[cfg(feature = "enabled")]
    use super::*;

    #[test]
    fn never_fires_without_an_injector() {
        for _ in 0..1000 {
            assert!(!fault!("test.point"));
        }
    }

    #[cfg(feature = "enabled")]
    #[test]
    fn decisions_replay_from_the_seed() {
        let run = |seed| {
            let guard = install(Injector::new(seed, 300_000));
            let v: Vec<bool> = (0..200).map(|_| fault!("test.point")).collect();
            let injector = guard.finish().unwrap();
            assert_eq!(injector.reached["test.point"], 200);
            v
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let fired = run(7).iter().filter(|f| **f).count();
        assert!((30..=90).contains(&fired), "30% of 200 should fire, got {fired}");
        assert!(!fault!("test.point"), "removed when the guard finished");
    }
}
