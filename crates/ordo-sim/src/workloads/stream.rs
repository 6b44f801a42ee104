//! Events and checkers shared by the stream workloads: every member streams
//! numbered messages to every peer, in sessions.
//!
//! # Model
//! - A **session** is one attempt of a sender to deliver messages `1..=T`
//!   to one receiver; a sender starts a new one at start-up and whenever it
//!   cannot continue the old one (after a reconnect or a reset). Session ids
//!   carry the sender's incarnation ([`session_id`]), so ids of later
//!   incarnations are larger.
//! - A receiver's deliveries are keyed by (receiver, receiver incarnation,
//!   sender, session): a restarted receiver is a new reader.
//!
//! # Properties checked
//! | checker | property |
//! |---|---|
//! | [`Integrity`] | every delivered message was sent, to this receiver, with exactly the bytes the sender built; no anomaly recorded |
//! | [`NoDuplication`] | no message delivered twice to one receiver incarnation |
//! | [`FifoNoGaps`] | per (receiver incarnation, sender, session) deliveries are exactly 1, 2, 3, ... |
//! | [`Liveness`] | at the end, every ordered pair's final incarnations completed a session of `T` messages |

use crate::history::{Checker, History, Violation, fnv64};
use crate::rng::splitmix64;
use ordo_fabric::MemberId;
use std::collections::{BTreeMap, BTreeSet};

/// What stream workloads record. Fields: `peer` is the other end of the
/// stream (the receiver for sender events, the sender for receiver events),
/// `session` a [`session_id`], `seq` the message number from 1.
#[allow(missing_docs)] // the fields are the same in every variant, described above
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StreamEvent {
    /// Sender: a new session to `peer` began.
    SessionStarted { peer: MemberId, session: u64 },
    /// Receiver: first saw `session` from `peer`.
    SessionOpened { peer: MemberId, session: u64 },
    /// Sender: message `seq` of `session` first sent to `peer`.
    Sent { peer: MemberId, session: u64, seq: u64 },
    /// Receiver: message `seq` of `session` from `peer` delivered, with the
    /// length and digest of the payload as read.
    Delivered { peer: MemberId, session: u64, seq: u64, len: u32, digest: u64 },
    /// Sender: `peer` acknowledged all `T` messages of `session`.
    StreamComplete { peer: MemberId, session: u64 },
    /// Something the protocol says cannot happen was observed.
    Anomaly { peer: MemberId, what: String },
}

/// Largest payload of a stream message.
pub const MAX_PAYLOAD: usize = 200;

/// The session id of the `counter`-th session of a sender's `incarnation`.
/// Panics past 4095 of either (24 bits in all, so it fits a fabric guard).
pub fn session_id(incarnation: u64, counter: u64) -> u64 {
    assert!(incarnation < 1 << 12 && counter < 1 << 12, "session id space exhausted");
    (incarnation << 12) | counter
}

/// The sender incarnation encoded in a session id.
pub fn session_incarnation(session: u64) -> u64 {
    session >> 12
}

/// The payload of message `seq` of `session` from `from` to `to`: its
/// length (1..=[`MAX_PAYLOAD`]) and bytes are a pure function of the four.
pub fn payload(from: MemberId, to: MemberId, session: u64, seq: u64, out: &mut Vec<u8>) {
    let mut state = (u64::from(from) << 56) ^ (u64::from(to) << 48) ^ (session << 24) ^ seq;
    let len = 1 + (splitmix64(&mut state) % MAX_PAYLOAD as u64) as usize;
    out.clear();
    while out.len() < len {
        let word = splitmix64(&mut state).to_le_bytes();
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&word[..take]);
    }
}

/// Digest of the expected payload (what [`Integrity`] compares with).
pub fn payload_digest(from: MemberId, to: MemberId, session: u64, seq: u64) -> u64 {
    let mut buf = Vec::with_capacity(MAX_PAYLOAD);
    payload(from, to, session, seq, &mut buf);
    fnv64(&buf)
}

/// Every delivered message was sent to this receiver and arrived intact;
/// no anomaly was recorded.
pub struct Integrity {
    /// The digest the payload of (from, to, session, seq) must have.
    pub expected: fn(MemberId, MemberId, u64, u64) -> u64,
}

impl Default for Integrity {
    fn default() -> Self {
        Integrity { expected: payload_digest }
    }
}

impl Checker<StreamEvent> for Integrity {
    fn name(&self) -> &'static str {
        "integrity"
    }

    fn check(&self, h: &History<StreamEvent>) -> Result<(), Violation> {
        let mut sent = BTreeSet::new();
        for e in &h.entries {
            match &e.event {
                StreamEvent::Sent { peer, session, seq } => {
                    sent.insert((e.member, *peer, *session, *seq));
                }
                StreamEvent::Delivered { peer, session, seq, len, digest } => {
                    if !sent.contains(&(*peer, e.member, *session, *seq)) {
                        return Err(Violation::new(
                            self.name(),
                            format!(
                                "m{} delivered message {seq} of session {session:#x} from m{peer} that was never sent (t={})",
                                e.member, e.time_ns
                            ),
                        ));
                    }
                    let want = (self.expected)(*peer, e.member, *session, *seq);
                    if *digest != want {
                        return Err(Violation::new(
                            self.name(),
                            format!(
                                "m{} delivered message {seq} of session {session:#x} from m{peer} with wrong content (len {len}, digest {digest:#x}, want {want:#x}, t={})",
                                e.member, e.time_ns
                            ),
                        ));
                    }
                }
                StreamEvent::Anomaly { peer, what } => {
                    return Err(Violation::new(
                        self.name(),
                        format!(
                            "m{} (incarnation {}) about m{peer}: {what} (t={})",
                            e.member, e.incarnation, e.time_ns
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// No receiver incarnation delivers a message twice.
pub struct NoDuplication;

impl Checker<StreamEvent> for NoDuplication {
    fn name(&self) -> &'static str {
        "no-duplication"
    }

    fn check(&self, h: &History<StreamEvent>) -> Result<(), Violation> {
        let mut seen = BTreeSet::new();
        for e in &h.entries {
            if let StreamEvent::Delivered { peer, session, seq, .. } = e.event
                && !seen.insert((e.member, e.incarnation, peer, session, seq))
            {
                return Err(Violation::new(
                    self.name(),
                    format!(
                        "m{} (incarnation {}) delivered message {seq} of session {session:#x} from m{peer} twice (t={})",
                        e.member, e.incarnation, e.time_ns
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Per (receiver incarnation, sender, session), deliveries are 1, 2, 3, ...
/// in order: FIFO with no gaps.
pub struct FifoNoGaps;

impl Checker<StreamEvent> for FifoNoGaps {
    fn name(&self) -> &'static str {
        "fifo-no-gaps"
    }

    fn check(&self, h: &History<StreamEvent>) -> Result<(), Violation> {
        let mut last: BTreeMap<(MemberId, u64, MemberId, u64), u64> = BTreeMap::new();
        for e in &h.entries {
            if let StreamEvent::Delivered { peer, session, seq, .. } = e.event {
                let prev = last.entry((e.member, e.incarnation, peer, session)).or_insert(0);
                if seq != *prev + 1 {
                    return Err(Violation::new(
                        self.name(),
                        format!(
                            "m{} (incarnation {}) delivered message {seq} of session {session:#x} from m{peer} after {} (t={})",
                            e.member, e.incarnation, *prev, e.time_ns
                        ),
                    ));
                }
                *prev = seq;
            }
        }
        Ok(())
    }
}

/// After the faults, every ordered pair of (final incarnations of) members
/// completed a session: the receiver delivered message `target` of a
/// session of the sender's final incarnation.
pub struct Liveness {
    /// Messages per session.
    pub target: u64,
}

impl Checker<StreamEvent> for Liveness {
    fn name(&self) -> &'static str {
        "liveness"
    }

    fn check(&self, h: &History<StreamEvent>) -> Result<(), Violation> {
        let mut complete = BTreeSet::new();
        for e in &h.entries {
            if let StreamEvent::Delivered { peer, session, seq, .. } = e.event
                && seq == self.target
            {
                complete.insert((e.member, e.incarnation, peer, session_incarnation(session)));
            }
        }
        for to in 0..h.members {
            if !h.alive_at_end(to) {
                return Err(Violation::new(self.name(), format!("m{to} was not alive at the end")));
            }
            let to_inc = h.final_incarnation(to);
            for from in (0..h.members).filter(|f| *f != to) {
                let from_inc = h.final_incarnation(from);
                if !complete.contains(&(to, to_inc, from, from_inc)) {
                    return Err(Violation::new(
                        self.name(),
                        format!(
                            "m{to} (incarnation {to_inc}) never received all {} messages of a session of m{from} (incarnation {from_inc}); run ended at {} ns",
                            self.target, h.end_ns
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The four stream checkers, safety first.
pub fn checkers(target: u64) -> Vec<Box<dyn Checker<StreamEvent>>> {
    vec![
        Box::new(Integrity::default()),
        Box::new(NoDuplication),
        Box::new(FifoNoGaps),
        Box::new(Liveness { target }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::FaultNote;

    fn delivered(from: MemberId, to: MemberId, session: u64, seq: u64) -> StreamEvent {
        let mut buf = Vec::new();
        payload(from, to, session, seq, &mut buf);
        StreamEvent::Delivered { peer: from, session, seq, len: buf.len() as u32, digest: fnv64(&buf) }
    }

    /// A good history: m0 streams 1..=3 of one session to m1 and back.
    fn good() -> History<StreamEvent> {
        let mut h = History::new(2);
        let s0 = session_id(1, 1);
        let s1 = session_id(1, 1);
        let mut t = 0;
        for seq in 1..=3 {
            t += 1;
            h.record(t, 0, 1, StreamEvent::Sent { peer: 1, session: s0, seq });
            h.record(t, 1, 1, StreamEvent::Sent { peer: 0, session: s1, seq });
        }
        for seq in 1..=3 {
            t += 1;
            h.record(t, 1, 1, delivered(0, 1, s0, seq));
            h.record(t, 0, 1, delivered(1, 0, s1, seq));
        }
        h
    }

    fn verdict(c: &dyn Checker<StreamEvent>, h: &History<StreamEvent>) -> Result<(), Violation> {
        c.check(h)
    }

    #[test]
    fn a_good_history_passes_every_checker() {
        let h = good();
        for c in checkers(3) {
            verdict(c.as_ref(), &h).unwrap();
        }
    }

    #[test]
    fn integrity_catches_corruption_unsent_messages_and_anomalies() {
        let mut h = good();
        if let StreamEvent::Delivered { digest, .. } = &mut h.entries[6].event {
            *digest ^= 1;
        }
        let v = Integrity::default().check(&h).unwrap_err();
        assert!(v.message.contains("wrong content"), "{v}");

        let mut h = good();
        h.record(100, 1, 1, delivered(0, 1, session_id(1, 1), 4));
        let v = Integrity::default().check(&h).unwrap_err();
        assert!(v.message.contains("never sent"), "{v}");

        // A message sent to m1 but delivered at m0 is not "sent to m0".
        let mut h = good();
        h.entries.retain(|e| !matches!(e.event, StreamEvent::Sent { peer: 0, .. }));
        assert!(Integrity::default().check(&h).is_err());

        let mut h = good();
        h.record(100, 0, 1, StreamEvent::Anomaly { peer: 1, what: "guard went back".into() });
        assert!(Integrity::default().check(&h).is_err());
    }

    #[test]
    fn no_duplication_catches_a_repeat_but_not_a_new_incarnation() {
        let mut h = good();
        h.record(100, 1, 1, delivered(0, 1, session_id(1, 1), 2));
        assert_eq!(NoDuplication.check(&h).unwrap_err().checker, "no-duplication");

        let mut h = good();
        h.note(50, FaultNote::Crash { member: 1 });
        h.note(60, FaultNote::Restart { member: 1, incarnation: 2 });
        h.record(100, 1, 2, delivered(0, 1, session_id(1, 1), 1));
        NoDuplication.check(&h).unwrap();
    }

    #[test]
    fn fifo_catches_gaps_and_reordering() {
        let mut h = good();
        let gap =
            h.entries.iter().position(|e| matches!(e.event, StreamEvent::Delivered { seq: 2, .. })).unwrap();
        h.entries.remove(gap);
        assert!(FifoNoGaps.check(&h).unwrap_err().message.contains("after 1"));

        let mut h = good();
        let a = h
            .entries
            .iter()
            .position(|e| e.member == 1 && matches!(e.event, StreamEvent::Delivered { seq: 2, .. }));
        let b = h
            .entries
            .iter()
            .position(|e| e.member == 1 && matches!(e.event, StreamEvent::Delivered { seq: 3, .. }));
        let (a, b) = (a.unwrap(), b.unwrap());
        let tmp = h.entries[a].event.clone();
        h.entries[a].event = h.entries[b].event.clone();
        h.entries[b].event = tmp;
        assert!(FifoNoGaps.check(&h).is_err());
    }

    #[test]
    fn liveness_requires_the_final_incarnations_to_finish() {
        assert!(Liveness { target: 4 }.check(&good()).is_err(), "target not reached");

        // m0 restarted: its old session does not count for the new incarnation.
        let mut h = good();
        h.note(50, FaultNote::Crash { member: 0 });
        h.note(60, FaultNote::Restart { member: 0, incarnation: 2 });
        let v = Liveness { target: 3 }.check(&h).unwrap_err();
        assert!(v.message.contains("incarnation 2"), "{v}");

        // A member that stays down fails liveness.
        let mut h = good();
        h.note(50, FaultNote::Crash { member: 1 });
        assert!(Liveness { target: 3 }.check(&h).unwrap_err().message.contains("not alive"));
    }
}
