//! [`Runner`]: runs agents on threads, in a [`ThreadingMode`], with an
//! [`IdleStrategy`], until stopped.
//!
//! # Invariants
//! - Each agent is moved into exactly one thread, so its `do_work` is only
//!   ever called from one thread at a time; [`Runner::join`] hands the agents
//!   back in the order they were given.
//! - **Stop is prompt.** [`Runner::stop`] sets a flag and then rings every
//!   thread's park bell; by the doorbell protocol a parked thread either is
//!   woken or sees the flag in its re-check. A thread exits after at most the
//!   duty cycle it is in (so agents must not block), and even a lost ring
//!   could delay it by no more than `park_max`.
//! - **Panics surface.** A panic in any agent callback stops the whole runner
//!   (a member whose predicate thread died must not limp on) and is returned
//!   by [`Runner::try_join`] naming the agent, or re-raised by
//!   [`Runner::join`] and by dropping the runner. It is never swallowed.

use crate::agent::Agent;
use crate::agent_loop::{AgentLoop, RunnerStats};
use crate::clock::{Clock, MonotonicClock};
use crate::idle::IdleStrategy;
use ordo_fabric::Doorbell;
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// How agents are mapped onto threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThreadingMode {
    /// One thread per agent: the lowest latency when there are cores enough.
    #[default]
    Dedicated,
    /// All agents round-robin in one thread, their work counts summed into
    /// one duty cycle: how a 16-member group runs on a 2-core machine.
    Shared,
}

/// Which cores runner threads are pinned to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CorePinning {
    /// No pinning; the OS schedules the threads.
    #[default]
    None,
    /// Thread `i` is pinned to the `i`-th core the OS reports (modulo their
    /// number).
    RoundRobin,
    /// Thread `i` is pinned to core `cores[i % cores.len()]`.
    Cores(Vec<usize>),
}

/// How a [`Runner`] runs its agents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerOptions {
    /// Threads per agent.
    pub threading: ThreadingMode,
    /// What an idle thread does.
    pub idle: IdleStrategy,
    /// Core pinning. Failing to pin is logged, not fatal.
    pub pinning: CorePinning,
    /// Prefix of the thread names (`<prefix>-<agent>` or `<prefix>-shared`).
    pub thread_name_prefix: String,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            threading: ThreadingMode::Dedicated,
            idle: IdleStrategy::DEFAULT,
            pinning: CorePinning::None,
            thread_name_prefix: "ordo".to_owned(),
        }
    }
}

impl RunnerOptions {
    /// Options with this threading mode and idle strategy, no pinning.
    pub fn new(threading: ThreadingMode, idle: IdleStrategy) -> Self {
        RunnerOptions { threading, idle, ..RunnerOptions::default() }
    }

    /// The same options with `pinning`.
    pub fn with_pinning(mut self, pinning: CorePinning) -> Self {
        self.pinning = pinning;
        self
    }
}

/// Why a runner could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The OS refused to create a thread. Threads already started were
    /// stopped and joined.
    #[error("cannot spawn runner thread `{thread}`: {source}")]
    Spawn {
        /// Name of the thread that could not be created.
        thread: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// `CorePinning::Cores` with an empty list.
    #[error("core pinning was asked for with an empty list of cores")]
    NoCores,
}

/// A panic in an agent callback, caught on the runner thread.
pub struct AgentPanic {
    /// The agent whose callback panicked.
    pub agent: String,
    /// The runner thread it ran on.
    pub thread: String,
    /// The panic message (when it was a string).
    pub message: String,
    payload: Box<dyn Any + Send + 'static>,
}

impl AgentPanic {
    fn new(agent: String, thread: String, payload: Box<dyn Any + Send + 'static>) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "<non-string panic payload>".to_owned()
        };
        AgentPanic { agent, thread, message, payload }
    }

    /// The original panic payload.
    pub fn into_payload(self) -> Box<dyn Any + Send + 'static> {
        self.payload
    }

    /// Re-raises the panic on the calling thread, with its original payload.
    pub fn resume(self) -> ! {
        resume_unwind(self.payload)
    }
}

impl fmt::Debug for AgentPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentPanic")
            .field("agent", &self.agent)
            .field("thread", &self.thread)
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for AgentPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "agent `{}` panicked on thread `{}`: {}", self.agent, self.thread, self.message)
    }
}

impl std::error::Error for AgentPanic {}

/// A cloneable handle that stops a runner from any thread (a signal
/// handler's thread, an agent, a test).
#[derive(Clone, Debug)]
pub struct RunnerHandle {
    stop: Arc<AtomicBool>,
    bells: Arc<[Doorbell]>,
}

impl RunnerHandle {
    /// Asks every thread to stop: sets the flag, then rings every park bell
    /// (flag first, so a woken or re-checking thread sees it). Idempotent.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for bell in self.bells.iter() {
            bell.ring();
        }
    }

    /// Whether a stop was asked for (by a call to `stop` or an agent panic).
    pub fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// What [`Runner::join`] returns.
#[derive(Debug)]
pub struct Joined<A> {
    /// The agents, in the order given to [`Runner::start`].
    pub agents: Vec<A>,
    /// Counters summed over the runner's threads.
    pub stats: RunnerStats,
    /// Counters per thread, in thread order.
    pub thread_stats: Vec<RunnerStats>,
}

type ThreadOutcome<A> = Result<(Vec<A>, RunnerStats), AgentPanic>;

struct RunnerThread<A> {
    name: String,
    /// Positions of this thread's agents in the list given to `start`.
    indices: Vec<usize>,
    join: JoinHandle<ThreadOutcome<A>>,
}

/// Agents running on threads. Stop with [`stop`](Self::stop) (or a
/// [`RunnerHandle`]), then [`join`](Self::join) to get the agents back.
///
/// Dropping a runner stops and joins it, and re-raises an agent's panic
/// (unless the dropping thread is already panicking).
pub struct Runner<A: Agent + Send + 'static> {
    threads: Vec<RunnerThread<A>>,
    handle: RunnerHandle,
    agent_count: usize,
}

impl<A: Agent + Send + 'static> Runner<A> {
    /// Starts `agents` with the real monotonic clock.
    pub fn start(agents: Vec<A>, options: &RunnerOptions) -> Result<Self, RunnerError> {
        Self::start_with_clock(agents, options, MonotonicClock::new())
    }

    /// Starts `agents`, each thread reading its own clone of `clock`.
    pub fn start_with_clock<C>(agents: Vec<A>, options: &RunnerOptions, clock: C) -> Result<Self, RunnerError>
    where
        C: Clock + Clone + Send + 'static,
    {
        let cores = resolve_cores(&options.pinning)?;
        let agent_count = agents.len();
        let stop = Arc::new(AtomicBool::new(false));

        // Partition the agents into threads and build each thread's loop here,
        // so every park bell is known before any thread runs.
        let groups: Vec<Vec<(usize, A)>> = match options.threading {
            ThreadingMode::Dedicated => agents.into_iter().enumerate().map(|a| vec![a]).collect(),
            ThreadingMode::Shared if agent_count == 0 => Vec::new(),
            ThreadingMode::Shared => vec![agents.into_iter().enumerate().collect()],
        };
        let mut loops = Vec::with_capacity(groups.len());
        for group in groups {
            let (indices, agents): (Vec<usize>, Vec<A>) = group.into_iter().unzip();
            let name = match options.threading {
                ThreadingMode::Dedicated => format!("{}-{}", options.thread_name_prefix, agents[0].name()),
                ThreadingMode::Shared => format!("{}-shared", options.thread_name_prefix),
            };
            let lp = AgentLoop::with_stop_flag(agents, options.idle, clock.clone(), stop.clone());
            loops.push((name, indices, lp));
        }
        let bells: Arc<[Doorbell]> = loops.iter().map(|(_, _, lp)| lp.park_bell().bell().clone()).collect();
        let handle = RunnerHandle { stop, bells };

        let mut runner = Runner { threads: Vec::with_capacity(loops.len()), handle, agent_count };
        for (i, (name, indices, lp)) in loops.into_iter().enumerate() {
            let core = cores.as_ref().map(|c| c[i % c.len()]);
            let thread_handle = runner.handle.clone();
            let thread_name = name.clone();
            let spawned = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || run_thread(lp, thread_name, core, thread_handle));
            match spawned {
                Ok(join) => runner.threads.push(RunnerThread { name, indices, join }),
                Err(source) => {
                    // Dropping the runner stops and joins what started.
                    drop(runner);
                    return Err(RunnerError::Spawn { thread: name, source });
                }
            }
        }
        tracing::debug!(
            threads = runner.threads.len(),
            agents = agent_count,
            threading = ?options.threading,
            idle = ?options.idle,
            "runner started"
        );
        Ok(runner)
    }

    /// A handle that stops this runner from anywhere.
    pub fn handle(&self) -> RunnerHandle {
        self.handle.clone()
    }

    /// Asks every thread to stop (see [`RunnerHandle::stop`]). Returns at
    /// once; [`join`](Self::join) waits for the threads.
    pub fn stop(&self) {
        self.handle.stop();
    }

    /// Whether every thread has exited (after a stop, or a panic).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(|t| t.join.is_finished())
    }

    /// Number of runner threads.
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Stops the runner, waits for its threads, and returns the agents and
    /// counters; re-raises the first agent panic on this thread.
    pub fn join(self) -> Joined<A> {
        match self.try_join() {
            Ok(joined) => joined,
            Err(panic) => {
                tracing::error!("{panic}");
                panic.resume()
            }
        }
    }

    /// Stops the runner, waits for its threads, and returns the agents and
    /// counters, or the first agent panic (in thread order). After a panic
    /// the other threads still stop and are joined; their agents are dropped.
    pub fn try_join(mut self) -> Result<Joined<A>, AgentPanic> {
        self.stop();
        let threads = std::mem::take(&mut self.threads);
        let mut slots: Vec<Option<A>> = (0..self.agent_count).map(|_| None).collect();
        let mut thread_stats = Vec::with_capacity(threads.len());
        let mut first_panic = None;
        for thread in threads {
            match join_thread(thread.join, &thread.name) {
                Ok((agents, stats)) => {
                    assert_eq!(agents.len(), thread.indices.len(), "a runner thread lost agents");
                    for (index, agent) in thread.indices.into_iter().zip(agents) {
                        slots[index] = Some(agent);
                    }
                    thread_stats.push(stats);
                }
                Err(panic) => {
                    first_panic.get_or_insert(panic);
                }
            }
        }
        if let Some(panic) = first_panic {
            return Err(panic);
        }
        let mut stats = RunnerStats::default();
        for s in &thread_stats {
            stats.merge(s);
        }
        let agents = slots.into_iter().map(|a| a.expect("every agent comes back")).collect();
        Ok(Joined { agents, stats, thread_stats })
    }
}

impl<A: Agent + Send + 'static> Drop for Runner<A> {
    fn drop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.stop();
        let mut first_panic = None;
        for thread in std::mem::take(&mut self.threads) {
            if let Err(panic) = join_thread(thread.join, &thread.name) {
                tracing::error!("{panic}");
                first_panic.get_or_insert(panic);
            }
        }
        if let Some(panic) = first_panic
            && !std::thread::panicking()
        {
            panic.resume();
        }
    }
}

fn join_thread<A>(join: JoinHandle<ThreadOutcome<A>>, name: &str) -> ThreadOutcome<A> {
    match join.join() {
        Ok(outcome) => outcome,
        // A panic outside the agent callbacks (in the runner itself).
        Err(payload) => Err(AgentPanic::new("<runner>".to_owned(), name.to_owned(), payload)),
    }
}

fn resolve_cores(pinning: &CorePinning) -> Result<Option<Vec<usize>>, RunnerError> {
    match pinning {
        CorePinning::None => Ok(None),
        CorePinning::Cores(cores) if cores.is_empty() => Err(RunnerError::NoCores),
        CorePinning::Cores(cores) => Ok(Some(cores.clone())),
        CorePinning::RoundRobin => match core_affinity::get_core_ids() {
            Some(ids) if !ids.is_empty() => Ok(Some(ids.into_iter().map(|c| c.id).collect())),
            _ => {
                tracing::warn!("cannot list the cores; runner threads are not pinned");
                Ok(None)
            }
        },
    }
}

/// The body of a runner thread: pin, start, run until stopped, close. A
/// panic in any callback stops the whole runner and is returned.
fn run_thread<A: Agent, C: Clock>(
    mut lp: AgentLoop<A, C>,
    thread: String,
    core: Option<usize>,
    handle: RunnerHandle,
) -> ThreadOutcome<A> {
    if let Some(id) = core
        && !core_affinity::set_for_current(core_affinity::CoreId { id })
    {
        tracing::warn!(thread, core = id, "cannot pin runner thread");
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        lp.start();
        lp.run();
        lp.close();
    }));
    match outcome {
        Ok(()) => {
            let stats = lp.stats();
            Ok((lp.into_agents(), stats))
        }
        Err(payload) => {
            handle.stop();
            let panic = AgentPanic::new(lp.current_agent().to_owned(), thread, payload);
            tracing::error!("{panic}; stopping the runner");
            // The agents' state is unknown after a panic: drop them here.
            Err(panic)
        }
    }
}
