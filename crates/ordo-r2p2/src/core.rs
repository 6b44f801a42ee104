//! The sans-I/O server core: decode → reassemble → route → replication-hook
//! actions → encode, with the counters. No socket, thread, queue or clock.
//!
//! The UDP [`Server`](crate::Server)'s network thread and the seeded R3P2
//! simulation (`ordo-simulation`'s `r3p2` workload) both drive this one
//! type: a datagram goes in through [`ServerCore::on_datagram`], time through
//! [`ServerCore::on_timers`], and [`ServerCore::end_turn`] sends what the
//! turn produced. The caller supplies two things:
//! - a [`Transport`] that sends one datagram (a UDP socket, a simulated one);
//! - an [`Executor`] that runs handler [`Job`]s — inline
//!   ([`InlineExecutor`], `HandlerMode::NetworkThread`, the simulation) or
//!   on worker threads (the server's pool) — and hands back their answers.
//!
//! # Invariants
//! - FIXED_ROUTE and LB_ROUTE requests are executed locally, at least once
//!   per arrival (no reply cache); a request that the executor refuses
//!   (every queue full) is dropped and counted — the client's retry is the
//!   back-pressure.
//! - REPLICATED_ROUTE requests never execute without replication: with no
//!   hook they are answered with ERROR [`ErrorCode::NotReplicated`]. With a
//!   hook, committed requests (and the hook's snapshots and restores) reach
//!   the executor's *ordered lane* in commit order; a job the lane refuses
//!   waits in a backlog, and nothing behind it overtakes it.
//! - A handler's answer to a replicated request is sent or, on a follower,
//!   dropped and counted, and then handed to the hook
//!   ([`Replication::on_response`], which keeps the bytes without a copy);
//!   the hook sees answers in the order it applied.
//! - RAFT messages are accepted only from an address in `peers` and, with
//!   a cluster secret, only with a valid MAC from another replica's id;
//!   admin commands only with the admin secret's MAC; requests with the
//!   client secret's MAC where that is required ([`crate::auth`]). Every
//!   datagram is checked before reassembly, and RAFT and client traffic are
//!   reassembled apart, so no client can push out a replica's partial
//!   message.
//! - Every datagram or message discarded increments one named counter of
//!   [`Stats`]; bad input never panics the core.
//! - Every answer carries the leader hint (the hook's, unless the answer
//!   names its own), so clients reach the leader in one hop.

use crate::Handler;
use crate::auth::{AuthConfig, Refusal, ServerAuth};
use crate::handler::{Job, JobKind, NO_CLIENT, Outgoing, RemoteResponder, Responder, ResponseHandle, Sink};
use crate::header::{self, ErrorCode, FLAG_AUTH, FLAG_LEADER_HINT, Header, MessageType, Policy};
use crate::reassembly::{self, Message, Reassembler, ReassemblyConfig};
use crate::replication::{ClientRef, ReplicatedRequest, Replication, ReplicationAction, ReplicationOutput};
use crate::stats::{Counters, Stats};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What the core needs to know of the server's configuration.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// Replica addresses, indexed by replica id (this server included);
    /// empty without replication.
    pub peers: Vec<SocketAddr>,
    /// This replica's id, sent as `client_id` on RAFT messages.
    pub node_id: u64,
    /// Payload bytes per datagram when sending (a sealed datagram carries
    /// [`ordo_auth::TRAILER_LEN`] fewer, so no datagram grows past
    /// `HEADER_SIZE + mtu_payload`).
    pub mtu_payload: usize,
    /// Bounds for incoming messages (also bounds outgoing packet counts).
    pub reassembly: ReassemblyConfig,
    /// Period of [`Replication::tick`] and of reassembly expiry.
    pub tick_interval: Duration,
    /// Secrets and what must be authenticated ([`crate::auth`]).
    pub auth: AuthConfig,
    /// The wall clock (ns since the Unix epoch) that MAC counters follow;
    /// `None` uses the `now_ns` the caller passes (the simulation's time).
    pub wall_clock: Option<fn() -> u64>,
}

/// How an outgoing message is sealed (when its header carries `FLAG_AUTH`).
#[derive(Clone, Copy)]
enum Seal {
    /// A RAFT message to this replica.
    Raft(u64),
    /// An answer to this client.
    Answer(u64),
}

/// Answers a [`RemoteResponder`] queue holds by default.
pub const DEFAULT_REMOTE_QUEUE_DEPTH: usize = 4096;

/// Sends one datagram (a UDP socket, a simulated socket).
pub trait Transport {
    /// Sends `datagram` to `to`; an error drops it (UDP senders may drop).
    fn send_datagram(&mut self, to: SocketAddr, datagram: &[u8]) -> io::Result<()>;
}

/// Runs handler jobs and hands back their answers.
pub trait Executor {
    /// Runs a FIXED/LB request on any thread; gives it back when there is no
    /// room anywhere.
    fn run_any(&mut self, job: Job) -> Result<(), Job>;
    /// Runs a committed job after every earlier one, on one thread; gives it
    /// back when that lane is full (the core retries it, in order).
    fn run_ordered(&mut self, job: Job) -> Result<(), Job>;
    /// Moves the answers produced since the last call into `out`, in the
    /// order each thread produced them; returns how many.
    fn collect_answers(&mut self, out: &mut Vec<Outgoing>) -> usize;
}

/// Runs every job at once on the caller's thread (R2P2's original design,
/// `HandlerMode::NetworkThread`; the simulation's replicas).
pub struct InlineExecutor {
    handler: Arc<dyn Handler>,
    remote: RemoteResponder,
    answers: Vec<Outgoing>,
}

impl InlineExecutor {
    /// Runs `handler`'s jobs inline; answers sent later through
    /// [`Responder::remote`] are collected from `core`'s remote queue.
    pub fn new<R: Replication>(handler: Arc<dyn Handler>, core: &ServerCore<R>) -> Self {
        InlineExecutor {
            handler,
            remote: core.remote_responder(DEFAULT_REMOTE_QUEUE_DEPTH, None),
            answers: Vec::new(),
        }
    }

    /// Runs `handler`'s jobs inline, collecting `remote`'s answers too.
    pub(crate) fn with_remote(handler: Arc<dyn Handler>, remote: RemoteResponder) -> Self {
        InlineExecutor { handler, remote, answers: Vec::new() }
    }

    fn run(&mut self, job: Job) {
        let mut responder = Responder { sink: Sink::Net(&mut self.answers), remote: &self.remote };
        job.run(&*self.handler, &mut responder);
    }
}

impl Executor for InlineExecutor {
    fn run_any(&mut self, job: Job) -> Result<(), Job> {
        self.run(job);
        Ok(())
    }

    fn run_ordered(&mut self, job: Job) -> Result<(), Job> {
        self.run(job);
        Ok(())
    }

    fn collect_answers(&mut self, out: &mut Vec<Outgoing>) -> usize {
        let n = self.answers.len();
        out.append(&mut self.answers);
        n + self.remote.drain_into(out)
    }
}

/// The server's logic for one replica (see the module docs).
pub struct ServerCore<R: Replication = Box<dyn Replication>> {
    config: CoreConfig,
    /// Client traffic (requests, admin commands).
    reassembler: Reassembler,
    /// Replica traffic (RAFT), kept apart from clients'.
    peer_reassembler: Reassembler,
    auth: ServerAuth,
    hook: Option<R>,
    hook_out: ReplicationOutput,
    /// Committed jobs the executor's ordered lane had no room for yet.
    backlog: VecDeque<Job>,
    outgoing: Vec<Outgoing>,
    scratch: Vec<u8>,
    peer_sequence: u32,
    next_tick_ns: u64,
    /// The latest `now_ns` the caller passed.
    now_ns: u64,
    counters: Arc<Counters>,
}

impl<R: Replication> ServerCore<R> {
    /// A core with `hook` serving REPLICATED_ROUTE, Admin and RAFT messages
    /// (`None`: they are refused or dropped).
    pub fn new(config: CoreConfig, hook: Option<R>) -> Self {
        assert!(config.mtu_payload > 0, "mtu_payload is positive");
        assert!(config.reassembly.max_packets > 0, "reassembly bounds are positive");
        ServerCore {
            reassembler: Reassembler::new(config.reassembly),
            peer_reassembler: Reassembler::new(config.reassembly),
            auth: ServerAuth::new(
                &config.auth,
                config.peers.len(),
                config.node_id,
                config.wall_clock.map_or(0, |clock| clock()),
            ),
            config,
            hook,
            hook_out: ReplicationOutput::default(),
            backlog: VecDeque::new(),
            outgoing: Vec::new(),
            scratch: Vec::with_capacity(header::MAX_DATAGRAM),
            peer_sequence: 0,
            next_tick_ns: 0,
            now_ns: 0,
            counters: Arc::new(Counters::default()),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    pub(crate) fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// A responder usable from any thread, whose answers an executor
    /// collects; `wake` is called after each answer is queued.
    pub(crate) fn remote_responder(
        &self,
        capacity: usize,
        wake: Option<crate::handler::WakeFn>,
    ) -> RemoteResponder {
        RemoteResponder::new(capacity, self.counters.clone(), wake)
    }

    /// The replication hook.
    pub fn hook(&self) -> Option<&R> {
        self.hook.as_ref()
    }

    /// When [`on_timers`](Self::on_timers) next has work.
    pub fn next_tick_ns(&self) -> u64 {
        self.next_tick_ns
    }

    /// Committed jobs waiting for room on the executor's ordered lane.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// One received datagram: decoded, reassembled and, once a message is
    /// complete, routed. Returns the work done (1).
    pub fn on_datagram(
        &mut self,
        now_ns: u64,
        from: SocketAddr,
        datagram: &[u8],
        exec: &mut impl Executor,
        net: &mut impl Transport,
    ) -> usize {
        self.now_ns = self.now_ns.max(now_ns);
        Counters::bump(&self.counters.datagrams_received);
        let message = match header::decode(datagram, self.config.reassembly.max_packets) {
            Ok((header, payload)) => {
                let wall = || self.config.wall_clock.map_or(now_ns, |clock| clock());
                match self.auth.check(&header, datagram, wall) {
                    Ok(()) if header.message_type == MessageType::Raft => {
                        self.peer_reassembler.on_packet(from, &header, payload, now_ns)
                    }
                    Ok(()) => self.reassembler.on_packet(from, &header, payload, now_ns),
                    Err(refusal) => {
                        self.on_refused(from, &header, refusal);
                        None
                    }
                }
            }
            Err(e) => {
                self.counters.on_decode_error(&e);
                None
            }
        };
        if let Some(message) = message {
            self.on_message(message, now_ns, exec, net);
        }
        1
    }

    /// A datagram failed authentication: counted, and a client's first
    /// datagram of a message answered with ERROR `Unauthorized` (or
    /// `Overloaded`); RAFT datagrams and replays are dropped silently (a
    /// replay may be the network's duplicate of a request that was served).
    fn on_refused(&mut self, from: SocketAddr, header: &Header, refusal: Refusal) {
        let counter = match refusal {
            Refusal::Missing | Refusal::AdminDisabled => &self.counters.drop_unauthenticated,
            Refusal::BadMac => &self.counters.drop_bad_mac,
            Refusal::Replayed | Refusal::Busy => &self.counters.drop_replayed,
        };
        Counters::bump(counter);
        let answer = match refusal {
            Refusal::Replayed => None,
            Refusal::Busy => Some(ErrorCode::Overloaded),
            Refusal::Missing | Refusal::AdminDisabled | Refusal::BadMac => Some(ErrorCode::Unauthorized),
        };
        if let Some(code) = answer
            && header.message_type != MessageType::Raft
            && header.packet_id == 0
        {
            let client = ClientRef { addr: from, client_id: header.client_id, request_id: header.request_id };
            self.outgoing.push(Outgoing::error(client, header.policy, code, refusal.reason()));
        }
    }

    /// The periodic work, when due: reassembly expiry and the hook's tick.
    pub fn on_timers(&mut self, now_ns: u64, exec: &mut impl Executor, net: &mut impl Transport) -> usize {
        self.now_ns = self.now_ns.max(now_ns);
        if now_ns < self.next_tick_ns {
            return 0;
        }
        let tick_ns = self.config.tick_interval.as_nanos().max(1) as u64;
        self.next_tick_ns = now_ns + tick_ns;
        if self.reassembler.partial_count() > 0 {
            self.reassembler.expire(now_ns);
        }
        if self.peer_reassembler.partial_count() > 0 {
            self.peer_reassembler.expire(now_ns);
        }
        match self.hook.as_mut() {
            Some(hook) => {
                hook.tick(now_ns, &mut self.hook_out);
                self.execute_hook_actions(exec, net)
            }
            None => 0,
        }
    }

    /// The end of a turn: the hook flushes (persists, then sends), committed
    /// jobs move to the executor in order, the executor's answers are
    /// collected, and every answer is shown to the hook and sent.
    pub fn end_turn(&mut self, now_ns: u64, exec: &mut impl Executor, net: &mut impl Transport) -> usize {
        self.now_ns = self.now_ns.max(now_ns);
        let mut work = 0;
        if let Some(hook) = self.hook.as_mut() {
            hook.flush(now_ns, &mut self.hook_out);
            work += self.execute_hook_actions(exec, net);
        }
        work += self.flush_backlog(exec);
        work += exec.collect_answers(&mut self.outgoing);
        work += self.send_outgoing(exec, net);
        self.counters.mirror_reassembly(&self.reassembler.stats().plus(&self.peer_reassembler.stats()));
        work
    }

    fn on_message(
        &mut self,
        message: Message,
        now_ns: u64,
        exec: &mut impl Executor,
        net: &mut impl Transport,
    ) {
        let client =
            ClientRef { addr: message.from, client_id: message.client_id, request_id: message.request_id };
        match (message.message_type, message.policy) {
            (MessageType::Request, Policy::FixedRoute | Policy::LbRoute) => {
                Counters::bump(&self.counters.requests);
                let job = Job {
                    handle: ResponseHandle { client, policy: message.policy, respond: true },
                    payload: message.payload,
                    kind: JobKind::Request,
                };
                if exec.run_any(job).is_err() {
                    Counters::bump(&self.counters.drop_queue_full);
                }
            }
            (MessageType::Request, Policy::ReplicatedRoute) => {
                Counters::bump(&self.counters.requests);
                let answered_below = message.answered_below.unwrap_or(0);
                let request = ReplicatedRequest { client, payload: message.payload, answered_below };
                self.hand_to_hook(request, Policy::ReplicatedRoute, false, now_ns, exec, net);
            }
            (MessageType::Admin, policy) => {
                let request = ReplicatedRequest { client, payload: message.payload, answered_below: 0 };
                self.hand_to_hook(request, policy, true, now_ns, exec, net);
            }
            (MessageType::Raft, _) => {
                let Some(hook) = self.hook.as_mut() else {
                    Counters::bump(&self.counters.drop_unexpected_type);
                    return;
                };
                let Some(from) = self.config.peers.iter().position(|p| *p == message.from) else {
                    Counters::bump(&self.counters.drop_unknown_peer);
                    return;
                };
                if self.auth.seals_raft() && message.client_id != from as u64 {
                    // Authenticated as one replica, sent from another's address.
                    Counters::bump(&self.counters.drop_unknown_peer);
                    return;
                }
                Counters::bump(&self.counters.peer_messages_received);
                hook.on_peer_message(from, &message.payload, now_ns, &mut self.hook_out);
                self.execute_hook_actions(exec, net);
            }
            _ => Counters::bump(&self.counters.drop_unexpected_type),
        }
    }

    /// Hands a REPLICATED_ROUTE request (or, `admin`, an admin command) to
    /// the hook and executes what it asks; without a hook the client gets
    /// ERROR `NotReplicated`.
    fn hand_to_hook(
        &mut self,
        request: ReplicatedRequest,
        policy: Policy,
        admin: bool,
        now_ns: u64,
        exec: &mut impl Executor,
        net: &mut impl Transport,
    ) {
        let Some(hook) = self.hook.as_mut() else {
            let reason = if admin {
                "admin command refused: this server has no replication hook"
            } else {
                "REPLICATED_ROUTE refused: this server has no replication hook"
            };
            self.outgoing.push(Outgoing::error(request.client, policy, ErrorCode::NotReplicated, reason));
            return;
        };
        if admin {
            hook.on_admin(request, now_ns, &mut self.hook_out);
        } else {
            Counters::bump(&self.counters.requests_replicated);
            hook.on_request(request, now_ns, &mut self.hook_out);
        }
        self.execute_hook_actions(exec, net);
    }

    /// Executes the hook's actions in order; returns how many.
    fn execute_hook_actions(&mut self, exec: &mut impl Executor, net: &mut impl Transport) -> usize {
        let mut actions = std::mem::take(&mut self.hook_out.actions);
        let count = actions.len();
        let replicated =
            |client, respond| ResponseHandle { client, policy: Policy::ReplicatedRoute, respond };
        for action in actions.drain(..) {
            match action {
                ReplicationAction::SendToPeer { peer, message } => self.send_to_peer(peer, &message, net),
                ReplicationAction::Apply { client, payload, respond } => {
                    Counters::bump(&self.counters.committed_applied);
                    let job = Job { handle: replicated(client, respond), payload, kind: JobKind::Request };
                    self.run_ordered(job, exec);
                }
                ReplicationAction::Snapshot => {
                    let job = Job {
                        handle: replicated(NO_CLIENT, false),
                        payload: Vec::new(),
                        kind: JobKind::Snapshot,
                    };
                    self.run_ordered(job, exec);
                }
                ReplicationAction::Restore { state } => {
                    let job =
                        Job { handle: replicated(NO_CLIENT, false), payload: state, kind: JobKind::Restore };
                    self.run_ordered(job, exec);
                }
                ReplicationAction::Redirect { client, leader } => {
                    let payload =
                        self.config.peers.get(leader as usize).map(|a| a.to_string()).unwrap_or_default();
                    self.outgoing.push(Outgoing {
                        to: client.addr,
                        message_type: MessageType::Redirect,
                        policy: Policy::ReplicatedRoute,
                        client_id: client.client_id,
                        request_id: client.request_id,
                        leader_hint: Some(leader),
                        payload: payload.into_bytes(),
                        send: true,
                        observe: false,
                        snapshot: None,
                    });
                }
                ReplicationAction::Respond { client, payload } => {
                    let mut item = Outgoing::response(&replicated(client, true), payload);
                    item.observe = false; // the hook's own reply, not a handler's
                    self.outgoing.push(item);
                }
                ReplicationAction::Refuse { client, code, reason } => {
                    self.outgoing.push(Outgoing::error(client, Policy::ReplicatedRoute, code, &reason));
                }
            }
        }
        // Hand the (empty) buffer back so its capacity is reused.
        assert!(self.hook_out.actions.is_empty(), "hook actions are only pushed from hook calls");
        self.hook_out.actions = actions;
        count
    }

    /// Runs a committed job behind every earlier one.
    fn run_ordered(&mut self, job: Job, exec: &mut impl Executor) {
        self.backlog.push_back(job);
        self.flush_backlog(exec);
    }

    /// Moves committed jobs, in order, to the executor's ordered lane.
    fn flush_backlog(&mut self, exec: &mut impl Executor) -> usize {
        let mut moved = 0;
        while let Some(job) = self.backlog.pop_front() {
            match exec.run_ordered(job) {
                Ok(()) => moved += 1,
                Err(back) => {
                    self.backlog.push_front(back);
                    break;
                }
            }
        }
        moved
    }

    fn send_outgoing(&mut self, exec: &mut impl Executor, net: &mut impl Transport) -> usize {
        let count = self.outgoing.len();
        if count == 0 {
            return 0;
        }
        let leader = self.hook.as_ref().and_then(|h| h.leader_hint());
        let mut outgoing = std::mem::take(&mut self.outgoing);
        let counters = self.counters.clone();
        let mut hook_called = false;
        for item in outgoing.drain(..) {
            if let Some(state) = item.snapshot {
                if let Some(hook) = self.hook.as_mut() {
                    hook.on_snapshot(state, &mut self.hook_out);
                    hook_called = true;
                }
                continue;
            }
            if item.send {
                let hint = item.leader_hint.or(leader);
                let sealed = if self.auth.seals_answers() { FLAG_AUTH } else { 0 };
                let header = Header {
                    message_type: item.message_type,
                    policy: item.policy,
                    flags: sealed | if hint.is_some() { FLAG_LEADER_HINT } else { 0 },
                    packet_id: 0,
                    packet_count: 1,
                    client_id: item.client_id,
                    request_id: item.request_id,
                    leader_hint: hint.unwrap_or(0),
                    payload_len: 0,
                };
                let counter = match item.message_type {
                    MessageType::Response => &counters.responses_sent,
                    MessageType::Redirect => &counters.redirects_sent,
                    _ => &counters.errors_sent,
                };
                // Counted before the send so that an answer is never observed
                // by its client before it is counted (tests and monitors rely
                // on it).
                Counters::bump(counter);
                self.send_message(&header, &item.payload, item.to, Seal::Answer(item.client_id), net);
            }
            // The hook sees the answer once it is sent, and takes its bytes
            // (a reply cache keeps them without a copy).
            if item.observe
                && let Some(hook) = self.hook.as_mut()
            {
                let client =
                    ClientRef { addr: item.to, client_id: item.client_id, request_id: item.request_id };
                hook.on_response(client, item.payload, item.send, &mut self.hook_out);
                hook_called = true;
            }
            // Counted after the hook saw it: whoever reads the count finds
            // the answer in the hook's cache.
            if !item.send {
                Counters::bump(&counters.drop_follower_responses);
            }
        }
        debug_assert!(self.outgoing.is_empty(), "nothing queues answers while they are sent");
        self.outgoing = outgoing;
        if hook_called && !self.hook_out.actions.is_empty() {
            self.execute_hook_actions(exec, net);
        }
        count
    }

    fn send_to_peer(&mut self, peer: usize, message: &[u8], net: &mut impl Transport) {
        let Some(&to) = self.config.peers.get(peer) else {
            Counters::bump(&self.counters.drop_unknown_peer);
            return;
        };
        self.peer_sequence = self.peer_sequence.wrapping_add(1);
        let header = Header {
            message_type: MessageType::Raft,
            policy: Policy::FixedRoute,
            flags: if self.auth.seals_raft() { FLAG_AUTH } else { 0 },
            packet_id: 0,
            packet_count: 1,
            client_id: self.config.node_id,
            request_id: self.peer_sequence,
            leader_hint: 0,
            payload_len: 0,
        };
        Counters::bump(&self.counters.peer_messages_sent);
        self.send_message(&header, message, to, Seal::Raft(peer as u64), net);
    }

    /// The wall clock for MAC counters.
    fn wall_ns(&self) -> u64 {
        self.config.wall_clock.map_or(self.now_ns, |clock| clock())
    }

    /// Splits and sends one message, each datagram sealed as `seal` says
    /// when the header carries `FLAG_AUTH`; false if it was dropped.
    fn send_message(
        &mut self,
        header: &Header,
        payload: &[u8],
        to: SocketAddr,
        seal_as: Seal,
        net: &mut impl Transport,
    ) -> bool {
        let seal = header.flags & FLAG_AUTH != 0;
        // One clock read per sealed message (its datagrams share it: the
        // sealer's counter still rises by one per datagram); none otherwise.
        let wall = if seal { self.wall_ns() } else { 0 };
        let counters = &self.counters;
        let auth = &mut self.auth;
        let mut all_sent = true;
        let mtu = if seal {
            self.config.mtu_payload.saturating_sub(ordo_auth::TRAILER_LEN).max(1)
        } else {
            self.config.mtu_payload
        };
        let split = reassembly::split(
            header,
            payload,
            mtu,
            self.config.reassembly.max_packets,
            &mut self.scratch,
            |datagram| {
                if seal {
                    match seal_as {
                        Seal::Raft(replica) => auth.seal_raft(datagram, wall, replica),
                        Seal::Answer(client_id) => auth.seal_answer(datagram, wall, client_id),
                    }
                }
                match net.send_datagram(to, datagram) {
                    Ok(()) => Counters::bump(&counters.datagrams_sent),
                    Err(e) => {
                        tracing::debug!(error = %e, %to, "r2p2 send failed");
                        Counters::bump(&counters.drop_send_failed);
                        all_sent = false;
                    }
                }
            },
        );
        if split.is_err() {
            Counters::bump(&self.counters.drop_response_too_large);
            return false;
        }
        all_sent
    }
}
