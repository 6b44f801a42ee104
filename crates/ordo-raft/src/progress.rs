//! What a leader knows about one follower's log (etcd's `Progress`).
//!
//! Invariant: `match_index < next_index`. `match_index` only grows during a
//! term; `next_index` moves back only on a rejection that is not stale.

use crate::types::Index;
use std::collections::VecDeque;

/// How the leader is currently replicating to a follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReplicationState {
    /// Where the follower's log matches is unknown: one append at a time,
    /// then wait for its answer (or the next heartbeat).
    Probe,
    /// The follower's log matches through `match_index`: stream appends,
    /// at most `max_inflight_appends` unacknowledged.
    Replicate,
    /// An InstallSnapshot of this index is in flight.
    Snapshot { index: Index },
}

#[derive(Clone, Debug)]
pub(crate) struct Progress {
    pub(crate) match_index: Index,
    pub(crate) next_index: Index,
    pub(crate) state: ReplicationState,
    /// Probe: an append was sent and is not answered yet.
    pub(crate) probe_sent: bool,
    /// Replicate: the last index of each unacknowledged append, ascending.
    pub(crate) inflight: VecDeque<Index>,
    /// Heard from since the last check-quorum round.
    pub(crate) recent_active: bool,
    /// Snapshot: ticks since the snapshot was sent (to resend a lost one).
    pub(crate) snapshot_ticks: u64,
    /// The highest `leader_commit` sent to this follower.
    pub(crate) commit_sent: Index,
    /// Replicate: one recovery append (for appends that may have been
    /// lost) is allowed until the next heartbeat. Without this bound every
    /// answer to an empty append from a follower that lags only because
    /// appends are in flight would trigger another empty append: a
    /// message storm under load.
    pub(crate) lag_retry: bool,
}

impl Progress {
    pub(crate) fn new(next_index: Index) -> Progress {
        let pr = Progress {
            match_index: 0,
            next_index: next_index.max(1),
            state: ReplicationState::Probe,
            probe_sent: false,
            inflight: VecDeque::new(),
            recent_active: false,
            snapshot_ticks: 0,
            commit_sent: 0,
            lag_retry: true,
        };
        assert!(pr.match_index < pr.next_index, "progress: match_index < next_index");
        pr
    }

    pub(crate) fn become_probe(&mut self) {
        self.state = ReplicationState::Probe;
        self.probe_sent = false;
        self.inflight.clear();
        self.next_index = self.next_index.max(self.match_index + 1);
        assert!(self.match_index < self.next_index, "probe: match_index < next_index");
    }

    pub(crate) fn become_replicate(&mut self) {
        assert_eq!(self.state, ReplicationState::Probe, "replicate is entered from probe only");
        self.state = ReplicationState::Replicate;
        self.probe_sent = false;
        self.inflight.clear();
        self.next_index = self.match_index + 1;
        assert!(self.match_index < self.next_index, "replicate: match_index < next_index");
    }

    pub(crate) fn become_snapshot(&mut self, index: Index) {
        assert!(index > self.match_index, "a snapshot is sent only to a follower behind it");
        self.state = ReplicationState::Snapshot { index };
        self.probe_sent = false;
        self.inflight.clear();
        self.snapshot_ticks = 0;
        assert!(self.match_index < self.next_index, "snapshot: match_index < next_index");
    }

    /// Records that the follower matches through `index`; whether it grew.
    pub(crate) fn update_match(&mut self, index: Index) -> bool {
        let grew = index > self.match_index;
        if grew {
            self.match_index = index;
        }
        self.next_index = self.next_index.max(index + 1);
        while self.inflight.front().is_some_and(|&last| last <= index) {
            self.inflight.pop_front();
        }
        assert!(self.match_index >= index && self.next_index > index, "update_match: covers index");
        assert!(self.match_index < self.next_index, "update_match: match_index < next_index");
        assert!(
            self.inflight.front().is_none_or(|&first| first > self.match_index),
            "update_match: acknowledged appends leave the in-flight window"
        );
        grew
    }

    /// Whether another append may be sent now.
    pub(crate) fn can_send(&self, max_inflight: usize) -> bool {
        assert!(!self.probe_sent || self.state == ReplicationState::Probe, "probe_sent only in probe");
        assert!(
            self.inflight.is_empty() || self.state == ReplicationState::Replicate,
            "appends are in flight only in replicate"
        );
        assert!(self.inflight.len() <= max_inflight, "in-flight window overrun");
        match self.state {
            ReplicationState::Probe => !self.probe_sent,
            ReplicationState::Replicate => self.inflight.len() < max_inflight,
            ReplicationState::Snapshot { .. } => false,
        }
    }
}
