//! The `kv` simulation workload: ordo-kv's replicated hash table under the
//! acuerdo workload's faults, with clients whose histories are checked for
//! linearizability.
//!
//! Each member is the production [`AcuerdoDriver`] with ordo-kv's state
//! machine ([`KvState`] applying [`Entry`]s, the same code `ordo kv serve`
//! runs on its agent thread) as the application, state transfer included.
//! Clients are sequential (one operation at a time) and talk to one member;
//! a member that does not lead refuses (the client moves to another
//! member), as `ordo kv serve` forwards or answers `TRYAGAIN`:
//! - a write becomes an entry stamped with the leader's clock, proposed
//!   with [`AcuerdoDriver::submit`]; it completes when this member applies
//!   it (the state machine's reply), fails when its ticket is lost (not
//!   applied), and is *unknown* when its member crashes first;
//! - a read asks the leader's read index ([`AcuerdoDriver::read_index`])
//!   and is answered from the state when the barrier is confirmed — or,
//!   with `stale_reads`, at once from any member's own copy (the
//!   deliberately wrong configuration: the checker must catch it).
//!
//! - Half the seeds (odd ones) run the engine in **durable mode** with
//!   ordo-kv's own durable store ([`DiskStore`], the code a `disk` replica
//!   runs: promise file, checksummed segment log, table snapshots every
//!   [`SNAPSHOT_ENTRIES`] entries) over a [`MemDisk`] per member: members
//!   the nemesis crashes come back from their disk, and 0.5 ms after the
//!   calm the power goes out on every member at once (the disks drop what
//!   was not synced); they all recover from disk 0.3 ms later. The same checkers must
//!   pass: nothing acknowledged lost, the group serves again.
//!
//! # Checked
//! - **Linearizability** of the clients' history (SET, GET, CAS on a few
//!   keys; unknown outcomes may or may not have taken effect) with
//!   [`ordo_kv::lincheck`].
//! - **Replicas agree**: every member's state after the run (those that
//!   applied the same number of entries) serializes to the same bytes.
//! - **Liveness**: operations invoked after the calm complete.

#![allow(missing_docs)] // harness-style event fields, named in their variants' docs

use crate::acuerdo::{Params, Shared, Status, may_poll, nemesis};
use crate::{SeedReport, Workload};
use ordo_acuerdo::{AcuerdoDriver, DeliverySink, Epoch, Header, Layout, Persist, Role, Settled};
use ordo_fabric::MemberId;
use ordo_kv::disk::{DiskOptions, DiskStore};
use ordo_kv::lincheck::{self, Op, OpKind, Verdict};
use ordo_kv::state::{Entry, KvState, Reply, SetWhen, Ttl, Write};
use ordo_raft::storage::MemDisk;
use ordo_sim::rng::SimRng;
use ordo_sim::{Checker, Ctx, History, Sim, SimConfig, SimFabric, SimProcess, Violation};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The workload's name.
pub const NAME: &str = "kv";

/// The registry entry (`ordo sim --workload kv`).
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "ordo-kv's state machine over AcuerdoDriver with read-index reads: crashes, restarts, partitions, \
              and in odd seeds durable mode (ordo-kv's disk store) with a whole-group power loss; clients' \
              histories linearizable, replicas agree, liveness",
    run: |seed, _| Ok(SeedReport::passed(NAME, seed, run(seed, false)?)),
};

/// What happens, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvEvent {
    /// A client invoked an operation (at the entry's time).
    Invoke { op: u64, key: u8, kind: Kind },
    /// It completed with this result.
    Complete { op: u64, result: Outcome },
    /// It certainly had no effect (refused or lost).
    Failed { op: u64 },
    /// A member's state after the run: entries applied and a digest.
    Final { applied: u64, digest: u64 },
    /// Something the harness did not expect.
    Anomaly { what: String },
}

/// An operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Set(u64),
    Get,
    Cas { expected: u64, new: u64 },
}

/// A completed operation's result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    Value(Option<u64>),
    Swapped(bool),
}

const KEYS: u8 = 3;
const CLIENTS: usize = 4;

/// A client: where it is connected, what it waits for.
#[derive(Clone, Debug, Default)]
struct ClientState {
    at: MemberId,
    busy: Option<u64>,
    next_ns: u64,
}

/// What the clients share with the members.
#[derive(Default)]
struct Clients {
    clients: Vec<ClientState>,
    next_op: u64,
}

type SharedClients = Rc<RefCell<Clients>>;

/// The application: ordo-kv's state machine, and the replies this
/// incarnation owes its clients.
struct App {
    state: KvState,
    me: MemberId,
    nonce: u64,
    replies: Vec<(u64, Reply)>,
    /// Durable mode: this incarnation's store over its member's disk.
    store: Option<DiskStore<MemDisk>>,
    /// The last header the state applied.
    applied: Header,
}

/// Durable mode: the table is snapshotted (and the log compacted) this
/// often, so short runs exercise compaction and recovery from a snapshot.
pub const SNAPSHOT_ENTRIES: u64 = 25;

/// A member's disk in durable mode: the promise directory and the log
/// directory (clones share the files; they survive the member's crashes).
#[derive(Clone, Debug, Default)]
pub struct Disk {
    meta: MemDisk,
    log: MemDisk,
}

impl Disk {
    fn open(&self) -> (DiskStore<MemDisk>, Option<ordo_kv::disk::Boot>) {
        let options = DiskOptions {
            snapshot_entries: SNAPSHOT_ENTRIES,
            segment_bytes: 4096,
            background: false,
            ..DiskOptions::default()
        };
        DiskStore::open(self.log.clone(), self.meta.clone(), options)
            .expect("the disk holds a state this member wrote")
    }

    /// Power loss: what was not synced may be lost.
    fn crash(&self, seed: u64) {
        self.meta.crash(seed);
        self.log.crash(seed.rotate_left(17));
    }
}

impl DeliverySink for App {
    fn deliver(&mut self, header: Header, payload: &[u8]) {
        self.applied = header;
        match Entry::decode(payload) {
            Ok(e) => {
                let reply = self.state.apply(&e);
                if e.origin == self.me && e.nonce == self.nonce {
                    self.replies.push((e.request, reply));
                }
            }
            Err(why) => self.replies.push((u64::MAX, Reply::err(why))),
        }
    }
    fn snapshot(&mut self) -> Vec<u8> {
        self.state.snapshot()
    }
    fn restore(&mut self, header: Header, state: &[u8]) {
        self.applied = header;
        if self.state.restore(state).is_err() {
            self.replies.push((u64::MAX, Reply::err("bad snapshot")));
        }
    }
    fn persist(&mut self, change: &Persist<'_>) {
        let Some(store) = &mut self.store else { return };
        let state = &self.state;
        store.persist(change, self.applied, &mut || state.clone()).expect("the simulated disk does not fail");
    }
}

fn value(v: u64) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn parse_value(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

struct Member {
    me: MemberId,
    params: Params,
    stale_reads: bool,
    driver: AcuerdoDriver<SimFabric>,
    settled: Vec<Settled>,
    app: App,
    status: Shared,
    clients: SharedClients,
    /// Operations waiting here: op → (client, key, kind).
    waiting: BTreeMap<u64, (usize, u8, Kind)>,
    rng: SimRng,
    stop_ns: u64,
    finished: bool,
    next_slow_poll_ns: u64,
    /// When each pending read asked for its barrier.
    read_asked_ns: BTreeMap<u64, u64>,
}

impl Member {
    fn new(
        ctx: &mut Ctx<'_, KvEvent>,
        params: &Params,
        stale: bool,
        status: Shared,
        clients: SharedClients,
        disks: Option<&[Disk]>,
    ) -> Self {
        let me = ctx.member();
        let mut cfg = params_config(params, me, ctx.incarnation());
        cfg.durable = disks.is_some();
        let mut state = KvState::new();
        let mut applied = Header::NONE;
        let mut store = None;
        let mut boot = None;
        if let Some(d) = disks.map(|d| &d[me as usize]) {
            // Durable mode: what `ordo kv serve` does at start — open the
            // store; a member that wrote something recovers it.
            let (s, b) = d.open();
            store = Some(s);
            boot = b;
        }
        let driver = match boot {
            Some(b) => {
                state = b.state;
                applied = b.recovered.base;
                AcuerdoDriver::recover(ctx.fabric().clone(), cfg, ctx.now(), 0, b.recovered)
                    .expect("the disk holds a state this member wrote")
            }
            None => AcuerdoDriver::new(ctx.fabric().clone(), cfg, ctx.now(), 0).expect("valid config"),
        };
        {
            let mut s = status.borrow_mut();
            s.synced[me as usize] = driver.engine().is_synced();
            s.leader[me as usize] = false;
            s.vote_epoch[me as usize] = Epoch::NONE;
            s.crashed[me as usize] = false;
        }
        // Operations of this member's previous incarnation: unknown.
        for c in clients.borrow_mut().clients.iter_mut().filter(|c| c.at == me) {
            c.busy = None;
        }
        let rng = SimRng::new(ctx.rng().next_u64());
        Member {
            me,
            params: params.clone(),
            stale_reads: stale,
            next_slow_poll_ns: 0,
            read_asked_ns: BTreeMap::new(),
            driver,
            settled: Vec::new(),
            app: App { state, me, nonce: ctx.incarnation(), replies: Vec::new(), store, applied },
            status,
            clients,
            waiting: BTreeMap::new(),
            rng,
            stop_ns: params.stop_sending_ns,
            finished: false,
        }
    }

    fn finish(&mut self, ctx: &mut Ctx<'_, KvEvent>, op: u64, result: Option<Outcome>) {
        let Some((client, _, _)) = self.waiting.remove(&op) else { return };
        ctx.record(match result {
            Some(result) => KvEvent::Complete { op, result },
            None => KvEvent::Failed { op },
        });
        let mut cl = self.clients.borrow_mut();
        let c = &mut cl.clients[client];
        c.busy = None;
        c.next_ns = ctx.now() + self.rng.range(2_000, 40_000);
    }

    /// Starts operations of the idle clients connected here.
    fn start_ops(&mut self, ctx: &mut Ctx<'_, KvEvent>) {
        let now = ctx.now();
        let leader = self.driver.engine().role() == Role::Leader;
        let n = self.params.members;
        let mut cl = self.clients.borrow_mut();
        // A client whose member crashed: its operation's outcome stays
        // unknown (nothing more is recorded for it); it reconnects here.
        {
            let s = self.status.borrow();
            for c in cl.clients.iter_mut().filter(|c| s.crashed[c.at as usize]) {
                c.busy = None;
                c.at = self.me;
            }
        }
        for client in 0..cl.clients.len() {
            let c = cl.clients[client].clone();
            if c.at != self.me || c.busy.is_some() || now < c.next_ns || now >= self.stop_ns {
                continue;
            }
            let key = self.rng.below(u64::from(KEYS)) as u8;
            let kind = match self.rng.below(10) {
                0..=3 => Kind::Set(self.rng.below(1 << 40)),
                4..=7 => Kind::Get,
                _ => Kind::Cas { expected: self.rng.below(1 << 40), new: self.rng.below(1 << 40) },
            };
            let read = kind == Kind::Get;
            if !(leader || read && self.stale_reads) {
                // Refused here: the client tries another member.
                cl.clients[client].at = (self.me + 1 + self.rng.below(u64::from(n - 1)) as MemberId) % n;
                cl.clients[client].next_ns = now + 5_000;
                continue;
            }
            let op = cl.next_op;
            cl.next_op += 1;
            cl.clients[client].busy = Some(op);
            ctx.record(KvEvent::Invoke { op, key, kind: kind.clone() });
            self.waiting.insert(op, (client, key, kind.clone()));
            let k = vec![b'k', b'0' + key];
            match kind {
                Kind::Get if self.stale_reads => {
                    let v = self.app.state.get(&k, now / 1_000_000).and_then(parse_value);
                    drop(cl);
                    self.finish(ctx, op, Some(Outcome::Value(v)));
                    cl = self.clients.borrow_mut();
                }
                Kind::Get => {
                    self.read_asked_ns.insert(op, now);
                    if self.driver.read_index(op).is_err() {
                        drop(cl);
                        self.finish(ctx, op, None);
                        cl = self.clients.borrow_mut();
                    }
                }
                Kind::Set(_) | Kind::Cas { .. } => {
                    let write = match kind {
                        Kind::Set(v) => Write::Set {
                            key: k,
                            value: value(v),
                            when: SetWhen::Always,
                            get: false,
                            ttl: Ttl::None,
                        },
                        Kind::Cas { expected, new } => {
                            Write::Cas { key: k, expected: Some(value(expected)), new: value(new) }
                        }
                        Kind::Get => unreachable!("reads are answered above"),
                    };
                    let entry = Entry {
                        origin: self.me,
                        nonce: self.app.nonce,
                        request: op,
                        now_ms: now / 1_000_000,
                        write,
                    };
                    if self.driver.submit(op, &entry.encode()).is_err() {
                        drop(cl);
                        self.finish(ctx, op, None);
                        cl = self.clients.borrow_mut();
                    }
                }
            }
        }
    }
}

/// The acuerdo workload's configuration, with slots that hold a log entry.
fn params_config(params: &Params, me: MemberId, incarnation: u64) -> ordo_acuerdo::Config {
    let mut cfg = params.config(me, incarnation);
    cfg.max_payload = cfg.max_payload.max(96);
    cfg
}

impl SimProcess<KvEvent> for Member {
    fn poll(&mut self, ctx: &mut Ctx<'_, KvEvent>) -> usize {
        let now = ctx.now();
        if !may_poll(&mut self.driver, ctx, &self.status, self.me, &mut self.next_slow_poll_ns) {
            return 0;
        }
        self.start_ops(ctx);
        let work = self.driver.poll(now, &mut self.app, &mut self.settled);
        for (op, reply) in std::mem::take(&mut self.app.replies) {
            if op == u64::MAX {
                ctx.record(KvEvent::Anomaly { what: format!("{reply:?}") });
                continue;
            }
            let Some((_, _, kind)) = self.waiting.get(&op).cloned() else { continue };
            let outcome = match (kind, reply) {
                (Kind::Set(_), Reply::Ok) => Outcome::Ok,
                (Kind::Cas { .. }, Reply::Int(i)) => Outcome::Swapped(i == 1),
                (k, r) => {
                    ctx.record(KvEvent::Anomaly { what: format!("{k:?} answered {r:?}") });
                    continue;
                }
            };
            self.finish(ctx, op, Some(outcome));
        }
        for s in self.settled.drain(..).collect::<Vec<_>>() {
            match s {
                Settled::Lost { ticket, .. } => self.finish(ctx, ticket, None),
                // The outcome stays unknown: nothing more is recorded, the
                // client moves on.
                Settled::Unknown { ticket, .. } => {
                    if let Some((client, _, _)) = self.waiting.remove(&ticket) {
                        let mut cl = self.clients.borrow_mut();
                        cl.clients[client].busy = None;
                        cl.clients[client].next_ns = ctx.now() + 10_000;
                    }
                }
                Settled::Committed { .. } => {}
            }
        }
        let fx = self.driver.effects();
        let (ready, failed) = (fx.reads_ready.clone(), fx.reads_failed.clone());
        for op in ready {
            // A read index needs a confirmation round on the fabric: a read
            // ready in the poll that asked for it was confirmed by echoes
            // of some other barrier.
            if self.read_asked_ns.remove(&op) == Some(now) && !self.stale_reads {
                ctx.record(KvEvent::Anomaly { what: format!("read {op} confirmed without a round") });
            }
            if let Some((_, key, _)) = self.waiting.get(&op) {
                let v = self.app.state.get(&[b'k', b'0' + key], now / 1_000_000).and_then(parse_value);
                self.finish(ctx, op, Some(Outcome::Value(v)));
            }
        }
        for op in failed {
            self.read_asked_ns.remove(&op);
            self.finish(ctx, op, None);
        }
        {
            let engine = self.driver.engine();
            let mut s = self.status.borrow_mut();
            s.synced[self.me as usize] = engine.is_synced();
            s.leader[self.me as usize] = engine.role() == Role::Leader;
            s.vote_epoch[self.me as usize] = engine.vote().e_new;
        }
        if now >= self.params.end_ns.saturating_sub(100_000) && !self.finished {
            self.finished = true;
            ctx.record(KvEvent::Final {
                applied: self.app.state.applied(),
                digest: ordo_sim::fnv64(&self.app.state.snapshot()),
            });
        }
        if self.driver.wake_at_ns() != u64::MAX {
            ctx.wake_at(self.driver.wake_at_ns());
        }
        if now < self.stop_ns {
            ctx.wake_at(now + 5_000);
        } else if !self.finished {
            ctx.wake_at(self.params.end_ns.saturating_sub(100_000));
        }
        work + usize::from(!self.driver.can_poll())
    }
}

/// Runs one seed (`stale_reads`: the deliberately wrong configuration) and
/// returns its history (unchecked). Half the seeds run in durable mode
/// (see [`durable`]), with a power loss of every member after the calm.
pub fn simulate(seed: u64, params: &Params, stale_reads: bool) -> History<KvEvent> {
    let durable = durable(seed);
    let n = params.members;
    let status = Status::shared(n);
    let clients: SharedClients = Rc::new(RefCell::new(Clients {
        clients: (0..CLIENTS)
            .map(|c| ClientState { at: c as MemberId % n, ..ClientState::default() })
            .collect(),
        next_op: 0,
    }));
    let fabric = crate::acuerdo::draw_fabric(seed, 0x4B56);
    let layout = Layout::new(&params_config(params, 0, 1));
    let config = SimConfig { members: n, region_len: layout.region_len, fabric, ..SimConfig::default() };
    let (p, st, cl) = (params.clone(), status.clone(), clients.clone());
    let disks: Option<Vec<Disk>> = durable.then(|| (0..n).map(|_| Disk::default()).collect());
    let d = disks.clone();
    let factory: ordo_sim::Factory<KvEvent> = Box::new(move |ctx| {
        Box::new(Member::new(ctx, &p, stale_reads, st.clone(), cl.clone(), d.as_deref()))
    });
    let mut sim = Sim::new(seed, config, None, factory);
    nemesis(&mut sim, seed, params, &status);
    if durable {
        // Power loss: every member at once, 0.5 ms after the calm; each
        // comes back from its disk 0.3 ms later. Nothing acknowledged may
        // be lost (the linearizability checker sees every acknowledged
        // write) and the group must serve again (liveness).
        sim.run_until(params.calm_ns + 500_000);
        for m in 0..n {
            sim.crash(m);
            status.borrow_mut().crashed[m as usize] = true;
            if let Some(d) = &disks {
                d[m as usize].crash(seed ^ u64::from(m));
            }
        }
        sim.run_until(params.calm_ns + 800_000);
        for m in 0..n {
            sim.restart(m);
        }
    }
    sim.run_until(params.end_ns);
    sim.into_history()
}

/// Every checker of the workload; operations invoked after `calm_ns` must
/// complete.
pub fn checkers(calm_ns: u64) -> Vec<Box<dyn Checker<KvEvent>>> {
    vec![
        Box::new(Anomalies),
        Box::new(Linearizable),
        Box::new(ReplicasAgree),
        Box::new(Liveness { after_ns: calm_ns + 3_000_000 }),
    ]
}

struct Liveness {
    after_ns: u64,
}
impl Checker<KvEvent> for Liveness {
    fn name(&self) -> &'static str {
        "liveness"
    }
    fn check(&self, h: &History<KvEvent>) -> Result<(), Violation> {
        let completed = h
            .entries
            .iter()
            .filter(|e| e.time_ns >= self.after_ns && matches!(e.event, KvEvent::Complete { .. }))
            .count();
        if completed == 0 {
            return Err(Violation::new(
                self.name(),
                format!("no operation completed after {} ns (the calm)", self.after_ns),
            ));
        }
        Ok(())
    }
}

/// Whether seed `seed` runs in durable mode (every other seed).
pub fn durable(seed: u64) -> bool {
    seed % 2 == 1
}

/// The acuerdo workload's parameters for `seed`, with clients that go on
/// for 6 ms after the calm.
pub fn params(seed: u64) -> Params {
    let mut p = Params::draw(seed);
    p.stop_sending_ns = p.calm_ns + 6_000_000;
    p
}

/// Runs and checks one seed.
pub fn run(seed: u64, stale_reads: bool) -> Result<u64, String> {
    let params = params(seed);
    let history = std::panic::catch_unwind(|| simulate(seed, &params, stale_reads))
        .map_err(|p| format!("seed {seed}: panicked: {}", crate::panic_message(&*p)))?;
    ordo_sim::check_all(&history, &checkers(params.calm_ns)).map_err(|v| format!("seed {seed}: {v}"))?;
    Ok(history.digest())
}

/// The clients' history as the checker reads it.
pub fn operations(history: &History<KvEvent>) -> Vec<Op> {
    let mut invoked: BTreeMap<u64, (u64, u8, Kind)> = BTreeMap::new();
    let mut done: BTreeMap<u64, Option<(u64, Outcome)>> = BTreeMap::new();
    for e in &history.entries {
        match &e.event {
            KvEvent::Invoke { op, key, kind } => {
                invoked.insert(*op, (e.time_ns, *key, kind.clone()));
            }
            KvEvent::Complete { op, result } => {
                done.insert(*op, Some((e.time_ns, result.clone())));
            }
            KvEvent::Failed { op } => {
                done.insert(*op, None);
            }
            _ => {}
        }
    }
    let mut ops = Vec::new();
    for (op, (call, key, kind)) in invoked {
        let key = vec![b'k', b'0' + key];
        let (ret, result) = match done.get(&op) {
            Some(None) => continue,
            Some(Some((t, r))) => (Some(*t), Some(r.clone())),
            None => (None, None),
        };
        let kind = match (kind, result) {
            (Kind::Get, Some(Outcome::Value(v))) => OpKind::Read(v.map(value)),
            (Kind::Get, _) => continue, // a read without an answer had no effect
            (Kind::Set(v), _) => OpKind::Write(Some(value(v))),
            (Kind::Cas { expected, new }, Some(Outcome::Swapped(s))) => {
                OpKind::Cas { expected: Some(value(expected)), new: value(new), swapped: s }
            }
            // A CAS of unknown outcome: it may have swapped or not; model
            // it as a write that may not have happened only if it could
            // have swapped — as an unknown CAS that swapped.
            (Kind::Cas { expected, new }, _) => {
                OpKind::Cas { expected: Some(value(expected)), new: value(new), swapped: true }
            }
        };
        ops.push(Op { key, call, ret, kind });
    }
    ops
}

struct Anomalies;
impl Checker<KvEvent> for Anomalies {
    fn name(&self) -> &'static str {
        "anomalies"
    }
    fn check(&self, h: &History<KvEvent>) -> Result<(), Violation> {
        match h.entries.iter().find(|e| matches!(e.event, KvEvent::Anomaly { .. })) {
            Some(e) => Err(Violation::new(
                self.name(),
                format!("member {} at {} ns: {:?}", e.member, e.time_ns, e.event),
            )),
            None => Ok(()),
        }
    }
}

struct Linearizable;
impl Checker<KvEvent> for Linearizable {
    fn name(&self) -> &'static str {
        "linearizable"
    }
    fn check(&self, h: &History<KvEvent>) -> Result<(), Violation> {
        let ops = operations(h);
        match lincheck::check(&ops, 20_000_000) {
            Verdict::Linearizable => Ok(()),
            v => Err(Violation::new(self.name(), format!("{v:?} in {} operations", ops.len()))),
        }
    }
}

struct ReplicasAgree;
impl Checker<KvEvent> for ReplicasAgree {
    fn name(&self) -> &'static str {
        "replicas agree"
    }
    fn check(&self, h: &History<KvEvent>) -> Result<(), Violation> {
        let mut by_applied: BTreeMap<u64, (u64, MemberId)> = BTreeMap::new();
        for e in &h.entries {
            if let KvEvent::Final { applied, digest } = e.event
                && let Some((d, m)) = by_applied.insert(applied, (digest, e.member))
                && d != digest
            {
                return Err(Violation::new(
                    self.name(),
                    format!("members {m} and {} applied {applied} entries into different tables", e.member),
                ));
            }
        }
        Ok(())
    }
}
