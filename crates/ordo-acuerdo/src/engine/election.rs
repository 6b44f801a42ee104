//! Roles and leader election (acuerdo §3.3, Fig. 7).
//!
//! ```text
//!  96 On: Timeout or Periodically when Role == ELECTING
//!  99 mx = max_vote(Vote_SST);
//! 100 if (timed_out || Accepted > mx.acpt) {                  // rule 1: vote for self
//! 102     E_new = new_bigger_epoch(E_new, mx.e_new, Self); Vote_SST[Self] = <E_new, Accepted>;
//! 106 } elif (mx > Vote_SST[Self] && Accepted ≤ mx.acpt) {    // rule 2: join the max vote
//! 108     E_new = mx.e_new; Vote_SST[Self] = <E_new, mx.acpt>;
//!     }
//! 114 if (majority_v∈Vote_SST (v == Vote_SST[Self]) && Vote_SST[Self].e_new.ldr == Self) {
//! 117     Role = LEADER; Count = 0;
//! 119     foreach j: send_to(j, diff of Log entries in [comm_cpy[j], Accepted]);
//!     }
//! ```
//! [`Engine::election_step`] is lines 96-117; the diffs of line 119 are the
//! streams [`Engine::become_leader`] opens (built in [`super::diffs`]).
//! [`Engine::roles`] moves between the roles: a follower whose leader's row
//! goes silent (heartbeat timeout) or drops its leader bit elects; a leader
//! that sees a bigger epoch abdicates ([`super::abdication`], beyond the
//! paper).
//!
//! # Invariants
//! - The vote only grows, and `E_new` with it; a member votes for itself
//!   only with a fresh epoch bigger than every epoch it has seen.
//! - The winner holds a quorum of identical votes for its own `E_new`, each
//!   voter's `Accepted` at most the winner's: the winner is up to date.
//! - Only a synced member (not a restarted one still catching up) votes.

use super::{Effects, Engine, Note, Role};
use crate::header::{Epoch, Vote};

impl Engine {
    pub(super) fn roles(&mut self, fx: &mut Effects) -> usize {
        match self.role {
            Role::Follower => {
                if !self.leads(self.e_cur.leader, self.e_cur) {
                    self.set_role(Role::Electing);
                    self.stall = None;
                }
            }
            Role::Leader => {
                // Beyond the paper: see `abdication`.
                if self.superseded() {
                    return self.abdicate(fx);
                }
                if self.epoch_spent() {
                    return self.renew_epoch(fx);
                }
            }
            Role::Electing => {
                // A transient delay: our leader is back and we never moved on.
                let leader = self.e_cur.leader;
                if self.synced
                    && self.e_cur != Epoch::NONE
                    && self.e_new == self.e_cur
                    && self.accepted.epoch == self.e_cur
                    && leader != self.me
                    && self.leads(leader, self.e_cur)
                {
                    self.set_role(Role::Follower);
                    return 1;
                }
            }
        }
        assert!(
            self.role != Role::Leader || (self.e_cur.leader == self.me && self.e_cur == self.e_new),
            "a leader leads its own, newest epoch"
        );
        if self.role == Role::Electing && self.synced { self.election_step(fx) } else { 0 }
    }

    pub(super) fn max_epoch_seen(&mut self) -> Epoch {
        let c = self.layout.columns;
        let mut e = self.e_new.max(self.e_cur);
        for row in 0..self.members.len() {
            if self.ring_mode_differs_at(row).is_some() {
                continue; // not of our group (see `votes_count`)
            }
            e = e.max(self.row_header(row, c.e_new).epoch).max(self.read_vote(row).e_new);
        }
        assert!(e >= self.e_new, "the largest epoch seen covers our own promise");
        e
    }

    /// Whether row `r`'s votes and promises count in our elections: not
    /// those of a member whose ring mode differs from ours (it cannot read
    /// our rings nor we its: a quorum with it could commit nothing, and its
    /// votes, racing ours upward, would otherwise keep both sides electing
    /// — and spend the rounds — for good).
    fn votes_count(&self, r: usize) -> bool {
        r == self.my_row || self.ring_mode_differs_at(r).is_none()
    }

    pub(super) fn vote_for_self(&mut self, fx: &mut Effects) {
        let seen = self.max_epoch_seen();
        let e = Epoch::next_for(seen, self.me);
        assert!(e > seen && e.leader == self.me, "a fresh epoch of our own, bigger than any seen (line 102)");
        self.set_e_new(e);
        self.set_vote(Vote { e_new: e, acpt: self.accepted }, fx);
        self.stall = Some((self.my_vote, self.now_ns));
        assert!(self.my_vote.candidate() == self.me && self.my_vote.e_new == self.e_new);
    }

    /// One step of the fixed-point election (Fig. 7, lines 96-127).
    pub(super) fn election_step(&mut self, fx: &mut Effects) -> usize {
        assert_eq!(self.role, Role::Electing, "only an electing member runs the election");
        assert!(self.synced, "a restarted member votes only once it caught up");
        let mut mx: Option<Vote> = None;
        for row in 0..self.members.len() {
            if !self.votes_count(row) {
                continue;
            }
            let v = if row == self.my_row { self.my_vote } else { self.read_vote(row) };
            if !v.is_none() && v.e_new >= self.e_new && mx.is_none_or(|m| v > m) {
                mx = Some(v);
            }
        }
        let stagger = self.cfg.election_timeout_ns * self.my_row as u64 / self.members.len() as u64;
        let stalled = match (mx, self.stall) {
            // The candidate won and is sending us its diff (which may take
            // a while for a long log): wait for it.
            (Some(m), _) if self.leads(m.candidate(), m.e_new) => {
                self.stall = Some((m, self.now_ns));
                false
            }
            (Some(m), Some((s, since))) if m == s => {
                self.now_ns.saturating_sub(since) > self.cfg.election_timeout_ns + stagger
            }
            (Some(m), _) => {
                self.stall = Some((m, self.now_ns));
                false
            }
            (None, _) => false,
        };
        let mut work = 0;
        match mx {
            None => {
                self.vote_for_self(fx);
                work += 1;
            }
            Some(m) if m.candidate() == self.me => {
                if stalled {
                    self.vote_for_self(fx);
                    work += 1;
                }
            }
            Some(m) => {
                // Rule 1 (line 100): the best candidate timed out or is less
                // up to date than we are; rule 2 (line 106): join it.
                if stalled || !self.alive(m.candidate()) || self.accepted > m.acpt {
                    self.vote_for_self(fx);
                    work += 1;
                } else if m > self.my_vote {
                    if m.e_new > self.e_new {
                        self.set_e_new(m.e_new);
                    }
                    self.set_vote(m, fx);
                    work += 1;
                }
            }
        }
        // Lines 114-127: a quorum of identical votes for us.
        // (Never an epoch it was already in: a member recovered from disk
        // may hold its own vote for an epoch it led.)
        if self.my_vote.candidate() == self.me && self.my_vote.e_new == self.e_new && self.e_new > self.e_cur
        {
            let mine = self.my_vote;
            let n = (0..self.members.len())
                .filter(|r| {
                    if *r == self.my_row { true } else { self.votes_count(*r) && self.read_vote(*r) == mine }
                })
                .count();
            if n >= self.quorum {
                self.become_leader(fx);
                assert_eq!(self.role, Role::Leader);
                work += 1;
            }
        }
        work
    }

    pub(super) fn become_leader(&mut self, fx: &mut Effects) {
        let e = self.e_new;
        assert!(self.my_vote.candidate() == self.me && self.my_vote.e_new == e, "a winner won its own vote");
        assert!(e > self.e_cur, "a new epoch, bigger than the one we were in");
        self.set_role(Role::Leader);
        self.e_cur = e;
        self.count = 0;
        // The leader is up to date: its own log is the new epoch's history.
        // It "accepts" its own diff (§3.4).
        self.set_accepted(e.header(0));
        self.next = e.header(0);
        for row in 0..self.out.len() {
            if self.out[row].is_some() {
                let stream = self.diff_stream(row, false);
                let request = self.load(row, self.layout.columns.diff_request, 0);
                let link = self.out[row].as_mut().expect("link");
                link.stream = stream;
                link.served_request = request;
            }
        }
        self.stall = None;
        self.dirty_all = true;
        assert!(self.e_cur == e && self.accepted == e.header(0) && self.next == e.header(0));
        fx.notes.push(Note::BecameLeader(e));
    }
}
