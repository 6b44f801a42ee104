//! The values Raft's core and its durable log share (Raft paper Fig. 2):
//! terms, indexes, entries, the hard state that must be on disk before a
//! message that depends on it leaves the node, and snapshots.
//!
//! Invariants:
//! - Indexes start at 1; index 0 with term 0 is the empty log's sentinel.
//! - An [`Entry`]'s `index` is its position in the log and never changes;
//!   its `term` is the leader's term when it was proposed.
//! - A [`SnapshotMeta`] stands for every entry up to and including `index`
//!   (whose term was `term`) and the membership in force at that index.

use std::collections::BTreeSet;

/// A member's identity inside one Raft group. 0 is never a valid id.
pub type NodeId = u64;
/// A Raft term (Raft §5.1). 0 before any election.
pub type Term = u64;
/// A log position, from 1. 0 means "before the first entry".
pub type Index = u64;

/// What an entry carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// An application command (for r2p2: a `REPLICATED_ROUTE` request).
    Normal,
    /// The empty entry a new leader appends to commit its term (Raft §8).
    Noop,
    /// A membership change; `data` holds the encoded [`Membership`] that
    /// takes effect as soon as the entry is appended (one server at a time,
    /// Raft thesis §4.1) .
    Membership,
}

use bytes::Bytes;

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub term: Term,
    pub index: Index,
    pub kind: EntryKind,
    /// Shared, not copied, by the clones the log hands out (to the store,
    /// to every follower's append, to the application): a leader made
    /// five copies of each command when this was a `Vec`.
    pub data: Bytes,
}

/// The entries of an AppendEntries, shared: a leader whose followers need
/// the same entries (the steady state) slices its log once for all of
/// them, and every append holds a reference (a vector of reference-counted
/// entries per follower before). Reads as a slice; built from a `Vec`. An
/// empty one (a heartbeat, an append carrying only the commit index)
/// allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct Entries(Option<std::sync::Arc<Vec<Entry>>>);

impl Entries {
    /// The entries as a vector of their own: moved out where this is the
    /// last reference (a decoded append), else cloned (each a reference
    /// count).
    pub fn into_vec(self) -> Vec<Entry> {
        match self.0 {
            None => Vec::new(),
            Some(shared) => std::sync::Arc::try_unwrap(shared).unwrap_or_else(|shared| (*shared).clone()),
        }
    }
}

impl std::ops::Deref for Entries {
    type Target = [Entry];

    fn deref(&self) -> &[Entry] {
        self.0.as_deref().map_or(&[], |v| v)
    }
}

impl<'a> IntoIterator for &'a Entries {
    type Item = &'a Entry;
    type IntoIter = std::slice::Iter<'a, Entry>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<Vec<Entry>> for Entries {
    fn from(entries: Vec<Entry>) -> Entries {
        Entries((!entries.is_empty()).then(|| std::sync::Arc::new(entries)))
    }
}

/// Equal as slices: shared or not, the same entries.
impl PartialEq for Entries {
    fn eq(&self, other: &Entries) -> bool {
        **self == **other
    }
}

impl Eq for Entries {}

impl std::hash::Hash for Entries {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

/// The state that must be durable before the node answers a vote or an
/// append that depends on it (Raft Fig. 2, "persistent state").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HardState {
    pub term: Term,
    /// The candidate voted for in `term`, if any.
    pub vote: Option<NodeId>,
    /// The highest index known committed (persisting it is an optimization
    /// for faster restart; losing it is safe).
    pub commit: Index,
}

/// Who votes and who only receives the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Membership {
    /// Members whose acknowledgements count toward a quorum and who vote.
    pub voters: BTreeSet<NodeId>,
    /// Members that receive the log (to catch up) but neither vote nor
    /// count toward a quorum.
    pub learners: BTreeSet<NodeId>,
}

impl Membership {
    /// A membership of voters only.
    pub fn with_voters(voters: impl IntoIterator<Item = NodeId>) -> Membership {
        Membership { voters: voters.into_iter().collect(), learners: BTreeSet::new() }
    }

    /// The number of voters that make a majority.
    pub fn quorum(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    /// Whether `id` is a voter or a learner.
    pub fn contains(&self, id: NodeId) -> bool {
        self.voters.contains(&id) || self.learners.contains(&id)
    }
}

/// What a snapshot covers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SnapshotMeta {
    /// The last index the snapshot includes.
    pub index: Index,
    /// The term of the entry at `index`.
    pub term: Term,
    /// The membership in force at `index`.
    pub membership: Membership,
}

/// A snapshot of the application state machine plus what it covers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Snapshot {
    pub meta: SnapshotMeta,
    /// The application's serialized state (opaque to Raft).
    pub data: Vec<u8>,
}

/// What a node finds on its disk when it starts: the input to
/// building a node after a crash (and what the durable log's recovery
/// returns).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub hard_state: HardState,
    /// The latest durable snapshot, if any.
    pub snapshot: Option<Snapshot>,
    /// The durable entries after the snapshot (or from index 1), contiguous.
    pub entries: Vec<Entry>,
}
