//! A fixed-capacity byte ring: the per-peer outbound queue.
//!
//! # Invariants
//! - The capacity is fixed when the ring is made; nothing here allocates
//!   afterwards, and pushing more than [`ByteRing::free`] bytes is a bug.
//! - Bytes leave in the order they were pushed (frames are never reordered
//!   or interleaved, since a frame is pushed whole under the link's lock).

use ordo_fabric::Region;
use std::sync::atomic::{AtomicU64, Ordering};

/// A bounded FIFO of bytes.
pub(crate) struct ByteRing {
    buf: Box<[u8]>,
    head: usize,
    len: usize,
}

impl ByteRing {
    /// A ring of `capacity` bytes (allocated now, never again).
    pub(crate) fn with_capacity(capacity: usize) -> ByteRing {
        assert!(capacity > 0, "a byte ring needs room");
        ByteRing { buf: vec![0u8; capacity].into_boxed_slice(), head: 0, len: 0 }
    }

    /// Bytes queued.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes that can still be pushed.
    pub(crate) fn free(&self) -> usize {
        self.buf.len() - self.len
    }

    /// Discards everything queued.
    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Appends `bytes`. Panics if they do not fit (callers check `free`).
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.push_with(bytes.len(), |segment, at| segment.copy_from_slice(&bytes[at..at + segment.len()]));
    }

    /// Appends `n` bytes produced by `fill(segment, position)`, which is
    /// called for one or two contiguous segments covering positions
    /// `0..n` of the appended bytes, in order.
    pub(crate) fn push_with(&mut self, n: usize, mut fill: impl FnMut(&mut [u8], usize)) {
        assert!(n <= self.free(), "byte ring overflow: {n} bytes, {} free", self.free());
        let capacity = self.buf.len();
        let tail = (self.head + self.len) % capacity;
        let first = n.min(capacity - tail);
        fill(&mut self.buf[tail..tail + first], 0);
        if first < n {
            fill(&mut self.buf[..n - first], first);
        }
        self.len += n;
    }

    /// The queued bytes as (up to) two slices, oldest first.
    pub(crate) fn slices(&self) -> (&[u8], &[u8]) {
        let first_end = (self.head + self.len).min(self.buf.len());
        let first = &self.buf[self.head..first_end];
        let second = &self.buf[..self.len - first.len()];
        (first, second)
    }

    /// Drops the oldest `n` bytes (they were sent).
    pub(crate) fn consume(&mut self, n: usize) {
        assert!(n <= self.len, "consumed {n} of {} queued bytes", self.len);
        self.head = (self.head + n) % self.buf.len();
        self.len -= n;
        if self.len == 0 {
            self.head = 0;
        }
    }
}

/// Copies `out.len()` bytes of `region` at `offset` into `out` so that every
/// 8-byte word that is 8-aligned in the region and lies wholly inside the
/// range is read with one atomic load: the snapshot a post takes never holds
/// half of a word that a concurrent writer (the receive thread applying a
/// peer's write) was storing. This is the read-side twin of
/// [`ordo_fabric::copy_untorn`], aligned on the *source*, which may be at any
/// position in `out`.
///
/// Panics if the range is outside the region (callers check it first).
pub(crate) fn read_untorn(region: &Region, offset: usize, out: &mut [u8]) {
    let len = out.len();
    assert!(offset.checked_add(len).is_some_and(|end| end <= region.len()), "snapshot outside the region");
    let base = region.as_ptr();
    let head = ((8 - offset % 8) % 8).min(len);
    let mut i = 0;
    // SAFETY (all three loops): `offset + i < region.len()` holds for every
    // access, so the pointer is inside the region's live memory; the region
    // base is 64-aligned, so `offset + i` 8-aligned means the address is too.
    while i < head {
        out[i] = unsafe { std::ptr::read_volatile(base.add(offset + i)) };
        i += 1;
    }
    while len - i >= 8 {
        let word = unsafe { (*(base.add(offset + i) as *const AtomicU64)).load(Ordering::Relaxed) };
        out[i..i + 8].copy_from_slice(&word.to_ne_bytes());
        i += 8;
    }
    while i < len {
        out[i] = unsafe { std::ptr::read_volatile(base.add(offset + i)) };
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_order_across_the_wrap() {
        let mut ring = ByteRing::with_capacity(10);
        ring.push(&[1, 2, 3, 4, 5, 6]);
        ring.consume(4);
        ring.push(&[7, 8, 9, 10, 11, 12]);
        assert_eq!(ring.len(), 8);
        assert_eq!(ring.free(), 2);
        let (a, b) = ring.slices();
        let all: Vec<u8> = a.iter().chain(b).copied().collect();
        assert_eq!(all, vec![5, 6, 7, 8, 9, 10, 11, 12]);
        ring.consume(8);
        assert!(ring.is_empty());
        assert_eq!(ring.slices(), (&[][..], &[][..]));
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn ring_refuses_to_grow() {
        let mut ring = ByteRing::with_capacity(4);
        ring.push(&[0; 5]);
    }

    #[test]
    fn read_untorn_copies_every_alignment() {
        let region = Region::new_heap(256);
        let data: Vec<u8> = (0..256u32).map(|i| (i * 13 + 1) as u8).collect();
        region.write_bytes(0, &data);
        for offset in 0..17 {
            for len in [0, 1, 7, 8, 9, 16, 33, 100] {
                let mut out = vec![0u8; len];
                read_untorn(&region, offset, &mut out);
                assert_eq!(out, &data[offset..offset + len]);
            }
        }
    }
}
