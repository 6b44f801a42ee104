//! ordo's benchmarks. Benchmarks report figures; they are never tests.
//!
//! - [`fabric`]: `ordo bench fabric` — one-way write-to-visible latency and
//!   streaming bandwidth per backend, beside the physical limits measured in
//!   the same run (memcpy at the same sizes and footprint, and a
//!   cross-process cache-line ping-pong).
//! - [`peer`]: the child process that benchmarks (and the multi-process
//!   tests) spawn as the remote member.
//! - [`machine`]: what every result records about the machine.
//!
//! # Invariants
//! - Every figure comes from a measurement in the same invocation; nothing is
//!   hard-coded or carried over between runs.
//! - Peer processes exit on their own when their parent's commands stop
//!   (a bounded idle deadline), so a crashed benchmark leaves nothing
//!   spinning.

#![warn(missing_docs)]

pub mod demo;
pub mod fabric;
pub mod machine;
pub mod peer;
pub mod protocol;
