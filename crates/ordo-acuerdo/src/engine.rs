//! The Acuerdo engine: one per member; [`Engine::poll`] runs the accepting,
//! committing, election and broadcasting predicates of Figs. 4-7 over the
//! local region and emits the writes the caller must post.
//!
//! # Invariants (asserted after every poll; a violation is a bug and panics)
//! - `E_cur ≤ E_new`; a leader has `E_cur == E_new` led by itself.
//! - `E_new`, `Accepted`, `Committed`, `Next` and the own vote never go back
//!   within an incarnation (so every own SST column is monotonic).
//! - `Committed < Next`, and every header at or below `Committed` was
//!   delivered exactly once, in header order, by this incarnation, or is
//!   covered by the last application snapshot it restored (whose header
//!   became `Committed` then; the log floor is at least that header).
//! - The log holds no entry at or below the log floor, and the floor never
//!   exceeds `Committed`; a leader's ring stream to a live member never
//!   needs an entry below the floor (GC stops at it).
//! - At most one `plan()` (one ring counter write) per outgoing ring per
//!   poll, and none in the poll that resets a ring: a write captures its
//!   bytes when the caller posts it, after the poll, so a second counter
//!   update in the same poll could overtake the data it covers.

use crate::config::{Config, ConfigError, Layout, WIRE_HEADER_LEN};
use crate::header::{Epoch, Header, Vote};
use ordo_fabric::{MemberId, Region};
use ordo_ring::{MessageMeta, RingReceiver, SendPath, SlotProducer};
use ordo_sst::{ColumnRange, Sst};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Wire kinds of ring messages (low byte of the first header word).
const KIND_NORMAL: u64 = 1;
const KIND_DIFF_ENTRY: u64 = 2;
const KIND_DIFF_END: u64 = 3;
const KIND_SNAP_CHUNK: u64 = 4;

/// Log garbage collection waits until the log holds this many entries.
const GC_BATCH: usize = 16;

/// A member's role in its current epoch (Fig. 1, line 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Looking for (or catching up to) a leader.
    Electing,
    /// The sole proposer of its epoch.
    Leader,
    /// Accepts and commits the leader's messages.
    Follower,
}

/// Who a [`Push`] goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Every other member.
    All,
    /// One member.
    Peer(MemberId),
}

/// A write the caller must post: `len` bytes at `offset` of the local
/// region to the same offset of the target's region. Post the pushes of one
/// poll in order, to each target in order, and post them all before the
/// next poll (retry back-pressure; never drop or reorder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Push {
    /// Destination(s).
    pub to: Target,
    /// Region offset.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// Something the engine did that an operator or a checker may want to know.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Note {
    /// This member cast a vote (for itself or another candidate).
    Voted(Vote),
    /// This member won the election of `epoch` (Fig. 7, line 117).
    BecameLeader(Epoch),
    /// This member accepted the diff of `epoch` and follows its leader.
    JoinedEpoch(Epoch),
    /// The leader saw a bigger promised epoch and started a new election.
    Abdicated(Epoch),
    /// A diff was not accepted.
    DiffRejected {
        /// The diff's epoch.
        epoch: Epoch,
        /// Why.
        reason: &'static str,
    },
    /// A restarted member learnt its epoch floor and asked for a full diff.
    RequestedDiff(u64),
    /// This member restored an application snapshot (state transfer) that
    /// covers every message up to `header`, from its leader's diff.
    Restored {
        /// The last header the snapshot covers (now `Committed`).
        header: Header,
        /// Bytes of the snapshot.
        bytes: usize,
    },
    /// The leader took an application snapshot at `header` for a diff to
    /// `to`, who needs entries the log no longer holds.
    SnapshotSent {
        /// The receiver.
        to: MemberId,
        /// The last header the snapshot covers (the leader's `Committed`).
        header: Header,
        /// Bytes of the snapshot.
        bytes: usize,
    },
    /// A peer's ring held a message the engine could not parse.
    BadMessage {
        /// The sender.
        sender: MemberId,
        /// What was wrong.
        what: String,
    },
}

/// What one [`Engine::poll`] asks of the caller and reports.
#[derive(Debug, Default)]
pub struct Effects {
    /// Writes to post, in order.
    pub pushes: Vec<Push>,
    /// Headers of messages proposed by this member id that were committed
    /// (delivered) in this poll: the commit notification of the tickets
    /// [`Engine::broadcast`] returned.
    pub committed: Vec<Header>,
    /// What happened (elections, diffs).
    pub notes: Vec<Note>,
    /// Poll again no later than this (the next heartbeat, or the next
    /// periodic push of a changed Commit column).
    pub wake_at_ns: Option<u64>,
}

impl Effects {
    /// Clears for reuse (keeps the allocations).
    pub fn clear(&mut self) {
        self.pushes.clear();
        self.committed.clear();
        self.notes.clear();
        self.wake_at_ns = None;
    }
}

/// The application: receives committed messages, one by one, in the total
/// order, and (for state transfer) snapshots and restores the state they
/// built.
///
/// State transfer (crate docs, "State transfer"): once log garbage
/// collection dropped entries a member still needs (it restarted, or it was
/// suspected while the others moved on), the leader calls
/// [`snapshot`](Self::snapshot) and sends its bytes, followed by the log
/// suffix; the member calls [`restore`](Self::restore) instead of
/// delivering the messages the snapshot covers. The defaults keep no state
/// (an empty snapshot, a restore that does nothing): right for an
/// application that only needs the messages delivered after it (re)joined.
pub trait DeliverySink {
    /// `payload` of the message `header` is committed.
    fn deliver(&mut self, header: Header, payload: &[u8]);

    /// The application state after every message delivered so far (the
    /// engine calls it inside [`Engine::poll`], so that is exactly the
    /// prefix up to [`Engine::committed`]). Any size: it travels in chunks
    /// of `max_payload` bytes.
    fn snapshot(&mut self) -> Vec<u8> {
        Vec::new()
    }

    /// Replace the application state by `state`, a [`snapshot`](Self::snapshot)
    /// taken at the leader after it delivered every message up to `header`.
    /// Deliveries continue after `header`.
    fn restore(&mut self, header: Header, state: &[u8]) {
        let _ = (header, state);
    }
}

impl<F: FnMut(Header, &[u8])> DeliverySink for F {
    fn deliver(&mut self, header: Header, payload: &[u8]) {
        self(header, payload)
    }
}

/// Why [`Engine::broadcast`] did not take a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BroadcastError {
    /// Only the leader broadcasts; `leader` is the one to redirect to, if
    /// this member follows one.
    #[error("not the leader (redirect to {leader:?})")]
    NotLeader {
        /// The current leader as far as this member knows.
        leader: Option<MemberId>,
    },
    /// `max_outstanding` messages are not committed yet; retry later.
    #[error("too many outstanding messages (back-pressure)")]
    WouldBlock,
    /// The payload is larger than `max_payload`.
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
}

/// The application snapshot that opens a diff (state transfer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Snap {
    /// A plain diff: the follower's Commit header is still in the log.
    No,
    /// The follower needs entries below the log floor: take a snapshot at
    /// the next send (where the application is at hand), then fix
    /// `base = after =` the snapshot's header and `upto`.
    Pending,
    /// `chunks` chunks of the link's snapshot are in the ring.
    Sending { chunks: u32 },
}

/// What a leader still has to send to one follower over its ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    /// Nothing (not leader, or waiting for the follower's diff request).
    Idle,
    /// A diff: its snapshot chunks (if any), the log entries in
    /// `(base, upto]`, then its end marker.
    Diff { serial: u32, epoch: Epoch, base: Header, upto: Header, after: Header, sent: u32, snap: Snap },
    /// Normal messages of the epoch after `after`.
    Normal { after: Header },
}

struct OutLink {
    peer: MemberId,
    session: u32,
    generation: u32,
    producer: SlotProducer,
    send: SendPath,
    /// Start a new session at the next poll.
    reset_pending: bool,
    /// The session started in this poll: plan nothing yet.
    quiet: bool,
    stream: Stream,
    served_request: u64,
    next_serial: u32,
    /// The snapshot a [`Snap::Sending`] diff is sending.
    snapshot: Option<Arc<[u8]>>,
}

struct InLink {
    session: u32,
    rx: RingReceiver,
    staging: Vec<(Header, Vec<u8>)>,
    staging_serial: Option<u32>,
    /// A snapshot being received: the diff serial it belongs to, its
    /// header, its announced length, its bytes so far, and whether every
    /// chunk arrived in order.
    snap_serial: Option<u32>,
    snap_header: Header,
    snap_total: u64,
    snap: Vec<u8>,
    snap_ok: bool,
}

impl InLink {
    fn clear_staging(&mut self) {
        self.staging.clear();
        self.staging_serial = None;
        self.snap_serial = None;
        self.snap = Vec::new();
    }
}

/// A complete diff as a follower received it.
struct Diff {
    epoch: Epoch,
    base: Header,
    upto: Header,
    entries: u32,
    staged: Vec<(Header, Vec<u8>)>,
    snapshot: Option<Vec<u8>>,
}

/// A parsed ring message.
enum Wire {
    Normal { header: Header, body: Vec<u8> },
    DiffEntry { serial: u32, header: Header, body: Vec<u8> },
    DiffEnd { serial: u32, epoch: Epoch, base: Header, upto: Header, entries: u32 },
    SnapChunk { serial: u32, header: Header, offset: u64, total: u64, body: Vec<u8> },
}

/// One member's Acuerdo engine. See the crate docs.
pub struct Engine {
    cfg: Config,
    layout: Layout,
    region: Region,
    sst: Sst,
    members: Vec<MemberId>,
    me: MemberId,
    my_row: usize,
    quorum: usize,
    now_ns: u64,

    role: Role,
    e_cur: Epoch,
    e_new: Epoch,
    accepted: Header,
    committed: Header,
    next: Header,
    count: u32,
    log: BTreeMap<Header, Vec<u8>>,
    /// The largest header garbage collection dropped from the log (every
    /// member committed it); `Header::NONE` while the log is whole.
    log_floor: Header,
    my_vote: Vote,

    synced: bool,
    floor_ready: bool,
    request_seq: u64,

    out: Vec<Option<OutLink>>,
    inc: Vec<Option<InLink>>,
    last_hb: Vec<u64>,
    hb_changed_ns: Vec<u64>,
    votes: Vec<Vote>,
    stall: Option<(Vote, u64)>,
    heartbeat: u64,
    next_hb_ns: u64,
    dirty_all: bool,
    dirty_to: Vec<bool>,
    /// The Commit column changed and is not pushed yet.
    commit_dirty: bool,
    next_commit_push_ns: u64,
    metas: Vec<MessageMeta>,
    /// Parsed ring messages of one scan (reused).
    msgs: Vec<Result<Wire, String>>,
    /// Spare message bodies (cleared), so the log allocates no buffer per
    /// message once warm.
    pool: Vec<Vec<u8>>,
    delivered: u64,
}

impl Engine {
    /// The engine of `cfg.me` over `region` (at least
    /// [`Layout::region_len`] bytes, zeroed at this incarnation's start),
    /// started at `now_ns`.
    pub fn new(cfg: Config, region: Region, now_ns: u64) -> Result<Engine, ConfigError> {
        cfg.validate()?;
        let layout = Layout::new(&cfg);
        if region.len() < layout.region_len {
            return Err(ConfigError::RegionTooSmall { have: region.len(), need: layout.region_len });
        }
        let members = cfg.sorted_members();
        let sst = Sst::new(region.clone(), 0, layout.sst.clone(), &members, cfg.me)
            .map_err(|e| ConfigError::Members(e.to_string()))?;
        let my_row = sst.my_row();
        let n = members.len();
        let out = (0..n)
            .map(|r| {
                (r != my_row).then(|| {
                    let (producer, send) =
                        ordo_ring::sender(region.clone(), layout.ring_offset(my_row, r), layout.ring);
                    OutLink {
                        peer: members[r],
                        session: 0,
                        generation: 0,
                        producer,
                        send,
                        reset_pending: true,
                        quiet: false,
                        stream: Stream::Idle,
                        served_request: 0,
                        next_serial: 0,
                        snapshot: None,
                    }
                })
            })
            .collect();
        let inc = (0..n)
            .map(|s| {
                (s != my_row).then(|| InLink {
                    session: 0,
                    rx: RingReceiver::new(region.clone(), layout.ring_offset(s, my_row), layout.ring),
                    staging: Vec::new(),
                    staging_serial: None,
                    snap_serial: None,
                    snap_header: Header::NONE,
                    snap_total: 0,
                    snap: Vec::new(),
                    snap_ok: false,
                })
            })
            .collect();
        let synced = cfg.incarnation == 1;
        let mut engine = Engine {
            quorum: cfg.quorum(),
            me: cfg.me,
            members,
            my_row,
            now_ns,
            cfg,
            layout,
            region,
            sst,
            role: Role::Electing,
            e_cur: Epoch::NONE,
            e_new: Epoch::NONE,
            accepted: Header::NONE,
            committed: Header::NONE,
            next: Header::NONE.succ(),
            count: 0,
            log: BTreeMap::new(),
            log_floor: Header::NONE,
            my_vote: Vote::NONE,
            synced,
            floor_ready: synced,
            request_seq: 0,
            out,
            inc,
            last_hb: vec![0; n],
            hb_changed_ns: vec![now_ns; n],
            votes: vec![Vote::NONE; n],
            stall: None,
            heartbeat: 0,
            next_hb_ns: now_ns,
            dirty_all: true,
            dirty_to: vec![false; n],
            commit_dirty: false,
            next_commit_push_ns: now_ns,
            metas: Vec::new(),
            msgs: Vec::new(),
            pool: Vec::new(),
            delivered: 0,
        };
        engine.write_status();
        Ok(engine)
    }

    // ------------------------------------------------------------------
    // Accessors
    // ------------------------------------------------------------------

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The region layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// This member.
    pub fn member(&self) -> MemberId {
        self.me
    }

    /// The other members, sorted.
    pub fn peers(&self) -> Vec<MemberId> {
        self.members.iter().copied().filter(|m| *m != self.me).collect()
    }

    /// The current role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// `E_cur`, the epoch this member is in.
    pub fn epoch(&self) -> Epoch {
        self.e_cur
    }

    /// `E_new`, the epoch this member has promised to join.
    pub fn e_new(&self) -> Epoch {
        self.e_new
    }

    /// The leader this member follows (or itself), if any.
    pub fn leader(&self) -> Option<MemberId> {
        match self.role {
            Role::Leader | Role::Follower => Some(self.e_cur.leader),
            Role::Electing => None,
        }
    }

    /// `Accepted`: the last accepted header.
    pub fn accepted(&self) -> Header {
        self.accepted
    }

    /// `Committed`: the last committed header.
    pub fn committed(&self) -> Header {
        self.committed
    }

    /// This member's current vote.
    pub fn vote(&self) -> Vote {
        self.my_vote
    }

    /// Whether this member holds a leader's log (false for a restarted
    /// member until it accepted a diff).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Messages delivered by this incarnation.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The headers in the log, in order.
    pub fn log_headers(&self) -> impl Iterator<Item = Header> + '_ {
        self.log.keys().copied()
    }

    /// Number of log entries (bounded under load with
    /// [`Config::log_gc`]; with it off, the log grows without bound).
    pub fn log_len(&self) -> usize {
        self.log.len()
    }

    /// The largest header log garbage collection dropped (every member had
    /// committed it), or [`Header::NONE`] while the log is whole. A diff
    /// from this member never reaches back below it.
    pub fn log_floor(&self) -> Header {
        self.log_floor
    }

    /// Whether some outgoing ring has messages not yet pushed or a session
    /// reset pending (for tests and drivers).
    pub fn has_pending_sends(&self) -> bool {
        self.out.iter().flatten().any(|l| l.send.ready() > 0 || l.reset_pending)
    }

    /// A one-line summary of the engine's state and its rings, for logs
    /// and failing simulation runs.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "m{} {:?} e_cur {:?} e_new {:?} acc {:?} com {:?} next {:?} synced {} log {} floor {:?} |",
            self.me,
            self.role,
            self.e_cur,
            self.e_new,
            self.accepted,
            self.committed,
            self.next,
            self.synced,
            self.log.len(),
            self.log_floor
        );
        for l in self.out.iter().flatten() {
            s += &format!(
                " out->{} s{:x} pub {} recl {} {:?};",
                l.peer,
                l.session,
                l.send.published(),
                l.send.reclaimable(),
                l.stream
            );
        }
        for (row, l) in self.inc.iter().enumerate() {
            if let Some(l) = l {
                s += &format!(
                    " in<-{} s{:x} cons {} pub {};",
                    self.members[row],
                    l.session,
                    l.rx.consumed(),
                    l.rx.published()
                );
            }
        }
        s
    }

    // ------------------------------------------------------------------
    // Inputs
    // ------------------------------------------------------------------

    /// Client request (Fig. 4): at the leader, assigns the next header of
    /// the epoch, appends the message to the log and returns the header (the
    /// ticket [`Effects::committed`] reports once it is committed).
    pub fn broadcast(&mut self, payload: &[u8]) -> Result<Header, BroadcastError> {
        if payload.len() > self.cfg.max_payload {
            return Err(BroadcastError::TooLarge { len: payload.len(), max: self.cfg.max_payload });
        }
        match self.role {
            Role::Leader => {}
            Role::Follower => return Err(BroadcastError::NotLeader { leader: Some(self.e_cur.leader) }),
            Role::Electing => return Err(BroadcastError::NotLeader { leader: None }),
        }
        let done = if self.committed.epoch == self.e_cur { self.committed.count } else { 0 };
        if self.count - done >= self.cfg.max_outstanding {
            return Err(BroadcastError::WouldBlock);
        }
        self.count += 1;
        let h = self.e_cur.header(self.count);
        let mut body = self.pool.pop().unwrap_or_default();
        body.extend_from_slice(payload);
        self.log.insert(h, body);
        self.set_accepted(h);
        Ok(h)
    }

    /// The fabric reconnected the link to `peer` (after a suspicion): writes
    /// posted before may be missing there, or `peer` may be a new
    /// incarnation with a zeroed region. The engine starts a new ring
    /// session to it (and, as leader, a fresh diff) and re-pushes its row.
    pub fn on_link_reset(&mut self, peer: MemberId) {
        if let Some(row) = self.row_of(peer)
            && let Some(link) = self.out[row].as_mut()
        {
            link.reset_pending = true;
        }
    }

    /// Runs every predicate once at time `now_ns`; appends the writes to post
    /// to `fx` and hands committed messages to `sink`. Returns the amount of
    /// work done (0 = idle until something changes or `fx.wake_at_ns`).
    pub fn poll(&mut self, now_ns: u64, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        self.now_ns = self.now_ns.max(now_ns);
        let before = (self.e_new, self.accepted, self.committed, self.my_vote);
        let mut work = self.reset_links(fx);
        self.observe_heartbeats();
        if !self.floor_ready {
            work += self.learn_floor(fx);
        }
        if self.floor_ready {
            work += self.receive(fx, sink);
        }
        work += self.roles(fx);
        work += self.commit(fx, sink);
        self.collect_garbage();
        if self.role == Role::Leader {
            self.serve_requests();
        }
        // The row goes out before ring data: a follower that finds a new
        // leader's diff must already see that leader's row (its leader bit).
        self.heartbeat();
        self.flush_row(fx);
        // Reclaim first, so slots an ack just freed are refilled at once.
        self.reclaim();
        work += self.send(fx, sink);
        fx.wake_at_ns = Some(if self.commit_dirty {
            self.next_hb_ns.min(self.next_commit_push_ns)
        } else {
            self.next_hb_ns
        });
        self.check_invariants(before);
        work
    }

    // ------------------------------------------------------------------
    // SST words
    // ------------------------------------------------------------------

    fn row_of(&self, m: MemberId) -> Option<usize> {
        self.members.binary_search(&m).ok()
    }

    fn load(&self, row: usize, col: impl Into<ColumnRange>, i: usize) -> u64 {
        self.region.load_acquire(self.layout.word(row, col, i))
    }

    fn store(&self, col: impl Into<ColumnRange>, i: usize, v: u64) {
        self.region.store_release(self.layout.word(self.my_row, col, i), v);
    }

    fn row_header(&self, row: usize, col: impl Into<ColumnRange>) -> Header {
        Header::decode(self.load(row, col, 0))
    }

    fn set_accepted(&mut self, h: Header) {
        debug_assert!(h >= self.accepted, "Accepted goes back: {:?} -> {h:?}", self.accepted);
        self.accepted = h;
        self.store(self.layout.columns.accept, 0, h.encode());
        let leader_row = self.row_of(self.e_cur.leader);
        if let Some(r) = leader_row.filter(|r| *r != self.my_row) {
            self.dirty_to[r] = true;
        }
    }

    fn set_e_new(&mut self, e: Epoch) {
        assert!(e >= self.e_new, "E_new goes back: {:?} -> {e:?}", self.e_new);
        self.e_new = e;
        self.store(self.layout.columns.e_new, 0, e.encode());
        self.dirty_all = true;
    }

    fn set_vote(&mut self, v: Vote, fx: &mut Effects) {
        assert!(v > self.my_vote, "votes only grow: {:?} -> {v:?}", self.my_vote);
        self.my_vote = v;
        for (i, w) in v.encode().into_iter().enumerate() {
            self.store(self.layout.columns.vote, i, w);
        }
        self.votes[self.my_row] = v;
        self.dirty_all = true;
        fx.notes.push(Note::Voted(v));
    }

    fn write_status(&mut self) {
        let leader = u64::from(self.role == Role::Leader) << 1;
        self.store(self.layout.columns.status, 0, u64::from(self.synced) | leader);
        self.dirty_all = true;
    }

    fn set_role(&mut self, role: Role) {
        self.role = role;
        self.write_status();
    }

    /// Whether `m` is alive and still leads `e` as far as its row shows: a
    /// leader that restarted (or abdicated) clears its leader bit, so its
    /// followers do not mistake its new incarnation's heartbeat for its own.
    fn leads(&self, m: MemberId, e: Epoch) -> bool {
        let c = self.layout.columns;
        self.row_of(m).is_some_and(|r| {
            self.alive_row(r) && self.load(r, c.status, 0) & 2 != 0 && self.row_header(r, c.e_new).epoch == e
        })
    }

    fn read_vote(&mut self, row: usize) -> Vote {
        let c = self.layout.columns.vote;
        let words = [self.load(row, c, 0), self.load(row, c, 1), self.load(row, c, 2)];
        if let Some(v) = Vote::decode(words) {
            self.votes[row] = v;
        }
        self.votes[row]
    }

    fn alive(&self, m: MemberId) -> bool {
        self.row_of(m).is_some_and(|r| self.alive_row(r))
    }

    /// [`alive`](Self::alive) by row (no member lookup).
    fn alive_row(&self, r: usize) -> bool {
        r == self.my_row || self.now_ns.saturating_sub(self.hb_changed_ns[r]) <= self.cfg.heartbeat_timeout_ns
    }

    // ------------------------------------------------------------------
    // Links, heartbeats, rows
    // ------------------------------------------------------------------

    /// Starts the ring sessions asked for: a fresh ring whose counter is
    /// zeroed at the receiver *before* the new session number reaches it
    /// (so a receiver that sees the new session sees no old counter).
    fn reset_links(&mut self, fx: &mut Effects) -> usize {
        let mut work = 0;
        for row in 0..self.out.len() {
            let Some(link) = self.out[row].as_mut() else { continue };
            link.quiet = false;
            if !link.reset_pending {
                continue;
            }
            link.reset_pending = false;
            link.quiet = true;
            link.generation += 1;
            link.session = ((self.cfg.incarnation as u32 & 0x7FFF) << 16) | (link.generation & 0xFFFF);
            let ring = self.layout.ring_offset(self.my_row, row);
            let (producer, send) = ordo_ring::sender(self.region.clone(), ring, self.layout.ring);
            link.producer = producer;
            link.send = send;
            self.region.store_release(ring, 0);
            let (session, peer) = (link.session, link.peer);
            self.store(self.layout.columns.ring_session, row, u64::from(session));
            fx.pushes.push(Push { to: Target::Peer(peer), offset: ring, len: 8 });
            fx.pushes.push(self.row_push(Target::Peer(peer)));
            let stream = if self.role == Role::Leader { self.diff_stream(row, false) } else { Stream::Idle };
            let request = self.load(row, self.layout.columns.diff_request, 0);
            let link = self.out[row].as_mut().expect("link");
            link.stream = stream;
            link.served_request = request;
            work += 1;
        }
        work
    }

    fn row_push(&self, to: Target) -> Push {
        let (offset, len) = self.sst.range(ColumnRange { offset: 0, len: self.layout.row_used });
        Push { to, offset, len }
    }

    fn observe_heartbeats(&mut self) {
        for row in 0..self.members.len() {
            if row == self.my_row {
                continue;
            }
            let hb = self.load(row, self.layout.columns.heartbeat, 0);
            if hb != self.last_hb[row] {
                self.last_hb[row] = hb;
                self.hb_changed_ns[row] = self.now_ns;
            }
        }
    }

    fn heartbeat(&mut self) {
        if self.now_ns >= self.next_hb_ns {
            self.heartbeat += 1;
            self.store(self.layout.columns.heartbeat, 0, self.heartbeat);
            self.next_hb_ns = self.now_ns + self.cfg.heartbeat_interval_ns;
            self.dirty_all = true;
        }
    }

    fn flush_row(&mut self, fx: &mut Effects) {
        if self.commit_dirty && self.now_ns >= self.next_commit_push_ns {
            self.dirty_all = true;
        }
        if self.dirty_all {
            self.commit_dirty = false;
            self.next_commit_push_ns = self.now_ns + self.cfg.commit_push_interval_ns;
            fx.pushes.push(self.row_push(Target::All));
        } else {
            // Only Accept and ring_ack change without a full push (every
            // other column sets `dirty_all`; Commit goes out with the next
            // periodic push, `commit_dirty` stays set): push just them.
            let (offset, len) = self.sst.range(self.layout.ack_push);
            for row in 0..self.dirty_to.len() {
                if self.dirty_to[row] {
                    fx.pushes.push(Push { to: Target::Peer(self.members[row]), offset, len });
                }
            }
        }
        self.dirty_all = false;
        self.dirty_to.iter_mut().for_each(|d| *d = false);
    }

    // ------------------------------------------------------------------
    // Restarts: learn the epoch floor, then ask for a full diff
    // ------------------------------------------------------------------

    /// A restarted member forgot its promises. Any epoch whose quorum
    /// counted it also holds f other members; hearing from f+1 synced
    /// others (rows in this incarnation's zeroed region were all pushed
    /// after the restart) meets one of them, so the largest epoch they show
    /// bounds every promise this member made before.
    fn learn_floor(&mut self, fx: &mut Effects) -> usize {
        let c = self.layout.columns;
        let mut heard = 0;
        let mut floor = self.e_new;
        for row in 0..self.members.len() {
            if row == self.my_row
                || self.load(row, c.heartbeat, 0) == 0
                || self.load(row, c.status, 0) & 1 == 0
            {
                continue;
            }
            heard += 1;
            floor = floor
                .max(self.row_header(row, c.e_new).epoch)
                .max(self.row_header(row, c.accept).epoch)
                .max(self.row_header(row, c.commit).epoch)
                .max(self.read_vote(row).e_new);
        }
        if heard < self.cfg.f() + 1 {
            return 0;
        }
        self.floor_ready = true;
        if floor > self.e_new {
            self.set_e_new(floor);
        }
        self.request_diff(fx);
        1
    }

    fn request_diff(&mut self, fx: &mut Effects) {
        self.request_seq += 1;
        let word = (self.cfg.incarnation << 32) | self.request_seq;
        self.store(self.layout.columns.diff_request, 0, word);
        self.dirty_all = true;
        fx.notes.push(Note::RequestedDiff(word));
    }

    // ------------------------------------------------------------------
    // Accepting (Fig. 5)
    // ------------------------------------------------------------------

    fn receive(&mut self, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        let mut work = 0;
        for s in 0..self.inc.len() {
            if self.inc[s].is_none() {
                continue;
            }
            let session = self.load(s, self.layout.columns.ring_session, self.my_row) as u32;
            let link = self.inc[s].as_mut().expect("link");
            if session != link.session {
                link.session = session;
                link.rx = RingReceiver::new(
                    self.region.clone(),
                    self.layout.ring_offset(s, self.my_row),
                    self.layout.ring,
                );
                link.clear_staging();
                self.store(self.layout.columns.ring_ack, s, u64::from(session) << 32);
                self.dirty_to[s] = true;
            }
            if session == 0 {
                continue;
            }
            let link = self.inc[s].as_mut().expect("link");
            self.metas.clear();
            // Errors here are the previous session's leftovers (a counter
            // not yet reset): wait for the new session's writes.
            if link.rx.scan(u64::MAX, &mut self.metas).is_err() {
                continue;
            }
            // Reused buffers: no allocation per message once warm.
            let mut msgs = std::mem::take(&mut self.msgs);
            msgs.clear();
            for meta in &self.metas {
                if meta.flags != session {
                    break; // an older or newer session's slot: not ours yet
                }
                msgs.push(parse(link.rx.payload(meta), &mut self.pool));
            }
            link.rx.consume(msgs.len() as u64);
            if msgs.is_empty() {
                self.msgs = msgs;
                continue;
            }
            let consumed = link.rx.consumed();
            self.store(
                self.layout.columns.ring_ack,
                s,
                (u64::from(session) << 32) | (consumed & 0xFFFF_FFFF),
            );
            self.dirty_to[s] = true;
            work += msgs.len();
            let sender = self.members[s];
            let mut latest = None;
            for msg in msgs.drain(..) {
                match msg {
                    Ok(Wire::Normal { header, body }) => {
                        // Fig. 5 line 47: only the current epoch's messages.
                        if header.epoch == self.e_new
                            && header.epoch == self.e_cur
                            && sender == header.epoch.leader
                            && header > self.accepted
                            && header.count > 0
                        {
                            if let Some(old) = self.log.insert(header, body) {
                                recycle(&mut self.pool, old);
                            }
                            latest = Some(header);
                        } else {
                            recycle(&mut self.pool, body);
                        }
                    }
                    Ok(Wire::DiffEntry { serial, header, body }) => {
                        let link = self.inc[s].as_mut().expect("link");
                        if link.staging_serial != Some(serial) {
                            link.staging.clear();
                            link.staging_serial = Some(serial);
                        }
                        link.staging.push((header, body));
                    }
                    Ok(Wire::SnapChunk { serial, header, offset, total, body }) => {
                        let link = self.inc[s].as_mut().expect("link");
                        if link.snap_serial != Some(serial) || offset == 0 {
                            link.snap_serial = Some(serial);
                            link.snap_header = header;
                            link.snap_total = total;
                            link.snap = Vec::new();
                            link.snap_ok = true;
                        }
                        if offset != link.snap.len() as u64
                            || header != link.snap_header
                            || total != link.snap_total
                            || offset.saturating_add(body.len() as u64) > total
                        {
                            link.snap_ok = false;
                        } else {
                            link.snap.extend_from_slice(&body);
                        }
                        recycle(&mut self.pool, body);
                    }
                    Ok(Wire::DiffEnd { serial, epoch, base, upto, entries }) => {
                        if let Some(h) = latest.take() {
                            self.set_accepted(h);
                        }
                        let link = self.inc[s].as_mut().expect("link");
                        let staged = if link.staging_serial == Some(serial) {
                            std::mem::take(&mut link.staging)
                        } else {
                            Vec::new()
                        };
                        let snapshot = (link.snap_serial == Some(serial)
                            && link.snap_ok
                            && link.snap_header == base
                            && link.snap.len() as u64 == link.snap_total)
                            .then(|| std::mem::take(&mut link.snap));
                        link.clear_staging();
                        let diff = Diff { epoch, base, upto, entries, staged, snapshot };
                        self.on_diff(sender, diff, fx, sink);
                    }
                    Err(what) => fx.notes.push(Note::BadMessage { sender, what }),
                }
            }
            self.msgs = msgs;
            // Acknowledge only the latest header of the scan: FIFO covers
            // the earlier ones (§3.2).
            if let Some(h) = latest {
                self.set_accepted(h);
            }
        }
        work
    }

    /// Fig. 5, lines 54-66: diff acceptance and transition into broadcast;
    /// with a snapshot (state transfer), the application state replaces
    /// the committed prefix up to `base`.
    fn on_diff(&mut self, sender: MemberId, diff: Diff, fx: &mut Effects, sink: &mut impl DeliverySink) {
        let Diff { epoch, base, upto, entries, staged, snapshot } = diff;
        let reject = |fx: &mut Effects, reason| fx.notes.push(Note::DiffRejected { epoch, reason });
        if sender != epoch.leader || staged.len() != entries as usize {
            return reject(fx, "malformed");
        }
        if self.e_new > epoch {
            return reject(fx, "promised a bigger epoch");
        }
        let new_accepted = if upto.epoch == epoch { upto } else { epoch.header(0) };
        if self.synced && self.e_cur == epoch && self.accepted >= new_accepted {
            return; // nothing new (a repeated diff)
        }
        // The diff must reach back to our committed header, or carry a
        // snapshot of the (committed) prefix up to its base. A follower of
        // this epoch that accepted `base` already holds the leader's log up
        // to it (FIFO from the same leader, who only appends): it keeps its
        // log up to Accepted and needs no snapshot.
        let mut keep = self.committed;
        let restore = if base > self.committed && self.synced && self.e_cur == epoch && self.accepted >= base
        {
            keep = self.accepted;
            None
        } else if base > self.committed {
            match snapshot {
                Some(bytes) if base <= new_accepted => Some(bytes),
                _ => {
                    reject(fx, "does not reach back to our committed header");
                    return self.request_diff(fx);
                }
            }
        } else {
            None
        };
        let joined = self.e_cur != epoch;
        if epoch > self.e_new {
            self.set_e_new(epoch);
        }
        self.e_cur = epoch;
        if self.role == Role::Leader {
            self.stop_streams();
        }
        self.set_role(Role::Follower);
        if let Some(bytes) = restore {
            // State transfer: `base` is committed (the leader's Committed
            // when it took the snapshot), so it becomes ours; what we hold
            // below it is superseded, above it uncommitted.
            self.log.clear();
            sink.restore(base, &bytes);
            self.committed = base;
            self.log_floor = base;
            self.store(self.layout.columns.commit, 0, base.encode());
            self.commit_dirty = true;
            fx.notes.push(Note::Restored { header: base, bytes: bytes.len() });
        }
        // Drop the uncommitted suffix, then apply the diff (line 62-63).
        let keep = keep.max(self.committed);
        let _ = self.log.split_off(&keep.succ());
        for (h, body) in staged {
            if h > keep {
                self.log.insert(h, body);
            }
        }
        // Every path here has new_accepted > Accepted: another epoch (ours
        // is older), a restarted member (nothing), or a newer diff.
        assert!(new_accepted > self.accepted, "a diff that takes Accepted back");
        self.accepted = new_accepted;
        self.store(self.layout.columns.accept, 0, self.accepted.encode());
        if let Some(r) = self.row_of(epoch.leader) {
            self.dirty_to[r] = true;
        }
        if joined {
            self.next = epoch.header(0);
        }
        if self.next <= self.committed {
            // A snapshot covered the diff commit (and maybe more) already.
            self.next = self.committed.succ();
        }
        if !self.synced {
            self.synced = true;
            self.write_status();
        }
        self.dirty_all = true;
        fx.notes.push(Note::JoinedEpoch(epoch));
    }

    // ------------------------------------------------------------------
    // Roles and election (Fig. 7)
    // ------------------------------------------------------------------

    fn roles(&mut self, fx: &mut Effects) -> usize {
        let c = self.layout.columns;
        match self.role {
            Role::Follower => {
                if !self.leads(self.e_cur.leader, self.e_cur) {
                    self.set_role(Role::Electing);
                    self.stall = None;
                }
            }
            Role::Leader => {
                let bigger = (0..self.members.len()).any(|r| {
                    r != self.my_row && self.row_header(r, c.e_new).epoch > self.e_cur && self.alive_row(r)
                });
                if bigger {
                    fx.notes.push(Note::Abdicated(self.e_cur));
                    self.set_role(Role::Electing);
                    self.stop_streams();
                    self.vote_for_self(fx);
                    return 1;
                }
            }
            Role::Electing => {
                // A transient delay: our leader is back and we never moved on.
                let leader = self.e_cur.leader;
                if self.synced
                    && self.e_cur != Epoch::NONE
                    && self.e_new == self.e_cur
                    && self.accepted.epoch == self.e_cur
                    && leader != self.me
                    && self.leads(leader, self.e_cur)
                {
                    self.set_role(Role::Follower);
                    return 1;
                }
            }
        }
        if self.role == Role::Electing && self.synced { self.election_step(fx) } else { 0 }
    }

    fn stop_streams(&mut self) {
        for link in self.out.iter_mut().flatten() {
            link.stream = Stream::Idle;
        }
    }

    fn max_epoch_seen(&mut self) -> Epoch {
        let c = self.layout.columns;
        let mut e = self.e_new.max(self.e_cur);
        for row in 0..self.members.len() {
            e = e.max(self.row_header(row, c.e_new).epoch).max(self.read_vote(row).e_new);
        }
        e
    }

    fn vote_for_self(&mut self, fx: &mut Effects) {
        let e = Epoch::next_for(self.max_epoch_seen(), self.me);
        self.set_e_new(e);
        self.set_vote(Vote { e_new: e, acpt: self.accepted }, fx);
        self.stall = Some((self.my_vote, self.now_ns));
    }

    /// One step of the fixed-point election (Fig. 7, lines 96-127).
    fn election_step(&mut self, fx: &mut Effects) -> usize {
        let mut mx: Option<Vote> = None;
        for row in 0..self.members.len() {
            let v = if row == self.my_row { self.my_vote } else { self.read_vote(row) };
            if !v.is_none() && v.e_new >= self.e_new && mx.is_none_or(|m| v > m) {
                mx = Some(v);
            }
        }
        let stagger = self.cfg.election_timeout_ns * self.my_row as u64 / self.members.len() as u64;
        let stalled = match (mx, self.stall) {
            // The candidate won and is sending us its diff (which may take
            // a while for a long log): wait for it.
            (Some(m), _) if self.leads(m.candidate(), m.e_new) => {
                self.stall = Some((m, self.now_ns));
                false
            }
            (Some(m), Some((s, since))) if m == s => {
                self.now_ns.saturating_sub(since) > self.cfg.election_timeout_ns + stagger
            }
            (Some(m), _) => {
                self.stall = Some((m, self.now_ns));
                false
            }
            (None, _) => false,
        };
        let mut work = 0;
        match mx {
            None => {
                self.vote_for_self(fx);
                work += 1;
            }
            Some(m) if m.candidate() == self.me => {
                if stalled {
                    self.vote_for_self(fx);
                    work += 1;
                }
            }
            Some(m) => {
                // Rule 1 (line 100): the best candidate timed out or is less
                // up to date than we are; rule 2 (line 106): join it.
                if stalled || !self.alive(m.candidate()) || self.accepted > m.acpt {
                    self.vote_for_self(fx);
                    work += 1;
                } else if m > self.my_vote {
                    if m.e_new > self.e_new {
                        self.set_e_new(m.e_new);
                    }
                    self.set_vote(m, fx);
                    work += 1;
                }
            }
        }
        // Lines 114-127: a quorum of identical votes for us.
        if self.my_vote.candidate() == self.me && self.my_vote.e_new == self.e_new {
            let mine = self.my_vote;
            let n = (0..self.members.len())
                .filter(|r| if *r == self.my_row { true } else { self.read_vote(*r) == mine })
                .count();
            if n >= self.quorum {
                self.become_leader(fx);
                work += 1;
            }
        }
        work
    }

    fn become_leader(&mut self, fx: &mut Effects) {
        let e = self.e_new;
        self.set_role(Role::Leader);
        self.e_cur = e;
        self.count = 0;
        // The leader is up to date: its own log is the new epoch's history.
        // It "accepts" its own diff (§3.4).
        self.set_accepted(e.header(0));
        self.next = e.header(0);
        for row in 0..self.out.len() {
            if self.out[row].is_some() {
                let stream = self.diff_stream(row, false);
                let request = self.load(row, self.layout.columns.diff_request, 0);
                let link = self.out[row].as_mut().expect("link");
                link.stream = stream;
                link.served_request = request;
            }
        }
        self.stall = None;
        self.dirty_all = true;
        fx.notes.push(Note::BecameLeader(e));
    }

    /// A diff for the member of `row`: every log entry after its committed
    /// header (after nothing when `full`), up to the end of the log.
    fn diff_stream(&mut self, row: usize, full: bool) -> Stream {
        let want = if full { Header::NONE } else { self.row_header(row, self.layout.columns.commit) };
        let upto = self.log.last_key_value().map_or(Header::NONE, |(h, _)| *h).max(self.e_cur.header(0));
        let link = self.out[row].as_mut().expect("link");
        link.next_serial = (link.next_serial + 1) & 0xFF_FFFF;
        link.snapshot = None;
        let (serial, epoch) = (link.next_serial, self.e_cur);
        if want < self.log_floor {
            // Entries it needs are gone: state transfer. The snapshot, its
            // base and `upto` are fixed when it is taken (`send`).
            let none = Header::NONE;
            return Stream::Diff {
                serial,
                epoch,
                base: none,
                upto: none,
                after: none,
                sent: 0,
                snap: Snap::Pending,
            };
        }
        let base = want.min(upto);
        Stream::Diff { serial, epoch, base, upto, after: base, sent: 0, snap: Snap::No }
    }

    fn serve_requests(&mut self) {
        for row in 0..self.out.len() {
            if self.out[row].is_none() {
                continue;
            }
            let request = self.load(row, self.layout.columns.diff_request, 0);
            let served = self.out[row].as_ref().expect("link").served_request;
            if request != 0 && request != served {
                // A restarted member (not synced) gets a full diff; a synced
                // one (it rejected a diff, or it synced from an earlier diff
                // since it asked) one from its Commit header, which avoids a
                // second state transfer.
                let synced = self.load(row, self.layout.columns.status, 0) & 1 != 0;
                let stream = self.diff_stream(row, !synced);
                let link = self.out[row].as_mut().expect("link");
                link.stream = stream;
                link.served_request = request;
            }
        }
    }

    // ------------------------------------------------------------------
    // Committing (Fig. 6)
    // ------------------------------------------------------------------

    fn commit(&mut self, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        let c = self.layout.columns;
        let threshold = match self.role {
            Role::Leader => {
                // The quorum-th largest Accept of the current epoch (line 74).
                // (No allocation: this runs on every poll.)
                let mut acks = [Header::NONE; crate::config::MAX_MEMBERS];
                let mut k = 0;
                for r in 0..self.members.len() {
                    let h = if r == self.my_row { self.accepted } else { self.row_header(r, c.accept) };
                    if h.epoch == self.e_cur {
                        acks[k] = h;
                        k += 1;
                    }
                }
                if k < self.quorum {
                    return 0;
                }
                let acks = &mut acks[..k];
                acks.sort_unstable_by(|a, b| b.cmp(a));
                acks[self.quorum - 1]
            }
            Role::Follower => {
                let Some(r) = self.row_of(self.e_cur.leader) else { return 0 };
                let h = self.row_header(r, c.commit);
                if h.epoch != self.e_cur {
                    return 0;
                }
                h
            }
            Role::Electing => return 0,
        };
        let mut work = 0;
        while self.next <= threshold {
            if self.next.count == 0 {
                // Diff commit (line 83): everything before it, in order.
                let upto = self.next;
                let from = self.committed;
                let batch: Vec<Header> =
                    self.log.range((Bound::Excluded(from), Bound::Excluded(upto))).map(|(h, _)| *h).collect();
                for h in batch {
                    self.deliver(h, fx, sink);
                }
                self.committed = upto;
            } else if self.log.contains_key(&self.next) {
                let h = self.next;
                self.deliver(h, fx, sink);
                self.committed = h;
            } else {
                break; // not received yet; the ring brings it
            }
            self.next = self.next.succ();
            work += 1;
        }
        if work > 0 {
            // Commit pushes are periodic, off the critical path (Fig. 6):
            // the row goes out at most every `commit_push_interval_ns`
            // (or with anything else that pushes it).
            self.store(c.commit, 0, self.committed.encode());
            self.commit_dirty = true;
        }
        work
    }

    /// Log garbage collection ([`Config::log_gc`]; crate docs, "Log garbage
    /// collection"): drops the entries at or below the smallest Commit
    /// column of the members not suspected (own row: `Committed`), but
    /// never an entry a live member's ring stream has still to send. A
    /// suspected member's stream that falls below the new floor becomes a
    /// state-transfer diff. A live row not heard from yet reads
    /// `Header::NONE` and drops nothing.
    fn collect_garbage(&mut self) {
        // Collect in batches (this runs on every poll).
        if !self.cfg.log_gc || !self.synced || self.log.len() < GC_BATCH {
            return;
        }
        let c = self.layout.columns;
        let mut floor = self.committed;
        for r in 0..self.members.len() {
            if r != self.my_row && self.alive_row(r) {
                floor = floor.min(self.row_header(r, c.commit));
            }
        }
        for r in 0..self.out.len() {
            if let Some(pos) = self.out[r].as_ref().and_then(|l| stream_position(l.stream))
                && self.alive_row(r)
            {
                floor = floor.min(pos);
            }
        }
        if floor <= self.log_floor {
            return;
        }
        while self.log.first_key_value().is_some_and(|(h, _)| *h <= floor) {
            if let Some((_, body)) = self.log.pop_first() {
                recycle(&mut self.pool, body);
            }
        }
        self.log_floor = floor;
        // Suspected members whose stream needs dropped entries get a
        // snapshot instead, should they come back.
        for r in 0..self.out.len() {
            if let Some(pos) = self.out[r].as_ref().and_then(|l| stream_position(l.stream))
                && pos < floor
            {
                let stream = self.diff_stream(r, false);
                self.out[r].as_mut().expect("link").stream = stream;
            }
        }
    }

    fn deliver(&mut self, h: Header, fx: &mut Effects, sink: &mut impl DeliverySink) {
        assert!(h > self.committed, "delivering {h:?} at or below Committed {:?}", self.committed);
        let body = self.log.get(&h).expect("delivered entry is in the log");
        sink.deliver(h, body);
        self.delivered += 1;
        if h.epoch.leader == self.me {
            fx.committed.push(h);
        }
    }

    // ------------------------------------------------------------------
    // Broadcasting over the rings (Fig. 4) and the reuse rule
    // ------------------------------------------------------------------

    fn send(&mut self, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        let mut work = 0;
        // One snapshot per poll, shared by every diff that needs one.
        let mut taken: Option<Arc<[u8]>> = None;
        // Links are used in place (no move per poll); the log is read only.
        let (log, committed, accepted, e_cur) = (&self.log, self.committed, self.accepted, self.e_cur);
        let chunk = self.cfg.max_payload;
        for link in self.out.iter_mut().flatten() {
            if let Stream::Diff { serial, epoch, snap: Snap::Pending, .. } = link.stream
                && !link.quiet
            {
                // The application is at `Committed` now (deliveries happen
                // inside poll): the snapshot covers exactly that prefix, and
                // the log holds every entry after it (floor ≤ Committed).
                let bytes = taken.get_or_insert_with(|| sink.snapshot().into()).clone();
                let base = committed;
                let upto = accepted.max(base);
                fx.notes.push(Note::SnapshotSent { to: link.peer, header: base, bytes: bytes.len() });
                link.snapshot = Some(bytes);
                link.stream = Stream::Diff {
                    serial,
                    epoch,
                    base,
                    upto,
                    after: base,
                    sent: 0,
                    snap: Snap::Sending { chunks: 0 },
                };
            }
            if !link.quiet {
                work += pump(log, e_cur, accepted, chunk, link);
                if let Some(plan) = link.send.plan(u64::MAX) {
                    for (offset, len) in plan.writes() {
                        fx.pushes.push(Push { to: Target::Peer(link.peer), offset, len });
                    }
                    work += 1;
                }
            }
        }
        work
    }
}

/// Fills free slots of `link`'s ring from its stream (the leader's `log`,
/// epoch `e_cur`, whose last broadcast header is `accepted`).
fn pump(
    log: &BTreeMap<Header, Vec<u8>>,
    e_cur: Epoch,
    accepted: Header,
    chunk: usize,
    link: &mut OutLink,
) -> usize {
    /// Where a message's body comes from.
    enum Body {
        Empty,
        Log(Header),
        Snap(usize, usize),
    }
    let mut work = 0;
    loop {
        let (wire_words, body, next_stream) = match link.stream {
            Stream::Idle | Stream::Diff { snap: Snap::Pending, .. } => return work,
            Stream::Diff { serial, epoch, upto, after, sent, base, snap } => {
                let snap_len = link.snapshot.as_ref().map_or(0, |b| b.len());
                let chunks_total = snap_len.div_ceil(chunk).max(1) as u32;
                match snap {
                    Snap::Sending { chunks } if chunks < chunks_total => {
                        let from = chunks as usize * chunk;
                        let to = (from + chunk).min(snap_len);
                        let w0 = KIND_SNAP_CHUNK | (u64::from(serial) << 8);
                        let next = Stream::Diff {
                            serial,
                            epoch,
                            base,
                            upto,
                            after,
                            sent,
                            snap: Snap::Sending { chunks: chunks + 1 },
                        };
                        ([w0, base.encode(), from as u64, snap_len as u64], Body::Snap(from, to), next)
                    }
                    _ => match log.range((Bound::Excluded(after), Bound::Included(upto))).next() {
                        Some((h, _)) => {
                            let next =
                                Stream::Diff { serial, epoch, base, upto, after: *h, sent: sent + 1, snap };
                            (
                                [KIND_DIFF_ENTRY | (u64::from(serial) << 8), h.encode(), 0, 0],
                                Body::Log(*h),
                                next,
                            )
                        }
                        None => {
                            let w0 = KIND_DIFF_END | (u64::from(serial) << 8) | (u64::from(sent) << 32);
                            let after = if upto.epoch == epoch { upto } else { epoch.header(0) };
                            (
                                [w0, epoch.header(0).encode(), base.encode(), upto.encode()],
                                Body::Empty,
                                Stream::Normal { after },
                            )
                        }
                    },
                }
            }
            // Nothing broadcast after `after` (the common case).
            Stream::Normal { after } if after >= accepted => return work,
            Stream::Normal { after } => {
                let next = log.range((Bound::Excluded(after), Bound::Unbounded)).next();
                match next {
                    Some((h, _)) if h.epoch == e_cur => {
                        ([KIND_NORMAL, h.encode(), 0, 0], Body::Log(*h), Stream::Normal { after: *h })
                    }
                    _ => return work,
                }
            }
        };
        let Some(mut slot) = link.producer.try_acquire() else { return work };
        let buf = slot.payload();
        for (i, w) in wire_words.iter().enumerate() {
            buf[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        let body: &[u8] = match body {
            Body::Empty => &[],
            Body::Log(h) => log[&h].as_slice(),
            Body::Snap(from, to) => &link.snapshot.as_ref().expect("a snapshot is being sent")[from..to],
        };
        buf[WIRE_HEADER_LEN..WIRE_HEADER_LEN + body.len()].copy_from_slice(body);
        slot.commit(WIRE_HEADER_LEN + body.len(), link.session);
        work += 1;
        if matches!(next_stream, Stream::Normal { .. }) {
            link.snapshot = None;
        }
        link.stream = next_stream;
    }
}

impl Engine {
    /// The reuse rule: a slot of the ring to `r` is free once `r`
    /// consumed its message in the same session (per receiver, so a dead
    /// follower blocks only its own ring; the leader's log holds what it
    /// has not received).
    fn reclaim(&mut self) {
        for row in 0..self.out.len() {
            let Some(link) = self.out[row].as_ref() else { continue };
            if link.quiet || link.reset_pending {
                continue;
            }
            let ack = self.load(row, self.layout.columns.ring_ack, self.my_row);
            if (ack >> 32) as u32 == link.session {
                let consumed = (ack & 0xFFFF_FFFF).min(link.send.published());
                if consumed > link.send.reclaimable() {
                    link.send.set_reclaimable(consumed);
                }
            }
        }
    }

    fn check_invariants(&self, before: (Epoch, Header, Header, Vote)) {
        assert!(self.e_cur <= self.e_new, "E_cur {:?} > E_new {:?}", self.e_cur, self.e_new);
        assert!(self.e_new >= before.0, "E_new went back");
        assert!(self.accepted >= before.1, "Accepted went back");
        assert!(self.committed >= before.2, "Committed went back");
        assert!(self.my_vote >= before.3, "vote went back");
        assert!(self.committed < self.next, "Committed {:?} ≥ Next {:?}", self.committed, self.next);
        assert!(self.log_floor <= self.committed, "log floor {:?} above Committed", self.log_floor);
        assert!(
            self.log.first_key_value().is_none_or(|(h, _)| *h > self.log_floor),
            "an entry at or below the log floor {:?} is kept",
            self.log_floor
        );
        if self.role == Role::Leader {
            assert!(self.e_cur == self.e_new && self.e_cur.leader == self.me, "leader of a foreign epoch");
        }
        if self.role != Role::Electing {
            assert!(self.synced, "a member that is not synced has a role");
        }
    }
}

/// The last log entry `stream` has put in its ring, if it has still log
/// entries after it to send (those must stay in the log).
fn stream_position(stream: Stream) -> Option<Header> {
    match stream {
        Stream::Idle | Stream::Diff { snap: Snap::Pending, .. } => None,
        Stream::Diff { after, .. } | Stream::Normal { after } => Some(after),
    }
}

/// Spare message bodies kept for reuse, at most, and the largest kept
/// (bounds the pool's memory to 1 MiB).
const POOL_MAX: usize = 256;
const POOL_BODY_MAX: usize = 4096;

/// Returns a body to the pool (cleared).
fn recycle(pool: &mut Vec<Vec<u8>>, mut body: Vec<u8>) {
    if pool.len() < POOL_MAX && body.capacity() <= POOL_BODY_MAX {
        body.clear();
        pool.push(body);
    }
}

/// Parses a ring payload (never panics on a peer's bytes); the body goes
/// into a buffer from `pool`.
fn parse(bytes: &[u8], pool: &mut Vec<Vec<u8>>) -> Result<Wire, String> {
    if bytes.len() < WIRE_HEADER_LEN {
        return Err(format!("message of {} bytes is shorter than its header", bytes.len()));
    }
    let w = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let kind = w(0) & 0xFF;
    if !(KIND_NORMAL..=KIND_SNAP_CHUNK).contains(&kind) {
        return Err(format!("unknown message kind {kind}"));
    }
    let mut body = pool.pop().unwrap_or_default();
    body.extend_from_slice(&bytes[WIRE_HEADER_LEN..]);
    let serial = ((w(0) >> 8) & 0xFF_FFFF) as u32;
    match w(0) & 0xFF {
        KIND_NORMAL => Ok(Wire::Normal { header: Header::decode(w(1)), body }),
        KIND_DIFF_ENTRY => Ok(Wire::DiffEntry { serial, header: Header::decode(w(1)), body }),
        KIND_SNAP_CHUNK => {
            Ok(Wire::SnapChunk { serial, header: Header::decode(w(1)), offset: w(2), total: w(3), body })
        }
        KIND_DIFF_END => Ok(Wire::DiffEnd {
            serial,
            epoch: Header::decode(w(1)).epoch,
            base: Header::decode(w(2)),
            upto: Header::decode(w(3)),
            entries: (w(0) >> 32) as u32,
        }),
        k => Err(format!("unknown message kind {k}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(me: MemberId) -> Engine {
        let cfg = Config::new(vec![0, 1, 2], me);
        let region = Region::new_heap(Layout::new(&cfg).region_len);
        Engine::new(cfg, region, 0).expect("valid")
    }

    /// The first poll starts a ring session per peer (zero the receiver's
    /// counter, then the row carrying the new session number), votes, and
    /// pushes the row (vote, heartbeat) to everyone; no ring data yet.
    #[test]
    fn first_poll_effects() {
        let mut e = engine(1);
        let mut fx = Effects::default();
        let work = e.poll(0, &mut fx, &mut |_: Header, _: &[u8]| panic!("nothing to deliver"));
        assert!(work > 0);
        let l = e.layout().clone();
        let row = Push { to: Target::All, offset: l.sst.row_stride(), len: l.row_used };
        let expected = vec![
            Push { to: Target::Peer(0), offset: l.ring_offset(1, 0), len: 8 },
            Push { to: Target::Peer(0), ..row },
            Push { to: Target::Peer(2), offset: l.ring_offset(1, 2), len: 8 },
            Push { to: Target::Peer(2), ..row },
            row,
        ];
        assert_eq!(fx.pushes, expected);
        assert_eq!(fx.notes, vec![Note::Voted(Vote { e_new: Epoch::new(0, 1), acpt: Header::NONE })]);
        assert_eq!(fx.wake_at_ns, Some(e.config().heartbeat_interval_ns));
        assert_eq!(e.broadcast(b"x"), Err(BroadcastError::NotLeader { leader: None }));
    }

    /// A failure-free group driven in lockstep (every push lands before the
    /// next poll) under endless load, with log garbage collection on: every
    /// member delivers every message in order and no log grows beyond the
    /// outstanding window plus a small constant.
    #[test]
    fn log_gc_bounds_the_log_under_endless_load() {
        const MESSAGES: u64 = 100_000;
        let members: Vec<MemberId> = vec![0, 1, 2];
        let mut engines: Vec<Engine> = members
            .iter()
            .map(|&me| {
                let mut cfg = Config::new(members.clone(), me);
                cfg.log_gc = true;
                // Commit columns pushed at once: the bound below holds no
                // allowance for messages committed within a push interval.
                cfg.commit_push_interval_ns = 0;
                let region = Region::new_heap(Layout::new(&cfg).region_len);
                Engine::new(cfg, region, 0).expect("valid")
            })
            .collect();
        let bound = engines[0].config().max_outstanding as usize + engines[0].config().window + GC_BATCH + 8;
        let mut delivered: Vec<Vec<(Header, u64)>> = vec![Vec::new(); members.len()];
        let (mut sent, mut max_log, mut now) = (0u64, 0usize, 0u64);
        let mut fx = Effects::default();
        let mut buf = Vec::new();
        while delivered.iter().any(|d| (d.len() as u64) < MESSAGES) {
            now += 1_000;
            assert!(
                now < 10_000_000_000,
                "stuck: {:?}",
                engines.iter().map(Engine::describe).collect::<Vec<_>>()
            );
            for i in 0..engines.len() {
                if engines[i].role() == Role::Leader {
                    while sent < MESSAGES {
                        match engines[i].broadcast(&sent.to_le_bytes()) {
                            Ok(_) => sent += 1,
                            Err(BroadcastError::WouldBlock) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                fx.clear();
                let sink = &mut delivered[i];
                engines[i].poll(now, &mut fx, &mut |h: Header, p: &[u8]| {
                    sink.push((h, u64::from_le_bytes(p.try_into().expect("8 bytes"))))
                });
                for push in &fx.pushes {
                    buf.resize(push.len, 0);
                    engines[i].region.read_bytes(push.offset, &mut buf);
                    for (j, e) in engines.iter().enumerate() {
                        let hit = match push.to {
                            Target::All => j != i,
                            Target::Peer(m) => e.member() == m,
                        };
                        if hit {
                            e.region.write_bytes(push.offset, &buf);
                        }
                    }
                }
                max_log = max_log.max(engines[i].log_len());
            }
        }
        assert!(max_log <= bound, "a log reached {max_log} entries (bound {bound})");
        for d in &delivered {
            assert_eq!(d.len() as u64, MESSAGES);
            assert!(d.iter().map(|(_, v)| *v).eq(0..MESSAGES), "delivered out of order");
            assert!(d.windows(2).all(|w| w[0].0 < w[1].0), "headers not increasing");
        }
        assert!(engines.iter().all(|e| e.log_floor() > Header::NONE));
    }

    #[test]
    fn bad_ring_messages_are_errors_not_panics() {
        let pool = &mut Vec::new();
        assert!(parse(&[0; 3], pool).is_err());
        assert!(parse(&[9; 40], pool).is_err());
        let mut ok = vec![0u8; 40];
        ok[0] = KIND_NORMAL as u8;
        assert!(matches!(parse(&ok, pool), Ok(Wire::Normal { .. })));
    }

    #[test]
    fn bad_configs_are_rejected() {
        let region = Region::new_heap(1 << 20);
        assert!(Engine::new(Config::new(vec![0, 1], 0), region.clone(), 0).is_err());
        assert!(Engine::new(Config::new(vec![0, 1, 1], 0), region.clone(), 0).is_err());
        assert!(Engine::new(Config::new(vec![0, 1, 2], 7), region.clone(), 0).is_err());
        assert!(Engine::new(Config::new(vec![0, 1, 300], 0), region, 0).is_err());
        let cfg = Config::new(vec![0, 1, 2], 0);
        let small = Region::new_heap(64);
        assert!(matches!(Engine::new(cfg, small, 0), Err(ConfigError::RegionTooSmall { .. })));
    }
}
