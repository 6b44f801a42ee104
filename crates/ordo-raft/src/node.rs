//! The Raft node: a sans-I/O state machine with an etcd-style `Ready` API.
//!
//! # Why one file
//!
//! This file is the Raft state machine as one room, as etcd raft's `raft.go`
//! is: elections, replication, commitment, snapshots and membership change
//! all read and write the same few fields (term, vote, role, log, commit,
//! progress), and their pre- and postconditions are easiest to check with
//! every transition in view. What does not need that shared state lives
//! beside it: the in-memory log in `log.rs`, a leader's view of one follower
//! in `progress.rs`, the messages in `message.rs` and their wire format in
//! `codec.rs`, the durable log in `storage/`, and the replicated state
//! machine that drives a node in `rsm.rs`.
//!
//! # Driving a node
//!
//! The node owns no thread, clock, socket, file or entropy. The caller
//! feeds it inputs and executes the effects it returns:
//!
//! ```text
//! loop {
//!     // inputs, in any order and number:
//!     node.tick();                       // one logical clock tick
//!     node.step(msg)?;                   // a message from the network
//!     node.propose(data)?;               // a client command (leader only)
//!     // effects:
//!     if node.has_ready() {
//!         let rd = node.ready();
//!         // 1. persist, in this order: rd.snapshot (replaces the whole log
//!         //    and restores the application), rd.entries (truncating the
//!         //    durable log from rd.entries[0].index first), rd.hard_state.
//!         // 2. only then send rd.messages.
//!         // 3. apply rd.committed in order (skipping Noop; decode
//!         //    Membership entries if the application cares).
//!         // 4. report durability:
//!         if let Some((index, term)) = rd.persist_point() { node.advance(index, term); }
//!     }
//! }
//! ```
//!
//! # The persistence contract
//!
//! - **Messages after persistence.** A message in `Ready::messages` may
//!   depend on the `hard_state`, `snapshot` and `entries` of the same
//!   `Ready` *and of every earlier one* (a vote on the persisted vote, an
//!   AppendReply on the persisted entries). The caller must make all of them
//!   durable, in the order the `Ready`s were returned, before sending it.
//!   `ready` may be called again before the previous one is persisted
//!   (pipelining / group commit), as long as that order is kept. A follower
//!   therefore acknowledges only durable entries.
//! - **`advance(index, term)` reports durability.** The caller reports that
//!   its durable log now holds everything up to `index` (whose term is
//!   `term`; [`Ready::persist_point`] gives the pair for one `Ready`). The
//!   node ignores a report whose (index, term) is no longer in its log (a
//!   suffix was overwritten in between), or that covers entries not yet
//!   handed out. A leader counts its own log toward a commit quorum only up
//!   to the durable index, so an entry is never committed on the strength of
//!   a leader's volatile copy. `committed` entries are handed out only up to
//!   the durable index too.
//! - **Dropping effects is allowed, reordering persistence is not.**
//!   Messages may be lost, duplicated or reordered by the network; the node
//!   copes. Skipping or reordering persistence breaks safety.
//!
//! # Recovery and bootstrap
//!
//! [`Node::new`] takes what the durable log recovered ([`Recovered`]). The
//! application must restore its state from `recovered.snapshot` (if any)
//! itself; the node then re-delivers the committed entries after the
//! snapshot in `Ready::committed`. The membership in force is the last
//! Membership entry of the log, else the snapshot's, else the
//! `initial_membership` given to `new` (the same on every founding node of
//! a fresh cluster; a node that joins later starts with an empty one and
//! learns the real one from the leader).
//!
//! # Protocol (Raft paper Fig. 2, Raft thesis, r3p2 Ch. 3)
//!
//! - Elections (§5.2) with randomized timeouts in `[election_ticks,
//!   2*election_ticks)`, optional pre-vote (thesis §9.6), leader stickiness
//!   (a node that heard from a leader within `election_ticks` ignores
//!   (pre)vote requests unless they come from a leadership transfer), and
//!   optional check-quorum (a leader that has not heard from a quorum of
//!   voters within `election_ticks` steps down).
//! - A new leader appends a Noop entry of its term (§8) and only commits
//!   entries of its own term by counting (§5.4.2).
//! - Replication: batched AppendEntries (`max_entries_per_append`,
//!   `max_bytes_per_append`), pipelined up to `max_inflight_appends` per
//!   follower; a client proposal is sent with the next `ready` (not at
//!   once), so the proposals of one batch of inputs leave in one
//!   AppendEntries per follower (up to the batch limit), and a commit
//!   index that moved is announced with it (an empty append only to
//!   followers that get no entries; with `Config::announce_commit` off,
//!   no empty append at all: it waits for the next entries or heartbeat);
//!   fast backtracking with a
//!   (hint_index, hint_term) reject hint; heartbeats are empty
//!   AppendEntries carrying the leader's commit index. A follower
//!   commits `min(leader_commit, highest index it has verified to match
//!   this leader in this term)`.
//! - Entries are shared, not copied: followers at the same next index get
//!   one slice of the log ([`Entries`]), and when exactly that slice
//!   commits the leader hands it out again as `Ready::committed`.
//! - Snapshots: [`Node::compact`] drops the applied prefix; a follower
//!   needing compacted entries gets an InstallSnapshot.
//! - Membership: one server at a time (thesis §4.1): AddLearner,
//!   PromoteLearner (only when caught up), RemoveServer. A configuration
//!   takes effect when its entry is appended (by leader and followers
//!   alike) and is rolled back if that entry is overwritten. At most one
//!   uncommitted change, and none before the leader has committed an entry
//!   of its own term (the fix for the single-server change bug). A leader
//!   that removed itself keeps leading, without counting itself, until the
//!   change commits, then steps down (after sending TimeoutNow to the most
//!   up-to-date voter).
//!
//! # Invariants (Raft paper Fig. 3)
//!
//! - **Election safety**: at most one leader per term — a node votes at most
//!   once per term (the vote is persisted before the reply leaves) and a
//!   candidate needs a quorum of the voters of its configuration.
//! - **Leader append-only**: a leader never overwrites or deletes entries of
//!   its log (asserted in `RaftLog::push`; `truncate_from` is only reached
//!   as follower).
//! - **Log matching**: entries with the same index and term are identical,
//!   as are the logs up to them — the AppendEntries consistency check on
//!   (`prev_index`, `prev_term`).
//! - **Leader completeness**: a committed entry is in every later leader's
//!   log — votes go only to candidates at least as up to date (§5.4.1), and a
//!   commit needs a quorum of *durable* copies.
//! - **State machine safety**: entries reach `Ready::committed` once, in
//!   index order, and a follower never truncates at or below its commit index
//!   (such a message is dropped as invalid).
//!
//! Peer input never panics the node: `step` validates every message
//! (`Message::validate`) and every index a peer names is range-checked.

use crate::codec::{DecodeError, DecodeLimits, decode_membership, encode_membership};
use crate::config::{Config, ConfigError};
use crate::log::RaftLog;
use crate::message::Message;
use crate::progress::{Progress, ReplicationState};
use crate::rng::SplitMix64;
use crate::types::{
    Entries, Entry, EntryKind, HardState, Index, Membership, NodeId, Recovered, Snapshot, SnapshotMeta, Term,
};
use bytes::Bytes;
use std::collections::BTreeMap;

/// A node's role (Raft §5.1, plus the pre-vote phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Follower,
    /// Running a pre-vote round; the term has not been incremented.
    PreCandidate,
    Candidate,
    Leader,
}

/// The volatile state a caller may want to observe (not persisted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftState {
    pub role: Role,
    pub leader: Option<NodeId>,
    pub term: Term,
}

/// The effects accumulated since the last [`Node::ready`] (see the module
/// docs for what the caller must do with each, and in which order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ready {
    /// Set when role, leader or term changed.
    pub soft_state: Option<SoftState>,
    /// Set when term, vote or commit changed: persist before sending.
    pub hard_state: Option<HardState>,
    /// A snapshot received from the leader: persist it (it replaces the
    /// whole durable log) and restore the application from it.
    pub snapshot: Option<Snapshot>,
    /// Entries to append durably. If `entries[0].index` is at or below the
    /// durable log's last index, the durable log must first be truncated from
    /// `entries[0].index` (a conflicting suffix is being replaced).
    /// Empty where [`Config::hand_out_entries`] is off (the caller keeps no
    /// log of its own); [`Ready::appended`] still names their end.
    pub entries: Vec<Entry>,
    /// The (index, term) of the last entry this `Ready` hands out for
    /// persistence: the last of `entries`, also where they are not handed
    /// out (`Config::hand_out_entries` off).
    pub appended: Option<(Index, Term)>,
    /// Messages to send once the above (and all earlier `Ready`s) are durable.
    pub messages: Vec<Message>,
    /// Committed entries to apply, in order, each exactly once. Includes Noop
    /// and Membership entries (the application skips what it does not use).
    /// They are always already durable locally (reported via `advance`), so
    /// they may be applied before or while this `Ready` is persisted. Not
    /// bounded in number: after a long outage it may hold the whole backlog.
    /// On a leader in the steady state these are the entries of an earlier
    /// append to the followers, shared, not cloned again.
    pub committed: Entries,
}

impl Ready {
    /// The (index, term) to pass to [`Node::advance`] once this `Ready`'s
    /// snapshot and entries are durable, if it has any.
    pub fn persist_point(&self) -> Option<(Index, Term)> {
        debug_assert!(
            self.entries.last().is_none_or(|e| self.appended == Some((e.index, e.term))),
            "appended names the last entry handed out"
        );
        if self.appended.is_some() {
            return self.appended;
        }
        self.snapshot.as_ref().map(|s| (s.meta.index, s.meta.term))
    }

    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.soft_state.is_none()
            && self.hard_state.is_none()
            && self.snapshot.is_none()
            && self.entries.is_empty()
            && self.appended.is_none()
            && self.messages.is_empty()
            && self.committed.is_empty()
    }
}

/// A one-server-at-a-time membership change (Raft thesis §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MembershipChange {
    /// Add a non-voting member that receives the log.
    AddLearner(NodeId),
    /// Make a caught-up learner a voter.
    PromoteLearner(NodeId),
    /// Remove a voter or learner (possibly the leader itself).
    RemoveServer(NodeId),
}

/// Why a proposal was refused. Nothing was appended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// Only the leader accepts proposals; `leader` is the last known one.
    #[error("not the leader (leader hint: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    /// `max_uncommitted_entries` are already waiting to commit.
    #[error("too many uncommitted entries")]
    Busy,
    /// The data is larger than `max_entry_bytes`.
    #[error("entry of {len} bytes exceeds max_entry_bytes {max}")]
    TooLarge { len: u64, max: u64 },
    /// A membership change is uncommitted, or this leader has not yet
    /// committed an entry of its term.
    #[error("a membership change is pending")]
    ChangePending,
    /// The learner's log is not within `learner_catchup_gap` of the leader's
    /// (or, for a transfer, the target is not fully caught up).
    #[error("node {id} has not caught up (match {match_index}, last {last_index})")]
    NotCaughtUp { id: NodeId, match_index: Index, last_index: Index },
    /// The change does not apply to the current membership.
    #[error("invalid membership change: {0}")]
    InvalidChange(&'static str),
}

/// Why [`Node::new`] refused its input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("invalid config: {0}")]
    Config(#[from] ConfigError),
    #[error("recovered log is not contiguous: expected index {expected}, found {found}")]
    NonContiguousLog { expected: Index, found: Index },
    #[error("recovered entry {index} has term {term} out of order")]
    TermOutOfOrder { index: Index, term: Term },
    /// No longer returned: a log ahead of the hard state is a crash between
    /// the log's sync and the hard state's write, and recovers (`Node::new`).
    #[error("recovered log or snapshot has term {found} above the hard state's term {hard_term}")]
    TermAboveHardState { found: Term, hard_term: Term },
    #[error("membership at index {index} does not decode: {error}")]
    CorruptMembership { index: Index, error: DecodeError },
    #[error("initial membership is invalid: {0}")]
    InvalidInitialMembership(DecodeError),
}

/// Why [`Node::step`] dropped a message (also counted in [`NodeStats`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    #[error("message for node {to} delivered to node {me}")]
    WrongRecipient { to: NodeId, me: NodeId },
    #[error("malformed message: {0}")]
    Invalid(#[from] DecodeError),
}

/// Why [`Node::compact`] refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompactError {
    #[error("index {index} is at or below the current snapshot {snapshot}")]
    AlreadyCompacted { index: Index, snapshot: Index },
    #[error("index {index} has not been applied (applied {applied})")]
    NotApplied { index: Index, applied: Index },
}

/// Counters of messages the node dropped or ignored, and of committed
/// batches handed out without a copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub wrong_recipient: u64,
    pub invalid: u64,
    pub stale_term: u64,
    pub ignored_in_lease: u64,
    /// Well-formed but meaningless in the current state (e.g. an AppendReply
    /// at a follower, a success for an index beyond our log).
    pub unexpected: u64,
    /// `Ready::committed` handed out as the entries of the leader's newest
    /// shared append (no clone of each entry from the log).
    pub committed_shared: u64,
}

/// A Raft node (see the module docs).
pub struct Node {
    config: Config,
    /// Structural limits for messages handed to `step` in-process.
    limits: DecodeLimits,
    rng: SplitMix64,
    role: Role,
    term: Term,
    vote: Option<NodeId>,
    leader: Option<NodeId>,
    log: RaftLog,
    commit: Index,
    /// Highest index handed out in `Ready::committed` (or restored from a
    /// snapshot).
    applied: Index,
    /// The membership in force (latest in the log) and its entry's index.
    membership: Membership,
    membership_index: Index,
    /// The bootstrap membership, in force at index 0.
    initial_membership: Membership,
    election_elapsed: u64,
    heartbeat_elapsed: u64,
    randomized_election_ticks: u64,
    /// Candidate / pre-candidate: responses from voters.
    votes: BTreeMap<NodeId, bool>,
    /// Leader: one per other member.
    progress: BTreeMap<NodeId, Progress>,
    /// Follower: highest index verified to match the current leader's log in
    /// this term (bounds the commit index we accept).
    leader_verified: Index,
    /// Leader: the voter being handed leadership, and ticks since.
    transfer: Option<(NodeId, u64)>,
    /// Leader: client entries appended since the last `ready` and not yet
    /// offered to the followers (in `ready`, as few AppendEntries per
    /// follower as `max_entries_per_append` allows).
    append_pending: bool,
    /// Leader: the commit index moved since the last `ready`; followers
    /// not told by an append with entries get an empty one carrying it.
    commit_pending: bool,
    messages: Vec<Message>,
    /// Leader: the entries of the newest append slice shared by followers
    /// (empty if none; of several, the one starting highest). When exactly they commit (the steady state: a
    /// batch's appends are answered together), `ready` hands them out as
    /// `Ready::committed` instead of cloning each entry from the log again.
    /// Dropped once the applied index reaches them; at most one append's
    /// worth of entries is held.
    recent_append: Entries,
    /// `maybe_commit`'s match indexes (kept, so that it allocates nothing).
    match_scratch: Vec<Index>,
    last_hard_state: HardState,
    last_soft_state: SoftState,
    stats: NodeStats,
}

impl Node {
    /// Builds a node from its configuration and what its durable log
    /// recovered (see "Recovery and bootstrap" in the module docs).
    pub fn new(
        config: Config,
        recovered: Recovered,
        initial_membership: Membership,
    ) -> Result<Node, NodeError> {
        config.validate()?;
        let limits = DecodeLimits {
            max_entries: usize::MAX,
            max_entry_bytes: u64::MAX,
            max_snapshot_bytes: u64::MAX,
            max_members: usize::MAX,
        };
        crate::codec::validate_membership(&initial_membership, &limits)
            .map_err(NodeError::InvalidInitialMembership)?;
        let Recovered { hard_state: durable_hard_state, snapshot, entries } = recovered;
        let snapshot = snapshot.unwrap_or_default();
        // The snapshot and the entries are made durable before the hard state
        // (see the persistence contract), so a crash in between recovers a
        // log whose terms run ahead of the hard state's. The node saw those
        // terms; it cast no vote in them that reached anyone (a vote leaves
        // only after its hard state is durable), so it resumes in the
        // highest such term with no vote (persisted by its first `Ready`).
        let mut hard_state = durable_hard_state;
        let seen = entries.last().map_or(snapshot.meta.term, |e| e.term.max(snapshot.meta.term));
        if seen > hard_state.term {
            hard_state = HardState { term: seen, vote: None, commit: hard_state.commit };
        }
        let mut term = snapshot.meta.term;
        for (expected, e) in (snapshot.meta.index + 1..).zip(entries.iter()) {
            if e.index != expected {
                return Err(NodeError::NonContiguousLog { expected, found: e.index });
            }
            if e.term < term || e.term == 0 {
                return Err(NodeError::TermOutOfOrder { index: e.index, term: e.term });
            }
            if e.kind == EntryKind::Membership {
                decode_membership(&e.data, &limits)
                    .map_err(|error| NodeError::CorruptMembership { index: e.index, error })?;
            }
            term = e.term;
        }
        let log = RaftLog::recovered(snapshot, entries);
        let commit = hard_state.commit.clamp(log.snapshot_index(), log.last_index());
        let applied = log.snapshot_index();
        let soft = SoftState { role: Role::Follower, leader: None, term: hard_state.term };
        let mut node = Node {
            rng: SplitMix64::new(config.seed),
            config,
            limits,
            role: Role::Follower,
            term: hard_state.term,
            vote: hard_state.vote,
            leader: None,
            log,
            commit,
            applied,
            membership: Membership::default(),
            membership_index: 0,
            initial_membership,
            election_elapsed: 0,
            heartbeat_elapsed: 0,
            randomized_election_ticks: 0,
            votes: BTreeMap::new(),
            progress: BTreeMap::new(),
            leader_verified: 0,
            transfer: None,
            append_pending: false,
            commit_pending: false,
            messages: Vec::new(),
            recent_append: Entries::default(),
            match_scratch: Vec::new(),
            last_hard_state: durable_hard_state,
            last_soft_state: soft,
            stats: NodeStats::default(),
        };
        node.recompute_membership();
        node.reset_election_timer();
        assert_eq!(node.role, Role::Follower, "a node starts as a follower");
        assert!(node.term >= node.log.last_term(), "recovered: no entry from a term above ours");
        assert!(node.term >= durable_hard_state.term, "recovered: the term never goes back");
        assert!(node.log.snapshot_index() <= node.commit, "recovered: the snapshot is committed");
        assert!(node.commit <= node.log.last_index(), "recovered: commit beyond the log");
        assert_eq!(node.applied, node.log.snapshot_index(), "recovered: applied is the snapshot");
        assert_eq!(node.log.persisted, node.log.last_index(), "recovered: the whole log is durable");
        Ok(node)
    }

    // ----- queries -------------------------------------------------------

    pub fn id(&self) -> NodeId {
        self.config.id
    }
    pub fn role(&self) -> Role {
        self.role
    }
    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }
    /// The leader of the current term, if known.
    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }
    pub fn term(&self) -> Term {
        self.term
    }
    pub fn vote(&self) -> Option<NodeId> {
        self.vote
    }
    pub fn commit_index(&self) -> Index {
        self.commit
    }
    /// The highest index handed out in `Ready::committed` or restored from a
    /// snapshot.
    pub fn applied_index(&self) -> Index {
        self.applied
    }
    /// The highest index the caller reported durable.
    pub fn persisted_index(&self) -> Index {
        self.log.persisted
    }
    pub fn first_index(&self) -> Index {
        let first = self.log.first_index();
        assert!(first >= 1, "indexes start at 1");
        first
    }
    pub fn last_index(&self) -> Index {
        self.log.last_index()
    }
    pub fn last_term(&self) -> Term {
        self.log.last_term()
    }
    /// The term of the entry at `index`, if it is in the log (or is the
    /// snapshot's last index).
    pub fn term_at(&self, index: Index) -> Option<Term> {
        self.log.term(index)
    }
    /// The entry at `index`, if it is in the in-memory log.
    pub fn entry(&self, index: Index) -> Option<&Entry> {
        self.log.entry(index)
    }
    /// The membership in force (the latest in the log, committed or not).
    pub fn membership(&self) -> &Membership {
        &self.membership
    }
    /// Whether the latest membership entry is not committed yet.
    pub fn membership_change_pending(&self) -> bool {
        self.membership_index > self.commit
    }
    /// The latest snapshot's metadata (index 0: none).
    pub fn snapshot_meta(&self) -> &SnapshotMeta {
        &self.log.snapshot.meta
    }
    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn stats(&self) -> NodeStats {
        self.stats
    }
    /// Leader only: the highest index known replicated on `id`.
    pub fn match_index(&self, id: NodeId) -> Option<Index> {
        if id == self.config.id {
            return (self.role == Role::Leader).then_some(self.log.persisted);
        }
        let match_index = self.progress.get(&id).map(|p| p.match_index);
        assert!(match_index.is_none_or(|m| m <= self.log.last_index()), "match beyond the leader's log");
        match_index
    }
    pub fn soft_state(&self) -> SoftState {
        SoftState { role: self.role, leader: self.leader, term: self.term }
    }
    pub fn hard_state(&self) -> HardState {
        HardState { term: self.term, vote: self.vote, commit: self.commit }
    }

    // ----- inputs --------------------------------------------------------

    /// One logical clock tick.
    pub fn tick(&mut self) {
        let term = self.term;
        match self.role {
            Role::Leader => self.tick_leader(),
            _ => {
                self.election_elapsed += 1;
                if self.election_elapsed >= self.randomized_election_ticks && self.is_voter() {
                    self.start_campaign(self.config.pre_vote, false);
                }
                assert!(
                    self.role == Role::Leader
                        || !self.is_voter()
                        || self.election_elapsed < self.randomized_election_ticks,
                    "a voter campaigns when its election timeout expires"
                );
            }
        }
        assert!(self.term >= term, "tick: the term never goes back");
    }

    /// Starts an election now (with pre-vote if configured), e.g. to
    /// bootstrap a cluster without waiting for a timeout. Ignored by a
    /// leader and by non-voters.
    pub fn campaign(&mut self) {
        if self.role != Role::Leader && self.is_voter() {
            self.start_campaign(self.config.pre_vote, false);
            assert_ne!(self.role, Role::Follower, "campaign: our own vote refuses nothing");
        }
    }

    /// Handles one message from the network. Malformed messages and
    /// messages for another node are dropped with an error; stale or
    /// meaningless ones are ignored (and counted in [`NodeStats`]).
    pub fn step(&mut self, msg: Message) -> Result<(), StepError> {
        if msg.to() != self.config.id {
            self.stats.wrong_recipient += 1;
            return Err(StepError::WrongRecipient { to: msg.to(), me: self.config.id });
        }
        if let Err(e) = msg.validate(&self.limits) {
            self.stats.invalid += 1;
            return Err(e.into());
        }
        let (term, from) = (msg.term(), msg.from());
        let (term_before, vote_before) = (self.term, self.vote);
        if term > self.term {
            match &msg {
                Message::PreVote { .. } | Message::RequestVote { .. } => {
                    let transfer = matches!(msg, Message::RequestVote { transfer: true, .. });
                    if !transfer && self.in_lease() {
                        self.stats.ignored_in_lease += 1;
                        return Ok(());
                    }
                }
                _ => {}
            }
            match &msg {
                // A pre-vote does not change anybody's term.
                Message::PreVote { .. } | Message::PreVoteReply { granted: true, .. } => {}
                Message::AppendEntries { .. } | Message::InstallSnapshot { .. } => {
                    self.become_follower(term, Some(from));
                }
                _ => self.become_follower(term, None),
            }
        } else if term < self.term {
            match &msg {
                // A leader of an older term (perhaps partitioned, or we
                // raised our term while partitioned): tell it our term so it
                // steps down. Leader stickiness means our vote requests may
                // never reach it otherwise.
                Message::AppendEntries { .. } | Message::InstallSnapshot { .. } => {
                    self.send(Message::AppendReply {
                        term: self.term,
                        from: self.config.id,
                        to: from,
                        success: false,
                        index: 0,
                        hint_index: 0,
                        hint_term: 0,
                    });
                }
                Message::PreVote { .. } => {
                    self.send(Message::PreVoteReply {
                        term: self.term,
                        from: self.config.id,
                        to: from,
                        granted: false,
                    });
                }
                _ => {}
            }
            self.stats.stale_term += 1;
            return Ok(());
        }
        assert!(
            term == self.term
                || (term > self.term
                    && matches!(msg, Message::PreVote { .. } | Message::PreVoteReply { granted: true, .. })),
            "step: only a pre-vote or its grant is handled in a term other than ours"
        );
        match msg {
            Message::PreVote { term, from, last_log_index, last_log_term, .. } => {
                self.on_vote_request(true, term, from, last_log_index, last_log_term);
            }
            Message::RequestVote { term, from, last_log_index, last_log_term, .. } => {
                self.on_vote_request(false, term, from, last_log_index, last_log_term);
            }
            Message::PreVoteReply { term, from, granted, .. } => {
                if granted && term != self.term + 1 {
                    self.stats.unexpected += 1;
                } else {
                    self.on_vote_reply(Role::PreCandidate, from, granted);
                }
            }
            Message::VoteReply { from, granted, .. } => self.on_vote_reply(Role::Candidate, from, granted),
            Message::AppendEntries { from, prev_index, prev_term, entries, leader_commit, .. } => {
                if !self.accept_leader(from) {
                    return Ok(());
                }
                self.on_append_entries(from, prev_index, prev_term, entries.into_vec(), leader_commit);
            }
            Message::InstallSnapshot { from, snapshot, .. } => {
                if !self.accept_leader(from) {
                    return Ok(());
                }
                self.on_install_snapshot(from, snapshot);
            }
            Message::AppendReply { from, success, index, hint_index, hint_term, .. } => {
                self.on_append_reply(from, success, index, hint_index, hint_term);
            }
            Message::SnapshotReply { from, index, .. } => self.on_snapshot_reply(from, index),
            Message::TimeoutNow { from, .. } => {
                if self.role != Role::Leader && self.is_voter() && self.leader == Some(from) {
                    self.start_campaign(false, true);
                } else {
                    self.stats.unexpected += 1;
                }
            }
        }
        assert!(self.term >= term_before, "step: the term never goes back");
        assert!(
            self.term != term_before || vote_before.is_none() || self.vote == vote_before,
            "step: at most one vote per term"
        );
        self.debug_check();
        Ok(())
    }

    /// Appends a client command (leader only); returns its index. The entry
    /// is committed once a quorum of voters has it durably. `data` is a
    /// `Vec<u8>`, or `Bytes` (e.g. a slice of a buffer several commands
    /// share, which spares an allocation per command).
    pub fn propose(&mut self, data: impl Into<Bytes>) -> Result<Index, ProposeError> {
        let data = data.into();
        let len = data.len() as u64;
        self.check_can_propose(len)?;
        assert!(len <= self.config.max_entry_bytes, "propose: entry within max_entry_bytes");
        Ok(self.append_and_replicate(EntryKind::Normal, data))
    }

    /// Proposes a one-server membership change (leader only; see the module
    /// docs). The new membership takes effect at once; returns the entry's
    /// index.
    pub fn propose_membership(&mut self, change: MembershipChange) -> Result<Index, ProposeError> {
        self.check_can_propose(0)?;
        if self.membership_change_pending() || self.log.term(self.commit) != Some(self.term) {
            return Err(ProposeError::ChangePending);
        }
        assert!(self.membership_index <= self.commit, "at most one uncommitted membership change");
        let mut next = self.membership.clone();
        match change {
            MembershipChange::AddLearner(id) => {
                if id == 0 {
                    return Err(ProposeError::InvalidChange("node id 0 is reserved"));
                }
                if next.contains(id) {
                    return Err(ProposeError::InvalidChange("already a member"));
                }
                next.learners.insert(id);
                assert!(next.learners.contains(&id) && !next.voters.contains(&id), "added as a learner");
            }
            MembershipChange::PromoteLearner(id) => {
                if !next.learners.contains(&id) {
                    return Err(ProposeError::InvalidChange("not a learner"));
                }
                let match_index = self.progress.get(&id).map_or(0, |p| p.match_index);
                let last_index = self.log.last_index();
                if match_index.saturating_add(self.config.learner_catchup_gap) < last_index {
                    return Err(ProposeError::NotCaughtUp { id, match_index, last_index });
                }
                next.learners.remove(&id);
                next.voters.insert(id);
                assert!(next.voters.contains(&id) && !next.learners.contains(&id), "promoted to voter");
            }
            MembershipChange::RemoveServer(id) => {
                if !next.contains(id) {
                    return Err(ProposeError::InvalidChange("not a member"));
                }
                next.voters.remove(&id);
                next.learners.remove(&id);
                if next.voters.is_empty() {
                    return Err(ProposeError::InvalidChange("cannot remove the last voter"));
                }
                assert!(!next.contains(id), "removed from the membership");
            }
        }
        assert!(!next.voters.is_empty(), "a membership keeps at least one voter");
        assert_ne!(next, self.membership, "a membership change changes the membership");
        let mut data = Vec::new();
        encode_membership(&next, &mut data);
        let index = self.append_and_replicate(EntryKind::Membership, data.into());
        assert_eq!(self.membership_index, index, "a membership takes effect when appended");
        assert!(self.membership_change_pending(), "a new membership is not committed yet");
        Ok(index)
    }

    /// Asks the leader to hand leadership to voter `target` (thesis §3.10):
    /// once `target` has the whole log it is sent TimeoutNow. Abandoned after
    /// an election timeout.
    pub fn transfer_leadership(&mut self, target: NodeId) -> Result<(), ProposeError> {
        if self.role != Role::Leader {
            return Err(ProposeError::NotLeader { leader: self.leader });
        }
        if target == self.config.id || !self.membership.voters.contains(&target) {
            return Err(ProposeError::InvalidChange("transfer target is not another voter"));
        }
        self.transfer = Some((target, 0));
        self.maybe_send_timeout_now(target);
        if self.transfer.is_some() {
            self.send_append(target, false);
        }
        assert_eq!(self.role, Role::Leader, "transfer: still the leader until the target campaigns");
        assert!(self.transfer.is_none_or(|(t, ticks)| t == target && ticks == 0), "transfer: to target");
        Ok(())
    }

    /// Reports that the durable log holds everything up to `index`, whose
    /// term is `term` (see "The persistence contract").
    pub fn advance(&mut self, index: Index, term: Term) {
        if self.log.pending_snapshot || index > self.log.stable || index <= self.log.persisted {
            return;
        }
        if self.log.term(index) != Some(term) {
            return;
        }
        assert!(self.log.persisted < index && index <= self.log.stable, "advance: only handed-out entries");
        self.log.persisted = index;
        if self.role == Role::Leader {
            self.maybe_commit();
        }
        assert_eq!(self.log.persisted, index, "advance: the durable index moved to index");
        self.debug_check();
    }

    /// The application has a snapshot of its state through `index` (which it
    /// has applied): drop the log up to it. Returns the snapshot's metadata,
    /// which the caller persists with `data`. Followers that later need
    /// entries before the new first index get an InstallSnapshot of it.
    pub fn compact(&mut self, index: Index, data: Vec<u8>) -> Result<SnapshotMeta, CompactError> {
        let snapshot_index = self.log.snapshot_index();
        if index <= snapshot_index {
            return Err(CompactError::AlreadyCompacted { index, snapshot: snapshot_index });
        }
        if index > self.applied {
            return Err(CompactError::NotApplied { index, applied: self.applied });
        }
        assert!(!self.log.pending_snapshot, "compact: no installed snapshot is pending");
        assert!(index <= self.commit, "compact: only committed entries are compacted");
        let last_index = self.log.last_index();
        let term = self.log.term(index).expect("applied entries are in the log");
        let meta = SnapshotMeta { index, term, membership: self.membership_at(index) };
        self.log.compact(Snapshot { meta: meta.clone(), data });
        assert_eq!(self.log.snapshot_index(), index, "compact: the snapshot ends at index");
        assert_eq!(self.log.last_index(), last_index, "compact: the last index is unchanged");
        assert_eq!(self.log.term(index), Some(term), "compact: the snapshot keeps index's term");
        self.debug_check();
        Ok(meta)
    }

    // ----- effects -------------------------------------------------------

    /// Whether [`Node::ready`] would return something.
    pub fn has_ready(&self) -> bool {
        assert!(self.applied <= self.commit, "applied beyond commit");
        self.soft_state() != self.last_soft_state
            || self.hard_state() != self.last_hard_state
            || self.log.pending_snapshot
            || self.log.has_unstable()
            || !self.messages.is_empty()
            || self.append_pending
            || (self.commit_pending && self.announces())
            || self.commit.min(self.log.persisted) > self.applied
    }

    /// Takes the accumulated effects (see the module docs).
    pub fn ready(&mut self) -> Ready {
        assert!(self.applied <= self.commit, "ready: applied beyond commit");
        let (proposals, commit) =
            (std::mem::take(&mut self.append_pending), std::mem::take(&mut self.commit_pending));
        // The newest shared append before this call's: what may commit now
        // (this call's proposals replace it with their own).
        let recent = std::mem::take(&mut self.recent_append);
        if self.role == Role::Leader {
            if proposals {
                self.offer_proposals();
            }
            if commit {
                // Followers that the proposals' appends did not tell
                // (`commit_sent`), and any entries they still lack.
                self.broadcast_append(false);
            }
        }
        let mut rd = Ready::default();
        let soft = self.soft_state();
        if soft != self.last_soft_state {
            rd.soft_state = Some(soft);
            self.last_soft_state = soft;
        }
        let hard = self.hard_state();
        if hard != self.last_hard_state {
            rd.hard_state = Some(hard);
            self.last_hard_state = hard;
        }
        if self.log.pending_snapshot {
            self.log.pending_snapshot = false;
            rd.snapshot = Some(self.log.snapshot.clone());
            self.applied = self.applied.max(self.log.snapshot_index());
        }
        assert!(
            self.applied >= self.log.snapshot_index(),
            "ready: the application holds everything up to the snapshot"
        );
        let persisted = self.log.persisted;
        if self.log.has_unstable() {
            let last = self.log.last_index();
            rd.appended = Some((last, self.log.last_term()));
            if self.config.hand_out_entries {
                rd.entries = self.log.take_unstable();
            } else {
                self.log.mark_stable();
            }
        }
        assert_eq!(self.log.stable, self.log.last_index(), "ready: every entry has been handed out");
        assert!(rd.entries.first().is_none_or(|e| e.index > persisted), "ready: durable entries again");
        assert!(
            rd.entries.last().is_none_or(|e| e.index == self.log.last_index()),
            "ready: entries run to the end of the log"
        );
        rd.messages = std::mem::take(&mut self.messages);
        let applicable = self.commit.min(self.log.persisted);
        if applicable > self.applied {
            rd.committed = self.committed_entries(applicable, recent);
            assert_eq!(
                rd.committed.first().map(|e| e.index),
                Some(self.applied + 1),
                "ready: committed entries follow the applied index"
            );
            assert_eq!(
                rd.committed.len() as u64,
                applicable - self.applied,
                "ready: committed entries are handed out without a gap"
            );
            self.applied = applicable;
        } else {
            self.keep_recent(recent);
        }
        assert!(self.applied <= self.commit, "ready: applied beyond commit");
        rd
    }

    /// The entries after the applied index through `applicable`: the
    /// shared append `recent`'s when it holds exactly those (an entry with
    /// the log's index and term is the log's entry, and so is everything
    /// before it back to the append's first index), else cloned from the
    /// log. `recent` is dropped once the applied index reaches it, else
    /// kept for a later call (unless a newer append took its place).
    fn committed_entries(&mut self, applicable: Index, recent: Entries) -> Entries {
        let lo = self.applied + 1;
        match (recent.first(), recent.last()) {
            (Some(first), Some(last)) if last.index <= applicable => {
                if first.index == lo
                    && last.index == applicable
                    && self.log.term(last.index) == Some(last.term)
                {
                    self.stats.committed_shared += 1;
                    return recent;
                }
            }
            _ => self.keep_recent(recent),
        }
        self.log.slice(lo, applicable, usize::MAX, u64::MAX).into()
    }

    /// Keeps `recent` as the newest shared append unless a newer one (this
    /// `ready`'s) took its place.
    fn keep_recent(&mut self, recent: Entries) {
        if self.recent_append.is_empty() {
            self.recent_append = recent;
        }
    }

    // ----- elections -----------------------------------------------------

    fn is_voter(&self) -> bool {
        self.membership.voters.contains(&self.config.id)
    }

    /// Heard from a leader within the minimum election timeout (a leader is
    /// always in its own lease; with check-quorum it steps down otherwise).
    fn in_lease(&self) -> bool {
        self.leader.is_some() && self.election_elapsed < self.config.election_ticks
    }

    fn reset_election_timer(&mut self) {
        self.election_elapsed = 0;
        let min = self.config.election_ticks;
        self.randomized_election_ticks = min + self.rng.below(min);
        assert!(
            self.randomized_election_ticks >= min && self.randomized_election_ticks < 2 * min,
            "election timeout in [election_ticks, 2 * election_ticks)"
        );
    }

    fn become_follower(&mut self, term: Term, leader: Option<NodeId>) {
        assert!(term >= self.term, "become_follower: the term never goes back");
        assert_ne!(leader, Some(self.config.id), "become_follower: we are not the leader");
        // A follower offers no entries and announces no commit index (and
        // keeps no append of its leadership for `Ready::committed`).
        (self.append_pending, self.commit_pending) = (false, false);
        self.recent_append = Entries::default();
        if term > self.term {
            self.term = term;
            self.vote = None;
            self.leader_verified = 0;
        }
        if self.role != Role::Follower {
            self.leader_verified = 0;
        }
        self.role = Role::Follower;
        self.leader = leader;
        self.votes.clear();
        self.progress.clear();
        self.transfer = None;
        self.reset_election_timer();
        assert_eq!(self.term, term, "become_follower: in the given term");
        assert!(self.votes.is_empty() && self.progress.is_empty(), "a follower tallies and tracks nothing");
    }

    fn start_campaign(&mut self, pre_vote: bool, transfer: bool) {
        assert_ne!(self.role, Role::Leader, "a leader does not campaign");
        assert!(self.is_voter(), "only a voter campaigns");
        assert!(self.transfer.is_none(), "only a leader transfers leadership");
        let term_before = self.term;
        self.reset_election_timer();
        self.leader = None;
        self.votes.clear();
        self.progress.clear();
        self.leader_verified = 0;
        let campaign_term = if pre_vote {
            self.role = Role::PreCandidate;
            self.term + 1
        } else {
            self.role = Role::Candidate;
            self.term += 1;
            self.vote = Some(self.config.id);
            self.term
        };
        self.votes.insert(self.config.id, true);
        let (last_log_index, last_log_term) = (self.log.last_index(), self.log.last_term());
        assert!(last_log_term < campaign_term, "a campaign's term is above every term in our log");
        let me = self.config.id;
        let voters: Vec<NodeId> = self.membership.voters.iter().copied().filter(|&v| v != me).collect();
        for to in voters {
            self.send(if pre_vote {
                Message::PreVote { term: campaign_term, from: me, to, last_log_index, last_log_term }
            } else {
                Message::RequestVote {
                    term: campaign_term,
                    from: me,
                    to,
                    last_log_index,
                    last_log_term,
                    transfer,
                }
            });
        }
        self.tally_votes();
        assert!(
            self.term == term_before + 1 || (pre_vote && self.term == term_before),
            "a campaign raises the term by one (a pre-vote: once it wins)"
        );
        assert_ne!(self.role, Role::Follower, "a campaign cannot lose on our own vote");
    }

    fn on_vote_request(
        &mut self,
        pre: bool,
        term: Term,
        from: NodeId,
        last_log_index: Index,
        last_log_term: Term,
    ) {
        assert!(
            if pre { term >= self.term } else { term == self.term },
            "vote request: term checked by step"
        );
        assert_ne!(from, self.config.id, "vote request: not from ourselves");
        let can_vote = if pre {
            term > self.term && !self.in_lease()
        } else {
            self.vote == Some(from) || (self.vote.is_none() && self.leader.is_none())
        };
        let granted = can_vote && self.log.is_up_to_date(last_log_index, last_log_term);
        let me = self.config.id;
        if pre {
            let reply_term = if granted { term } else { self.term };
            self.send(Message::PreVoteReply { term: reply_term, from: me, to: from, granted });
        } else {
            if granted {
                assert!(self.vote.is_none_or(|v| v == from), "at most one vote per term");
                assert!(
                    matches!(self.role, Role::Follower | Role::PreCandidate),
                    "a candidate votes for itself"
                );
                self.vote = Some(from);
                self.election_elapsed = 0;
            }
            self.send(Message::VoteReply { term: self.term, from: me, to: from, granted });
        }
    }

    fn on_vote_reply(&mut self, expected: Role, from: NodeId, granted: bool) {
        if self.role != expected || !self.membership.voters.contains(&from) {
            self.stats.unexpected += 1;
            return;
        }
        assert!(matches!(expected, Role::PreCandidate | Role::Candidate), "vote reply: a campaign role");
        assert_eq!(self.votes.get(&self.config.id), Some(&true), "a campaign counts our own vote");
        self.votes.entry(from).or_insert(granted);
        self.tally_votes();
    }

    fn tally_votes(&mut self) {
        assert!(matches!(self.role, Role::PreCandidate | Role::Candidate), "tally: only while campaigning");
        assert!(self.leader.is_none(), "tally: no leader known while campaigning");
        let voters = &self.membership.voters;
        let granted = self.votes.iter().filter(|(id, g)| **g && voters.contains(id)).count();
        let refused = self.votes.iter().filter(|(id, g)| !**g && voters.contains(id)).count();
        let quorum = self.membership.quorum();
        assert!(granted >= 1, "tally: our own vote counts");
        assert!(granted + refused <= voters.len(), "tally: one answer per voter");
        if granted >= quorum {
            match self.role {
                Role::PreCandidate => self.start_campaign(false, false),
                Role::Candidate => self.become_leader(),
                _ => {}
            }
        } else if refused > voters.len().saturating_sub(quorum) {
            // A quorum is out of reach in this round.
            let term = self.term;
            self.become_follower(term, None);
        }
    }

    fn become_leader(&mut self) {
        assert_eq!(self.role, Role::Candidate, "only a candidate becomes leader");
        assert_eq!(self.vote, Some(self.config.id), "a leader voted for itself");
        assert!(self.is_voter(), "only a voter becomes leader");
        assert!(self.log.last_term() < self.term, "a new leader's log holds nothing of its term");
        self.role = Role::Leader;
        self.leader = Some(self.config.id);
        self.votes.clear();
        self.transfer = None;
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        self.reset_progress();
        // §8: a Noop of the new term lets earlier entries commit.
        let index = self.log.last_index() + 1;
        self.log.push(Entry { term: self.term, index, kind: EntryKind::Noop, data: Bytes::new() });
        self.broadcast_append(true);
        self.maybe_commit();
        assert_eq!(self.role, Role::Leader, "a new leader is a voter and stays leader");
        assert_eq!(self.log.last_term(), self.term, "a new leader's log ends in its Noop");
        assert!(self.commit < index, "the Noop cannot commit before a quorum has it durably");
    }

    fn reset_progress(&mut self) {
        assert_eq!(self.role, Role::Leader, "only a leader tracks progress");
        let next = self.log.last_index() + 1;
        let me = self.config.id;
        let members: Vec<NodeId> = self
            .membership
            .voters
            .iter()
            .chain(self.membership.learners.iter())
            .copied()
            .filter(|&id| id != me)
            .collect();
        self.progress.retain(|id, _| members.contains(id));
        for &id in &members {
            self.progress.entry(id).or_insert_with(|| Progress::new(next));
        }
        assert!(self.progress.len() <= members.len(), "progress only for members");
        debug_assert!(members.iter().all(|id| self.progress.contains_key(id)), "progress for every member");
        assert!(!self.progress.contains_key(&me), "no progress for ourselves");
    }

    // ----- leader --------------------------------------------------------

    fn tick_leader(&mut self) {
        assert_eq!(self.role, Role::Leader, "tick_leader: a leader");
        self.heartbeat_elapsed += 1;
        self.election_elapsed += 1;
        if self.election_elapsed >= self.config.election_ticks {
            self.election_elapsed = 0;
            if self.config.check_quorum && !self.quorum_active() {
                let term = self.term;
                self.become_follower(term, None);
                return;
            }
            for pr in self.progress.values_mut() {
                pr.recent_active = false;
            }
        }
        if let Some((_, ticks)) = self.transfer.as_mut() {
            *ticks += 1;
            if *ticks >= self.config.election_ticks {
                self.transfer = None;
            }
        }
        let election_ticks = self.config.election_ticks;
        let mut retry: Vec<NodeId> = Vec::new();
        for (&id, pr) in self.progress.iter_mut() {
            if let ReplicationState::Snapshot { .. } = pr.state {
                pr.snapshot_ticks += 1;
                if pr.snapshot_ticks >= election_ticks {
                    // The snapshot or its reply was probably lost: resend.
                    pr.become_probe();
                    retry.push(id);
                }
            }
        }
        for id in retry {
            self.send_append(id, true);
        }
        if self.heartbeat_elapsed >= self.config.heartbeat_ticks {
            self.heartbeat_elapsed = 0;
            self.broadcast_heartbeat();
        }
        assert!(
            self.heartbeat_elapsed < self.config.heartbeat_ticks,
            "a heartbeat is due every heartbeat_ticks"
        );
        assert!(
            self.election_elapsed < self.config.election_ticks,
            "a leader's quorum round is election_ticks"
        );
        assert!(
            self.transfer.is_none_or(|(_, ticks)| ticks < self.config.election_ticks),
            "a transfer is abandoned after an election timeout"
        );
    }

    fn quorum_active(&self) -> bool {
        assert_eq!(self.role, Role::Leader, "check-quorum: a leader");
        let me = self.config.id;
        let active = self
            .membership
            .voters
            .iter()
            .filter(|&&id| id == me || self.progress.get(&id).is_some_and(|p| p.recent_active))
            .count();
        active >= self.membership.quorum()
    }

    fn check_can_propose(&self, len: u64) -> Result<(), ProposeError> {
        if self.role != Role::Leader {
            return Err(ProposeError::NotLeader { leader: self.leader });
        }
        if len > self.config.max_entry_bytes {
            return Err(ProposeError::TooLarge { len, max: self.config.max_entry_bytes });
        }
        assert!(self.commit <= self.log.last_index(), "propose: commit beyond the log");
        if self.log.last_index() - self.commit >= self.config.max_uncommitted_entries {
            return Err(ProposeError::Busy);
        }
        Ok(())
    }

    fn append_and_replicate(&mut self, kind: EntryKind, data: Bytes) -> Index {
        assert_eq!(self.role, Role::Leader, "only a leader appends proposals");
        let term = self.term;
        let index = self.log.last_index() + 1;
        let is_membership = kind == EntryKind::Membership;
        self.log.push(Entry { term: self.term, index, kind, data });
        if is_membership {
            self.recompute_membership();
            assert_eq!(self.membership_index, index, "the appended membership is in force");
            self.reset_progress();
            self.broadcast_append(false);
        } else {
            // Sent with the next `ready`: a batch of proposals leaves in as
            // few AppendEntries per follower as the batch limit allows, not
            // one per proposal.
            self.append_pending = true;
        }
        if is_membership {
            // The new membership's quorum may already hold the log (a
            // leader that is no longer a voter commits without itself). A
            // normal entry moves no match index, so no commit.
            self.maybe_commit();
        }
        assert_eq!(self.term, term, "appending does not change the term");
        assert_eq!(self.log.last_index(), index, "a leader's log is append-only");
        assert_eq!(self.log.term(index), Some(term), "a proposal carries the leader's term");
        assert!(self.commit < index, "an entry cannot commit before a quorum has it durably");
        self.debug_check();
        index
    }

    /// `allow_empty`: also send an empty append (carrying the commit index)
    /// to followers that are up to date.
    fn broadcast_append(&mut self, allow_empty: bool) {
        // Also reached right after a removed leader stepped down (no peers).
        assert!(self.role == Role::Leader || self.progress.is_empty(), "only a leader replicates");
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for id in peers {
            self.send_append(id, allow_empty);
        }
    }

    /// Whether a commit announcement would send anything: a follower the
    /// window lets us send to that lacks entries or the commit index (or is
    /// probed). Mirrors `send_append(_, false)`, so `has_ready` stays exact.
    fn announces(&self) -> bool {
        let last = self.log.last_index();
        self.role == Role::Leader
            && self.progress.values().any(|p| {
                p.can_send(self.config.max_inflight_appends)
                    && (p.state == ReplicationState::Probe
                        || p.next_index <= last
                        || p.commit_sent < self.commit)
            })
    }

    /// The proposals since the last `ready`: to every follower that
    /// replicates, as few appends as `max_entries_per_append` allows (as
    /// many as one per proposal went before), within its in-flight window.
    fn offer_proposals(&mut self) {
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        // Followers at the same next index get the same entries: sliced
        // once (the log does not change in this pass).
        let mut shared = None;
        for id in peers {
            while let Some(pr) = self.progress.get(&id) {
                let before = pr.next_index;
                let more = pr.state == ReplicationState::Replicate
                    && before <= self.log.last_index()
                    && pr.can_send(self.config.max_inflight_appends);
                if !more {
                    break;
                }
                self.send_append_sharing(id, false, &mut shared);
                // No progress: the entries it needs are compacted (a
                // snapshot went instead).
                if self.progress.get(&id).is_none_or(|p| p.next_index <= before) {
                    break;
                }
            }
        }
    }

    fn broadcast_heartbeat(&mut self) {
        assert_eq!(self.role, Role::Leader, "only a leader sends heartbeats");
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for id in peers {
            let Some(pr) = self.progress.get_mut(&id) else { continue };
            pr.lag_retry = true;
            if pr.state == ReplicationState::Probe {
                // The heartbeat doubles as a retry of a lost probe.
                pr.probe_sent = false;
                self.send_append(id, true);
                continue;
            }
            let prev_index = if self.log.term(pr.match_index).is_some() {
                pr.match_index
            } else {
                self.log.snapshot_index()
            };
            assert!(self.log.term(prev_index).is_some(), "heartbeat: prev_index is in our log");
            let prev_term = self.log.term(prev_index).unwrap_or(0);
            assert!(prev_term <= self.term, "heartbeat: prev_term from our log");
            pr.commit_sent = pr.commit_sent.max(self.commit);
            self.send(Message::AppendEntries {
                term: self.term,
                from: self.config.id,
                to: id,
                prev_index,
                prev_term,
                entries: Entries::default(),
                leader_commit: self.commit,
            });
        }
    }

    /// Sends `to` the next batch of entries (or a snapshot, or an empty
    /// append carrying the commit index when `allow_empty` or when the
    /// follower has not been told the current commit index) if its flow
    /// control allows. A probe is sent even when empty.
    fn send_append(&mut self, to: NodeId, allow_empty: bool) {
        self.send_append_sharing(to, allow_empty, &mut None);
    }

    /// `send_append`, reusing `shared` — the entries last sliced in this
    /// pass, by their first index — where this follower needs the same.
    fn send_append_sharing(&mut self, to: NodeId, allow_empty: bool, shared: &mut Option<(Index, Entries)>) {
        let Some(pr) = self.progress.get_mut(&to) else { return };
        if !pr.can_send(self.config.max_inflight_appends) {
            return;
        }
        assert_eq!(self.role, Role::Leader, "only a leader tracks progress");
        assert!(pr.match_index < pr.next_index, "send_append: match_index < next_index");
        assert!(pr.next_index <= self.log.last_index() + 1, "send_append: next_index beyond the log");
        let prev_index = pr.next_index - 1;
        let Some(prev_term) = self.log.term(prev_index) else {
            // The entries it needs are compacted: send the snapshot.
            let snapshot = self.log.snapshot.clone();
            assert!(snapshot.meta.index > prev_index, "a snapshot goes only where entries are compacted");
            pr.become_snapshot(snapshot.meta.index);
            self.send(Message::InstallSnapshot { term: self.term, from: self.config.id, to, snapshot });
            return;
        };
        assert!(prev_term <= self.term, "send_append: prev_term from our log");
        let entries = match shared {
            Some((from, entries)) if *from == pr.next_index => entries.clone(),
            _ => {
                let entries: Entries = self
                    .log
                    .slice(
                        pr.next_index,
                        self.log.last_index(),
                        self.config.max_entries_per_append,
                        self.config.max_bytes_per_append,
                    )
                    .into();
                *shared = Some((pr.next_index, entries.clone()));
                // Of this pass's slices the one starting highest is the
                // up-to-date followers' batch (the next to commit), not a
                // lagging follower's catch-up.
                if entries
                    .first()
                    .is_some_and(|e| self.recent_append.first().is_none_or(|r| r.index < e.index))
                {
                    self.recent_append = entries.clone();
                }
                entries
            }
        };
        assert_eq!(
            entries.is_empty(),
            prev_index == self.log.last_index(),
            "send_append: empty only if caught up"
        );
        assert!(entries.len() <= self.config.max_entries_per_append, "send_append: batch within its limit");
        assert!(entries.first().is_none_or(|e| e.index == prev_index + 1), "append starts at prev_index + 1");
        debug_assert!(
            entries.iter().zip(prev_index + 1..).all(|(e, index)| e.index == index),
            "append entries are contiguous"
        );
        debug_assert!(
            entries.iter().all(|e| prev_term <= e.term && e.term <= self.term),
            "append entry terms lie in [prev_term, term]"
        );
        match pr.state {
            ReplicationState::Probe => pr.probe_sent = true,
            ReplicationState::Replicate => match entries.last() {
                Some(last) => {
                    assert!(pr.inflight.back().is_none_or(|&b| b < last.index), "in-flight appends ascend");
                    pr.next_index = last.index + 1;
                    pr.inflight.push_back(last.index);
                }
                None if !allow_empty && pr.commit_sent >= self.commit => return,
                None => {}
            },
            ReplicationState::Snapshot { .. } => unreachable!("can_send is false while snapshotting"),
        }
        pr.commit_sent = pr.commit_sent.max(self.commit);
        self.send(Message::AppendEntries {
            term: self.term,
            from: self.config.id,
            to,
            prev_index,
            prev_term,
            entries,
            leader_commit: self.commit,
        });
    }

    fn on_append_reply(
        &mut self,
        from: NodeId,
        success: bool,
        index: Index,
        hint_index: Index,
        hint_term: Term,
    ) {
        let last_index = self.log.last_index();
        if self.role != Role::Leader || index > last_index {
            self.stats.unexpected += 1;
            return;
        }
        let Some(pr) = self.progress.get_mut(&from) else {
            self.stats.unexpected += 1;
            return;
        };
        pr.recent_active = true;
        assert!(pr.match_index <= last_index, "match beyond the leader's log");
        if success {
            let grew = pr.update_match(index);
            match pr.state {
                ReplicationState::Probe if grew || index + 1 >= pr.next_index => pr.become_replicate(),
                ReplicationState::Probe => pr.probe_sent = false,
                ReplicationState::Snapshot { index: snap } if pr.match_index >= snap => pr.become_probe(),
                ReplicationState::Replicate
                    if !grew && pr.inflight.len() >= self.config.max_inflight_appends =>
                {
                    // A heartbeat answer while the window is full: some
                    // appends were probably lost; free a slot to probe on.
                    pr.inflight.pop_front();
                }
                _ => {}
            }
            assert!(pr.match_index >= index, "append reply: the follower matches through index");
            assert!(pr.next_index <= last_index + 1, "append reply: next_index beyond the log");
            if grew {
                let (committed, announce) = (self.maybe_commit(), self.config.announce_commit);
                let more = self.progress.get(&from).is_some_and(|p| p.next_index <= self.log.last_index());
                if committed && announce {
                    // Announced with the next `ready`, once for all the
                    // answers of this batch of inputs (and not at all to
                    // followers an append with entries tells first); that
                    // broadcast also sends what this follower still lacks.
                    self.commit_pending = true;
                } else if more {
                    self.send_append(from, false);
                } else if announce {
                    // Nothing new to send: a commit index it was not told
                    // goes with the next `ready`, on an append with entries
                    // if one goes. Not announced, it rides on the next
                    // append with entries or heartbeat.
                    self.commit_pending = true;
                }
            } else if let Some(pr) = self.progress.get_mut(&from)
                && pr.match_index < last_index
                && pr.lag_retry
            {
                // An answer that acknowledges nothing new from a lagging
                // follower: appends may have been lost. An append at
                // next_index - 1 either is acknowledged or is rejected and
                // turns the follower to probe. Once per heartbeat interval:
                // under load the follower lags only because appends are in
                // flight, and answering every answer would be a storm.
                pr.lag_retry = false;
                self.send_append(from, true);
            }
            self.maybe_send_timeout_now(from);
            return;
        }
        // Rejected: `index` is the prev_index the follower did not match.
        let probe = if hint_term > 0 {
            self.log.find_conflict_by_term(hint_index.min(last_index), hint_term)
        } else {
            hint_index.min(last_index)
        };
        assert!(probe <= last_index, "append reply: a probe within our log");
        let Some(pr) = self.progress.get_mut(&from) else { return };
        let stale = match pr.state {
            ReplicationState::Replicate => index <= pr.match_index,
            ReplicationState::Probe => index + 1 != pr.next_index,
            ReplicationState::Snapshot { .. } => true,
        };
        if stale {
            return;
        }
        pr.next_index = index.min(probe + 1).max(pr.match_index + 1);
        pr.become_probe();
        assert!(pr.next_index <= last_index + 1, "append reject: next_index beyond the log");
        assert_eq!(pr.state, ReplicationState::Probe, "a rejection turns the follower to probe");
        self.send_append(from, true);
    }

    fn on_snapshot_reply(&mut self, from: NodeId, index: Index) {
        if self.role != Role::Leader || index > self.log.last_index() {
            self.stats.unexpected += 1;
            return;
        }
        let Some(pr) = self.progress.get_mut(&from) else {
            self.stats.unexpected += 1;
            return;
        };
        pr.recent_active = true;
        let grew = pr.update_match(index);
        pr.next_index = pr.match_index + 1;
        pr.become_probe();
        assert_eq!(pr.next_index, pr.match_index + 1, "snapshot reply: probe right after the match");
        assert!(pr.match_index <= self.log.last_index(), "match beyond the leader's log");
        if grew && self.maybe_commit() {
            self.broadcast_append(true);
        } else {
            self.send_append(from, true);
        }
    }

    fn maybe_send_timeout_now(&mut self, target: NodeId) {
        let Some((t, _)) = self.transfer else { return };
        if t != target || self.progress.get(&target).map(|p| p.match_index) != Some(self.log.last_index()) {
            return;
        }
        assert_eq!(self.role, Role::Leader, "only a leader transfers leadership");
        assert_ne!(target, self.config.id, "no transfer to ourselves");
        self.transfer = None;
        self.send(Message::TimeoutNow { term: self.term, from: self.config.id, to: target });
    }

    /// Leader: advances the commit index to the highest entry of this term
    /// stored durably on a quorum of voters. Returns whether it moved.
    fn maybe_commit(&mut self) -> bool {
        if self.role != Role::Leader {
            return false;
        }
        let me = self.config.id;
        let mut matches = std::mem::take(&mut self.match_scratch);
        matches.clear();
        matches.extend(self.membership.voters.iter().map(|&id| {
            if id == me {
                self.log.persisted.min(self.log.last_index())
            } else {
                self.progress.get(&id).map_or(0, |p| p.match_index)
            }
        }));
        matches.sort_unstable_by(|a, b| b.cmp(a));
        let quorum_match = matches.get(self.membership.quorum() - 1).copied();
        self.match_scratch = matches;
        let Some(candidate) = quorum_match else { return false };
        if candidate <= self.commit || self.log.term(candidate) != Some(self.term) {
            return false;
        }
        assert!(candidate <= self.log.last_index(), "commit beyond the leader's log");
        self.commit = candidate;
        if self.membership_index <= self.commit && !self.is_voter() {
            // Thesis §4.2.2: a removed leader steps down once its removal
            // commits; hand over to the most up-to-date voter.
            let best = self
                .membership
                .voters
                .iter()
                .filter_map(|id| self.progress.get(id).map(|p| (p.match_index, *id)))
                .max();
            if let Some((match_index, id)) = best
                && match_index == self.log.last_index()
            {
                assert_ne!(id, me, "a removed leader hands over to another voter");
                self.send(Message::TimeoutNow { term: self.term, from: me, to: id });
            }
            // Let the remaining voters learn the commit before we go.
            self.broadcast_heartbeat();
            let term = self.term;
            self.become_follower(term, None);
        }
        assert_eq!(self.commit, candidate, "maybe_commit: commit moved to the candidate");
        assert_eq!(
            self.log.term(self.commit),
            Some(self.term),
            "a leader commits only its own term by counting"
        );
        true
    }

    // ----- follower ------------------------------------------------------

    /// A message from `from` claiming leadership of our current term.
    fn accept_leader(&mut self, from: NodeId) -> bool {
        if self.role == Role::Leader {
            // Two leaders in one term would violate election safety: a
            // misbehaving peer. Ignore it.
            self.stats.unexpected += 1;
            return false;
        }
        if self.role != Role::Follower || self.leader != Some(from) {
            let term = self.term;
            self.become_follower(term, Some(from));
        }
        self.election_elapsed = 0;
        assert_eq!(self.role, Role::Follower, "accept_leader: a follower");
        assert_eq!(self.leader, Some(from), "accept_leader: of this leader");
        true
    }

    fn on_append_entries(
        &mut self,
        from: NodeId,
        prev_index: Index,
        prev_term: Term,
        entries: Vec<Entry>,
        leader_commit: Index,
    ) {
        assert_eq!(self.role, Role::Follower, "append: accepted as a follower");
        assert_eq!(self.leader, Some(from), "append: from the accepted leader");
        let commit_before = self.commit;
        let me = self.config.id;
        let reply = |success: bool, index: Index, hint_index: Index, hint_term: Term, term: Term| {
            Message::AppendReply { term, from: me, to: from, success, index, hint_index, hint_term }
        };
        if prev_index < self.commit {
            // Everything through commit matches any leader's log.
            self.send(reply(true, self.commit, 0, 0, self.term));
            return;
        }
        if self.log.term(prev_index) != Some(prev_term) {
            let (hint_index, hint_term) = if prev_index > self.log.last_index() {
                (self.log.last_index(), self.log.last_term())
            } else {
                let i = self.log.find_conflict_by_term(prev_index, prev_term);
                (i, self.log.term(i).unwrap_or(0))
            };
            let hint_index = hint_index.min(prev_index);
            let hint_term = if hint_index == 0 { 0 } else { hint_term };
            assert!(hint_term <= self.term, "append reject: the hint comes from our log");
            self.send(reply(false, prev_index, hint_index, hint_term, self.term));
            return;
        }
        assert!(prev_index >= self.log.snapshot_index(), "append: prev_index at or above our snapshot");
        let last_new = prev_index + entries.len() as u64;
        let last_new_term = entries.last().map_or(prev_term, |e| e.term);
        // Find the first entry we do not already have.
        let mut new_from = entries.len();
        let mut truncated = false;
        for (k, e) in entries.iter().enumerate() {
            match self.log.term(e.index) {
                Some(t) if t == e.term => continue,
                Some(_) => {
                    if e.index <= self.commit {
                        // Conflicts with a committed entry: not a legitimate
                        // leader of this term. Drop it.
                        self.stats.unexpected += 1;
                        return;
                    }
                    assert!(e.index > self.commit, "a follower never truncates committed entries");
                    self.log.truncate_from(e.index);
                    truncated = true;
                    new_from = k;
                }
                None => new_from = k,
            }
            break;
        }
        let mut membership_changed = false;
        for e in entries.into_iter().skip(new_from) {
            membership_changed |= e.kind == EntryKind::Membership;
            self.log.push(e);
        }
        if membership_changed || truncated {
            self.recompute_membership();
        }
        assert_eq!(self.log.term(last_new), Some(last_new_term), "append: our log matches through last_new");
        self.leader_verified = self.leader_verified.max(last_new);
        let commit = leader_commit.min(self.leader_verified).min(self.log.last_index());
        if commit > self.commit {
            self.commit = commit;
        }
        assert!(self.commit >= commit_before, "append: commit never goes back");
        assert!(self.commit <= self.log.last_index(), "append: commit beyond the log");
        self.send(reply(true, last_new, 0, 0, self.term));
    }

    fn on_install_snapshot(&mut self, from: NodeId, snapshot: Snapshot) {
        assert_eq!(self.role, Role::Follower, "snapshot: accepted as a follower");
        assert_eq!(self.leader, Some(from), "snapshot: from the accepted leader");
        let me = self.config.id;
        let index = snapshot.meta.index;
        if index <= self.commit {
            self.send(Message::SnapshotReply { term: self.term, from: me, to: from, index: self.commit });
            return;
        }
        if self.log.term(index) == Some(snapshot.meta.term) {
            // We already have the snapshot's last entry: its prefix matches.
            assert!(index <= self.log.last_index(), "snapshot: its last entry is in our log");
            self.leader_verified = self.leader_verified.max(index);
            self.commit = index;
        } else {
            self.log.restore(snapshot);
            self.commit = index;
            self.leader_verified = self.leader_verified.max(index);
            self.recompute_membership();
            assert!(self.log.pending_snapshot, "snapshot: the next Ready hands it out");
            assert_eq!(self.log.last_index(), index, "snapshot: the log ends at the snapshot");
            assert_eq!(self.membership_index, index, "snapshot: its membership is in force");
        }
        assert_eq!(self.commit, index, "snapshot: everything it covers is committed");
        self.send(Message::SnapshotReply { term: self.term, from: me, to: from, index });
    }

    // ----- membership ----------------------------------------------------

    /// The membership in force at `index` (<= last index).
    fn membership_at(&self, index: Index) -> Membership {
        assert!(index <= self.log.last_index(), "membership_at: index beyond the log");
        assert!(index >= self.log.snapshot_index(), "membership_at: index inside the snapshot");
        if index >= self.membership_index {
            // The membership in force is the latest in the log: no scan
            // (a compaction at the leader's pace would read every entry
            // since the last one).
            #[cfg(any(test, debug_assertions))]
            assert_eq!(self.membership, self.scan_membership_at(index), "the membership in force");
            return self.membership.clone();
        }
        self.scan_membership_at(index)
    }

    fn scan_membership_at(&self, index: Index) -> Membership {
        for e in self.log.entries().iter().rev() {
            if e.index <= index && e.kind == EntryKind::Membership {
                return decode_membership(&e.data, &self.limits).unwrap_or_else(|_| self.base_membership());
            }
        }
        self.base_membership()
    }

    fn base_membership(&self) -> Membership {
        if self.log.snapshot_index() > 0 {
            self.log.snapshot.meta.membership.clone()
        } else {
            self.initial_membership.clone()
        }
    }

    /// Sets the membership in force from the log (after appends,
    /// truncations and snapshots).
    fn recompute_membership(&mut self) {
        // Every Membership entry in the log was validated on the way in
        // (Node::new, Message::validate), so decoding cannot fail here.
        let latest = self.log.entries().iter().rev().find(|e| e.kind == EntryKind::Membership);
        let (membership, index) = match latest {
            Some(e) => {
                (decode_membership(&e.data, &self.limits).unwrap_or_else(|_| self.base_membership()), e.index)
            }
            None => (self.base_membership(), self.log.snapshot_index()),
        };
        self.membership = membership;
        self.membership_index = index;
        assert!(
            self.log.snapshot_index() <= index && index <= self.log.last_index(),
            "the membership in force comes from the snapshot or the log"
        );
    }

    // ----- helpers -------------------------------------------------------

    fn send(&mut self, msg: Message) {
        assert_eq!(msg.from(), self.config.id, "an outgoing message is from us");
        assert_ne!(msg.to(), self.config.id, "an outgoing message is not to us");
        self.messages.push(msg);
    }

    /// Invariants checked after every input: the O(1) ones always (STYLE:
    /// assertions stay on), the O(log length) one in debug builds.
    fn debug_check(&self) {
        #[cfg(any(test, debug_assertions))]
        self.log.check();
        assert!(self.commit <= self.log.last_index(), "commit beyond the log");
        assert!(self.log.persisted <= self.log.stable && self.log.stable <= self.log.last_index());
        assert!(self.applied <= self.commit, "applied beyond commit");
        assert!(self.membership_index <= self.log.last_index());
        assert!(self.log.snapshot_index() <= self.commit, "snapshot beyond commit");
        assert!(self.log.last_term() <= self.term, "an entry from a term above ours");
        assert!(
            self.applied >= self.log.snapshot_index() || self.log.pending_snapshot,
            "applied behind the snapshot"
        );
        assert_eq!(
            self.role == Role::Leader,
            self.leader == Some(self.config.id),
            "we lead iff we are the leader"
        );
        assert!(self.progress.is_empty() || self.role == Role::Leader, "progress only at a leader");
        assert!(self.transfer.is_none() || self.role == Role::Leader, "a transfer only at a leader");
        assert!(
            self.votes.is_empty() || matches!(self.role, Role::PreCandidate | Role::Candidate),
            "votes only while campaigning"
        );
        if self.role == Role::Candidate {
            assert_eq!(self.vote, Some(self.config.id), "a candidate voted for itself");
        }
        if self.role == Role::Leader {
            assert_eq!(self.leader, Some(self.config.id));
            assert_eq!(self.vote, Some(self.config.id));
            assert!(!self.progress.contains_key(&self.config.id));
            assert_eq!(self.log.last_term(), self.term, "a leader's log ends in its own term");
            debug_assert!(
                self.progress
                    .values()
                    .all(|p| p.match_index < p.next_index && p.next_index <= self.log.last_index() + 1),
                "match_index < next_index <= last_index + 1"
            );
        }
    }
}

#[cfg(test)]
mod recovery_tests {
    use super::*;

    /// Regression (r3p2 simulation, `ordo sim --workload r3p2 --seed 111`;
    /// also 42, 148, 155, 164): a crash after entries of a new term reached
    /// the log file (synced, or unsynced but kept by the crash) and before
    /// the hard state with that term was written leaves a log ahead of the
    /// hard state; the node must restart from it (in that term, with no
    /// vote, persisted by its first `Ready`) rather than refuse to open.
    #[test]
    fn log_ahead_of_the_hard_state_recovers_in_its_term() {
        let entry = |index, term| Entry { term, index, kind: EntryKind::Normal, data: vec![1].into() };
        let recovered = Recovered {
            hard_state: HardState { term: 1, vote: Some(2), commit: 1 },
            snapshot: None,
            entries: vec![entry(1, 1), entry(2, 3)],
        };
        let mut node = Node::new(Config::new(1, 7), recovered, Membership::with_voters(1..=3)).unwrap();
        assert_eq!((node.term(), node.vote(), node.last_index()), (3, None, 2));
        assert!(node.has_ready());
        let rd = node.ready();
        assert_eq!(rd.hard_state, Some(HardState { term: 3, vote: None, commit: 1 }));
    }
}
