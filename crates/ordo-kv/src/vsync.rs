//! `kv.engine = "vsync"`: ordo-kv's state machine over virtual synchrony —
//! one ordered subgroup of every replica (Derecho's atomic multicast with
//! Spindle's optimizations, `ordo node`'s [`Node`](ordo_runtime::node::Node)
//! with its view changes, joins and state transfer) — the third [`Engine`].
//!
//! There is no leader: every replica sends its own writes into the
//! subgroup and every replica applies the delivered total order.
//!
//! # Invariants
//! - **Order**: a replica's messages are delivered in the order it sent
//!   them, and all replicas deliver one total order (round-robin with null
//!   messages), so a connection's commands take effect in its order.
//! - **Replies where applied**: the replica that sent an entry answers its
//!   client when it delivers it (its results), as for the other engines.
//! - **Reads**: a read barrier is a message of this replica; `ReadReady`
//!   when it is delivered here. Every write acknowledged before the read was
//!   asked for was delivered (somewhere) before the barrier was sent, so
//!   its slot in the round-robin order precedes the barrier's: the table
//!   covers it (linearizable, no log).
//! - A view change delivers the ragged trim and resends what it cut; a
//!   replica removed from the view stops serving (its status is no longer
//!   running), and what it had in flight is unknown.
//! - A message that does not decode is skipped alike by every replica.

use crate::engine::{Engine, EngineEvent, EngineStatus};
use crate::state::Entry;
use ordo_fabric::MemberId;
use ordo_runtime::NodeStatus;
use ordo_runtime::acuerdo::SubmitError;
use ordo_runtime::node::ViewSender;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

const KIND_ENTRY: u8 = 1;
const KIND_BARRIER: u8 = 2;

/// A delivered message, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    /// An entry, and the sender's ticket for it.
    Entry {
        /// The sender's ticket.
        ticket: u64,
        /// The entry.
        entry: Entry,
    },
    /// A read barrier of `(origin, nonce)`.
    Barrier {
        /// The replica whose front end asked.
        origin: u32,
        /// Its incarnation nonce.
        nonce: u64,
        /// Its ticket.
        ticket: u64,
    },
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decodes a delivered payload (bounded by its bytes).
pub fn decode(b: &[u8]) -> Result<Message, &'static str> {
    match b.first() {
        Some(&KIND_ENTRY) if b.len() >= 9 => {
            Ok(Message::Entry { ticket: word(b, 1), entry: Entry::decode(&b[9..])? })
        }
        Some(&KIND_BARRIER) if b.len() == 21 => Ok(Message::Barrier {
            origin: u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")),
            nonce: word(b, 5),
            ticket: word(b, 13),
        }),
        _ => Err("not an ordo-kv message"),
    }
}

/// The front end's side of the vsync engine.
pub(crate) struct VsyncEngine {
    sender: ViewSender,
    events: Arc<Mutex<VecDeque<EngineEvent>>>,
    status: Box<dyn Fn() -> NodeStatus + Send>,
    me: MemberId,
    nonce: u64,
    next_ticket: u64,
    max_entry_bytes: usize,
    /// Whether the member is in a view, as last read (the node's status is
    /// a whole `NodeStatus`; the front end asks per command): re-read at
    /// most every millisecond.
    in_view: std::cell::Cell<Option<(std::time::Instant, bool)>>,
}

/// A member takes writes while it is in a view: running, or changing views
/// (its sends then wait for the new view).
fn in_view(st: &NodeStatus) -> bool {
    st.state == "running" || st.state == "changing"
}

impl VsyncEngine {
    pub(crate) fn new(
        sender: ViewSender,
        events: Arc<Mutex<VecDeque<EngineEvent>>>,
        status: Box<dyn Fn() -> NodeStatus + Send>,
        me: MemberId,
        nonce: u64,
        max_entry_bytes: usize,
    ) -> VsyncEngine {
        VsyncEngine {
            sender,
            events,
            status,
            me,
            nonce,
            next_ticket: 1,
            max_entry_bytes,
            in_view: std::cell::Cell::new(None),
        }
    }

    fn send(&mut self, len: usize, build: impl FnOnce(u64, &mut [u8])) -> Result<u64, SubmitError> {
        let ticket = self.next_ticket;
        // WouldBlock (window full) and Wedged (a view change): retry later;
        // what was not sent is certainly not applied.
        self.sender.try_send_with(len, |buf| build(ticket, buf)).map_err(|_| SubmitError::Full)?;
        self.next_ticket += 1;
        Ok(ticket)
    }
}

impl Engine for VsyncEngine {
    fn submit(&mut self, entry: &[u8]) -> Result<u64, SubmitError> {
        if entry.len() > self.max_entry_bytes {
            return Err(SubmitError::TooLarge { len: entry.len(), max: self.max_entry_bytes });
        }
        self.send(9 + entry.len(), |ticket, buf| {
            buf[0] = KIND_ENTRY;
            buf[1..9].copy_from_slice(&ticket.to_le_bytes());
            buf[9..].copy_from_slice(entry);
        })
    }

    fn read_barrier(&mut self) -> Result<u64, SubmitError> {
        let (me, nonce) = (self.me, self.nonce);
        self.send(21, |ticket, buf| {
            buf[0] = KIND_BARRIER;
            buf[1..5].copy_from_slice(&me.to_le_bytes());
            buf[5..13].copy_from_slice(&nonce.to_le_bytes());
            buf[13..21].copy_from_slice(&ticket.to_le_bytes());
        })
    }

    fn poll(&mut self) -> Option<EngineEvent> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }

    fn leadership(&self) -> (bool, Option<MemberId>) {
        // No leader: every member in the view takes writes itself.
        let now = std::time::Instant::now();
        let running = match self.in_view.get() {
            Some((at, v)) if now.duration_since(at) < std::time::Duration::from_millis(1) => v,
            _ => {
                let v = in_view(&(self.status)());
                self.in_view.set(Some((now, v)));
                v
            }
        };
        (running, running.then_some(self.me))
    }

    fn status(&self) -> EngineStatus {
        let st = (self.status)();
        let running = in_view(&st);
        EngineStatus {
            is_leader: running,
            leader: running.then_some(self.me),
            role: st.state.clone(),
            term: st.view,
            epoch: format!("view {}", st.view),
            committed: format!("delivered {}", st.subgroups.first().map_or(0, |s| s.delivered_messages)),
            delivered: st.subgroups.first().map_or(0, |s| s.delivered_messages),
            elections: st.view_changes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Write;

    #[test]
    fn messages_decode_and_garbage_is_refused() {
        let e = Entry {
            origin: 1,
            nonce: 2,
            request: 3,
            now_ms: 4,
            write: Write::Del { keys: vec![b"k".to_vec()] },
        };
        let mut b = vec![KIND_ENTRY];
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend_from_slice(&e.encode());
        assert_eq!(decode(&b).unwrap(), Message::Entry { ticket: 7, entry: e });
        let mut bar = vec![KIND_BARRIER];
        bar.extend_from_slice(&1u32.to_le_bytes());
        bar.extend_from_slice(&2u64.to_le_bytes());
        bar.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(decode(&bar).unwrap(), Message::Barrier { origin: 1, nonce: 2, ticket: 9 });
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).is_err(), "cut {cut}");
        }
        assert!(decode(&bar[..20]).is_err());
        assert!(decode(&[9, 0, 0]).is_err());
    }
}
