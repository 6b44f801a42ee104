//! Per-sender slot rings in a fabric region: Derecho's small-message
//! multicast (SMC, spindle §II-C) and Acuerdo's ring buffers (acuerdo §3.2).
//!
//! A sender owns one ring of `window` fixed-size slots at the same offset in
//! every member's region. Application threads **acquire** a free slot without
//! locks, **build the message in place** (zero copy) and **commit** it. The
//! send path (the predicate thread) finds every committed message contiguous
//! after the last published one and pushes them in **one write** (two if the
//! range wraps around the ring), then pushes the ring's **counter** — the
//! guard — in a second write (spindle §III-A, send batching). A receiver
//! loads the counter of its local copy of the ring and finds every new
//! message in one scan (receive batching).
//!
//! # Ring layout (at `base`; every size a multiple of 64 bytes)
//! ```text
//! base + 0                 +---------------------------------------------+
//!                          | published: u64 (guard) | pad to 64           |
//! base + 64                +---------------------------------------------+
//!   slot 0                 | len: u32 | flags: u32 | index+1: u64        |  16-byte message header
//!                          | payload: max_payload bytes | trailer: u64  |
//!                          | pad to 64                                   |
//! base + 64 + slot_size    +---------------------------------------------+
//!   slot 1 ...             |                                             |
//! base + 64 + w*slot_size  +---------------------------------------------+
//! ```
//! Message `k` (counting from 0) lives in slot `k % window`; its header
//! carries `k + 1` so a receiver can verify it (and a zeroed slot is never
//! mistaken for message 0). The word right after the payload (at
//! `payload + len` rounded up to 8) is the message's **trailer stamp**,
//! `(k + 1) · C` for a fixed odd `C` ([`trailer_stamp`]); every slot has
//! room for it. Not `k + 1` itself: the trailer's position moves with the
//! length, so what it finds there before it lands may be an older
//! message's *payload* — often its last, zero-padded word, a small number
//! (found by the simulator with writes landing in two steps: a stale
//! payload word read `4` where message 3's trailer was awaited). `(k + 1)
//! · C` is a bijection that is never 0 and is small only for astronomically
//! large `k`; a stale payload word matches it by chance (2^-64).
//!
//! # Stamped rings: one write per batch
//! A [stamped](RingLayout::stamped) ring pushes no counter: where the
//! fabric makes the bytes of one write visible in ascending address order
//! (`ordo_fabric`'s capability 8, [`Fabric::address_ordered`]), a receiver
//! that loads message `k`'s trailer and finds `k + 1` sees the header and
//! payload below it, so the trailer *is* the guard and a batch is one data
//! write (two when it wraps) instead of data plus counter. The receiver
//! scans slots instead of reading a counter. This rests on two more rules:
//! - indices never restart in a ring whose slots hold older stamps: a ring
//!   starts zeroed, and an engine that restarts a ring's indices (Acuerdo's
//!   ring sessions) zeroes the receiver's copy first (FIFO puts that write
//!   before the new session's data), so a stale trailer never equals the
//!   stamp a receiver waits for;
//! - a receiver that reads the sender's own mapping (zero-copy) reads the
//!   counter, which the sender still stores locally
//!   ([`RingReceiver::reading_counter`]).
//!
//! # Invariants
//! - **Publish rule.** Slot bytes are pushed before the counter that covers
//!   them; with the fabric's FIFO a receiver that sees `published = p`
//!   (Acquire) sees messages `0..p` complete.
//! - **Reuse rule, supplied by the engine.** The sender reuses the slot of
//!   message `k` only after the engine declared `k + 1` messages
//!   reclaimable ([`SendPath::set_reclaimable`]): vsync after every member
//!   delivered it, Acuerdo after the receiver accepted it. Until then
//!   [`SlotProducer::try_acquire`] reports back-pressure.
//! - **Order.** Messages are published in index order; a committed message
//!   waits for every earlier reservation to commit, so a single-threaded
//!   application's messages keep its order.
//! - **Lying peers.** A receiver validates every header it reads (index and
//!   length); a bad one is a [`RingError`], and the receiver's state does
//!   not move.

#![warn(missing_docs)]

use ordo_fabric::{Fabric, MemberId, PostError, Region, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the message header at the start of each slot. The payload
/// follows it on the same cache line: a message of up to 40 bytes, header
/// and trailer stamp included, is one line to pull across cores (it was
/// two with a 64-byte header).
pub const MESSAGE_HEADER_LEN: usize = 16;
/// Bytes of the ring header (the published counter, on its own line).
pub const RING_HEADER_LEN: usize = 64;

// Payloads stay 8-aligned (samples of alignment ≤ 8 are built in place),
// slots and the ring header 64-aligned.
const _: () = assert!(MESSAGE_HEADER_LEN.is_multiple_of(8) && RING_HEADER_LEN.is_multiple_of(64));

/// Bytes of the trailer stamp after a message's payload.
pub const TRAILER_LEN: usize = 8;

/// The trailer stamp of message `index`: `(index + 1) · C`, `C` odd (a
/// bijection, never 0; see the crate docs for why not `index + 1`).
pub fn trailer_stamp(index: u64) -> u64 {
    index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Geometry of one ring; identical for every sender of a ring set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Number of slots (`w`, the window).
    pub window: usize,
    /// Largest payload a slot holds.
    pub max_payload: usize,
    /// No counter write: slots' trailer stamps are the guard (see the
    /// crate docs, "Stamped rings"). Only where the fabric is
    /// address-ordered; every member of a ring set must agree.
    pub stamped: bool,
}

impl RingLayout {
    /// A counter-guarded layout; `window ≥ 1`, `max_payload ≥ 1`.
    pub fn new(window: usize, max_payload: usize) -> RingLayout {
        assert!(window >= 1 && max_payload >= 1, "a ring needs slots and payload space");
        RingLayout { window, max_payload, stamped: false }
    }

    /// The same geometry, stamped or counter-guarded (the slot size does not
    /// change: every slot has room for its trailer).
    pub fn with_stamps(self, stamped: bool) -> RingLayout {
        RingLayout { stamped, ..self }
    }

    /// Bytes per slot (header + payload + trailer, a multiple of 64).
    pub fn slot_size(&self) -> usize {
        (MESSAGE_HEADER_LEN + self.max_payload.next_multiple_of(8) + TRAILER_LEN).next_multiple_of(64)
    }

    /// Offset of the trailer of a message of `len` bytes, from its payload.
    fn trailer(len: usize) -> usize {
        len.next_multiple_of(8)
    }

    /// Bytes per ring.
    pub fn ring_len(&self) -> usize {
        RING_HEADER_LEN + self.window * self.slot_size()
    }

    /// Bytes for `senders` rings placed one after another.
    pub fn set_len(&self, senders: usize) -> usize {
        self.ring_len() * senders
    }

    /// Offset of ring `i` of a set at `base`.
    pub fn ring_offset(&self, base: usize, i: usize) -> usize {
        base + i * self.ring_len()
    }

    fn slot_offset(&self, ring: usize, index: u64) -> usize {
        ring + RING_HEADER_LEN + (index % self.window as u64) as usize * self.slot_size()
    }
}

/// Bad data found in a ring (a peer wrote something it must not have).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The header of message `index` does not carry its index.
    #[error("message {index}: slot holds index {found}")]
    WrongIndex {
        /// The message expected in the slot.
        index: u64,
        /// The index the slot's header carries.
        found: u64,
    },
    /// The header of message `index` claims a payload longer than a slot.
    #[error("message {index}: length {len} exceeds the slot payload of {max}")]
    BadLength {
        /// The message.
        index: u64,
        /// The length its header claims, in bytes.
        len: usize,
        /// The slot's payload capacity, in bytes.
        max: usize,
    },
    /// The counter went below what was already consumed.
    #[error("counter went back to {published} after {consumed} were consumed")]
    CounterWentBack {
        /// The counter as read.
        published: u64,
        /// Messages this receiver already consumed.
        consumed: u64,
    },
    /// The counter claims more messages than the window can hold unread.
    #[error("counter claims {published} messages, {consumed} consumed, window {window}")]
    CounterTooFar {
        /// The counter as read.
        published: u64,
        /// Messages this receiver already consumed.
        consumed: u64,
        /// Slots in the ring.
        window: usize,
    },
}

/// A committed message's header fields plus its payload location.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageMeta {
    /// Index of the message in its sender's sequence (from 0).
    pub index: u64,
    /// Engine-defined flags (e.g. a null message).
    pub flags: u32,
    /// Payload length.
    pub len: usize,
    /// Region offset of the payload.
    pub payload_offset: usize,
}

struct Shared {
    region: Region,
    ring: usize,
    layout: RingLayout,
    /// Next index to hand out to a producer.
    reserved: AtomicU64,
    /// Messages the engine allows to be overwritten (reuse rule).
    reclaimable: AtomicU64,
    /// `ready[k % window] == k + 1` once message `k` is committed.
    ready: Box<[AtomicU64]>,
    /// Rung after each commit so a parked send path wakes at once.
    bell: std::sync::OnceLock<ordo_fabric::Doorbell>,
}

/// Creates the sender side of the ring at `ring_offset` (this member's own
/// ring): a producer handle for application threads and the send path for
/// the predicate thread.
pub fn sender(region: Region, ring_offset: usize, layout: RingLayout) -> (SlotProducer, SendPath) {
    assert!(ring_offset.is_multiple_of(64), "rings are cache-line aligned");
    assert!(ring_offset + layout.ring_len() <= region.len(), "ring does not fit in the region");
    let shared = Arc::new(Shared {
        region,
        ring: ring_offset,
        layout,
        reserved: AtomicU64::new(0),
        reclaimable: AtomicU64::new(0),
        ready: (0..layout.window).map(|_| AtomicU64::new(0)).collect(),
        bell: std::sync::OnceLock::new(),
    });
    (SlotProducer { shared: shared.clone() }, SendPath { shared, published: 0, pushed_bytes: 0, pushes: 0 })
}

/// Application-side handle: acquires slots and commits messages. Cheap to
/// clone; usable from many threads at once (lock-free).
#[derive(Clone)]
pub struct SlotProducer {
    shared: Arc<Shared>,
}

/// A reserved slot being filled in place. Commit it, or it stalls the ring
/// (every later message waits for it): dropping it commits an empty message
/// with flag [`SlotGuard::ABANDONED`].
pub struct SlotGuard<'a> {
    shared: &'a Shared,
    index: u64,
    committed: bool,
}

impl SlotProducer {
    /// Reserves the next slot, or `None` if every slot holds a message that
    /// is not reclaimable yet (back-pressure).
    pub fn try_acquire(&self) -> Option<SlotGuard<'_>> {
        let s = &*self.shared;
        let mut r = s.reserved.load(Ordering::Relaxed);
        loop {
            // `r` may be stale (loaded before others reserved and the engine
            // reclaimed past it): then the CAS below fails and reloads it.
            if r.saturating_sub(s.reclaimable.load(Ordering::Acquire)) >= s.layout.window as u64 {
                return None;
            }
            match s.reserved.compare_exchange_weak(r, r + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(SlotGuard { shared: s, index: r, committed: false }),
                Err(now) => r = now,
            }
        }
    }

    /// Largest payload.
    pub fn max_payload(&self) -> usize {
        self.shared.layout.max_payload
    }

    /// Whether every slot holds a message that is not reclaimable yet: the
    /// next [`try_acquire`](Self::try_acquire) fails unless more is
    /// declared reclaimable first.
    pub fn is_full(&self) -> bool {
        let s = &*self.shared;
        s.reserved.load(Ordering::Acquire).saturating_sub(s.reclaimable.load(Ordering::Acquire))
            >= s.layout.window as u64
    }

    /// Rings `bell` after every commit from now on (the doorbell the send
    /// path's thread parks on), so a message committed while the predicate
    /// thread is parked is sent at once rather than at its next timeout.
    /// Set once; later calls are ignored.
    pub fn ring_on_commit(&self, bell: ordo_fabric::Doorbell) {
        let _ = self.shared.bell.set(bell);
    }

    /// Messages reserved so far.
    pub fn reserved(&self) -> u64 {
        self.shared.reserved.load(Ordering::Acquire)
    }
}

impl SlotGuard<'_> {
    /// Flag set on a message whose guard was dropped without commit.
    pub const ABANDONED: u32 = 1 << 31;

    /// The message index.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The payload area to build the message in (`max_payload` bytes).
    pub fn payload(&mut self) -> &mut [u8] {
        let s = self.shared;
        let off = s.layout.slot_offset(s.ring, self.index) + MESSAGE_HEADER_LEN;
        // SAFETY: the reservation makes this slot exclusively ours until
        // commit: no producer holds the same index, the send path reads it
        // only after commit, and the reuse rule keeps the old message's
        // readers done with it (reclaimable > index - window).
        unsafe { s.region.slice_mut(off, s.layout.max_payload) }
    }

    /// Publishes the first `len` bytes of the payload with `flags`.
    pub fn commit(mut self, len: usize, flags: u32) {
        self.finish(len, flags);
    }

    fn finish(&mut self, len: usize, flags: u32) {
        let s = self.shared;
        assert!(len <= s.layout.max_payload, "message of {len} bytes exceeds {}", s.layout.max_payload);
        let hdr = s.layout.slot_offset(s.ring, self.index);
        s.region.atomic_u64(hdr).store(len as u64 | (u64::from(flags) << 32), Ordering::Relaxed);
        // index + 1, so a zeroed (never written) slot never passes as a message.
        s.region.atomic_u64(hdr + 8).store(self.index + 1, Ordering::Relaxed);
        // The trailer stamp: last word of the message, above its payload.
        let trailer = hdr + MESSAGE_HEADER_LEN + RingLayout::trailer(len);
        s.region.atomic_u64(trailer).store(trailer_stamp(self.index), Ordering::Relaxed);
        s.ready[(self.index % s.layout.window as u64) as usize].store(self.index + 1, Ordering::Release);
        self.committed = true;
        if let Some(bell) = s.bell.get() {
            bell.ring();
        }
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.finish(0, Self::ABANDONED);
        }
    }
}

/// The writes one push consists of, in the order they must be posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushPlan {
    /// Slot ranges (offset, len): one, or two when the batch wraps.
    pub data: [Option<(usize, usize)>; 2],
    /// The counter write (offset, len), posted after the data; none in a
    /// stamped ring (the slots' trailers are the guard).
    pub guard: Option<(usize, usize)>,
    /// Messages covered: `first..end`.
    pub first: u64,
    /// One past the last message covered.
    pub end: u64,
}

impl PushPlan {
    /// The writes in posting order.
    pub fn writes(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.data.iter().flatten().copied().chain(self.guard)
    }

    /// Number of messages in the batch.
    pub fn messages(&self) -> u64 {
        self.end - self.first
    }
}

/// The predicate thread's side of a sender's ring.
pub struct SendPath {
    shared: Arc<Shared>,
    published: u64,
    pushed_bytes: u64,
    pushes: u64,
}

impl SendPath {
    /// Messages published (covered by a pushed counter).
    pub fn published(&self) -> u64 {
        self.published
    }

    /// Number of committed messages not yet published (the send predicate).
    pub fn ready(&self) -> u64 {
        let s = &*self.shared;
        let mut k = self.published;
        let reserved = s.reserved.load(Ordering::Acquire);
        while k < reserved && s.ready[(k % s.layout.window as u64) as usize].load(Ordering::Acquire) == k + 1
        {
            k += 1;
        }
        k - self.published
    }

    /// The engine's reuse rule: messages `0..count` may be overwritten.
    pub fn set_reclaimable(&self, count: u64) {
        let s = &*self.shared;
        assert!(count <= self.published, "cannot reclaim unpublished message {count}");
        // Monotonic: a smaller count than already declared changes nothing.
        s.reclaimable.fetch_max(count, Ordering::AcqRel);
    }

    /// Messages the engine has declared reclaimable.
    pub fn reclaimable(&self) -> u64 {
        self.shared.reclaimable.load(Ordering::Acquire)
    }

    /// Plans the push of every committed message after the last published
    /// one (at most `limit`), marks them published, and returns the writes;
    /// `None` if nothing is ready. With batching off the caller passes
    /// `limit = 1`.
    ///
    /// Contract: the caller posts every write of the plan, in order, to
    /// every peer, before posting any later plan's writes to that peer
    /// (retrying on back-pressure, never dropping). Otherwise a peer could
    /// see a counter covering slots it never received.
    pub fn plan(&mut self, limit: u64) -> Option<PushPlan> {
        let mut n = self.ready().min(limit);
        if n == 0 {
            return None;
        }
        if n > 1 && ordo_fault::fault!("ring.send.partial_batch") {
            n = n.div_ceil(2);
        }
        let s = &*self.shared;
        let (w, first) = (s.layout.window as u64, self.published);
        let end = first + n;
        let slot = s.layout.slot_size();
        let start_slot = (first % w) as usize;
        let first_run = n.min(w - first % w) as usize;
        // The last message of a run ends at its payload, or, stamped, at
        // its trailer.
        let last_len = |k: u64| {
            let hdr = s.layout.slot_offset(s.ring, k);
            let len = (s.region.atomic_u64(hdr).load(Ordering::Relaxed) & 0xFFFF_FFFF) as usize;
            let len = len.min(s.layout.max_payload);
            if s.layout.stamped {
                MESSAGE_HEADER_LEN + RingLayout::trailer(len) + TRAILER_LEN
            } else {
                MESSAGE_HEADER_LEN + len
            }
        };
        let base = s.ring + RING_HEADER_LEN;
        let mut data = [None, None];
        let run_len = |count: usize, last: u64| (count - 1) * slot + last_len(last);
        data[0] = Some((base + start_slot * slot, run_len(first_run, first + first_run as u64 - 1)));
        if (first_run as u64) < n {
            data[1] = Some((base, run_len((n as usize) - first_run, end - 1)));
        }
        self.published = end;
        // Stored even in a stamped ring: zero-copy receivers read it here.
        s.region.store_release(s.ring, end);
        self.pushes += 1;
        self.pushed_bytes += data.iter().flatten().map(|d| d.1 as u64).sum::<u64>();
        let guard = (!s.layout.stamped).then_some((s.ring, 8));
        Some(PushPlan { data, guard, first, end })
    }

    /// Posts a plan's writes to each of `peers` (data first, then counter).
    /// Suspected peers are skipped. Returns the number of writes posted.
    ///
    /// On an error (e.g. back-pressure) some peers may have the batch and
    /// others not: post the same plan again. Re-posting is harmless — the
    /// slots hold the same bytes and the counter the same value — and keeps
    /// every peer's FIFO order (data before counter).
    pub fn post<F: Fabric>(plan: &PushPlan, fabric: &mut F, peers: &[MemberId]) -> Result<usize, PostError> {
        let mut posted = 0;
        for &peer in peers {
            for (offset, len) in plan.writes() {
                match fabric.post_write(Write::new(peer, offset, len)) {
                    Ok(()) => posted += 1,
                    Err(PostError::PeerSuspected(_)) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(posted)
    }

    /// (pushes planned, payload+header bytes pushed) so far.
    pub fn stats(&self) -> (u64, u64) {
        (self.pushes, self.pushed_bytes)
    }
}

/// A receiver's view of one sender's ring: its local copy, which the
/// sender's pushes update, or — zero-copy on one host — the sender's own
/// ring in the sender's region (nothing pushed; see `ordo_fabric`'s
/// guarantee 8).
pub struct RingReceiver {
    region: Region,
    ring: usize,
    layout: RingLayout,
    consumed: u64,
    /// End of the last validated scan: what `consume` may reach.
    scanned: u64,
    /// Scan slot stamps rather than read the counter.
    by_stamps: bool,
}

impl RingReceiver {
    /// The receiver for the ring at `ring_offset`.
    pub fn new(region: Region, ring_offset: usize, layout: RingLayout) -> RingReceiver {
        assert!(ring_offset + layout.ring_len() <= region.len(), "ring does not fit in the region");
        RingReceiver { region, ring: ring_offset, layout, consumed: 0, scanned: 0, by_stamps: layout.stamped }
    }

    /// Reads the counter even in a stamped ring: for a receiver reading the
    /// sender's own mapping (zero-copy), where the sender stores its
    /// counter after the slots it covers and the trailers are not guards
    /// (they are plain stores of the producing thread).
    pub fn reading_counter(mut self) -> RingReceiver {
        self.by_stamps = false;
        self
    }

    /// Messages consumed so far.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The region the ring is read in (payload offsets of its metadata
    /// are offsets of this region).
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The sender's published counter as seen locally (Acquire); in a
    /// stamped ring read by stamps, the end of the last scan.
    pub fn published(&self) -> u64 {
        if self.by_stamps { self.scanned.max(self.consumed) } else { self.region.load_acquire(self.ring) }
    }

    /// Whether the next message looks present (one load, no validation): a
    /// cheap hint of whether a [`scan`](Self::scan) may find something. A
    /// stamped ring's next header carries its stamp; a counter ring's
    /// counter passed `consumed`. May say yes while the rest of the write is
    /// still on its way (the scan then finds nothing yet); says no only
    /// when the scan would find nothing.
    pub fn has_new(&self) -> bool {
        if self.by_stamps {
            let hdr = self.layout.slot_offset(self.ring, self.consumed);
            self.region.load_acquire(hdr + 8) == self.consumed.wrapping_add(1)
        } else {
            self.region.load_acquire(self.ring) != self.consumed
        }
    }

    /// Every new message, in one scan (the receive predicate): validates and
    /// appends the headers of messages `consumed..published` to `out` (up to
    /// `limit`) without consuming them. On a bad header nothing is appended
    /// beyond the last good message and the error is returned.
    pub fn scan(&mut self, limit: u64, out: &mut Vec<MessageMeta>) -> Result<u64, RingError> {
        if self.by_stamps {
            return self.scan_stamps(limit, out);
        }
        let published = self.published();
        if published < self.consumed {
            return Err(RingError::CounterWentBack { published, consumed: self.consumed });
        }
        if published - self.consumed > self.layout.window as u64 {
            return Err(RingError::CounterTooFar {
                published,
                consumed: self.consumed,
                window: self.layout.window,
            });
        }
        let end = published.min(self.consumed.saturating_add(limit));
        let mut n = 0;
        for k in self.consumed..end {
            out.push(self.meta(k)?);
            n += 1;
            self.scanned = self.scanned.max(k + 1);
        }
        Ok(n)
    }

    /// [`scan`](Self::scan) of a stamped ring: message `k` has arrived when
    /// its header carries `k + 1` and its trailer [`trailer_stamp`]`(k)`
    /// (the trailer last: by
    /// address order, header and payload are then visible). At most a
    /// window of messages past `consumed` (the slots beyond hold older
    /// ones). A header claiming an impossible length is an error; any other
    /// mismatch is a message not (yet) there.
    fn scan_stamps(&mut self, limit: u64, out: &mut Vec<MessageMeta>) -> Result<u64, RingError> {
        let end = self.consumed.saturating_add(limit.min(self.layout.window as u64));
        let mut n = 0;
        for k in self.consumed..end {
            let hdr = self.layout.slot_offset(self.ring, k);
            // The stamp first, then the length word below it: seeing the
            // new stamp, the load of the length sees the new length.
            if self.region.load_acquire(hdr + 8) != k.wrapping_add(1) {
                break;
            }
            let word = self.region.load_acquire(hdr);
            let len = (word & 0xFFFF_FFFF) as usize;
            if len > self.layout.max_payload {
                return Err(RingError::BadLength { index: k, len, max: self.layout.max_payload });
            }
            let payload_offset = hdr + MESSAGE_HEADER_LEN;
            if self.region.load_acquire(payload_offset + RingLayout::trailer(len)) != trailer_stamp(k) {
                break; // the header is here, the rest of the write is not
            }
            out.push(MessageMeta { index: k, flags: (word >> 32) as u32, len, payload_offset });
            n += 1;
            self.scanned = self.scanned.max(k + 1);
        }
        Ok(n)
    }

    /// The validated header of message `k` (which must be published).
    pub fn meta(&self, k: u64) -> Result<MessageMeta, RingError> {
        let hdr = self.layout.slot_offset(self.ring, k);
        let word = self.region.load_acquire(hdr);
        let stored = self.region.load_acquire(hdr + 8);
        if stored != k.wrapping_add(1) {
            return Err(RingError::WrongIndex { index: k, found: stored.wrapping_sub(1) });
        }
        let len = (word & 0xFFFF_FFFF) as usize;
        if len > self.layout.max_payload {
            return Err(RingError::BadLength { index: k, len, max: self.layout.max_payload });
        }
        Ok(MessageMeta {
            index: k,
            flags: (word >> 32) as u32,
            len,
            payload_offset: hdr + MESSAGE_HEADER_LEN,
        })
    }

    /// The payload of a scanned message, read in place.
    ///
    /// Valid while the sender cannot reuse the slot, which the engine's
    /// reuse rule must guarantee (it counts this receiver's consumption).
    pub fn payload(&self, meta: &MessageMeta) -> &[u8] {
        // SAFETY: in bounds (validated length); the reuse rule keeps the
        // sender from writing this slot until the engine releases it.
        unsafe { self.region.slice(meta.payload_offset, meta.len) }
    }

    /// Whether the slot of a scanned message still holds it, read after
    /// its payload was (an acquire fence orders those reads first): its
    /// header's two words (flags and length; index) are still the ones
    /// [`scan`](Self::scan) saw. A reader that copied or parsed the payload
    /// in place and then finds it still there read it whole, where writes
    /// land in address order (every stamped ring; a counter ring on such a
    /// fabric): a sender that overwrites the slot regardless of the reuse
    /// rule (a new ring session zeroing the ring, or writing its own first
    /// messages, with its own flags) writes the header, below the payload,
    /// before any payload byte.
    pub fn still_there(&self, meta: &MessageMeta) -> bool {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let hdr = meta.payload_offset - MESSAGE_HEADER_LEN;
        let word = (u64::from(meta.flags) << 32) | meta.len as u64;
        self.region.load_acquire(hdr + 8) == meta.index.wrapping_add(1)
            && self.region.load_acquire(hdr) == word
    }

    /// Marks `n` more messages consumed; they must have been returned by a
    /// [`scan`](Self::scan) (checked against what the scan validated, not
    /// against the peer's counter, which may have changed since).
    pub fn consume(&mut self, n: u64) {
        assert!(self.consumed + n <= self.scanned, "consuming messages no scan validated");
        self.consumed += n;
    }
}

#[cfg(test)]
mod tests;
