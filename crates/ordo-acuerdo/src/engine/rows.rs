//! The SST rows (acuerdo §3.1): this member's words (Accept, Commit,
//! E_new, Vote, status, heartbeat, ring sessions and acks, diff requests),
//! reading peers' rows, liveness by heartbeat, and the row pushes.
//!
//! # Invariants
//! - Every own column is monotonic within an incarnation (`set_*` assert
//!   it) and is written with a Release store before it is pushed.
//! - A full row push goes to every peer whenever a column other than
//!   Accept, the ring acks and Commit changed (`dirty_all`; the heartbeat
//!   too, so a peer's copy of every column is refreshed at least every
//!   `heartbeat_interval_ns`); Accept and ring acks alone go only to the
//!   peers that need them (one cache line, `ack_push`); Commit goes out at
//!   most every `commit_push_interval_ns` (Fig. 6, line 93), with the
//!   columns before it (`head_push`) unless a full push is due: a peer's
//!   cached lines of the rest of the row (read on every receive) stay
//!   valid.
//! - A peer is alive while its heartbeat word changed within
//!   `heartbeat_timeout_ns` of now.

use super::{Effects, Engine, Note, Push, Role, Target};
use crate::header::{Epoch, Header, Vote};
use ordo_fabric::MemberId;
use ordo_sst::ColumnRange;

/// Status bits: 1 synced, 2 leader, 4 stamped rings, and this bit: the
/// status announces the ring mode (so a row not yet written, all zero,
/// announces nothing).
const STATUS_RING_MODE: u64 = 8;

impl Engine {
    pub(super) fn row_of(&self, m: MemberId) -> Option<usize> {
        self.members.binary_search(&m).ok()
    }

    pub(super) fn load(&self, row: usize, col: impl Into<ColumnRange>, i: usize) -> u64 {
        self.region.load_acquire(self.layout.word(row, col, i))
    }

    pub(super) fn store(&self, col: impl Into<ColumnRange>, i: usize, v: u64) {
        self.region.store_release(self.layout.word(self.my_row, col, i), v);
    }

    pub(super) fn row_header(&self, row: usize, col: impl Into<ColumnRange>) -> Header {
        Header::decode(self.load(row, col, 0))
    }

    pub(super) fn set_accepted(&mut self, h: Header) {
        debug_assert!(h >= self.accepted, "Accepted goes back: {:?} -> {h:?}", self.accepted);
        assert!(h.epoch <= self.e_new, "nothing accepted beyond the promised epoch");
        self.accepted = h;
        self.store(self.layout.columns.accept, 0, h.encode());
        let leader_row = self.row_of(self.e_cur.leader);
        if let Some(r) = leader_row.filter(|r| *r != self.my_row) {
            self.dirty_to[r] = true;
        }
    }

    pub(super) fn set_e_new(&mut self, e: Epoch) {
        assert!(e >= self.e_new, "E_new goes back: {:?} -> {e:?}", self.e_new);
        self.e_new = e;
        self.promise_dirty = true;
        self.store(self.layout.columns.e_new, 0, e.encode());
        self.dirty_all = true;
    }

    pub(super) fn set_vote(&mut self, v: Vote, fx: &mut Effects) {
        assert!(v > self.my_vote, "votes only grow: {:?} -> {v:?}", self.my_vote);
        self.my_vote = v;
        self.promise_dirty = true;
        for (i, w) in v.encode().into_iter().enumerate() {
            self.store(self.layout.columns.vote, i, w);
        }
        self.votes[self.my_row] = v;
        self.dirty_all = true;
        fx.notes.push(Note::Voted(v));
    }

    pub(super) fn write_status(&mut self) {
        let leader = u64::from(self.role == Role::Leader) << 1;
        let stamped = u64::from(self.layout.ring.stamped) << 2;
        self.store(
            self.layout.columns.status,
            0,
            u64::from(self.synced) | leader | stamped | STATUS_RING_MODE,
        );
        self.dirty_all = true;
    }

    pub(super) fn set_role(&mut self, role: Role) {
        assert!(role != Role::Leader || self.synced, "only a synced member leads");
        self.role = role;
        self.write_status();
        assert_eq!(self.load(self.my_row, self.layout.columns.status, 0) & 2 != 0, role == Role::Leader);
    }

    /// Whether the ring mode row `r`'s status announces (once it does)
    /// differs from ours.
    pub(super) fn ring_mode_differs_at(&self, r: usize) -> Option<bool> {
        let status = self.load(r, self.layout.columns.status, 0);
        let stamped = status & 4 != 0;
        (status & STATUS_RING_MODE != 0 && stamped != self.layout.ring.stamped).then_some(stamped)
    }

    /// Whether `m` is alive and still leads `e` as far as its row shows: a
    /// leader that restarted (or abdicated) clears its leader bit, so its
    /// followers do not mistake its new incarnation's heartbeat for its own.
    pub(super) fn leads(&self, m: MemberId, e: Epoch) -> bool {
        let c = self.layout.columns;
        self.row_of(m).is_some_and(|r| {
            self.alive_row(r) && self.load(r, c.status, 0) & 2 != 0 && self.row_header(r, c.e_new).epoch == e
        })
    }

    pub(super) fn read_vote(&mut self, row: usize) -> Vote {
        let c = self.layout.columns.vote;
        assert!(row < self.votes.len(), "a row of the group");
        let words = [self.load(row, c, 0), self.load(row, c, 1), self.load(row, c, 2)];
        if let Some(v) = Vote::decode(words) {
            self.votes[row] = v;
        }
        self.votes[row]
    }

    pub(super) fn alive(&self, m: MemberId) -> bool {
        self.row_of(m).is_some_and(|r| self.alive_row(r))
    }

    /// [`alive`](Self::alive) by row (no member lookup): its heartbeat is
    /// fresh and its ring mode agrees with ours (a member whose ring we
    /// cannot read, nor it ours, is as good as partitioned away: it is
    /// neither joined as a candidate nor followed nor waited for by log
    /// garbage collection).
    pub(super) fn alive_row(&self, r: usize) -> bool {
        r == self.my_row
            || (self.now_ns.saturating_sub(self.hb_changed_ns[r]) <= self.cfg.heartbeat_timeout_ns
                && self.ring_mode_differs_at(r).is_none())
    }

    pub(super) fn row_push(&self, to: Target) -> Push {
        let (offset, len) = self.sst.range(ColumnRange { offset: 0, len: self.layout.row_used });
        assert!(len > 0 && offset + len <= self.region.len(), "a row push lies in the region");
        Push { to, offset, len }
    }

    pub(super) fn observe_heartbeats(&mut self) {
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
        debug_assert!(
            self.hb_changed_ns.iter().all(|t| *t <= self.now_ns),
            "liveness times are not in the future"
        );
    }

    pub(super) fn heartbeat(&mut self) {
        if self.now_ns >= self.next_hb_ns {
            self.heartbeat += 1;
            self.store(self.layout.columns.heartbeat, 0, self.heartbeat);
            self.next_hb_ns = self.now_ns + self.cfg.heartbeat_interval_ns;
            self.dirty_all = true;
        }
        assert!(self.next_hb_ns >= self.now_ns, "the next heartbeat is not in the past");
    }

    pub(super) fn flush_row(&mut self, fx: &mut Effects) {
        let commit_due = self.commit_dirty && self.now_ns >= self.next_commit_push_ns;
        if self.dirty_all || commit_due {
            self.commit_dirty = false;
            self.next_commit_push_ns = self.now_ns + self.cfg.commit_push_interval_ns;
            if self.dirty_all {
                fx.pushes.push(self.row_push(Target::All));
            } else {
                // Commit and the acks before it (every peer's pending ack
                // push included): not the lines of columns that did not
                // change.
                let (offset, len) = self.sst.range(self.layout.head_push);
                fx.pushes.push(Push { to: Target::All, offset, len });
            }
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
        assert!(
            !self.commit_dirty || self.next_commit_push_ns > self.now_ns,
            "a pending Commit push is scheduled"
        );
    }
}
