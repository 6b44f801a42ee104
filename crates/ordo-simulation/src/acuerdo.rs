//! The `acuerdo` simulation workload: 2f+1 members, each the runtime's own
//! [`AcuerdoDriver`] (engine, ordered push backlog, reconnect schedule,
//! ticket settlement — checked here: every ticket settles once, with the
//! header it was given), on `ordo-sim`'s simulated fabric under crashes (the leader too, and members during
//! elections and diff transfers), restarts with empty state, partitions,
//! slow members and random delays; then everything heals and liveness is
//! required. Checkers judge the recorded history.
//!
//! # What one seed draws
//! - n ∈ {3, 5}; ring window 4..=32; payloads 1..=`max_payload` (16..=128);
//!   heartbeat interval, heartbeat and election timeouts; fabric delays and
//!   spikes; the client's send interval.
//! - A fault schedule (this driver's own nemesis, so it can respect the
//!   safety budget): every 100-600 µs until the calm, one of: crash a member
//!   (the leader, the best candidate of an election, or anyone), restarted
//!   with an empty region after 0.1-1.5 ms (or only at the calm); cut a
//!   pair; split the group; make a member slow (it polls only every
//!   50-400 µs for a while); nothing. A crash is made only while fewer than
//!   f members are *unsafe* (crashed, or restarted and not yet holding a
//!   leader's log): beyond that no protocol can keep committed messages.
//! - At the calm every partition heals, every crashed member restarts, and
//!   random delays stop spiking; the client keeps sending for a while, then
//!   stops so the run can drain.
//!
//! - Log garbage collection is on (the engine's default), so restarted
//!   members and members suspected for long catch up by state transfer.
//!   The application is a running hash and count of the delivered
//!   payloads' digests; its snapshot is `count, hash` plus a padding whose
//!   length grows with the count (so snapshots span several ring chunks)
//!   and whose bytes derive from the hash (checked on restore).
//!
//! # Checked
//! See the checkers below: integrity, no duplication, total order (a
//! common order: a member that restored a snapshot of `count` messages
//! continues at position `count`), one leader per epoch, every elected
//! leader up to date, no committed message lost (every survivor's final
//! incarnation delivers, or restored, everything anyone delivered),
//! liveness (messages sent after the calm commit everywhere), no
//! anomalies, and restored state (every restored snapshot equals the
//! state of the common order's prefix it claims).

#![allow(missing_docs)] // harness-style event and parameter fields, named in their variants' docs

use crate::{SeedReport, Workload};
use ordo_acuerdo::{AcuerdoDriver, Config, DeliverySink, Epoch, Header, Layout, Note, Role, Settled};
use ordo_fabric::MemberId;
use ordo_sim::rng::{SimRng, derive_seed, stream};
use ordo_sim::{
    Checker, Ctx, FabricConfig, FaultNote, History, Sim, SimConfig, SimFabric, SimProcess, Undo, UndoQueue,
    Violation, fnv64,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// The workload's name.
pub const NAME: &str = "acuerdo";

/// The registry entry (`ordo sim --workload acuerdo`). This workload has its
/// own fault driver (it keeps at most f members unsafe); the options'
/// switches do not apply to it.
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "acuerdo engine through the runtime's AcuerdoDriver: crashes (the leader too), restarts, \
              partitions; integrity, total order, one leader per epoch, up-to-date leaders, no committed loss, \
              restored state, liveness",
    run: |seed, _| Ok(SeedReport::passed(NAME, seed, run(seed)?)),
};

/// What the members record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AcEvent {
    /// The leader took a client message: its header (ticket) and payload digest.
    Broadcast { header: u64, digest: u64 },
    /// A member delivered (committed) a message; `epoch` is the epoch it
    /// was in (its `E_cur`): that epoch's leader committed it, so it is
    /// committed *in* that epoch, which can be bigger than the header's
    /// (a new leader's diff commit delivers older epochs' messages).
    Deliver { header: u64, digest: u64, epoch: u64 },
    /// A member restored a snapshot (state transfer): the application state
    /// after the first `count` messages of the order, the last being
    /// `header`, whose running hash is `hash`.
    Restored { header: u64, count: u64, hash: u64 },
    /// A member won an election; `log` is every header in its log then.
    /// `floor`: the winner's log floor (log garbage collection dropped the
    /// entries at or below it, all of which it delivered itself).
    Elected { epoch: u64, log: Vec<u64>, floor: u64 },
    /// A leader stepped down from its full epoch to lead a bigger one
    /// (`Config::epoch_messages`).
    EpochRenewed { epoch: u64 },
    /// Something the harness did not expect.
    Anomaly { what: String },
    /// An engine note (elections, diffs), for reading a failing history.
    Note { what: String },
}

/// Parameters of one run.
#[derive(Clone, Debug)]
pub struct Params {
    pub members: u32,
    pub window: usize,
    pub max_payload: usize,
    pub heartbeat_interval_ns: u64,
    pub heartbeat_timeout_ns: u64,
    pub election_timeout_ns: u64,
    pub send_interval_ns: u64,
    pub calm_ns: u64,
    pub stop_sending_ns: u64,
    pub end_ns: u64,
    pub faults: bool,
    pub restarts: bool,
    /// `Config::log_gc` (on in drawn runs, the engine's default: restarted
    /// members catch up by state transfer).
    pub log_gc: bool,
    /// `Config::epoch_messages`: small in a third of the drawn runs (the
    /// leader renews its epoch every few messages, under the faults),
    /// else the engine's default.
    pub epoch_messages: u32,
    pub trace: bool,
}

impl Params {
    pub fn draw(seed: u64) -> Params {
        let mut rng = SimRng::new(derive_seed(seed, stream::SCENARIO));
        let members = if rng.chance(700_000) { 3 } else { 5 };
        let heartbeat_interval_ns = rng.range(40_000, 100_000);
        let calm_ns = rng.range(2_000_000, 5_000_000);
        Params {
            members,
            window: rng.range(4, 32) as usize,
            max_payload: rng.range(16, 128) as usize,
            heartbeat_interval_ns,
            heartbeat_timeout_ns: rng.range(5, 10) * heartbeat_interval_ns,
            election_timeout_ns: rng.range(400_000, 1_200_000),
            send_interval_ns: rng.range(5_000, 60_000),
            calm_ns,
            stop_sending_ns: calm_ns + 2_500_000,
            end_ns: calm_ns + 12_000_000,
            faults: true,
            restarts: true,
            log_gc: true,
            // Its own stream: the draws above stay what pinned seeds had.
            epoch_messages: {
                let mut erng = SimRng::new(derive_seed(seed, stream::SCENARIO ^ 0xE90C_0000));
                if erng.chance(333_333) { erng.range(2, 40) as u32 } else { ordo_acuerdo::MAX_EPOCH_MESSAGES }
            },
            trace: false,
        }
    }

    /// The engine configuration of member `me` at `incarnation`.
    pub fn config(&self, me: MemberId, incarnation: u64) -> Config {
        let mut cfg = Config::new((0..self.members).collect(), me);
        cfg.incarnation = incarnation;
        cfg.window = self.window;
        cfg.max_payload = self.max_payload;
        cfg.max_outstanding = 32;
        cfg.heartbeat_interval_ns = self.heartbeat_interval_ns;
        cfg.heartbeat_timeout_ns = self.heartbeat_timeout_ns;
        cfg.election_timeout_ns = self.election_timeout_ns;
        cfg.log_gc = self.log_gc;
        cfg.epoch_messages = self.epoch_messages;
        cfg
    }
}

/// The simulated fabric's delays, spikes and completion timeout for
/// `seed` (`salt` separates workloads that share the seed).
pub fn draw_fabric(seed: u64, salt: u64) -> FabricConfig {
    let mut srng = SimRng::new(derive_seed(seed, stream::FABRIC ^ salt));
    FabricConfig {
        delay_min_ns: srng.range(300, 2_000),
        delay_max_ns: srng.range(3_000, 30_000),
        spike_ppm: srng.range(0, 5_000) as u32,
        spike_max_ns: srng.range(10_000, 200_000),
        completion_timeout_ns: srng.range(100_000, 400_000),
        ..FabricConfig::default()
    }
}

/// What the driver and the members share (single-threaded simulation).
#[derive(Default)]
pub struct Status {
    pub synced: Vec<bool>,
    pub leader: Vec<bool>,
    pub vote_epoch: Vec<Epoch>,
    pub slow_until_ns: Vec<u64>,
    pub slow_every_ns: Vec<u64>,
    /// Crashed and not restarted yet (set by the nemesis, cleared by the
    /// member's new incarnation).
    pub crashed: Vec<bool>,
}

/// The status the members and the nemesis share.
pub type Shared = Rc<RefCell<Status>>;

impl Status {
    /// A group of `n` members before the first poll (all synced).
    pub fn shared(n: u32) -> Shared {
        let n = n as usize;
        Rc::new(RefCell::new(Status {
            synced: vec![true; n],
            leader: vec![false; n],
            vote_epoch: vec![Epoch::NONE; n],
            slow_until_ns: vec![0; n],
            slow_every_ns: vec![0; n],
            crashed: vec![false; n],
        }))
    }
}

struct Member {
    me: MemberId,
    incarnation: u64,
    params: Params,
    /// The production driver: engine, push backlog, link recovery, tickets.
    driver: AcuerdoDriver<SimFabric>,
    settled: Vec<Settled>,
    /// Tickets submitted and not yet settled, with the header each got.
    unsettled: BTreeMap<u64, Header>,
    shared: Shared,
    sent: u64,
    next_send_ns: u64,
    next_slow_poll_ns: u64,
    next_trace_ns: u64,
    rng: SimRng,
    app: App,
}

/// The sim application: a running hash and count of delivered digests.
#[derive(Default)]
pub struct App {
    pub count: u64,
    pub hash: u64,
    /// What happened since the caller last took it, in order.
    pub log: Vec<AppEvent>,
}

/// What the application saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppEvent {
    Delivered { header: Header, digest: u64 },
    Restored { header: Header, count: u64, hash: u64 },
    BadSnapshot(String),
}

/// One step of the running hash.
pub fn mix(hash: u64, digest: u64) -> u64 {
    (hash ^ digest).wrapping_mul(0x0000_0100_0000_01B3).rotate_left(17)
}

fn padding(count: u64, hash: u64) -> impl Iterator<Item = u8> {
    let len = ((count * 8) % 1_500) as usize;
    (0..len).map(move |i| (hash >> ((i % 8) * 8)) as u8 ^ i as u8)
}

impl DeliverySink for App {
    fn deliver(&mut self, header: Header, payload: &[u8]) {
        let digest = fnv64(payload);
        self.count += 1;
        self.hash = mix(self.hash, digest);
        self.log.push(AppEvent::Delivered { header, digest });
    }

    fn snapshot(&mut self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.count.to_le_bytes());
        b.extend_from_slice(&self.hash.to_le_bytes());
        b.extend(padding(self.count, self.hash));
        b
    }

    fn restore(&mut self, header: Header, state: &[u8]) {
        if state.len() < 16 {
            self.log.push(AppEvent::BadSnapshot(format!("{} bytes", state.len())));
            return;
        }
        let count = u64::from_le_bytes(state[..8].try_into().expect("8"));
        let hash = u64::from_le_bytes(state[8..16].try_into().expect("8"));
        if !state[16..].iter().copied().eq(padding(count, hash)) {
            self.log.push(AppEvent::BadSnapshot(format!("padding of a {}-byte snapshot", state.len())));
        }
        self.count = count;
        self.hash = hash;
        self.log.push(AppEvent::Restored { header, count, hash });
    }
}

impl Member {
    fn new(ctx: &mut Ctx<'_, AcEvent>, params: &Params, shared: Shared) -> Member {
        let me = ctx.member();
        let fabric = ctx.fabric().clone();
        let cfg = params.config(me, ctx.incarnation());
        // Reconnect interval 0: a suspected link is retried on every poll.
        let driver = AcuerdoDriver::new(fabric, cfg, ctx.now(), 0).expect("valid config");
        {
            let mut s = shared.borrow_mut();
            s.synced[me as usize] = driver.engine().is_synced();
            s.leader[me as usize] = false;
            s.vote_epoch[me as usize] = Epoch::NONE;
            s.crashed[me as usize] = false;
        }
        let rng = SimRng::new(ctx.rng().next_u64());
        Member {
            me,
            incarnation: ctx.incarnation(),
            params: params.clone(),
            driver,
            settled: Vec::new(),
            unsettled: BTreeMap::new(),
            shared,
            sent: 0,
            next_send_ns: 0,
            next_slow_poll_ns: 0,
            next_trace_ns: 0,
            rng,
            app: App::default(),
        }
    }

    fn anomaly(ctx: &mut Ctx<'_, AcEvent>, what: String) {
        ctx.record(AcEvent::Anomaly { what });
    }

    fn client(&mut self, ctx: &mut Ctx<'_, AcEvent>) -> usize {
        let now = ctx.now();
        if self.driver.engine().role() != Role::Leader
            || now < self.next_send_ns
            || now >= self.params.stop_sending_ns
        {
            return 0;
        }
        let burst = self.rng.range(1, 4);
        let mut work = 0;
        for _ in 0..burst {
            let len = self.rng.range(24, self.params.max_payload.max(24) as u64) as usize;
            let mut payload = vec![0u8; len.min(self.params.max_payload).max(24)];
            payload[..4].copy_from_slice(&self.me.to_le_bytes());
            payload[4..12].copy_from_slice(&self.incarnation.to_le_bytes());
            payload[12..20].copy_from_slice(&self.sent.to_le_bytes());
            for (i, b) in payload[20..].iter_mut().enumerate() {
                *b = (i as u64 ^ self.sent) as u8;
            }
            payload.truncate(self.params.max_payload);
            match self.driver.submit(self.sent, &payload) {
                Ok(h) => {
                    self.unsettled.insert(self.sent, h);
                    ctx.record(AcEvent::Broadcast { header: h.encode(), digest: fnv64(&payload) });
                    self.sent += 1;
                    work += 1;
                }
                Err(_) => break,
            }
        }
        self.next_send_ns = now + self.params.send_interval_ns;
        work
    }
}

/// Whether member `me` may poll its driver now (the acuerdo and kv
/// workloads' members both ask): its earlier pushes are posted (else it
/// wakes in 2 µs: the engine waits for them), and while the nemesis slows
/// it down it polls only every `slow_every_ns` (else it wakes then).
pub(crate) fn may_poll<E>(
    driver: &mut AcuerdoDriver<SimFabric>,
    ctx: &mut Ctx<'_, E>,
    status: &Shared,
    me: MemberId,
    next_slow_poll_ns: &mut u64,
) -> bool {
    let now = ctx.now();
    driver.on_fabric_events(now, |_| {});
    driver.post_backlog();
    if !driver.can_poll() {
        ctx.wake_at(now + 2_000);
        return false;
    }
    let (slow_until, every) = {
        let s = status.borrow();
        (s.slow_until_ns[me as usize], s.slow_every_ns[me as usize])
    };
    if now < slow_until {
        if now < *next_slow_poll_ns {
            ctx.wake_at(*next_slow_poll_ns);
            return false;
        }
        *next_slow_poll_ns = now + every;
    }
    true
}

impl SimProcess<AcEvent> for Member {
    fn poll(&mut self, ctx: &mut Ctx<'_, AcEvent>) -> usize {
        let now = ctx.now();
        if !may_poll(&mut self.driver, ctx, &self.shared, self.me, &mut self.next_slow_poll_ns) {
            return 0;
        }
        if self.params.trace && now >= self.next_slow_poll_ns.max(self.next_trace_ns) {
            self.next_trace_ns = now + 500_000;
            ctx.record(AcEvent::Note { what: self.driver.engine().describe() });
        }
        let mut work = self.client(ctx);
        work += self.driver.poll(now, &mut self.app, &mut self.settled);
        for s in self.settled.drain(..) {
            // A ticket settles once, with the header it was given (the
            // driver's contract the runtime's clients rely on).
            let (Settled::Lost { ticket, header }
            | Settled::Committed { ticket, header }
            | Settled::Unknown { ticket, header }) = s;
            if self.unsettled.remove(&ticket) != Some(header) {
                ctx.record(AcEvent::Anomaly { what: format!("settled an unknown ticket or header: {s:?}") });
            }
        }
        // Deliveries happen only in the engine's commit step, after any
        // epoch change of the poll: all of them in the epoch it is in now.
        let in_epoch = self.driver.engine().epoch().encode();
        for ev in std::mem::take(&mut self.app.log) {
            match ev {
                AppEvent::Delivered { header, digest } => {
                    ctx.record(AcEvent::Deliver { header: header.encode(), digest, epoch: in_epoch })
                }
                AppEvent::Restored { header, count, hash } => {
                    ctx.record(AcEvent::Restored { header: header.encode(), count, hash })
                }
                AppEvent::BadSnapshot(what) => Self::anomaly(ctx, format!("bad snapshot: {what}")),
            }
        }
        let engine = self.driver.engine();
        for note in &self.driver.effects().notes {
            match note {
                Note::BecameLeader(e) => {
                    let log = engine.log_headers().map(|h| h.encode()).collect();
                    let floor = engine.log_floor().encode();
                    ctx.record(AcEvent::Elected { epoch: e.encode(), log, floor });
                }
                Note::BadMessage { sender, what } => {
                    Self::anomaly(ctx, format!("bad message from {sender}: {what}"))
                }
                Note::EpochRenewed(e) => ctx.record(AcEvent::EpochRenewed { epoch: e.encode() }),
                other => {
                    if self.params.trace {
                        ctx.record(AcEvent::Note { what: format!("{other:?}") })
                    }
                }
            }
        }
        {
            let mut s = self.shared.borrow_mut();
            s.synced[self.me as usize] = engine.is_synced();
            s.leader[self.me as usize] = engine.role() == Role::Leader;
            s.vote_epoch[self.me as usize] = engine.vote().e_new;
        }
        if self.driver.wake_at_ns() != u64::MAX {
            ctx.wake_at(self.driver.wake_at_ns());
        }
        if engine.role() == Role::Leader && now < self.params.stop_sending_ns {
            ctx.wake_at(self.next_send_ns);
        }
        work + usize::from(!self.driver.can_poll())
    }
}

/// Runs one seed and returns its history (unchecked).
pub fn simulate(seed: u64, params: &Params) -> History<AcEvent> {
    let n = params.members;
    let shared = Status::shared(n);
    let fabric = draw_fabric(seed, 0xACE);
    let layout = Layout::new(&params.config(0, 1));
    let config = SimConfig { members: n, region_len: layout.region_len, fabric, ..SimConfig::default() };
    let p = params.clone();
    let sh = shared.clone();
    let factory: ordo_sim::Factory<AcEvent> = Box::new(move |ctx| Box::new(Member::new(ctx, &p, sh.clone())));
    let injector = ordo_fault::Injector::new(derive_seed(seed, stream::FAULT_POINTS), 20_000);
    let guard = ordo_fault::install(injector);
    let mut sim = Sim::new(seed, config, None, factory);
    nemesis(&mut sim, seed, params, &shared);
    sim.run_until(params.end_ns);
    drop(guard.finish());
    sim.into_history()
}

/// This workload's fault driver (shared with the `kv` workload): until
/// `params.calm_ns`, every 100-600 µs one of crash (while fewer than f
/// members are unsafe), cut a pair, split, slow a member, nothing; then
/// everything heals and every crashed member restarts. Members report
/// through `shared` (synced, leader, vote) and it marks crashes there.
pub fn nemesis<E>(sim: &mut Sim<E>, seed: u64, params: &Params, shared: &Shared) {
    let n = params.members;
    let mut rng = SimRng::new(derive_seed(seed, stream::NEMESIS));
    let f = (n / 2) as usize;
    let mut crashed: BTreeSet<MemberId> = BTreeSet::new();
    let mut later = UndoQueue::default();
    let mut t = 300_000;
    if params.faults {
        while t < params.calm_ns {
            // Run to t, doing the pending actions due before it in order.
            for m in later.run_due(sim, t) {
                crashed.remove(&m);
            }
            sim.run_until(t);
            let unsafe_count = {
                let s = shared.borrow();
                crashed.len() + (0..n).filter(|m| !crashed.contains(m) && !s.synced[*m as usize]).count()
            };
            match rng.weighted(&[4, 2, 2, 1, 1]) {
                0 if unsafe_count < f => {
                    let victim = {
                        let s = shared.borrow();
                        let alive: Vec<MemberId> = (0..n).filter(|m| !crashed.contains(m)).collect();
                        let leader = alive.iter().copied().find(|m| s.leader[*m as usize]);
                        let candidate = alive.iter().copied().max_by_key(|m| s.vote_epoch[*m as usize]);
                        match rng.below(3) {
                            0 if leader.is_some() => leader.expect("checked"),
                            1 if candidate.is_some() => candidate.expect("checked"),
                            _ => alive[rng.index(alive.len())],
                        }
                    };
                    sim.crash(victim);
                    crashed.insert(victim);
                    shared.borrow_mut().crashed[victim as usize] = true;
                    if params.restarts && rng.chance(800_000) {
                        later.push(t + rng.range(100_000, 1_500_000), Undo::Restart(victim));
                    }
                }
                1 => {
                    let a = rng.below(u64::from(n)) as MemberId;
                    let b = (a + 1 + rng.below(u64::from(n - 1)) as MemberId) % n;
                    sim.cut(a, b);
                    later.push(t + rng.range(50_000, 1_000_000), Undo::Heal(a, b));
                }
                2 => {
                    let mut all: Vec<MemberId> = (0..n).collect();
                    rng.shuffle(&mut all);
                    let mut side = all[..1 + rng.index((n - 1) as usize)].to_vec();
                    side.sort_unstable();
                    sim.split(side.clone());
                    later.push(t + rng.range(50_000, 1_000_000), Undo::HealSplit(side));
                }
                3 => {
                    let m = rng.below(u64::from(n)) as usize;
                    let mut s = shared.borrow_mut();
                    s.slow_until_ns[m] = t + rng.range(100_000, 2_000_000);
                    s.slow_every_ns[m] = rng.range(50_000, 400_000);
                }
                _ => {}
            }
            t += rng.range(100_000, 600_000);
        }
        // Actions due before the calm still happen; the calm heals the rest.
        if params.calm_ns > 0 {
            later.run_due(sim, params.calm_ns - 1);
        }
        later.clear();
        sim.run_until(params.calm_ns);
        {
            let mut s = shared.borrow_mut();
            s.slow_until_ns.iter_mut().for_each(|x| *x = 0);
        }
        sim.calm();
    }
}

/// Every checker of the workload, in order.
pub fn checkers() -> Vec<Box<dyn Checker<AcEvent>>> {
    vec![
        Box::new(Anomalies),
        Box::new(Integrity),
        Box::new(NoDuplication),
        Box::new(TotalOrder),
        Box::new(OneLeaderPerEpoch),
        Box::new(LeaderUpToDate),
        Box::new(NoCommittedLoss),
        Box::new(Liveness),
        Box::new(RestoredState),
    ]
}

/// Runs and checks one seed.
pub fn run(seed: u64) -> Result<u64, String> {
    let params = Params::draw(seed);
    let history = std::panic::catch_unwind(|| simulate(seed, &params))
        .map_err(|p| format!("seed {seed}: panicked: {}", crate::panic_message(&*p)))?;
    ordo_sim::check_all(&history, &checkers()).map_err(|v| format!("seed {seed}: {v} ({params:?})"))?;
    Ok(history.digest())
}

// ---------------------------------------------------------------------------
// Checkers
// ---------------------------------------------------------------------------

type Key = (MemberId, u64);

/// One incarnation's deliveries: `(position in the order, (header,
/// digest))`. A restore makes the next delivery's position the snapshot's
/// count.
type Seq = Vec<(usize, (u64, u64))>;

/// Delivered sequences per (member, incarnation), and how many positions
/// of the order each one covers (delivered or restored).
fn sequences(h: &History<AcEvent>) -> (BTreeMap<Key, Seq>, BTreeMap<Key, usize>) {
    let mut seqs: BTreeMap<Key, Seq> = BTreeMap::new();
    let mut end: BTreeMap<Key, usize> = BTreeMap::new();
    for e in &h.entries {
        let key = (e.member, e.incarnation);
        match e.event {
            AcEvent::Deliver { header, digest, .. } => {
                let p = end.entry(key).or_insert(0);
                seqs.entry(key).or_default().push((*p, (header, digest)));
                *p += 1;
            }
            AcEvent::Restored { count, .. } => {
                seqs.entry(key).or_default();
                let p = end.entry(key).or_insert(0);
                *p = (*p).max(count as usize);
            }
            _ => {}
        }
    }
    (seqs, end)
}

/// The common order: every position anyone delivered (`None` where only
/// restores covered it), or the first conflict.
fn reference(seqs: &BTreeMap<Key, Seq>) -> Result<Vec<Option<(u64, u64)>>, String> {
    let mut order: Vec<Option<(u64, u64)>> = Vec::new();
    let mut by: Vec<Key> = Vec::new();
    for (key, seq) in seqs {
        for &(p, v) in seq {
            if order.len() <= p {
                order.resize(p + 1, None);
                by.resize(p + 1, (0, 0));
            }
            match order[p] {
                None => {
                    order[p] = Some(v);
                    by[p] = *key;
                }
                Some(w) if w == v => {}
                Some(w) => {
                    return Err(format!(
                        "m{} (incarnation {}) delivered {:?} at position {p}, m{} (incarnation {}) {:?}",
                        key.0,
                        key.1,
                        hdr(v.0),
                        by[p].0,
                        by[p].1,
                        hdr(w.0)
                    ));
                }
            }
        }
    }
    Ok(order)
}

fn hdr(word: u64) -> Header {
    Header::decode(word)
}

/// The harness saw nothing unexpected.
pub struct Anomalies;
impl Checker<AcEvent> for Anomalies {
    fn name(&self) -> &'static str {
        "anomalies"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        for e in &h.entries {
            if let AcEvent::Anomaly { what } = &e.event {
                return Err(Violation::new(
                    self.name(),
                    format!("m{} at {} ns: {what}", e.member, e.time_ns),
                ));
            }
        }
        Ok(())
    }
}

/// Every delivered message was broadcast, with exactly those bytes.
pub struct Integrity;
impl Checker<AcEvent> for Integrity {
    fn name(&self) -> &'static str {
        "integrity"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        let mut sent = BTreeMap::new();
        for e in &h.entries {
            match e.event {
                AcEvent::Broadcast { header, digest } => {
                    sent.insert(header, digest);
                }
                AcEvent::Deliver { header, digest, .. } => match sent.get(&header) {
                    Some(d) if *d == digest => {}
                    Some(_) => {
                        return Err(Violation::new(
                            self.name(),
                            format!(
                                "m{} delivered {:?} with other bytes than broadcast",
                                e.member,
                                hdr(header)
                            ),
                        ));
                    }
                    None => {
                        return Err(Violation::new(
                            self.name(),
                            format!("m{} delivered {:?}, never broadcast", e.member, hdr(header)),
                        ));
                    }
                },
                _ => {}
            }
        }
        Ok(())
    }
}

/// No member incarnation delivers a message twice.
pub struct NoDuplication;
impl Checker<AcEvent> for NoDuplication {
    fn name(&self) -> &'static str {
        "no-duplication"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        for ((m, inc), seq) in sequences(h).0 {
            let mut headers = BTreeSet::new();
            let mut digests = BTreeSet::new();
            for (_, (header, digest)) in seq {
                if !headers.insert(header) || !digests.insert(digest) {
                    return Err(Violation::new(
                        self.name(),
                        format!("m{m} (incarnation {inc}) delivered {:?} twice", hdr(header)),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Every member incarnation delivers a prefix of one common order (after
/// a restore, from the snapshot's position on).
pub struct TotalOrder;
impl Checker<AcEvent> for TotalOrder {
    fn name(&self) -> &'static str {
        "total-order"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        reference(&sequences(h).0).map(|_| ()).map_err(|m| Violation::new(self.name(), m))
    }
}

/// Every restore jumps forward, and its snapshot is the application state
/// of the common order's prefix it claims: the running hash of the first
/// `count` digests (where the order is known there), ending at or before
/// its header, with the next message after it.
pub struct RestoredState;
impl Checker<AcEvent> for RestoredState {
    fn name(&self) -> &'static str {
        "restored-state"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        let (seqs, _) = sequences(h);
        let order = reference(&seqs).map_err(|m| Violation::new(self.name(), m))?;
        let mut pos: BTreeMap<Key, u64> = BTreeMap::new();
        for e in &h.entries {
            let key = (e.member, e.incarnation);
            match e.event {
                AcEvent::Deliver { .. } => *pos.entry(key).or_insert(0) += 1,
                AcEvent::Restored { header, count, hash } => {
                    let at = pos.entry(key).or_insert(0);
                    let who = format!("m{} (incarnation {})", e.member, e.incarnation);
                    if count < *at {
                        return Err(Violation::new(
                            self.name(),
                            format!("{who} restored {count} messages after delivering {at}"),
                        ));
                    }
                    *at = count;
                    let count = count as usize;
                    let prefix: Option<Vec<(u64, u64)>> =
                        (count <= order.len()).then(|| order[..count].iter().copied().collect()).flatten();
                    if let Some(prefix) = prefix {
                        let want = prefix.iter().fold(0, |acc, (_, d)| mix(acc, *d));
                        if want != hash {
                            return Err(Violation::new(
                                self.name(),
                                format!("{who} restored a state of {count} messages unlike the order's"),
                            ));
                        }
                        if prefix.last().is_some_and(|(last, _)| hdr(*last) > hdr(header)) {
                            return Err(Violation::new(
                                self.name(),
                                format!(
                                    "{who} restored {:?}, before the order's {count}th message",
                                    hdr(header)
                                ),
                            ));
                        }
                    }
                    if let Some(Some((next, _))) = order.get(count)
                        && hdr(*next) <= hdr(header)
                    {
                        return Err(Violation::new(
                            self.name(),
                            format!("{who} restored {:?}, which covers message {count} too", hdr(header)),
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// At most one member (incarnation) wins each epoch, and it is the epoch's
/// named leader; no two broadcasts share a header.
pub struct OneLeaderPerEpoch;
impl Checker<AcEvent> for OneLeaderPerEpoch {
    fn name(&self) -> &'static str {
        "one-leader-per-epoch"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        let mut winners: BTreeMap<u64, Key> = BTreeMap::new();
        let mut headers = BTreeSet::new();
        for e in &h.entries {
            match &e.event {
                AcEvent::Elected { epoch, .. } => {
                    let ep = hdr(*epoch).epoch;
                    if ep.leader != e.member {
                        return Err(Violation::new(self.name(), format!("m{} won {ep:?}", e.member)));
                    }
                    if let Some(prev) = winners.insert(*epoch, (e.member, e.incarnation))
                        && prev != (e.member, e.incarnation)
                    {
                        return Err(Violation::new(
                            self.name(),
                            format!("{ep:?} won by {prev:?} and by ({}, {})", e.member, e.incarnation),
                        ));
                    }
                }
                AcEvent::Broadcast { header, .. } if !headers.insert(*header) => {
                    return Err(Violation::new(
                        self.name(),
                        format!("header {:?} broadcast twice", hdr(*header)),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// An elected leader's log holds every message committed before its epoch
/// (delivered anywhere before the election, by a member then in a smaller
/// epoch), except those at or below its log floor, which it must have
/// delivered itself (in the same incarnation) before the election.
pub struct LeaderUpToDate;
impl Checker<AcEvent> for LeaderUpToDate {
    fn name(&self) -> &'static str {
        "leader-up-to-date"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        // Header -> the smallest epoch it was delivered in so far.
        let mut committed: BTreeMap<u64, u64> = BTreeMap::new();
        let mut own: BTreeSet<(MemberId, u64, u64)> = BTreeSet::new();
        let mut restored: BTreeMap<Key, u64> = BTreeMap::new();
        for e in &h.entries {
            match &e.event {
                AcEvent::Deliver { header, epoch, .. } => {
                    let first = committed.entry(*header).or_insert(*epoch);
                    *first = (*first).min(*epoch);
                    own.insert((e.member, e.incarnation, *header));
                }
                AcEvent::Restored { header, .. } => {
                    let r = restored.entry((e.member, e.incarnation)).or_insert(0);
                    *r = (*r).max(*header);
                }
                AcEvent::Elected { epoch, log, floor } => {
                    // Committed before its epoch: delivered somewhere before
                    // the election by a member in a smaller epoch. (A member
                    // can move its vote to a bigger epoch after a candidate
                    // of a smaller one counted it; that candidate may still
                    // win its smaller epoch, which can commit nothing, since
                    // a quorum promised the bigger one; what bigger epochs
                    // commit is not its business, including older epochs'
                    // messages that only a bigger epoch's diff committed:
                    // the header alone does not say when a message was
                    // committed.)
                    let log: BTreeSet<u64> = log.iter().copied().collect();
                    let snap = restored.get(&(e.member, e.incarnation)).copied().unwrap_or(0);
                    let before = committed.range(..*epoch).filter(|(_, in_epoch)| **in_epoch < *epoch);
                    let missing = before.map(|(c, _)| c).find(|c| {
                        let covered = own.contains(&(e.member, e.incarnation, **c)) || **c <= snap;
                        let below_floor = **c <= *floor && covered;
                        !log.contains(c) && !below_floor
                    });
                    if let Some(missing) = missing {
                        return Err(Violation::new(
                            self.name(),
                            format!(
                                "m{} won {:?} without committed {:?}",
                                e.member,
                                hdr(*epoch).epoch,
                                hdr(*missing)
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Every member alive at the end delivered (or restored), in its last
/// incarnation, everything any member delivered (no committed message
/// lost).
pub struct NoCommittedLoss;
impl Checker<AcEvent> for NoCommittedLoss {
    fn name(&self) -> &'static str {
        "no-committed-loss"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        let (seqs, end) = sequences(h);
        let total = end.values().copied().max().unwrap_or(0);
        let order = reference(&seqs).unwrap_or_default();
        for m in 0..h.members {
            if !h.alive_at_end(m) {
                continue;
            }
            let inc = h.final_incarnation(m);
            let have = end.get(&(m, inc)).copied().unwrap_or(0);
            if have < total {
                return Err(Violation::new(
                    self.name(),
                    format!(
                        "m{m} (incarnation {inc}) delivered {have} of {total} committed messages; first missing {:?}",
                        order.get(have).copied().flatten().map(|(x, _)| hdr(x))
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// After the calm, a leader is elected and new messages commit at every
/// member.
pub struct Liveness;
impl Checker<AcEvent> for Liveness {
    fn name(&self) -> &'static str {
        "liveness"
    }
    fn check(&self, h: &History<AcEvent>) -> Result<(), Violation> {
        let calm = h.faults.iter().find(|f| f.fault == FaultNote::Calm).map_or(0, |f| f.time_ns);
        let after: BTreeSet<u64> = h
            .entries
            .iter()
            .filter(|e| e.time_ns >= calm)
            .filter_map(|e| match e.event {
                AcEvent::Broadcast { header, .. } => Some(header),
                _ => None,
            })
            .collect();
        if after.is_empty() {
            return Err(Violation::new(
                self.name(),
                format!("no message broadcast after the calm at {calm} ns"),
            ));
        }
        let (seqs, _) = sequences(h);
        for m in 0..h.members {
            let inc = h.final_incarnation(m);
            let got =
                seqs.get(&(m, inc)).map_or(0, |s| s.iter().filter(|(_, (x, _))| after.contains(x)).count());
            if got == 0 {
                return Err(Violation::new(
                    self.name(),
                    format!("m{m} delivered nothing broadcast after the calm"),
                ));
            }
        }
        Ok(())
    }
}
