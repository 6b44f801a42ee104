//! One R3P2 server as a deployable unit: an R2P2 [`Server`] running a
//! service, replicated by [`RaftReplication`] over a durable log in a
//! directory (or unreplicated, for comparison). `ordo r3p2 serve` and the
//! benchmark start servers through [`start_node`].
//!
//! # Invariants
//! - A replicated node binds exactly `peers[id]`: peers recognize each
//!   other's RAFT messages by source address.
//! - With a data directory and `durable`, a write is acknowledged only after
//!   a quorum fsynced it; a node restarted on the same directory recovers
//!   its log, vote and snapshot (see [`crate::raft`]).

use crate::core::{InlineExecutor, ServerCore};
use crate::disk::FsDisk;
use crate::kv::KvService;
use crate::raft::{RaftOptions, RaftReplication, RaftStatus};
use crate::replication::Replication;
use crate::server::{Handler, HandlerMode, Responder, ResponseHandle, SOCKET_IDLE, Server, ServerConfig};
use ordo_agent::IdleStrategy;
use ordo_raft::storage::{Disk, MemDisk};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The application a node serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// The replicated key-value store ([`KvService`]).
    Kv,
    /// A synthetic handler that computes for `micros` µs and answers 8
    /// bytes (r3p2 Ch. 5's 1 µs and 10 µs workloads).
    Spin {
        /// Busy time per request.
        micros: u64,
    },
}

impl std::str::FromStr for ServiceKind {
    type Err = String;

    /// `kv` or `spin:<micros>`.
    fn from_str(s: &str) -> Result<ServiceKind, String> {
        if s == "kv" {
            return Ok(ServiceKind::Kv);
        }
        if let Some(us) = s.strip_prefix("spin:") {
            let micros = us.parse().map_err(|_| format!("bad spin time `{us}` (µs)"))?;
            return Ok(ServiceKind::Spin { micros });
        }
        Err(format!("unknown service `{s}` (expected `kv` or `spin:<micros>`)"))
    }
}

/// The synthetic service: spins, then answers the first 8 bytes of the
/// request (or zeros). Deterministic, with no state (its snapshot is empty).
#[derive(Debug)]
pub struct SpinService {
    work: Duration,
}

impl SpinService {
    /// A service that spends `micros` µs per request.
    pub fn new(micros: u64) -> SpinService {
        SpinService { work: Duration::from_micros(micros) }
    }
}

impl Handler for SpinService {
    fn on_request(&self, request: &[u8], handle: ResponseHandle, responder: &mut Responder<'_>) {
        let start = Instant::now();
        while start.elapsed() < self.work {
            std::hint::spin_loop();
        }
        let mut answer = [0u8; 8];
        let n = request.len().min(8);
        answer[..n].copy_from_slice(&request[..n]);
        responder.send_response(handle, answer.to_vec());
    }

    fn snapshot(&self) -> Option<Vec<u8>> {
        Some(Vec::new())
    }

    fn restore(&self, _state: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

/// How to run a node.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// This node's index in `peers`.
    pub id: usize,
    /// Every replica's address, the same list on every node (a single
    /// address for an unreplicated server).
    pub peers: Vec<SocketAddr>,
    /// Where the durable log lives; `None`: in memory (lost with the
    /// process).
    pub data_dir: Option<PathBuf>,
    /// fsync before acknowledging (false: the in-memory mode switch, no
    /// fsync even with a directory).
    pub durable: bool,
    /// Run Raft behind REPLICATED_ROUTE (false: requests are only served
    /// with FIXED/LB_ROUTE, the baseline of r3p2 Fig. 5.1).
    pub replicated: bool,
    /// Where handlers run.
    pub mode: HandlerMode,
    /// The application.
    pub service: ServiceKind,
    /// Snapshot and compact after this many entries (0: never), and once
    /// the log since the last snapshot is as large as it
    /// ([`crate::RaftOptions::snapshot_by_size`], on).
    pub snapshot_interval: u64,
    /// Idle strategy of the network thread and workers.
    pub idle: IdleStrategy,
    /// The voters of a brand-new cluster: the first this-many peers (`None`:
    /// all). Later peers start outside the membership, as spares that
    /// `add-learner` / `promote` admin commands bring in.
    pub initial_voters: Option<usize>,
    /// Secrets: the cluster secret seals RAFT datagrams, the admin secret
    /// admin commands, the client secret requests ([`crate::auth`]). The
    /// default has none: replica traffic is trusted by address and admin
    /// commands are refused.
    pub auth: crate::auth::AuthConfig,
    /// `SO_BUSY_POLL` on the server socket, µs ([`ServerConfig::busy_poll_us`]).
    pub busy_poll_us: Option<u32>,
    /// Pin the network thread to this CPU ([`ServerConfig::pin_cpu`]).
    pub pin_cpu: Option<usize>,
    /// Batched socket system calls ([`ServerConfig::syscall_batching`]).
    pub syscall_batching: bool,
    /// Announce a moved commit index to followers at once
    /// (`ordo_raft::Config::announce_commit`; off by default, see
    /// [`RaftOptions::new`]).
    pub announce_commit: bool,
}

impl NodeOptions {
    /// A replicated KV node `id` of `peers`, durable in `data_dir`.
    pub fn new(id: usize, peers: Vec<SocketAddr>, data_dir: Option<PathBuf>) -> NodeOptions {
        NodeOptions {
            id,
            peers,
            data_dir,
            durable: true,
            replicated: true,
            mode: HandlerMode::Workers(1),
            service: ServiceKind::Kv,
            snapshot_interval: 10_000,
            idle: SOCKET_IDLE,
            initial_voters: None,
            auth: crate::auth::AuthConfig::default(),
            busy_poll_us: None,
            pin_cpu: None,
            syscall_batching: true,
            announce_commit: false,
        }
    }
}

/// A replica's idle strategy where the replicas' threads on its host
/// outnumber the CPUs: [`IdleStrategy::HAND_OFF`] without its spins (yield
/// at the first idle turn, 100 times, then park). With three replicas and
/// a client on two cores, a replica spinning after its answer holds the
/// core the leader needs for the next step: parked light-load p50 went
/// from ~210 µs (the default's 200 spins) to ~75 µs (10 spins) and ~71 µs
/// (none); never parking, 36 → 30 µs from 10 spins to none (BENCHMARKS.md,
/// twelfth session). Fewer yields than [`SOCKET_IDLE`]'s 250: an idle
/// replica that yields is still runnable, and takes turns on the shared
/// cores from the one that works (250 yields gained light-load latency,
/// 85 → 60-64 µs p50, but under a datagram flood the working replica fell
/// behind its socket; BENCHMARKS.md, fifteenth session).
pub const CROWDED_IDLE: IdleStrategy = match IdleStrategy::HAND_OFF {
    IdleStrategy::BackoffPark { yields, park_min, park_max, .. } => {
        IdleStrategy::BackoffPark { spins: 0, yields, park_min, park_max }
    }
    other => other,
};

impl NodeOptions {
    /// The polling threads this node and the other replicas on its host run:
    /// a network thread and the workers per replica, counting as on this
    /// host every peer whose address has this node's IP (or is loopback,
    /// when this node's is). Unreplicated: this node's own.
    pub fn threads_on_host(&self) -> usize {
        let per_replica = 1 + match self.mode {
            HandlerMode::NetworkThread => 0,
            HandlerMode::Workers(n) => n,
        };
        let Some(me) = self.peers.get(self.id) else { return per_replica };
        if !self.replicated {
            return per_replica;
        }
        let here = |p: &SocketAddr| p.ip() == me.ip() || (p.ip().is_loopback() && me.ip().is_loopback());
        per_replica * self.peers.iter().filter(|p| here(p)).count().max(1)
    }

    /// The idle strategy for this host: [`CROWDED_IDLE`] where the
    /// replicas' threads on it ([`Self::threads_on_host`]) outnumber its
    /// CPUs, else [`SOCKET_IDLE`].
    pub fn idle_for_host(&self) -> IdleStrategy {
        if IdleStrategy::crowded(self.threads_on_host()) { CROWDED_IDLE } else { SOCKET_IDLE }
    }
}

/// A started node.
pub struct RunningNode {
    server: Server,
    status: Option<Arc<RaftStatus>>,
}

impl RunningNode {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }
    /// Raft status (replicated nodes).
    pub fn status(&self) -> Option<&Arc<RaftStatus>> {
        self.status.as_ref()
    }
    /// The server (counters).
    pub fn server(&self) -> &Server {
        &self.server
    }
    /// Stops the node.
    pub fn shutdown(self) {
        self.server.shutdown();
    }
}

/// Starts a node: binds `peers[id]`, opens (or creates) its log and starts
/// the server's threads.
pub fn start_node(opts: &NodeOptions) -> io::Result<RunningNode> {
    let config = opts.server_config()?;
    if opts.replicated && opts.peers.len() > 1 && opts.auth.cluster.is_none() {
        tracing::warn!(
            id = opts.id,
            "R3P2 replica without a cluster secret: anyone who can send it UDP datagrams from a replica's address can change its log"
        );
    }
    let (hook, status) = opts.replication()?.map(|r| (r.hook, r.status)).unzip();
    let server = Server::start(config, opts.handler(), hook)?;
    Ok(RunningNode { server, status })
}

impl NodeOptions {
    /// The server configuration [`start_node`] binds with.
    pub fn server_config(&self) -> io::Result<ServerConfig> {
        let Some(&bind) = self.peers.get(self.id) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("id {} is not an index into {} peers", self.id, self.peers.len()),
            ));
        };
        Ok(ServerConfig {
            bind,
            handler_mode: self.mode,
            idle: self.idle,
            worker_idle: self.idle,
            peers: if self.replicated { self.peers.clone() } else { Vec::new() },
            node_id: self.id as u64,
            auth: self.auth.clone(),
            busy_poll_us: self.busy_poll_us,
            pin_cpu: self.pin_cpu,
            syscall_batching: self.syscall_batching,
            ..ServerConfig::default()
        })
    }

    /// The application [`start_node`] serves.
    pub fn handler(&self) -> Arc<dyn Handler> {
        match self.service {
            ServiceKind::Kv => Arc::new(KvService::new()),
            ServiceKind::Spin { micros } => Arc::new(SpinService::new(micros)),
        }
    }

    /// The replication hook [`start_node`] runs, with its status (`None`
    /// unreplicated): Raft over the log in `data_dir` (opened or created,
    /// its state recovered), or in memory.
    pub fn replication(&self) -> io::Result<Option<NodeReplication>> {
        if !self.replicated {
            return Ok(None);
        }
        let voters = self.initial_voters.unwrap_or(self.peers.len()).min(self.peers.len());
        let mut raft = RaftOptions::new(self.id, voters);
        raft.log.durable = self.durable;
        raft.snapshot_interval = self.snapshot_interval;
        raft.raft.announce_commit = self.announce_commit;
        let other = |e: ordo_raft::rsm::ReplicaError| io::Error::other(e.to_string());
        fn boxed<D: Disk + Send + 'static>(hook: RaftReplication<D>) -> NodeReplication {
            NodeReplication { status: hook.status(), hook: Box::new(hook) }
        }
        Ok(Some(match &self.data_dir {
            Some(dir) => boxed(RaftReplication::open(FsDisk::open(dir)?, raft).map_err(other)?),
            None => {
                // The disk would die with the process: write nothing to it.
                raft.log.durable = false;
                raft.memory_only = true;
                boxed(RaftReplication::open(MemDisk::new(), raft).map_err(other)?)
            }
        }))
    }

    /// What this node's network thread runs, without its socket and
    /// threads: the sans-I/O [`ServerCore`] with the node's hook, and its
    /// handlers inline ([`InlineExecutor`], whatever `mode` says). For
    /// driving nodes in memory on one thread: the `leadercost` figure of
    /// `ordo bench r3p2` measures the network thread's work this way.
    pub fn core(&self) -> io::Result<NodeCore> {
        let config = self.server_config()?;
        let (hook, status) = self.replication()?.map(|r| (r.hook, r.status)).unzip();
        let core = ServerCore::new(config.core(), hook);
        let exec = InlineExecutor::new(self.handler(), &core);
        Ok(NodeCore { core, exec, status })
    }
}

/// A node's replication hook and its status ([`NodeOptions::replication`]).
pub struct NodeReplication {
    /// Raft behind REPLICATED_ROUTE.
    pub hook: Box<dyn Replication>,
    /// Its status, readable from any thread.
    pub status: Arc<RaftStatus>,
}

/// A node's logic without I/O ([`NodeOptions::core`]).
pub struct NodeCore {
    /// The server's sans-I/O core, with the node's replication hook.
    pub core: ServerCore,
    /// The node's handler, run inline.
    pub exec: InlineExecutor,
    /// Raft status (replicated nodes).
    pub status: Option<Arc<RaftStatus>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn threads_on_host_count_the_replicas_that_share_its_address() {
        let local = addrs(&["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.2:7002"]);
        let mut opts = NodeOptions::new(1, local.clone(), None);
        opts.mode = HandlerMode::NetworkThread;
        assert_eq!(opts.threads_on_host(), 3, "loopback peers all live here");
        opts.mode = HandlerMode::Workers(2);
        assert_eq!(opts.threads_on_host(), 9, "a network thread and two workers each");
        let spread = addrs(&["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.1:7001"]);
        let mut opts = NodeOptions::new(0, spread.clone(), None);
        opts.mode = HandlerMode::NetworkThread;
        assert_eq!(opts.threads_on_host(), 2, "two replicas on 10.0.0.1");
        let opts = NodeOptions { mode: HandlerMode::NetworkThread, ..NodeOptions::new(1, spread, None) };
        assert_eq!(opts.threads_on_host(), 1, "alone on 10.0.0.2");
        let mut opts = NodeOptions::new(0, local, None);
        opts.replicated = false;
        assert_eq!(opts.threads_on_host(), 2, "unreplicated: its own network thread and worker");
    }

    #[test]
    fn idle_for_host_hands_the_core_off_only_when_threads_outnumber_cpus() {
        let cpus = ordo_agent::online_cpus();
        let peers: Vec<SocketAddr> =
            (0..cpus as u16 + 1).map(|i| SocketAddr::from(([127, 0, 0, 1], 7000 + i))).collect();
        let crowded = NodeOptions { mode: HandlerMode::NetworkThread, ..NodeOptions::new(0, peers, None) };
        assert_eq!(crowded.threads_on_host(), cpus + 1);
        assert_eq!(crowded.idle_for_host(), CROWDED_IDLE);
        assert!(matches!(CROWDED_IDLE, IdleStrategy::BackoffPark { spins: 0, yields: 100, .. }));
        let alone = NodeOptions {
            mode: HandlerMode::NetworkThread,
            ..NodeOptions::new(0, addrs(&["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"]), None)
        };
        assert_eq!(alone.threads_on_host(), 1);
        assert_eq!(alone.idle_for_host(), SOCKET_IDLE, "one thread never outnumbers the CPUs");
        assert!(
            matches!(SOCKET_IDLE, IdleStrategy::BackoffPark { spins: 0, yields: 250, .. }),
            "a server never spins against the thread its answer woke"
        );
    }
}
