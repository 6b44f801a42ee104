//! Diffs beyond Fig. 7 line 119: how a leader's diff travels and who gets
//! one.
//!
//! The paper sends a diff as one message. Here it is a *stream* over the
//! follower's ring (it may be longer than a slot): one ring message per log
//! entry in `(base, upto]`, optionally preceded by snapshot chunks
//! ([`super::snapshots`]), closed by an end marker carrying the epoch,
//! `base`, `upto` and the entry count; a follower stages entries by diff
//! serial and applies the diff only at its end marker ([`Engine::on_diff`]).
//! Beyond the paper as well: a restarted member (empty state) first learns
//! its epoch floor from f+1 synced rows, then *requests* a full diff
//! through its `diff_request` column; a follower that rejected a diff asks
//! again the same way.
//!
//! # Invariants
//! - A diff to a member starts after that member's Commit header (after
//!   nothing when it restarted), or at a snapshot when that header is below
//!   the log floor; `base ≤ upto`.
//! - A follower applies a diff only when every staged entry of the same
//!   serial arrived (`entries` of them) with its end marker.
//! - A restarted member does not vote or accept until f+1 members showed it
//!   the current epochs and it caught up by a full diff.

use super::{Effects, Engine, InLink, Note, Role, Snap, Stream};
use crate::header::{Epoch, Header};

/// A complete diff as a follower received it.
pub(super) struct Diff {
    pub(super) epoch: Epoch,
    pub(super) base: Header,
    pub(super) upto: Header,
    pub(super) entries: u32,
    pub(super) staged: Vec<(Header, Vec<u8>)>,
    pub(super) snapshot: Option<Vec<u8>>,
}

impl Engine {
    pub(super) fn stop_streams(&mut self) {
        for link in self.out.iter_mut().flatten() {
            link.stream = Stream::Idle;
        }
        debug_assert!(self.out.iter().flatten().all(|l| l.stream == Stream::Idle));
    }

    /// A diff for the member of `row`: every log entry after its committed
    /// header (after nothing when `full`), up to the end of the log.
    pub(super) fn diff_stream(&mut self, row: usize, full: bool) -> Stream {
        let want = if full { Header::NONE } else { self.row_header(row, self.layout.columns.commit) };
        let upto = self.log.last_key_value().map_or(Header::NONE, |(h, _)| *h).max(self.e_cur.header(0));
        let link = self.out[row].as_mut().expect("link");
        link.next_serial = (link.next_serial + 1) & 0xFF_FFFF;
        link.snapshot = None;
        let (serial, epoch) = (link.next_serial, self.e_cur);
        if want < self.log_floor {
            // Entries it needs are gone: state transfer. The snapshot, its
            // base and `upto` are fixed when it is taken (`send`).
            let none = Header::NONE;
            return Stream::Diff {
                serial,
                epoch,
                base: none,
                upto: none,
                after: none,
                sent: 0,
                snap: Snap::Pending,
            };
        }
        let base = want.min(upto);
        assert!(want >= self.log_floor, "a plain diff: the member needs no entry below the floor");
        assert!(base <= upto, "a diff runs forward");
        Stream::Diff { serial, epoch, base, upto, after: base, sent: 0, snap: Snap::No }
    }

    pub(super) fn serve_requests(&mut self) {
        assert_eq!(self.role, Role::Leader, "only a leader serves diff requests");
        for row in 0..self.out.len() {
            if self.out[row].is_none() {
                continue;
            }
            let request = self.load(row, self.layout.columns.diff_request, 0);
            let served = self.out[row].as_ref().expect("link").served_request;
            if request != 0 && request != served {
                // A restarted member (not synced) gets a full diff; a synced
                // one (it rejected a diff, or it synced from an earlier diff
                // since it asked) one from its Commit header, which avoids a
                // second state transfer.
                let synced = self.load(row, self.layout.columns.status, 0) & 1 != 0;
                let stream = self.diff_stream(row, !synced);
                let link = self.out[row].as_mut().expect("link");
                link.stream = stream;
                link.served_request = request;
            }
        }
    }

    /// A restarted member forgot its promises. Any epoch whose quorum
    /// counted it also holds f other members; hearing from f+1 synced
    /// others (rows in this incarnation's zeroed region were all pushed
    /// after the restart) meets one of them, so the largest epoch they show
    /// bounds every promise this member made before.
    pub(super) fn learn_floor(&mut self, fx: &mut Effects) -> usize {
        assert!(!self.floor_ready && !self.synced, "only a restarted member learns its floor");
        let c = self.layout.columns;
        let mut heard = 0;
        let mut floor = self.e_new;
        for row in 0..self.members.len() {
            if row == self.my_row
                || self.load(row, c.heartbeat, 0) == 0
                || self.load(row, c.status, 0) & 1 == 0
            {
                continue;
            }
            heard += 1;
            floor = floor
                .max(self.row_header(row, c.e_new).epoch)
                .max(self.row_header(row, c.accept).epoch)
                .max(self.row_header(row, c.commit).epoch)
                .max(self.read_vote(row).e_new);
        }
        if heard < self.cfg.f() + 1 {
            return 0;
        }
        self.floor_ready = true;
        if floor > self.e_new {
            self.set_e_new(floor);
        }
        self.request_diff(fx);
        1
    }

    pub(super) fn request_diff(&mut self, fx: &mut Effects) {
        self.request_seq += 1;
        assert!(self.request_seq < 1 << 32, "requests fit the low word");
        let word = (self.cfg.incarnation << 32) | self.request_seq;
        self.store(self.layout.columns.diff_request, 0, word);
        self.dirty_all = true;
        fx.notes.push(Note::RequestedDiff(word));
    }

    /// Stages a diff entry from row `s` under its diff serial (a new serial
    /// drops what an older diff left).
    pub(super) fn stage_diff_entry(&mut self, s: usize, serial: u32, header: Header, body: Vec<u8>) {
        let link = self.inc[s].as_mut().expect("an incoming link for every other row");
        if link.staging_serial != Some(serial) {
            link.staging.clear();
            link.staging_serial = Some(serial);
        }
        link.staging.push((header, body));
        debug_assert_eq!(link.staging_serial, Some(serial));
    }

    /// The diff an end marker from row `s` closes: the entries staged under
    /// its serial and, if one arrived whole, its snapshot. Clears the
    /// staging either way.
    pub(super) fn take_diff(
        &mut self,
        s: usize,
        serial: u32,
        epoch: Epoch,
        base: Header,
        upto: Header,
        entries: u32,
    ) -> Diff {
        let link: &mut InLink = self.inc[s].as_mut().expect("an incoming link for every other row");
        let staged =
            if link.staging_serial == Some(serial) { std::mem::take(&mut link.staging) } else { Vec::new() };
        let snapshot = link.take_snapshot(serial, base);
        link.clear_staging();
        assert!(link.staging.is_empty() && link.staging_serial.is_none(), "staging is cleared");
        Diff { epoch, base, upto, entries, staged, snapshot }
    }
}
