//! Abdication (beyond the paper): a leader that sees a live member promise
//! a bigger epoch steps down and starts an election at once, instead of
//! leading an epoch no quorum follows any more until a timeout.
//!
//! # Invariants
//! - Only a leader abdicates, and only for a bigger epoch shown by a live
//!   row; it stops its ring streams and votes for itself with an epoch
//!   bigger than every one it has seen (so its vote grows).

use super::{Effects, Engine, Note, Role};

impl Engine {
    /// Whether a live member promised an epoch bigger than the one this
    /// member leads.
    pub(super) fn superseded(&self) -> bool {
        assert_eq!(self.role, Role::Leader, "only a leader can be superseded");
        let c = self.layout.columns;
        (0..self.members.len())
            .any(|r| r != self.my_row && self.row_header(r, c.e_new).epoch > self.e_cur && self.alive_row(r))
    }

    /// Steps down and votes for itself in a bigger epoch.
    pub(super) fn abdicate(&mut self, fx: &mut Effects) -> usize {
        assert_eq!(self.role, Role::Leader, "only a leader abdicates");
        let led = self.e_cur;
        fx.notes.push(Note::Abdicated(led));
        self.set_role(Role::Electing);
        self.stop_streams();
        self.vote_for_self(fx);
        assert!(self.e_new > led, "the new vote's epoch is bigger than the abdicated one");
        1
    }
}
