//! Committing (acuerdo §3.2, Fig. 6).
//!
//! ```text
//! 72 if ((Role == LEADER && majority_k (Accept_SST[k] ≥ Next && Accept_SST[k].e == E_cur))
//! 75  || (Role == FOLLOWER && Commit_SST[E_cur.ldr] ≥ Next && Commit_SST[E_cur.ldr].e == E_cur)) {
//! 79     if (∃ M ∈ Log: M.hdr == Next && Next.cnt ≠ 0) { deliver(M); Committed = Next; }   // normal commit
//! 83     elif (Next.cnt == 0) {                                                             // diff commit
//! 84         d = {(h, m) ∈ Log | Committed < h < Next};
//! 85         while (d ≠ ∅) { n = d[d.minKey()]; deliver(n); Committed = n.hdr; d.remove(d.minKey()); }
//!        }
//! 90     Next.cnt++;
//! }
//! 93 On: Periodically: Commit_SST[Self] = Committed; Commit_SST.push_mine();
//! ```
//! [`Engine::commit`] is lines 72-90; line 93 is the periodic row push
//! (`commit_push_interval_ns`, [`super::rows`]): commits travel off the
//! critical path.
//!
//! # Invariants
//! - Messages are delivered once each, in header order: every delivered
//!   header is above `Committed`, which then becomes it.
//! - A leader's threshold is the quorum-th largest Accept of `E_cur` (its
//!   own included), or, read first in an urgent step, the least Accept of
//!   `E_cur` in the quorum that was highest at the last full read (a
//!   quorum holds it, so it is at most the quorum-th largest; every full
//!   poll reads all rows and re-chooses that quorum); a follower's is its
//!   leader's Commit column of `E_cur`.
//! - `Committed < Next` after every step.

use super::{DeliverySink, Effects, Engine, Role};
use crate::header::Header;
use std::ops::Bound;

impl Engine {
    /// Lines 72-90. `hinted`: a leader reads first the quorum of its last
    /// full read (see below); a full poll passes false and reads every row.
    pub(super) fn commit(&mut self, fx: &mut Effects, sink: &mut impl DeliverySink, hinted: bool) -> usize {
        let c = self.layout.columns;
        let threshold = match self.role {
            Role::Leader => {
                // (No allocation: this runs on every poll. The words are
                // compared encoded: their numeric order is the headers'.)
                let epoch_word = self.e_cur.encode() >> 32;
                // First the quorum of the last full read (this leader and
                // the followers whose Accept was highest then): the least
                // Accept of the epoch among them is one a quorum holds. If
                // it moves Next, the other rows' lines (an ack may be
                // landing in one, moving it from core to core) are not
                // read this time.
                if hinted && self.commit_hint_len + 1 == self.quorum {
                    let (mut least, mut of_epoch) = (self.accepted.encode(), true);
                    for &r in &self.commit_hint[..self.commit_hint_len] {
                        let w = self.load(r as usize, c.accept, 0);
                        of_epoch &= w >> 32 == epoch_word;
                        least = least.min(w);
                    }
                    let threshold = Header::decode(least).min(self.accepted);
                    if of_epoch && threshold >= self.next {
                        assert_eq!(threshold.epoch, self.e_cur, "the threshold is of the current epoch");
                        return self.commit_upto(threshold, fx, sink);
                    }
                }
                // The quorum-th largest Accept of the current epoch (line 74).
                let mut acks = [(0u64, 0u8); crate::config::MAX_MEMBERS];
                let mut k = 0;
                for r in 0..self.members.len() {
                    let w = if r == self.my_row { self.accepted.encode() } else { self.load(r, c.accept, 0) };
                    if w >> 32 == epoch_word {
                        acks[k] = (w, r as u8);
                        k += 1;
                    }
                }
                if k < self.quorum {
                    return 0;
                }
                let acks = &mut acks[..k];
                // Highest Accept first; among equal ones the lower row, the
                // follower a broadcast posts to first (`send` walks the
                // links in row order), so at window 1 the hint names the
                // follower whose ack lands first and the next commit reads
                // one line, not a line still in flight and then every row.
                acks.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                // The next read starts with the highest followers.
                self.commit_hint_len = 0;
                for &(_, r) in acks.iter().filter(|(_, r)| *r as usize != self.my_row).take(self.quorum - 1) {
                    self.commit_hint[self.commit_hint_len] = r;
                    self.commit_hint_len += 1;
                }
                // Followers' Accept columns are peer input: never commit
                // beyond what this leader itself holds.
                let threshold = Header::decode(acks[self.quorum - 1].0).min(self.accepted);
                assert_eq!(threshold.epoch, self.e_cur, "the threshold is of the current epoch (line 74)");
                threshold
            }
            Role::Follower => {
                let Some(r) = self.row_of(self.e_cur.leader) else { return 0 };
                let h = self.row_header(r, c.commit);
                if h.epoch != self.e_cur {
                    return 0;
                }
                h
            }
            Role::Electing => return 0,
        };
        self.commit_upto(threshold, fx, sink)
    }

    /// Lines 76-90 up to `threshold`: what a quorum accepted (leader) or
    /// the leader committed (follower).
    fn commit_upto(&mut self, threshold: Header, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        let c = self.layout.columns;
        let mut work = 0;
        while self.next <= threshold {
            if self.next.count == 0 {
                // Diff commit (line 83): everything before it, in order.
                let upto = self.next;
                let from = self.committed;
                assert!(from < upto, "a diff commit moves Committed forward");
                let batch: Vec<Header> =
                    self.log.range((Bound::Excluded(from), Bound::Excluded(upto))).map(|(h, _)| *h).collect();
                for h in batch {
                    self.deliver(h, fx, sink);
                }
                self.committed = upto;
            } else if self.log.contains_key(&self.next) {
                let h = self.next;
                self.deliver(h, fx, sink);
                self.committed = h;
            } else {
                break; // not received yet; the ring brings it
            }
            self.next = self.next.succ();
            work += 1;
        }
        assert!(self.committed < self.next, "Committed < Next after committing");
        if work > 0 {
            // Commit pushes are periodic, off the critical path (Fig. 6):
            // the row goes out at most every `commit_push_interval_ns`
            // (or with anything else that pushes it).
            self.store(c.commit, 0, self.committed.encode());
            self.commit_dirty = true;
        }
        work
    }

    pub(super) fn deliver(&mut self, h: Header, fx: &mut Effects, sink: &mut impl DeliverySink) {
        assert!(h > self.committed, "delivering {h:?} at or below Committed {:?}", self.committed);
        assert!(h.count > 0, "a diff marker (count 0) is committed, never delivered");
        let body = self.log.get(&h).expect("delivered entry is in the log");
        sink.deliver(h, body);
        self.delivered += 1;
        if h.epoch.leader == self.me {
            fx.committed.push(h);
        }
    }
}
