//! Deterministic simulation of ordo: every member of a group in one thread,
//! every choice drawn from one seed (DESIGN.md §7; TigerBeetle's VOPR,
//! FoundationDB's simulator and BUGGIFY).
//!
//! # What the simulator guarantees
//! - **Determinism.** A run is a pure function of its seed (and the code):
//!   the same seed gives the same history, step for step, forever. All
//!   randomness comes from [`SimRng`] (xoshiro256** seeded by SplitMix64,
//!   written here so that no dependency upgrade changes a stream); nothing
//!   reads a wall clock; every collection iterated is ordered.
//! - **The fabric's contract** ([`ordo_fabric`] guarantees 1-5, checked by
//!   its conformance suite in this crate's tests): FIFO per (sender,
//!   receiver) pair, writes to different peers reorder, untorn words,
//!   signaled writes resolve exactly once, and **nothing posted after a lost
//!   write ever lands** — a lost write breaks its link until a reconnect, so
//!   a guard never lands without its data.
//! - **Bounded runs.** Every run stops at a simulated-time limit or a step
//!   limit; queues, in-flight writes and datagram sizes are bounded.
//! - **Faults, then liveness.** Partitions, crashes and restarts are drawn
//!   from the seed up to a point; then everything heals, every member is up,
//!   and the workload's liveness checker requires progress.
//! - **Fault points.** Each run installs an [`ordo_fault::Injector`] seeded
//!   from the run's seed, so `ordo_fault::fault!` points in production code
//!   fire, and replay, deterministically.
//! - A failing run reports its seed and the command that replays it:
//!   `ordo sim --workload <name> --seed <N>`.
//!
//! # Map
//! | module | what |
//! |---|---|
//! | [`rng`] | [`SimRng`], seed derivation |
//! | [`clock`] | [`SimClock`] |
//! | `world` | [`World`]: regions, links, partitions, crash/restart, event queue |
//! | `fabric` | [`SimFabric`]: `impl Fabric` on the world |
//! | `net` | [`SimSocket`]: lossy, duplicating, reordering datagrams |
//! | `sim` | [`Sim`]: the scheduler of [`SimProcess`]es, [`FaultPlan`] nemesis |
//! | `history` | [`History`], [`Checker`], [`Violation`] |
//! | `harness` | [`SimHarness`]: the fabric conformance harness |
//! | [`workloads`] | the registry and the substrate workloads |

#![warn(missing_docs)]

pub mod clock;
mod fabric;
mod harness;
mod history;
mod net;
pub mod rng;
mod sim;
pub mod workloads;
mod world;

pub use clock::SimClock;
pub use fabric::SimFabric;
pub use harness::SimHarness;
pub use history::{Checker, Entry, FaultNote, FaultRecord, Fnv64, History, Violation, check_all, fnv64};
pub use net::{NetAddr, NetError, SimSocket};
pub use rng::{SimRng, derive_seed};
pub use sim::{Ctx, Factory, FaultPlan, Outcome, RunLimits, Sim, SimProcess, SimStats, Undo, UndoQueue};
pub use workloads::{Scenario, Workload};
pub use world::{FabricConfig, NetConfig, SimConfig, World, WorldStats};

use std::hash::Hash;

/// Options of a run that the caller (CLI, tests) may change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Whether the nemesis injects partitions, crashes and restarts.
    pub faults: bool,
    /// Probability (ppm) that a reached `ordo_fault::fault!` point fires.
    pub fault_point_ppm: u32,
    /// Overrides the workload's step limit.
    pub max_steps: Option<u64>,
    /// Overrides the workload's simulated-time limit.
    pub max_time_ns: Option<u64>,
    /// Overrides the fabric's split landing (`FabricConfig::split_land_ppm`:
    /// a write seen half-applied, lower part first), for every workload.
    pub split_land_ppm: Option<u32>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            faults: true,
            fault_point_ppm: 20_000,
            max_steps: None,
            max_time_ns: None,
            split_land_ppm: None,
        }
    }
}

/// What a passing run did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RunReport {
    /// Workload name.
    pub workload: String,
    /// The seed (replays the run).
    pub seed: u64,
    /// Group size.
    pub members: u32,
    /// Why the run stopped.
    pub outcome: Outcome,
    /// Simulated time (summed over seeds in a [`SeedsReport`]).
    pub sim_time_ns: u64,
    /// Scheduler steps (summed over seeds in a [`SeedsReport`]).
    pub steps: u64,
    /// Fabric writes that landed.
    pub writes_landed: u64,
    /// Datagrams handed to the network.
    pub datagrams_sent: u64,
    /// Datagrams lost (random loss or partition).
    pub datagrams_lost: u64,
    /// Datagrams delivered twice.
    pub datagrams_duplicated: u64,
    /// Fault actions of the nemesis (crashes, cuts, splits).
    pub faults_fired: u64,
    /// `ordo_fault::fault!` points that fired.
    pub fault_points_fired: u64,
    /// Number of history entries.
    pub history_len: usize,
    /// Digest of the whole history: equal digests, equal histories.
    pub history_digest: u64,
    /// Every counter of the world.
    pub world: WorldStats,
    /// Every counter of the scheduler.
    pub sim: SimStats,
}

/// Why a run failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// No workload of that name.
    UnknownWorkload,
    /// A checker found a violation.
    Violation {
        /// The checker's name.
        checker: &'static str,
    },
    /// The run panicked (an assertion in the simulator or in the code under
    /// test).
    Panic,
}

/// A failed run: always carries its seed and the command that replays it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("workload `{workload}` failed with seed {seed}: {message}\n  replay with: {replay}")]
pub struct RunFailure {
    /// Workload name.
    pub workload: String,
    /// The seed (replays the run).
    pub seed: u64,
    /// What kind of failure.
    pub kind: FailureKind,
    /// What went wrong.
    pub message: String,
    /// `ordo sim --workload <name> --seed <N>`.
    pub replay: String,
}

impl RunFailure {
    fn new(workload: &str, seed: u64, kind: FailureKind, message: String) -> RunFailure {
        RunFailure {
            workload: workload.to_string(),
            seed,
            kind,
            message,
            replay: replay_command(workload, seed),
        }
    }
}

/// The command line that replays `seed` of `workload`.
pub fn replay_command(workload: &str, seed: u64) -> String {
    format!("ordo sim --workload {workload} --seed {seed}")
}

/// Names of every registered workload.
pub fn workloads() -> &'static [&'static str] {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| workloads::REGISTRY.iter().map(|w| w.name).collect())
}

/// Runs one seed of the workload `name`, checks its history and returns
/// the report, or the failure (printed to stderr with its replay command).
/// A panic inside the run is caught and reported as a failure of the seed.
pub fn run_workload(name: &str, seed: u64, opts: &RunOptions) -> Result<RunReport, RunFailure> {
    let Some(workload) = workloads::find(name) else {
        let known = workloads().join(", ");
        return Err(RunFailure::new(
            name,
            seed,
            FailureKind::UnknownWorkload,
            format!("unknown workload `{name}` (known: {known})"),
        ));
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (workload.run)(seed, opts)));
    let result = result.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "non-string panic".into());
        Err(RunFailure::new(name, seed, FailureKind::Panic, format!("panicked: {message}")))
    });
    if let Err(failure) = &result {
        eprintln!("{failure}");
    }
    result
}

/// Builds the simulation of `scenario` from `seed`, runs it with fault
/// points armed, checks the history and reports. Workloads call this.
pub fn execute<E: Hash + 'static>(
    workload: &'static str,
    seed: u64,
    opts: &RunOptions,
    scenario: Scenario<E>,
) -> Result<RunReport, RunFailure> {
    let (report, history, checkers) = simulate(workload, seed, opts, scenario);
    match check_all(&history, &checkers) {
        Ok(()) => Ok(report),
        Err(v) => Err(RunFailure::new(
            workload,
            seed,
            FailureKind::Violation { checker: v.checker },
            format!("{v} (outcome {:?} at {} ns)", report.outcome, report.sim_time_ns),
        )),
    }
}

type Simulated<E> = (RunReport, History<E>, Vec<Box<dyn Checker<E>>>);

/// Runs `scenario` and returns its report and history without checking
/// (tests use it to look at histories).
pub fn simulate<E: Hash + 'static>(
    workload: &'static str,
    seed: u64,
    opts: &RunOptions,
    scenario: Scenario<E>,
) -> Simulated<E> {
    let Scenario { mut config, faults, mut limits, factory, checkers } = scenario;
    if let Some(ppm) = opts.split_land_ppm {
        config.fabric.split_land_ppm = ppm;
    }
    if let Some(steps) = opts.max_steps {
        limits.max_steps = steps;
    }
    if let Some(t) = opts.max_time_ns {
        limits.max_time_ns = t;
    }
    let members = config.members;
    let injector =
        ordo_fault::Injector::new(derive_seed(seed, rng::stream::FAULT_POINTS), opts.fault_point_ppm);
    let guard = ordo_fault::install(injector);
    let mut sim = Sim::new(seed, config, if opts.faults { faults } else { None }, factory);
    let outcome = sim.run(&limits);
    let fault_points_fired = guard.finish().map_or(0, |i| i.fired.values().sum());
    let world = sim.world().lock().expect("world lock").stats().clone();
    let stats = sim.stats().clone();
    let history = sim.into_history();
    let report = RunReport {
        workload: workload.to_string(),
        seed,
        members,
        outcome,
        sim_time_ns: history.end_ns,
        steps: stats.steps,
        writes_landed: world.writes_landed,
        datagrams_sent: world.datagrams_sent,
        datagrams_lost: world.datagrams_lost,
        datagrams_duplicated: world.datagrams_duplicated,
        faults_fired: stats.faults,
        fault_points_fired,
        history_len: history.len(),
        history_digest: history.digest(),
        world,
        sim: stats,
    };
    (report, history, checkers)
}

/// The outcome of many seeds of one workload.
#[derive(Clone, Debug, Default)]
pub struct SeedsReport {
    /// Workload name.
    pub workload: String,
    /// Seeds run.
    pub runs: u64,
    /// Seeds that passed.
    pub passed: u64,
    /// Every failing seed.
    pub failures: Vec<RunFailure>,
    /// Simulated time (summed over seeds in a [`SeedsReport`]).
    pub sim_time_ns: u64,
    /// Scheduler steps (summed over seeds in a [`SeedsReport`]).
    pub steps: u64,
    /// Fault actions of the nemesis.
    pub faults_fired: u64,
    /// `ordo_fault::fault!` points that fired.
    pub fault_points_fired: u64,
}

/// Runs every seed of `seeds` (all of them, even after a failure) and
/// collects the failures.
pub fn run_seeds(name: &str, seeds: impl IntoIterator<Item = u64>, opts: &RunOptions) -> SeedsReport {
    run_seeds_with(name, seeds, opts, |seed, opts| run_workload(name, seed, opts))
}

/// Like [`run_seeds`] for a workload that is not in this crate's registry
/// (an engine's, defined in a crate above this one): `run` runs one seed.
pub fn run_seeds_with(
    name: &str,
    seeds: impl IntoIterator<Item = u64>,
    opts: &RunOptions,
    run: impl Fn(u64, &RunOptions) -> Result<RunReport, RunFailure>,
) -> SeedsReport {
    let mut out = SeedsReport { workload: name.to_string(), ..SeedsReport::default() };
    for seed in seeds {
        out.runs += 1;
        match run(seed, opts) {
            Ok(r) => {
                out.passed += 1;
                out.sim_time_ns += r.sim_time_ns;
                out.steps += r.steps;
                out.faults_fired += r.faults_fired;
                out.fault_points_fired += r.fault_points_fired;
            }
            Err(f) => out.failures.push(f),
        }
    }
    out
}

/// A batch of fresh seeds: `count` seeds from `base` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedBatch {
    /// First seed.
    pub base: u64,
    /// Number of seeds.
    pub count: u64,
}

impl SeedBatch {
    /// From the environment: `ORDO_SIM_SEEDS` (count, default
    /// `default_count`) and `ORDO_SIM_BASE_SEED` (default: from the system
    /// time, so every batch explores new seeds). Panics on a malformed
    /// variable (an operator mistake in a test run).
    pub fn from_env(default_count: u64) -> SeedBatch {
        let parse = |var: &str| {
            std::env::var(var)
                .ok()
                .map(|v| v.trim().parse::<u64>().unwrap_or_else(|e| panic!("{var}={v:?} is not a u64: {e}")))
        };
        let count = parse("ORDO_SIM_SEEDS").unwrap_or(default_count);
        let base = parse("ORDO_SIM_BASE_SEED").unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let mut s = t.as_nanos() as u64;
            rng::splitmix64(&mut s)
        });
        SeedBatch { base, count }
    }

    /// The seeds of the batch.
    pub fn seeds(&self) -> impl Iterator<Item = u64> + use<> {
        let base = self.base;
        (0..self.count).map(move |i| base.wrapping_add(i))
    }

    /// Runs `run` on every seed of the batch, spread over `threads` threads
    /// (one simulation is single-threaded; runs are independent), and
    /// returns the failures in seed order. Prints to stderr what the batch
    /// is (with the variables that replay it) and its outcome, with the
    /// first few failures: the shared body of every workload's fresh-seed
    /// test and of `ordo sim --seeds`.
    pub fn run<T>(
        &self,
        name: &str,
        threads: usize,
        run: impl Fn(u64) -> Result<T, String> + Sync,
    ) -> Vec<String> {
        eprintln!(
            "{name}: {} seeds from base {} (replay with ORDO_SIM_BASE_SEED={} ORDO_SIM_SEEDS={})",
            self.count, self.base, self.base, self.count
        );
        let start = std::time::Instant::now();
        let seeds: Vec<u64> = self.seeds().collect();
        let chunk = seeds.len().div_ceil(threads.max(1)).max(1);
        let failures: Vec<String> = std::thread::scope(|scope| {
            let run = &run;
            let workers: Vec<_> = seeds
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || part.iter().filter_map(|&s| run(s).err()).collect::<Vec<_>>())
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().expect("a seed thread panicked")).collect()
        });
        eprintln!("{name}: {} seeds, {} failed, in {:.1?}", self.count, failures.len(), start.elapsed());
        for f in failures.iter().take(5) {
            eprintln!("  {f}");
        }
        failures
    }
}
