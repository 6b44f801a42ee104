//! Abdication (beyond the paper): a leader that sees a live member promise
//! a bigger epoch steps down and starts an election at once, instead of
//! leading an epoch no quorum follows any more until a timeout.
//!
//! Epoch renewal (beyond the paper): a header's count is 32 bits, so a
//! leader whose epoch holds `epoch_messages` messages (by default
//! `u32::MAX`) steps down the same way once they are all committed, and —
//! the most up to date member, voting first with the biggest epoch — wins
//! the next election at once (the followers join its vote, Fig. 7 rule 2);
//! broadcasts get back-pressure meanwhile, never a count that wraps. It
//! waits while a live follower is being caught up (a diff in progress).
//!
//! # Invariants
//! - Only a leader abdicates: for a bigger epoch shown by a live row, or
//!   for a full epoch all committed; it stops its ring streams and votes
//!   for itself with an epoch bigger than every one it has seen (so its
//!   vote grows).

use super::{Effects, Engine, Note, Role, Stream};

impl Engine {
    /// Whether a live member promised an epoch bigger than the one this
    /// member leads.
    pub(super) fn superseded(&self) -> bool {
        assert_eq!(self.role, Role::Leader, "only a leader can be superseded");
        let c = self.layout.columns;
        (0..self.members.len())
            .any(|r| r != self.my_row && self.row_header(r, c.e_new).epoch > self.e_cur && self.alive_row(r))
    }

    /// Whether this leader's epoch is full (its messages, or its read
    /// barriers' 32-bit count) and all of it committed, and no live
    /// follower's catch-up is moving (a diff or state transfer in progress
    /// would start over in the new epoch: renewing under it, a restarted
    /// member could be starved — the `acuerdo` simulation found it with an
    /// epoch of 2 messages; one that has not moved for an election timeout
    /// is not waited for, so a follower that cannot read our ring does not
    /// stop the group): time to renew it.
    pub(super) fn epoch_spent(&mut self) -> bool {
        assert_eq!(self.role, Role::Leader, "only a leader's epoch fills");
        let full = self.count >= self.cfg.epoch_messages || !self.read_seq_left();
        if !full || self.committed != self.e_cur.header(self.count) {
            return false;
        }
        let (now, patience) = (self.now_ns, self.cfg.election_timeout_ns);
        let mut waiting = false;
        for r in 0..self.out.len() {
            let alive = self.alive_row(r);
            let Some(link) = self.out[r].as_mut() else { continue };
            let Stream::Diff { serial, .. } = link.stream else { continue };
            if !alive {
                continue;
            }
            let seen = (serial, link.send.reclaimable());
            if link.progress != Some(seen) {
                link.progress = Some(seen);
                link.progress_ns = now;
            }
            waiting |= now.saturating_sub(link.progress_ns) <= patience;
        }
        !waiting
    }

    /// Steps down from a full epoch and votes for itself in a bigger one.
    pub(super) fn renew_epoch(&mut self, fx: &mut Effects) -> usize {
        fx.notes.push(Note::EpochRenewed(self.e_cur));
        self.step_down(fx)
    }

    /// Steps down and votes for itself in a bigger epoch.
    pub(super) fn abdicate(&mut self, fx: &mut Effects) -> usize {
        fx.notes.push(Note::Abdicated(self.e_cur));
        self.step_down(fx)
    }

    fn step_down(&mut self, fx: &mut Effects) -> usize {
        assert_eq!(self.role, Role::Leader, "only a leader abdicates");
        let led = self.e_cur;
        self.set_role(Role::Electing);
        self.stop_streams();
        self.vote_for_self(fx);
        assert!(self.e_new > led, "the new vote's epoch is bigger than the abdicated one");
        1
    }
}
