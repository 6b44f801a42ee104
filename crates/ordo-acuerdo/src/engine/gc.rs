//! Log garbage collection (beyond the paper; crate docs, "Log garbage
//! collection"). The paper's log grows for ever; ordo drops the entries
//! every live member committed.
//!
//! # Invariants
//! - The floor is at most `Committed` and at most every live member's
//!   Commit column, and never passes an entry a live member's ring stream
//!   has still to send; the log keeps nothing at or below it.
//! - A stream that falls below the new floor (its member is suspected)
//!   becomes a state-transfer diff ([`super::snapshots`]).

use super::wire::recycle;
use super::{Engine, Snap, Stream};
use crate::header::Header;

/// Log garbage collection waits until the log holds this many entries.
pub(super) const GC_BATCH: usize = 16;

impl Engine {
    /// Log garbage collection ([`Config::log_gc`]; crate docs, "Log garbage
    /// collection"): drops the entries at or below the smallest Commit
    /// column of the members not suspected (own row: `Committed`), but
    /// never an entry a live member's ring stream has still to send. A
    /// suspected member's stream that falls below the new floor becomes a
    /// state-transfer diff. A live row not heard from yet reads
    /// `Header::NONE` and drops nothing.
    pub(super) fn collect_garbage(&mut self) {
        // Collect in batches of GC_BATCH entries (this runs on every poll;
        // collecting whenever the log held GC_BATCH entries dropped one
        // entry per commit, each time after a scan of every row). A log
        // shrunk by other means (a snapshot) lowers the mark.
        self.gc_next_len = self.gc_next_len.min(self.log.len() + GC_BATCH);
        // The mark moves only when a collection dropped entries: a floor
        // pinned by a member not yet suspected is tried again every poll,
        // so the log shrinks as soon as the suspicion lets it (the log may
        // not grow again).
        if !self.cfg.log_gc || !self.synced || self.log.len() < self.gc_next_len.max(GC_BATCH) {
            return;
        }
        let c = self.layout.columns;
        let mut floor = self.committed;
        for r in 0..self.members.len() {
            if r != self.my_row && self.alive_row(r) {
                floor = floor.min(self.row_header(r, c.commit));
            }
        }
        for r in 0..self.out.len() {
            if let Some(pos) = self.out[r].as_ref().and_then(|l| stream_position(l.stream))
                && self.alive_row(r)
            {
                floor = floor.min(pos);
            }
        }
        if floor <= self.log_floor {
            return;
        }
        assert!(self.synced && self.cfg.log_gc, "only a synced member collects, and only when asked to");
        while self.log.first_key_value().is_some_and(|(h, _)| *h <= floor) {
            if let Some((_, body)) = self.log.pop_first() {
                recycle(&mut self.pool, body);
            }
        }
        assert!(floor <= self.committed, "the floor never passes Committed");
        self.log_floor = floor;
        self.gc_next_len = self.log.len() + GC_BATCH;
        debug_assert!(
            self.log.first_key_value().is_none_or(|(h, _)| *h > floor),
            "nothing at or below the floor"
        );
        // Suspected members whose stream needs dropped entries get a
        // snapshot instead, should they come back.
        for r in 0..self.out.len() {
            if let Some(pos) = self.out[r].as_ref().and_then(|l| stream_position(l.stream))
                && pos < floor
            {
                let stream = self.diff_stream(r, false);
                self.out[r].as_mut().expect("link").stream = stream;
            }
        }
    }
}

/// The last log entry `stream` has put in its ring, if it has still log
/// entries after it to send (those must stay in the log).
pub(super) fn stream_position(stream: Stream) -> Option<Header> {
    match stream {
        Stream::Idle | Stream::Diff { snap: Snap::Pending, .. } => None,
        Stream::Diff { after, .. } | Stream::Normal { after } => Some(after),
    }
}
