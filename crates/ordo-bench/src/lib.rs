//! ordo's benchmarks. Benchmarks report figures; they are never tests.
//!
//! - [`fabric`]: `ordo bench fabric` — one-way write-to-visible latency and
//!   streaming bandwidth per backend, beside the physical limits measured in
//!   the same run (the cross-process copy ring of the same geometry, a hot
//!   memcpy, and a cross-process cache-line ping-pong).
//! - [`failover`]: `ordo bench failover` — SIGKILL one `ordo node` of a
//!   vsync group: kill → new view p50/p99 per group size and fabric, and a
//!   survivor's throughput across the kill.
//! - [`acuerdo_bench`]: `ordo bench acuerdo` — the Acuerdo paper's Fig. 8
//!   (latency vs throughput, beside vsync) and Table 1 (election time).
//! - [`r3p2_bench`]: `ordo bench r3p2` — the r3p2 thesis' Figs. 5.1-5.2
//!   (p99 latency vs throughput over loopback UDP, replicated vs not).
//! - [`acuerdo_peer`]: one Acuerdo member process (`ordo acuerdo-peer`)
//!   for the kill -9 tests.
//! - [`peer`]: the child process that benchmarks (and the multi-process
//!   tests) spawn as the remote member.
//! - [`spindle`]: `ordo bench spindle` — the Spindle paper's experiments
//!   (spindle §IV) on the vsync engine, baseline and optimized side by side.
//! - [`experiment`]: the one shape of every benchmark (plan → points → rows
//!   → CSV/JSON/PNG files → tables), which the CLI runs.
//! - [`noise`]: measurements that survive a noisy machine — the core share
//!   each sample got, retries of contended samples, interleaved compared
//!   pairs reported as median [min–max], ratios only between clean samples.
//! - [`limits`]: physical limits measured beside the figures they bound
//!   (the cross-process copy ring, the busy-polled UDP round trip).
//! - [`plot`]: PNG line charts for the figures.
//! - [`machine`]: what every result records about the machine.
//!
//! # Invariants
//! - Every figure comes from a measurement in the same invocation; nothing is
//!   hard-coded or carried over between runs.
//! - Peer processes exit on their own when their parent's commands stop
//!   (a bounded idle deadline), so a crashed benchmark leaves nothing
//!   spinning.

#![warn(missing_docs)]

pub mod acuerdo_bench;
pub mod acuerdo_peer;
pub mod dds_bench;
pub mod demo;
pub mod experiment;
pub mod fabric;
pub mod failover;
pub mod kv_bench;
pub mod limits;
pub mod machine;
pub mod noise;
pub mod peer;
pub mod plot;
pub mod protocol;
pub mod r3p2_bench;
pub mod spindle;
pub mod ycsb;

/// Entry point of the hidden `ordo acuerdo-peer` subcommand (`args`
/// without the program and subcommand names); see [`acuerdo_peer`].
pub fn acuerdo_peer_main(args: &[String]) -> Result<(), String> {
    acuerdo_peer::main(args)
}
