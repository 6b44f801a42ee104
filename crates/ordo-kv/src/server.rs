//! `ordo kv serve`: one replica of the replicated hash table — an acuerdo
//! member (its agent thread) and a RESP front end (one mio event loop
//! thread) that speaks to any Redis client.
//!
//! # How a request is served
//! - **Writes** at the leader become an [`Entry`] stamped with the leader's
//!   clock, proposed through the member's client queue; every replica
//!   applies committed entries in the total order ([`KvState::apply`], on
//!   the agent's thread); the replica whose front end took the request
//!   (`origin`, `nonce`) hands the state machine's reply to the waiting
//!   connection. At a follower a write is forwarded to the leader's RESP
//!   port over one pipelined link (authenticated with the client secret,
//!   marked `ORDO FORWARDED` so the leader never forwards it again), or
//!   answered `-MOVED 0 host:port` when `kv.redirect` is set.
//! - **Reads** are linearizable by default: the leader batches the reads of
//!   one loop turn behind one read barrier ([`AcuerdoClient::read_barrier`],
//!   the engine's read index: no log write), and answers them from the
//!   state once the barrier is confirmed; followers forward reads to the
//!   leader. A `READONLY` connection (or `kv.reads = "local"`) reads the
//!   local copy at once, possibly stale.
//!
//! # Invariants
//! - A connection's commands take effect in its order: a read is confirmed
//!   only after every write taken before it was proposed (the read index
//!   then covers them); a write behind a pending read of its connection is
//!   held until that read is answered (so the read cannot see it); a
//!   follower forwards both over one ordered link.
//! - Replies go out in request order per connection (pipelining): each
//!   request takes a slot at the tail of its connection's queue, and bytes
//!   are written only from filled slots at the head.
//! - A client is answered once per request: `+OK`/value after its entry was
//!   applied here; `-TRYAGAIN ...` only when the write was certainly not
//!   applied (refused, or lost in a leader change) or the outcome is
//!   unknown (the forwarding link broke), and it says which.
//! - Nothing a client sends changes state before it is parsed and
//!   authorized; what one connection may hold is bounded (unparsed bytes,
//!   pipelined requests), and so is the number of connections.

use crate::command::{Action, Read, ScanCursors, Sizes, answer, keys_in_chunks, parse};
use crate::disk::{DiskOptions, DiskStore};
use crate::engine::{AcuerdoEngine, Engine, EngineEvent};
use crate::resp::{self, Limits};
use crate::state::{Entry, KvState, Reply};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use ordo_fabric::MemberId;
use ordo_runtime::acuerdo::{AcuerdoMember, MemberOptions, region_len, runtime_config, start_member_idle};
use ordo_runtime::node::{NodeStatus, SubgroupStatus, unix_ns};
use ordo_runtime::wiring::{MemberFabric, connect_fabric};
use ordo_runtime::{KvDurability, KvEngine, KvReads, OrdoConfig, Runner, StatusServer};
use std::collections::{HashMap, VecDeque};
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FORWARD: Token = Token(2);
const FIRST_CONN: usize = 16;

/// Why a replica did not start.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The configuration is not one `ordo kv serve` can run.
    #[error("configuration: {0}")]
    Config(String),
    /// The client secret could not be read.
    #[error("client secret: {0}")]
    Secret(String),
    /// The fabric or the member did not start.
    #[error("starting the member: {0}")]
    Start(String),
    /// The durable state (`kv.durability = "disk"`) could not be opened or
    /// is damaged.
    #[error("data directory {dir}: {why}")]
    Disk {
        /// `kv.data_dir`.
        dir: String,
        /// Why.
        why: crate::disk::DiskError,
    },
    /// The RESP port could not be bound.
    #[error("binding {addr}: {why}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        why: String,
    },
}

/// Counters the front end keeps (INFO, status, tests).
#[derive(Debug, Default)]
pub struct KvCounters {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections open now.
    pub clients: AtomicU64,
    /// Commands processed.
    pub commands: AtomicU64,
    /// Writes proposed here (as leader).
    pub writes_proposed: AtomicU64,
    /// Requests forwarded to the leader.
    pub forwarded: AtomicU64,
    /// Read barriers asked for.
    pub read_barriers: AtomicU64,
    /// Requests refused as malformed or over a bound (connection closed).
    pub protocol_errors: AtomicU64,
    /// Failed AUTH attempts.
    pub auth_failures: AtomicU64,
    /// `disk` mode: persists that wrote something (one fsync of the log
    /// each: group commit).
    pub disk_persists: AtomicU64,
    /// `disk` mode: table snapshots written (periodic and restored).
    pub disk_snapshots: AtomicU64,
    /// `disk` mode: entries in the stored log (above the snapshot).
    pub disk_stored_entries: AtomicU64,
}

impl Shared {
    fn new(table: KvState, applied: u64, waker: Waker) -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(table),
            applied: AtomicU64::new(applied),
            results: Mutex::new(Vec::new()),
            waker,
            counters: KvCounters::default(),
            stop: AtomicBool::new(false),
            status: Mutex::new(NodeStatus::default()),
        })
    }
}

struct Shared {
    state: Mutex<KvState>,
    /// The last header the table applied (its word), written on the agent's
    /// thread; a `disk` replica snapshots the table at it.
    applied: AtomicU64,
    /// Replies of entries this front end proposed, by request number.
    results: Mutex<Vec<(u64, Reply)>>,
    waker: Waker,
    counters: KvCounters,
    stop: AtomicBool,
    status: Mutex<NodeStatus>,
}

/// A running replica.
pub struct KvServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    front: Option<std::thread::JoinHandle<()>>,
    runner: Option<Runner<ordo_runtime::acuerdo::AcuerdoMember<MemberFabric>>>,
    /// `kv.engine = "raft"`: the R3P2 replica.
    raft: Option<ordo_r2p2::Server>,
    /// `kv.engine = "vsync"`: the `ordo node` member.
    node: Option<ordo_runtime::Node>,
    _status: Option<StatusServer>,
}

impl KvServer {
    /// Starts the replica `config` describes ([`OrdoConfig::validate_kv`]):
    /// the acuerdo member over the configured fabric (waiting for every
    /// member to come up), then the RESP front end.
    pub fn start(config: &OrdoConfig) -> Result<KvServer, KvError> {
        config.validate_kv().map_err(|e| KvError::Config(e.to_string()))?;
        let password = config
            .security
            .load_client_secret()
            .map_err(|e| KvError::Secret(e.to_string()))?
            .map(|s| s.env_value().map(|v| v.as_bytes().to_vec()))
            .map(|v| v.ok_or_else(|| KvError::Secret("the client secret is not UTF-8 text".into())))
            .transpose()?;
        let kv = config.kv.clone();
        let me = config.member.id;
        let mut cfg = runtime_config(config.group.members.clone(), me);
        cfg.incarnation = config.node.incarnation.max(1);
        cfg.max_payload = kv.max_entry_bytes;
        cfg.window = kv.window;
        cfg.max_outstanding = kv.max_outstanding;
        let timeout_ns = kv.failure_timeout_ms().saturating_mul(1_000_000);
        cfg.heartbeat_timeout_ns = timeout_ns;
        cfg.election_timeout_ns = timeout_ns + timeout_ns / 3;
        cfg.validate().map_err(|e| KvError::Config(e.to_string()))?;
        let mut c = config.clone();
        c.fabric.region_bytes = c.fabric.region_bytes.max(region_len(&cfg));
        let listener = std::net::TcpListener::bind(&kv.listen)
            .map_err(|e| KvError::Bind { addr: kv.listen.clone(), why: e.to_string() })?;
        listener.set_nonblocking(true).map_err(|e| KvError::Start(e.to_string()))?;
        let addr = listener.local_addr().map_err(|e| KvError::Start(e.to_string()))?;
        let poll = Poll::new().map_err(|e| KvError::Start(e.to_string()))?;
        let waker = Waker::new(poll.registry(), WAKER).map_err(|e| KvError::Start(e.to_string()))?;
        let nonce = unix_ns() ^ (u64::from(std::process::id()) << 40) ^ u64::from(me);
        let (shared, client, runner, raft_server, vsync_node) = match kv.engine {
            KvEngine::Raft => start_raft(config, me, nonce, waker)?,
            KvEngine::Vsync => start_vsync(config, me, nonce, waker)?,
            KvEngine::Acuerdo => {
                // Durable mode: the table, promise and log this replica wrote.
                let mut store = None;
                let mut boot = None;
                if kv.durability == KvDurability::Disk {
                    let dir = kv.data_dir.clone().unwrap_or_default();
                    let options = DiskOptions {
                        snapshot_entries: kv.snapshot_entries,
                        max_record_bytes: u32::try_from(kv.max_entry_bytes + 64).unwrap_or(u32::MAX),
                        ..DiskOptions::default()
                    };
                    let (s, b) = DiskStore::open_dir(std::path::Path::new(&dir), options)
                        .map_err(|why| KvError::Disk { dir: dir.clone(), why })?;
                    if let Some(b) = &b {
                        tracing::info!(
                            %dir, base = ?b.recovered.base, entries = b.recovered.log.len(), e_new = ?b.recovered.e_new,
                            "recovering from disk"
                        );
                    }
                    store = Some(s);
                    boot = b;
                    cfg.durable = true;
                }
                let (table, applied, recovered) = match boot {
                    Some(b) => (b.state, b.recovered.base, Some(b.recovered)),
                    None => (KvState::new(), ordo_acuerdo::Header::NONE, None),
                };
                let shared = Shared::new(table, applied.encode(), waker);
                let fabric = connect_fabric(&c).map_err(|e| KvError::Start(e.to_string()))?;
                let (s1, s2, s3, s4, s5) =
                    (shared.clone(), shared.clone(), shared.clone(), shared.clone(), shared.clone());
                let on_persist: Option<ordo_runtime::acuerdo::PersistFn> = store.map(|mut store| {
                    Box::new(move |change: &ordo_acuerdo::Persist<'_>| {
                        let applied = ordo_acuerdo::Header::decode(s5.applied.load(Ordering::Acquire));
                        let mut table = || lock(&s5).clone();
                        let result = store.persist(change, applied, &mut table);
                        let c = &s5.counters;
                        c.disk_persists.store(store.stats().persists, Ordering::Relaxed);
                        c.disk_snapshots.store(store.stats().snapshots, Ordering::Relaxed);
                        c.disk_stored_entries.store(store.stored_entries() as u64, Ordering::Relaxed);
                        if let Err(why) = result {
                            // Like etcd on a failed fsync: the member must not
                            // publish what it could not make durable, so it stops
                            // here (its peers see it die and go on without it).
                            tracing::error!(%why, "cannot write the durable state; this replica exits");
                            eprintln!("ordo-kv: cannot write the durable state ({why}); exiting");
                            std::process::exit(74);
                        }
                    }) as ordo_runtime::acuerdo::PersistFn
                });
                let options = MemberOptions {
                    recovered,
                    on_persist,
                    on_deliver: Some(Box::new(move |h, payload| {
                        s1.applied.store(h.encode(), Ordering::Release);
                        let entry = match Entry::decode(payload) {
                            Ok(e) => e,
                            Err(why) => {
                                // Only a leader proposes, and only entries it
                                // encoded: a bad one is a bug, but it must not
                                // stop the replica; every replica skips it alike.
                                tracing::error!(%why, "a committed entry does not decode; skipped");
                                return;
                            }
                        };
                        let reply = lock(&s1).apply(&entry);
                        if entry.origin == me && entry.nonce == nonce && entry.request != 0 {
                            s1.results.lock().unwrap_or_else(|e| e.into_inner()).push((entry.request, reply));
                        }
                    })),
                    on_snapshot: Some(Box::new(move || lock(&s2).snapshot())),
                    on_restore: Some(Box::new(move |header, bytes| {
                        s3.applied.store(header.encode(), Ordering::Release);
                        let mut st = lock(&s3);
                        match st.restore(bytes) {
                            Ok(()) => {
                                tracing::info!(
                                    ?header,
                                    keys = st.len(0),
                                    "state restored from the leader's snapshot"
                                )
                            }
                            Err(why) => {
                                tracing::error!(%why, "the leader's snapshot does not decode; state kept")
                            }
                        }
                    })),
                    on_client_event: Some(Box::new(move || {
                        let _ = s4.waker.wake();
                    })),
                    ..MemberOptions::default()
                };
                let idle = AcuerdoMember::<MemberFabric>::idle_strategy_with(&cfg, kv.spins, kv.yields);
                let (runner, client) =
                    start_member_idle(fabric, cfg, options, idle).map_err(KvError::Start)?;
                let client: Box<dyn Engine> = Box::new(AcuerdoEngine(client));
                (shared, client, Some(runner), None, None)
            }
        };
        let status_server = match &config.node.status {
            Some(a) => {
                let a: SocketAddr =
                    a.parse().map_err(|e| KvError::Config(format!("node.status {a}: {e}")))?;
                let sh = shared.clone();
                Some(
                    StatusServer::start(a, move || {
                        sh.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
                    })
                    .map_err(|e| KvError::Bind { addr: a.to_string(), why: e.to_string() })?,
                )
            }
            None => None,
        };
        let mut front = Front {
            poll,
            listener: TcpListener::from_std(listener),
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            next_conn_id: 1,
            shared: shared.clone(),
            client,
            me,
            nonce,
            password,
            kv: kv.clone(),
            limits: Limits { max_args: kv.max_args, max_request_bytes: kv.max_request_bytes },
            sizes: Sizes { max_key_bytes: kv.max_key_bytes, max_value_bytes: kv.max_value_bytes },
            next_request: 1,
            writes: HashMap::new(),
            tickets: HashMap::new(),
            backlog: std::collections::BTreeSet::new(),
            in_flight: 0,
            read_batch: Vec::new(),
            barriers: HashMap::new(),
            fwd: None,
            members: config.group.members.clone(),
            backend: format!("{:?}", config.fabric.backend).to_lowercase(),
            started: std::time::Instant::now(),
            next_status: std::time::Instant::now(),
            tokens: Vec::new(),
        };
        front
            .poll
            .registry()
            .register(&mut front.listener, LISTENER, Interest::READABLE)
            .map_err(|e| KvError::Start(e.to_string()))?;
        let thread = std::thread::Builder::new()
            .name(format!("kv-front-{me}"))
            .spawn(move || front.run())
            .map_err(|e| KvError::Start(e.to_string()))?;
        tracing::info!(member = me, %addr, "ordo-kv serving RESP");
        Ok(KvServer {
            shared,
            addr,
            front: Some(thread),
            runner,
            raft: raft_server,
            node: vsync_node,
            _status: status_server,
        })
    }

    /// The RESP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The front end's counters.
    pub fn counters(&self) -> &KvCounters {
        &self.shared.counters
    }

    /// The replica's status (as its status endpoint serves it).
    pub fn status(&self) -> NodeStatus {
        self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A copy of the table (tests, tools).
    pub fn state(&self) -> KvState {
        lock(&self.shared).clone()
    }

    /// Stops the front end and the member.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
        if let Some(t) = self.front.take() {
            let _ = t.join();
        }
        if let Some(r) = self.runner.take() {
            drop(r.join());
        }
        if let Some(r) = self.raft.take() {
            r.shutdown();
        }
        if let Some(n) = self.node.take() {
            n.stop();
        }
    }
}

impl Drop for KvServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What starting an engine gives the front end.
type Started = (
    Arc<Shared>,
    Box<dyn Engine>,
    Option<Runner<ordo_runtime::acuerdo::AcuerdoMember<MemberFabric>>>,
    Option<ordo_r2p2::Server>,
    Option<ordo_runtime::Node>,
);

/// `kv.engine = "vsync"`: this replica as an `ordo node` member of one
/// ordered subgroup of every replica (view changes, joins with state
/// transfer), whose delivery upcall applies the table ([`crate::vsync`]).
fn start_vsync(config: &OrdoConfig, me: MemberId, nonce: u64, waker: Waker) -> Result<Started, KvError> {
    use crate::vsync::{Message, VsyncEngine, decode};
    let kv = &config.kv;
    let mut c = config.clone();
    c.node.engine = ordo_runtime::NodeEngine::Vsync;
    c.node.send_rate = 0;
    // An entry and its 9-byte envelope fit a slot of the default subgroup.
    c.vsync.max_payload = c.vsync.max_payload.max(kv.max_entry_bytes + 9);
    let shared = Shared::new(KvState::new(), 0, waker);
    let events = Arc::new(Mutex::new(VecDeque::new()));
    let (a, b, d, ev) = (shared.clone(), shared.clone(), shared.clone(), events.clone());
    let app = ordo_runtime::NodeApp {
        on_deliver: Some(Box::new(move |_view, batch| {
            let mut woke = false;
            for m in batch.iter().filter(|m| m.subgroup == 0) {
                match decode(m.payload) {
                    Ok(Message::Entry { ticket, entry }) => {
                        let reply = lock(&a).apply(&entry);
                        if entry.origin == me && entry.nonce == nonce {
                            if entry.request != 0 {
                                a.results
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push((entry.request, reply));
                            }
                            ev.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push_back(EngineEvent::Committed(ticket));
                            woke = true;
                        }
                    }
                    Ok(Message::Barrier { origin, nonce: n, ticket }) => {
                        if origin == me && n == nonce {
                            ev.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push_back(EngineEvent::ReadReady(ticket));
                            woke = true;
                        }
                    }
                    // Every replica skips it alike.
                    Err(why) => {
                        tracing::error!(%why, sender = m.sender, "a delivered message does not decode; skipped")
                    }
                }
            }
            if woke {
                let _ = a.waker.wake();
            }
        })),
        on_view: None,
        snapshot: Some(Box::new(move |_| lock(&b).snapshot())),
        restore: Some(Box::new(move |_, bytes| {
            if let Err(why) = lock(&d).restore(bytes) {
                tracing::error!(%why, "the group's state does not decode; table kept");
            }
        })),
        ..Default::default()
    };
    let node = ordo_runtime::Node::start_with(&c, app).map_err(|e| KvError::Start(e.to_string()))?;
    let sender = node.sender(0).ok_or_else(|| KvError::Config("this replica sends in no subgroup".into()))?;
    let engine =
        VsyncEngine::new(sender, events, Box::new(node.status_source()), me, nonce, kv.max_entry_bytes);
    Ok((shared, Box::new(engine), None, None, Some(node)))
}

/// `kv.engine = "raft"`: this replica's R3P2 server (Raft behind
/// REPLICATED_ROUTE on its `kv.raft` address, the table as its handler)
/// and the bridge the front end submits through ([`crate::raft`]).
/// The table, even if a thread panicked holding it (it is only ever
/// replaced whole or changed by one deterministic apply).
fn lock(s: &Shared) -> std::sync::MutexGuard<'_, KvState> {
    s.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The R3P2 replica's options from `[kv]`: snapshots every
/// `snapshot_entries`; the log (and the vote) in `data_dir/raft`, fsynced
/// in `disk` mode (in `memory` mode written but not fsynced: it survives a
/// process crash, not a power loss); and elections after
/// `failure_timeout_ms` of silence (each timeout drawn from `[t, 2t)`), as
/// for acuerdo: a leader waiting on an fsync behind a busy disk, or
/// descheduled on a loaded machine, must not be voted out by followers
/// that merely did not hear from it for a few milliseconds.
fn raft_options(kv: &ordo_runtime::KvConfig, index: usize, members: usize) -> ordo_r2p2::RaftOptions {
    let mut raft = ordo_r2p2::RaftOptions::new(index, members);
    raft.snapshot_interval = kv.snapshot_entries;
    raft.log.durable = kv.durability == KvDurability::Disk;
    let tick_ms = u64::try_from(raft.tick.as_millis()).unwrap_or(u64::MAX).max(1);
    raft.raft.election_ticks = (kv.failure_timeout_ms() / tick_ms).max(2);
    raft.raft.heartbeat_ticks = raft.raft.heartbeat_ticks.min(raft.raft.election_ticks - 1);
    // READONLY connections read a replica's own copy: keep it µs, not a
    // heartbeat, behind the leader.
    raft.raft.announce_commit = true;
    raft
}

fn start_raft(config: &OrdoConfig, me: MemberId, nonce: u64, waker: Waker) -> Result<Started, KvError> {
    use ordo_r2p2::{AuthConfig, HandlerMode, RaftReplication, Server, ServerConfig};
    let kv = &config.kv;
    let members = config.group.members.clone();
    let index = members
        .iter()
        .position(|m| *m == me)
        .ok_or_else(|| KvError::Config(format!("member.id {me} is not in group.members")))?;
    let peers: Vec<SocketAddr> = members
        .iter()
        .map(|id| {
            let a = kv.raft.iter().find(|p| p.id == *id).map(|p| p.addr.as_str()).unwrap_or("");
            a.parse().map_err(|e| KvError::Config(format!("kv.raft address {a:?} of member {id}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    // The cluster secret seals the replicas' datagrams and the bridges'
    // requests: nobody without it changes the log.
    let cluster = config.security.load_secret().map_err(|e| KvError::Secret(e.to_string()))?;
    let shared = Shared::new(KvState::new(), 0, waker);
    let events = Arc::new(Mutex::new(VecDeque::new()));
    let (a, b, c, d, e, f) =
        (shared.clone(), shared.clone(), shared.clone(), shared.clone(), shared.clone(), shared.clone());
    let handler = crate::raft::RaftKv {
        apply: Box::new(move |entry| lock(&a).apply(entry)),
        results: Box::new(move |request, reply| {
            b.results.lock().unwrap_or_else(|e| e.into_inner()).push((request, reply));
        }),
        events: events.clone(),
        wake: Box::new(move || {
            let _ = c.waker.wake();
        }),
        snapshot: Box::new(move || lock(&d).snapshot()),
        restore: Box::new(move |bytes| lock(&e).restore(bytes)),
        me,
        nonce,
    };
    let idle = ordo_runtime::IdleStrategy::BackoffPark {
        spins: kv.spins,
        yields: kv.yields,
        park_min: Duration::from_micros(20),
        park_max: Duration::from_millis(1),
    };
    let server_config = ServerConfig {
        bind: peers[index],
        handler_mode: HandlerMode::NetworkThread,
        idle,
        worker_idle: idle,
        peers: peers.clone(),
        node_id: index as u64,
        auth: AuthConfig {
            cluster: cluster.clone(),
            client: cluster.clone(),
            require_client_mac: cluster.is_some(),
            ..AuthConfig::default()
        },
        ..ServerConfig::default()
    };
    let raft = raft_options(kv, index, members.len());
    let start_err = |e: String| KvError::Start(format!("raft replica: {e}"));
    let dir = std::path::Path::new(kv.data_dir.as_deref().unwrap_or(".")).join("raft");
    let disk = ordo_r2p2::disk::FsDisk::open(&dir)
        .map_err(|why| KvError::Bind { addr: dir.display().to_string(), why: why.to_string() })?;
    let hook = RaftReplication::open(disk, raft).map_err(|e| start_err(e.to_string()))?;
    let status = hook.status();
    let server = Server::bind_replicated(server_config, handler, Box::new(hook));
    let server =
        server.map_err(|why| KvError::Bind { addr: peers[index].to_string(), why: why.to_string() })?;
    let engine = crate::raft::RaftEngine::start(
        peers,
        cluster,
        status,
        events,
        Box::new(move || {
            let _ = f.waker.wake();
        }),
        members,
        me,
        nonce,
        kv.max_entry_bytes,
    )
    .map_err(|e| start_err(e.to_string()))?;
    Ok((shared, Box::new(engine), None, Some(server), None))
}

/// Where a reply goes: a connection (by token and id, so a reused token
/// never receives another connection's reply) and its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiter {
    token: Token,
    conn: u64,
    seq: u64,
}

/// A read waiting for its barrier: who waits, what to answer, the request
/// as sent (to forward it if the barrier fails), and the last write
/// request number taken before it (its barrier waits until that one is
/// proposed).
type WaitingRead = (Waiter, Read, Vec<Vec<u8>>, u64);

struct PendingWrite {
    waiter: Waiter,
    entry: Vec<u8>,
    ticket: Option<u64>,
}

struct Conn {
    stream: TcpStream,
    id: u64,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// Replies in request order; `None` while waiting.
    slots: VecDeque<Option<Reply>>,
    /// Sequence number of `slots[0]`.
    base: u64,
    authed: bool,
    proto: u8,
    readonly: bool,
    forwarded: bool,
    name: Option<Vec<u8>>,
    cursors: ScanCursors,
    /// Close once everything queued is written.
    closing: bool,
    /// The socket may hold more input than was read (buffer bound).
    more_input: bool,
    dead: bool,
    /// Reads of this connection waiting for a read barrier here.
    reads_pending: usize,
    /// A write that arrived behind a pending read: held (and parsing
    /// stopped) until the read is answered, so the read cannot see it.
    held: Option<Vec<Vec<u8>>>,
}

impl Conn {
    fn push(&mut self, reply: Option<Reply>) -> Waiter {
        let seq = self.base + self.slots.len() as u64;
        self.slots.push_back(reply);
        Waiter { token: Token(0), conn: self.id, seq }
    }
}

/// A refusal of a request that certainly did not reach the leader: the
/// client may retry it as it is (`-TRYAGAIN <why>; not applied, retry`).
fn not_applied(why: impl std::fmt::Display) -> Reply {
    Reply::Error(format!("TRYAGAIN {why}; not applied, retry"))
}

/// Whether `stream` is connected to its own address (see `forward_io`).
fn is_self_connected(stream: &TcpStream) -> bool {
    matches!((stream.local_addr(), stream.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

struct ForwardLink {
    stream: TcpStream,
    leader: MemberId,
    /// Some bytes were written to the link (it connected): until then no
    /// request queued on it reached the leader.
    connected: bool,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    /// Who waits for each reply in order (None: the link's own handshake).
    fifo: VecDeque<Option<Waiter>>,
}

struct Front {
    poll: Poll,
    listener: TcpListener,
    conns: HashMap<Token, Conn>,
    next_token: usize,
    next_conn_id: u64,
    shared: Arc<Shared>,
    client: Box<dyn Engine>,
    me: MemberId,
    nonce: u64,
    password: Option<Vec<u8>>,
    kv: ordo_runtime::KvConfig,
    limits: Limits,
    sizes: Sizes,
    next_request: u64,
    writes: HashMap<u64, PendingWrite>,
    tickets: HashMap<u64, u64>,
    /// Writes waiting for room in the member's window, by request number.
    /// Writes taken but not yet proposed, by request number (ordered: a
    /// write refused with back-pressure goes back to its place).
    backlog: std::collections::BTreeSet<u64>,
    in_flight: u32,
    read_batch: Vec<WaitingRead>,
    barriers: HashMap<u64, Vec<WaitingRead>>,
    fwd: Option<ForwardLink>,
    members: Vec<MemberId>,
    backend: String,
    started: std::time::Instant,
    next_status: std::time::Instant,
    /// Scratch list of connection tokens, reused every loop turn.
    tokens: Vec<Token>,
}

/// Answers `read` from the shared state. The state lock is also taken by
/// the agent thread for every delivery, so KEYS — a walk of the whole
/// table — takes it once per 1,024 keys: a big table does not stall the
/// replica's deliveries (and heartbeats), and KEYS, like SCAN, may or may
/// not include keys written or deleted while it runs.
fn answer_locked(state: &Mutex<KvState>, read: &Read, now_ms: u64, cursors: &mut ScanCursors) -> Reply {
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    let Read::Keys { pattern } = read else { return answer(read, &lock(), now_ms, cursors) };
    keys_in_chunks(|after| lock().scan(after, Some(pattern), 1024, now_ms))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unix_ms() -> u64 {
    unix_ns() / 1_000_000
}

impl Front {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut busy = false;
        while !self.shared.stop.load(Ordering::Acquire) {
            // Input left in a buffer or a socket, or a held write now free:
            // go round again at once.
            let timeout = if busy { Duration::ZERO } else { Duration::from_millis(20) };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout))
                && e.kind() != std::io::ErrorKind::Interrupted
            {
                tracing::error!(%e, "poll failed; the front end stops");
                break;
            }
            // One token buffer for the whole loop (no allocation per turn).
            let mut tokens = std::mem::take(&mut self.tokens);
            tokens.clear();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    FORWARD => self.forward_io(),
                    t => tokens.push(t),
                }
            }
            for &t in &tokens {
                self.read_conn(t);
            }
            self.settle();
            // Connections with input left (paused by a bound) or waiting.
            tokens.clear();
            tokens.extend(
                self.conns
                    .iter()
                    .filter(|(_, c)| c.more_input || !c.inbuf.is_empty() || c.held.is_some())
                    .map(|(t, _)| *t),
            );
            for &t in &tokens {
                self.read_conn(t);
            }
            self.tokens = tokens;
            self.issue_reads();
            self.drain_backlog();
            self.check_leader();
            self.flush_all();
            self.publish_status();
            busy = self.conns.values().any(|c| {
                !c.closing
                    && c.slots.len() < self.kv.max_pending
                    && (c.more_input || (c.held.is_some() && c.reads_pending == 0))
            });
        }
        // Closing: every connection is dropped with the loop.
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if self.conns.len() >= self.kv.max_clients {
                        let _ = stream.write_all(b"-ERR max number of clients reached\r\n");
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let token = Token(self.next_token);
                    self.next_token += 1;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
                        .is_err()
                    {
                        continue;
                    }
                    let id = self.next_conn_id;
                    self.next_conn_id += 1;
                    self.shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                    self.shared.counters.clients.fetch_add(1, Ordering::Relaxed);
                    self.conns.insert(
                        token,
                        Conn {
                            stream,
                            id,
                            inbuf: Vec::new(),
                            out: Vec::new(),
                            slots: VecDeque::new(),
                            base: 0,
                            authed: self.password.is_none(),
                            proto: 2,
                            readonly: false,
                            forwarded: false,
                            name: None,
                            cursors: ScanCursors::default(),
                            closing: false,
                            more_input: true,
                            dead: false,
                            reads_pending: 0,
                            held: None,
                        },
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(%e, "accept failed");
                    return;
                }
            }
        }
    }

    /// Reads what the socket has (within the bound) and serves complete
    /// requests while the connection has room for more in flight.
    fn read_conn(&mut self, token: Token) {
        let max_in = self.kv.max_request_bytes;
        let Some(c) = self.conns.get_mut(&token) else { return };
        if c.closing || c.dead {
            return;
        }
        let mut buf = [0u8; 16 * 1024];
        while c.inbuf.len() < max_in {
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    c.dead = true;
                    break;
                }
                Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    c.more_input = false;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.dead = true;
                    break;
                }
            }
        }
        if c.inbuf.len() >= max_in {
            c.more_input = true;
        }
        let mut used = 0;
        loop {
            let Some(c) = self.conns.get_mut(&token) else { return };
            if c.closing || c.slots.len() >= self.kv.max_pending {
                break;
            }
            if c.held.is_some() {
                if c.reads_pending > 0 {
                    break;
                }
                let args = c.held.take().expect("held");
                self.serve(token, args);
                continue;
            }
            match resp::next_request(&c.inbuf[used..], &self.limits) {
                Ok(Some((args, n))) => {
                    used += n;
                    if !args.is_empty() {
                        self.serve(token, args);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.shared.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    c.push(Some(Reply::err(e.to_string())));
                    c.closing = true;
                    used = c.inbuf.len();
                    break;
                }
            }
        }
        if let Some(c) = self.conns.get_mut(&token) {
            c.inbuf.drain(..used);
            if c.dead && c.inbuf.is_empty() {
                self.close(token);
            }
        }
    }

    fn close(&mut self, token: Token) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.shared.counters.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn is_leader(&self) -> bool {
        self.client.leadership().0
    }

    /// One request of connection `token`.
    fn serve(&mut self, token: Token, args: Vec<Vec<u8>>) {
        self.shared.counters.commands.fetch_add(1, Ordering::Relaxed);
        let action = parse(&args, &self.sizes);
        let password = self.password.clone();
        let leader = self.is_leader();
        let local_reads = self.kv.reads == KvReads::Local;
        let Some(c) = self.conns.get_mut(&token) else { return };
        if !c.authed && !matches!(action, Action::Auth { .. } | Action::Hello { .. } | Action::Quit) {
            c.push(Some(Reply::Error("NOAUTH Authentication required.".into())));
            return;
        }
        let waiter = |c: &mut Conn| {
            let mut w = c.push(None);
            w.token = token;
            w
        };
        match action {
            Action::Reply(r) => {
                c.push(Some(r));
            }
            Action::Auth { user, password: given } => {
                let ok = match &password {
                    None => {
                        c.push(Some(Reply::err(
                            "AUTH <password> called without any password configured for the default user",
                        )));
                        return;
                    }
                    Some(p) => user.as_deref().is_none_or(|u| u == b"default") && ct_eq(&given, p),
                };
                if ok {
                    c.authed = true;
                    c.push(Some(Reply::Ok));
                } else {
                    self.shared.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
                    c.push(Some(Reply::Error(
                        "WRONGPASS invalid username-password pair or user is disabled.".into(),
                    )));
                }
            }
            Action::Hello { proto, auth, name } => {
                if let Some((user, given)) = auth {
                    let ok = password.as_ref().is_some_and(|p| user == b"default" && ct_eq(&given, p))
                        || (password.is_none() && user == b"default");
                    if !ok {
                        self.shared.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
                        c.push(Some(Reply::Error(
                            "WRONGPASS invalid username-password pair or user is disabled.".into(),
                        )));
                        return;
                    }
                    c.authed = true;
                }
                if !c.authed {
                    c.push(Some(Reply::Error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into())));
                    return;
                }
                if let Some(p) = proto {
                    c.proto = p;
                }
                if name.is_some() {
                    c.name = name;
                }
                let s = |t: &str| Reply::Bulk(t.as_bytes().to_vec());
                let hello = Reply::Map(vec![
                    (s("server"), s("ordo-kv")),
                    (s("version"), s(env!("CARGO_PKG_VERSION"))),
                    (s("proto"), Reply::Int(i64::from(c.proto))),
                    (s("id"), Reply::Int(c.id as i64)),
                    (s("mode"), s("standalone")),
                    (s("role"), s(if leader { "master" } else { "replica" })),
                    (s("modules"), Reply::Array(Vec::new())),
                ]);
                c.push(Some(hello));
            }
            Action::SetName(n) => {
                c.name = Some(n);
                c.push(Some(Reply::Ok));
            }
            Action::GetName => {
                let r = Reply::opt(c.name.as_deref());
                c.push(Some(r));
            }
            Action::ClientId => {
                let id = c.id as i64;
                c.push(Some(Reply::Int(id)));
            }
            Action::ReadOnly => {
                c.readonly = true;
                c.push(Some(Reply::Ok));
            }
            Action::ReadWrite => {
                c.readonly = false;
                c.push(Some(Reply::Ok));
            }
            Action::Quit => {
                c.push(Some(Reply::Ok));
                c.closing = true;
            }
            Action::Forwarded => {
                c.forwarded = true;
                c.cursors = ScanCursors::with_capacity(ScanCursors::MAX_FORWARDED);
                c.push(Some(Reply::Ok));
            }
            Action::Info => {
                let info = self.info();
                if let Some(c) = self.conns.get_mut(&token) {
                    c.push(Some(Reply::Bulk(info.into_bytes())));
                }
            }
            Action::Read(read) => {
                if c.readonly || local_reads {
                    let r = answer_locked(&self.shared.state, &read, unix_ms(), &mut c.cursors);
                    c.push(Some(r));
                } else if leader {
                    let w = waiter(c);
                    c.reads_pending += 1;
                    let gate = self.next_request - 1;
                    self.read_batch.push((w, read, args, gate));
                } else {
                    let forwarded = c.forwarded;
                    let w = waiter(c);
                    self.forward(w, args, forwarded);
                }
            }
            Action::Write(write) => {
                if c.reads_pending > 0 {
                    c.held = Some(args);
                    return;
                }
                if !leader {
                    let forwarded = c.forwarded;
                    let w = waiter(c);
                    self.forward(w, args, forwarded);
                    return;
                }
                let request = self.next_request;
                self.next_request += 1;
                let entry =
                    Entry { origin: self.me, nonce: self.nonce, request, now_ms: unix_ms(), write }.encode();
                if entry.len() > self.kv.max_entry_bytes {
                    c.push(Some(Reply::err(format!(
                        "command too large: its log entry of {} bytes exceeds kv.max_entry_bytes {}",
                        entry.len(),
                        self.kv.max_entry_bytes
                    ))));
                    return;
                }
                let w = waiter(c);
                self.writes.insert(request, PendingWrite { waiter: w, entry, ticket: None });
                self.backlog.insert(request);
                self.drain_backlog();
            }
        }
    }

    fn info(&self) -> String {
        let status = self.client.status();
        let state = lock(&self.shared);
        let c = &self.shared.counters;
        format!(
            "# Server\r\nordo_version:{}\r\nordo_member:{}\r\nuptime_in_seconds:{}\r\n\r\n# Clients\r\nconnected_clients:{}\r\n\r\n# Replication\r\nrole:{}\r\nordo_leader:{}\r\nordo_engine:{}\r\nordo_epoch:{}\r\nordo_committed:{}\r\nordo_delivered:{}\r\n\r\n# Stats\r\ntotal_commands_processed:{}\r\nordo_writes_proposed:{}\r\nordo_forwarded:{}\r\nordo_read_barriers:{}\r\n\r\n# Persistence\r\nordo_durability:{}\r\nordo_disk_persists:{}\r\nordo_disk_snapshots:{}\r\nordo_disk_stored_entries:{}\r\n\r\n# Keyspace\r\ndb0:keys={},expires={}\r\n",
            env!("CARGO_PKG_VERSION"),
            self.me,
            self.started.elapsed().as_secs(),
            c.clients.load(Ordering::Relaxed),
            if status.is_leader { "master" } else { "slave" },
            status.leader.map_or("none".to_string(), |l| l.to_string()),
            match self.kv.engine {
                KvEngine::Raft => "raft",
                KvEngine::Vsync => "vsync",
                KvEngine::Acuerdo => "acuerdo",
            },
            status.epoch,
            status.committed,
            status.delivered,
            c.commands.load(Ordering::Relaxed),
            c.writes_proposed.load(Ordering::Relaxed),
            c.forwarded.load(Ordering::Relaxed),
            c.read_barriers.load(Ordering::Relaxed),
            if self.kv.durability == KvDurability::Disk { "disk" } else { "memory" },
            c.disk_persists.load(Ordering::Relaxed),
            c.disk_snapshots.load(Ordering::Relaxed),
            c.disk_stored_entries.load(Ordering::Relaxed),
            state.len(unix_ms()),
            state.expiring(),
        )
    }

    /// Fills the slot `w` waits on.
    fn fill(&mut self, w: Waiter, reply: Reply) {
        if let Some(c) = self.conns.get_mut(&w.token)
            && c.id == w.conn
            && w.seq >= c.base
            && let Some(slot) = c.slots.get_mut((w.seq - c.base) as usize)
        {
            debug_assert!(slot.is_none(), "a slot is filled once");
            *slot = Some(reply);
        }
    }

    /// Proposes backlogged writes while the member's window has room. A
    /// member that no longer leads refuses them: they were never proposed,
    /// so they are certainly not applied.
    fn drain_backlog(&mut self) {
        if !self.backlog.is_empty() && !self.is_leader() {
            for request in std::mem::take(&mut self.backlog) {
                if let Some(p) = self.writes.remove(&request) {
                    self.fill(
                        p.waiter,
                        Reply::Error("TRYAGAIN leadership moved; the write was not applied, retry".into()),
                    );
                }
            }
            return;
        }
        while self.in_flight < self.kv.max_outstanding
            && let Some(&request) = self.backlog.first()
        {
            let Some(p) = self.writes.get_mut(&request) else {
                self.backlog.remove(&request);
                continue;
            };
            match self.client.submit(&p.entry) {
                Ok(ticket) => {
                    p.ticket = Some(ticket);
                    self.tickets.insert(ticket, request);
                    self.in_flight += 1;
                    self.backlog.remove(&request);
                    self.shared.counters.writes_proposed.fetch_add(1, Ordering::Relaxed);
                }
                Err(ordo_runtime::acuerdo::SubmitError::Full) => return,
                Err(e) => {
                    self.backlog.remove(&request);
                    let w = p.waiter;
                    self.writes.remove(&request);
                    self.fill(w, Reply::err(format!("write not applied: {e}")));
                }
            }
        }
    }

    /// One barrier for every read of this loop turn. Only once every
    /// write taken before them is proposed: the barrier's index is the
    /// leader's last proposed entry, so a read pipelined after a write on
    /// one connection (or forwarded after it on one link) sees it.
    fn issue_reads(&mut self) {
        if self.read_batch.is_empty() {
            return;
        }
        // Only once every write taken before these reads is proposed.
        let gate = self.read_batch.iter().map(|r| r.3).max().unwrap_or(0);
        if self.backlog.first().is_some_and(|first| *first <= gate) {
            return;
        }
        match self.client.read_barrier() {
            Ok(ticket) => {
                self.shared.counters.read_barriers.fetch_add(1, Ordering::Relaxed);
                let batch = std::mem::take(&mut self.read_batch);
                self.barriers.insert(ticket, batch);
            }
            Err(ordo_runtime::acuerdo::SubmitError::Full) => {}
            Err(e) => {
                for (w, _, _, _) in std::mem::take(&mut self.read_batch) {
                    self.read_done(w);
                    self.fill(w, Reply::err(format!("read not served: {e}")));
                }
            }
        }
    }

    /// Applied results and the member's events.
    fn settle(&mut self) {
        let results = std::mem::take(&mut *self.shared.results.lock().unwrap_or_else(|e| e.into_inner()));
        for (request, reply) in results {
            if let Some(p) = self.writes.remove(&request) {
                if let Some(t) = p.ticket {
                    self.tickets.remove(&t);
                }
                self.fill(p.waiter, reply);
            }
        }
        while let Some(ev) = self.client.poll() {
            match ev {
                EngineEvent::Committed(ticket) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    // Its reply came (or comes) through the results.
                    self.tickets.remove(&ticket);
                }
                EngineEvent::Lost(ticket) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.fail_write(
                        ticket,
                        "TRYAGAIN write lost in a leader change; it was not applied, retry",
                    );
                }
                EngineEvent::Unknown(ticket) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.fail_write(
                        ticket,
                        "TRYAGAIN leadership moved (or the log did not answer); the outcome of this write is unknown",
                    );
                }
                EngineEvent::Retry(ticket) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    if let Some(request) = self.tickets.remove(&ticket) {
                        self.backlog.insert(request);
                    }
                }
                EngineEvent::NotLeader(ticket) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.fail_write(ticket, "TRYAGAIN leadership moved; the write was not applied, retry");
                }
                EngineEvent::Refused(ticket, e) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.fail_write(ticket, &format!("ERR write not applied: {e}"));
                }
                EngineEvent::ReadReady(ticket) => {
                    let batch = self.barriers.remove(&ticket).unwrap_or_default();
                    let now = unix_ms();
                    let mut answers = Vec::with_capacity(batch.len());
                    for (w, read, _, _) in batch {
                        let r = match self.conns.get_mut(&w.token) {
                            Some(c) if c.id == w.conn => {
                                answer_locked(&self.shared.state, &read, now, &mut c.cursors)
                            }
                            _ => continue,
                        };
                        answers.push((w, r));
                    }
                    for (w, r) in answers {
                        self.read_done(w);
                        self.fill(w, r);
                    }
                }
                EngineEvent::ReadFailed(ticket) => {
                    for (w, _, args, _) in self.barriers.remove(&ticket).unwrap_or_default() {
                        self.read_done(w);
                        let came_forwarded =
                            self.conns.get(&w.token).is_some_and(|c| c.id == w.conn && c.forwarded);
                        self.forward(w, args, came_forwarded);
                    }
                }
            }
        }
    }

    /// A read of this front end's barriers is answered (or handed on).
    fn read_done(&mut self, w: Waiter) {
        if let Some(c) = self.conns.get_mut(&w.token)
            && c.id == w.conn
        {
            c.reads_pending = c.reads_pending.saturating_sub(1);
        }
    }

    fn fail_write(&mut self, ticket: u64, why: &str) {
        if let Some(request) = self.tickets.remove(&ticket)
            && let Some(p) = self.writes.remove(&request)
        {
            self.fill(p.waiter, Reply::Error(why.into()));
        }
    }

    /// Sends a request to the leader over the forwarding link (or answers
    /// MOVED / TRYAGAIN).
    fn forward(&mut self, w: Waiter, args: Vec<Vec<u8>>, came_forwarded: bool) {
        if self.is_leader() {
            // Here only when this leader refused a read barrier
            // (too many reads waiting).
            self.fill(w, not_applied("too many reads waiting at the leader"));
            return;
        }
        let leader = self.client.leadership().1.filter(|l| *l != self.me);
        let Some(leader) = leader else {
            self.fill(w, not_applied("no leader (an election is in progress)"));
            return;
        };
        if came_forwarded {
            self.fill(w, not_applied(format!("not the leader (member {leader} leads)")));
            return;
        }
        let Some(addr) = self.kv.replica_addr(leader).map(str::to_string) else {
            self.fill(w, not_applied(format!("the leader (member {leader}) has no kv address")));
            return;
        };
        if self.kv.redirect {
            self.fill(w, Reply::Error(format!("MOVED 0 {addr}")));
            return;
        }
        if self.fwd.as_ref().is_some_and(|f| f.leader != leader) {
            self.drop_forward("the leader changed");
        }
        if self.fwd.is_none() {
            let Ok(sock) = addr.parse::<SocketAddr>() else {
                self.fill(w, Reply::err(format!("bad kv address {addr} for member {leader}")));
                return;
            };
            let mut stream = match TcpStream::connect(sock) {
                Ok(s) => s,
                Err(e) => {
                    self.fill(w, not_applied(format!("cannot reach the leader at {addr}: {e}")));
                    return;
                }
            };
            let _ = stream.set_nodelay(true);
            if self
                .poll
                .registry()
                .register(&mut stream, FORWARD, Interest::READABLE | Interest::WRITABLE)
                .is_err()
            {
                self.fill(w, not_applied("cannot register the forwarding link"));
                return;
            }
            let mut link = ForwardLink {
                stream,
                leader,
                connected: false,
                out: Vec::new(),
                inbuf: Vec::new(),
                fifo: VecDeque::new(),
            };
            if let Some(p) = &self.password {
                resp::encode_request(&[b"AUTH".to_vec(), p.clone()], &mut link.out);
                link.fifo.push_back(None);
            }
            resp::encode_request(&[b"ORDO".to_vec(), b"FORWARDED".to_vec()], &mut link.out);
            link.fifo.push_back(None);
            self.fwd = Some(link);
        }
        let link = self.fwd.as_mut().expect("just made");
        resp::encode_request(&args, &mut link.out);
        link.fifo.push_back(Some(w));
        self.shared.counters.forwarded.fetch_add(1, Ordering::Relaxed);
        self.forward_io();
    }

    fn drop_forward(&mut self, why: &str) {
        if let Some(mut link) = self.fwd.take() {
            let _ = self.poll.registry().deregister(&mut link.stream);
            // A link that never connected (the leader's port refused it)
            // carried no byte: its requests are certainly not applied.
            let reply = if link.connected {
                Reply::Error(format!(
                    "TRYAGAIN {why} before the leader answered; the outcome of this request is unknown"
                ))
            } else {
                not_applied(format!("{why} before the link connected"))
            };
            for w in link.fifo.into_iter().flatten() {
                self.fill(w, reply.clone());
            }
        }
    }

    fn forward_io(&mut self) {
        let Some(link) = self.fwd.as_mut() else { return };
        let mut broken = None;
        if !link.out.is_empty() {
            match link.stream.write(&link.out) {
                // A connect to a closed local port in the ephemeral range
                // can meet itself (TCP simultaneous open): the requests
                // would come back as "replies", and the socket would hold
                // the dead leader's port against its restart. Nothing
                // reached a leader: not applied.
                Ok(_) if !link.connected && is_self_connected(&link.stream) => {
                    broken =
                        Some("the link to the leader connected to itself (its port is closed)".to_string());
                }
                Ok(n) => {
                    link.connected = true;
                    link.out.drain(..n);
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::NotConnected => {}
                Err(e) => broken = Some(format!("the link to the leader failed ({e})")),
            }
        }
        let mut buf = [0u8; 16 * 1024];
        while broken.is_none() {
            match link.stream.read(&mut buf) {
                Ok(0) => broken = Some("the leader closed the link".to_string()),
                Ok(n) => link.inbuf.extend_from_slice(&buf[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::NotConnected =>
                {
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => broken = Some(format!("the link to the leader failed ({e})")),
            }
        }
        let mut answers = Vec::new();
        let mut used = 0;
        loop {
            match resp::next_reply(&link.inbuf[used..]) {
                Ok(Some((reply, n))) => {
                    used += n;
                    match link.fifo.pop_front() {
                        Some(Some(w)) => answers.push((w, reply)),
                        Some(None) => {
                            if let Reply::Error(e) = &reply {
                                broken = Some(format!("the leader refused the forwarding link ({e})"));
                            }
                        }
                        None => broken = Some("the leader sent an unexpected reply".into()),
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    broken = Some(format!("the leader's reply does not parse ({e})"));
                    break;
                }
            }
        }
        link.inbuf.drain(..used);
        for (w, r) in answers {
            self.fill(w, r);
        }
        if let Some(why) = broken {
            self.drop_forward(&why);
        }
    }

    /// Drops the forwarding link when leadership moved (its requests may or
    /// may not have been applied: they are answered as unknown).
    fn check_leader(&mut self) {
        let leader = self.client.leadership().1;
        if let Some(link) = &self.fwd
            && (leader != Some(link.leader) || self.is_leader())
        {
            self.drop_forward("the leader changed");
        }
    }

    /// Writes every connection's filled head slots.
    fn flush_all(&mut self) {
        let mut tokens = std::mem::take(&mut self.tokens);
        tokens.clear();
        tokens.extend(self.conns.keys().copied());
        for &t in &tokens {
            let Some(c) = self.conns.get_mut(&t) else { continue };
            while let Some(Some(_)) = c.slots.front() {
                let r = c.slots.pop_front().flatten().expect("filled");
                c.base += 1;
                resp::encode(&r, c.proto, &mut c.out);
            }
            while !c.out.is_empty() {
                match c.stream.write(&c.out) {
                    Ok(0) => {
                        c.dead = true;
                        break;
                    }
                    Ok(n) => {
                        c.out.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        c.dead = true;
                        break;
                    }
                }
            }
            let done = c.out.is_empty() && c.slots.is_empty();
            if c.dead || (c.closing && done) {
                self.close(t);
            }
        }
        self.tokens = tokens;
    }

    fn publish_status(&mut self) {
        let now = std::time::Instant::now();
        if now < self.next_status {
            return;
        }
        self.next_status = now + Duration::from_millis(20);
        let st = self.client.status();
        let state = lock(&self.shared);
        let (keys, applied) = (state.len(unix_ms()) as u64, state.applied());
        drop(state);
        *self.shared.status.lock().unwrap_or_else(|e| e.into_inner()) = NodeStatus {
            member: self.me,
            state: st.role.clone(),
            view: st.term,
            members: self.members.clone(),
            backend: self.backend.clone(),
            engine: "kv".into(),
            leader: st.leader,
            subgroups: vec![SubgroupStatus {
                subgroup: 0,
                delivered_messages: applied,
                delivered_bytes: keys,
                sent_messages: self.shared.counters.writes_proposed.load(Ordering::Relaxed),
                ..SubgroupStatus::default()
            }],
            view_changes: st.elections,
            uptime_s: self.started.elapsed().as_secs_f64(),
            taken_at_unix_ns: unix_ns(),
            ..NodeStatus::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket bound to a local port and connected to that same port
    /// meets itself (TCP simultaneous open) — what a follower's link to a
    /// dead leader's port can become; a link to a listener is not one.
    #[test]
    fn a_link_that_met_itself_is_told_from_a_real_one() {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket calls on a descriptor this test owns; the
        // address structs are fully initialized; the descriptor is handed
        // to `std::net::TcpStream`, which closes it.
        let own = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as libc::sa_family_t;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            assert_eq!(libc::bind(fd, (&raw const a).cast(), len), 0);
            let mut got_len = len;
            assert_eq!(libc::getsockname(fd, (&raw mut a).cast(), &raw mut got_len), 0);
            assert_eq!(
                libc::connect(fd, (&raw const a).cast(), len),
                0,
                "{}",
                std::io::Error::last_os_error()
            );
            std::net::TcpStream::from_raw_fd(fd)
        };
        let own = TcpStream::from_std(own);
        assert!(is_self_connected(&own));

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let real = TcpStream::from_std(std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        assert!(!is_self_connected(&real));
    }

    /// `kv.failure_timeout_ms` is Raft's election timeout too: 30 ms in
    /// `memory` mode, 1 s in `disk` mode, or what the operator wrote; the
    /// heartbeat stays well inside it, and every set is one Raft accepts.
    #[test]
    fn raft_elections_wait_the_failure_timeout() {
        let mut kv = ordo_runtime::KvConfig::default();
        for (durability, set, ticks) in [
            (KvDurability::Memory, 0, 30),
            (KvDurability::Disk, 0, 1000),
            (KvDurability::Disk, 250, 250),
            (KvDurability::Memory, 3, 3),
        ] {
            kv.durability = durability;
            kv.failure_timeout_ms = set;
            let o = raft_options(&kv, 1, 3);
            assert_eq!(o.tick, Duration::from_millis(1));
            assert_eq!(o.raft.election_ticks, ticks, "{durability:?} {set}");
            assert!(o.raft.heartbeat_ticks < o.raft.election_ticks);
            assert_eq!(o.log.durable, durability == KvDurability::Disk);
            o.raft.validate().expect("a valid Raft configuration");
        }
    }
}
