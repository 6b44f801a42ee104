//! The engines' seeded simulation workloads, in one home, registered once.
//!
//! `ordo-sim` is the simulator's core (world, simulated fabric, datagram
//! network, clock, disk, checkers' machinery) and sits *below* the engines;
//! this crate sits *above* them and holds each engine's workload — the
//! fault driver, the application and the checkers — over the **production
//! drivers**:
//! - [`vsync`]: every member is an `ordo_vsync::VsyncDriver`, the type the
//!   runtime's predicate agent wraps;
//! - [`acuerdo`]: every member is an `ordo_acuerdo::AcuerdoDriver`, the type
//!   the runtime's Acuerdo agent wraps;
//! - [`r3p2`]: every replica is an `ordo_r2p2::ServerCore` (decode → route →
//!   replication-hook actions → encode), the core the UDP server's network
//!   thread runs, with the production `RaftReplication` hook and `KvState`.
//!
//! # Invariants
//! - [`REGISTRY`] lists every workload once, the substrate's (from
//!   `ordo_sim::workloads`) and the engines'; the tests, `ordo sim --workload
//!   W --seed N` and `ordo sim --workload W --seeds K` all go through it.
//! - A workload's `run` is a pure function of the seed and the options: the
//!   same seed gives the same history digest.
//! - A failing seed's message names the line that replays it.

#![warn(missing_docs)]

pub mod acuerdo;
pub mod dds;
pub mod kv;
pub mod r3p2;
pub mod scenario;
pub mod vsync;
pub mod vsync_views;

use ordo_sim::{RunOptions, RunReport, SeedBatch};

/// A registered workload.
#[derive(Clone, Copy)]
pub struct Workload {
    /// Name used by the CLI (`--workload`).
    pub name: &'static str,
    /// One line on what it exercises and checks.
    pub summary: &'static str,
    /// Runs one seed and checks it: what it did, or the violation.
    pub run: fn(u64, &RunOptions) -> Result<SeedReport, String>,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload").field("name", &self.name).finish()
    }
}

/// What one passing seed did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SeedReport {
    /// The workload.
    pub workload: String,
    /// The seed (replays the run).
    pub seed: u64,
    /// Digest of the whole history: equal digests, equal histories.
    pub history_digest: u64,
    /// A human-readable account of the run (one or more lines).
    pub summary: String,
}

impl SeedReport {
    /// A passing seed of `workload` whose history digest is `history_digest`.
    pub fn passed(workload: &str, seed: u64, history_digest: u64) -> SeedReport {
        SeedReport {
            workload: workload.into(),
            seed,
            history_digest,
            summary: format!("{workload} seed {seed}: passed, history digest {history_digest:#018x}"),
        }
    }
}

/// The account of a run of a substrate workload (`ordo_sim`'s report).
fn describe(report: &RunReport) -> String {
    format!(
        "{} seed {}: passed ({:?}) — {} members, {:.3} simulated ms, {} steps, {} writes landed, \
         {} datagrams sent ({} lost, {} duplicated), {} faults, {} fault points fired, history {} entries \
         (digest {:#018x})",
        report.workload,
        report.seed,
        report.outcome,
        report.members,
        report.sim_time_ns as f64 / 1e6,
        report.steps,
        report.writes_landed,
        report.datagrams_sent,
        report.datagrams_lost,
        report.datagrams_duplicated,
        report.faults_fired,
        report.fault_points_fired,
        report.history_len,
        report.history_digest
    )
}

fn from_run_report(result: Result<RunReport, ordo_sim::RunFailure>) -> Result<SeedReport, String> {
    // The replay line is added once, by whoever runs the seed in a batch.
    let report = result.map_err(|f| format!("seed {}: {}", f.seed, f.message))?;
    Ok(SeedReport {
        workload: report.workload.clone(),
        seed: report.seed,
        history_digest: report.history_digest,
        summary: describe(&report),
    })
}

/// The `I`-th workload of `ordo_sim`'s own registry.
fn substrate<const I: usize>(seed: u64, opts: &RunOptions) -> Result<SeedReport, String> {
    let name = ordo_sim::workloads::REGISTRY[I].name;
    from_run_report(ordo_sim::run_workload(name, seed, opts))
}

const fn from_substrate<const I: usize>() -> Workload {
    let w = &ordo_sim::workloads::REGISTRY[I];
    Workload { name: w.name, summary: w.summary, run: substrate::<I> }
}

/// Every workload, in the order the CLI lists them.
pub static REGISTRY: &[Workload] = &[
    from_substrate::<0>(),
    from_substrate::<1>(),
    from_substrate::<2>(),
    vsync::WORKLOAD,
    vsync_views::WORKLOAD,
    dds::WORKLOAD,
    acuerdo::WORKLOAD,
    kv::WORKLOAD,
    r3p2::WORKLOAD,
];

/// What a caught panic said (its `String` or `&str` payload; empty
/// otherwise), for a seed's failure report.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// The workload called `name`.
pub fn find(name: &str) -> Option<&'static Workload> {
    REGISTRY.iter().find(|w| w.name == name)
}

/// The workload called `name`, or an error listing the known ones.
pub fn lookup(name: &str) -> Result<&'static Workload, String> {
    find(name).ok_or_else(|| {
        let known: Vec<&str> = REGISTRY.iter().map(|w| w.name).collect();
        format!("unknown workload `{name}` (known: {})", known.join(", "))
    })
}

/// Runs every seed of `batch` on `threads` threads; returns the failures in
/// seed order (each names its replay line). The shared body of every
/// workload's fresh-seed test and of `ordo sim --seeds`.
pub fn run_batch(workload: &Workload, batch: &SeedBatch, threads: usize, opts: &RunOptions) -> Vec<String> {
    batch.run(workload.name, threads, |seed| {
        (workload.run)(seed, opts)
            .map_err(|e| format!("{e} (replay: {})", replay_line(workload.name, seed, opts)))
    })
}

/// The command that replays `seed` of `name` with `opts`.
pub fn replay_line(name: &str, seed: u64, opts: &RunOptions) -> String {
    let mut line = format!("ordo sim --workload {name} --seed {seed}");
    if !opts.faults {
        line += " --no-faults";
    }
    if opts.fault_point_ppm != RunOptions::default().fault_point_ppm {
        line += &format!(" --fault-point-ppm {}", opts.fault_point_ppm);
    }
    if let Some(ppm) = opts.split_land_ppm {
        line += &format!(" --split-land-ppm {ppm}");
    }
    line
}

/// The body of every workload's fresh-seed test: a batch from the
/// environment (`ORDO_SIM_SEEDS`, default `default_count`;
/// `ORDO_SIM_BASE_SEED`, default fresh) through the registry, with default
/// options. Panics with the failures, each with its replay line.
pub fn assert_fresh_seeds(name: &str, default_count: u64) {
    assert_fresh_seeds_with(name, default_count, &RunOptions::default());
}

/// [`assert_fresh_seeds`] with other options (e.g. writes landing in two
/// steps: `RunOptions::split_land_ppm`).
pub fn assert_fresh_seeds_with(name: &str, default_count: u64, opts: &RunOptions) {
    let workload = lookup(name).unwrap_or_else(|e| panic!("{e}"));
    let batch = SeedBatch::from_env(default_count);
    let failures = run_batch(workload, &batch, 2, opts);
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed; first: {}",
        failures.len(),
        batch.count,
        failures[0]
    );
}

/// The body of every workload's pinned-seed test: each seed that ever
/// failed, through the registry, with default options.
pub fn assert_pinned_seeds(name: &str, seeds: &[u64]) {
    assert_pinned_seeds_with(name, seeds, &RunOptions::default());
}

/// [`assert_pinned_seeds`] with the options the seeds failed under.
pub fn assert_pinned_seeds_with(name: &str, seeds: &[u64], opts: &RunOptions) {
    let workload = lookup(name).unwrap_or_else(|e| panic!("{e}"));
    for &seed in seeds {
        if let Err(e) = (workload.run)(seed, opts) {
            panic!("pinned seed failed: {e} (replay: {})", replay_line(name, seed, opts));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_cover_every_engine() {
        let mut names: Vec<&str> = REGISTRY.iter().map(|w| w.name).collect();
        let total = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), total, "workload names are unique");
        for engine in ["vsync", "acuerdo", "r3p2", "fabric-stream", "datagram-stream", "ring-multicast"] {
            assert!(find(engine).is_some(), "{engine} is registered");
        }
        assert!(lookup("nope").unwrap_err().contains("r3p2"));
    }
}
