//! Broadcasting (acuerdo §3.2, Fig. 4) and the rings that carry it.
//!
//! ```text
//! 38 On: Broadcast payload pyld per client request
//! 39 Pre: Role == LEADER
//! 40 msghdr hdr = <E_new, ++Count>;
//! 41 outgoing_buff.send_to_all(new message<hdr,pyld>);
//! ```
//! Line 40 is [`Engine::broadcast`] (the leader also appends the message to
//! its own log and accepts it, §3.2: "including itself"). Line 41 is
//! [`Engine::send`]: where the paper has one outgoing buffer, ordo has one
//! ring per ordered pair ([`OutLink`]), so a slow or dead follower blocks
//! only its own ring and the leader's log holds what it has not received;
//! [`pump`] fills a ring from that follower's stream (a diff first, then
//! the epoch's messages), [`Engine::reclaim`] is the per-receiver reuse rule.
//!
//! # Invariants
//! - Headers of one epoch are `<E_cur, 1>, <E_cur, 2>, ...` without gaps,
//!   and at most `max_outstanding` of them are uncommitted.
//! - A stream sends log entries in header order, each once per ring
//!   session; the stream of a live follower never points below the log
//!   floor (see [`super::gc`]).
//! - At most one ring counter write (`plan()`) per ring per poll (or
//!   urgent step, [`Engine::poll_urgent`]), and none in the poll that reset
//!   the ring (`quiet`).
//! - A slot is reclaimed only up to what the receiver acknowledged in the
//!   current session, and never beyond what was published.

use super::snapshots::begin_snapshot_diff;
use super::wire::{KIND_DIFF_END, KIND_DIFF_ENTRY, KIND_NORMAL, KIND_SNAP_CHUNK, header_len};
use super::{BroadcastError, DeliverySink, Effects, Engine, OutLink, Push, Role, Snap, Stream, Target};
use crate::header::{Epoch, Header};
use std::ops::Bound;
use std::sync::Arc;

impl Engine {
    /// Client request (Fig. 4): at the leader, assigns the next header of
    /// the epoch, appends the message to the log and returns the header (the
    /// ticket [`Effects::committed`] reports once it is committed).
    pub fn broadcast(&mut self, payload: &[u8]) -> Result<Header, BroadcastError> {
        if payload.len() > self.cfg.max_payload {
            return Err(BroadcastError::TooLarge { len: payload.len(), max: self.cfg.max_payload });
        }
        match self.role {
            Role::Leader => {}
            Role::Follower => return Err(BroadcastError::NotLeader { leader: Some(self.e_cur.leader) }),
            Role::Electing => return Err(BroadcastError::NotLeader { leader: None }),
        }
        let done = if self.committed.epoch == self.e_cur { self.committed.count } else { 0 };
        if self.count - done >= self.cfg.max_outstanding || self.count >= self.cfg.epoch_messages {
            // A full epoch waits for its renewal (`abdication`).
            return Err(BroadcastError::WouldBlock);
        }
        assert_eq!(self.e_cur.leader, self.me, "a leader leads its own epoch");
        self.count += 1;
        let h = self.e_cur.header(self.count);
        assert!(h > self.accepted, "a new header is above everything the leader accepted");
        let mut body = self.pool.pop().unwrap_or_default();
        body.extend_from_slice(payload);
        self.log.insert(h, body);
        self.log_dirty(h);
        self.set_accepted(h);
        self.unsent = true;
        assert_eq!(self.accepted, h, "the leader accepts its own message (§3.2)");
        debug_assert!(self.count - done <= self.cfg.max_outstanding, "the outstanding window holds");
        Ok(h)
    }

    pub(super) fn send(&mut self, fx: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        let mut work = 0;
        // One snapshot per poll, shared by every diff that needs one.
        let mut taken: Option<Arc<[u8]>> = None;
        // Links are used in place (no move per poll); the log is read only.
        let (log, committed, accepted, e_cur) = (&self.log, self.committed, self.accepted, self.e_cur);
        let chunk = self.cfg.max_payload;
        assert!(chunk > 0, "max_payload is validated positive");
        // A ring that filled up leaves broadcasts behind: still unsent, so
        // the next urgent step refills the slots its acks free.
        let mut left = false;
        for link in self.out.iter_mut().flatten() {
            if !link.quiet {
                // State transfer (beyond the paper): see `snapshots`.
                begin_snapshot_diff(link, &mut taken, sink, committed, accepted, fx);
            }
            if !link.quiet {
                work += pump(log, e_cur, accepted, chunk, link);
                if let Some(plan) = link.send.plan(u64::MAX) {
                    for (offset, len) in plan.writes() {
                        fx.pushes.push(Push { to: Target::Peer(link.peer), offset, len });
                    }
                    work += 1;
                }
                left |= matches!(link.stream, Stream::Normal { after } if after < accepted);
            }
        }
        self.unsent = left;
        work
    }

    /// The reuse rule: a slot of the ring to `r` is free once `r`
    /// consumed its message in the same session (per receiver, so a dead
    /// follower blocks only its own ring; the leader's log holds what it
    /// has not received).
    pub(super) fn reclaim(&mut self) {
        for row in 0..self.out.len() {
            let Some(link) = self.out[row].as_ref() else { continue };
            if link.quiet || link.reset_pending {
                continue;
            }
            let ack = self.load(row, self.layout.columns.ring_ack, self.my_row);
            if (ack >> 32) as u32 == link.session {
                let consumed = ack_consumed(ack as u32, link.send.published());
                if consumed > link.send.reclaimable() {
                    link.send.set_reclaimable(consumed);
                }
                assert!(link.send.reclaimable() <= link.send.published(), "reclaim only what was published");
            }
        }
    }
}

/// The count a receiver's ack says it consumed: the ack holds its low 32
/// bits (the high word is the session), and the count lies within a window
/// below `published` (a sender publishes at most a window past what it
/// reclaimed, and it reclaims only acknowledged slots; acks only rise), so
/// the high bits are `published`'s, less one where the low bits wrapped.
/// Without this a ring stalled for good after 2^32 messages in one session.
pub(super) fn ack_consumed(low: u32, published: u64) -> u64 {
    let behind = u64::from((published as u32).wrapping_sub(low));
    // An ack cannot be ahead of what was published; one that looks so
    // (which the window rules out) reclaims nothing more than published.
    published.saturating_sub(behind)
}

/// Fills free slots of `link`'s ring from its stream (the leader's `log`,
/// epoch `e_cur`, whose last broadcast header is `accepted`).
pub(super) fn pump(
    log: &super::log::Log,
    e_cur: Epoch,
    accepted: Header,
    chunk: usize,
    link: &mut OutLink,
) -> usize {
    /// Where a message's body comes from.
    enum Body<'a> {
        Empty,
        Log(&'a [u8]),
        Snap(usize, usize),
    }
    let mut work = 0;
    loop {
        let (wire_words, body, next_stream) = match link.stream {
            Stream::Idle | Stream::Diff { snap: Snap::Pending, .. } => return work,
            Stream::Diff { serial, epoch, upto, after, sent, base, snap } => {
                let snap_len = link.snapshot.as_ref().map_or(0, |b| b.len());
                let chunks_total = snap_len.div_ceil(chunk).max(1) as u32;
                match snap {
                    Snap::Sending { chunks } if chunks < chunks_total => {
                        let from = chunks as usize * chunk;
                        let to = (from + chunk).min(snap_len);
                        let w0 = KIND_SNAP_CHUNK | (u64::from(serial) << 8);
                        let next = Stream::Diff {
                            serial,
                            epoch,
                            base,
                            upto,
                            after,
                            sent,
                            snap: Snap::Sending { chunks: chunks + 1 },
                        };
                        ([w0, base.encode(), from as u64, snap_len as u64], Body::Snap(from, to), next)
                    }
                    _ => match log.range((Bound::Excluded(after), Bound::Included(upto))).next() {
                        Some((h, body)) => {
                            let next =
                                Stream::Diff { serial, epoch, base, upto, after: *h, sent: sent + 1, snap };
                            (
                                [KIND_DIFF_ENTRY | (u64::from(serial) << 8), h.encode(), 0, 0],
                                Body::Log(body.as_slice()),
                                next,
                            )
                        }
                        None => {
                            let w0 = KIND_DIFF_END | (u64::from(serial) << 8) | (u64::from(sent) << 32);
                            let after = if upto.epoch == epoch { upto } else { epoch.header(0) };
                            (
                                [w0, epoch.header(0).encode(), base.encode(), upto.encode()],
                                Body::Empty,
                                Stream::Normal { after },
                            )
                        }
                    },
                }
            }
            // Nothing broadcast after `after` (the common case).
            Stream::Normal { after } if after >= accepted => return work,
            Stream::Normal { after } => {
                let next = log.first_after(after);
                match next {
                    Some((h, body)) if h.epoch == e_cur => (
                        [KIND_NORMAL, h.encode(), 0, 0],
                        Body::Log(body.as_slice()),
                        Stream::Normal { after: *h },
                    ),
                    _ => return work,
                }
            }
        };
        let Some(mut slot) = link.producer.try_acquire() else { return work };
        let buf = slot.payload();
        let header = header_len(wire_words[0] & 0xFF);
        for (i, w) in wire_words.iter().enumerate().take(header / 8) {
            buf[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        let body: &[u8] = match body {
            Body::Empty => &[],
            Body::Log(b) => b,
            Body::Snap(from, to) => &link.snapshot.as_ref().expect("a snapshot is being sent")[from..to],
        };
        assert!(header + body.len() <= buf.len(), "a message fits its slot (max_payload)");
        buf[header..header + body.len()].copy_from_slice(body);
        slot.commit(header + body.len(), link.session);
        work += 1;
        if matches!(next_stream, Stream::Normal { .. }) {
            link.snapshot = None;
        }
        debug_assert!(
            stream_after(next_stream) >= stream_after(link.stream),
            "a stream only moves forward: {:?} -> {next_stream:?}",
            link.stream
        );
        link.stream = next_stream;
    }
}

/// How far a stream got in the log (for the forward-only check).
fn stream_after(stream: Stream) -> Header {
    match stream {
        Stream::Idle => Header::NONE,
        Stream::Diff { after, .. } | Stream::Normal { after } => after,
    }
}

#[cfg(test)]
mod tests {
    use super::ack_consumed;
    use proptest::prelude::*;

    #[test]
    fn an_ack_past_two_to_the_32_messages_still_reclaims() {
        let wrap = 1u64 << 32;
        assert_eq!(ack_consumed(2, wrap + 5), wrap + 2, "consumed past the wrap");
        assert_eq!(ack_consumed(u32::MAX - 1, wrap + 5), wrap - 2, "consumed just below it");
        assert_eq!(ack_consumed(7, 7), 7);
        assert_eq!(ack_consumed(0, 0), 0);
        // An ack claiming more than was published reclaims nothing more.
        assert!(ack_consumed(9, 7) <= 7);
    }

    proptest! {
        /// Any count within a window (here up to 2^31) below what was
        /// published comes back whole from its low 32 bits.
        #[test]
        fn the_consumed_count_is_rebuilt_from_its_low_word(
            published in any::<u64>(), behind in 0u64..(1 << 31),
        ) {
            let consumed = published.saturating_sub(behind);
            prop_assert_eq!(ack_consumed(consumed as u32, published), consumed);
        }

        /// A lying ack never reclaims past what was published.
        #[test]
        fn no_ack_reclaims_past_what_was_published(low in any::<u32>(), published in any::<u64>()) {
            prop_assert!(ack_consumed(low, published) <= published);
        }
    }
}
