//! Workloads: scenarios the simulator runs over many seeds, each with the
//! checkers that judge its histories.
//!
//! # Invariants
//! - A workload is a pure function from a seed (and [`RunOptions`]) to a
//!   [`Scenario`]: its parameters (group size, delays, message counts, fault
//!   plan) are drawn from the seed's scenario stream, so one seed is one
//!   exact run.
//! - Every workload has safety checkers *and* a liveness checker: once the
//!   fault plan calms (everything healed and restarted), progress is
//!   required; a run that stops at its limit without it fails.
//! - Names are unique; the CLI replays a failure with
//!   `ordo sim --workload <name> --seed <N>`.
//!
//! # Adding a workload
//! 1. Write `src/workloads/<name>.rs` with an event type (`Debug + Hash`),
//!    a [`crate::SimProcess`] for one member, a `scenario(seed, opts) ->
//!    Scenario<E>` that draws the parameters and builds the checkers, and
//!    `pub const WORKLOAD: Workload = Workload { name, summary, run }` whose
//!    `run` is `|seed, opts| crate::execute(NAME, seed, opts, scenario(seed, opts))`.
//! 2. Add `pub mod <name>;` below and `<name>::WORKLOAD` to [`REGISTRY`].
//! 3. Add it to the seed tests in `tests/sim.rs` (fresh seeds, pinned seeds,
//!    a bad history for each new checker).
//!
//! Stream-shaped workloads can reuse [`stream`]'s events and checkers.

pub mod datagram_stream;
pub mod fabric_stream;
pub mod ring_multicast;
pub mod stream;

use crate::history::Checker;
use crate::sim::{Factory, FaultPlan, RunLimits};
use crate::world::SimConfig;
use crate::{RunFailure, RunOptions, RunReport};

/// A registered workload.
#[derive(Clone, Copy)]
pub struct Workload {
    /// Name used by the CLI (`--workload`).
    pub name: &'static str,
    /// One line on what it exercises and checks.
    pub summary: &'static str,
    /// Runs one seed and checks it.
    pub run: fn(u64, &RunOptions) -> Result<RunReport, RunFailure>,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload").field("name", &self.name).finish()
    }
}

/// Everything one seeded run of a workload consists of.
pub struct Scenario<E> {
    /// The world: members, delays, limits.
    pub config: SimConfig,
    /// The nemesis' plan (`None`: no partitions, crashes or restarts).
    pub faults: Option<FaultPlan>,
    /// Time and step bounds, and when to stop once quiescent.
    pub limits: RunLimits,
    /// Builds a member's process at start and after each restart.
    pub factory: Factory<E>,
    /// Run in order after the run; the first violation fails it.
    pub checkers: Vec<Box<dyn Checker<E>>>,
}

/// Every workload, in the order the CLI lists them.
pub static REGISTRY: &[Workload] =
    &[fabric_stream::WORKLOAD, datagram_stream::WORKLOAD, ring_multicast::WORKLOAD];

/// The workload called `name`.
pub fn find(name: &str) -> Option<&'static Workload> {
    REGISTRY.iter().find(|w| w.name == name)
}
