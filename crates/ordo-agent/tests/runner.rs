//! Runner behaviour with real threads: wake-ups, shared mode, stop, panics.
//! Every wait has a deadline; no test spins without bound.

use ordo_agent::{Agent, CorePinning, IdleStrategy, Runner, RunnerError, RunnerOptions, ThreadingMode};
use ordo_fabric::Doorbell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// Waits until `done()` or `limit` passes; returns whether `done()` held.
fn wait_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    done()
}

fn park_for(spins: u32, yields: u32, park_min: Duration, park_max: Duration) -> IdleStrategy {
    IdleStrategy::BackoffPark { spins, yields, park_min, park_max }
}

/// Work other threads hand to an agent: `pending` units, then a ring.
#[derive(Clone, Debug, Default)]
struct Mailbox {
    pending: Arc<AtomicU64>,
    processed: Arc<AtomicU64>,
    /// `do_work` calls so far.
    calls: Arc<AtomicU64>,
}

impl Mailbox {
    fn post(&self, n: u64, bell: &Doorbell) {
        self.pending.fetch_add(n, Ordering::Release);
        bell.ring();
    }
    fn processed(&self) -> u64 {
        self.processed.load(Ordering::Acquire)
    }

    /// Waits (up to 5 s) until the agent has been called at least
    /// `min_calls` times and then not at all for 50 ms: its thread is parked
    /// on a long timeout.
    fn wait_parked(&self, min_calls: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let before = self.calls.load(Ordering::Acquire);
            std::thread::sleep(Duration::from_millis(50));
            let after = self.calls.load(Ordering::Acquire);
            if after >= min_calls && after == before {
                return;
            }
            assert!(Instant::now() < deadline, "the runner did not park ({after} calls)");
        }
    }
}

/// Processes its mailbox, plus `budget` units of its own work, one a cycle.
#[derive(Debug)]
struct Worker {
    name: String,
    mailbox: Mailbox,
    bell: Option<Doorbell>,
    budget: u64,
    calls: u64,
    started: u32,
    closed: u32,
    threads: Vec<ThreadId>,
    panic_at_call: Option<u64>,
}

impl Worker {
    fn new(name: impl Into<String>, bell: Option<Doorbell>) -> Self {
        Worker {
            name: name.into(),
            mailbox: Mailbox::default(),
            bell,
            budget: 0,
            calls: 0,
            started: 0,
            closed: 0,
            threads: Vec::new(),
            panic_at_call: None,
        }
    }
}

impl Agent for Worker {
    fn name(&self) -> &str {
        &self.name
    }
    fn on_start(&mut self) {
        self.started += 1;
    }
    fn do_work(&mut self, _now_ns: u64) -> usize {
        self.calls += 1;
        self.mailbox.calls.fetch_add(1, Ordering::Release);
        if self.panic_at_call == Some(self.calls) {
            panic!("boom in {}", self.name);
        }
        let id = std::thread::current().id();
        if !self.threads.contains(&id) {
            self.threads.push(id);
        }
        let mut work = self.mailbox.pending.swap(0, Ordering::Acquire);
        if self.budget > 0 {
            self.budget -= 1;
            work += 1;
        }
        if work > 0 {
            self.mailbox.processed.fetch_add(work, Ordering::Release);
        }
        work as usize
    }
    fn on_close(&mut self) {
        self.closed += 1;
    }
    fn doorbell(&self) -> Option<Doorbell> {
        self.bell.clone()
    }
}

#[test]
fn a_parked_dedicated_runner_wakes_on_a_ring_long_before_park_max() {
    let bell = Doorbell::new_local();
    let worker = Worker::new("w", Some(bell.clone()));
    let mailbox = worker.mailbox.clone();
    // park_min = park_max = 5 s: without the ring the work waits ~5 s.
    let idle = park_for(10, 10, Duration::from_secs(5), Duration::from_secs(5));
    let runner = Runner::start(vec![worker], &RunnerOptions::new(ThreadingMode::Dedicated, idle)).unwrap();
    mailbox.wait_parked(21); // 10 spins, 10 yields, 1 park (+ its re-check)

    let posted = Instant::now();
    mailbox.post(1, &bell);
    assert!(wait_until(Duration::from_secs(3), || mailbox.processed() == 1), "work not seen");
    let woken_after = posted.elapsed();
    assert!(woken_after < Duration::from_secs(1), "woke after {woken_after:?}");
    // The ring found a waiter (seq only moves when someone is parked).
    assert_eq!(bell.seq(), 1);

    let joined = runner.join();
    let stats = joined.stats;
    assert!(stats.parks >= 1 && stats.wakeups >= 1, "{stats:?}");
    assert_eq!(stats.park_timeouts, 0, "{stats:?}");
    assert_eq!(stats.work_count, 1);
    let worker = &joined.agents[0];
    assert_eq!((worker.started, worker.closed), (1, 1));
    assert_eq!(worker.threads.len(), 1);
    assert_ne!(worker.threads[0], std::thread::current().id());
}

#[test]
fn stop_of_parked_runners_is_prompt_with_and_without_doorbells() {
    let idle = park_for(0, 0, Duration::from_secs(5), Duration::from_secs(5));
    for threading in [ThreadingMode::Dedicated, ThreadingMode::Shared] {
        // One agent with a bell, one without (parks on a private bell), one
        // with a different bell.
        let agents = vec![
            Worker::new("belled", Some(Doorbell::new_local())),
            Worker::new("bell-less", None),
            Worker::new("other-bell", Some(Doorbell::new_local())),
        ];
        let mailboxes: Vec<Mailbox> = agents.iter().map(|a| a.mailbox.clone()).collect();
        let runner = Runner::start(agents, &RunnerOptions::new(threading, idle)).unwrap();
        for m in &mailboxes {
            m.wait_parked(2); // an idle cycle and the park's re-check
        }
        assert!(!runner.is_finished());
        let asked = Instant::now();
        let joined = runner.join();
        let took = asked.elapsed();
        assert!(took < Duration::from_secs(1), "{threading:?}: stop took {took:?}");
        assert!(joined.stats.parks >= 1, "{threading:?}: {:?}", joined.stats);
        assert!(joined.agents.iter().all(|a| a.started == 1 && a.closed == 1));
        let names: Vec<&str> = joined.agents.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["belled", "bell-less", "other-bell"], "agents come back in order");
    }
}

#[test]
fn shared_mode_runs_16_agents_in_one_thread_and_all_make_progress() {
    let bell = Doorbell::new_local();
    let mut agents: Vec<Worker> = (0..16).map(|i| Worker::new(format!("m{i}"), Some(bell.clone()))).collect();
    for a in &mut agents {
        a.budget = 500;
    }
    let mailboxes: Vec<Mailbox> = agents.iter().map(|a| a.mailbox.clone()).collect();
    let idle = park_for(10, 10, Duration::from_secs(5), Duration::from_secs(5));
    let runner = Runner::start(agents, &RunnerOptions::new(ThreadingMode::Shared, idle)).unwrap();
    assert_eq!(runner.thread_count(), 1);
    assert!(
        wait_until(Duration::from_secs(5), || mailboxes.iter().all(|m| m.processed() == 500)),
        "own work not finished"
    );
    // All idle and parked on the common bell; one ring wakes the thread and
    // every agent's mail is seen.
    mailboxes[15].wait_parked(521);
    let posted = Instant::now();
    for m in &mailboxes {
        m.pending.fetch_add(1, Ordering::Release);
    }
    bell.ring();
    assert!(wait_until(Duration::from_secs(3), || mailboxes.iter().all(|m| m.processed() == 501)));
    assert!(posted.elapsed() < Duration::from_secs(1), "took {:?}", posted.elapsed());

    let joined = runner.join();
    assert_eq!(joined.thread_stats.len(), 1);
    assert_eq!(joined.stats.work_count, 16 * 501);
    assert!(joined.stats.wakeups >= 1, "{:?}", joined.stats);
    let thread = joined.agents[0].threads[0];
    assert_ne!(thread, std::thread::current().id());
    let first_calls = joined.agents[0].calls;
    for a in &joined.agents {
        assert_eq!(a.threads, [thread], "{} ran on another thread", a.name);
        assert_eq!(a.budget, 0);
        // Round-robin: every agent is called once per duty cycle.
        assert_eq!(a.calls, first_calls, "{}", a.name);
    }
}

#[test]
fn shared_mode_with_distinct_bells_sees_unrung_work_within_park_max() {
    let agents: Vec<Worker> =
        (0..16).map(|i| Worker::new(format!("m{i}"), Some(Doorbell::new_local()))).collect();
    let last_bell = agents[15].bell.clone().unwrap();
    let last = agents[15].mailbox.clone();
    let idle = park_for(10, 10, Duration::from_millis(1), Duration::from_millis(20));
    let runner = Runner::start(agents, &RunnerOptions::new(ThreadingMode::Shared, idle)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let posted = Instant::now();
    // The thread parks on agent 0's bell, so this ring wakes no one; the
    // park timeout (<= 20 ms) bounds the delay.
    last.post(1, &last_bell);
    assert!(wait_until(Duration::from_secs(3), || last.processed() == 1));
    assert!(posted.elapsed() < Duration::from_secs(1), "took {:?}", posted.elapsed());
    let joined = runner.join();
    assert!(joined.stats.park_timeouts >= 1, "{:?}", joined.stats);
}

#[test]
fn dedicated_mode_runs_each_agent_on_its_own_thread() {
    let agents: Vec<Worker> = (0..3)
        .map(|i| {
            let mut w = Worker::new(format!("d{i}"), None);
            w.budget = 100;
            w
        })
        .collect();
    let mailboxes: Vec<Mailbox> = agents.iter().map(|a| a.mailbox.clone()).collect();
    let runner =
        Runner::start(agents, &RunnerOptions::new(ThreadingMode::Dedicated, IdleStrategy::DEFAULT)).unwrap();
    assert_eq!(runner.thread_count(), 3);
    assert!(wait_until(Duration::from_secs(5), || mailboxes.iter().all(|m| m.processed() == 100)));
    let joined = runner.join();
    assert_eq!(joined.thread_stats.len(), 3);
    let mut threads: Vec<ThreadId> = joined.agents.iter().flat_map(|a| a.threads.clone()).collect();
    threads.dedup();
    assert_eq!(threads.len(), 3);
}

#[test]
fn busy_spin_and_spin_then_yield_run_and_stop() {
    for idle in [IdleStrategy::BusySpin, IdleStrategy::SpinThenYield { spins: 5 }] {
        let mut w = Worker::new("spinner", None);
        w.budget = 10;
        let m = w.mailbox.clone();
        let runner = Runner::start(vec![w], &RunnerOptions::new(ThreadingMode::Dedicated, idle)).unwrap();
        assert!(wait_until(Duration::from_secs(5), || m.processed() == 10));
        let joined = runner.join();
        assert_eq!(joined.stats.parks, 0, "{idle:?} never parks");
        match idle {
            IdleStrategy::BusySpin => assert_eq!(joined.stats.yields, 0),
            _ => assert!(joined.stats.yields > 0),
        }
    }
}

#[test]
fn an_agent_panic_stops_the_runner_and_surfaces_on_try_join() {
    for threading in [ThreadingMode::Dedicated, ThreadingMode::Shared] {
        let bell = Doorbell::new_local();
        let mut agents: Vec<Worker> =
            (0..3).map(|i| Worker::new(format!("agent-{i}"), Some(bell.clone()))).collect();
        agents[1].panic_at_call = Some(50);
        agents[1].budget = 1000;
        let idle = park_for(0, 0, Duration::from_secs(5), Duration::from_secs(5));
        let runner = Runner::start(agents, &RunnerOptions::new(threading, idle)).unwrap();
        let handle = runner.handle();
        // Nobody calls stop: the panic itself stops every thread.
        assert!(wait_until(Duration::from_secs(3), || handle.is_stopped() && runner.is_finished()));
        let panic = runner.try_join().expect_err("the panic must surface");
        assert_eq!(panic.agent, "agent-1", "{threading:?}");
        assert_eq!(panic.message, "boom in agent-1");
        assert!(panic.to_string().contains("agent `agent-1` panicked"), "{panic}");
    }
}

#[test]
fn join_reraises_an_agent_panic() {
    let mut w = Worker::new("doomed", None);
    w.panic_at_call = Some(3);
    w.budget = 10;
    let runner = Runner::start(vec![w], &RunnerOptions::default()).unwrap();
    let handle = runner.handle();
    assert!(wait_until(Duration::from_secs(3), || handle.is_stopped()));
    let result = catch_unwind(AssertUnwindSafe(|| runner.join()));
    let payload = result.expect_err("join re-raises");
    assert_eq!(payload.downcast_ref::<String>().map(String::as_str), Some("boom in doomed"));
}

#[test]
fn dropping_a_runner_reraises_an_agent_panic() {
    let mut w = Worker::new("dropped", None);
    w.panic_at_call = Some(1);
    let runner = Runner::start(vec![w], &RunnerOptions::default()).unwrap();
    let handle = runner.handle();
    assert!(wait_until(Duration::from_secs(3), || handle.is_stopped()));
    assert!(catch_unwind(AssertUnwindSafe(move || drop(runner))).is_err());
}

#[test]
fn a_stop_handle_works_from_another_thread() {
    let runner = Runner::start(
        vec![Worker::new("w", Some(Doorbell::new_local()))],
        &RunnerOptions::new(
            ThreadingMode::Dedicated,
            park_for(0, 0, Duration::from_secs(5), Duration::from_secs(5)),
        ),
    )
    .unwrap();
    let handle = runner.handle();
    let stopped = Arc::new(AtomicBool::new(false));
    let s2 = stopped.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        handle.stop();
        s2.store(true, Ordering::Release);
    });
    assert!(wait_until(Duration::from_secs(2), || runner.is_finished()));
    assert!(stopped.load(Ordering::Acquire));
    stopper.join().unwrap();
    runner.join();
}

#[test]
fn core_pinning_runs_and_an_empty_core_list_is_rejected() {
    let mut w = Worker::new("pinned", None);
    w.budget = 10;
    let m = w.mailbox.clone();
    let options = RunnerOptions::default().with_pinning(CorePinning::RoundRobin);
    let runner = Runner::start(vec![w], &options).unwrap();
    assert!(wait_until(Duration::from_secs(5), || m.processed() == 10));
    runner.join();

    let options = RunnerOptions::default().with_pinning(CorePinning::Cores(Vec::new()));
    let err = Runner::start(vec![Worker::new("x", None)], &options).err().expect("no cores");
    assert!(matches!(err, RunnerError::NoCores));
}

#[test]
fn an_empty_runner_starts_and_joins() {
    for threading in [ThreadingMode::Dedicated, ThreadingMode::Shared] {
        let runner =
            Runner::<Worker>::start(Vec::new(), &RunnerOptions::new(threading, IdleStrategy::DEFAULT))
                .unwrap();
        assert_eq!(runner.thread_count(), 0);
        assert!(runner.join().agents.is_empty());
    }
}

/// Different agent types run together as `Box<dyn Agent + Send>`.
#[test]
fn boxed_heterogeneous_agents_run() {
    struct Other(Arc<Mutex<u32>>);
    impl Agent for Other {
        fn name(&self) -> &str {
            "other"
        }
        fn do_work(&mut self, _now_ns: u64) -> usize {
            let mut n = self.0.lock().unwrap();
            if *n < 5 {
                *n += 1;
                1
            } else {
                0
            }
        }
        fn doorbell(&self) -> Option<Doorbell> {
            None
        }
    }
    let count = Arc::new(Mutex::new(0));
    let agents: Vec<Box<dyn Agent + Send>> =
        vec![Box::new(Other(count.clone())), Box::new(Worker::new("w", None))];
    let runner =
        Runner::start(agents, &RunnerOptions::new(ThreadingMode::Shared, IdleStrategy::DEFAULT)).unwrap();
    assert!(wait_until(Duration::from_secs(5), || *count.lock().unwrap() == 5));
    let joined = runner.join();
    assert_eq!(joined.agents[1].name(), "w");
}
