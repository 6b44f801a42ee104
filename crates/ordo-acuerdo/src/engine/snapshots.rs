//! State transfer (beyond the paper; crate docs, "Log garbage collection
//! and state transfer"): once garbage collection dropped entries a member
//! needs, its diff opens with an application snapshot instead.
//!
//! The leader takes the snapshot inside `poll` at its `Committed` header
//! `S` (the application has delivered exactly that prefix), once per poll
//! for every diff that needs one, and sends it in `max_payload` chunks
//! through the ring, then the log suffix `(S, upto]`, then the end marker
//! with `base = S`. The follower assembles the chunks and, at the end
//! marker, restores from the snapshot only if it is complete.
//!
//! # Invariants
//! - A snapshot covers exactly a committed prefix: `S = Committed` of the
//!   leader when taken, and `S ≤ upto ≤` its Accepted.
//! - A follower uses a snapshot only if every chunk of the same serial
//!   arrived in order, for header `base`, with the announced length.
//! - On restore the follower drops its whole log, sets `Committed` and its
//!   log floor to `S`, and continues delivering after `S`: no message is
//!   delivered twice by an incarnation, none is skipped.

use super::{DeliverySink, Effects, Engine, InLink, Note, OutLink, Snap, Stream};
use crate::header::Header;
use std::sync::Arc;

impl Engine {
    /// Stages a snapshot chunk from row `s` (a new serial, or offset 0,
    /// starts a new snapshot; a chunk out of order spoils it).
    pub(super) fn stage_snap_chunk(
        &mut self,
        s: usize,
        serial: u32,
        header: Header,
        offset: u64,
        total: u64,
        body: &[u8],
    ) {
        let link = self.inc[s].as_mut().expect("an incoming link for every other row");
        if link.snap_serial != Some(serial) || offset == 0 {
            link.snap_serial = Some(serial);
            link.snap_header = header;
            link.snap_total = total;
            link.snap = Vec::new();
            link.snap_ok = true;
        }
        if offset != link.snap.len() as u64
            || header != link.snap_header
            || total != link.snap_total
            || offset.saturating_add(body.len() as u64) > total
        {
            link.snap_ok = false;
        } else {
            link.snap.extend_from_slice(body);
        }
        assert!(
            !link.snap_ok || link.snap.len() as u64 <= link.snap_total,
            "a snapshot never outgrows its length"
        );
    }

    /// State transfer at the follower: `bytes` is the application state
    /// after every message up to `base`, which is committed (the leader's
    /// Committed when it took the snapshot); what this member holds below
    /// it is superseded, above it uncommitted.
    pub(super) fn restore_snapshot(
        &mut self,
        base: Header,
        bytes: &[u8],
        fx: &mut Effects,
        sink: &mut impl DeliverySink,
    ) {
        assert!(base > self.committed, "a snapshot restores only a prefix beyond Committed");
        self.log.clear();
        self.log_dirty(Header::NONE);
        if self.cfg.durable {
            self.restored = Some(base);
        }
        sink.restore(base, bytes);
        self.committed = base;
        self.log_floor = base;
        self.store(self.layout.columns.commit, 0, base.encode());
        self.commit_dirty = true;
        fx.notes.push(Note::Restored { header: base, bytes: bytes.len() });
        assert!(self.log.is_empty() && self.log_floor == self.committed);
    }
}

impl InLink {
    /// The snapshot of diff `serial` for header `base`, if it arrived whole.
    pub(super) fn take_snapshot(&mut self, serial: u32, base: Header) -> Option<Vec<u8>> {
        (self.snap_serial == Some(serial)
            && self.snap_ok
            && self.snap_header == base
            && self.snap.len() as u64 == self.snap_total)
            .then(|| std::mem::take(&mut self.snap))
    }
}

/// At the leader: a diff that waits for a snapshot (`Snap::Pending`) takes
/// it now, at `committed` (the application is there: deliveries happen
/// inside poll), sharing one snapshot per poll (`taken`) among every diff
/// that needs one; the diff then runs from `committed` to `accepted`.
pub(super) fn begin_snapshot_diff(
    link: &mut OutLink,
    taken: &mut Option<Arc<[u8]>>,
    sink: &mut impl DeliverySink,
    committed: Header,
    accepted: Header,
    fx: &mut Effects,
) {
    let Stream::Diff { serial, epoch, snap: Snap::Pending, .. } = link.stream else { return };
    let bytes = taken.get_or_insert_with(|| sink.snapshot().into()).clone();
    let base = committed;
    let upto = accepted.max(base);
    fx.notes.push(Note::SnapshotSent { to: link.peer, header: base, bytes: bytes.len() });
    link.snapshot = Some(bytes);
    link.stream =
        Stream::Diff { serial, epoch, base, upto, after: base, sent: 0, snap: Snap::Sending { chunks: 0 } };
    assert!(base <= upto, "a snapshot diff runs forward");
}
