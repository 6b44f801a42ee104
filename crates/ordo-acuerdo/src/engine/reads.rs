//! Linearizable reads without a log write: the leader's **read index**
//! confirmed by one round on the fabric (Raft's ReadIndex, done with SST
//! columns).
//!
//! A client read at the leader ([`Engine::read_index`]) records the
//! leader's *Accepted* header (the last entry of its log) as the read's
//! index. Once per batch of reads the leader bumps its `read_seq` column
//! and pushes its row; a follower echoes the value into its `read_ack`
//! column (an acknowledgement push to the leader) **only while it follows
//! that leader's epoch and has promised no bigger one**. The read is ready
//! when a quorum (the leader included) echoed a `read_seq` bumped after the
//! read arrived and the leader's Committed (hence its deliveries) reached
//! the read's index; the application then answers from its state.
//!
//! # Why this is linearizable
//! - *Nothing acknowledged before the read is missing.* A write acknowledged
//!   to a client before the read arrived was committed, so it is in the log
//!   of every up-to-date leader (the election's rule 2) at or below its
//!   Accepted: at or below the read's index, delivered before the read is
//!   answered.
//! - *No newer leader committed anything the read misses.* A leader of a
//!   bigger epoch needs a quorum's promise before it commits. That quorum
//!   meets the confirming one in a member that echoed after the read arrived
//!   with E_new = this epoch; E_new only grows, so it promised the bigger
//!   epoch after the read arrived, and the newer leader's commits come later
//!   still, after the read's invocation: serializing the read before them is
//!   allowed.
//!
//! # Invariants
//! - Own `read_seq` and `read_ack` columns only grow within an incarnation.
//!   Both are words `Header { epoch, count }.encode()`: the leader's epoch
//!   and a count of its barriers in it. A follower echoes only a word of
//!   the epoch it follows, and a leader counts only echoes of its own
//!   epoch: a follower's echo of an earlier leader's barriers (found by the
//!   `kv` simulation: a read confirmed with no round at all) confirms
//!   nothing.
//! - A read is answered once: ready (in [`Effects::reads_ready`]) or failed
//!   (in [`Effects::reads_failed`], when this member stops leading the
//!   read's epoch before it is confirmed: the client retries at the new
//!   leader).
//! - At most [`MAX_PENDING_READS`] reads wait; more are refused with
//!   back-pressure.

use super::{Effects, Engine, Role};
use crate::engine::BroadcastError;
use crate::header::{Epoch, Header};

/// Most reads that may wait for confirmation at once.
pub const MAX_PENDING_READS: usize = 4096;

/// A read waiting for its confirmation round and its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PendingRead {
    pub(super) ticket: u64,
    /// The `read_seq` a quorum must echo (bumped after the read arrived).
    pub(super) seq: u64,
    /// The leader's Accepted when the read arrived.
    pub(super) index: Header,
    /// The epoch it led then.
    pub(super) epoch: Epoch,
}

impl Engine {
    /// Asks for a linearizable read (leader only): the caller's `ticket`
    /// comes back in [`Effects::reads_ready`] once the application state
    /// (after the deliveries of that poll) may answer it, or in
    /// [`Effects::reads_failed`] if this member stops leading first.
    pub fn read_index(&mut self, ticket: u64) -> Result<(), BroadcastError> {
        if self.role != Role::Leader {
            return Err(BroadcastError::NotLeader { leader: self.leader() });
        }
        if self.reads.len() >= MAX_PENDING_READS {
            return Err(BroadcastError::WouldBlock);
        }
        // Every read since the last bump shares the next one. After 2^32
        // barriers in one epoch the count would carry into the epoch bits:
        // reads wait for the next epoch instead.
        let Some(seq) = self.next_read_seq() else { return Err(BroadcastError::WouldBlock) };
        self.read_wanted = true;
        self.reads.push(PendingRead { ticket, seq, index: self.accepted, epoch: self.e_cur });
        Ok(())
    }

    /// Whether this epoch has a read barrier left (its 32-bit count is not
    /// spent): if not, the leader renews the epoch (`abdication`).
    pub(super) fn read_seq_left(&self) -> bool {
        self.next_read_seq().is_some()
    }

    /// The `read_seq` word the next bump writes: this epoch in the high
    /// bits (a [`Header`] of it), a count in the low ones, so an echo of
    /// another leader's (or another epoch's) barrier never confirms ours.
    fn next_read_seq(&self) -> Option<u64> {
        let last = Header::decode(self.read_seq);
        if last.epoch != self.e_cur {
            return Some(self.e_cur.header(1).encode());
        }
        last.count.checked_add(1).map(|c| self.e_cur.header(c).encode())
    }

    /// Leader: bump `read_seq` for the reads that arrived since the last
    /// bump (the row push carries it). Called before the row is flushed.
    pub(super) fn bump_read_seq(&mut self) {
        if self.read_wanted && self.role == Role::Leader {
            self.read_wanted = false;
            self.read_seq =
                self.next_read_seq().expect("read_index refuses a read that would overflow the count");
            self.store(self.layout.columns.read_seq, 0, self.read_seq);
            self.dirty_all = true;
        }
    }

    /// Follower: echo the leader's `read_seq` while following its epoch
    /// with no bigger promise.
    pub(super) fn echo_reads(&mut self) {
        if self.role != Role::Follower || self.e_new != self.e_cur {
            return;
        }
        let Some(row) = self.row_of(self.e_cur.leader) else { return };
        let seq = self.load(row, self.layout.columns.read_seq, 0);
        if Header::decode(seq).epoch == self.e_cur && seq > self.read_ack {
            self.read_ack = seq;
            self.store(self.layout.columns.read_ack, 0, seq);
            self.dirty_to[row] = true;
        }
    }

    /// Leader: answer the reads a quorum confirmed and whose index is
    /// committed (delivered); fail them all when leadership of their epoch
    /// is gone.
    pub(super) fn settle_reads(&mut self, fx: &mut Effects) -> usize {
        if self.reads.is_empty() {
            return 0;
        }
        let before = self.reads.len();
        if self.role != Role::Leader {
            fx.reads_failed.extend(self.reads.drain(..).map(|r| r.ticket));
            return before;
        }
        let col = self.layout.columns.read_ack;
        let e_cur = self.e_cur;
        // Echoes of this epoch's barriers only (the epoch is in the word).
        // (No allocation: this runs on every poll that holds reads, as
        // commit's quorum count does.)
        let mut echoes = [0u64; crate::config::MAX_MEMBERS];
        let n = self.members.len() - 1;
        for (k, r) in (0..self.members.len()).filter(|r| *r != self.my_row).enumerate() {
            let w = self.load(r, col, 0);
            echoes[k] = if Header::decode(w).epoch == e_cur { w } else { 0 };
        }
        let echoes = &mut echoes[..n];
        // The (quorum-1)-th largest echo is confirmed by a quorum with me.
        echoes.sort_unstable_by(|a, b| b.cmp(a));
        let confirmed = if self.quorum <= 1 { u64::MAX } else { echoes[self.quorum - 2] };
        let committed = self.committed;
        let mut i = 0;
        while i < self.reads.len() {
            let r = self.reads[i];
            if r.epoch != e_cur {
                fx.reads_failed.push(r.ticket);
                self.reads.swap_remove(i);
            } else if r.seq <= confirmed && r.index <= committed && r.seq <= self.read_seq {
                fx.reads_ready.push(r.ticket);
                self.reads.swap_remove(i);
            } else {
                i += 1;
            }
        }
        before - self.reads.len()
    }
}
