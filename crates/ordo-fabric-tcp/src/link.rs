//! Per-peer link state, shared by the caller's thread and the I/O thread.
//!
//! # Invariants
//! - Everything about one peer's link lives in one [`LinkState`] behind one
//!   mutex; no code holds two links' locks at once, so there is no lock
//!   order to get wrong. The I/O thread reads and applies incoming frames
//!   *without* the lock; it takes it only to record an ACK, queue an ACK or
//!   flush the outbound ring.
//! - A link has at most one connection, identified by its `generation`. Code
//!   that acts for a connection checks [`LinkState::is_current`] first, so a
//!   connection that was replaced or failed can never touch the link again.
//! - Writes are posted only while `status` is [`Status::Up`]; every one goes
//!   on the current connection's outbound ring, whole, in posting order.
//!   When the connection fails the ring is cleared: nothing posted to a dead
//!   connection is ever sent on a later one.
//! - Each signaled write is in `pending` until exactly one event is produced
//!   for it (`Completed` once `acked` reaches its sequence number, or
//!   `Failed`). Events of one peer are queued in `events` in the order they
//!   happened, and `pending` is in posting order, so per-peer completions
//!   are reported in posting order.
//! - Bounded: the ring has a fixed capacity, and `pending.len() +
//!   events.len()` is capped by the caller before each signaled post.

use crate::frame::{FrameHeader, HEADER_LEN};
use crate::ring::ByteRing;
use mio::net::TcpStream;
use ordo_fabric::{FabricEvent, FailureCause, MemberId, WriteTag};
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write as _};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Where a link stands, as the fabric's user sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Start-up: the first connection is not up yet (posts are not possible:
    /// `connect` returns only once every link is up).
    Connecting,
    /// Usable: posts go on the current connection.
    Up,
    /// Suspected (reported once). A connection to a new incarnation may
    /// already be standing by; [`ordo_fabric::Fabric::reconnect`] makes it `Up`.
    Suspected,
}

/// A signaled write waiting for its ACK.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    pub(crate) seq: u64,
    pub(crate) tag: WriteTag,
    pub(crate) deadline: Instant,
}

/// The state of the link to one peer (see the module invariants).
pub(crate) struct LinkState {
    pub(crate) status: Status,
    /// The current connection, shared with the I/O thread (which reads it).
    pub(crate) conn: Option<Arc<TcpStream>>,
    /// The connection's TLS session, when links use TLS (both threads use
    /// it under this lock; see [`crate::tls`]).
    pub(crate) tls: Option<Box<rustls::Connection>>,
    /// Identifies `conn`; bumped by the I/O thread for every new connection.
    pub(crate) generation: u64,
    /// The peer incarnation `conn` leads to.
    pub(crate) incarnation: u64,
    /// Frames queued for `conn` but not yet accepted by the socket.
    pub(crate) out: ByteRing,
    /// Sequence number of the next WRITE posted on `conn` (starts at 1).
    pub(crate) next_seq: u64,
    /// Highest WRITE sequence number the peer acknowledged on `conn`.
    pub(crate) acked: u64,
    /// An ACK that did not fit in `out`; sent as soon as there is room.
    pub(crate) ack_owed: Option<u64>,
    pub(crate) pending: VecDeque<Pending>,
    pub(crate) events: VecDeque<FabricEvent>,
    /// `reconnect` found no standby connection: the I/O thread should dial now.
    pub(crate) dial_requested: bool,
}

impl LinkState {
    pub(crate) fn new(ring_capacity: usize) -> LinkState {
        LinkState {
            status: Status::Connecting,
            conn: None,
            tls: None,
            generation: 0,
            incarnation: 0,
            out: ByteRing::with_capacity(ring_capacity),
            next_seq: 1,
            acked: 0,
            ack_owed: None,
            pending: VecDeque::new(),
            events: VecDeque::new(),
            dial_requested: false,
        }
    }

    /// Whether `generation` names the live connection of this link.
    pub(crate) fn is_current(&self, generation: u64) -> bool {
        self.conn.is_some() && self.generation == generation
    }

    /// Writes queued bytes to the socket until it would block or the ring is
    /// empty, topping up an owed ACK when room appears. `Err` means the
    /// connection is broken.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        let Some(conn) = self.conn.clone() else { return Ok(()) };
        loop {
            if let Some(seq) = self.ack_owed
                && self.out.free() >= HEADER_LEN
            {
                self.out.push(&FrameHeader::ack(seq).encode());
                self.ack_owed = None;
            }
            if let Some(tls) = self.tls.as_mut() {
                // Ciphertext left from an earlier flush goes first.
                crate::tls::push(tls, &conn)?;
                if self.out.is_empty() || tls.wants_write() {
                    return Ok(());
                }
                let (a, _) = self.out.slices();
                match crate::tls::write(tls, &conn, a)? {
                    0 => return Ok(()), // the session's buffer is full
                    n => self.out.consume(n),
                }
                continue;
            }
            if self.out.is_empty() {
                return Ok(());
            }
            let (a, b) = self.out.slices();
            match (&*conn).write_vectored(&[IoSlice::new(a), IoSlice::new(b)]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out.consume(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Queues an ACK of every WRITE up to `seq` (coalescing with an owed one).
    pub(crate) fn queue_ack(&mut self, seq: u64) {
        if self.out.free() >= HEADER_LEN && self.ack_owed.is_none() {
            self.out.push(&FrameHeader::ack(seq).encode());
        } else {
            self.ack_owed = Some(self.ack_owed.map_or(seq, |owed| owed.max(seq)));
        }
    }

    /// Closes the current connection (if any) and discards what was queued
    /// for it. The peer sees EOF; the I/O thread sees its socket close.
    pub(crate) fn drop_conn(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        self.tls = None;
        self.out.clear();
        self.ack_owed = None;
    }

    /// Takes the link down for `cause`: closes the connection, turns every
    /// pending signaled write into one event (`Completed` if it was acked,
    /// else `Failed`), and reports `Suspected` once. For `TimedOut`, writes
    /// whose own deadline had not passed at `now` fail with `LinkDown`.
    /// A link that is already suspected only loses its standby connection.
    pub(crate) fn fail(&mut self, peer: MemberId, cause: FailureCause, now: Instant) {
        self.drop_conn();
        if self.status == Status::Suspected {
            debug_assert!(self.pending.is_empty(), "no posts while suspected");
            return;
        }
        while let Some(p) = self.pending.pop_front() {
            let event = if p.seq <= self.acked {
                FabricEvent::Completed { peer, tag: p.tag }
            } else {
                let cause = if cause == FailureCause::TimedOut && p.deadline > now {
                    FailureCause::LinkDown
                } else {
                    cause
                };
                FabricEvent::Failed { peer, tag: p.tag, cause }
            };
            self.events.push_back(event);
        }
        self.events.push_back(FabricEvent::Suspected { peer, cause });
        self.status = Status::Suspected;
    }

    /// Makes `conn` (handshake done, to incarnation `incarnation`) the link's
    /// connection. A link that had a live connection loses it first (the
    /// peer came back before we saw the old stream close). Returns the new
    /// status: `Up` at start-up, else `Suspected` (standby until `reconnect`).
    pub(crate) fn install(
        &mut self,
        peer: MemberId,
        conn: Arc<TcpStream>,
        tls: Option<Box<rustls::Connection>>,
        generation: u64,
        incarnation: u64,
    ) -> Status {
        if self.status == Status::Up {
            self.fail(peer, FailureCause::ConnectionLost, Instant::now());
        }
        self.drop_conn();
        self.conn = Some(conn);
        self.tls = tls;
        self.generation = generation;
        self.incarnation = incarnation;
        self.next_seq = 1;
        self.acked = 0;
        if self.status == Status::Connecting {
            self.status = Status::Up;
        }
        self.status
    }

    /// Moves the events of completed writes (acked, in posting order) to `events`.
    pub(crate) fn complete_acked(&mut self, peer: MemberId) {
        while let Some(p) = self.pending.front() {
            if p.seq > self.acked {
                break;
            }
            self.events.push_back(FabricEvent::Completed { peer, tag: p.tag });
            self.pending.pop_front();
        }
    }
}

/// One peer's link: its identity and its shared state.
pub(crate) struct Link {
    pub(crate) id: MemberId,
    pub(crate) addr: SocketAddr,
    state: Mutex<LinkState>,
}

impl Link {
    pub(crate) fn new(id: MemberId, addr: SocketAddr, ring_capacity: usize) -> Link {
        Link { id, addr, state: Mutex::new(LinkState::new(ring_capacity)) }
    }

    /// Locks the link. A panic while it was held was a bug that has already
    /// been reported; the state is still consistent enough to shut down, so
    /// a poisoned lock is taken anyway.
    pub(crate) fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the fabric handle and its I/O thread share.
pub(crate) struct Shared {
    pub(crate) member: MemberId,
    /// One per peer, in increasing id order.
    pub(crate) links: Vec<Link>,
    /// Set by `Drop`; the I/O thread exits when it sees it.
    pub(crate) shutdown: AtomicBool,
    /// Wakes the I/O thread (shutdown, a dial request, a link failed by the caller).
    pub(crate) waker: mio::Waker,
    /// Notified whenever a connection is installed (start-up waits on it).
    pub(crate) installed: (Mutex<()>, Condvar),
}

impl Shared {
    pub(crate) fn wake_io(&self) {
        if let Err(e) = self.waker.wake() {
            tracing::warn!(member = self.member, error = %e, "could not wake the tcp fabric's I/O thread");
        }
    }
}
