//! A replicated state machine on Raft: client sessions with duplicate
//! detection, durable persistence through [`LogStore`], snapshots and
//! compaction — everything between a transport (R2P2's `REPLICATED_ROUTE`)
//! and an application, still without I/O of its own (the caller owns the
//! socket, the clock and the threads; the [`Disk`] is given).
//!
//! The caller feeds client requests ([`Replica::request`]), peer messages
//! ([`Replica::step`]) and ticks, and drains [`Output`]s: messages to send,
//! commands to apply (on the caller's thread of choice, in the order given),
//! replies and redirects to clients, snapshot requests and restores. It
//! reports applications back with [`Replica::applied`] and snapshots with
//! [`Replica::snapshot_ready`].
//!
//! # Invariants
//! - **Persist before speaking.** Everything a Raft `Ready` asks to persist
//!   is appended to the [`LogStore`] and synced (one fsync per batch: group
//!   commit) before its messages leave and before the node counts its own
//!   log toward a quorum. With [`SyncMode::Deferred`] the caller decides
//!   when the fsync happens ([`Output::NeedSync`] → [`Replica::synced`]);
//!   nothing that depends on the unsynced writes is released before it.
//! - **Apply in log order, exactly once per (client, request).** Committed
//!   commands are handed out as [`Output::Apply`] in index order. A session
//!   table keyed by client id remembers, per client, the request ids applied
//!   most recently (a window of `session_window` ids) with their responses;
//!   a committed command whose id is in the window is a duplicate (a retry)
//!   and is not applied again — its cached response answers the retry. The
//!   table's decisions depend only on the log, so every replica makes the
//!   same ones. Clients number their requests in increasing order and may
//!   keep many outstanding (R2P2's open loop) as long as a retry comes
//!   before `session_window` newer requests of the same client have been
//!   applied; a request older than a full window is not applied rather than
//!   risk applying it twice, and its client is told its session expired
//!   ([`Output::Expired`]; Raft thesis §6.3).
//! - **Answers the client has are forgotten.** A command may carry its
//!   client's *answered-below* id ([`Replica::request_answered`]; R2P2's
//!   answered span): every request of the client numbered below it was
//!   answered or given up. Applying the command drops those requests'
//!   slots and raises the session's floor; a request below the floor is
//!   treated like one older than a full window (the thesis' rule: the
//!   client says which answers it has). The floor only rises, and it is
//!   part of the log and of snapshots, so every replica decides alike.
//! - **Bounded sessions.** At most `max_sessions` are kept; the one least
//!   recently used *in log order* is evicted (deterministic on every
//!   replica). A client evicted while it still retries an old request can
//!   see it applied twice; size the table above the number of live clients.
//! - **Snapshots are consistent cuts.** A snapshot at index `i` holds the
//!   application state after every command ≤ `i` and the session table as of
//!   `i`; it is taken every `snapshot_interval` applied entries, persisted,
//!   and the log before it is compacted. A restarted replica restores the
//!   latest durable snapshot and replays the committed entries after it.
//! - **Only the leader answers.** A replica that is not the leader answers a
//!   request with a redirect naming the leader it knows; followers apply the
//!   same commands and drop their responses (r3p2 §3.3).

use crate::node::{MembershipChange, Node, ProposeError, Ready};
use crate::storage::{Disk, LogOptions, LogStore, StorageError};
use crate::{Config, Entry, EntryKind, Index, Membership, Message, NodeId, Recovered, Snapshot};
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};

/// The replica's hash maps: a few ns a lookup where SipHash took ~20
/// (seven lookups a request on the leader). Their keys are client-chosen
/// ids, so the hasher is seeded per map at random (foldhash's
/// `RandomState`, which its authors call minimally DoS-resistant: it
/// defeats colliding keys chosen in advance, not an attacker who studies
/// a long-running process); the maps are bounded (`max_sessions`, the
/// requests in flight).
type Map<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// Identifies a client (chosen by the client, e.g. at random).
pub type ClientId = u64;
/// A client's request number; increases with each new request of a client.
pub type RequestId = u64;

/// When the log is fsynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Sync at the end of every processed batch, inside the call.
    Immediate,
    /// Emit [`Output::NeedSync`] and hold everything that depends on the
    /// batch until [`Replica::synced`] (lets the caller model or overlap the
    /// fsync's latency; batches arriving meanwhile are group-committed).
    Deferred,
    /// Never: after [`Replica::open`] nothing is written to the store, and
    /// the log lives only in the Raft node's memory (the r3p2 thesis'
    /// configuration). For a replica whose disk dies with its process (a
    /// fresh in-memory `MemDisk`), where encoding every entry into it only
    /// cost time (~15 % of a leader's loop turn). The disk must hold no
    /// state at open ([`ReplicaError::VolatileOnState`]).
    Volatile,
}

/// How a replica runs.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The Raft node's configuration.
    pub raft: Config,
    /// The durable log's options (its `durable` switch is the in-memory
    /// mode).
    pub store: LogOptions,
    /// When the fsync happens.
    pub sync: SyncMode,
    /// Take a snapshot after this many applied entries (0: never).
    pub snapshot_interval: u64,
    /// Also wait, past `snapshot_interval`, until the entries handed out
    /// since the last snapshot hold at least as many bytes as that snapshot
    /// did ([`SNAPSHOT_ENTRY_BYTES`] each besides their data): writing a
    /// snapshot then never costs more than the log it replaces (LogCabin's
    /// rule, at a ratio of one). A snapshot holds every session's window of
    /// answers: without this rule a table of many clients' answers was
    /// encoded every `snapshot_interval` entries whatever its size (with
    /// 1,000 clients of ~200 answers each, more than the leader's whole
    /// replication work per request). The log kept in memory grows to about
    /// the snapshot's size at most.
    pub snapshot_by_size: bool,
    /// Most client sessions kept for duplicate detection.
    pub max_sessions: usize,
    /// Applied request ids (and responses) remembered per client: how far
    /// out of order a client's requests may be applied or retried.
    pub session_window: usize,
    /// Members of a brand-new cluster (ignored when the disk holds state).
    pub initial_membership: Membership,
}

/// What the replica asks of its caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Output<R> {
    /// Send this Raft message to its `to` member.
    Send(Message),
    /// Apply this committed command to the application, after every earlier
    /// `Apply`, then call [`Replica::applied`] with its response.
    Apply(Apply<R>),
    /// Answer a client.
    Reply { to: R, client: ClientId, request: RequestId, response: Vec<u8> },
    /// Tell a client to go to the leader (`None`: unknown, try another).
    Redirect { to: R, client: ClientId, request: RequestId, leader: Option<NodeId> },
    /// Tell a client that its session no longer holds this request: it is
    /// below the client's answered floor, or older than the session's whole
    /// window, so it is not applied now and whether it was applied before
    /// is unknown here (the Raft thesis' SESSION_EXPIRED, §6.3). A client
    /// still waiting for it takes a new session for its next requests.
    Expired { to: R, client: ClientId, request: RequestId },
    /// Serialize the application's state after every `Apply` up to `index`
    /// and hand it to [`Replica::snapshot_ready`].
    TakeSnapshot { index: Index },
    /// Replace the application's state by this snapshot (taken at `index`)
    /// before applying anything later.
    Restore { index: Index, data: Vec<u8> },
    /// (Deferred sync only) call [`Replica::synced`] once the log is synced.
    NeedSync,
}

/// A committed command to apply.
#[derive(Debug, PartialEq, Eq)]
pub struct Apply<R> {
    pub index: Index,
    pub client: ClientId,
    pub request: RequestId,
    pub payload: Vec<u8>,
    /// Where the response goes (only on the leader that took the request).
    pub reply_to: Option<R>,
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("snapshot at index {index} is malformed: {why}")]
    BadSnapshot { index: Index, why: &'static str },
    #[error("snapshot_ready({got}) does not match the requested snapshot {want:?}")]
    UnexpectedSnapshot { got: Index, want: Option<Index> },
    /// `SyncMode::Volatile` on a disk that holds a replica's state: writing
    /// nothing more to it would leave a vote and a log older than the
    /// replica's promises for a later open to recover.
    #[error("a volatile replica needs an empty disk; this one holds term {term}, {entries} entries")]
    VolatileOnState { term: crate::Term, entries: usize },
}

/// Counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    pub proposed: u64,
    pub applied: u64,
    pub duplicates: u64,
    pub redirects: u64,
    pub syncs: u64,
    pub snapshots_taken: u64,
    pub snapshots_installed: u64,
    pub sessions_evicted: u64,
    pub malformed_commands: u64,
    /// Requests older than their client's whole session window, or below
    /// its answered floor: not applied, their clients told
    /// [`Output::Expired`].
    pub too_old: u64,
    /// Answers dropped from their sessions because the client said it had
    /// them (its answered floor rose past them).
    pub answers_forgotten: u64,
    pub invalid_messages: u64,
    pub refused_proposals: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Session {
    /// The most recently applied request ids and their responses (`None`
    /// while the command is being applied); at most `session_window`.
    applied: AppliedWindow,
    /// Log index of the session's last command (its LRU key).
    index: Index,
    /// The floor: every request below it was answered or given up (the
    /// highest answered-below id its commands carried; 0: none said).
    /// Invariant: no slot of `applied` is below it.
    answered_below: RequestId,
}

/// A client's most recently applied request ids with their responses, in
/// ascending id order: a sorted ring. Clients number their requests in
/// increasing order, so a new id almost always goes at the back, and the
/// oldest leaves at the front; a lookup is a binary search over one
/// contiguous buffer (a `BTreeMap` here cost two node walks and an
/// allocation per request on the leader's hot path).
///
/// The newest id is also kept beside the ring's header (`newest`): a new
/// request, the common case, is told apart without reading the ring's
/// buffer — with many clients that read was a cache miss per request on
/// the leader (a tenth of its work at a thousand clients).
///
/// Invariant: `newest` is the id of the ring's last slot, 0 while it is
/// empty (so equal windows compare equal).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct AppliedWindow {
    slots: VecDeque<(RequestId, Option<Vec<u8>>)>,
    newest: RequestId,
}

impl AppliedWindow {
    fn find(&self, request: RequestId) -> Result<usize, usize> {
        debug_assert_eq!(self.newest, self.slots.back().map_or(0, |s| s.0), "newest is the last slot's id");
        let len = self.slots.len();
        // The common cases first: a new request, and the response of the
        // newest one.
        if len == 0 {
            return Err(0);
        }
        let last = self.newest;
        if last < request {
            return Err(len);
        }
        if last == request {
            return Ok(len - 1);
        }
        // A client's ids are mostly consecutive: the slot as far below the
        // newest as the id is (the answers of a batch fill the slots just
        // below it), else a search.
        let below = last - request;
        if let Some(at) = (len as u64 - 1).checked_sub(below)
            && self.slots[at as usize].0 == request
        {
            return Ok(at as usize);
        }
        self.slots.binary_search_by_key(&request, |(id, _)| *id)
    }

    fn newest(&self) -> Option<RequestId> {
        (!self.slots.is_empty()).then_some(self.newest)
    }

    #[cfg(test)]
    fn get(&self, request: RequestId) -> Option<&Option<Vec<u8>>> {
        self.find(request).ok().map(|at| &self.slots[at].1)
    }

    fn get_mut(&mut self, request: RequestId) -> Option<&mut Option<Vec<u8>>> {
        self.find(request).ok().map(|at| &mut self.slots[at].1)
    }

    /// Adds `request`; false (and nothing changes) if it is there already.
    /// O(1) at the back (a client's new request), O(window) below it.
    fn insert(&mut self, request: RequestId, response: Option<Vec<u8>>) -> bool {
        match self.find(request) {
            Ok(_) => false,
            Err(at) => {
                self.slots.insert(at, (request, response));
                if at + 1 == self.slots.len() {
                    self.newest = request;
                }
                debug_assert!(at == 0 || self.slots[at - 1].0 < request, "ascending below");
                debug_assert!(self.slots.get(at + 1).is_none_or(|next| request < next.0), "ascending above");
                true
            }
        }
    }

    fn oldest(&self) -> Option<RequestId> {
        self.slots.front().map(|(id, _)| *id)
    }

    /// Removes the oldest id; returns its answer's buffer, if it had one.
    fn pop_first(&mut self) -> Option<Vec<u8>> {
        let oldest = self.slots.pop_front();
        if self.slots.is_empty() {
            self.newest = 0;
        }
        oldest.and_then(|(_, answer)| answer)
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn iter(&self) -> impl Iterator<Item = &(RequestId, Option<Vec<u8>>)> {
        self.slots.iter()
    }
}

/// What the session table says about a request.
enum Seen<'a> {
    /// Never applied: apply it.
    New,
    /// Applied; its response (`None`: still being applied).
    Applied(Option<&'a Vec<u8>>),
    /// Older than the whole window, or below the client's answered floor:
    /// ignore it.
    TooOld,
}

impl Session {
    fn seen(&self, request: RequestId, window: usize) -> Seen<'_> {
        if request < self.answered_below {
            return Seen::TooOld; // its client has its answer, or gave it up
        }
        // One search: a new request (above every id held, the common
        // case) reads only the newest slot, not the oldest too — with
        // many clients each is a cache miss.
        match self.applied.find(request) {
            Ok(at) => Seen::Applied(self.applied.slots[at].1.as_ref()),
            // Below the oldest id of a full window.
            Err(0) if self.applied.len() >= window => Seen::TooOld,
            Err(_) => Seen::New,
        }
    }

    /// Records `request`'s response (moved in: the caller's copy) in its
    /// slot if the slot has none yet. The first answer stays: a request
    /// applied twice (its client's session evicted in between, then its
    /// retry proposed again) keeps the answer of its first application —
    /// the one a snapshot cut before the second answer holds
    /// ([`PendingSnapshot::answer`]), so a replica restored from the
    /// snapshot and one that was not agree.
    fn fill(&mut self, request: RequestId, response: Vec<u8>) {
        if let Some(slot @ None) = self.applied.get_mut(request) {
            *slot = Some(response);
        }
    }
}

/// The sessions in least-recently-used order *in log order*: each applied
/// command appends `(index, client)`, or moves the newest item up to its
/// index when that item is the same client's; an item is live while its
/// session's last applied index is still `index`, stale once the client
/// applied a later command or was evicted. Indexes grow, so the first live item is
/// the session least recently used — the one a `BTreeMap` keyed by index
/// would give first, with a push per command instead of an insert and a
/// remove (two tree walks on every replica for every command).
///
/// Invariants: items are in increasing index order; every session has
/// exactly one live item; stale items are dropped when met at the front
/// and all at once when they outnumber the live ones, so the queue holds
/// at most `2 × sessions + SLACK` items.
#[derive(Default)]
struct Lru {
    items: VecDeque<(Index, ClientId)>,
}

impl Lru {
    /// Stale items tolerated beyond the live ones before a sweep.
    const SLACK: usize = 64;

    /// The order of `sessions` (a snapshot's, a recovered one's).
    fn of(sessions: &Map<ClientId, Session>) -> Lru {
        let mut items: Vec<(Index, ClientId)> = sessions.iter().map(|(c, s)| (s.index, *c)).collect();
        items.sort_unstable();
        Lru { items: items.into() }
    }

    fn live(sessions: &Map<ClientId, Session>, (index, client): (Index, ClientId)) -> bool {
        sessions.get(&client).is_some_and(|s| s.index == index)
    }

    /// `client`'s session has just applied the command at `index` (its
    /// `index` already set); [`Lru::evict`] follows.
    fn touch(&mut self, index: Index, client: ClientId) {
        match self.items.back_mut() {
            // The same client as the newest item (a client's burst, one
            // client's load): that item is its previous one (live, or stale
            // by an eviction since), replaced in place: no item per command
            // and no sweep for a client that sends many in a row.
            Some(last) if last.1 == client => {
                assert!(last.0 < index, "lru: indexes grow");
                last.0 = index;
            }
            last => {
                assert!(last.is_none_or(|&mut (last, _)| last < index), "lru: indexes grow");
                self.items.push_back((index, client));
            }
        }
    }

    /// The least recently used session, its item removed (the caller
    /// removes the session).
    fn pop_oldest(&mut self, sessions: &Map<ClientId, Session>) -> Option<ClientId> {
        while let Some(item) = self.items.pop_front() {
            if Self::live(sessions, item) {
                return Some(item.1);
            }
        }
        None
    }

    /// Removes the least recently used sessions until at most `max` are
    /// left, and the stale items once they outnumber the live ones; returns
    /// how many sessions went.
    fn evict(&mut self, sessions: &mut Map<ClientId, Session>, max: usize) -> u64 {
        let mut evicted = 0;
        while sessions.len() > max {
            let Some(victim) = self.pop_oldest(sessions) else { break };
            sessions.remove(&victim);
            evicted += 1;
        }
        if self.items.len() > 2 * sessions.len() + Self::SLACK {
            self.items.retain(|&item| Self::live(sessions, item));
            debug_assert_eq!(self.items.len(), sessions.len(), "lru: one live item per session");
        }
        evicted
    }
}

/// A snapshot waiting for the application's part: the session table
/// encoded at the cut, and the answers that were still outstanding then.
///
/// The table is encoded when the cut is taken, not cloned: a clone copied
/// every session's window of answers, an allocation per answer (with a
/// thousand clients, a third of the leader's work per request at a
/// snapshot every 10,000 entries). A command handed out at or before the
/// cut may be answered after it ([`Replica::applied`]); its slot was
/// encoded with an empty answer, and its answer is spliced in when the
/// snapshot is completed, so the bytes are those an encoding of the table
/// at the cut with every answer in would give.
struct PendingSnapshot {
    index: Index,
    /// `encode_snapshot`'s session part of the table at the cut.
    sessions: Vec<u8>,
    /// The slots that had no answer at the cut: (client, request) → offset
    /// of the slot's answer length (0) in `sessions`.
    unanswered: Map<(ClientId, RequestId), usize>,
    /// Answers that came for them since: (offset, answer).
    answers: Vec<(usize, Vec<u8>)>,
}

impl PendingSnapshot {
    fn cut(index: Index, sessions: &Map<ClientId, Session>) -> PendingSnapshot {
        let mut unanswered = Map::default();
        let sessions = encode_sessions(sessions, |client, request, at| {
            unanswered.insert((client, request), at);
        });
        PendingSnapshot { index, sessions, unanswered, answers: Vec::new() }
    }

    /// `request` of `client` was answered: if its slot was waiting, the
    /// answer goes in (the first answer stays, as in the table:
    /// `Session::fill`).
    fn answer(&mut self, client: ClientId, request: RequestId, response: &[u8]) {
        if let Some(at) = self.unanswered.remove(&(client, request)) {
            self.answers.push((at, response.to_vec()));
        }
    }

    /// The snapshot's bytes: the table with the answers spliced in, then
    /// the application's state.
    fn complete(mut self, app: &[u8]) -> Vec<u8> {
        let extra: usize = self.answers.iter().map(|(_, a)| a.len()).sum();
        let mut b = Vec::with_capacity(self.sessions.len() + extra + app.len());
        self.answers.sort_unstable_by_key(|&(at, _)| at);
        let mut from = 0;
        for (at, answer) in &self.answers {
            assert_eq!(self.sessions[*at..*at + 4], [0; 4], "snapshot: an unanswered slot is empty");
            b.extend_from_slice(&self.sessions[from..*at]);
            b.extend_from_slice(&(answer.len() as u32).to_le_bytes());
            b.extend_from_slice(answer);
            from = at + 4;
        }
        b.extend_from_slice(&self.sessions[from..]);
        b.extend_from_slice(app);
        b
    }
}

/// One replica of a replicated state machine. `D` is its disk, `R` the
/// caller's notion of a reply address.
pub struct Replica<D: Disk, R> {
    node: Node,
    store: LogStore<D>,
    cfg: ReplicaConfig,
    out: VecDeque<Output<R>>,
    sessions: Map<ClientId, Session>,
    /// The sessions by the index of their last applied command, oldest
    /// first ([`Lru`]).
    lru: Lru,
    /// Requests this leader proposed and has not answered: (client, request)
    /// → reply address.
    waiting: Map<(ClientId, RequestId), R>,
    /// Membership changes this leader proposed: index → (term, reply address).
    admin_waiting: Map<Index, (crate::Term, R)>,
    /// Retries of commands that are still being applied.
    reply_after_apply: Map<(ClientId, RequestId), R>,
    /// Index of the last entry handed out (applied or skipped).
    last_handed: Index,
    /// Index covered by the last snapshot.
    last_snapshot: Index,
    /// Bytes of the last snapshot (taken, recovered or installed).
    last_snapshot_bytes: u64,
    /// Bytes of the entries handed out since the last snapshot's cut
    /// ([`ReplicaConfig::snapshot_by_size`]).
    log_bytes: u64,
    pending_snapshot: Option<PendingSnapshot>,
    /// A batch is written but not synced (deferred mode).
    sync_pending: Option<HeldBatch>,
    was_leader: bool,
    /// Term and vote as last persisted.
    node_term_vote: (crate::Term, Option<NodeId>),
    /// The chunk this leader writes its commands into
    /// ([`encode_command_into`]).
    commands: BytesMut,
    /// Buffers of answers that left their sessions, for the application's
    /// copies of the next commands (at most `SPARES` of at most
    /// `SPARE_MAX_BYTES` each).
    spares: Vec<Vec<u8>>,
    stats: ReplicaStats,
}

struct HeldBatch {
    ready: Ready,
}

const COMMAND_MAGIC: u8 = 0xC1;
/// Magic, client id, request id.
const COMMAND_HEADER: usize = 17;
/// A command that carries its client's answered-below id.
const COMMAND_MAGIC_ANSWERED: u8 = 0xC2;
/// Magic, client id, request id, and how far below the request the
/// answered-below id is (u32: a wider span is not written).
const COMMAND_HEADER_ANSWERED: usize = 21;
/// A snapshot without the sessions' answered floors (every floor 0).
const SNAPSHOT_MAGIC: u8 = 0x5E;
/// A snapshot whose sessions carry their answered floors (what is written).
const SNAPSHOT_MAGIC_ANSWERED: u8 = 0x5F;
/// What an entry counts besides its data in [`ReplicaConfig::snapshot_by_size`]
/// (its header in the log and on the wire).
pub const SNAPSHOT_ENTRY_BYTES: u64 = 32;

/// A client command, as a log entry's data holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command<'a> {
    pub client: ClientId,
    pub request: RequestId,
    /// Every request of the client below this one was answered or given up
    /// (0: the client did not say). At most `request`.
    pub answered_below: RequestId,
    pub payload: &'a [u8],
}

impl Command<'_> {
    /// The encoded header: the answered-below id only when there is one
    /// (commands without it keep the first format), as its distance below
    /// the request (4 bytes, not 8: most log entries are small). A floor
    /// further below than `u32::MAX` is left out: a lower floor, or none,
    /// only keeps answers longer.
    fn header(&self) -> ([u8; COMMAND_HEADER_ANSWERED], usize) {
        assert!(self.answered_below <= self.request, "answered below a request still asked");
        let mut h = [0; COMMAND_HEADER_ANSWERED];
        h[1..9].copy_from_slice(&self.client.to_le_bytes());
        h[9..17].copy_from_slice(&self.request.to_le_bytes());
        match u32::try_from(self.request - self.answered_below) {
            Ok(span) if self.answered_below > 0 => {
                h[0] = COMMAND_MAGIC_ANSWERED;
                h[17..].copy_from_slice(&span.to_le_bytes());
                (h, COMMAND_HEADER_ANSWERED)
            }
            _ => {
                h[0] = COMMAND_MAGIC;
                (h, COMMAND_HEADER)
            }
        }
    }
}

/// Encodes a client command as a log entry's data.
pub fn encode_command(command: &Command<'_>) -> Vec<u8> {
    let (header, len) = command.header();
    let mut b = Vec::with_capacity(len + command.payload.len());
    b.extend_from_slice(&header[..len]);
    b.extend_from_slice(command.payload);
    b
}

/// A chunk commands are written into ([`encode_command_into`]).
const COMMAND_CHUNK: usize = 4096;
/// The largest answer buffer reused for a command's copy for the
/// application (a larger one is freed: a small command must not hold a
/// large buffer).
const SPARE_MAX_BYTES: usize = 4096;
/// The most answer buffers kept for reuse (a floor that rises once per
/// batch frees a batch of answers at once; the batch's commands take them).
const SPARES: usize = 256;

/// [`encode_command`] into the free end of `chunk`, as a slice of it: the
/// commands of a leader's batch share one allocation (and one reference
/// count) instead of one each, and a clone of a slice (for the followers'
/// appends, the application) only counts a reference. A command larger
/// than a quarter chunk gets a buffer of its own. A chunk lives until the
/// last of its commands' entries is compacted away: the log's memory is
/// its commands' bytes rounded up to whole chunks of 4 KiB.
pub fn encode_command_into(chunk: &mut BytesMut, command: &Command<'_>) -> Bytes {
    let (header, header_len) = command.header();
    let len = header_len + command.payload.len();
    if len > COMMAND_CHUNK / 4 {
        return encode_command(command).into();
    }
    if chunk.capacity() - chunk.len() < len {
        *chunk = BytesMut::with_capacity(COMMAND_CHUNK);
    }
    debug_assert!(chunk.is_empty(), "every command is split off the chunk");
    // The header in one write (three small ones before).
    chunk.extend_from_slice(&header[..header_len]);
    chunk.extend_from_slice(command.payload);
    let encoded = chunk.split().freeze();
    debug_assert_eq!(encoded.len(), len);
    encoded
}

/// Decodes [`encode_command`]'s output (either format); `None` for
/// anything else, or for an answered-below id below 0.
pub fn decode_command(data: &[u8]) -> Option<Command<'_>> {
    let word = |at: usize| data.get(at..at + 8).map(|w| u64::from_le_bytes(w.try_into().unwrap()));
    let (client, request) = (word(1)?, word(9)?);
    let (answered_below, header) = match data[0] {
        COMMAND_MAGIC => (0, COMMAND_HEADER),
        COMMAND_MAGIC_ANSWERED => {
            let span = u32::from_le_bytes(data.get(17..21)?.try_into().unwrap());
            (request.checked_sub(u64::from(span))?, COMMAND_HEADER_ANSWERED)
        }
        _ => return None,
    };
    Some(Command { client, request, answered_below, payload: &data[header..] })
}

#[cfg(test)]
fn encode_snapshot(sessions: &Map<ClientId, Session>, app: &[u8]) -> Vec<u8> {
    let mut b = encode_sessions(sessions, |_, _, _| {});
    b.extend_from_slice(app);
    b
}

/// The session part of a snapshot (the application's state follows it);
/// `unanswered(client, request, offset)` is told of every slot without an
/// answer yet, encoded as an empty one whose length sits at `offset`.
fn encode_sessions(
    sessions: &Map<ClientId, Session>,
    mut unanswered: impl FnMut(ClientId, RequestId, usize),
) -> Vec<u8> {
    let mut clients: Vec<_> = sessions.iter().collect();
    clients.sort_unstable_by_key(|(c, _)| **c);
    let bytes: usize = clients
        .iter()
        .map(|(_, s)| 28 + s.applied.iter().map(|(_, r)| 12 + r.as_ref().map_or(0, Vec::len)).sum::<usize>())
        .sum();
    let mut b = Vec::with_capacity(5 + bytes);
    b.push(SNAPSHOT_MAGIC_ANSWERED);
    b.extend_from_slice(&(clients.len() as u32).to_le_bytes());
    for (&client, s) in clients {
        b.extend_from_slice(&client.to_le_bytes());
        b.extend_from_slice(&s.index.to_le_bytes());
        b.extend_from_slice(&s.answered_below.to_le_bytes());
        b.extend_from_slice(&(s.applied.len() as u32).to_le_bytes());
        for (request, resp) in s.applied.iter() {
            b.extend_from_slice(&request.to_le_bytes());
            match resp {
                Some(resp) => {
                    b.extend_from_slice(&(resp.len() as u32).to_le_bytes());
                    b.extend_from_slice(resp);
                }
                None => {
                    unanswered(client, *request, b.len());
                    b.extend_from_slice(&0u32.to_le_bytes());
                }
            }
        }
    }
    b
}

type DecodedSnapshot<'a> = (Map<ClientId, Session>, &'a [u8]);

fn decode_snapshot(data: &[u8], index: Index) -> Result<DecodedSnapshot<'_>, ReplicaError> {
    let bad = |why| ReplicaError::BadSnapshot { index, why };
    // The first format had no answered floors (every one is 0).
    let with_floors = match data.first() {
        Some(&SNAPSHOT_MAGIC_ANSWERED) => true,
        Some(&SNAPSHOT_MAGIC) => false,
        _ => return Err(bad("missing header")),
    };
    if data.len() < 5 {
        return Err(bad("missing header"));
    }
    let session_bytes = if with_floors { 28 } else { 20 };
    let n = u32::from_le_bytes(data[1..5].try_into().unwrap()) as usize;
    let mut at = 5;
    // Each session takes at least `session_bytes`: bound the count by the input.
    if n > (data.len() - at) / session_bytes {
        return Err(bad("session count exceeds the snapshot"));
    }
    let word = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    let half = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
    let mut sessions = Map::with_capacity_and_hasher(n, Default::default());
    for _ in 0..n {
        if data.len() - at < session_bytes {
            return Err(bad("truncated session"));
        }
        let client = word(at);
        let sidx = word(at + 8);
        let answered_below = if with_floors { word(at + 16) } else { 0 };
        let count = half(at + session_bytes - 4);
        at += session_bytes;
        // A session's last command is in the snapshot (the eviction order
        // relies on it).
        if sidx > index {
            return Err(bad("session index beyond the snapshot"));
        }
        // Each applied id takes at least 12 bytes.
        if count > (data.len() - at) / 12 {
            return Err(bad("applied count exceeds the snapshot"));
        }
        let mut applied = AppliedWindow::default();
        for _ in 0..count {
            if data.len() - at < 12 {
                return Err(bad("truncated applied request"));
            }
            let request = word(at);
            let len = half(at + 8);
            at += 12;
            if data.len() - at < len {
                return Err(bad("truncated response"));
            }
            // Written in ascending order: anything else is malformed (and
            // would cost a shift per id to sort).
            if applied.newest().is_some_and(|last| last >= request) {
                return Err(bad("request ids repeated or not ascending"));
            }
            if request < answered_below {
                return Err(bad("a request id below its session's answered floor"));
            }
            let fresh = applied.insert(request, Some(data[at..at + len].to_vec()));
            debug_assert!(fresh, "above every id so far");
            at += len;
        }
        if sessions.insert(client, Session { applied, index: sidx, answered_below }).is_some() {
            return Err(bad("duplicate session"));
        }
    }
    Ok((sessions, &data[at..]))
}

impl<D: Disk, R: Clone> Replica<D, R> {
    /// Opens the replica on `disk`: recovers the durable log and snapshot
    /// (a fresh disk starts a member of `cfg.initial_membership`). The first
    /// outputs include a [`Output::Restore`] when a snapshot was recovered;
    /// call [`flush`](Self::flush) to start.
    pub fn open(disk: D, cfg: ReplicaConfig) -> Result<Replica<D, R>, ReplicaError> {
        let (store, recovered): (LogStore<D>, Recovered) = LogStore::open(disk, cfg.store)?;
        let holds_state = recovered.hard_state != Default::default()
            || recovered.snapshot.is_some()
            || !recovered.entries.is_empty();
        if cfg.sync == SyncMode::Volatile && holds_state {
            return Err(ReplicaError::VolatileOnState {
                term: recovered.hard_state.term,
                entries: recovered.entries.len(),
            });
        }
        let mut out = VecDeque::new();
        let mut sessions = Map::default();
        let mut last = 0;
        let last_snapshot_bytes = recovered.snapshot.as_ref().map_or(0, |s| s.data.len() as u64);
        if let Some(snap) = &recovered.snapshot {
            let (s, app) = decode_snapshot(&snap.data, snap.meta.index)?;
            sessions = s;
            last = snap.meta.index;
            out.push_back(Output::Restore { index: last, data: app.to_vec() });
        }
        let lru = Lru::of(&sessions);
        let hard = recovered.hard_state;
        // A volatile replica writes no entries: the node keeps them to itself.
        let raft = Config {
            hand_out_entries: cfg.raft.hand_out_entries && cfg.sync != SyncMode::Volatile,
            ..cfg.raft.clone()
        };
        let node = Node::new(raft, recovered, cfg.initial_membership.clone())
            .map_err(|e| ReplicaError::Raft(e.to_string()))?;
        let r = Replica {
            node,
            store,
            cfg,
            out,
            sessions,
            lru,
            waiting: Map::default(),
            reply_after_apply: Map::default(),
            admin_waiting: Map::default(),
            last_handed: last,
            last_snapshot: last,
            last_snapshot_bytes,
            log_bytes: 0,
            pending_snapshot: None,
            sync_pending: None,
            was_leader: false,
            node_term_vote: (hard.term, hard.vote),
            commands: BytesMut::new(),
            spares: Vec::new(),
            stats: ReplicaStats::default(),
        };
        Ok(r)
    }

    /// The Raft node (read-only: role, leader, term, indexes).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The durable log (read-only).
    pub fn store(&self) -> &LogStore<D> {
        &self.store
    }

    /// Counters.
    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    /// The next output, if any.
    pub fn next_output(&mut self) -> Option<Output<R>> {
        self.out.pop_front()
    }

    /// One logical tick of the Raft clock.
    pub fn tick(&mut self) -> Result<(), ReplicaError> {
        self.node.tick();
        Ok(())
    }

    /// A Raft message from a peer.
    pub fn step(&mut self, msg: Message) -> Result<(), ReplicaError> {
        if self.node.step(msg).is_err() {
            self.stats.invalid_messages += 1;
        }
        Ok(())
    }

    /// A client's request (a `REPLICATED_ROUTE` command). The answer comes
    /// later as a [`Output::Reply`] or now as a [`Output::Redirect`].
    pub fn request(
        &mut self,
        reply_to: R,
        client: ClientId,
        request: RequestId,
        payload: &[u8],
    ) -> Result<(), ReplicaError> {
        self.request_answered(reply_to, client, request, 0, payload)
    }

    /// [`request`](Self::request) from a client that says every one of its
    /// requests below `answered_below` was answered or given up: once this
    /// command is applied, their answers are forgotten and their ids are
    /// ignored (the module's invariants). Above `request` it says nothing,
    /// as 0 does.
    pub fn request_answered(
        &mut self,
        reply_to: R,
        client: ClientId,
        request: RequestId,
        answered_below: RequestId,
        payload: &[u8],
    ) -> Result<(), ReplicaError> {
        let answered_below = if answered_below <= request { answered_below } else { 0 };
        if !self.node.is_leader() {
            self.stats.redirects += 1;
            let leader = self.node.leader();
            self.out.push_back(Output::Redirect { to: reply_to, client, request, leader });
            return Ok(());
        }
        if let Some(s) = self.sessions.get(&client) {
            match s.seen(request, self.cfg.session_window) {
                Seen::New => {}
                Seen::TooOld => {
                    // Unknown: never risk a second application; say so.
                    self.stats.too_old += 1;
                    self.out.push_back(Output::Expired { to: reply_to, client, request });
                    return Ok(());
                }
                Seen::Applied(Some(resp)) => {
                    self.stats.duplicates += 1;
                    let response = resp.clone();
                    self.out.push_back(Output::Reply { to: reply_to, client, request, response });
                    return Ok(());
                }
                Seen::Applied(None) => {
                    self.stats.duplicates += 1;
                    self.reply_after_apply.insert((client, request), reply_to);
                    return Ok(());
                }
            }
        }
        // One lookup for both the retry check and the insert.
        let waiting = match self.waiting.entry((client, request)) {
            std::collections::hash_map::Entry::Occupied(mut w) => {
                w.insert(reply_to); // a retry of a proposal in flight: answer the latest address
                return Ok(());
            }
            std::collections::hash_map::Entry::Vacant(w) => w,
        };
        let command = Command { client, request, answered_below, payload };
        match self.node.propose(encode_command_into(&mut self.commands, &command)) {
            Ok(_) => {
                self.stats.proposed += 1;
                waiting.insert(reply_to);
            }
            Err(ProposeError::NotLeader { leader }) => {
                self.stats.redirects += 1;
                self.out.push_back(Output::Redirect { to: reply_to, client, request, leader });
            }
            Err(_) => {
                // Busy or too large: the client retries after its timeout.
                self.stats.refused_proposals += 1;
            }
        }
        Ok(())
    }

    /// Proposes a one-server-at-a-time membership change (Raft thesis §4.1;
    /// a learner is promoted only once caught up). The answer — a
    /// [`Output::Reply`] to `reply_to` with client and request 0 — comes when
    /// the change commits; a refusal is returned now.
    pub fn change_membership(
        &mut self,
        reply_to: R,
        change: MembershipChange,
    ) -> Result<Index, ProposeError> {
        let index = self.node.propose_membership(change)?;
        self.admin_waiting.insert(index, (self.node.term(), reply_to));
        Ok(index)
    }

    /// The application applied `index` and answered `response`.
    pub fn applied(&mut self, index: Index, client: ClientId, request: RequestId, response: Vec<u8>) {
        self.stats.applied += 1;
        if let Some(p) = &mut self.pending_snapshot
            && index <= p.index
        {
            p.answer(client, request, &response);
        }
        if !self.reply_after_apply.is_empty()
            && let Some(to) = self.reply_after_apply.remove(&(client, request))
        {
            self.out.push_back(Output::Reply { to, client, request, response: response.clone() });
        }
        if let Some(s) = self.sessions.get_mut(&client) {
            s.fill(request, response);
        }
    }

    /// The application's state after every command ≤ `index` (answering
    /// [`Output::TakeSnapshot`]). Persists the snapshot and compacts the log.
    pub fn snapshot_ready(&mut self, index: Index, app: Vec<u8>) -> Result<(), ReplicaError> {
        let Some(p) = self.pending_snapshot.take_if(|p| p.index == index) else {
            return Err(ReplicaError::UnexpectedSnapshot {
                got: index,
                want: self.pending_snapshot.as_ref().map(|p| p.index),
            });
        };
        let data = p.complete(&app);
        let data_len = data.len() as u64;
        if self.cfg.sync == SyncMode::Volatile {
            self.node.compact(index, data).map_err(|e| ReplicaError::Raft(e.to_string()))?;
        } else {
            let meta =
                self.node.compact(index, data.clone()).map_err(|e| ReplicaError::Raft(e.to_string()))?;
            let snapshot = Snapshot { meta, data };
            self.store.install_snapshot(&snapshot)?;
            self.store.sync()?;
            self.store.compact(index)?;
        }
        self.last_snapshot = index;
        self.last_snapshot_bytes = data_len;
        self.stats.snapshots_taken += 1;
        Ok(())
    }

    /// (Deferred sync) the caller synced the log after an
    /// [`Output::NeedSync`].
    pub fn synced(&mut self) -> Result<(), ReplicaError> {
        let Some(held) = self.sync_pending.take() else { return Ok(()) };
        self.store.sync()?;
        self.stats.syncs += 1;
        self.release(held.ready)?;
        self.flush()
    }

    /// Whether a deferred sync is outstanding.
    pub fn sync_outstanding(&self) -> bool {
        self.sync_pending.is_some()
    }

    /// Runs the node's readies: persist, sync (group commit: one sync for
    /// everything the inputs since the last flush produced), send, apply.
    /// Call it after each batch of inputs ([`request`](Self::request),
    /// [`step`](Self::step), [`tick`](Self::tick)); nothing leaves the
    /// replica before it.
    pub fn flush(&mut self) -> Result<(), ReplicaError> {
        loop {
            if self.sync_pending.is_some() {
                return Ok(());
            }
            if !self.node.has_ready() {
                // Only now: the entries a lost leadership committed before it
                // ended (e.g. a leader's own removal, after which it steps
                // down at once) were handed out above with their reply
                // addresses.
                self.leadership_check();
                return Ok(());
            }
            let ready = self.node.ready();
            if self.cfg.sync == SyncMode::Volatile {
                if let Some(snap) = &ready.snapshot {
                    decode_snapshot(&snap.data, snap.meta.index)?;
                }
                if let Some(hs) = &ready.hard_state {
                    self.node_term_vote = (hs.term, hs.vote);
                }
                self.release(ready)?;
                continue;
            }
            if let Some(snap) = &ready.snapshot {
                // Check a leader's snapshot before it replaces the durable
                // log: a malformed one stops the replica (see `release`)
                // without leaving a disk it cannot reopen.
                decode_snapshot(&snap.data, snap.meta.index)?;
                self.store.install_snapshot(snap)?;
            }
            if !ready.entries.is_empty() {
                self.store.append(&ready.entries)?;
            }
            if let Some(hs) = &ready.hard_state {
                self.store.save_hard_state(hs);
            }
            // A hard state whose term and vote are unchanged only moved the
            // commit index, which need not be synced (losing it is safe).
            let vote_changed = ready.hard_state.is_some_and(|hs| {
                let (term, vote) = (self.node_term_vote.0, self.node_term_vote.1);
                (hs.term, hs.vote) != (term, vote)
            });
            if let Some(hs) = &ready.hard_state {
                self.node_term_vote = (hs.term, hs.vote);
            }
            let persists = ready.snapshot.is_some() || !ready.entries.is_empty() || vote_changed;
            if !persists {
                self.release(ready)?;
                continue;
            }
            match self.cfg.sync {
                SyncMode::Immediate => {
                    self.store.sync()?;
                    self.stats.syncs += 1;
                    self.release(ready)?;
                }
                SyncMode::Deferred => {
                    self.sync_pending = Some(HeldBatch { ready });
                    self.out.push_back(Output::NeedSync);
                    return Ok(());
                }
                SyncMode::Volatile => unreachable!("released above without persisting"),
            }
        }
    }

    /// What a synced batch lets out: the node's own acknowledgement, the
    /// messages, the snapshot restore and the committed entries.
    fn release(&mut self, ready: Ready) -> Result<(), ReplicaError> {
        if let Some((index, term)) = ready.persist_point() {
            self.node.advance(index, term);
        }
        for m in ready.messages {
            self.out.push_back(Output::Send(m));
        }
        if let Some(snap) = ready.snapshot {
            let index = snap.meta.index;
            let (sessions, app) = decode_snapshot(&snap.data, index)?;
            self.lru = Lru::of(&sessions);
            self.sessions = sessions;
            self.out.push_back(Output::Restore { index, data: app.to_vec() });
            self.last_handed = index;
            self.last_snapshot = index;
            self.last_snapshot_bytes = snap.data.len() as u64;
            self.log_bytes = 0;
            self.pending_snapshot = None;
            self.stats.snapshots_installed += 1;
        }
        for e in ready.committed.iter() {
            self.hand_out(e);
        }
        Ok(())
    }

    fn hand_out(&mut self, e: &Entry) {
        if e.index <= self.last_handed {
            return; // covered by a restored snapshot
        }
        self.last_handed = e.index;
        self.log_bytes += e.data.len() as u64 + SNAPSHOT_ENTRY_BYTES;
        match e.kind {
            EntryKind::Normal => self.hand_out_command(e),
            EntryKind::Membership => {
                if let Some((term, to)) = self.admin_waiting.remove(&e.index)
                    && term == e.term
                {
                    let m = self.node.membership();
                    let response = format!(
                        "committed at index {}: voters {:?} learners {:?}",
                        e.index, m.voters, m.learners
                    );
                    self.out.push_back(Output::Reply {
                        to,
                        client: 0,
                        request: 0,
                        response: response.into_bytes(),
                    });
                }
            }
            EntryKind::Noop => {}
        }
        if self.cfg.snapshot_interval > 0
            && self.pending_snapshot.is_none()
            && self.last_handed >= self.last_snapshot + self.cfg.snapshot_interval
            && (!self.cfg.snapshot_by_size || self.log_bytes >= self.last_snapshot_bytes)
        {
            self.log_bytes = 0;
            self.pending_snapshot = Some(PendingSnapshot::cut(self.last_handed, &self.sessions));
            self.out.push_back(Output::TakeSnapshot { index: self.last_handed });
        }
    }

    fn hand_out_command(&mut self, e: &Entry) {
        let Some(Command { client, request, answered_below, payload: command }) = decode_command(&e.data)
        else {
            self.stats.malformed_commands += 1;
            return;
        };
        let waiting = self.waiting.remove(&(client, request));
        let window = self.cfg.session_window.max(1);
        // One lookup: a client without a session gets an empty one, for
        // which every request is new.
        let session = self.sessions.entry(client).or_default();
        match session.seen(request, window) {
            Seen::New => {}
            Seen::TooOld => {
                self.stats.too_old += 1;
                if let Some(to) = waiting {
                    self.out.push_back(Output::Expired { to, client, request });
                }
                return;
            }
            Seen::Applied(resp) => {
                self.stats.duplicates += 1;
                if let Some(to) = waiting {
                    match resp {
                        Some(resp) => {
                            let response = resp.clone();
                            self.out.push_back(Output::Reply { to, client, request, response });
                        }
                        None => {
                            self.reply_after_apply.insert((client, request), to);
                        }
                    }
                }
                return;
            }
        }
        assert!(session.index < e.index, "sessions are used in log order");
        session.index = e.index;
        // The answers the client says it has leave (`request` is not below
        // the floor: `seen` said new, and a command's floor is at most its
        // request), and a full window's oldest. Their buffers, if small,
        // hold the application's copies of the next commands (one
        // allocation and one free less per command at a client's steady
        // state).
        let spares = &mut self.spares;
        let forgotten = &mut self.stats.answers_forgotten;
        let mut keep = |answer: Option<Vec<u8>>| {
            if let Some(buffer) = answer
                && buffer.capacity() <= SPARE_MAX_BYTES
                && spares.len() < SPARES
            {
                spares.push(buffer);
            }
        };
        if answered_below > session.answered_below {
            session.answered_below = answered_below;
            while session.applied.oldest().is_some_and(|oldest| oldest < answered_below) {
                keep(session.applied.pop_first());
                *forgotten += 1;
            }
        }
        let fresh = session.applied.insert(request, None);
        debug_assert!(fresh, "a request the window holds was found above");
        while session.applied.len() > window {
            keep(session.applied.pop_first());
        }
        self.lru.touch(e.index, client);
        self.stats.sessions_evicted += self.lru.evict(&mut self.sessions, self.cfg.max_sessions.max(1));
        // The application's own copy (the entry's bytes stay shared with
        // the log).
        let payload = match self.spares.pop() {
            Some(mut buffer) if buffer.capacity() >= command.len() => {
                buffer.clear();
                buffer.extend_from_slice(command);
                buffer
            }
            _ => command.to_vec(),
        };
        self.out.push_back(Output::Apply(Apply {
            index: e.index,
            client,
            request,
            payload,
            reply_to: waiting,
        }));
    }

    /// Forgets the requests of a lost leadership: their clients retry. (Not
    /// a safety measure: an answer to `(client, request)` from the first
    /// committed application of it is right whoever proposed it.)
    fn leadership_check(&mut self) {
        let leader = self.node.is_leader();
        if self.was_leader && !leader {
            self.waiting.clear();
            self.reply_after_apply.clear();
            self.admin_waiting.clear();
        }
        self.was_leader = leader;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// The sorted ring answers as the `BTreeMap` it replaced: any mix
        /// of inserts (mostly ascending, some out of order, some repeated),
        /// fills and trims from the front.
        #[test]
        fn the_applied_window_behaves_as_an_ordered_map(
            ops in proptest::collection::vec((0u8..4, 0u64..8), 1..300),
        ) {
            let mut window = AppliedWindow::default();
            let mut model: BTreeMap<RequestId, Option<Vec<u8>>> = BTreeMap::new();
            let mut next = 100u64;
            for (op, d) in ops {
                match op {
                    0 | 1 => {
                        // Ascending, or up to 7 below the newest id.
                        let id = if op == 0 { next += 1 + d; next } else { next.saturating_sub(d) };
                        let fresh = !model.contains_key(&id);
                        prop_assert_eq!(window.insert(id, None), fresh);
                        model.entry(id).or_insert(None);
                    }
                    2 => {
                        let id = next.saturating_sub(d);
                        if let Some(slot) = model.get_mut(&id) {
                            *slot = Some(id.to_le_bytes().to_vec());
                        }
                        if let Some(slot) = window.get_mut(id) {
                            *slot = Some(id.to_le_bytes().to_vec());
                        }
                    }
                    _ => {
                        window.pop_first();
                        model.pop_first();
                    }
                }
                prop_assert_eq!(window.len(), model.len());
                // The id kept beside the ring is its last slot's.
                prop_assert_eq!(window.newest(), model.keys().next_back().copied());
                prop_assert_eq!(window.newest, window.slots.back().map_or(0, |s| s.0));
                prop_assert_eq!(window.oldest(), model.keys().next().copied());
                for probe in next.saturating_sub(10)..=next + 1 {
                    prop_assert_eq!(window.get(probe), model.get(&probe));
                }
                let flat: Vec<_> = window.iter().cloned().collect();
                let expect: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
                prop_assert_eq!(flat, expect);
            }
        }
    }

    proptest! {
        /// The lazy queue evicts what the `BTreeMap` keyed by index it
        /// replaced evicted: the session with the oldest last command,
        /// whatever mix of clients applies and however small the table,
        /// and it stays within its bound.
        #[test]
        fn the_lru_evicts_as_an_index_ordered_map(
            ops in proptest::collection::vec((0u64..40, 1usize..30, any::<bool>()), 1..600),
        ) {
            let mut sessions: Map<ClientId, Session> = Map::default();
            let mut lru = Lru::default();
            let mut model: BTreeMap<Index, ClientId> = BTreeMap::new();
            let mut previous = None;
            for (i, (client, max, again)) in ops.into_iter().enumerate() {
                // Half the commands repeat the previous client (a burst):
                // its item is moved up in place.
                let client = if again { previous.unwrap_or(client) } else { client };
                previous = Some(client);
                let index = i as Index + 1;
                let session = sessions.entry(client).or_default();
                if session.index > 0 {
                    model.remove(&session.index);
                }
                session.index = index;
                model.insert(index, client);
                lru.touch(index, client);
                let mut expect = Vec::new();
                while sessions.len() - expect.len() > max {
                    expect.push(model.pop_first().map(|(_, c)| c).unwrap());
                }
                let before: Vec<ClientId> = sessions.keys().copied().collect();
                prop_assert_eq!(lru.evict(&mut sessions, max), expect.len() as u64);
                let mut gone: Vec<ClientId> = before.into_iter().filter(|c| !sessions.contains_key(c)).collect();
                gone.sort_unstable();
                expect.sort_unstable();
                prop_assert_eq!(gone, expect);
                prop_assert!(lru.items.len() <= 2 * sessions.len() + Lru::SLACK);
                prop_assert_eq!(lru.items.iter().filter(|&&it| Lru::live(&sessions, it)).count(), sessions.len());
            }
            // Rebuilt from the table (a snapshot), it orders as the model.
            let mut rebuilt = Lru::of(&sessions);
            for (_, client) in model {
                prop_assert_eq!(rebuilt.pop_oldest(&sessions), Some(client));
            }
        }
    }

    proptest! {
        /// A snapshot completed from the table encoded at the cut, with the
        /// answers that came later spliced in, is byte for byte the
        /// encoding of the table with those answers in (what cloning the
        /// table at the cut and filling the clone gave), and decodes to it.
        #[test]
        fn a_snapshot_cut_then_answered_encodes_as_the_answered_table(
            table in proptest::collection::vec(
                (1u64..5, proptest::collection::vec((any::<bool>(), 0usize..20, any::<bool>()), 0..12)),
                0..10,
            ),
            app in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut sessions: Map<ClientId, Session> = Map::default();
            let mut later = Vec::new();
            let mut client = 0;
            for (gap, slots) in table {
                // Distinct ids, in no particular order of insertion.
                client = (client + gap) % 97;
                if sessions.contains_key(&client) {
                    continue;
                }
                let mut applied = AppliedWindow::default();
                for (k, (answered, len, answer_later)) in slots.into_iter().enumerate() {
                    let request = 100 + k as RequestId;
                    let answer = vec![client as u8 ^ k as u8; len];
                    applied.insert(request, answered.then(|| answer.clone()));
                    if !answered && answer_later {
                        later.push((client, request, answer));
                    }
                }
                sessions.insert(client, Session { applied, index: 7 + client, answered_below: client % 2 });
            }
            let mut pending = PendingSnapshot::cut(1_000, &sessions);
            // Every slot is answered again too (a request applied twice:
            // its session evicted, its retry proposed anew): the first
            // answer stays, in the snapshot as in the table.
            let again: Vec<(ClientId, RequestId)> = sessions
                .iter()
                .flat_map(|(c, s)| s.applied.iter().map(move |(r, _)| (*c, *r)))
                .collect();
            for (client, request, answer) in later.iter().rev() {
                pending.answer(*client, *request, answer);
                sessions.get_mut(client).unwrap().fill(*request, answer.clone());
            }
            for (client, request) in again {
                pending.answer(client, request, b"second");
                sessions.get_mut(&client).unwrap().fill(request, b"second".to_vec());
            }
            // An answer for a slot that was answered at the cut, or unknown,
            // changes nothing.
            pending.answer(999, 1, b"stray");
            let bytes = pending.complete(&app);
            prop_assert_eq!(&bytes, &encode_snapshot(&sessions, &app));
            let (back, tail) = decode_snapshot(&bytes, 1_000).unwrap();
            prop_assert_eq!(tail, &app[..]);
            prop_assert_eq!(back.len(), sessions.len());
        }
    }

    /// One command that evicts many sessions (the table's bound lowered)
    /// leaves the queue within its bound of the sessions left.
    #[test]
    fn the_lru_stays_bounded_when_one_command_evicts_many() {
        let mut sessions: Map<ClientId, Session> = Map::default();
        let mut lru = Lru::default();
        let mut index = 0;
        let mut apply =
            |client: ClientId, max: usize, sessions: &mut Map<ClientId, Session>, lru: &mut Lru| {
                index += 1;
                sessions.entry(client).or_default().index = index;
                lru.touch(index, client);
                lru.evict(sessions, max)
            };
        for client in [1, 2, 3] {
            assert_eq!(apply(client, 10, &mut sessions, &mut lru), 0);
        }
        for _ in 0..70 {
            apply(4, 10, &mut sessions, &mut lru);
        }
        assert_eq!(apply(5, 2, &mut sessions, &mut lru), 3);
        let mut left: Vec<_> = sessions.keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [4, 5]);
        assert!(lru.items.len() <= 2 * sessions.len() + Lru::SLACK, "{} items", lru.items.len());
    }

    #[test]
    fn commands_written_into_a_chunk_decode_as_written_and_share_it() {
        let mut chunk = BytesMut::new();
        let mut made = Vec::new();
        for i in 0..400u64 {
            // Mostly small, now and then larger than a quarter chunk.
            let len = if i % 50 == 7 { COMMAND_CHUNK } else { (i % 40) as usize };
            let payload: Vec<u8> = (0..len).map(|k| (k as u64 ^ i) as u8).collect();
            // Every third one says what its client has had answered.
            let answered_below = if i % 3 == 0 { 990 + i } else { 0 };
            let command = Command { client: 7 + i, request: 1_000 + i, answered_below, payload: &payload };
            let encoded = encode_command_into(&mut chunk, &command);
            assert_eq!(encoded, encode_command(&command), "command {i}");
            assert_eq!(decode_command(&encoded), Some(command));
            made.push(encoded);
        }
        // Small neighbours share a chunk: consecutive in memory.
        let (a, b) = (&made[2], &made[3]);
        assert_eq!(a.as_ptr() as usize + a.len(), b.as_ptr() as usize, "one chunk, one after the other");
        // A large one has a buffer of its own and leaves the chunk alone.
        let (before, large, after) = (&made[6], &made[7], &made[8]);
        assert_eq!(large.len(), COMMAND_HEADER + COMMAND_CHUNK);
        let large_answered = &made[57];
        assert_eq!(large_answered.len(), COMMAND_HEADER_ANSWERED + COMMAND_CHUNK);
        assert_eq!(before.as_ptr() as usize + before.len(), after.as_ptr() as usize);
        // A command cut inside its answered span is no command.
        let answered = &made[3];
        assert_eq!(answered[0], COMMAND_MAGIC_ANSWERED);
        assert_eq!(decode_command(&answered[..COMMAND_HEADER_ANSWERED - 1]), None);
        assert_eq!(decode_command(&[]), None);
        // Every earlier command is intact after the chunks were refilled.
        for (i, command) in made.iter().enumerate() {
            let Command { client, request, .. } = decode_command(command).unwrap();
            assert_eq!((client, request), (7 + i as u64, 1_000 + i as u64));
        }
    }

    #[test]
    fn a_snapshot_whose_session_ran_past_it_is_refused() {
        let mut sessions = Map::default();
        sessions.insert(1, Session { applied: AppliedWindow::default(), index: 4, answered_below: 0 });
        let bytes = encode_snapshot(&sessions, b"");
        assert!(decode_snapshot(&bytes, 4).is_ok());
        assert!(matches!(
            decode_snapshot(&bytes, 3),
            Err(ReplicaError::BadSnapshot { why: "session index beyond the snapshot", .. })
        ));
    }

    #[test]
    fn a_snapshot_of_the_first_format_reads_with_no_floors_and_one_below_its_floor_is_refused() {
        // The first format (before answered floors): client 9, index 3, one
        // slot (id 4, answer "ok"), then the application's bytes.
        let (count, client, index, slots, id, len) = (1u32, 9u64, 3u64, 1u32, 4u64, 2u32);
        let old = [
            &[SNAPSHOT_MAGIC][..],
            &count.to_le_bytes(),
            &client.to_le_bytes(),
            &index.to_le_bytes(),
            &slots.to_le_bytes(),
            &id.to_le_bytes(),
            &len.to_le_bytes(),
            b"okapp",
        ]
        .concat();
        let (sessions, app) = decode_snapshot(&old, 3).unwrap();
        let mut applied = AppliedWindow::default();
        applied.insert(4, Some(b"ok".to_vec()));
        assert_eq!(sessions.get(&9), Some(&Session { applied, index: 3, answered_below: 0 }));
        assert_eq!(app, b"app");
        // Written again, it takes the new format, and reads back the same.
        let again = encode_snapshot(&sessions, app);
        assert_eq!(again[0], SNAPSHOT_MAGIC_ANSWERED);
        assert_eq!(decode_snapshot(&again, 3).unwrap(), (sessions.clone(), &b"app"[..]));
        // A slot below its session's floor cannot be in a table.
        let mut sessions = sessions;
        sessions.get_mut(&9).unwrap().answered_below = 5;
        let bad = encode_snapshot(&sessions, b"");
        assert!(matches!(
            decode_snapshot(&bad, 3),
            Err(ReplicaError::BadSnapshot { why: "a request id below its session's answered floor", .. })
        ));
    }

    #[test]
    fn a_snapshot_with_repeated_or_unordered_request_ids_is_refused() {
        let mut sessions = Map::default();
        let mut applied = AppliedWindow::default();
        assert!(applied.insert(7, Some(b"a".to_vec())));
        assert!(!applied.insert(7, Some(b"b".to_vec())), "the window holds an id once");
        sessions.insert(1, Session { applied, index: 3, answered_below: 5 });
        let good = encode_snapshot(&sessions, b"app");
        let (back, app) = decode_snapshot(&good, 3).unwrap();
        assert_eq!((back, app), (sessions, &b"app"[..]));
        // One session's ids: the same twice, or descending.
        for ids in [[7u64, 7], [8, 7]] {
            let mut bad = vec![SNAPSHOT_MAGIC_ANSWERED];
            bad.extend_from_slice(&1u32.to_le_bytes());
            bad.extend_from_slice(&1u64.to_le_bytes());
            bad.extend_from_slice(&3u64.to_le_bytes());
            bad.extend_from_slice(&0u64.to_le_bytes());
            bad.extend_from_slice(&2u32.to_le_bytes());
            for id in ids {
                bad.extend_from_slice(&id.to_le_bytes());
                bad.extend_from_slice(&0u32.to_le_bytes());
            }
            assert!(matches!(
                decode_snapshot(&bad, 3),
                Err(ReplicaError::BadSnapshot { why: "request ids repeated or not ascending", .. })
            ));
        }
    }
}
