//! Running the Acuerdo engine for real: one predicate agent per member
//! ([`AcuerdoMember`]) that owns the member's fabric endpoint and its
//! [`ordo_acuerdo::Engine`], a client handle usable from another thread
//! ([`AcuerdoClient`]), per-message delivery callbacks in commit order, and
//! [`connect_local_group`] to bring a whole group up in one process (tests,
//! benchmarks).
//!
//! # Invariants
//! - The member is an [`AcuerdoDriver`] (the sans-I/O driver the simulation
//!   runs too) plus the client's queues and callbacks: pushes are posted in
//!   order and **the engine is not polled again until they all are**; a
//!   suspected peer's held-back writes are dropped and the peer is retried
//!   with [`Fabric::reconnect`] every `reconnect_interval_ns`; a
//!   reconnection becomes [`Engine::on_link_reset`]; every accepted ticket
//!   is settled once (see `ordo_acuerdo::AcuerdoDriver`).
//! - Timers: the engine asks to be polled again by `Effects::wake_at_ns`
//!   (its next heartbeat). The agent is polled on every duty cycle, and an
//!   idle runner re-checks it at least every `park_max`
//!   ([`AcuerdoMember::idle_strategy`] keeps `park_max` below the heartbeat
//!   interval); a duty cycle at or after the wake time counts as work.
//! - Client requests travel through a bounded SPSC queue; the agent takes a
//!   request only when every earlier reply was handed to the reply queue,
//!   so replies are never dropped and the agent's own overflow is bounded
//!   by `max_outstanding + 1`. Every accepted ticket ends with exactly one
//!   [`ClientEvent::Committed`] or [`ClientEvent::Lost`].
//! - Delivery callbacks run on the agent's thread, once per committed
//!   message, in the total order; they must not block.
//! - State transfer (log garbage collection is on by default, see
//!   [`ordo_acuerdo`]'s crate docs): the snapshot and restore callbacks
//!   ([`MemberOptions::on_snapshot`], [`MemberOptions::on_restore`]) run on
//!   the agent's thread too, in the same sequence as the deliveries, so a
//!   snapshot is the state after exactly the messages delivered so far; a
//!   restore replaces that state by the leader's at the header it names,
//!   and deliveries continue after it. Without them the application's
//!   state is not transferred: a member that rejoins by state transfer
//!   then delivers only the messages after the snapshot.

use crate::wiring::MemberFabric;
use crate::{Agent, IdleStrategy};
use ordo_acuerdo::{
    AcuerdoDriver, BroadcastError, Config, DeliverySink, Engine, Epoch, Header, Layout, Note, Role, Settled,
};
use ordo_fabric::{Doorbell, Fabric, FabricEvent, MemberId};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Delivery callback: `(header, payload)` of each committed message, in
/// commit order, on the agent's thread.
pub type DeliverFn = Box<dyn FnMut(Header, &[u8]) + Send>;
/// Note callback: `(now_ns on the runner's clock, note)`.
pub type NoteFn = Box<dyn FnMut(u64, &Note) + Send>;
/// Snapshot callback: the application state after every message delivered
/// so far (state transfer to a member that needs entries the log dropped).
pub type SnapshotFn = Box<dyn FnMut() -> Vec<u8> + Send>;
/// Restore callback: `(header, state)`: replace the application state by a
/// leader's snapshot covering every message up to `header`.
pub type RestoreFn = Box<dyn FnMut(Header, &[u8]) + Send>;
/// Persist callback (durable mode): make the poll's log changes and
/// promises durable before returning.
pub type PersistFn = Box<dyn FnMut(&ordo_acuerdo::Persist<'_>) + Send>;

/// The application as the engine sees it: the three callbacks.
struct AppSink<'a> {
    deliver: &'a mut DeliverFn,
    snapshot: &'a mut Option<SnapshotFn>,
    restore: &'a mut Option<RestoreFn>,
    persist: &'a mut Option<PersistFn>,
}

impl DeliverySink for AppSink<'_> {
    fn deliver(&mut self, header: Header, payload: &[u8]) {
        (self.deliver)(header, payload)
    }

    fn snapshot(&mut self) -> Vec<u8> {
        self.snapshot.as_mut().map_or_else(Vec::new, |f| f())
    }

    fn restore(&mut self, header: Header, state: &[u8]) {
        if let Some(f) = self.restore.as_mut() {
            f(header, state)
        }
    }

    fn persist(&mut self, change: &ordo_acuerdo::Persist<'_>) {
        if let Some(f) = self.persist.as_mut() {
            f(change)
        }
    }
}

/// A [`Config`] with timers suited to real threads and processes on a
/// shared machine: 1 ms heartbeats, 30 ms heartbeat timeout, 40 ms election
/// timeout (the engine's defaults, 50 µs / 1 ms, suit a dedicated core per
/// member that never parks).
pub fn runtime_config(members: Vec<MemberId>, me: MemberId) -> Config {
    let mut c = Config::new(members, me);
    c.heartbeat_interval_ns = 1_000_000;
    c.heartbeat_timeout_ns = 30_000_000;
    c.election_timeout_ns = 40_000_000;
    c
}

/// Bytes of the fabric region a member of `cfg`'s group needs (rounded up
/// to a page, as every backend accepts).
pub fn region_len(cfg: &Config) -> usize {
    Layout::new(cfg).region_len.next_multiple_of(4096)
}

pub use crate::wiring::{connect_local_group, tcp_options};

/// What the agent tells a client about one of its tickets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The leader took the message and assigned it `header`.
    Accepted {
        /// The client's ticket.
        ticket: u64,
        /// The message's place in the total order (once committed).
        header: Header,
    },
    /// The engine refused the message: redirect (`NotLeader`), retry later
    /// (`WouldBlock`), or too large.
    Rejected {
        /// The client's ticket.
        ticket: u64,
        /// Why.
        error: BroadcastError,
    },
    /// The message is committed (delivered here, in the total order).
    Committed {
        /// The client's ticket.
        ticket: u64,
        /// Its header.
        header: Header,
    },
    /// A read barrier ([`AcuerdoClient::read_barrier`]) is confirmed: the
    /// application state, as of this event, reflects every message
    /// committed before the barrier was asked for (a linearizable read may
    /// be answered from it).
    ReadReady {
        /// The client's ticket.
        ticket: u64,
    },
    /// A read barrier will not be confirmed here: this member is not (or
    /// no longer) the leader. Retry at `leader`.
    ReadFailed {
        /// The client's ticket.
        ticket: u64,
        /// The leader this member knows of, if any.
        leader: Option<MemberId>,
    },
    /// The message was accepted, and this member cannot tell whether it was
    /// committed: it caught up by restoring a leader's snapshot that covers
    /// the message's place (state transfer). Do not resubmit blindly.
    Unknown {
        /// The client's ticket.
        ticket: u64,
        /// The header it had.
        header: Header,
    },
    /// The message was accepted but will never be committed: this member
    /// lost its epoch before a quorum accepted it, and the group committed
    /// past its header without it. Resubmit it (to the new leader).
    Lost {
        /// The client's ticket.
        ticket: u64,
        /// The header it had.
        header: Header,
    },
}

impl ClientEvent {
    /// The ticket this event is about.
    pub fn ticket(&self) -> u64 {
        match *self {
            ClientEvent::Accepted { ticket, .. }
            | ClientEvent::Rejected { ticket, .. }
            | ClientEvent::Committed { ticket, .. }
            | ClientEvent::ReadReady { ticket }
            | ClientEvent::ReadFailed { ticket, .. }
            | ClientEvent::Unknown { ticket, .. }
            | ClientEvent::Lost { ticket, .. } => ticket,
        }
    }
}

/// Why [`AcuerdoClient::submit`] did not queue a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The request queue is full (the agent is behind): retry later.
    #[error("the request queue is full")]
    Full,
    /// The payload exceeds the group's `max_payload`.
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The agent is gone (stopped or crashed).
    #[error("the member's agent is gone")]
    Closed,
}

/// Why a blocking [`AcuerdoClient::broadcast_and_wait`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Submitting failed.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The engine refused the message.
    #[error(transparent)]
    Broadcast(#[from] BroadcastError),
    /// Accepted, but lost in a leader change.
    #[error("message {0} was lost in a leader change")]
    Lost(Header),
    /// Accepted, and this member cannot tell whether it was committed (it
    /// caught up by a snapshot covering it).
    #[error("the outcome of message {0} is unknown (this member caught up by state transfer)")]
    Unknown(Header),
    /// No answer within the timeout.
    #[error("timed out")]
    TimedOut,
}

struct Request {
    ticket: u64,
    /// A read barrier (payload empty) rather than a message.
    read: bool,
    payload: Vec<u8>,
}

/// The status words' loads and stores (release/acquire).
trait AtomicCell<T> {
    fn get(&self) -> T;
    fn put(&self, v: T);
}

impl AtomicCell<u64> for AtomicU64 {
    fn get(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
    fn put(&self, v: u64) {
        self.store(v, Ordering::Release);
    }
}

impl AtomicCell<u8> for AtomicU8 {
    fn get(&self) -> u8 {
        self.load(Ordering::Relaxed)
    }
    fn put(&self, v: u8) {
        self.store(v, Ordering::Release);
    }
}

/// Largest request buffer handed back to the client for reuse.
const SPARE_BUF_MAX: usize = 16 * 1024;

/// Live state of a member, readable from any thread.
#[derive(Debug)]
pub struct AcuerdoStatus {
    member: MemberId,
    role: AtomicU8,
    leader: AtomicU64,
    epoch: AtomicU64,
    committed: AtomicU64,
    delivered: AtomicU64,
    elections_won: AtomicU64,
    log_len: AtomicU64,
    restores: AtomicU64,
    synced: AtomicU8,
}

impl AcuerdoStatus {
    fn new(member: MemberId) -> Self {
        AcuerdoStatus {
            member,
            role: AtomicU8::new(0),
            leader: AtomicU64::new(u64::MAX),
            epoch: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            elections_won: AtomicU64::new(0),
            log_len: AtomicU64::new(0),
            restores: AtomicU64::new(0),
            synced: AtomicU8::new(0),
        }
    }

    fn update(&self, e: &Engine) {
        let role = match e.role() {
            Role::Electing => 0,
            Role::Leader => 1,
            Role::Follower => 2,
        };
        // Runs every duty cycle: store only what changed, so readers on
        // other cores keep their cache lines while the member is idle.
        fn set<T: PartialEq + Copy>(a: &impl AtomicCell<T>, v: T) {
            if a.get() != v {
                a.put(v);
            }
        }
        set(&self.role, role);
        set(&self.leader, e.leader().map_or(u64::MAX, u64::from));
        set(&self.epoch, e.epoch().encode());
        set(&self.committed, e.committed().encode());
        set(&self.delivered, e.delivered());
        set(&self.log_len, e.log_len() as u64);
        set(&self.synced, u8::from(e.is_synced()));
    }

    /// The member.
    pub fn member(&self) -> MemberId {
        self.member
    }

    /// Its role as of its last duty cycle.
    pub fn role(&self) -> Role {
        match self.role.load(Ordering::Acquire) {
            1 => Role::Leader,
            2 => Role::Follower,
            _ => Role::Electing,
        }
    }

    /// Whether it leads.
    pub fn is_leader(&self) -> bool {
        self.role() == Role::Leader
    }

    /// The leader it follows (or itself).
    pub fn leader(&self) -> Option<MemberId> {
        let l = self.leader.load(Ordering::Acquire);
        (l != u64::MAX).then_some(l as MemberId)
    }

    /// Its current epoch.
    pub fn epoch(&self) -> Epoch {
        Header::decode(self.epoch.load(Ordering::Acquire)).epoch
    }

    /// Its last committed header.
    pub fn committed(&self) -> Header {
        Header::decode(self.committed.load(Ordering::Acquire))
    }

    /// Messages delivered by it.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Acquire)
    }

    /// Elections it won.
    pub fn elections_won(&self) -> u64 {
        self.elections_won.load(Ordering::Acquire)
    }

    /// Entries in its log.
    pub fn log_len(&self) -> u64 {
        self.log_len.load(Ordering::Acquire)
    }

    /// Snapshots it restored (state transfers it received).
    pub fn restores(&self) -> u64 {
        self.restores.load(Ordering::Acquire)
    }

    /// Whether it holds a leader's log (a restarted member: once caught up).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire) != 0
    }
}

/// A client of one member: submits messages (the member broadcasts them
/// if it leads) and receives per-ticket outcomes. `Send`, so it can live on
/// any one thread (it is the producer end of an SPSC queue, not `Clone`).
pub struct AcuerdoClient {
    requests: rtrb::Producer<Request>,
    /// Payload buffers the agent is done with (cleared), so a submit
    /// allocates nothing once warm.
    spare: rtrb::Consumer<Vec<u8>>,
    replies: rtrb::Consumer<ClientEvent>,
    next_ticket: u64,
    max_payload: usize,
    bell: Option<Doorbell>,
    status: Arc<AcuerdoStatus>,
}

impl AcuerdoClient {
    /// Queues `payload` for broadcast and returns its ticket; the outcome
    /// arrives through [`poll`](Self::poll).
    pub fn submit(&mut self, payload: &[u8]) -> Result<u64, SubmitError> {
        if payload.len() > self.max_payload {
            return Err(SubmitError::TooLarge { len: payload.len(), max: self.max_payload });
        }
        if self.requests.is_abandoned() {
            return Err(SubmitError::Closed);
        }
        let ticket = self.next_ticket;
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.extend_from_slice(payload);
        self.requests.push(Request { ticket, read: false, payload: buf }).map_err(|_| SubmitError::Full)?;
        self.next_ticket += 1;
        if let Some(bell) = &self.bell {
            bell.ring();
        }
        Ok(ticket)
    }

    /// Asks the member (it must lead) for a linearizable read barrier and
    /// returns its ticket; [`ClientEvent::ReadReady`] or
    /// [`ClientEvent::ReadFailed`] follows. Reads asked for together share
    /// one confirmation round (see `ordo_acuerdo`'s read index).
    pub fn read_barrier(&mut self) -> Result<u64, SubmitError> {
        if self.requests.is_abandoned() {
            return Err(SubmitError::Closed);
        }
        let ticket = self.next_ticket;
        self.requests
            .push(Request { ticket, read: true, payload: Vec::new() })
            .map_err(|_| SubmitError::Full)?;
        self.next_ticket += 1;
        if let Some(bell) = &self.bell {
            bell.ring();
        }
        Ok(ticket)
    }

    /// The next outcome, if any.
    pub fn poll(&mut self) -> Option<ClientEvent> {
        self.replies.pop().ok()
    }

    /// Whether the agent is gone (after draining its last replies).
    pub fn is_closed(&self) -> bool {
        self.requests.is_abandoned()
    }

    /// The member's live status.
    pub fn status(&self) -> &Arc<AcuerdoStatus> {
        &self.status
    }

    /// Submits `payload` and waits (polling, sleeping 50 µs between
    /// checks) until it is committed, refused or lost, up to `timeout`.
    /// Events of other tickets seen meanwhile are dropped: use it only
    /// when this client has nothing else in flight.
    pub fn broadcast_and_wait(&mut self, payload: &[u8], timeout: Duration) -> Result<Header, ClientError> {
        let deadline = Instant::now() + timeout;
        let ticket = loop {
            match self.submit(payload) {
                Ok(t) => break t,
                Err(SubmitError::Full) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(50))
                }
                Err(SubmitError::Full) => return Err(ClientError::TimedOut),
                Err(e) => return Err(e.into()),
            }
        };
        loop {
            while let Some(ev) = self.poll() {
                match ev {
                    ClientEvent::Committed { ticket: t, header } if t == ticket => return Ok(header),
                    ClientEvent::Rejected { ticket: t, error } if t == ticket => return Err(error.into()),
                    ClientEvent::Lost { ticket: t, header } if t == ticket => {
                        return Err(ClientError::Lost(header));
                    }
                    ClientEvent::Unknown { ticket: t, header } if t == ticket => {
                        return Err(ClientError::Unknown(header));
                    }
                    _ => {}
                }
            }
            if Instant::now() >= deadline {
                return Err(ClientError::TimedOut);
            }
            if self.is_closed() && self.replies.is_empty() {
                return Err(SubmitError::Closed.into());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Options of an [`AcuerdoMember`] beyond the engine's [`Config`].
pub struct MemberOptions {
    /// Requests the client can queue before [`SubmitError::Full`].
    pub request_capacity: usize,
    /// How often a suspected peer is retried with [`Fabric::reconnect`].
    pub reconnect_interval_ns: u64,
    /// Called per committed message, in commit order.
    pub on_deliver: Option<DeliverFn>,
    /// Called per engine note (votes, elections, diffs).
    pub on_note: Option<NoteFn>,
    /// State transfer, sending side: the application state after the
    /// messages delivered so far (default: none, an empty snapshot).
    pub on_snapshot: Option<SnapshotFn>,
    /// State transfer, receiving side: replace the application state by a
    /// leader's snapshot (default: ignore it).
    pub on_restore: Option<RestoreFn>,
    /// Durable mode: start from this state read back from disk (see
    /// `ordo_acuerdo::Engine::recover`) instead of empty.
    pub recovered: Option<ordo_acuerdo::Recovered>,
    /// Durable mode (`Config::durable`): write the poll's changes; runs on
    /// the agent's thread, in the poll, before anything it publishes.
    pub on_persist: Option<PersistFn>,
    /// Called on the agent's thread after a duty cycle that queued client
    /// events, so a client that sleeps on its own poller (an event loop)
    /// can be woken; it must not block.
    pub on_client_event: Option<Box<dyn FnMut() + Send>>,
}

impl Default for MemberOptions {
    fn default() -> Self {
        MemberOptions {
            request_capacity: 1024,
            reconnect_interval_ns: 10_000_000,
            on_deliver: None,
            on_note: None,
            on_snapshot: None,
            on_restore: None,
            recovered: None,
            on_persist: None,
            on_client_event: None,
        }
    }
}

/// A member's Acuerdo predicate agent: a thin shell around the sans-I/O
/// [`AcuerdoDriver`] (engine, push backlog, link recovery, ticket
/// settlement) that adds the client's queues, the application callbacks,
/// the live status and logging.
pub struct AcuerdoMember<F: Fabric> {
    driver: AcuerdoDriver<F>,
    on_deliver: DeliverFn,
    on_note: Option<NoteFn>,
    on_snapshot: Option<SnapshotFn>,
    on_restore: Option<RestoreFn>,
    on_persist: Option<PersistFn>,
    on_client_event: Option<Box<dyn FnMut() + Send>>,
    /// Client events were queued in this duty cycle.
    replied: bool,
    requests: rtrb::Consumer<Request>,
    /// Returns request payload buffers to the client for reuse.
    spare: rtrb::Producer<Vec<u8>>,
    replies: rtrb::Producer<ClientEvent>,
    /// Replies the reply queue had no room for yet, oldest first.
    overflow: VecDeque<ClientEvent>,
    /// Tickets settled by the last poll (reused buffer).
    settled: Vec<Settled>,
    status: Arc<AcuerdoStatus>,
}

impl<F: Fabric> AcuerdoMember<F> {
    /// The agent of `cfg.me` over `fabric` (whose region must be zeroed and
    /// at least [`Layout::region_len`] bytes), and its client.
    pub fn new(
        fabric: F,
        cfg: Config,
        now_ns: u64,
        options: MemberOptions,
    ) -> Result<(Self, AcuerdoClient), ordo_acuerdo::ConfigError> {
        let max_payload = cfg.max_payload;
        let reply_capacity = options.request_capacity + cfg.max_outstanding as usize + 16;
        let bell = fabric.doorbell().cloned();
        let driver = match options.recovered {
            Some(rec) => {
                AcuerdoDriver::recover(fabric, cfg, now_ns, options.reconnect_interval_ns.max(1), rec)?
            }
            None => AcuerdoDriver::new(fabric, cfg, now_ns, options.reconnect_interval_ns.max(1))?,
        };
        let (req_tx, req_rx) = rtrb::RingBuffer::new(options.request_capacity.max(1));
        let (rep_tx, rep_rx) = rtrb::RingBuffer::new(reply_capacity);
        let (spare_tx, spare_rx) = rtrb::RingBuffer::new(options.request_capacity.clamp(1, 64));
        let status = Arc::new(AcuerdoStatus::new(driver.engine().member()));
        status.update(driver.engine());
        let client = AcuerdoClient {
            requests: req_tx,
            spare: spare_rx,
            replies: rep_rx,
            next_ticket: 0,
            max_payload,
            bell,
            status: status.clone(),
        };
        let member = AcuerdoMember {
            driver,
            on_deliver: options.on_deliver.unwrap_or_else(|| Box::new(|_, _| {})),
            on_note: options.on_note,
            on_snapshot: options.on_snapshot,
            on_restore: options.on_restore,
            on_persist: options.on_persist,
            on_client_event: options.on_client_event,
            replied: false,
            requests: req_rx,
            spare: spare_tx,
            replies: rep_tx,
            overflow: VecDeque::new(),
            settled: Vec::new(),
            status,
        };
        Ok((member, client))
    }

    /// An idle strategy that re-checks the agent at least every heartbeat
    /// interval of `cfg` (spin, yield, then park up to half an interval).
    pub fn idle_strategy(cfg: &Config) -> IdleStrategy {
        Self::idle_strategy_with(cfg, 2_000, 100)
    }

    /// [`idle_strategy`](Self::idle_strategy) with `spins` and `yields`
    /// idle duty cycles before parking. Few (tens) when members outnumber
    /// cores: a spinning member holds a core another member needs for the
    /// same round (ordo-kv's YCSB-load with 7 replicas on 2 cores: 3.7k
    /// ops/s with 2,000 spins, 31k with 20).
    pub fn idle_strategy_with(cfg: &Config, spins: u32, yields: u32) -> IdleStrategy {
        let half = Duration::from_nanos(cfg.heartbeat_interval_ns / 2).max(IdleStrategy::MIN_PARK);
        IdleStrategy::BackoffPark {
            spins,
            yields,
            park_min: Duration::from_micros(20).min(half),
            park_max: half,
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        self.driver.engine()
    }

    /// The fabric endpoint.
    pub fn fabric(&self) -> &F {
        self.driver.fabric()
    }

    /// The live status (shared with the client).
    pub fn status(&self) -> Arc<AcuerdoStatus> {
        self.status.clone()
    }

    /// Peers suspected so far (count) and links reconnected (count).
    pub fn link_counts(&self) -> (u64, u64) {
        self.driver.link_counts()
    }

    /// Pushes waiting for the fabric.
    pub fn backlog_len(&self) -> usize {
        self.driver.backlog_len()
    }

    fn handle_events(&mut self, now_ns: u64) -> usize {
        let member = self.driver.engine().member();
        self.driver.on_fabric_events(now_ns, |e| match e {
            FabricEvent::Suspected { peer, cause } => tracing::info!(member, peer, %cause, "peer suspected"),
            FabricEvent::Reconnected { peer, incarnation } => {
                tracing::info!(member, peer, incarnation, "link reconnected")
            }
            _ => {}
        })
    }

    fn reply(&mut self, ev: ClientEvent) {
        self.replied = true;
        if !self.overflow.is_empty() {
            self.overflow.push_back(ev);
        } else if let Err(rtrb::PushError::Full(ev)) = self.replies.push(ev) {
            self.overflow.push_back(ev);
        }
    }

    fn flush_replies(&mut self) {
        while let Some(ev) = self.overflow.front() {
            if self.replies.push(*ev).is_err() {
                return;
            }
            self.overflow.pop_front();
        }
    }

    /// Takes client requests into the engine (leader) or answers them.
    fn take_requests(&mut self) -> usize {
        let mut work = 0;
        while self.overflow.is_empty() {
            let Ok(req) = self.requests.pop() else { break };
            work += 1;
            if req.read {
                if let Err(e) = self.driver.read_index(req.ticket) {
                    let leader = match e {
                        BroadcastError::NotLeader { leader } => leader,
                        _ => self.driver.engine().leader(),
                    };
                    self.reply(ClientEvent::ReadFailed { ticket: req.ticket, leader });
                }
                continue;
            }
            match self.driver.submit(req.ticket, &req.payload) {
                Ok(header) => self.reply(ClientEvent::Accepted { ticket: req.ticket, header }),
                Err(error) => self.reply(ClientEvent::Rejected { ticket: req.ticket, error }),
            }
            // Hand the buffer back (dropped if the client has enough).
            let mut buf = req.payload;
            if buf.capacity() <= SPARE_BUF_MAX {
                buf.clear();
                let _ = self.spare.push(buf);
            }
        }
        work
    }
}

impl<F: Fabric + Send> Agent for AcuerdoMember<F> {
    fn name(&self) -> &str {
        "acuerdo"
    }

    fn do_work(&mut self, now_ns: u64) -> usize {
        self.flush_replies();
        let mut work = self.driver.post_backlog();
        if !self.driver.can_poll() {
            // Back-pressure: the engine may not run again until everything
            // it asked for is posted.
            return work + self.handle_events(now_ns);
        }
        work += self.take_requests();
        let mut app = AppSink {
            deliver: &mut self.on_deliver,
            snapshot: &mut self.on_snapshot,
            restore: &mut self.on_restore,
            persist: &mut self.on_persist,
        };
        let mut settled = std::mem::take(&mut self.settled);
        work += self.driver.poll(now_ns, &mut app, &mut settled);
        let member = self.driver.engine().member();
        for note in &self.driver.effects().notes {
            match note {
                Note::BecameLeader(_) => {
                    self.status.elections_won.fetch_add(1, Ordering::AcqRel);
                }
                Note::Restored { .. } => {
                    self.status.restores.fetch_add(1, Ordering::AcqRel);
                }
                Note::RingModeDiffers { sender, stamped } => tracing::error!(
                    member,
                    peer = sender,
                    peer_stamped = stamped,
                    "acuerdo: this member and a peer disagree on the ring mode (stamped slots need an \
                     address-ordered fabric on every member: same backend, same architecture); its ring is not read"
                ),
                _ => {}
            }
            tracing::debug!(member, ?note, "acuerdo");
            if let Some(f) = self.on_note.as_mut() {
                f(now_ns, note);
            }
        }
        let fx = self.driver.effects();
        if !fx.reads_ready.is_empty() || !fx.reads_failed.is_empty() {
            let leader = self.driver.engine().leader();
            let reads: Vec<ClientEvent> = fx
                .reads_ready
                .iter()
                .map(|&ticket| ClientEvent::ReadReady { ticket })
                .chain(fx.reads_failed.iter().map(|&ticket| ClientEvent::ReadFailed { ticket, leader }))
                .collect();
            for ev in reads {
                self.reply(ev);
            }
        }
        for s in settled.drain(..) {
            self.reply(match s {
                Settled::Committed { ticket, header } => ClientEvent::Committed { ticket, header },
                Settled::Lost { ticket, header } => ClientEvent::Lost { ticket, header },
                Settled::Unknown { ticket, header } => ClientEvent::Unknown { ticket, header },
            });
        }
        self.settled = settled;
        self.status.update(self.driver.engine());
        if std::mem::take(&mut self.replied)
            && let Some(f) = self.on_client_event.as_mut()
        {
            f();
        }
        work + self.handle_events(now_ns)
    }

    fn doorbell(&self) -> Option<Doorbell> {
        self.driver.fabric().doorbell().cloned()
    }
}

/// Convenience for tests and tools: the member of `cfg.me` over `fabric`,
/// started on its own runner thread with [`AcuerdoMember::idle_strategy`].
pub fn start_member(
    fabric: MemberFabric,
    cfg: Config,
    options: MemberOptions,
) -> Result<(crate::Runner<AcuerdoMember<MemberFabric>>, AcuerdoClient), String> {
    let idle = AcuerdoMember::<MemberFabric>::idle_strategy(&cfg);
    start_member_idle(fabric, cfg, options, idle)
}

/// [`start_member`] with the runner's idle strategy given.
pub fn start_member_idle(
    fabric: MemberFabric,
    cfg: Config,
    options: MemberOptions,
    idle: IdleStrategy,
) -> Result<(crate::Runner<AcuerdoMember<MemberFabric>>, AcuerdoClient), String> {
    let name = format!("acuerdo{}", cfg.me);
    // The runner's clock starts at zero when it starts; the engine's time
    // origin is its first poll, so start it at 0 too.
    let (member, client) = AcuerdoMember::new(fabric, cfg, 0, options).map_err(|e| e.to_string())?;
    let mut opts = crate::RunnerOptions::new(crate::ThreadingMode::Dedicated, idle);
    opts.thread_name_prefix = name;
    let runner = crate::Runner::start(vec![member], &opts).map_err(|e| e.to_string())?;
    Ok((runner, client))
}
