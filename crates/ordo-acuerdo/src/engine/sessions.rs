//! Ring sessions (beyond the paper): a ring to a peer is restarted after
//! every reconnection, since writes posted before a link failure may be
//! missing at the peer, or the peer may be a new incarnation with a zeroed
//! region. Each ring carries a session number (this incarnation and a
//! generation), published in the sender's `ring_session` column; slots
//! carry it in their flags, acks carry it in their high word.
//!
//! # Invariants
//! - A new session zeroes the ring's counter at the receiver *before* its
//!   number reaches it (the counter write is pushed first), so a receiver
//!   that sees the new session sees no old counter; a stamped ring's slots
//!   are zeroed the same way, so no older session's stamp is left to pass
//!   for a new message (indices restart at 0).
//! - A receiver consumes only slots of the session it follows, and follows
//!   a new session from an empty ring, dropping anything half-staged.
//! - Nothing is planned on a ring in the poll that reset it (`quiet`).

use super::Engine;
use super::wire::{Wire, parse, recycle_wire};
use super::{Effects, Push, Role, Stream, Target};
use ordo_ring::RingReceiver;

/// Largest write zeroing a stamped ring at a session reset (whole slots).
const ZERO_WRITE_MAX: usize = 64 << 10;

impl Engine {
    /// Starts the ring sessions asked for: a fresh ring whose counter is
    /// zeroed at the receiver *before* the new session number reaches it
    /// (so a receiver that sees the new session sees no old counter).
    /// A stamped ring (`Layout::ring.stamped`) is also zeroed at the
    /// receiver, in the same way.
    pub(super) fn reset_links(&mut self, fx: &mut Effects) -> usize {
        let mut work = 0;
        for row in 0..self.out.len() {
            let Some(link) = self.out[row].as_mut() else { continue };
            link.quiet = false;
            if !link.reset_pending {
                continue;
            }
            link.reset_pending = false;
            link.quiet = true;
            link.generation += 1;
            link.session = ((self.cfg.incarnation as u32 & 0x7FFF) << 16) | (link.generation & 0xFFFF);
            assert_ne!(link.session, 0, "session 0 means no ring (incarnations start at 1)");
            let ring = self.layout.ring_offset(self.my_row, row);
            let (producer, send) = ordo_ring::sender(self.region.clone(), ring, self.layout.ring);
            link.producer = producer;
            link.send = send;
            self.region.store_release(ring, 0);
            let (session, peer) = (link.session, link.peer);
            self.store(self.layout.columns.ring_session, row, u64::from(session));
            fx.pushes.push(Push { to: Target::Peer(peer), offset: ring, len: 8 });
            if self.layout.ring.stamped {
                // Indices restart at 0: the receiver's copy must hold no
                // stamp of an older session (a stale trailer could pass for
                // a new message's), so the whole ring goes out zeroed, ahead
                // of the row that announces the session (`ordo_ring`,
                // "Stamped rings"). In writes of whole slots, at most
                // 64 KiB each (or one slot): within any fabric's write
                // limit that carries the ring's messages.
                let slot = self.layout.ring.slot_size();
                let per_write = (ZERO_WRITE_MAX / slot).max(1);
                let slots = ring + ordo_ring::RING_HEADER_LEN;
                self.region.write_bytes(slots, &vec![0; self.layout.ring.window * slot]);
                for first in (0..self.layout.ring.window).step_by(per_write) {
                    let n = per_write.min(self.layout.ring.window - first);
                    fx.pushes.push(Push {
                        to: Target::Peer(peer),
                        offset: slots + first * slot,
                        len: n * slot,
                    });
                }
            }
            fx.pushes.push(self.row_push(Target::Peer(peer)));
            let stream = if self.role == Role::Leader { self.diff_stream(row, false) } else { Stream::Idle };
            let request = self.load(row, self.layout.columns.diff_request, 0);
            let link = self.out[row].as_mut().expect("link");
            link.stream = stream;
            link.served_request = request;
            work += 1;
        }
        work
    }

    /// Follows the ring session the sender of row `s` publishes; returns it
    /// (0: the sender has not opened one to us yet).
    pub(super) fn sync_in_session(&mut self, s: usize) -> u32 {
        assert_ne!(s, self.my_row, "no ring from a member to itself");
        let session = self.load(s, self.layout.columns.ring_session, self.my_row) as u32;
        let link = self.inc[s].as_mut().expect("an incoming link for every other row");
        if session != link.session {
            link.session = session;
            link.rx = RingReceiver::new(
                self.region.clone(),
                self.layout.ring_offset(s, self.my_row),
                self.layout.ring,
            );
            link.clear_staging();
            self.store(self.layout.columns.ring_ack, s, u64::from(session) << 32);
            self.dirty_to[s] = true;
        }
        debug_assert_eq!(self.inc[s].as_ref().map(|l| l.session), Some(session));
        session
    }

    /// Scans the ring from row `s` once: parses the messages of `session`
    /// (into the reused buffer), consumes them and acknowledges them. `None`
    /// when there is nothing new.
    pub(super) fn scan_ring(&mut self, s: usize, session: u32) -> Option<Vec<Result<Wire, String>>> {
        assert_ne!(session, 0, "session 0 means no ring yet");
        let link = self.inc[s].as_mut().expect("an incoming link for every other row");
        self.metas.clear();
        // Errors here are the previous session's leftovers (a counter not
        // yet reset): wait for the new session's writes.
        if link.rx.scan(u64::MAX, &mut self.metas).is_err() {
            return None;
        }
        // Reused buffers: no allocation per message once warm.
        let mut msgs = std::mem::take(&mut self.msgs);
        msgs.clear();
        for meta in &self.metas {
            if meta.flags != session {
                break; // an older or newer session's slot: not ours yet
            }
            msgs.push(parse(link.rx.payload(meta), &mut self.pool));
        }
        // Parsed in place: a message counts only if its slot still holds it
        // (a new session may be zeroing or refilling the ring under us,
        // past the reuse rule). From the first one that changed on, none.
        if let Some(torn) = self.metas[..msgs.len()].iter().position(|meta| !link.rx.still_there(meta)) {
            for wire in msgs.drain(torn..).flatten() {
                recycle_wire(&mut self.pool, wire);
            }
        }
        link.rx.consume(msgs.len() as u64);
        if msgs.is_empty() {
            self.msgs = msgs;
            return None;
        }
        // The count's low 32 bits: the sender rebuilds the rest
        // (`broadcast::ack_consumed`).
        let consumed = link.rx.consumed();
        self.store(self.layout.columns.ring_ack, s, (u64::from(session) << 32) | (consumed & 0xFFFF_FFFF));
        self.dirty_to[s] = true;
        Some(msgs)
    }
}
