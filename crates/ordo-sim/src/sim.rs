//! The discrete-event scheduler: every member's process in one thread.
//!
//! # Invariants
//! - **Determinism.** A [`Sim`] built from one seed, configuration and
//!   factory runs the same steps in the same order every time: events are
//!   taken in `(time, sequence)` order from one queue, members woken by the
//!   same event are polled in id order, and every random choice (poll cost,
//!   fault schedule, process randomness) comes from its own seeded stream.
//! - **Polls.** A member's process is polled when something concerns it (a
//!   write landed in its region, a fabric event, a datagram, one of its
//!   timers), or again right after a poll that reported work. Each poll costs
//!   a simulated CPU time drawn from the seed, during which the member is not
//!   polled again. When every member is idle the clock jumps to the next
//!   event.
//! - **Crash** drops the process (all its state) and its endpoints;
//!   **restart** builds a new process from the factory, for a new incarnation.
//!   Timers and polls of an older incarnation never reach the new one.
//! - **Bounded.** A run stops at [`RunLimits::max_time_ns`] or
//!   [`RunLimits::max_steps`], or when quiescent: after
//!   [`RunLimits::quiesce_after_ns`], every member alive and every process
//!   reporting [`SimProcess::done`].
//! - **Faults** (the nemesis) follow a [`FaultPlan`] drawn from the seed:
//!   until `until_ns` it cuts pairs, splits the group and crashes members
//!   (never more than `max_crashed` at once), healing and restarting them
//!   later; at `until_ns` it heals everything, restarts every crashed member
//!   and switches off random network faults, so liveness can be required.

use crate::fabric::SimFabric;
use crate::history::{FaultNote, History};
use crate::net::{NetError, SimSocket};
use crate::rng::{SimRng, derive_seed, stream};
use crate::world::{Event, NemesisAction, SimConfig, Stepped, World};
use ordo_fabric::MemberId;
use std::sync::{Arc, Mutex};

/// A member's program under simulation: a sans-I/O state machine polled by
/// the scheduler. It must not block, sleep, read clocks or draw randomness
/// other than through its [`Ctx`].
pub trait SimProcess<E> {
    /// Does whatever work is ready and returns how much (0 = idle; the
    /// scheduler then waits for something that concerns this member).
    fn poll(&mut self, ctx: &mut Ctx<'_, E>) -> usize;

    /// Whether this member has finished what the run asks of it (used only
    /// to stop a run early once faults are over).
    fn done(&self) -> bool {
        true
    }
}

/// Builds the process of a member's new incarnation (at start and after
/// every restart). The context belongs to the new incarnation.
pub type Factory<E> = Box<dyn FnMut(&mut Ctx<'_, E>) -> Box<dyn SimProcess<E>>>;

/// What a process sees of the world during one poll.
pub struct Ctx<'a, E> {
    member: MemberId,
    incarnation: u64,
    now_ns: u64,
    fabric: &'a mut SimFabric,
    world: &'a Arc<Mutex<World>>,
    history: &'a mut History<E>,
    timer: &'a mut Option<u64>,
    rng: &'a mut SimRng,
}

impl<E> Ctx<'_, E> {
    /// Simulated time of this poll.
    pub fn now(&self) -> u64 {
        self.now_ns
    }

    /// This member.
    pub fn member(&self) -> MemberId {
        self.member
    }

    /// This member's incarnation (the first is 1).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// This incarnation's fabric endpoint (clone it to keep one).
    pub fn fabric(&mut self) -> &mut SimFabric {
        self.fabric
    }

    /// Binds a datagram socket on `port` of this incarnation.
    pub fn bind(&mut self, port: u16) -> Result<SimSocket, NetError> {
        SimSocket::bind(self.world, self.member, self.incarnation, port)
    }

    /// Records `event` in the run's history.
    pub fn record(&mut self, event: E) {
        self.history.record(self.now_ns, self.member, self.incarnation, event);
    }

    /// Asks to be polled at `t_ns` (or right away if that has passed). Only
    /// the earliest pending request is kept; ask again after it fired.
    pub fn wake_at(&mut self, t_ns: u64) {
        let t = t_ns.max(self.now_ns);
        if self.timer.is_none_or(|old| t < old) {
            *self.timer = Some(t);
        }
    }

    /// This incarnation's own seeded random stream.
    pub fn rng(&mut self) -> &mut SimRng {
        self.rng
    }
}

/// When faults happen (all times in simulated ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultPlan {
    /// First fault no earlier than this.
    pub start_ns: u64,
    /// No new fault from here on; everything heals and restarts at this time.
    pub until_ns: u64,
    /// Time between fault actions.
    pub gap_min_ns: u64,
    /// Largest time between fault actions.
    pub gap_max_ns: u64,
    /// Relative weights of the actions: cut one pair, split the group in two,
    /// crash a member, do nothing.
    pub weight_cut: u32,
    /// Weight of splitting the group.
    pub weight_split: u32,
    /// Weight of crashing a member.
    pub weight_crash: u32,
    /// Weight of doing nothing.
    pub weight_none: u32,
    /// How long a partition lasts.
    pub partition_min_ns: u64,
    /// Longest partition.
    pub partition_max_ns: u64,
    /// How long a crashed member stays down.
    pub down_min_ns: u64,
    /// Longest downtime.
    pub down_max_ns: u64,
    /// Most members down at once.
    pub max_crashed: u32,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            start_ns: 100_000,
            until_ns: 4_000_000,
            gap_min_ns: 100_000,
            gap_max_ns: 800_000,
            weight_cut: 3,
            weight_split: 2,
            weight_crash: 2,
            weight_none: 1,
            partition_min_ns: 50_000,
            partition_max_ns: 1_000_000,
            down_min_ns: 50_000,
            down_max_ns: 1_000_000,
            max_crashed: 1,
        }
    }
}

impl FaultPlan {
    /// The plan the substrate workloads draw for a group of `members` (≥ 2):
    /// faults from within the first 0.3 ms until 1-8 ms, cuts, splits and
    /// crashes (at most `members - 1` down at once), partitions and downtimes
    /// of 20 µs to 1.5 ms. The draws happen in a fixed order, so a seed keeps
    /// its plan.
    pub fn draw(rng: &mut SimRng, members: u32) -> FaultPlan {
        assert!(members >= 2, "a fault plan needs a group");
        let until_ns = rng.range(1_000_000, 8_000_000);
        FaultPlan {
            start_ns: rng.range(0, 300_000),
            until_ns,
            gap_min_ns: 50_000,
            gap_max_ns: rng.range(100_000, 800_000),
            weight_cut: rng.range(0, 4) as u32,
            weight_split: rng.range(0, 3) as u32,
            weight_crash: rng.range(0, 3) as u32,
            weight_none: 1,
            partition_min_ns: 20_000,
            partition_max_ns: rng.range(50_000, 1_500_000),
            down_min_ns: 20_000,
            down_max_ns: rng.range(50_000, 1_500_000),
            max_crashed: rng.range(1, u64::from(members - 1)) as u32,
        }
    }
}

/// Bounds of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunLimits {
    /// Stop at this simulated time.
    pub max_time_ns: u64,
    /// Stop after this many events.
    pub max_steps: u64,
    /// From this time on, stop as soon as every member is alive and done.
    pub quiesce_after_ns: Option<u64>,
}

impl RunLimits {
    /// Limits for a run whose faults stop at `until_ns` and that needs
    /// `settle_ns` after that to converge: stop once quiescent after
    /// `until_ns + settle_ns`, and at the latest 50 ms after the faults.
    pub fn after_faults(until_ns: u64, settle_ns: u64) -> RunLimits {
        RunLimits {
            max_time_ns: until_ns + 50_000_000,
            max_steps: 3_000_000,
            quiesce_after_ns: Some(until_ns + settle_ns),
        }
    }
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits { max_time_ns: 100_000_000, max_steps: 5_000_000, quiesce_after_ns: None }
    }
}

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Outcome {
    /// Every member alive and done after `quiesce_after_ns`.
    Quiesced,
    /// No event left at all.
    Idle,
    /// Reached `max_time_ns`.
    TimeLimit,
    /// Reached `max_steps`.
    StepLimit,
}

/// Counters of the scheduler.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SimStats {
    /// Events processed.
    pub steps: u64,
    /// Process polls.
    pub polls: u64,
    /// Members crashed.
    pub crashes: u64,
    /// Members restarted.
    pub restarts: u64,
    /// Cuts and splits.
    pub partitions: u64,
    /// Fault actions taken by the nemesis (crashes, cuts, splits).
    pub faults: u64,
}

struct Slot<E> {
    process: Option<Box<dyn SimProcess<E>>>,
    fabric: SimFabric,
    rng: SimRng,
    busy_until_ns: u64,
    poll_key: Option<(u64, u64)>,
    /// A timer requested during the current poll.
    timer_ns: Option<u64>,
    /// The earliest timer scheduled and not yet fired.
    armed_ns: Option<u64>,
}

struct Nemesis {
    plan: FaultPlan,
    rng: SimRng,
}

/// A simulation of a group: a world plus one process per member.
pub struct Sim<E> {
    seed: u64,
    world: Arc<Mutex<World>>,
    slots: Vec<Slot<E>>,
    factory: Factory<E>,
    history: History<E>,
    cpu_rng: SimRng,
    nemesis: Option<Nemesis>,
    stats: SimStats,
    woken: Vec<MemberId>,
}

impl<E> Sim<E> {
    /// A simulation of `cfg.members` members, each running a process from
    /// `factory`, with faults from `faults` if given.
    pub fn new(seed: u64, cfg: SimConfig, faults: Option<FaultPlan>, factory: Factory<E>) -> Sim<E> {
        let members = cfg.members;
        let world = Arc::new(Mutex::new(World::new(cfg, seed)));
        let slots = (0..members)
            .map(|m| Slot {
                process: None,
                fabric: SimFabric::attach(&world, m),
                rng: SimRng::new(derive_seed(seed, process_stream(m, 1))),
                busy_until_ns: 0,
                poll_key: None,
                timer_ns: None,
                armed_ns: None,
            })
            .collect();
        let mut sim = Sim {
            seed,
            world,
            slots,
            factory,
            history: History::new(members),
            cpu_rng: SimRng::new(derive_seed(seed, stream::CPU)),
            nemesis: None,
            stats: SimStats::default(),
            woken: Vec::new(),
        };
        for m in 0..members {
            sim.boot(m);
        }
        if let Some(plan) = faults {
            assert!(plan.start_ns <= plan.until_ns, "fault plan ends before it starts");
            let mut rng = SimRng::new(derive_seed(seed, stream::NEMESIS));
            let first = plan.start_ns + rng.range(0, plan.gap_max_ns);
            let mut w = sim.lock();
            if first < plan.until_ns {
                w.schedule(first, Event::Nemesis(NemesisAction::Tick));
            }
            w.schedule(plan.until_ns, Event::Nemesis(NemesisAction::Calm));
            drop(w);
            sim.nemesis = Some(Nemesis { plan, rng });
        }
        sim
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().expect("world lock")
    }

    /// The seed this simulation was built from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The shared world (for scripted scenarios and inspection).
    pub fn world(&self) -> &Arc<Mutex<World>> {
        &self.world
    }

    /// Current simulated time.
    pub fn now_ns(&self) -> u64 {
        self.lock().now_ns()
    }

    /// The history so far.
    pub fn history(&self) -> &History<E> {
        &self.history
    }

    /// Takes the history out (the run's end time set).
    pub fn into_history(mut self) -> History<E> {
        self.history.end_ns = self.now_ns();
        self.history
    }

    /// Scheduler counters.
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }

    /// Whether every member is alive and its process reports done.
    pub fn all_done(&self) -> bool {
        self.slots.iter().all(|s| s.process.as_ref().is_some_and(|p| p.done()))
    }

    fn boot(&mut self, m: MemberId) {
        let (now, incarnation) = {
            let w = self.lock();
            (w.now_ns(), w.incarnation(m))
        };
        let slot = &mut self.slots[m as usize];
        slot.fabric = SimFabric::attach(&self.world, m);
        slot.rng = SimRng::new(derive_seed(self.seed, process_stream(m, incarnation)));
        slot.timer_ns = None;
        slot.armed_ns = None;
        slot.poll_key = None;
        let mut ctx = Ctx {
            member: m,
            incarnation,
            now_ns: now,
            fabric: &mut slot.fabric,
            world: &self.world,
            history: &mut self.history,
            timer: &mut slot.timer_ns,
            rng: &mut slot.rng,
        };
        slot.process = Some((self.factory)(&mut ctx));
        self.arm_timer(m, incarnation);
        self.request_poll(m, now);
    }

    fn request_poll(&mut self, m: MemberId, at_ns: u64) {
        let slot = &self.slots[m as usize];
        if slot.process.is_none() {
            return;
        }
        let at = at_ns.max(slot.busy_until_ns);
        if slot.poll_key.is_some_and(|(t, _)| t <= at) {
            return;
        }
        let key = self.lock().schedule(at, Event::Poll { member: m });
        self.slots[m as usize].poll_key = Some(key);
    }

    fn arm_timer(&mut self, m: MemberId, incarnation: u64) {
        let slot = &mut self.slots[m as usize];
        let Some(t) = slot.timer_ns.take() else { return };
        if slot.armed_ns.is_some_and(|armed| armed <= t) {
            return; // an earlier timer is pending; the process asks again then
        }
        slot.armed_ns = Some(t);
        self.lock().schedule(t, Event::Timer { member: m, incarnation });
    }

    fn poll(&mut self, m: MemberId) {
        let (now, incarnation) = {
            let w = self.lock();
            (w.now_ns(), w.incarnation(m))
        };
        let (lo, hi) = self.world_cfg_cost();
        let cost = self.cpu_rng.range(lo, hi);
        let slot = &mut self.slots[m as usize];
        let mut process = slot.process.take().expect("polled member has a process");
        slot.poll_key = None;
        let mut ctx = Ctx {
            member: m,
            incarnation,
            now_ns: now,
            fabric: &mut slot.fabric,
            world: &self.world,
            history: &mut self.history,
            timer: &mut slot.timer_ns,
            rng: &mut slot.rng,
        };
        let work = process.poll(&mut ctx);
        slot.process = Some(process);
        slot.busy_until_ns = now + cost;
        self.stats.polls += 1;
        self.arm_timer(m, incarnation);
        if work > 0 {
            self.request_poll(m, now + cost);
        }
    }

    fn world_cfg_cost(&self) -> (u64, u64) {
        let w = self.lock();
        (w.cfg.poll_cost_min_ns, w.cfg.poll_cost_max_ns)
    }

    /// Crashes `m` now: its process and endpoints are gone.
    pub fn crash(&mut self, m: MemberId) {
        let now = {
            let mut w = self.lock();
            if !w.is_alive(m) {
                return;
            }
            w.crash(m);
            w.now_ns()
        };
        let slot = &mut self.slots[m as usize];
        slot.process = None;
        slot.poll_key = None;
        slot.timer_ns = None;
        slot.armed_ns = None;
        self.stats.crashes += 1;
        self.history.note(now, FaultNote::Crash { member: m });
        tracing::debug!(member = m, now, "crash");
    }

    /// Restarts a crashed `m` as a new incarnation with a new process.
    pub fn restart(&mut self, m: MemberId) {
        let (now, incarnation) = {
            let mut w = self.lock();
            if w.is_alive(m) {
                return;
            }
            let inc = w.restart(m);
            (w.now_ns(), inc)
        };
        self.stats.restarts += 1;
        self.history.note(now, FaultNote::Restart { member: m, incarnation });
        tracing::debug!(member = m, incarnation, now, "restart");
        self.boot(m);
    }

    /// Cuts the pair `a`-`b` (see [`World::cut`]).
    pub fn cut(&mut self, a: MemberId, b: MemberId) {
        let now = {
            let mut w = self.lock();
            w.cut(a, b);
            w.now_ns()
        };
        self.stats.partitions += 1;
        self.history.note(now, FaultNote::Cut { a, b });
        self.wake_from_world();
    }

    /// Heals one cut of the pair `a`-`b`.
    pub fn heal(&mut self, a: MemberId, b: MemberId) {
        let now = {
            let mut w = self.lock();
            w.heal(a, b);
            w.now_ns()
        };
        self.history.note(now, FaultNote::Heal { a, b });
    }

    /// Partitions `side` from the rest of the group.
    pub fn split(&mut self, side: Vec<MemberId>) {
        let now = {
            let mut w = self.lock();
            w.split(&side);
            w.now_ns()
        };
        self.stats.partitions += 1;
        self.history.note(now, FaultNote::Split { side });
        self.wake_from_world();
    }

    /// Heals one [`split`](Self::split) of `side`.
    pub fn heal_split(&mut self, side: Vec<MemberId>) {
        let now = {
            let mut w = self.lock();
            w.heal_split(&side);
            w.now_ns()
        };
        self.history.note(now, FaultNote::HealSplit { side });
    }

    /// Stops all faults: heals every partition, restarts every crashed
    /// member, switches off random network faults.
    pub fn calm(&mut self) {
        let now = {
            let mut w = self.lock();
            w.heal_all();
            w.calm_network();
            w.now_ns()
        };
        self.history.note(now, FaultNote::Calm);
        for m in 0..self.slots.len() as MemberId {
            self.restart(m);
        }
        if let Some(n) = &mut self.nemesis {
            n.plan.until_ns = n.plan.until_ns.min(now);
        }
    }

    fn wake_from_world(&mut self) {
        let mut woken = std::mem::take(&mut self.woken);
        self.lock().take_woken(&mut woken);
        let now = self.now_ns();
        for m in woken.drain(..) {
            self.request_poll(m, now);
        }
        self.woken = woken;
    }

    fn on_nemesis(&mut self, action: NemesisAction) {
        let now = self.now_ns();
        match action {
            NemesisAction::Tick => self.nemesis_tick(now),
            NemesisAction::HealPair(a, b) => self.heal(a, b),
            NemesisAction::HealSplit(side) => self.heal_split(side),
            NemesisAction::Restart(m) => self.restart(m),
            NemesisAction::Calm => self.calm(),
        }
    }

    fn nemesis_tick(&mut self, now: u64) {
        let Some(mut nemesis) = self.nemesis.take() else { return };
        let plan = nemesis.plan.clone();
        if now >= plan.until_ns {
            self.nemesis = Some(nemesis);
            return;
        }
        let rng = &mut nemesis.rng;
        let n = self.slots.len() as MemberId;
        let weights = [plan.weight_cut, plan.weight_split, plan.weight_crash, plan.weight_none];
        let mut later = Vec::new();
        match rng.weighted(&weights) {
            0 if n >= 2 => {
                let a = rng.below(u64::from(n)) as MemberId;
                let b = (a + 1 + rng.below(u64::from(n - 1)) as MemberId) % n;
                self.cut(a, b);
                let heal = now + rng.range(plan.partition_min_ns, plan.partition_max_ns);
                later.push((heal, NemesisAction::HealPair(a, b)));
                self.stats.faults += 1;
            }
            1 if n >= 2 => {
                let mut members: Vec<MemberId> = (0..n).collect();
                rng.shuffle(&mut members);
                let size = 1 + rng.below(u64::from(n - 1)) as usize;
                let mut side = members[..size].to_vec();
                side.sort_unstable();
                self.split(side.clone());
                let heal = now + rng.range(plan.partition_min_ns, plan.partition_max_ns);
                later.push((heal, NemesisAction::HealSplit(side)));
                self.stats.faults += 1;
            }
            2 => {
                let (alive, dead): (Vec<MemberId>, Vec<MemberId>) = {
                    let w = self.lock();
                    (0..n).partition(|m| w.is_alive(*m))
                };
                if (dead.len() as u32) < plan.max_crashed && !alive.is_empty() {
                    let victim = alive[rng.index(alive.len())];
                    self.crash(victim);
                    let back = now + rng.range(plan.down_min_ns, plan.down_max_ns);
                    later.push((back, NemesisAction::Restart(victim)));
                    self.stats.faults += 1;
                }
            }
            _ => {}
        }
        let next = now + rng.range(plan.gap_min_ns, plan.gap_max_ns);
        if next < plan.until_ns {
            later.push((next, NemesisAction::Tick));
        }
        let mut w = self.lock();
        for (t, action) in later {
            w.schedule(t, Event::Nemesis(action));
        }
        drop(w);
        self.nemesis = Some(nemesis);
    }

    /// Runs until a limit or quiescence (see the module docs).
    pub fn run(&mut self, limits: &RunLimits) -> Outcome {
        loop {
            if self.stats.steps >= limits.max_steps {
                return Outcome::StepLimit;
            }
            let stepped = {
                let mut w = self.lock();
                match w.step(limits.max_time_ns) {
                    Some(s) => s,
                    None if w.next_event_ns().is_none() => return Outcome::Idle,
                    None => return Outcome::TimeLimit,
                }
            };
            self.stats.steps += 1;
            let mut check_quiet = false;
            match stepped {
                Stepped::Network => {}
                Stepped::Poll { member, key } => {
                    if self.slots[member as usize].poll_key == Some(key) {
                        self.poll(member);
                        check_quiet = true;
                    }
                }
                Stepped::Timer { member, incarnation } => {
                    let current = {
                        let w = self.lock();
                        w.is_alive(member) && w.incarnation(member) == incarnation
                    };
                    if current {
                        let now = self.now_ns();
                        let slot = &mut self.slots[member as usize];
                        if slot.armed_ns.is_some_and(|t| t <= now) {
                            slot.armed_ns = None;
                        }
                        self.request_poll(member, now);
                    }
                }
                Stepped::Nemesis(action) => self.on_nemesis(action),
            }
            self.wake_from_world();
            if check_quiet && limits.quiesce_after_ns.is_some_and(|q| self.now_ns() >= q) && self.all_done() {
                return Outcome::Quiesced;
            }
        }
    }

    /// Runs until simulated time `t_ns` (for scripted scenarios).
    pub fn run_until(&mut self, t_ns: u64) -> Outcome {
        let limits = RunLimits { max_time_ns: t_ns, max_steps: u64::MAX, quiesce_after_ns: None };
        self.run(&limits)
    }
}

/// The random stream of `member`'s incarnation `incarnation`.
fn process_stream(member: MemberId, incarnation: u64) -> u64 {
    stream::PROCESS + (u64::from(member) << 20) + incarnation
}

/// The undoing of a fault, scheduled by a workload's own fault driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undo {
    /// Restart a crashed member.
    Restart(MemberId),
    /// Heal the cut between two members.
    Heal(MemberId, MemberId),
    /// Heal a split that isolated `side`.
    HealSplit(Vec<MemberId>),
}

/// Undo actions due at simulated times (ns), performed in time order (in
/// scheduling order among equal times).
#[derive(Clone, Debug, Default)]
pub struct UndoQueue {
    due: Vec<(u64, Undo)>,
}

impl UndoQueue {
    /// Schedules `undo` at `at_ns`.
    pub fn push(&mut self, at_ns: u64, undo: Undo) {
        self.due.push((at_ns, undo));
    }

    /// Runs `sim` to each action due at or before `t_ns` and performs it,
    /// in time order; returns the members it restarted.
    pub fn run_due<E>(&mut self, sim: &mut Sim<E>, t_ns: u64) -> Vec<MemberId> {
        self.due.sort_by_key(|(at, _)| *at);
        let ready = self.due.partition_point(|(at, _)| *at <= t_ns);
        let mut restarted = Vec::new();
        for (at, undo) in self.due.drain(..ready) {
            sim.run_until(at);
            match undo {
                Undo::Restart(m) => {
                    sim.restart(m);
                    restarted.push(m);
                }
                Undo::Heal(a, b) => sim.heal(a, b),
                Undo::HealSplit(side) => sim.heal_split(side),
            }
        }
        restarted
    }

    /// Forgets every scheduled action (a calm heals and restarts all).
    pub fn clear(&mut self) {
        self.due.clear();
    }
}
