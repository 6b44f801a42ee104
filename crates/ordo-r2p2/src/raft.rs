//! [`RaftReplication`]: Raft behind `REPLICATED_ROUTE` (r3p2 Ch. 3), with
//! what the thesis left as future work (Ch. 6): a durable, group-committed
//! log, snapshots and compaction, leader routing and duplicate detection.
//!
//! It is a [`Replication`] hook: the server's network thread calls it with
//! client requests, peer messages, ticks and once per loop turn
//! ([`Replication::flush`]), and it answers with actions. Inside is an
//! [`ordo_raft::rsm::Replica`] (Raft node + durable log + client sessions).
//!
//! # Invariants
//! - **Nothing is acknowledged before it is durable.** A turn's new entries,
//!   votes and terms are appended to the log and synced once, in `flush`
//!   (group commit), before the turn's Raft messages leave and before the
//!   leader counts its own copy; a client's answer comes only after its
//!   request committed (a quorum of durable copies) and was applied.
//! - **Same order everywhere.** Committed requests become `Apply` actions in
//!   log order on every replica; the server runs them in that order on one
//!   thread. The leader's answer goes to the client; followers' are dropped
//!   (r3p2 §3.3).
//! - **Exactly once per (client id, request id).** A retry of a request that
//!   was already applied is answered from the session table (kept in the log
//!   and in snapshots) without applying it again.
//! - **Leader routing.** A follower answers a request with a redirect to the
//!   leader it knows (or stays silent when it knows none: the client's
//!   timeout moves it on); every response carries the leader hint, so
//!   clients send straight to the leader in steady state.
//! - **Peer input is untrusted.** A RAFT message that does not decode within
//!   the configured limits, or that claims to come from another member than
//!   the address it came from, is dropped and counted.
//! - **A storage failure stops the replica** (panics the network thread:
//!   crash-stop). Continuing after a failed fsync could acknowledge data that
//!   is not on disk.

use crate::header::ErrorCode;
use crate::replication::{ClientRef, ReplicatedRequest, Replication, ReplicationOutput};
use ordo_raft::rsm::{Output, Replica, ReplicaConfig, ReplicaError, SyncMode};
use ordo_raft::storage::{Disk, LogOptions};
use ordo_raft::{Config, DecodeLimits, Index, Membership, MembershipChange, NodeId, Role, decode, encode};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How a replica runs.
#[derive(Clone, Debug)]
pub struct RaftOptions {
    /// This replica's index in `ServerConfig::peers` (its Raft id is
    /// `me + 1`).
    pub me: usize,
    /// Number of replicas in a new cluster (ids `1..=members`); ignored when
    /// the disk holds state.
    pub members: usize,
    /// The length of one Raft tick.
    pub tick: Duration,
    /// Raft's own configuration (its `id` is set from `me`).
    pub raft: Config,
    /// The durable log's options (`durable: false`: written, never
    /// fsynced).
    pub log: LogOptions,
    /// Keep the log only in memory: nothing is written to the disk after
    /// open (`SyncMode::Volatile`). For a disk that dies with the process
    /// (`ordo r3p2 serve` without a data directory).
    pub memory_only: bool,
    /// Snapshot and compact after this many applied entries (0: never).
    pub snapshot_interval: u64,
    /// And only once the entries since the last snapshot hold as many
    /// bytes as it did ([`ordo_raft::rsm::ReplicaConfig::snapshot_by_size`];
    /// on by default).
    pub snapshot_by_size: bool,
    /// Most client sessions kept for duplicate detection.
    pub max_sessions: usize,
    /// Applied request ids remembered per client (how far out of order an
    /// open-loop client's requests may be applied or retried).
    pub session_window: usize,
    /// Largest snapshot accepted from a peer.
    pub max_snapshot_bytes: u64,
}

impl RaftOptions {
    /// Defaults for replica `me` of `members`: 1 ms ticks, elections after
    /// 10-20 ms of silence, heartbeats every 2 ms, durable log, a snapshot
    /// every 10,000 entries, and a moved commit index not announced on its
    /// own (`raft.announce_commit` off): it rides on the next append or
    /// heartbeat, so followers apply (and serve LB_ROUTE reads) a heartbeat
    /// (2 ms, more if it is lost) behind the leader, and a request at light
    /// load costs one append and one answer per follower instead of two of
    /// each — on a host whose replicas share cores, the announcements and
    /// their answers ran just when the leader's reply was on its way to the
    /// client.
    pub fn new(me: usize, members: usize) -> RaftOptions {
        let mut raft = Config::new(me as NodeId + 1, 0x5eed_0000 + me as u64);
        raft.election_ticks = 10;
        raft.heartbeat_ticks = 2;
        raft.announce_commit = false;
        RaftOptions {
            me,
            members,
            tick: Duration::from_millis(1),
            raft,
            log: LogOptions::default(),
            memory_only: false,
            snapshot_interval: 10_000,
            snapshot_by_size: true,
            max_sessions: 100_000,
            session_window: 1024,
            max_snapshot_bytes: 256 << 20,
        }
    }
}

/// What a replica looks like from outside (updated after every call; read
/// by monitors, tests and the CLI from any thread).
#[derive(Debug, Default)]
pub struct RaftStatus {
    term: AtomicU64,
    /// 0 follower, 1 pre-candidate, 2 candidate, 3 leader.
    role: AtomicU64,
    /// Leader's replica index + 1, 0 when unknown.
    leader: AtomicU64,
    commit: AtomicU64,
    applied: AtomicU64,
    snapshots: AtomicU64,
    syncs: AtomicU64,
    duplicates: AtomicU64,
    answers_forgotten: AtomicU64,
    dropped_peer_messages: AtomicU64,
}

impl RaftStatus {
    /// The current term.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Relaxed)
    }
    /// Whether this replica is the leader.
    pub fn is_leader(&self) -> bool {
        self.role.load(Ordering::Relaxed) == 3
    }
    /// The leader's replica index, if known.
    pub fn leader(&self) -> Option<usize> {
        self.leader.load(Ordering::Relaxed).checked_sub(1).map(|i| i as usize)
    }
    /// The highest index known committed.
    pub fn commit(&self) -> u64 {
        self.commit.load(Ordering::Relaxed)
    }
    /// Commands applied (answered by the handler) on this replica.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }
    /// Snapshots taken or installed.
    pub fn snapshots(&self) -> u64 {
        self.snapshots.load(Ordering::Relaxed)
    }
    /// Log syncs (fsync batches) performed.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
    /// Retried requests answered without applying them again.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
    /// Answers dropped from the session table because their clients said
    /// they had them (the answered span of R2P2 requests).
    pub fn answers_forgotten(&self) -> u64 {
        self.answers_forgotten.load(Ordering::Relaxed)
    }
    /// Peer messages dropped (malformed or from the wrong member).
    pub fn dropped_peer_messages(&self) -> u64 {
        self.dropped_peer_messages.load(Ordering::Relaxed)
    }
}

/// Raft as the server's replication hook.
pub struct RaftReplication<D: Disk> {
    replica: Replica<D, ClientRef>,
    me: usize,
    limits: DecodeLimits,
    tick_ns: u64,
    next_tick_ns: Option<u64>,
    /// Applies handed to the server whose answers have not come back yet.
    applying: VecDeque<(Index, u64, u64)>,
    /// The indexes of the snapshots asked of the handler and not answered
    /// yet, oldest first (the handler answers them in order). More than one
    /// only when a restore dropped the replica's pending snapshot while the
    /// handler was still serializing it: that answer is stale.
    snapshotting: VecDeque<Index>,
    /// Bytes of the last peer message encoded (the next one's first guess).
    encoded_len: usize,
    status: Arc<RaftStatus>,
}

/// The placeholder address of an apply on a follower (never answered).
const NOWHERE: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

impl<D: Disk> RaftReplication<D> {
    /// Opens replica `options.me` on `disk`, recovering its durable state.
    pub fn open(disk: D, options: RaftOptions) -> Result<RaftReplication<D>, ReplicaError> {
        let mut raft = options.raft.clone();
        raft.id = options.me as NodeId + 1;
        let limits = DecodeLimits::for_config(&raft, options.max_snapshot_bytes, 64.max(options.members * 2));
        let cfg = ReplicaConfig {
            raft,
            store: options.log,
            sync: if options.memory_only { SyncMode::Volatile } else { SyncMode::Immediate },
            snapshot_interval: options.snapshot_interval,
            snapshot_by_size: options.snapshot_by_size,
            max_sessions: options.max_sessions,
            session_window: options.session_window,
            initial_membership: Membership::with_voters(1..=options.members as NodeId),
        };
        let replica = Replica::open(disk, cfg)?;
        let hook = RaftReplication {
            replica,
            me: options.me,
            limits,
            tick_ns: options.tick.as_nanos().max(1) as u64,
            next_tick_ns: None,
            applying: VecDeque::new(),
            snapshotting: VecDeque::new(),
            encoded_len: 0,
            status: Arc::new(RaftStatus::default()),
        };
        hook.publish_status();
        Ok(hook)
    }

    /// A handle on this replica's status, readable from any thread.
    pub fn status(&self) -> Arc<RaftStatus> {
        self.status.clone()
    }

    /// The replica inside (role, log, counters).
    pub fn replica(&self) -> &Replica<D, ClientRef> {
        &self.replica
    }

    fn check(&self, result: Result<(), ReplicaError>) {
        if let Err(e) = result {
            // Crash-stop: never go on after a failed write or sync.
            panic!("raft replica {} stops: {e}", self.me);
        }
    }

    /// Turns the replica's outputs into server actions.
    fn drain(&mut self, out: &mut ReplicationOutput) {
        while let Some(o) = self.replica.next_output() {
            match o {
                Output::Send(msg) => {
                    let Some(peer) = (msg.to() as usize).checked_sub(1) else { continue };
                    // Encoded in place (a copy of a scratch buffer before),
                    // sized by the last message.
                    let mut bytes = Vec::with_capacity(self.encoded_len);
                    encode(&msg, &mut bytes);
                    self.encoded_len = bytes.len();
                    out.send_to_peer(peer, bytes);
                }
                Output::Apply(a) => {
                    let respond = a.reply_to.is_some();
                    let client = a.reply_to.unwrap_or(ClientRef {
                        addr: NOWHERE,
                        client_id: a.client,
                        request_id: a.request as u32,
                    });
                    self.applying.push_back((a.index, a.client, a.request));
                    out.apply(client, a.payload, respond);
                }
                Output::Reply { to, response, .. } => out.respond(to, response),
                Output::Expired { to, .. } => out.refuse(
                    to,
                    ErrorCode::SessionExpired,
                    "the session no longer holds this request: take a new client id",
                ),
                Output::Redirect { to, leader, .. } => {
                    // No known leader: stay silent, the client's timeout
                    // moves it to the next replica.
                    if let Some(leader) = leader.and_then(|id| (id as usize).checked_sub(1))
                        && leader != self.me
                    {
                        out.redirect(to, leader as u16);
                    }
                }
                Output::TakeSnapshot { index } => {
                    self.snapshotting.push_back(index);
                    out.snapshot();
                }
                Output::Restore { data, .. } => out.restore(data),
                Output::NeedSync => {
                    // Immediate mode syncs inside flush; nothing to do.
                }
            }
        }
        self.publish_status();
    }

    fn publish_status(&self) {
        let node = self.replica.node();
        let s = &self.status;
        s.term.store(node.term(), Ordering::Relaxed);
        let role = match node.role() {
            Role::Follower => 0,
            Role::PreCandidate => 1,
            Role::Candidate => 2,
            Role::Leader => 3,
        };
        s.role.store(role, Ordering::Relaxed);
        s.leader.store(node.leader().unwrap_or(0), Ordering::Relaxed);
        s.commit.store(node.commit_index(), Ordering::Relaxed);
        let stats = self.replica.stats();
        s.applied.store(stats.applied, Ordering::Relaxed);
        s.snapshots.store(stats.snapshots_taken + stats.snapshots_installed, Ordering::Relaxed);
        s.syncs.store(stats.syncs, Ordering::Relaxed);
        s.duplicates.store(stats.duplicates, Ordering::Relaxed);
        s.answers_forgotten.store(stats.answers_forgotten, Ordering::Relaxed);
    }
}

impl<D: Disk + Send + 'static> Replication for RaftReplication<D> {
    fn on_request(&mut self, request: ReplicatedRequest, _now_ns: u64, out: &mut ReplicationOutput) {
        let client = request.client;
        // A floor above the request (across the client's id wrap) says
        // nothing: `request_answered` takes it as 0.
        let result = self.replica.request_answered(
            client,
            client.client_id,
            u64::from(client.request_id),
            u64::from(request.answered_below),
            &request.payload,
        );
        self.check(result);
        self.drain(out);
    }

    fn on_peer_message(&mut self, from: usize, message: &[u8], _now_ns: u64, out: &mut ReplicationOutput) {
        match decode(message, &self.limits) {
            Ok(msg) if msg.from() == from as NodeId + 1 => {
                let result = self.replica.step(msg);
                self.check(result);
            }
            _ => {
                self.status.dropped_peer_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.drain(out);
    }

    fn tick(&mut self, now_ns: u64, out: &mut ReplicationOutput) {
        let next = *self.next_tick_ns.get_or_insert(now_ns);
        if now_ns < next {
            return;
        }
        // Catch up at most a few ticks after a stall (a long pause must not
        // turn into a burst of elections).
        let due = ((now_ns - next) / self.tick_ns + 1).min(4);
        for _ in 0..due {
            let result = self.replica.tick();
            self.check(result);
        }
        self.next_tick_ns = Some(now_ns.max(next) + self.tick_ns);
        self.drain(out);
    }

    fn flush(&mut self, _now_ns: u64, out: &mut ReplicationOutput) {
        let result = self.replica.flush();
        self.check(result);
        self.drain(out);
    }

    fn on_response(
        &mut self,
        client: ClientRef,
        response: Vec<u8>,
        _sent: bool,
        out: &mut ReplicationOutput,
    ) {
        let Some((index, client_id, request)) = self.applying.pop_front() else { return };
        debug_assert_eq!((client_id, request as u32), (client.client_id, client.request_id));
        self.replica.applied(index, client_id, request, response);
        self.drain(out);
    }

    fn on_snapshot(&mut self, state: Option<Vec<u8>>, out: &mut ReplicationOutput) {
        let Some(index) = self.snapshotting.pop_front() else { return };
        if let Some(state) = state {
            match self.replica.snapshot_ready(index, state) {
                // A snapshot installed from the leader replaced the state
                // this one was taken of (and dropped the replica's request):
                // stale, not an error.
                Err(ReplicaError::UnexpectedSnapshot { .. }) => {}
                result => self.check(result),
            }
        }
        // `None`: the handler keeps no snapshot-able state; the replica keeps
        // its request pending and so takes no further snapshots.
        self.drain(out);
    }

    fn on_admin(&mut self, request: ReplicatedRequest, _now_ns: u64, out: &mut ReplicationOutput) {
        let client = request.client;
        let text = String::from_utf8_lossy(&request.payload).into_owned();
        let mut words = text.split_whitespace();
        let (verb, arg) = (words.next().unwrap_or(""), words.next());
        if verb == "status" {
            let node = self.replica.node();
            let m = node.membership();
            let status = format!(
                "id {} role {:?} term {} leader {:?} commit {} last {} voters {:?} learners {:?}",
                node.id(),
                node.role(),
                node.term(),
                node.leader(),
                node.commit_index(),
                node.last_index(),
                m.voters,
                m.learners
            );
            out.respond(client, status.into_bytes());
            return;
        }
        let id: Option<NodeId> = arg.and_then(|a| a.parse().ok()).filter(|id| *id > 0);
        let change = match (verb, id) {
            ("add-learner", Some(id)) => MembershipChange::AddLearner(id),
            ("promote", Some(id)) => MembershipChange::PromoteLearner(id),
            ("remove", Some(id)) => MembershipChange::RemoveServer(id),
            _ => {
                let usage = "usage: status | add-learner <id> | promote <id> | remove <id> (ids from 1)";
                out.refuse(client, ErrorCode::Rejected, format!("bad admin command `{text}`: {usage}"));
                return;
            }
        };
        if !self.replica.node().is_leader() {
            match self.replica.node().leader().and_then(|l| (l as usize).checked_sub(1)) {
                Some(leader) if leader != self.me => out.redirect(client, leader as u16),
                _ => {} // no leader known: the client's timeout moves it on
            }
            return;
        }
        match self.replica.change_membership(client, change) {
            Ok(_) => {}
            Err(e) => out.refuse(client, ErrorCode::Rejected, e.to_string()),
        }
        self.drain(out);
    }

    fn leader_hint(&self) -> Option<u16> {
        self.replica.node().leader().and_then(|id| (id as usize).checked_sub(1)).map(|i| i as u16)
    }
}
