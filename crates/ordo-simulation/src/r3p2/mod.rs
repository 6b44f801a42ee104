//! The seeded simulation of r3p2: R2P2 with Raft inside it, serving the
//! replicated key-value store ([`KvState`]) on the simulator's datagram
//! network, with loss, duplication, reordering (delay spread and spikes),
//! partitions, crashes and restarts that lose unsynced writes.
//!
//! # What a seed runs
//! - `servers` (3 or 5) sim members, each a [`SimProcess`] running the
//!   UDP server's own sans-I/O [`ServerCore`] (decode, reassembly, routing,
//!   the replication hook's actions, encoding, counters) with the
//!   production [`RaftReplication<SimDisk>`] hook and the production
//!   [`KvState`] behind the [`Handler`] interface, run inline
//!   ([`InlineExecutor`], the server's network-thread mode); the process
//!   feeds it the simulated socket's datagrams, ticks and the end of each
//!   turn exactly as the mio network loop does (`server.rs`). Redirects
//!   carry the leader's address, every answer the leader hint.
//! - `clients` further members (never crashed; partitions do reach them),
//!   each with one operation outstanding, retried with the same
//!   `(client id, request id)` after a timeout, at the next server, following
//!   redirects and leader hints. Operations conflict on a few keys (Get, Put,
//!   Cas, Append with unique values) plus an append-only key `log`.
//! - Each server's [`MemDisk`] lives outside the process (in the factory,
//!   wrapped in a [`SimDisk`]); a restarted incarnation first calls
//!   `MemDisk::crash`, so whatever was not synced is lost, torn or kept as
//!   the crash seed says. The log is durable (`durable: true`): the hook
//!   syncs inside `flush`, before anything of the turn is sent. A poll is
//!   atomic in the simulator, so a plain crash never falls between a write
//!   and its fsync; the nemesis' **power loss** does: it makes the server's
//!   next fsync fail, the replica crash-stops there (its documented reaction
//!   to a failed fsync: a panic, caught by the process, which goes silent),
//!   with written and unsynced data on the disk, and the driver then crashes
//!   and later restarts it.
//! - A nemesis (this module's driver, like acuerdo's) crashes servers (often
//!   the leader), cuts their power at the next fsync, restarts them, cuts
//!   pairs (servers and clients) and splits the servers, until `calm_ns`;
//!   then everything heals and restarts, every client completes
//!   [`AFTER_CALM`] more operations invoked after the heal, and the run
//!   stops once every client is done (or at the time limit).
//! - Applied commands are recorded by their **apply position** (the KV
//!   state's count of commands applied before: restored with a snapshot, so
//!   comparable across replicas and restarts) rather than their log index,
//!   which the hook does not expose; Raft's own positions (commit index and
//!   term, each leader's log at election, each replica's final log) are
//!   recorded from `replica().node()`.
//!
//! # What is checked (one [`Checker`] each)
//! election safety, log matching, leader completeness (committed entries in
//! every later leader's log and in every final log up to its commit index),
//! state machine safety (the same command at the same apply position
//! everywhere, across restarts;
//! replaying the common sequence yields every replica's final state),
//! exactly-once (no `(client, request)` applied at two positions; a retried
//! request's answer is the first application's; the append-only key holds
//! each acknowledged token exactly once), no acknowledged write lost,
//! linearizability per key (stateright's `LinearizabilityTester`, thread =
//! client), and liveness after healing (every client's operations answered,
//! including [`AFTER_CALM`] invoked after the heal; a leader at the end).

#![allow(missing_docs)] // harness-style event and parameter fields, named in their variants' docs

use crate::{SeedReport, Workload};
use ordo_r2p2::header::{self, Header, MessageType, Policy};
use ordo_r2p2::kv::{KvOp, KvReply, KvState};
use ordo_r2p2::reassembly::{Reassembler, ReassemblyConfig, split};
use ordo_r2p2::{
    CoreConfig, Handler, InlineExecutor, RaftOptions, RaftReplication, Responder, ResponseHandle, ServerCore,
    Transport,
};
use ordo_raft::Config;
use ordo_raft::node::Node;
use ordo_raft::storage::{Disk, LogOptions, MemDisk};
use ordo_sim::rng::stream;
use ordo_sim::{
    Checker, Ctx, History, NetAddr, NetConfig, Sim, SimConfig, SimProcess, SimRng, SimSocket, Undo,
    UndoQueue, Violation, derive_seed,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

/// The workload's name (`ordo sim --workload r3p2`).
pub const NAME: &str = "r3p2";

/// The registry entry. This workload has its own fault driver (power loss
/// at fsync included); the options' switches do not apply to it.
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "r3p2 (R2P2 + Raft) KV service through the UDP server's ServerCore: loss, duplication, \
              reordering, partitions, crashes, power loss at fsync; election safety, log matching, leader \
              completeness, state machine safety, exactly-once, no acknowledged loss, linearizability, liveness",
    run: |seed, _| seed_report(seed),
};

/// The port servers listen on.
const SERVER_PORT: u16 = 1;
/// The port clients send from.
const CLIENT_PORT: u16 = 2;
/// Operations each client completes, invoked after the faults healed
/// (liveness), beyond its `ops`.
pub const AFTER_CALM: u32 = 3;
/// The append-only key (exactly-once check).
pub const LOG_KEY: &[u8] = b"log";
/// R2P2 payload per datagram (the simulated network's 1472-byte datagrams).
const MTU_PAYLOAD: usize = 1472 - header::HEADER_SIZE;
const MAX_PACKETS: u16 = 1024;

/// What a seed draws (tests may change it before simulating).
#[derive(Clone, Debug)]
pub struct Params {
    /// Raft replicas (members `0..servers`).
    pub servers: u32,
    /// Clients (members `servers..servers + clients`).
    pub clients: u32,
    /// Operations per client.
    pub ops: u32,
    /// Keys with mixed operations (besides `log`).
    pub keys: u32,
    /// One Raft tick.
    pub tick_ns: u64,
    /// Client retry timeout.
    pub client_timeout_ns: u64,
    /// Largest pause between a client's operations.
    pub think_max_ns: u64,
    /// Snapshot every this many applied entries (0: never).
    pub snapshot_interval: u64,
    /// Log segment size.
    pub segment_bytes: u64,
    /// The network.
    pub net: NetConfig,
    /// Whether the nemesis acts.
    pub faults: bool,
    /// Most servers down at once.
    pub max_crashed: u32,
    /// Longest partition / downtime.
    pub fault_max_ns: u64,
    /// Largest gap between nemesis actions.
    pub gap_max_ns: u64,
    /// Faults stop (everything heals and restarts) at this time.
    pub calm_ns: u64,
    /// The run stops at this time at the latest.
    pub end_ns: u64,
    /// Leaders announce a moved commit index at once (`ordo_raft::Config::
    /// announce_commit`; production's R3P2 default is off). Drawn last, so
    /// the other parameters of a seed are what they were before it existed.
    pub announce_commit: bool,
    /// Replicas snapshot only once the log since the last snapshot is as
    /// large as it (`RaftOptions::snapshot_by_size`, production's default);
    /// else at every `snapshot_interval` entries, as before it existed.
    /// Drawn after `announce_commit`, for the same reason.
    pub snapshot_by_size: bool,
}

impl Params {
    /// The parameters of `seed`.
    pub fn draw(seed: u64) -> Params {
        let mut r = SimRng::new(derive_seed(seed, stream::SCENARIO ^ 0x_3_2_2));
        let servers = if r.chance(200_000) { 5 } else { 3 };
        let tick_ns = r.range(150_000, 300_000);
        let net = NetConfig {
            delay_min_ns: r.range(2_000, 10_000),
            delay_max_ns: r.range(20_000, 120_000),
            spike_ppm: r.range(0, 20_000) as u32,
            spike_max_ns: r.range(100_000, 2_000_000),
            loss_ppm: r.range(0, 60_000) as u32,
            duplicate_ppm: r.range(0, 30_000) as u32,
            ..NetConfig::default()
        };
        let calm_ns = r.range(10_000_000, 60_000_000);
        let ops = r.range(10, 60);
        Params {
            servers,
            clients: r.range(2, 5) as u32,
            ops: ops as u32,
            keys: r.range(1, 4) as u32,
            tick_ns,
            // A quarter of the seeds retry impatiently (often before the
            // first attempt committed): many duplicates in the log.
            client_timeout_ns: if r.chance(250_000) {
                r.range(100_000, 600_000)
            } else {
                r.range(tick_ns * 8, tick_ns * 25)
            },
            // Spread the load over the faults (and a little beyond).
            think_max_ns: r.range(calm_ns / ops, 3 * calm_ns / ops),
            snapshot_interval: [0, 3, 7, 16, 50][r.index(5)],
            segment_bytes: [512, 4096, 1 << 20][r.index(3)],
            net,
            faults: !r.chance(50_000),
            max_crashed: r.range(1, u64::from(servers)) as u32,
            fault_max_ns: r.range(1_000_000, 12_000_000),
            gap_max_ns: r.range(500_000, 4_000_000),
            calm_ns,
            end_ns: calm_ns + 200_000_000,
            announce_commit: r.chance(500_000),
            snapshot_by_size: r.chance(500_000),
        }
    }

    fn members(&self) -> u32 {
        self.servers + self.clients
    }
}

/// A replica's log as term runs: `(first index of the run, term)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogView {
    /// First index held (after the snapshot).
    pub first: u64,
    /// Last index held.
    pub last: u64,
    /// Ascending runs of equal terms.
    pub runs: Vec<(u64, u64)>,
}

impl LogView {
    fn of(node: &Node) -> LogView {
        let (first, last) = (node.first_index(), node.last_index());
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for i in first..=last {
            let t = node.term_at(i).unwrap_or(0);
            if runs.last().is_none_or(|r| r.1 != t) {
                runs.push((i, t));
            }
        }
        LogView { first, last, runs }
    }

    /// The term at `index`, if held.
    pub fn term(&self, index: u64) -> Option<u64> {
        if index < self.first || index > self.last {
            return None;
        }
        self.runs.iter().rev().find(|r| r.0 <= index).map(|r| r.1)
    }
}

/// One recorded event (fields as named).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum R3Event {
    /// A client started an operation.
    Invoke { client: u64, request: u32, op: KvOp },
    /// A client got its operation's answer.
    Return { client: u64, request: u32, reply: KvReply },
    /// A server applied a committed command at apply position `position`
    /// (the KV state's count of applied commands before it).
    Applied { position: u64, client: u64, request: u32, op: KvOp, reply: KvReply },
    /// A server replaced its KV state by a snapshot.
    Restored { applied: u64 },
    /// A server's commit index advanced to `index` (entry term `term`) while
    /// its current term was `at_term`.
    Commit { index: u64, term: u64, at_term: u64 },
    /// A server became leader of `term` with this log.
    Leader { term: u64, log: LogView },
    /// A live server's state at the end of the run.
    Final {
        log: LogView,
        commit: u64,
        term: u64,
        leader: bool,
        applied: u64,
        state: Vec<u8>,
        duplicates: u64,
    },
}

fn sock_addr(a: NetAddr) -> SocketAddr {
    let m = a.member;
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, (m >> 16) as u8, (m >> 8) as u8, m as u8), a.port))
}

fn net_addr(a: SocketAddr) -> Option<NetAddr> {
    match a {
        SocketAddr::V4(v4) => {
            let o = v4.ip().octets();
            (o[0] == 10).then(|| NetAddr::new(u32::from_be_bytes([0, o[1], o[2], o[3]]), v4.port()))
        }
        SocketAddr::V6(_) => None,
    }
}

fn reassembler() -> Reassembler {
    Reassembler::new(ReassemblyConfig { max_packets: MAX_PACKETS, ..ReassemblyConfig::default() })
}

fn send(sock: &mut SimSocket, scratch: &mut Vec<u8>, header: &Header, payload: &[u8], to: SocketAddr) {
    let Some(to) = net_addr(to) else { return };
    let _ = split(header, payload, MTU_PAYLOAD, MAX_PACKETS, scratch, |d| {
        // A closed socket (crashed member) or an oversized datagram is a
        // send failure, as UDP's.
        let _ = sock.send(to, d);
    });
}

/// The simulated socket as the server core's transport.
struct SimTransport {
    sock: SimSocket,
}

impl Transport for SimTransport {
    fn send_datagram(&mut self, to: SocketAddr, datagram: &[u8]) -> io::Result<()> {
        let to = net_addr(to)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a simulated address"))?;
        // A closed socket (crashed member) or an oversized datagram is a
        // send failure, as UDP's.
        self.sock.send(to, datagram).map(|_| ()).map_err(|e| io::Error::other(format!("{e:?}")))
    }
}

/// The replicated application: the production [`KvState`] behind the
/// production [`Handler`] interface, recording what it applies.
#[derive(Default)]
struct RecordingKv {
    state: Mutex<KvState>,
    events: Mutex<Vec<R3Event>>,
}

impl RecordingKv {
    fn state(&self) -> std::sync::MutexGuard<'_, KvState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, e: R3Event) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }

    fn take_events(&self) -> Vec<R3Event> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Handler for RecordingKv {
    fn on_request(&self, request: &[u8], handle: ResponseHandle, responder: &mut Responder<'_>) {
        let (position, reply) = {
            let mut state = self.state();
            (state.applied(), state.apply(request))
        };
        let op = KvOp::decode(request).expect("clients send well-formed operations");
        let client = handle.client();
        let bytes = reply.encode();
        self.record(R3Event::Applied {
            position,
            client: client.client_id,
            request: client.request_id,
            op,
            reply,
        });
        responder.send_response(handle, bytes);
    }

    fn snapshot(&self) -> Option<Vec<u8>> {
        Some(self.state().snapshot())
    }

    fn restore(&self, state: &[u8]) -> Result<(), String> {
        let restored = KvState::from_snapshot(state).expect("a snapshot of our own KV state");
        let applied = restored.applied();
        *self.state() = restored;
        self.record(R3Event::Restored { applied });
        Ok(())
    }
}

/// One server incarnation: the production [`ServerCore`] (the network
/// thread's logic) with the production [`RaftReplication`] hook, the KV
/// handler run inline ([`InlineExecutor`], the server's network-thread
/// mode), and the simulated socket.
pub struct Replica {
    core: ServerCore<RaftReplication<SimDisk>>,
    exec: InlineExecutor,
    kv: Arc<RecordingKv>,
    net: SimTransport,
    last_commit: u64,
    led_term: u64,
}

/// The simulated cluster's secret.
fn cluster_secret() -> ordo_auth::Secret {
    ordo_auth::Secret::from_bytes(b"the r3p2 simulation's cluster secret").expect("long enough")
}

impl Replica {
    fn new(me: u32, servers: u32, tick_ns: u64, sock: SimSocket, hook: RaftReplication<SimDisk>) -> Replica {
        let config = CoreConfig {
            peers: (0..servers).map(|i| sock_addr(NetAddr::new(i, SERVER_PORT))).collect(),
            node_id: u64::from(me),
            mtu_payload: MTU_PAYLOAD,
            reassembly: ReassemblyConfig { max_packets: MAX_PACKETS, ..ReassemblyConfig::default() },
            tick_interval: Duration::from_nanos(tick_ns),
            // Replica traffic is sealed and checked as in production (the
            // MAC counters follow simulated time).
            auth: ordo_r2p2::AuthConfig { cluster: Some(cluster_secret()), ..Default::default() },
            wall_clock: None,
        };
        let core = ServerCore::new(config, Some(hook));
        let kv = Arc::new(RecordingKv::default());
        let exec = InlineExecutor::new(kv.clone(), &core);
        Replica { core, exec, kv, net: SimTransport { sock }, last_commit: 0, led_term: 0 }
    }

    fn observe(&mut self, ctx: &mut Ctx<'_, R3Event>) {
        let node = self.core.hook().expect("a replica has its hook").replica().node();
        let commit = node.commit_index();
        let mut events = Vec::new();
        if commit > self.last_commit {
            self.last_commit = commit;
            let term = node.term_at(commit).unwrap_or(0);
            events.push(R3Event::Commit { index: commit, term, at_term: node.term() });
        }
        if node.is_leader() && node.term() != self.led_term {
            self.led_term = node.term();
            events.push(R3Event::Leader { term: self.led_term, log: LogView::of(node) });
        }
        for e in events {
            ctx.record(e);
        }
    }

    /// The network loop's turn: receive a batch, timers, end of turn.
    fn poll(&mut self, ctx: &mut Ctx<'_, R3Event>) -> usize {
        let now = ctx.now();
        let mut work = 0;
        for _ in 0..32 {
            let Some((from, bytes)) = self.net.sock.recv() else { break };
            work += self.core.on_datagram(now, sock_addr(from), &bytes, &mut self.exec, &mut self.net);
        }
        work += self.core.on_timers(now, &mut self.exec, &mut self.net);
        work += self.core.end_turn(now, &mut self.exec, &mut self.net);
        for e in self.kv.take_events() {
            ctx.record(e);
        }
        self.observe(ctx);
        ctx.wake_at(self.core.next_tick_ns());
        work
    }

    fn final_event(&self) -> R3Event {
        let node = self.hook().replica().node();
        let kv = self.kv.state();
        R3Event::Final {
            log: LogView::of(node),
            commit: node.commit_index(),
            term: node.term(),
            leader: node.is_leader(),
            applied: kv.applied(),
            state: kv.snapshot(),
            duplicates: self.hook().replica().stats().duplicates,
        }
    }

    /// The hook (tests look at its replica).
    pub fn hook(&self) -> &RaftReplication<SimDisk> {
        self.core.hook().expect("a replica has its hook")
    }
}

struct ServerProc {
    core: Rc<RefCell<Replica>>,
    world: Rc<RefCell<World>>,
    /// Died of a power loss: does nothing until crashed and restarted.
    dead: bool,
}

impl SimProcess<R3Event> for ServerProc {
    fn poll(&mut self, ctx: &mut Ctx<'_, R3Event>) -> usize {
        if self.dead {
            return 0;
        }
        let core = &self.core;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.borrow_mut().poll(ctx))) {
            Ok(work) => work,
            Err(panic) => {
                let msg = panic_message(&*panic);
                if !msg.contains(POWER_LOSS) {
                    std::panic::resume_unwind(panic);
                }
                // The replica's crash-stop on a failed fsync: the process is
                // gone, with whatever it wrote and did not sync.
                self.dead = true;
                let mut w = self.world.borrow_mut();
                w.zombies.insert(ctx.member());
                w.power_losses += 1;
                0
            }
        }
    }
}

use crate::panic_message;

/// What a failed fsync says (a simulated power loss).
const POWER_LOSS: &str = "simulated power loss";

/// Keeps the default panic message for every panic but the simulated
/// power losses (which are caught and expected).
fn quiet_power_losses() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !panic_message(info.payload()).contains(POWER_LOSS) {
                previous(info);
            }
        }));
    });
}

/// A server's disk: a [`MemDisk`] (shared by the member's incarnations)
/// whose fsyncs fail once `power_loss` is set, so the process dies between
/// writing and syncing (the replica's crash-stop), and the restart's
/// `MemDisk::crash` decides what of the unsynced writes survives.
#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    /// The storage.
    pub mem: MemDisk,
    /// Fail the next fsync (and every one after it).
    pub power_loss: Arc<AtomicBool>,
}

impl SimDisk {
    fn check(&self) -> io::Result<()> {
        if self.power_loss.load(Ordering::SeqCst) { Err(io::Error::other(POWER_LOSS)) } else { Ok(()) }
    }
}

impl Disk for SimDisk {
    fn list(&mut self) -> io::Result<Vec<String>> {
        self.mem.list()
    }
    fn create(&mut self, name: &str) -> io::Result<()> {
        self.mem.create(name)
    }
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.mem.append(name, bytes)
    }
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        self.mem.read(name)
    }
    fn read_range(&mut self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.mem.read_range(name, offset, len)
    }
    fn file_len(&mut self, name: &str) -> io::Result<u64> {
        self.mem.file_len(name)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.check()?;
        self.mem.sync(name)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.mem.truncate(name, len)
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.mem.remove(name)
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.mem.rename(from, to)
    }
    fn sync_dir(&mut self) -> io::Result<()> {
        self.check()?;
        self.mem.sync_dir()
    }
}

/// A client's state (kept across its incarnations: the same logical client).
struct ClientCore {
    id: u64,
    servers: u32,
    keys: u32,
    ops: u32,
    timeout_ns: u64,
    think_max_ns: u64,
    rng: SimRng,
    target: u32,
    next_request: u32,
    done: u32,
    pending: Option<(u32, Vec<u8>, u64)>,
    next_op_ns: u64,
    /// When the pending operation was invoked.
    invoked_ns: u64,
    /// Faults stop here: the client must then complete `AFTER_CALM` more.
    calm_ns: u64,
    answered_after_calm: u32,
    /// Values this client saw per key (Cas expectations).
    seen: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

struct ClientProc {
    core: Rc<RefCell<ClientCore>>,
    sock: SimSocket,
    reasm: Reassembler,
    scratch: Vec<u8>,
    resend: bool,
}

impl ClientCore {
    /// Its `ops`, and `AFTER_CALM` more invoked after the faults, answered.
    fn finished(&self) -> bool {
        self.done >= self.ops && self.answered_after_calm >= AFTER_CALM
    }

    fn next_op(&mut self, request: u32) -> KvOp {
        let token = format!("c{}r{};", self.id, request).into_bytes();
        if self.rng.chance(250_000) {
            return KvOp::Append { key: LOG_KEY.to_vec(), value: token };
        }
        let key = format!("k{}", self.rng.below(u64::from(self.keys))).into_bytes();
        match self.rng.below(10) {
            0..=2 => KvOp::Get { key },
            3..=4 => KvOp::Put { key, value: token },
            5..=6 => {
                let expected =
                    if self.rng.chance(800_000) { self.seen.get(&key).cloned().flatten() } else { None };
                KvOp::Cas { key, expected, new: token }
            }
            7 => KvOp::Delete { key },
            _ => KvOp::Append { key, value: token },
        }
    }
}

impl ClientProc {
    fn send_pending(&mut self) {
        let core = self.core.borrow();
        let Some((request, payload, _)) = &core.pending else { return };
        let mut h = Header {
            message_type: MessageType::Request,
            policy: Policy::ReplicatedRoute,
            flags: 0,
            packet_id: 0,
            packet_count: 1,
            client_id: core.id,
            request_id: *request,
            leader_hint: 0,
            payload_len: 0,
        };
        // Half the clients say what they have had answered (every earlier
        // request: one at a time), as `Client` does by default; the others
        // keep the replicas' whole session window in play.
        if core.id.is_multiple_of(2) {
            h.set_answered_below(*request);
        }
        let to = sock_addr(NetAddr::new(core.target, SERVER_PORT));
        send(&mut self.sock, &mut self.scratch, &h, payload, to);
    }
}

impl SimProcess<R3Event> for ClientProc {
    fn poll(&mut self, ctx: &mut Ctx<'_, R3Event>) -> usize {
        let now = ctx.now();
        let mut work = 0;
        while let Some((from, bytes)) = self.sock.recv() {
            work += 1;
            let Ok((h, payload)) = header::decode(&bytes, MAX_PACKETS) else { continue };
            let Some(m) = self.reasm.on_packet(sock_addr(from), &h, payload, now) else { continue };
            let mut core = self.core.borrow_mut();
            let core = &mut *core;
            if let Some(hint) = m.leader_hint
                && u32::from(hint) < core.servers
            {
                core.target = u32::from(hint);
            }
            let Some((request, payload, _)) = core.pending.clone() else { continue };
            if m.client_id != core.id || m.request_id != request {
                continue; // an answer to an older attempt
            }
            match m.message_type {
                MessageType::Response => {
                    let reply = KvReply::decode(&m.payload).expect("well-formed reply");
                    let op = KvOp::decode(&payload).expect("own op");
                    let key = op.key().to_vec();
                    let value = match &reply {
                        KvReply::Value(v) => match op {
                            KvOp::Get { .. } | KvOp::Append { .. } => v.clone(),
                            KvOp::Put { value, .. } => Some(value),
                            _ => None,
                        },
                        KvReply::Cas { swapped: true, .. } => match op {
                            KvOp::Cas { new, .. } => Some(new),
                            _ => None,
                        },
                        KvReply::Cas { found, .. } => found.clone(),
                        KvReply::Error(_) => None,
                    };
                    core.seen.insert(key, value);
                    ctx.record(R3Event::Return { client: core.id, request, reply });
                    core.pending = None;
                    core.done += 1;
                    if core.invoked_ns >= core.calm_ns {
                        core.answered_after_calm += 1;
                    }
                    let think = core.rng.range(0, core.think_max_ns + 1);
                    core.next_op_ns = now + think;
                }
                MessageType::Redirect => {
                    self.resend = true;
                }
                MessageType::Error => {
                    // E.g. refused: try the next server on the timeout.
                }
                _ => {}
            }
        }
        {
            let mut core = self.core.borrow_mut();
            let core = &mut *core;
            if let Some((_, _, deadline)) = core.pending.as_mut()
                && now >= *deadline
            {
                *deadline = now + core.timeout_ns;
                core.target = (core.target + 1) % core.servers;
                self.resend = true;
            }
            if core.pending.is_none()
                && !core.finished()
                && now >= core.next_op_ns
                && (core.done < core.ops || now >= core.calm_ns)
            {
                core.invoked_ns = now;
                core.next_request += 1;
                let request = core.next_request;
                let op = core.next_op(request);
                ctx.record(R3Event::Invoke { client: core.id, request, op: op.clone() });
                core.pending = Some((request, op.encode(), now + core.timeout_ns));
                self.resend = true;
            }
        }
        if std::mem::take(&mut self.resend) {
            self.send_pending();
            work += 1;
        }
        let core = self.core.borrow();
        match &core.pending {
            Some((_, _, deadline)) => ctx.wake_at(*deadline),
            None if core.finished() => {}
            None if core.done < core.ops => ctx.wake_at(core.next_op_ns),
            None => ctx.wake_at(core.next_op_ns.max(core.calm_ns)),
        }
        work
    }

    fn done(&self) -> bool {
        self.core.borrow().finished()
    }
}

/// Everything a driver needs to look at the processes.
pub struct World {
    /// Each server's latest incarnation.
    pub servers: Vec<Option<Rc<RefCell<Replica>>>>,
    /// Each server's disk (outside its processes).
    pub disks: Vec<SimDisk>,
    /// Servers whose process died of a power loss at an fsync (silent until
    /// the driver crashes and restarts them).
    pub zombies: BTreeSet<u32>,
    /// Power losses that struck (a sync failed).
    pub power_losses: u64,
    /// Bytes of torn unsynced tails that recoveries cut.
    pub torn_bytes: u64,
}

/// Builds the simulation of `params` (no nemesis yet: the driver acts).
pub fn build(seed: u64, params: &Params) -> (Sim<R3Event>, Rc<RefCell<World>>) {
    let n = params.servers;
    let world = Rc::new(RefCell::new(World {
        servers: vec![None; n as usize],
        disks: (0..n).map(|_| SimDisk::default()).collect(),
        zombies: BTreeSet::new(),
        power_losses: 0,
        torn_bytes: 0,
    }));
    let clients: Vec<Rc<RefCell<ClientCore>>> = (0..params.clients)
        .map(|c| {
            let m = n + c;
            Rc::new(RefCell::new(ClientCore {
                id: 1000 + u64::from(m),
                servers: n,
                keys: params.keys,
                ops: params.ops,
                timeout_ns: params.client_timeout_ns,
                think_max_ns: params.think_max_ns,
                rng: SimRng::new(derive_seed(seed, stream::PROCESS ^ (0xC11E << 16) ^ u64::from(m))),
                target: c % n,
                next_request: 0,
                done: 0,
                pending: None,
                next_op_ns: 0,
                invoked_ns: 0,
                calm_ns: if params.faults { params.calm_ns } else { 0 },
                answered_after_calm: 0,
                seen: BTreeMap::new(),
            }))
        })
        .collect();
    let p = params.clone();
    let w = world.clone();
    let factory: ordo_sim::Factory<R3Event> = Box::new(move |ctx| {
        let m = ctx.member();
        if m >= p.servers {
            let sock = ctx.bind(CLIENT_PORT).expect("client port");
            let core = clients[(m - p.servers) as usize].clone();
            let mut proc =
                ClientProc { core, sock, reasm: reassembler(), scratch: Vec::new(), resend: false };
            // A restarted client resends its pending operation at once.
            proc.resend = proc.core.borrow().pending.is_some();
            return Box::new(proc);
        }
        let disk = w.borrow().disks[m as usize].clone();
        if ctx.incarnation() > 1 {
            // The incarnation before died (crash, or power loss at an
            // fsync): whatever it had not synced may be lost or torn.
            disk.mem.crash(derive_seed(seed, stream::PROCESS ^ (u64::from(m) << 32) ^ ctx.incarnation()));
            disk.power_loss.store(false, Ordering::SeqCst);
        }
        let mut opts = RaftOptions::new(m as usize, p.servers as usize);
        opts.tick = Duration::from_nanos(p.tick_ns);
        let mut raft =
            Config::new(u64::from(m) + 1, derive_seed(seed, (u64::from(m) << 32) ^ ctx.incarnation()));
        raft.election_ticks = 10;
        raft.heartbeat_ticks = 2;
        raft.announce_commit = p.announce_commit;
        opts.raft = raft;
        opts.log = LogOptions { segment_bytes: p.segment_bytes, durable: true, ..LogOptions::default() };
        opts.snapshot_interval = p.snapshot_interval;
        opts.snapshot_by_size = p.snapshot_by_size;
        let hook = RaftReplication::open(disk, opts).expect("a replica opens on its own disk");
        w.borrow_mut().torn_bytes += hook.replica().store().stats().torn_bytes_recovered;
        let sock = ctx.bind(SERVER_PORT).expect("server port");
        let core = Rc::new(RefCell::new(Replica::new(m, p.servers, p.tick_ns, sock, hook)));
        w.borrow_mut().servers[m as usize] = Some(core.clone());
        Box::new(ServerProc { core, world: w.clone(), dead: false })
    });
    let config = SimConfig { members: params.members(), net: params.net.clone(), ..SimConfig::default() };
    (Sim::new(seed, config, None, factory), world)
}

/// Records every live server's final state (at the history's end).
pub fn finish(sim: Sim<R3Event>, world: &Rc<RefCell<World>>, servers: u32) -> History<R3Event> {
    let mut h = sim.into_history();
    let end = h.end_ns;
    for m in 0..servers {
        if !h.alive_at_end(m) {
            continue;
        }
        let inc = h.final_incarnation(m);
        if let Some(core) = &world.borrow().servers[m as usize] {
            let e = core.borrow().final_event();
            h.record(end, m, inc, e);
        }
    }
    h
}

/// The live leader, if any (its process believes it leads).
pub fn leader_of(world: &Rc<RefCell<World>>, sim: &Sim<R3Event>, n: u32) -> Option<u32> {
    let w = world.borrow();
    let wl = sim.world().lock().expect("world lock");
    (0..n).find(|m| {
        wl.is_alive(*m)
            && w.servers[*m as usize].as_ref().is_some_and(|c| c.borrow().hook().replica().node().is_leader())
    })
}

/// Runs one seed (nemesis included) and returns its history (unchecked).
pub fn simulate(seed: u64, params: &Params) -> History<R3Event> {
    simulate_counted(seed, params).0
}

/// What a run's disks went through.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskCounts {
    /// Processes that died at a failed fsync.
    pub power_losses: u64,
    /// Bytes of torn unsynced tails cut by recoveries.
    pub torn_bytes: u64,
    /// Crashes of the disks (restarts of servers).
    pub disk_crashes: u64,
}

/// [`simulate`], with the disks' counters.
pub fn simulate_counted(seed: u64, params: &Params) -> (History<R3Event>, DiskCounts) {
    quiet_power_losses();
    let n = params.servers;
    let (mut sim, world) = build(seed, params);
    let mut rng = SimRng::new(derive_seed(seed, stream::NEMESIS));
    if params.faults {
        let mut crashed: BTreeSet<u32> = BTreeSet::new();
        let mut later = UndoQueue::default();
        let mut t = rng.range(1_000_000, 5_000_000);
        let members = params.members();
        while t < params.calm_ns {
            for m in later.run_due(&mut sim, t) {
                crashed.remove(&m);
            }
            sim.run_until(t);
            let hold = rng.range(200_000, params.fault_max_ns);
            // Processes that died of a power loss are crashed (they are
            // already silent) and restarted later.
            let zombies = std::mem::take(&mut world.borrow_mut().zombies);
            for z in zombies {
                sim.crash(z);
                crashed.insert(z);
                later.push(t + hold, Undo::Restart(z));
            }
            match rng.weighted(&[3, 3, 2, 2, 1]) {
                0 if (crashed.len() as u32) < params.max_crashed => {
                    let alive: Vec<u32> = (0..n).filter(|m| !crashed.contains(m)).collect();
                    let victim = match leader_of(&world, &sim, n) {
                        Some(l) if rng.chance(600_000) => l,
                        _ => alive[rng.index(alive.len())],
                    };
                    sim.crash(victim);
                    crashed.insert(victim);
                    later.push(t + hold, Undo::Restart(victim));
                }
                1 => {
                    let a = rng.below(u64::from(members)) as u32;
                    let b = (a + 1 + rng.below(u64::from(members - 1)) as u32) % members;
                    sim.cut(a, b);
                    later.push(t + hold, Undo::Heal(a, b));
                }
                3 if (crashed.len() as u32) < params.max_crashed => {
                    // Power loss at the victim's next fsync.
                    let alive: Vec<u32> = (0..n).filter(|m| !crashed.contains(m)).collect();
                    let victim = match leader_of(&world, &sim, n) {
                        Some(l) if rng.chance(500_000) => l,
                        _ => alive[rng.index(alive.len())],
                    };
                    world.borrow().disks[victim as usize].power_loss.store(true, Ordering::SeqCst);
                }
                2 => {
                    let mut all: Vec<u32> = (0..n).collect();
                    rng.shuffle(&mut all);
                    let mut side = all[..1 + rng.index((n - 1) as usize)].to_vec();
                    side.sort_unstable();
                    sim.split(side.clone());
                    later.push(t + hold, Undo::HealSplit(side));
                }
                _ => {}
            }
            t += rng.range(200_000, params.gap_max_ns);
        }
        if params.calm_ns > 0 {
            later.run_due(&mut sim, params.calm_ns - 1);
        }
        later.clear();
        sim.run_until(params.calm_ns);
        // No power loss after the calm; the dead are restarted by it.
        for d in &world.borrow().disks {
            d.power_loss.store(false, Ordering::SeqCst);
        }
        let zombies = std::mem::take(&mut world.borrow_mut().zombies);
        for z in zombies {
            sim.crash(z);
        }
        sim.calm();
    }
    let h = settle(sim, &world, params, params.calm_ns);
    let w = world.borrow();
    let counts = DiskCounts {
        power_losses: w.power_losses,
        torn_bytes: w.torn_bytes,
        disk_crashes: w.disks.iter().map(|d| d.mem.stats().crashes).sum(),
    };
    (h, counts)
}

/// Runs `sim` (faults over) until every client is done, from `from_ns` on,
/// or the time limit; returns the history with the final states.
pub fn settle(
    mut sim: Sim<R3Event>,
    world: &Rc<RefCell<World>>,
    params: &Params,
    from_ns: u64,
) -> History<R3Event> {
    let limits = ordo_sim::RunLimits {
        max_time_ns: params.end_ns.max(from_ns + 200_000_000),
        max_steps: 20_000_000,
        quiesce_after_ns: Some(from_ns + 2_000_000),
    };
    sim.run(&limits);
    finish(sim, world, params.servers)
}

mod check;
pub use check::*;
