//! Agents with duty cycles, idle strategies and the runner (DESIGN.md §5).
//!
//! Protocol engines are sans-I/O state machines; this crate is the part of
//! the runtime that runs any of them for real, with no fabric backend, engine
//! or configuration attached (the R2P2 stack runs on it without linking
//! shared memory, TCP fabric, vsync or acuerdo; `ordo-runtime` re-exports it). Each member's predicate loop is an [`Agent`] (Aeron's
//! `Agent`): `do_work(now_ns) -> work_count`. A [`Runner`] runs agents on
//! threads — one thread each ([`ThreadingMode::Dedicated`]) or all
//! round-robin in one thread ([`ThreadingMode::Shared`], how a 16-member
//! group runs on a 2-core machine) — and, when they are idle, follows an
//! [`IdleStrategy`]: busy-spin, spin-then-yield, or spin, yield and then
//! **park on the doorbell** that incoming fabric writes ring. Derecho sleeps
//! after 100 ms idle and then notices work up to 1 ms late; an ordo member
//! parks and is woken by the write itself. A wake-up costs about 40 µs on
//! this VM, so the hot path spins first and parks only when really idle.
//!
//! # Invariants
//! - An agent's `do_work` is only ever called from one thread at a time: the
//!   runner moves each agent into exactly one thread (agents are `Send`, not
//!   `Sync`), and gives them back on [`Runner::join`].
//! - No wake-up is lost: parking follows the doorbell's
//!   prepare / re-check (a full duty cycle) / park protocol.
//! - Stop is prompt: [`Runner::stop`] sets a flag and rings every park bell,
//!   so a parked runner wakes at once, and at worst (no ring possible)
//!   within `park_max`.
//! - No unbounded busy spin in [`IdleStrategy::BackoffPark`]: after
//!   `spins + yields` idle cycles every idle cycle parks, for at least
//!   [`IdleStrategy::MIN_PARK`] and at most `park_max`.
//! - A panic in an agent stops the runner and surfaces on
//!   [`Runner::join`] / [`Runner::try_join`]; it is never swallowed.
//!
//! # Example
//! ```
//! use ordo_fabric::Doorbell;
//! use ordo_agent::{Agent, IdleStrategy, Runner, RunnerOptions, ThreadingMode};
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::{Duration, Instant};
//!
//! /// Does 100 units of work, then idles.
//! struct Countdown { left: u32, finished: Arc<AtomicUsize>, bell: Doorbell }
//!
//! impl Agent for Countdown {
//!     fn name(&self) -> &str { "countdown" }
//!     fn do_work(&mut self, _now_ns: u64) -> usize {
//!         if self.left == 0 { return 0; }
//!         self.left -= 1;
//!         if self.left == 0 { self.finished.fetch_add(1, Ordering::Release); }
//!         1
//!     }
//!     fn doorbell(&self) -> Option<Doorbell> { Some(self.bell.clone()) }
//! }
//!
//! let (bell, finished) = (Doorbell::new_local(), Arc::new(AtomicUsize::new(0)));
//! let agents: Vec<Countdown> = (0..4)
//!     .map(|_| Countdown { left: 100, finished: finished.clone(), bell: bell.clone() })
//!     .collect();
//! let options = RunnerOptions::new(ThreadingMode::Shared, IdleStrategy::DEFAULT);
//! let runner = Runner::start(agents, &options).expect("threads start");
//! let deadline = Instant::now() + Duration::from_secs(10);
//! while finished.load(Ordering::Acquire) < 4 && Instant::now() < deadline {
//!     std::thread::sleep(Duration::from_millis(1));
//! }
//! let joined = runner.join(); // stops, joins, re-raises an agent's panic
//! assert_eq!(joined.stats.work_count, 400);
//! assert!(joined.agents.iter().all(|a| a.left == 0));
//! ```
//!
#![warn(missing_docs)]

mod agent;
mod agent_loop;
mod clock;
mod idle;
mod runner;

pub use agent::Agent;
pub use agent_loop::{AgentLoop, ParkBell, RunnerStats, Step};
pub use clock::{Clock, MonotonicClock};
pub use idle::{IdleAction, IdleStrategy, Idler, online_cpus};
pub use runner::{
    AgentPanic, CorePinning, Joined, Runner, RunnerError, RunnerHandle, RunnerOptions, ThreadingMode,
};
