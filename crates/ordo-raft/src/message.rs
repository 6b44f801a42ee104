//! Every message two Raft nodes exchange, and their structural validation.
//!
//! Every variant carries the sender's `term`, `from` and `to`. Messages are
//! plain data: the node produces them in [`crate::Ready::messages`] and
//! consumes them in [`crate::Node::step`]; [`crate::codec`] turns them into
//! bytes. A snapshot travels whole in one [`Message::InstallSnapshot`] (no
//! chunking): the receiver's `DecodeLimits::max_snapshot_bytes` bounds it.
//!
//! [`Message::validate`] checks what must hold of any well-formed message
//! regardless of the receiver's state (ids non-zero, entries contiguous and
//! with non-decreasing terms not above the message term, membership data
//! decodable, ...). The decoder runs it on every decoded message and
//! `Node::step` runs it on every message it is handed, so the node's logic
//! only ever sees structurally valid messages.

use crate::codec::{DecodeError, DecodeLimits, decode_membership, validate_membership};
use crate::types::{Entries, Entry, EntryKind, Index, NodeId, Snapshot, Term};

/// A Raft message (Raft paper Fig. 2, plus pre-vote, snapshots and
/// leadership transfer from the Raft thesis).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Pre-vote (thesis §9.6): "would you vote for me at `term`?". `term` is
    /// the term the sender *would* campaign in (its current term + 1); the
    /// sender's real term is not changed by sending it nor the receiver's by
    /// receiving it.
    PreVote { term: Term, from: NodeId, to: NodeId, last_log_index: Index, last_log_term: Term },
    /// Answer to [`Message::PreVote`]. When granted, `term` echoes the
    /// pre-vote's term; when refused it is the refuser's current term.
    PreVoteReply { term: Term, from: NodeId, to: NodeId, granted: bool },
    /// RequestVote RPC (Raft §5.2). `transfer` marks a campaign started by
    /// [`Message::TimeoutNow`]: receivers then ignore leader stickiness.
    RequestVote {
        term: Term,
        from: NodeId,
        to: NodeId,
        last_log_index: Index,
        last_log_term: Term,
        transfer: bool,
    },
    /// Answer to [`Message::RequestVote`].
    VoteReply { term: Term, from: NodeId, to: NodeId, granted: bool },
    /// AppendEntries RPC (Raft §5.3); with no entries it is a heartbeat.
    /// `entries[i].index == prev_index + 1 + i`.
    AppendEntries {
        term: Term,
        from: NodeId,
        to: NodeId,
        prev_index: Index,
        prev_term: Term,
        entries: Entries,
        leader_commit: Index,
    },
    /// Answer to [`Message::AppendEntries`]. On success `index` is the last
    /// index the follower now has that matches the leader's log (and is
    /// durable: replies leave only after persistence). On rejection `index`
    /// is the rejected `prev_index` and (`hint_index`, `hint_term`) is the
    /// follower's last entry at or below `prev_index` whose term is at most
    /// the rejected `prev_term` (etcd-style fast backtracking); both hints are
    /// 0 on success.
    AppendReply {
        term: Term,
        from: NodeId,
        to: NodeId,
        success: bool,
        index: Index,
        hint_index: Index,
        hint_term: Term,
    },
    /// InstallSnapshot RPC (Raft §7), the whole snapshot in one message.
    InstallSnapshot { term: Term, from: NodeId, to: NodeId, snapshot: Snapshot },
    /// Answer to [`Message::InstallSnapshot`]: the follower's log now
    /// matches the leader's through `index`.
    SnapshotReply { term: Term, from: NodeId, to: NodeId, index: Index },
    /// Leadership transfer (thesis §3.10): the receiver campaigns at once.
    TimeoutNow { term: Term, from: NodeId, to: NodeId },
}

impl Message {
    /// The sender's term (for [`Message::PreVote`]: the proposed term).
    pub fn term(&self) -> Term {
        match self {
            Message::PreVote { term, .. }
            | Message::PreVoteReply { term, .. }
            | Message::RequestVote { term, .. }
            | Message::VoteReply { term, .. }
            | Message::AppendEntries { term, .. }
            | Message::AppendReply { term, .. }
            | Message::InstallSnapshot { term, .. }
            | Message::SnapshotReply { term, .. }
            | Message::TimeoutNow { term, .. } => *term,
        }
    }

    /// The sender.
    pub fn from(&self) -> NodeId {
        match self {
            Message::PreVote { from, .. }
            | Message::PreVoteReply { from, .. }
            | Message::RequestVote { from, .. }
            | Message::VoteReply { from, .. }
            | Message::AppendEntries { from, .. }
            | Message::AppendReply { from, .. }
            | Message::InstallSnapshot { from, .. }
            | Message::SnapshotReply { from, .. }
            | Message::TimeoutNow { from, .. } => *from,
        }
    }

    /// The addressee.
    pub fn to(&self) -> NodeId {
        match self {
            Message::PreVote { to, .. }
            | Message::PreVoteReply { to, .. }
            | Message::RequestVote { to, .. }
            | Message::VoteReply { to, .. }
            | Message::AppendEntries { to, .. }
            | Message::AppendReply { to, .. }
            | Message::InstallSnapshot { to, .. }
            | Message::SnapshotReply { to, .. }
            | Message::TimeoutNow { to, .. } => *to,
        }
    }

    /// A short name of the variant (for logs and counters).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Message::PreVote { .. } => "PreVote",
            Message::PreVoteReply { .. } => "PreVoteReply",
            Message::RequestVote { .. } => "RequestVote",
            Message::VoteReply { .. } => "VoteReply",
            Message::AppendEntries { .. } => "AppendEntries",
            Message::AppendReply { .. } => "AppendReply",
            Message::InstallSnapshot { .. } => "InstallSnapshot",
            Message::SnapshotReply { .. } => "SnapshotReply",
            Message::TimeoutNow { .. } => "TimeoutNow",
        }
    }

    /// Checks the structural invariants of a well-formed message against
    /// `limits` (see the module docs). Never panics.
    pub fn validate(&self, limits: &DecodeLimits) -> Result<(), DecodeError> {
        let (from, to, term) = (self.from(), self.to(), self.term());
        if from == 0 || to == 0 || from == to {
            return Err(DecodeError::InvalidNodeId { from, to });
        }
        match self {
            Message::PreVote { last_log_index, last_log_term, .. }
            | Message::RequestVote { last_log_index, last_log_term, .. } => {
                check_position(*last_log_index, *last_log_term, term, "last_log")?;
            }
            Message::AppendEntries { prev_index, prev_term, entries, .. } => {
                check_position(*prev_index, *prev_term, term, "prev")?;
                validate_entries(*prev_index, *prev_term, term, entries, limits)?;
            }
            Message::AppendReply { success, index, hint_index, hint_term, .. } => {
                let bad = if *success {
                    *hint_index != 0 || *hint_term != 0
                } else {
                    *hint_index > *index || *hint_term > term || (*hint_index == 0 && *hint_term != 0)
                };
                if bad {
                    return Err(DecodeError::InvalidHint { index: *index, hint_index: *hint_index });
                }
            }
            Message::InstallSnapshot { snapshot, .. } => {
                let meta = &snapshot.meta;
                if meta.index == 0 || meta.term == 0 || meta.term > term {
                    return Err(DecodeError::InvalidSnapshotMeta { index: meta.index, term: meta.term });
                }
                if snapshot.data.len() as u64 > limits.max_snapshot_bytes {
                    return Err(DecodeError::SnapshotTooLarge {
                        len: snapshot.data.len() as u64,
                        max: limits.max_snapshot_bytes,
                    });
                }
                validate_membership(&meta.membership, limits)?;
            }
            Message::PreVoteReply { .. }
            | Message::VoteReply { .. }
            | Message::SnapshotReply { .. }
            | Message::TimeoutNow { .. } => {}
        }
        Ok(())
    }
}

/// A log position (`index`, `term`) named in a message of term `term`.
fn check_position(index: Index, pos_term: Term, term: Term, field: &'static str) -> Result<(), DecodeError> {
    if pos_term > term || (index == 0) != (pos_term == 0) {
        return Err(DecodeError::InvalidLogPosition { field, index, term: pos_term });
    }
    Ok(())
}

/// Entries of an AppendEntries of term `term` after (`prev_index`,
/// `prev_term`): contiguous, terms non-decreasing from `prev_term` and at
/// most `term`, within the limits, membership data decodable.
pub(crate) fn validate_entries(
    prev_index: Index,
    prev_term: Term,
    term: Term,
    entries: &[Entry],
    limits: &DecodeLimits,
) -> Result<(), DecodeError> {
    if entries.len() > limits.max_entries {
        return Err(DecodeError::TooManyEntries { count: entries.len() as u64, max: limits.max_entries });
    }
    let mut expected = prev_index;
    let mut last_term = prev_term;
    for entry in entries {
        expected = expected.checked_add(1).ok_or(DecodeError::IndexOverflow)?;
        if entry.index != expected {
            return Err(DecodeError::NonContiguousEntries { expected, found: entry.index });
        }
        if entry.term < last_term || entry.term > term || entry.term == 0 {
            return Err(DecodeError::EntryTermOutOfOrder { index: entry.index, term: entry.term });
        }
        last_term = entry.term;
        if entry.data.len() as u64 > limits.max_entry_bytes {
            return Err(DecodeError::EntryTooLarge {
                len: entry.data.len() as u64,
                max: limits.max_entry_bytes,
            });
        }
        if entry.kind == EntryKind::Membership {
            decode_membership(&entry.data, limits)?;
        }
    }
    Ok(())
}
