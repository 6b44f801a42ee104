//! [`AgentLoop`]: the duty cycle of one runner thread over one or more agents.
//!
//! One *duty cycle* reads the clock once and calls `do_work(now_ns)` on every
//! agent in order (round-robin), summing the work counts. After an idle cycle
//! the [`Idler`] picks spin, yield or park; parking is the doorbell protocol
//! of [`ordo_fabric::Doorbell`]:
//!
//! ```text
//! token = bell.prepare_park()      // announce the waiter (SeqCst)
//! if stop requested  -> cancel(token), stop
//! work = duty cycle                // the re-check
//! if work > 0        -> cancel(token), reset the backoff
//! else               -> bell.park(token, timeout)
//! ```
//!
//! A ringer that writes data and then rings either sees the waiter (and wakes
//! it) or its data is seen by the re-check, so no wake-up is lost. `stop`
//! works the same way: set the flag, then ring.
//!
//! An agent that runs alone on its thread and waits on something no bell
//! rings (the R2P2 network thread's socket) parks itself instead
//! ([`Agent::park_until_work`]), with its own announce / re-check / wait.
//!
//! # Which bell (shared mode)
//! - Every agent names the **same** bell ([`Doorbell::ptr_eq`]): park on it;
//!   a ring for any agent wakes the thread.
//! - Agents name **different** bells (or some none): a thread can wait on one
//!   futex only, so it parks on the first agent's bell, and a write for
//!   another agent is noticed when the park times out, i.e. within
//!   `park_max`. Give co-located members one shared bell (the shm backend's
//!   `doorbell_owner`) to avoid that delay.
//! - **No** agent has a bell: park on a private bell that only `stop` rings,
//!   so the park is a sleep of at most `park_max` that stop can cut short.
//!
//! # Invariants
//! - The loop owns its agents; `do_work` runs only on the thread that runs
//!   the loop.
//! - The stop flag is checked before every duty cycle and after every
//!   `prepare_park`, so a stopped loop exits after at most one duty cycle and
//!   never parks through a stop.

use crate::agent::Agent;
use crate::clock::{Clock, MonotonicClock};
use crate::idle::{IdleAction, IdleStrategy, Idler};
use ordo_fabric::Doorbell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Counters of one runner thread (or the sum over a runner's threads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunnerStats {
    /// Duty cycles run (including the re-check cycles of parks).
    pub duty_cycles: u64,
    /// Sum of the work counts the agents returned.
    pub work_count: u64,
    /// Idle cycles answered with a spin.
    pub spins: u64,
    /// Idle cycles answered with a yield.
    pub yields: u64,
    /// Parks entered (futex waits).
    pub parks: u64,
    /// Parks that ended because the bell rang (or changed before the wait).
    pub wakeups: u64,
    /// Parks that ended by their timeout.
    pub park_timeouts: u64,
    /// Prepared parks abandoned because the re-check found work or a stop.
    pub parks_cancelled: u64,
}

impl RunnerStats {
    /// Adds `other`'s counters to these.
    pub fn merge(&mut self, other: &RunnerStats) {
        self.duty_cycles += other.duty_cycles;
        self.work_count += other.work_count;
        self.spins += other.spins;
        self.yields += other.yields;
        self.parks += other.parks;
        self.wakeups += other.wakeups;
        self.park_timeouts += other.park_timeouts;
        self.parks_cancelled += other.parks_cancelled;
    }
}

/// What one [`AgentLoop::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The duty cycle did this much work; the backoff is reset.
    Worked(usize),
    /// Idle; spun.
    Spun,
    /// Idle; yielded the core.
    Yielded,
    /// Idle; parked for at most `timeout`. `woken`: a ring ended it.
    Parked {
        /// The longest the park could last, as chosen by the idle backoff.
        timeout: Duration,
        /// `true` if a doorbell ring ended the park, `false` if it timed out.
        woken: bool,
    },
    /// Idle, but the re-check after `prepare_park` did `work`; not parked.
    ParkCancelled {
        /// Work items the re-check's duty cycle did (always > 0).
        work: usize,
    },
    /// The stop flag is set; nothing was done.
    Stopped,
}

/// Which bell the loop parks on, and why (see the module docs).
#[derive(Clone, Debug)]
pub enum ParkBell {
    /// Every agent rings this bell.
    Common(Doorbell),
    /// Agents ring different bells (or some none); this is the first one.
    FirstOfMany(Doorbell),
    /// No agent has a bell; a private one that only `stop` rings.
    Private(Doorbell),
}

impl ParkBell {
    fn for_agents<A: Agent>(agents: &[A]) -> ParkBell {
        let bells: Vec<Option<Doorbell>> = agents.iter().map(Agent::doorbell).collect();
        let first = bells.iter().flatten().next().cloned();
        match first {
            None => ParkBell::Private(Doorbell::new_local()),
            Some(first) => {
                let all_same = bells.iter().all(|b| b.as_ref().is_some_and(|b| b.ptr_eq(&first)));
                if all_same { ParkBell::Common(first) } else { ParkBell::FirstOfMany(first) }
            }
        }
    }

    /// The bell itself.
    pub fn bell(&self) -> &Doorbell {
        match self {
            ParkBell::Common(b) | ParkBell::FirstOfMany(b) | ParkBell::Private(b) => b,
        }
    }
}

/// The duty cycle and idle strategy of one runner thread over its agents.
///
/// [`Runner`](crate::Runner) runs one per thread; it is public so a caller
/// can drive agents on a thread of its own (or step it in a test).
pub struct AgentLoop<A, C = MonotonicClock> {
    agents: Vec<A>,
    names: Vec<String>,
    clock: C,
    idler: Idler,
    park_bell: ParkBell,
    stop: Arc<AtomicBool>,
    stats: RunnerStats,
    /// Index of the agent being called, for panic reports.
    current: usize,
}

impl<A: Agent, C: Clock> AgentLoop<A, C> {
    /// A loop over `agents` with its own stop flag.
    pub fn new(agents: Vec<A>, strategy: IdleStrategy, clock: C) -> Self {
        Self::with_stop_flag(agents, strategy, clock, Arc::new(AtomicBool::new(false)))
    }

    /// A loop over `agents` that stops when `stop` becomes true (ring
    /// [`park_bell`](Self::park_bell) after setting it).
    pub fn with_stop_flag(agents: Vec<A>, strategy: IdleStrategy, clock: C, stop: Arc<AtomicBool>) -> Self {
        let names = agents.iter().map(|a| a.name().to_owned()).collect();
        let park_bell = ParkBell::for_agents(&agents);
        AgentLoop {
            agents,
            names,
            clock,
            idler: Idler::new(strategy),
            park_bell,
            stop,
            stats: RunnerStats::default(),
            current: 0,
        }
    }

    /// The bell this loop parks on; ring it after setting the stop flag.
    pub fn park_bell(&self) -> &ParkBell {
        &self.park_bell
    }

    /// The stop flag.
    pub fn stop_flag(&self) -> &Arc<AtomicBool> {
        &self.stop
    }

    /// Sets the stop flag and rings the park bell (from any thread that
    /// holds the flag and bell, this is how to stop a running loop).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.park_bell.bell().ring();
    }

    /// The agents.
    pub fn agents(&self) -> &[A] {
        &self.agents
    }

    /// The agents' names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The name of the agent called last (the culprit if a call panicked).
    pub fn current_agent(&self) -> &str {
        self.names.get(self.current).map_or("<none>", String::as_str)
    }

    /// Counters so far.
    pub fn stats(&self) -> RunnerStats {
        self.stats
    }

    /// The agents back, ending the loop.
    pub fn into_agents(self) -> Vec<A> {
        self.agents
    }

    /// Calls every agent's `on_start`.
    pub fn start(&mut self) {
        for (i, agent) in self.agents.iter_mut().enumerate() {
            self.current = i;
            agent.on_start();
        }
    }

    /// Calls every agent's `on_close`.
    pub fn close(&mut self) {
        for (i, agent) in self.agents.iter_mut().enumerate() {
            self.current = i;
            agent.on_close();
        }
    }

    /// Steps until the stop flag is set.
    pub fn run(&mut self) {
        while self.step() != Step::Stopped {}
    }

    /// One duty cycle over all agents; returns the summed work count.
    #[inline]
    fn duty_cycle(&mut self) -> usize {
        let now_ns = self.clock.now_ns();
        let mut work = 0usize;
        for (i, agent) in self.agents.iter_mut().enumerate() {
            self.current = i;
            work = work.saturating_add(agent.do_work(now_ns));
        }
        self.stats.duty_cycles += 1;
        self.stats.work_count += work as u64;
        work
    }

    /// One duty cycle, then the idle action it calls for.
    pub fn step(&mut self) -> Step {
        if self.stop.load(Ordering::Relaxed) {
            return Step::Stopped;
        }
        let work = self.duty_cycle();
        match self.idler.idle(work) {
            None => Step::Worked(work),
            Some(IdleAction::Spin) => {
                self.stats.spins += 1;
                IdleAction::Spin.spin_or_yield();
                Step::Spun
            }
            Some(IdleAction::Yield) => {
                self.stats.yields += 1;
                IdleAction::Yield.spin_or_yield();
                Step::Yielded
            }
            Some(IdleAction::Park(timeout)) => self.park(timeout),
        }
    }

    /// The doorbell protocol: prepare, re-check (stop flag, then a duty
    /// cycle), park or cancel.
    fn park(&mut self, timeout: Duration) -> Step {
        if self.agents.len() == 1 {
            if self.stop.load(Ordering::SeqCst) {
                return Step::Stopped;
            }
            // An agent with its own waiting (a socket): it announces,
            // re-checks and waits itself.
            if let Some(woken) = self.agents[0].park_until_work(timeout) {
                self.stats.parks += 1;
                if woken {
                    self.stats.wakeups += 1;
                } else {
                    self.stats.park_timeouts += 1;
                }
                return Step::Parked { timeout, woken };
            }
        }
        let bell = self.park_bell.bell().clone();
        let token = bell.prepare_park();
        if self.stop.load(Ordering::SeqCst) {
            bell.cancel(token);
            self.stats.parks_cancelled += 1;
            return Step::Stopped;
        }
        let work = self.duty_cycle();
        if work > 0 {
            bell.cancel(token);
            self.stats.parks_cancelled += 1;
            self.idler.reset();
            return Step::ParkCancelled { work };
        }
        self.stats.parks += 1;
        let woken = bell.park(token, timeout);
        if woken {
            self.stats.wakeups += 1;
        } else {
            self.stats.park_timeouts += 1;
        }
        Step::Parked { timeout, woken }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Returns scripted work counts (then 0), counting calls.
    struct Scripted {
        script: VecDeque<usize>,
        calls: usize,
        bell: Option<Doorbell>,
    }

    impl Scripted {
        fn new(script: &[usize], bell: Option<Doorbell>) -> Self {
            Scripted { script: script.iter().copied().collect(), calls: 0, bell }
        }
    }

    impl Agent for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        fn do_work(&mut self, _now_ns: u64) -> usize {
            self.calls += 1;
            self.script.pop_front().unwrap_or(0)
        }
        fn doorbell(&self) -> Option<Doorbell> {
            self.bell.clone()
        }
    }

    fn strategy(spins: u32, yields: u32, min_us: u64, max_us: u64) -> IdleStrategy {
        IdleStrategy::BackoffPark {
            spins,
            yields,
            park_min: Duration::from_micros(min_us),
            park_max: Duration::from_micros(max_us),
        }
    }

    fn parked(step: Step) -> Duration {
        match step {
            Step::Parked { timeout, woken: false } => timeout,
            other => panic!("expected a timed-out park, got {other:?}"),
        }
    }

    #[test]
    fn phases_spin_then_yield_then_park_doubling_and_work_resets() {
        let bell = Doorbell::new_local();
        // work on the 1st cycle; then idle; after 2 spins, 2 yields, 3 parks
        // (3 re-checks), work again on the cycle after.
        let mut script = vec![4];
        script.extend([0; 4 + 3 * 2]);
        script.push(1);
        let agent = Scripted::new(&script, Some(bell));
        let mut lp = AgentLoop::new(vec![agent], strategy(2, 2, 200, 500), MonotonicClock::new());
        assert!(matches!(lp.park_bell(), ParkBell::Common(_)));
        assert_eq!(lp.step(), Step::Worked(4));
        assert_eq!(lp.step(), Step::Spun);
        assert_eq!(lp.step(), Step::Spun);
        assert_eq!(lp.step(), Step::Yielded);
        assert_eq!(lp.step(), Step::Yielded);
        assert_eq!(parked(lp.step()), Duration::from_micros(200));
        assert_eq!(parked(lp.step()), Duration::from_micros(400));
        assert_eq!(parked(lp.step()), Duration::from_micros(500));
        assert_eq!(lp.step(), Step::Worked(1));
        // Reset: spinning again.
        assert_eq!(lp.step(), Step::Spun);
        let stats = lp.stats();
        assert_eq!(stats.parks, 3);
        assert_eq!(stats.park_timeouts, 3);
        assert_eq!(stats.wakeups, 0);
        assert_eq!(stats.spins, 3);
        assert_eq!(stats.yields, 2);
        assert_eq!(stats.work_count, 5);
        // 10 plain cycles + 3 re-checks.
        assert_eq!(stats.duty_cycles, 13);
        assert_eq!(lp.agents()[0].calls, 13);
    }

    #[test]
    fn work_found_by_the_recheck_cancels_the_park_and_resets() {
        // Idle once (-> park), the re-check finds work.
        let agent = Scripted::new(&[0, 7], None);
        let mut lp = AgentLoop::new(vec![agent], strategy(0, 0, 100_000, 100_000), MonotonicClock::new());
        assert!(matches!(lp.park_bell(), ParkBell::Private(_)));
        assert_eq!(lp.step(), Step::ParkCancelled { work: 7 });
        // Reset: the next park is again park_min, not doubled.
        let start = std::time::Instant::now();
        assert_eq!(parked(lp.step()), Duration::from_millis(100));
        assert!(start.elapsed() >= Duration::from_millis(90));
        assert_eq!(lp.stats().parks_cancelled, 1);
    }

    /// An agent that waits on its own source (a socket) parks itself.
    struct SelfParking {
        parks: Vec<Duration>,
        wake_on: usize,
    }

    impl Agent for SelfParking {
        fn name(&self) -> &str {
            "self-parking"
        }
        fn do_work(&mut self, _now_ns: u64) -> usize {
            0
        }
        fn park_until_work(&mut self, timeout: Duration) -> Option<bool> {
            self.parks.push(timeout);
            Some(self.parks.len() == self.wake_on)
        }
        fn doorbell(&self) -> Option<Doorbell> {
            None
        }
    }

    #[test]
    fn an_agent_alone_on_its_thread_parks_itself_and_a_stop_comes_first() {
        let agent = SelfParking { parks: Vec::new(), wake_on: 2 };
        let mut lp = AgentLoop::new(vec![agent], strategy(0, 0, 100, 200), MonotonicClock::new());
        // The agent's own park, with the strategy's backoff; no doorbell park.
        assert_eq!(lp.step(), Step::Parked { timeout: Duration::from_micros(100), woken: false });
        assert_eq!(lp.step(), Step::Parked { timeout: Duration::from_micros(200), woken: true });
        assert_eq!(lp.agents()[0].parks, vec![Duration::from_micros(100), Duration::from_micros(200)]);
        let stats = lp.stats();
        assert_eq!((stats.parks, stats.wakeups, stats.park_timeouts, stats.parks_cancelled), (2, 1, 1, 0));
        // A stop is checked before the agent is asked to park.
        lp.request_stop();
        assert_eq!(lp.step(), Step::Stopped);
        assert_eq!(lp.agents()[0].parks.len(), 2);
    }

    #[test]
    fn a_set_stop_flag_prevents_parking() {
        let agent = Scripted::new(&[], None);
        let mut lp =
            AgentLoop::new(vec![agent], strategy(0, 0, 10_000_000, 10_000_000), MonotonicClock::new());
        lp.request_stop();
        assert_eq!(lp.step(), Step::Stopped);
        lp.run(); // returns at once
        assert_eq!(lp.stats().parks, 0);
    }

    #[test]
    fn different_bells_park_on_the_first() {
        let (a, b) = (Doorbell::new_local(), Doorbell::new_local());
        let agents = vec![Scripted::new(&[], Some(a.clone())), Scripted::new(&[], Some(b))];
        let lp = AgentLoop::new(agents, IdleStrategy::DEFAULT, MonotonicClock::new());
        match lp.park_bell() {
            ParkBell::FirstOfMany(bell) => assert!(bell.ptr_eq(&a)),
            other => panic!("{other:?}"),
        }
        let agents = vec![Scripted::new(&[], Some(a.clone())), Scripted::new(&[], Some(a.clone()))];
        let lp = AgentLoop::new(agents, IdleStrategy::DEFAULT, MonotonicClock::new());
        assert!(matches!(lp.park_bell(), ParkBell::Common(bell) if bell.ptr_eq(&a)));
        let agents = vec![Scripted::new(&[], None), Scripted::new(&[], Some(a.clone()))];
        let lp = AgentLoop::new(agents, IdleStrategy::DEFAULT, MonotonicClock::new());
        assert!(matches!(lp.park_bell(), ParkBell::FirstOfMany(bell) if bell.ptr_eq(&a)));
    }
}
