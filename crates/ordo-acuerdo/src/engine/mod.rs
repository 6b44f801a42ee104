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
//!
//! # Where each figure lives
//! | module | the paper | what |
//! |---|---|---|
//! | [`broadcast`](self::broadcast) | Fig. 4 | client requests, the leader's ring streams, the reuse rule |
//! | [`accept`](self::accept) | Fig. 5 | accepting ring messages and diffs |
//! | [`commit`](self::commit) | Fig. 6 | the commit threshold and in-order delivery |
//! | [`election`](self::election) | Fig. 7 | roles and the fixed-point election |
//! | [`rows`](self::rows) | §3.1 | SST words, heartbeats, row pushes |
//! | beyond the paper | — | [`sessions`](self::sessions) (ring sessions over reconnects), [`diffs`](self::diffs) (diff streams, requests, restarted members), [`snapshots`](self::snapshots) (state transfer), [`gc`](self::gc) (log garbage collection), [`abdication`](self::abdication), [`wire`](self::wire) (ring message format) |
//!
//! [`Engine::poll`] below runs them in the order the paper's predicate
//! thread does, and checks the invariants after every poll.

mod abdication;
mod accept;
mod broadcast;
mod commit;
mod diffs;
mod durable;
mod election;
mod gc;
mod log;
mod reads;
pub use reads::MAX_PENDING_READS;
mod rows;
mod sessions;
mod snapshots;
mod wire;

use crate::config::{Config, ConfigError, Layout};
use crate::header::{Epoch, Header, Vote};
use ordo_fabric::{MemberId, Region};
use ordo_ring::{MessageMeta, RingReceiver, SendPath, SlotProducer};
use ordo_sst::Sst;
use std::sync::Arc;
use wire::Wire;

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
    /// The leader's epoch held `Config::epoch_messages` messages, all
    /// committed: it stepped down to lead a bigger one.
    EpochRenewed(Epoch),
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
    /// A peer's row says its rings are stamped where ours are not, or the
    /// other way round (`Config::ring_stamps`, turned off by a driver where
    /// its fabric is not address-ordered): every member must agree, so its
    /// ring is not read until they do (noted once per peer).
    RingModeDiffers {
        /// The peer.
        sender: MemberId,
        /// Whether the peer's rings are stamped.
        stamped: bool,
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
    /// Tickets of [`Engine::read_index`] requests that may be answered now
    /// from the application state (every delivery they need is made).
    pub reads_ready: Vec<u64>,
    /// Tickets of read requests that will not be confirmed: this member no
    /// longer leads their epoch (retry at the new leader).
    pub reads_failed: Vec<u64>,
}

impl Effects {
    /// Clears for reuse (keeps the allocations).
    pub fn clear(&mut self) {
        self.pushes.clear();
        self.committed.clear();
        self.notes.clear();
        self.wake_at_ns = None;
        self.reads_ready.clear();
        self.reads_failed.clear();
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

    /// Durable mode ([`Config::durable`]): make `change` durable before
    /// returning (one call per poll at most: group commit). The default
    /// keeps nothing.
    fn persist(&mut self, change: &Persist<'_>) {
        let _ = change;
    }
}

/// What one poll changed that durable mode must write before any of the
/// poll's pushes leave the member.
#[derive(Debug)]
pub struct Persist<'a> {
    /// The promise: E_new.
    pub e_new: Epoch,
    /// The promise: this member's vote.
    pub vote: Vote,
    /// Drop every stored log entry at or after this header, then store
    /// `entries` (all at or after it). None: the log did not change.
    pub log_from: Option<Header>,
    /// The log from `log_from` on, in header order.
    pub entries: Vec<(Header, &'a [u8])>,
    /// A leader's snapshot was restored at this header in this poll (the
    /// application's state replaced the prefix up to it; the log was
    /// cleared): persist the application's state before the log.
    pub restored: Option<Header>,
    /// Accepted: the header up to which this member holds the log of the
    /// epoch it follows or leads. Usually the last entry's header; after a
    /// diff (a new leader's, accepted or made) it is that epoch's count-0
    /// header, above every entry — and an election counts it (the vote's
    /// `acpt`), so it must survive a restart: write it **after** the log,
    /// since it claims the log is held.
    pub accepted: Header,
}

/// A member's durable state, read back after a restart ([`Engine::recover`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The promise: E_new.
    pub e_new: Epoch,
    /// The promise: the vote.
    pub vote: Vote,
    /// The header the application's restored state covers (its snapshot's;
    /// `Header::NONE` for none): the member resumes with Committed there.
    pub base: Header,
    /// The stored log after `base`, in header order.
    pub log: Vec<(Header, Vec<u8>)>,
    /// The last Accepted written ([`Persist::accepted`]); the member resumes
    /// with Accepted = the larger of it and the last entry's header.
    pub accepted: Header,
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
    /// While a full epoch waits for this follower's catch-up: the diff's
    /// serial and the slots reclaimed when last seen to move, and when
    /// (`abdication`: a catch-up that stops moving is not waited for).
    progress: Option<(u32, u64)>,
    progress_ns: u64,
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
    /// The followers' rows (`quorum - 1` of them, or none yet) whose
    /// Accept columns were highest at the leader's last full read of the
    /// commit rule: the quorum it reads first ([`Engine::commit`]).
    commit_hint: [u8; crate::config::MAX_MEMBERS],
    commit_hint_len: usize,
    /// The leader's last urgent step began with its send (its next one
    /// runs the commit rule first).
    sent_last_step: bool,
    now_ns: u64,

    role: Role,
    e_cur: Epoch,
    e_new: Epoch,
    accepted: Header,
    committed: Header,
    next: Header,
    count: u32,
    log: log::Log,
    /// The largest header garbage collection dropped from the log (every
    /// member committed it); `Header::NONE` while the log is whole.
    log_floor: Header,
    /// Log garbage collection runs once the log reaches this length: a
    /// batch of [`gc::GC_BATCH`] entries past what the last one left.
    gc_next_len: usize,
    my_vote: Vote,

    synced: bool,
    floor_ready: bool,
    request_seq: u64,

    out: Vec<Option<OutLink>>,
    inc: Vec<Option<InLink>>,
    last_hb: Vec<u64>,
    hb_changed_ns: Vec<u64>,
    /// Per row: its ring mode (stamped or counter) was found to differ
    /// from ours (noted once; its ring is not read).
    ring_mode_differs: Vec<bool>,
    votes: Vec<Vote>,
    stall: Option<(Vote, u64)>,
    heartbeat: u64,
    next_hb_ns: u64,
    dirty_all: bool,
    dirty_to: Vec<bool>,
    /// Leader: a message was broadcast since the last send, or a full ring
    /// left one behind at the last send.
    unsent: bool,
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
    /// Reads waiting for their confirmation round (leader).
    reads: Vec<reads::PendingRead>,
    /// A read arrived since the last `read_seq` bump.
    read_wanted: bool,
    /// This member's `read_seq` column.
    read_seq: u64,
    /// This member's `read_ack` column.
    read_ack: u64,
    /// Durable mode: the smallest header whose log entry changed since the
    /// last persist (None: unchanged).
    dirty_from: Option<Header>,
    /// Durable mode: E_new or the vote changed since the last persist.
    promise_dirty: bool,
    /// Durable mode: a snapshot restored since the last persist.
    restored: Option<Header>,
    /// Durable mode: Accepted as of the last persist.
    persisted_accepted: Header,
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
                        progress: None,
                        progress_ns: 0,
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
            commit_hint: [0; crate::config::MAX_MEMBERS],
            commit_hint_len: 0,
            sent_last_step: false,
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
            log: log::Log::default(),
            log_floor: Header::NONE,
            gc_next_len: gc::GC_BATCH,
            my_vote: Vote::NONE,
            synced,
            floor_ready: synced,
            request_seq: 0,
            out,
            inc,
            last_hb: vec![0; n],
            hb_changed_ns: vec![now_ns; n],
            ring_mode_differs: vec![false; n],
            votes: vec![Vote::NONE; n],
            stall: None,
            heartbeat: 0,
            next_hb_ns: now_ns,
            dirty_all: true,
            dirty_to: vec![false; n],
            commit_dirty: false,
            unsent: false,
            next_commit_push_ns: now_ns,
            metas: Vec::new(),
            msgs: Vec::new(),
            pool: Vec::new(),
            delivered: 0,
            reads: Vec::new(),
            read_wanted: false,
            read_seq: 0,
            read_ack: 0,
            dirty_from: None,
            promise_dirty: false,
            restored: None,
            persisted_accepted: Header::NONE,
        };
        engine.write_status();
        assert_eq!(engine.members[engine.my_row], engine.me, "my row is mine");
        assert!(2 * engine.quorum > engine.members.len(), "a quorum is a majority");
        assert!(
            engine.out[engine.my_row].is_none() && engine.inc[engine.my_row].is_none(),
            "no ring to myself"
        );
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
    /// Leader: the rows of the followers its next commit reads first (the
    /// quorum of its last full read of every row); empty otherwise or
    /// before a full read.
    pub fn commit_hint(&self) -> &[u8] {
        &self.commit_hint[..self.commit_hint_len]
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

    /// The fabric reconnected the link to `peer` (after a suspicion): writes
    /// posted before may be missing there, or `peer` may be a new
    /// incarnation with a zeroed region. The engine starts a new ring
    /// session to it (and, as leader, a fresh diff) and re-pushes its row.
    pub fn on_link_reset(&mut self, peer: MemberId) {
        assert_ne!(peer, self.me, "no link to myself");
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
        assert!(fx.pushes.is_empty() || fx.pushes.iter().all(|p| p.len > 0), "effects start clean or valid");
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
        self.echo_reads();
        // Durable mode: everything this poll will publish (Accept, votes,
        // E_new) and the leader's own count in the commit rule are on disk
        // from here on.
        self.persist(sink);
        // A full poll reads every row (and re-chooses the quorum an urgent
        // step reads first), so a slow follower in that quorum sets no
        // commit's pace for longer than a run of urgent steps.
        work += self.commit(fx, sink, false);
        self.bump_read_seq();
        work += self.settle_reads(fx);
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

    /// The part of a poll that lies on a commit's path, for a driver that
    /// posts its pushes at once and runs a full [`poll`](Self::poll) soon
    /// after (`AcuerdoDriver`: at least every eighth poll): at a leader,
    /// the messages broadcast since its last send, into the followers'
    /// rings, in a step of their own when the step before sent nothing
    /// (they are posted before anything reads a follower's row), else the
    /// commit rule (Fig. 6, lines 72-90, reading first the quorum of the
    /// last full read) and then the messages; at a follower, what its
    /// leader's ring brought, accepted and acknowledged (Fig. 5), or, with
    /// nothing new, the commit rule (so the ack waits for no read of the
    /// leader's row). So a message leaves, its ack comes back and it
    /// commits without waiting for the phases a poll runs around them
    /// (liveness, roles, reads, garbage collection, heartbeats, the
    /// invariant checks).
    ///
    /// Each step is the full poll's own function, run only where it does
    /// not depend on the phases skipped: never in durable mode (an ack or
    /// a commit count waits for `persist` there); the commit rule needs
    /// only a quorum's Accept of the epoch, or its leader's Commit column
    /// (what a quorum accepted is committed whoever leads next, §3.3,
    /// alive or not); either step only with every ring session up (no
    /// reset due or just made: not even a row goes out over a link whose
    /// reset is due); the leader's send after its row push, as in a poll
    /// (a new leader's row goes out before its diffs), and in a step of its
    /// own, before the commit rule's (the next step); the follower's
    /// receive only when its leader's ring shows a new message
    /// to the session it follows (a new session is the full poll's to
    /// follow). With nothing to do it does nothing and returns 0.
    pub fn poll_urgent(&mut self, now_ns: u64, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        if self.cfg.durable || !self.floor_ready {
            return 0;
        }
        let before = (self.accepted, self.committed);
        let links_up = |e: &Engine| e.out.iter().flatten().all(|l| !l.reset_pending && !l.quiet);
        let work = match self.role {
            Role::Leader => {
                // Nothing goes out over a link whose reset is due (not even
                // the row): the full poll resets it first.
                if !links_up(self) {
                    return 0;
                }
                self.now_ns = self.now_ns.max(now_ns);
                // A step that starts with something to send, after one that
                // did not, sends before anything else (its writes are
                // posted when the step returns): the commit rule and the
                // reuse rule read the followers' rows, whose lines an ack
                // landing may be moving from core to core, and the slot
                // need not wait for them; the reuse rule then runs only for
                // a ring with no free slot. The step after it runs the
                // commit rule first, so a stream of broadcasts does not put
                // every commit off to the next full poll.
                let send_first = self.unsent && !self.sent_last_step;
                self.sent_last_step = send_first;
                let mut work = if send_first { 0 } else { self.commit(fx, sink, true) };
                let send = self.unsent;
                if work > 0 || send {
                    // A moved Commit column goes out when a poll would push it.
                    self.flush_row(fx);
                }
                if send {
                    if !send_first || self.out.iter().flatten().any(|l| !l.quiet && l.producer.is_full()) {
                        self.reclaim();
                    }
                    work += self.send(fx, sink);
                }
                work
            }
            Role::Follower => {
                let from_leader = self.row_of(self.e_cur.leader).and_then(|r| self.inc[r].as_ref());
                if !from_leader.is_some_and(|l| l.session != 0 && l.rx.has_new()) || !links_up(self) {
                    return 0;
                }
                self.now_ns = self.now_ns.max(now_ns);
                // The ack leaves first: the commit rule reads the leader's
                // row, whose line a periodic push may have just moved, and
                // the ack need not wait for it; the next poll (a full one,
                // unless more came) commits.
                let received = self.receive(fx, sink);
                let work = if received > 0 { received } else { self.commit(fx, sink, true) };
                self.flush_row(fx);
                work
            }
            Role::Electing => 0,
        };
        assert!(self.accepted >= before.0 && self.committed >= before.1, "an urgent step only moves forward");
        assert!(self.committed < self.next, "Committed {:?} ≥ Next {:?}", self.committed, self.next);
        debug_assert!(fx.pushes.iter().all(|p| p.len > 0), "an urgent step pushes only valid writes");
        work
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
        if self.role == Role::Follower {
            assert!(self.e_cur.leader != self.me, "a follower follows someone else");
        }
        assert!(self.committed <= self.accepted || !self.synced, "nothing committed that was not accepted");
        assert!(self.role == Role::Leader || self.reads.is_empty(), "only a leader holds reads");
        if self.role != Role::Leader {
            assert!(
                self.out.iter().flatten().all(|l| l.stream == Stream::Idle),
                "only a leader streams to its followers"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gc::GC_BATCH;
    use super::wire::{KIND_DIFF_END, KIND_NORMAL, parse};
    use super::*;

    fn engine(me: MemberId) -> Engine {
        let cfg = Config::new(vec![0, 1, 2], me);
        let region = Region::new_heap(Layout::new(&cfg).region_len);
        Engine::new(cfg, region, 0).expect("valid")
    }

    /// A leader's diff is peer input: one whose entries are not messages of
    /// epochs up to its own, in order, is rejected and changes nothing; the
    /// same diff well formed is joined.
    #[test]
    fn a_malformed_diff_is_rejected_and_changes_nothing() {
        let mut e = engine(1);
        let epoch = Epoch::new(0, 0);
        let diff = |staged: Vec<(Header, Vec<u8>)>| diffs::Diff {
            epoch,
            base: Header::NONE,
            upto: epoch.header(1),
            entries: staged.len() as u32,
            staged,
            snapshot: None,
        };
        let no_delivery = &mut |_: Header, _: &[u8]| panic!("nothing is delivered by a diff's acceptance");
        for bad in [
            vec![(epoch.header(0), b"x".to_vec())],
            vec![(Epoch::new(1, 2).header(1), b"x".to_vec())],
            vec![(epoch.header(1), b"x".to_vec()), (epoch.header(1), b"y".to_vec())],
        ] {
            let mut fx = Effects::default();
            e.on_diff(0, diff(bad), &mut fx, no_delivery);
            assert_eq!(fx.notes, vec![Note::DiffRejected { epoch, reason: "malformed" }]);
            assert_eq!(
                (e.role(), e.accepted(), e.e_new(), e.log_len()),
                (Role::Electing, Header::NONE, Epoch::NONE, 0)
            );
        }
        let mut fx = Effects::default();
        e.on_diff(0, diff(vec![(epoch.header(1), b"x".to_vec())]), &mut fx, no_delivery);
        assert_eq!(fx.notes, vec![Note::JoinedEpoch(epoch)]);
        assert_eq!((e.role(), e.accepted(), e.log_len()), (Role::Follower, epoch.header(1), 1));
    }

    /// The first poll starts a ring session per peer (zero the receiver's
    /// counter — and, stamped, its slots — then the row carrying the new
    /// session number), votes, and pushes the row (vote, heartbeat) to
    /// everyone; no ring data yet.
    #[test]
    fn first_poll_effects() {
        for stamped in [false, true] {
            let cfg = Config { ring_stamps: stamped, ..Config::new(vec![0, 1, 2], 1) };
            let region = Region::new_heap(Layout::new(&cfg).region_len);
            let mut e = Engine::new(cfg, region, 0).expect("valid");
            let mut fx = Effects::default();
            let work = e.poll(0, &mut fx, &mut |_: Header, _: &[u8]| panic!("nothing to deliver"));
            assert!(work > 0);
            let l = e.layout().clone();
            let row = Push { to: Target::All, offset: l.sst.row_stride(), len: l.row_used };
            let slots = l.ring.window * l.ring.slot_size();
            let mut expected = Vec::new();
            for peer in [0, 2] {
                let ring = l.ring_offset(1, peer as usize);
                expected.push(Push { to: Target::Peer(peer), offset: ring, len: 8 });
                if stamped {
                    expected.push(Push { to: Target::Peer(peer), offset: ring + 64, len: slots });
                }
                expected.push(Push { to: Target::Peer(peer), ..row });
            }
            expected.push(row);
            assert_eq!(fx.pushes, expected, "stamped: {stamped}");
        }
        let mut e = engine(1);
        let mut fx = Effects::default();
        e.poll(0, &mut fx, &mut |_: Header, _: &[u8]| panic!("nothing to deliver"));
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
        let mut engines = three(|cfg| {
            cfg.log_gc = true;
            // Commit columns pushed at once: the bound below holds no
            // allowance for messages committed within a push interval.
            cfg.commit_push_interval_ns = 0;
        });
        let bound = engines[0].config().max_outstanding as usize + engines[0].config().window + GC_BATCH + 8;
        let mut delivered: Vec<Vec<(Header, u64)>> = vec![Vec::new(); engines.len()];
        let (mut sent, mut max_log, mut now) = (0u64, 0usize, 0u64);
        let mut fx = Effects::default();
        while delivered.iter().any(|d| (d.len() as u64) < MESSAGES) {
            now += 1_000;
            assert!(
                now < 10_000_000_000,
                "stuck: {:?}",
                engines.iter().map(Engine::describe).collect::<Vec<_>>()
            );
            for i in 0..engines.len() {
                broadcast_until_blocked(&mut engines[i], &mut sent, MESSAGES);
                fx.clear();
                let sink = &mut delivered[i];
                engines[i].poll(now, &mut fx, &mut |h: Header, p: &[u8]| {
                    sink.push((h, u64::from_le_bytes(p.try_into().expect("8 bytes"))))
                });
                land(&engines, i, &fx);
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

    /// Stamped rings restart their indices with every ring session, so a
    /// reset zeroes the receiver's copy of the ring (slots included) in the
    /// poll that starts the session, ahead of the row announcing it; the
    /// group then goes on delivering in order over the new session.
    #[test]
    fn a_stamped_ring_reset_zeroes_the_receivers_copy() {
        let mut engines = three(|cfg| assert!(cfg.ring_stamps, "stamped by default"));
        let mut delivered: Vec<Vec<u64>> = vec![Vec::new(); 3];
        let (mut sent, mut now) = (0u64, 0u64);
        // One lockstep round: every engine polls, its pushes land at once.
        let round = |engines: &mut Vec<Engine>,
                     delivered: &mut Vec<Vec<u64>>,
                     sent: &mut u64,
                     now: &mut u64,
                     limit: u64| {
            *now += 1_000;
            let mut fx = Effects::default();
            for i in 0..engines.len() {
                while engines[i].role() == Role::Leader
                    && *sent < limit
                    && engines[i].broadcast(&sent.to_le_bytes()).is_ok()
                {
                    *sent += 1;
                }
                fx.clear();
                let sink = &mut delivered[i];
                engines[i].poll(*now, &mut fx, &mut |_: Header, p: &[u8]| {
                    sink.push(u64::from_le_bytes(p.try_into().expect("8 bytes")))
                });
                land(engines, i, &fx);
            }
        };
        while delivered.iter().any(|d| d.len() < 40) {
            round(&mut engines, &mut delivered, &mut sent, &mut now, 40);
            assert!(now < 1_000_000_000, "no progress");
        }
        let leader = engines.iter().position(|e| e.role() == Role::Leader).expect("a leader");
        let follower = (leader + 1) % 3;
        let l = engines[leader].layout().clone();
        let ring = l.ring_offset(leader, follower);
        let slots = |e: &Engine| {
            let mut b = vec![0u8; l.ring.window * l.ring.slot_size()];
            e.region.read_bytes(ring + 64, &mut b);
            b
        };
        assert!(slots(&engines[follower]).iter().any(|b| *b != 0), "the ring carried messages");
        engines[leader].on_link_reset(follower as MemberId);
        let mut fx = Effects::default();
        engines[leader].poll(now + 1, &mut fx, &mut |_: Header, _: &[u8]| {});
        let to_follower: Vec<&Push> =
            fx.pushes.iter().filter(|p| p.to == Target::Peer(follower as MemberId)).collect();
        let zeroing = to_follower.iter().position(|p| p.offset == ring + 64).expect("the slots are zeroed");
        let row = to_follower.iter().position(|p| p.offset == l.sst.row_stride() * leader).expect("the row");
        assert!(zeroing < row, "zeroed before the session is announced");
        for p in &fx.pushes {
            let mut buf = vec![0u8; p.len];
            engines[leader].region.read_bytes(p.offset, &mut buf);
            if p.to != Target::Peer(((leader + 2) % 3) as MemberId) {
                engines[follower].region.write_bytes(p.offset, &buf);
            }
        }
        assert!(slots(&engines[follower]).iter().all(|b| *b == 0), "no stamp of the old session is left");
        while delivered.iter().any(|d| d.len() < 80) {
            round(&mut engines, &mut delivered, &mut sent, &mut now, 80);
            assert!(now < 2_000_000_000, "no progress after the reset");
        }
        for d in &delivered {
            assert!(d.iter().copied().eq(0..d.len() as u64), "delivered in order, once");
        }
    }

    #[test]
    fn bad_ring_messages_are_errors_not_panics() {
        let pool = &mut Vec::new();
        assert!(parse(&[0; 3], pool).is_err());
        assert!(parse(&[9; 40], pool).is_err());
        let mut ok = vec![0u8; 16];
        ok[0] = KIND_NORMAL as u8;
        assert!(matches!(parse(&ok, pool), Ok(Wire::Normal { .. })), "a Normal header is two words");
        // A DiffEnd's header is four words: cut short, it is refused.
        let mut end = vec![0u8; 24];
        end[0] = KIND_DIFF_END as u8;
        assert!(parse(&end, pool).is_err());
        end.resize(32, 0);
        assert!(matches!(parse(&end, pool), Ok(Wire::DiffEnd { .. })));
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

    /// Members 0, 1 and 2 in heap regions, each configured by `configure`
    /// after the defaults.
    fn three(configure: impl Fn(&mut Config)) -> Vec<Engine> {
        (0..3)
            .map(|me| {
                let mut cfg = Config::new(vec![0, 1, 2], me);
                configure(&mut cfg);
                let region = Region::new_heap(Layout::new(&cfg).region_len);
                Engine::new(cfg, region, 0).expect("valid")
            })
            .collect()
    }

    /// At a leader, broadcasts messages `sent..limit` (each its number) until
    /// back-pressure; returns their headers.
    fn broadcast_until_blocked(e: &mut Engine, sent: &mut u64, limit: u64) -> Vec<Header> {
        let mut headers = Vec::new();
        while e.role() == Role::Leader && *sent < limit {
            match e.broadcast(&sent.to_le_bytes()) {
                Ok(h) => {
                    headers.push(h);
                    *sent += 1;
                }
                Err(BroadcastError::WouldBlock) => break,
                Err(err) => panic!("{err}"),
            }
        }
        headers
    }

    /// Lands engine `from`'s pushes of `fx` in their receivers' regions at
    /// once (a lockstep fabric).
    fn land(engines: &[Engine], from: usize, fx: &Effects) {
        let mut buf = Vec::new();
        for push in &fx.pushes {
            buf.resize(push.len, 0);
            engines[from].region.read_bytes(push.offset, &mut buf);
            for (j, e) in engines.iter().enumerate() {
                let hit = match push.to {
                    Target::All => j != from,
                    Target::Peer(m) => e.member() == m,
                };
                if hit {
                    e.region.write_bytes(push.offset, &buf);
                }
            }
        }
    }

    /// A leader whose epoch holds `epoch_messages` messages renews it once
    /// they are all committed (back-pressure meanwhile, never a count that
    /// wraps) and leads the next epoch; the group delivers every message,
    /// in order, across the renewals, and nobody else ever leads.
    #[test]
    fn a_full_epoch_is_renewed_by_its_leader_and_nothing_is_lost() {
        const MESSAGES: u64 = 40;
        let mut engines = three(|cfg| cfg.epoch_messages = 5);
        let mut delivered: Vec<Vec<(Header, u64)>> = vec![Vec::new(); engines.len()];
        let (mut sent, mut now) = (0u64, 0u64);
        let (mut renewed, mut leaders) = (Vec::new(), std::collections::BTreeSet::new());
        let mut fx = Effects::default();
        while delivered.iter().any(|d| (d.len() as u64) < MESSAGES) {
            now += 1_000;
            assert!(
                now < 1_000_000_000,
                "stuck: {:?}",
                engines.iter().map(Engine::describe).collect::<Vec<_>>()
            );
            for i in 0..engines.len() {
                for h in broadcast_until_blocked(&mut engines[i], &mut sent, MESSAGES) {
                    assert!(h.count <= 5, "a count past the epoch's limit: {h:?}");
                }
                fx.clear();
                let sink = &mut delivered[i];
                engines[i].poll(now, &mut fx, &mut |h: Header, p: &[u8]| {
                    sink.push((h, u64::from_le_bytes(p.try_into().expect("8 bytes"))))
                });
                for note in &fx.notes {
                    match note {
                        Note::EpochRenewed(e) => renewed.push(*e),
                        Note::BecameLeader(e) => {
                            leaders.insert(e.leader);
                        }
                        Note::Abdicated(e) => panic!("abdicated {e:?} with no bigger epoch around"),
                        _ => {}
                    }
                }
                land(&engines, i, &fx);
            }
        }
        for d in &delivered {
            assert!(d.iter().map(|(_, v)| *v).eq(0..MESSAGES), "delivered out of order or lost");
            assert!(d.windows(2).all(|w| w[0].0 < w[1].0), "headers not increasing");
        }
        assert!(renewed.len() >= 7, "40 messages, 5 an epoch: {renewed:?}");
        assert!(renewed.windows(2).all(|w| w[0] < w[1]), "each renewal from a bigger epoch");
        assert_eq!(leaders.len(), 1, "the leader renews its own epoch: {leaders:?}");
    }

    /// Members that disagree on the ring mode (one with counter rings among
    /// stamped ones) cannot read each other's rings: each side notes it
    /// once per peer and treats the other as gone, so the two that agree —
    /// a quorum — elect one of themselves (also when the odd one out would
    /// win the first vote), deliver, renew full epochs and collect their
    /// logs without it.
    #[test]
    fn members_that_disagree_on_the_ring_mode_say_so_and_the_agreeing_quorum_goes_on() {
        const MESSAGES: u64 = 60;
        for odd in [2, 0] {
            let mut engines = three(|cfg| {
                cfg.ring_stamps = cfg.me != odd;
                cfg.epoch_messages = 5;
                cfg.commit_push_interval_ns = 0;
            });
            let mut noted: Vec<Vec<(MemberId, bool)>> = vec![Vec::new(); 3];
            let mut delivered = vec![0u64; 3];
            let (mut sent, mut now, mut renewals, mut max_log) = (0u64, 0u64, 0, 0);
            let mut fx = Effects::default();
            let agreeing: Vec<usize> = (0..3).filter(|m| *m != odd as usize).collect();
            while agreeing.iter().any(|&m| delivered[m] < MESSAGES) {
                now += 1_000;
                assert!(
                    now < 200_000_000,
                    "odd {odd}: stuck at {delivered:?} {:#?}",
                    engines.iter().map(Engine::describe).collect::<Vec<_>>()
                );
                for i in 0..engines.len() {
                    assert!(
                        i != odd as usize || engines[i].role() != Role::Leader,
                        "the odd one out never leads"
                    );
                    broadcast_until_blocked(&mut engines[i], &mut sent, MESSAGES);
                    fx.clear();
                    let count = &mut delivered[i];
                    engines[i].poll(now, &mut fx, &mut |_: Header, _: &[u8]| *count += 1);
                    for note in &fx.notes {
                        match note {
                            Note::RingModeDiffers { sender, stamped } => noted[i].push((*sender, *stamped)),
                            Note::EpochRenewed(_) => renewals += 1,
                            _ => {}
                        }
                    }
                    max_log = max_log.max(engines[i].log_len());
                    land(&engines, i, &fx);
                }
            }
            for &m in &agreeing {
                assert_eq!(noted[m], vec![(odd, false)], "odd {odd}: member {m} noted it once");
            }
            let mut seen_by_odd = noted[odd as usize].clone();
            seen_by_odd.sort_unstable();
            let expect: Vec<(MemberId, bool)> = agreeing.iter().map(|&m| (m as MemberId, true)).collect();
            assert_eq!(seen_by_odd, expect, "odd {odd}");
            assert!(renewals >= 10, "odd {odd}: full epochs renewed without the odd one out: {renewals}");
            assert!(max_log < 40, "odd {odd}: logs collected without it: {max_log} entries");
        }
    }

    /// A leader whose epoch has spent its 32-bit count of read barriers
    /// refuses reads (back-pressure) and renews its epoch once its messages
    /// are committed; reads then go on in the new epoch.
    #[test]
    fn a_leader_out_of_read_barriers_renews_its_epoch() {
        let mut engines = three(|_| {});
        let mut fx = Effects::default();
        let mut renewed = Vec::new();
        let mut now = 0;
        let mut round = |engines: &mut Vec<Engine>, renewed: &mut Vec<Epoch>| {
            now += 1_000;
            for i in 0..engines.len() {
                fx.clear();
                engines[i].poll(now, &mut fx, &mut |_: Header, _: &[u8]| {});
                renewed.extend(fx.notes.iter().filter_map(|n| match n {
                    Note::EpochRenewed(e) => Some(*e),
                    _ => None,
                }));
                land(engines, i, &fx);
            }
        };
        let leader = loop {
            round(&mut engines, &mut renewed);
            if let Some(l) = engines.iter().position(|e| e.role() == Role::Leader) {
                break l;
            }
        };
        let first = engines[leader].e_cur;
        assert_eq!(engines[leader].read_index(1), Ok(()));
        round(&mut engines, &mut renewed);
        // The epoch's last barrier taken.
        engines[leader].read_seq = first.header(u32::MAX).encode();
        assert_eq!(engines[leader].read_index(2), Err(BroadcastError::WouldBlock));
        for _ in 0..200 {
            round(&mut engines, &mut renewed);
        }
        assert_eq!(renewed, vec![first], "the epoch out of barriers renewed once");
        assert_eq!(engines[leader].role(), Role::Leader, "by the same leader");
        assert!(engines[leader].e_cur > first);
        assert_eq!(engines[leader].read_index(3), Ok(()), "reads go on in the new epoch");
    }

    /// An epoch holds at most `u32::MAX - 1` messages (the commit step names
    /// the header after the last one delivered): the default, and the most
    /// a configuration may ask for.
    #[test]
    fn an_epoch_holds_at_most_one_less_than_the_count_can_name() {
        let cfg = Config::new(vec![0, 1, 2], 0);
        assert_eq!(cfg.epoch_messages, crate::MAX_EPOCH_MESSAGES);
        let last = Epoch::new(1, 0).header(crate::MAX_EPOCH_MESSAGES);
        assert_eq!(last.succ().count, u32::MAX, "the header after the last one is nameable");
        for bad in [0, u32::MAX] {
            assert!(matches!(
                Config { epoch_messages: bad, ..cfg.clone() }.validate(),
                Err(ConfigError::Parameter(_))
            ));
        }
    }
}
