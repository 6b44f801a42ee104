//! Accepting (acuerdo §3.2 and §3.4, Fig. 5).
//!
//! ```text
//! 43 On: Receive message<msghdr<epoch e, uint32 cnt> hdr, payload pd> M via incoming_buff[i]
//! 47 if (e == E_new && e == E_cur) {          // normal message acceptance
//! 49     Log[hdr] = M; Accepted = hdr;
//! 51     Accept_SST[Self] = hdr; Accept_SST.push_mine_to(E_cur.ldr);
//! 54 } elif (E_new ≤ e) {                     // diff acceptance, into broadcast
//! 57     assert(hdr.cnt == 0); E_new = e; E_cur = e;
//! 60     if (e.ldr ≠ Self) { Role = FOLLOWER; }
//! 62     ∀ N ∈ Log ∧ N.hdr ≥ d.minKey(): Log.remove(N);  ∀ (h,n) ∈ d: Log[h] = n;
//! 63     Accepted = hdr; Accept_SST[Self] = hdr; Accept_SST.push_mine_to(E_cur.ldr);
//! 66     Next = <E_cur, 0>;
//! }
//! ```
//! [`Engine::receive`] scans each incoming ring once per poll and accepts
//! normal messages (line 47); of a batch it acknowledges only the latest
//! header: FIFO covers the earlier ones (§3.2, the key difference with
//! Zab). A diff arrives as several ring messages (entries, snapshot chunks,
//! an end marker: [`super::diffs`], [`super::snapshots`]); once complete,
//! [`Engine::on_diff`] applies lines 54-66.
//!
//! # Invariants
//! - A normal message is accepted only from the leader of `E_cur == E_new`,
//!   above `Accepted`; anything else is dropped (and its buffer recycled).
//! - `Accepted` only grows; a diff is applied only if it takes `Accepted`
//!   forward and reaches back to `Committed` (or carries a complete
//!   snapshot of the prefix it skips): a follower never delivers with a gap.
//! - A peer's malformed message is a [`Note::BadMessage`], never a panic.

use super::diffs::Diff;
use super::wire::{Wire, recycle};
use super::{DeliverySink, Effects, Engine, Note, Role};
use crate::header::Header;
use ordo_fabric::MemberId;

impl Engine {
    /// Scans every incoming ring once: accepts normal messages (line 47),
    /// stages diffs, applies complete ones (lines 54-66).
    pub(super) fn receive(&mut self, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        let mut work = 0;
        for s in 0..self.inc.len() {
            if self.inc[s].is_none() {
                continue;
            }
            let session = self.sync_in_session(s);
            if session == 0 {
                continue;
            }
            if let Some(stamped) = self.ring_mode_differs_at(s) {
                // Its ring cannot be read as ours is (counter or stamps).
                if !std::mem::replace(&mut self.ring_mode_differs[s], true) {
                    fx.notes.push(Note::RingModeDiffers { sender: self.members[s], stamped });
                }
                continue;
            }
            self.ring_mode_differs[s] = false;
            let Some(mut msgs) = self.scan_ring(s, session) else { continue };
            work += msgs.len();
            let sender = self.members[s];
            let mut latest = None;
            for msg in msgs.drain(..) {
                match msg {
                    Ok(Wire::Normal { header, body }) => {
                        if self.accept_normal(sender, header, body) {
                            latest = Some(header);
                        }
                    }
                    Ok(Wire::DiffEntry { serial, header, body }) => {
                        self.stage_diff_entry(s, serial, header, body)
                    }
                    Ok(Wire::SnapChunk { serial, header, offset, total, body }) => {
                        self.stage_snap_chunk(s, serial, header, offset, total, &body);
                        recycle(&mut self.pool, body);
                    }
                    Ok(Wire::DiffEnd { serial, epoch, base, upto, entries }) => {
                        // What came before the diff is accepted before it.
                        if let Some(h) = latest.take() {
                            self.set_accepted(h);
                        }
                        let diff = self.take_diff(s, serial, epoch, base, upto, entries);
                        self.on_diff(sender, diff, fx, sink);
                    }
                    Err(what) => fx.notes.push(Note::BadMessage { sender, what }),
                }
            }
            self.msgs = msgs;
            // Acknowledge only the latest header of the scan: FIFO covers
            // the earlier ones (§3.2).
            if let Some(h) = latest {
                self.set_accepted(h);
            }
        }
        work
    }

    /// Fig. 5, line 47-49: a normal message is accepted only in the current
    /// epoch, from its leader, above `Accepted`. Returns whether it was
    /// (the body then lives in the log; otherwise it is recycled).
    fn accept_normal(&mut self, sender: MemberId, header: Header, body: Vec<u8>) -> bool {
        if header.epoch == self.e_new
            && header.epoch == self.e_cur
            && sender == header.epoch.leader
            && header > self.accepted
            && header.count > 0
        {
            assert!(self.role != Role::Leader, "a leader receives no normal messages of its own epoch");
            if let Some(old) = self.log.insert(header, body) {
                recycle(&mut self.pool, old);
            }
            self.log_dirty(header);
            true
        } else {
            recycle(&mut self.pool, body);
            false
        }
    }

    /// Fig. 5, lines 54-66: diff acceptance and transition into broadcast;
    /// with a snapshot (state transfer), the application state replaces
    /// the committed prefix up to `base`.
    pub(super) fn on_diff(
        &mut self,
        sender: MemberId,
        diff: Diff,
        fx: &mut Effects,
        sink: &mut impl DeliverySink,
    ) {
        let Diff { epoch, base, upto, entries, staged, snapshot } = diff;
        let reject = |fx: &mut Effects, reason| fx.notes.push(Note::DiffRejected { epoch, reason });
        // A peer's diff is input: entries must be messages (count > 0) of
        // epochs up to the diff's, each once, in order.
        let well_formed = staged.iter().all(|(h, _)| h.count > 0 && h.epoch <= epoch)
            && staged.windows(2).all(|w| w[0].0 < w[1].0);
        if sender != epoch.leader || staged.len() != entries as usize || !well_formed {
            return reject(fx, "malformed");
        }
        if self.e_new > epoch {
            return reject(fx, "promised a bigger epoch");
        }
        let new_accepted = if upto.epoch == epoch { upto } else { epoch.header(0) };
        if self.synced && self.e_cur == epoch && self.accepted >= new_accepted {
            return; // nothing new (a repeated diff)
        }
        // The diff must reach back to our committed header, or carry a
        // snapshot of the (committed) prefix up to its base. A follower of
        // this epoch that accepted `base` already holds the leader's log up
        // to it (FIFO from the same leader, who only appends): it keeps its
        // log up to Accepted and needs no snapshot.
        let mut keep = self.committed;
        let restore = if base > self.committed && self.synced && self.e_cur == epoch && self.accepted >= base
        {
            keep = self.accepted;
            None
        } else if base > self.committed {
            match snapshot {
                Some(bytes) if base <= new_accepted => Some(bytes),
                _ => {
                    reject(fx, "does not reach back to our committed header");
                    return self.request_diff(fx);
                }
            }
        } else {
            None
        };
        let joined = self.e_cur != epoch;
        if epoch > self.e_new {
            self.set_e_new(epoch);
        }
        self.e_cur = epoch;
        if self.role == Role::Leader {
            self.stop_streams();
        }
        self.set_role(Role::Follower);
        if let Some(bytes) = restore {
            // State transfer (beyond the paper): see `snapshots`.
            self.restore_snapshot(base, &bytes, fx, sink);
        }
        // Drop the uncommitted suffix, then apply the diff (line 62-63).
        let keep = keep.max(self.committed);
        self.log.truncate_from(keep.succ());
        self.log_dirty(keep.succ());
        for (h, body) in staged {
            if h > keep {
                self.log.insert(h, body);
            }
        }
        // Every path here has new_accepted > Accepted: another epoch (ours
        // is older), a restarted member (nothing), or a newer diff.
        assert!(new_accepted > self.accepted, "a diff that takes Accepted back");
        self.accepted = new_accepted;
        self.store(self.layout.columns.accept, 0, self.accepted.encode());
        if let Some(r) = self.row_of(epoch.leader) {
            self.dirty_to[r] = true;
        }
        if joined {
            self.next = epoch.header(0);
        }
        if self.next <= self.committed {
            // A snapshot covered the diff commit (and maybe more) already.
            self.next = self.committed.succ();
        }
        if !self.synced {
            self.synced = true;
            self.write_status();
        }
        self.dirty_all = true;
        assert!(
            self.role == Role::Follower && self.e_cur == epoch && self.e_new == epoch,
            "joined the diff's epoch"
        );
        assert!(self.synced && self.committed < self.next, "a follower is synced, Committed < Next");
        fx.notes.push(Note::JoinedEpoch(epoch));
    }
}
