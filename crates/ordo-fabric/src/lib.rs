//! The fabric: one-sided, ordered writes between members' memory regions.
//!
//! Everything in ordo rests on this abstraction (DESIGN.md §2), the one RDMA
//! gives Derecho and Acuerdo (spindle §II-B): every member registers a
//! [`Region`] of the same length and layout; a member **posts a write** of a
//! byte range of its own region to the same range of a peer's region.
//!
//! # Guarantees every backend keeps (checked by [`conformance`])
//! 1. **FIFO per peer.** Writes posted to one peer become visible there in
//!    posting order. Nothing is promised about the order of bytes *within*
//!    one write.
//! 2. **No torn words.** Every 8-byte word that is 8-byte aligned in the
//!    region and lies wholly inside a write is stored with a single atomic
//!    store: a concurrent reader sees the old or the new value, never a mix.
//! 3. **Guarded publishing.** Because of 1, data is published by a *later*
//!    write of a guard (a counter): write the data, then write the counter.
//!    A reader that loads the guard with `Acquire` and sees the new value also
//!    sees the data. (A guard at the end of the *same* write is not safe:
//!    Derecho issue #47.)
//! 4. **Signaled writes complete exactly once.** A write posted with a
//!    [`WriteTag`] yields exactly one [`FabricEvent::Completed`] (the write is
//!    visible at the peer) or [`FabricEvent::Failed`].
//! 5. **Failures are suspicions.** A failed signaled write, a lost connection
//!    or a dead peer process raises [`FabricEvent::Suspected`] once; from then
//!    on the link is down: posts to that peer return
//!    [`PostError::PeerSuspected`], and nothing posted after the failure is
//!    applied (so a guard can never land without its data). Only
//!    [`Fabric::reconnect`] brings a link back — usually to a new
//!    incarnation, but on tcp possibly to the same process after a timeout:
//!    either way writes posted before the failure may be missing at the
//!    peer, so a caller treats a reconnected link as new and re-pushes what
//!    the peer needs.
//! 6. **Doorbell.** Where the backend can, a write landing rings the
//!    receiver's [`Doorbell`], so a poller parked on it wakes up.
//! 7. **Batches.** [`Fabric::post_writes`] posts several ranges to one peer
//!    as one batch: they keep guarantees 1-5 as if posted one by one, in
//!    order (a guard last in a batch still publishes the data before it),
//!    and cost the backend one publishing fence and one doorbell ring (shm),
//!    one send (tcp), one delivery delay (simulator). A batch that fails
//!    part-way posted exactly its first [`PartialPost::posted`] ranges.
//! 8. **Address order within a write** (a capability, not a guarantee):
//!    where [`Fabric::address_ordered`] says so, the bytes of one write
//!    become visible at the peer in ascending address order: a reader that
//!    loads a word of a write with `Acquire` and sees its new value also
//!    sees the new value of every word *below* it in that write. shm, tcp
//!    and loopback store with [`copy_untorn`], ascending, so on x86-64
//!    (TSO) they say yes; the simulator lands a write at once. RDMA does not
//!    promise it (Derecho issue #47), so a guard in the same write is only
//!    safe where this holds — what `ordo-ring`'s stamped rings (one write
//!    per batch, each slot carrying its own stamp) rest on. A backend that
//!    says yes also takes a write's bytes from the source region before the
//!    post returns (shm copies them, tcp into its send buffer, the
//!    simulator snapshots them): a stamp the source stores later can never
//!    land ahead of the write that carries the stamp's message.
//! 9. **Zero-copy on one host** (a capability, not a guarantee):
//!    [`Fabric::peer_region`] gives, where the backend can, a peer's *own*
//!    region as this member can read it (shm: the peer's file mapping; the
//!    simulator: the peer's region). What the peer stores there (with
//!    `Release`) a reader that loads with `Acquire` sees without any write
//!    being posted — so a ring's slots need not be copied to every
//!    receiver (Aeron IPC, Cyclone DDS with iceoryx). tcp has no such
//!    region. The handle stays readable after the peer dies (the mapping
//!    lives as long as the handle).
//!
//! # Memory model
//! Backends store with `copy_untorn` (atomic 8-byte stores and aligned
//! vector stores) and publish with Release fences, and readers load words
//! with Acquire. Vector stores and cross-process mappings lie outside the
//! Rust memory model; the guarantees above rest on the x86-64 (TSO) and
//! AArch64 hardware models, and are what the conformance suite checks.
//!
//! # What a backend may not do
//! Allocate or make a syscall per write on the shm data path; apply a frame
//! that lies outside the region; block forever on a dead peer.

#![warn(missing_docs)]

pub mod backlog;
pub mod conformance;
mod doorbell;
pub mod loopback;
mod region;

pub use doorbell::{Doorbell, DoorbellWords, ParkToken, asymmetric_barrier};
pub use region::{Region, copy_untorn};

use std::fmt;

/// A member's id within a group (stable across restarts of that member).
pub type MemberId = u32;

/// Caller-chosen identifier of a signaled write, echoed in its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WriteTag(pub u64);

/// One one-sided write: copy `len` bytes at `offset` of the local region to
/// the same offset of `peer`'s region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// Destination member.
    pub peer: MemberId,
    /// Byte offset in both regions.
    pub offset: usize,
    /// Number of bytes.
    pub len: usize,
    /// `Some` to request a completion event for this write.
    pub signal: Option<WriteTag>,
}

impl Write {
    /// An unsignaled write.
    pub fn new(peer: MemberId, offset: usize, len: usize) -> Self {
        Write { peer, offset, len, signal: None }
    }

    /// A signaled write: its completion or failure is reported with `tag`.
    pub fn signaled(peer: MemberId, offset: usize, len: usize, tag: WriteTag) -> Self {
        Write { peer, offset, len, signal: Some(tag) }
    }
}

/// Why a peer is suspected or a signaled write failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureCause {
    /// A signaled write did not complete within the configured timeout.
    TimedOut,
    /// The peer's process is gone (its liveness lock was released).
    PeerDead,
    /// The connection to the peer closed or errored.
    ConnectionLost,
    /// The peer sent a malformed frame; the connection was closed.
    BadFrame,
    /// The link failed (for another reason, e.g. an earlier write timed
    /// out) while this write was pending.
    LinkDown,
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            FailureCause::TimedOut => "completion timed out",
            FailureCause::PeerDead => "peer process is dead",
            FailureCause::ConnectionLost => "connection lost",
            FailureCause::BadFrame => "peer sent a malformed frame",
            FailureCause::LinkDown => "link is down",
        };
        f.write_str(s)
    }
}

/// Something the fabric reports through [`Fabric::poll_events`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricEvent {
    /// The signaled write `tag` to `peer` is visible in the peer's region.
    Completed {
        /// The peer the write was posted to.
        peer: MemberId,
        /// The tag the write was posted with.
        tag: WriteTag,
    },
    /// The signaled write `tag` to `peer` may not have been applied.
    Failed {
        /// The peer the write was posted to.
        peer: MemberId,
        /// The tag the write was posted with.
        tag: WriteTag,
        /// Why the write failed.
        cause: FailureCause,
    },
    /// `peer` is suspected of having failed; reported once per link failure.
    Suspected {
        /// The suspected peer; its link is down from now on.
        peer: MemberId,
        /// What made the fabric suspect it.
        cause: FailureCause,
    },
    /// The link to `peer` is up again, to incarnation `incarnation`.
    Reconnected {
        /// The peer whose link is back up.
        peer: MemberId,
        /// The peer's new incarnation the link now leads to.
        incarnation: u64,
    },
}

/// Why a write could not be posted. Posting never partially applies.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The destination is not a member of this fabric (or is the member itself).
    #[error("member {0} is not a peer of this fabric")]
    UnknownPeer(MemberId),
    /// The byte range does not lie inside the region.
    #[error("write [{offset}, {offset}+{len}) lies outside the region of {region_len} bytes")]
    OutOfBounds {
        /// Requested start of the write, in bytes from the region's start.
        offset: usize,
        /// Requested length of the write, in bytes.
        len: usize,
        /// Length of the region, in bytes.
        region_len: usize,
    },
    /// The write is larger than the backend accepts in one piece.
    #[error("write of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Requested length of the write, in bytes.
        len: usize,
        /// Largest write the backend accepts, in bytes.
        max: usize,
    },
    /// The link to the peer is down; see [`FabricEvent::Suspected`].
    #[error("peer {0} is suspected; its link is down")]
    PeerSuspected(MemberId),
    /// The send queue to the peer is full; poll and retry.
    #[error("send queue to peer {0} is full")]
    Backpressure(MemberId),
}

/// How far a [`Fabric::post_writes`] batch got before `error`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("batch stopped after {posted} write(s): {error}")]
pub struct PartialPost {
    /// Leading ranges of the batch that were posted.
    pub posted: usize,
    /// Why the next one was not.
    pub error: PostError,
}

/// Errors of [`Fabric::reconnect`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReconnectError {
    /// The peer is not a member of this fabric.
    #[error("member {0} is not a peer of this fabric")]
    UnknownPeer(MemberId),
    /// No live incarnation of the peer could be reached (yet).
    #[error("peer {0} is not reachable: {1}")]
    Unreachable(MemberId, String),
}

/// A member's endpoint on a fabric: its registered region and its links to
/// every peer. See the crate docs for the guarantees.
///
/// Implementations: `ordo-fabric-shm`, `ordo-fabric-tcp`, and the simulator's
/// fabric in `ordo-sim`. All pass [`conformance`].
pub trait Fabric {
    /// This member's id.
    fn member(&self) -> MemberId;

    /// Every other member of the group, in increasing id order.
    fn peers(&self) -> &[MemberId];

    /// This member's region. Peers' writes land here; the member writes its
    /// own data here before posting writes of it.
    fn region(&self) -> &Region;

    /// Posts a write. On `Ok` the write will become visible at the peer after
    /// every write posted to that peer before it (unless the link fails).
    /// On `Err` nothing was posted and no state changed.
    fn post_write(&mut self, write: Write) -> Result<(), PostError>;

    /// Posts the same range to several peers. Stops at the first error
    /// (writes to earlier peers in `peers` stay posted).
    fn post_write_to(&mut self, peers: &[MemberId], offset: usize, len: usize) -> Result<(), PostError> {
        for &peer in peers {
            self.post_write(Write::new(peer, offset, len))?;
        }
        Ok(())
    }

    /// Posts unsignaled writes of `ranges` (offset, length) to `peer` as one
    /// batch (guarantee 7): in order, each visible at the peer after the
    /// ones before it. `Ok` when all were posted; on `Err` exactly the first
    /// `posted` ranges were posted and the rest not (the caller retries
    /// from there). The default posts them one by one.
    fn post_writes(&mut self, peer: MemberId, ranges: &[(usize, usize)]) -> Result<(), PartialPost> {
        for (posted, &(offset, len)) in ranges.iter().enumerate() {
            self.post_write(Write::new(peer, offset, len)).map_err(|error| PartialPost { posted, error })?;
        }
        Ok(())
    }

    /// Whether the bytes of one write become visible at a peer in
    /// ascending address order, and are taken from the source region before
    /// the post returns (capability 8; default `false`: not promised).
    fn address_ordered(&self) -> bool {
        false
    }

    /// `peer`'s own region, readable here without a write being posted
    /// (capability 9), where the backend has it; `None` otherwise (the
    /// default), for an unknown peer, or for one whose link is down.
    fn peer_region(&self, peer: MemberId) -> Option<Region> {
        let _ = peer;
        None
    }

    /// Appends completions, failures and suspicions that happened since the
    /// last call to `events`. Also runs the backend's timeout checks.
    fn poll_events(&mut self, events: &mut Vec<FabricEvent>);

    /// The doorbell that peers' writes ring, if this backend has one.
    fn doorbell(&self) -> Option<&Doorbell>;

    /// Whether `peer` is currently suspected (its link is down).
    fn is_suspected(&self, peer: MemberId) -> bool;

    /// Tries to bring the link to a suspected `peer` back (see guarantee 5).
    /// `Ok(incarnation)` once the link is usable; the peer's region holds
    /// whatever its incarnation holds, possibly without writes posted before
    /// the failure. On a link that is not suspected it returns the current
    /// incarnation; on one that failed but is not yet suspected (the failure
    /// not yet detected) it returns `Unreachable`.
    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError>;
}

/// Checks a write's range against a region length (shared by backends).
pub fn check_range(offset: usize, len: usize, region_len: usize) -> Result<(), PostError> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(PostError::OutOfBounds { offset, len, region_len }),
    }
}
