//! A registered memory region and the untorn copy that writes into it.
//!
//! # Invariants
//! - A `Region` is a (pointer, length) pair whose memory stays mapped for as
//!   long as any clone of the `Region` lives (it holds its owner alive).
//! - The base address is 64-byte aligned, so cache-line-aligned offsets are
//!   cache-line-aligned addresses.
//! - Memory is shared with peers' writes (another process or a receive
//!   thread), so every access goes through atomics or through [`copy_untorn`]
//!   (word-atomic), except the `unsafe` slice accessors whose callers promise
//!   that no one writes the range meanwhile (the ring-slot ownership rule).

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, compiler_fence};

/// Alignment of every region's base address.
pub const REGION_ALIGN: usize = 64;

struct Inner {
    base: NonNull<u8>,
    len: usize,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the memory is only accessed through atomics or through unsafe
// accessors whose callers uphold exclusivity; the owner is Send + Sync.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

/// A member's registered memory region (cheap to clone; clones share memory).
#[derive(Clone)]
pub struct Region {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("base", &self.inner.base).field("len", &self.inner.len).finish()
    }
}

/// Heap memory for regions that are not file mappings (tcp, sim).
struct HeapBlock {
    words: Box<[AtomicU64]>,
}

impl Region {
    /// A zeroed region of `len` bytes on the heap (used by the tcp backend and
    /// the simulator). `len` is rounded up to a multiple of 64.
    pub fn new_heap(len: usize) -> Region {
        let words = len.div_ceil(REGION_ALIGN) * (REGION_ALIGN / 8) + REGION_ALIGN / 8;
        let block: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let raw = block.as_ptr() as usize;
        let aligned = raw.next_multiple_of(REGION_ALIGN);
        let owner = Arc::new(HeapBlock { words: block });
        let base = NonNull::new(aligned as *mut u8).expect("heap pointer is non-null");
        debug_assert!(aligned + len <= raw + owner.words.len() * 8);
        Region { inner: Arc::new(Inner { base, len, _owner: owner }) }
    }

    /// Wraps memory owned by `owner` (e.g. a file mapping).
    ///
    /// # Safety
    /// `base..base+len` must be valid, readable and writable memory for as
    /// long as `owner` lives, and `base` must be 64-byte aligned.
    pub unsafe fn from_raw(base: NonNull<u8>, len: usize, owner: Arc<dyn Any + Send + Sync>) -> Region {
        assert!((base.as_ptr() as usize).is_multiple_of(REGION_ALIGN), "region base must be 64-byte aligned");
        Region { inner: Arc::new(Inner { base, len, _owner: owner }) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Base address (for backends that copy between regions).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.base.as_ptr()
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.inner.len),
            "range [{offset}, +{len}) outside region of {} bytes",
            self.inner.len
        );
    }

    /// The 8-byte atomic at `offset` (must be 8-aligned and inside).
    #[inline]
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8);
        assert_eq!(offset % 8, 0, "u64 at unaligned offset {offset}");
        // SAFETY: in bounds, aligned, and the memory outlives `self`.
        unsafe { &*(self.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// The 4-byte atomic at `offset` (must be 4-aligned and inside).
    #[inline]
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        self.check(offset, 4);
        assert_eq!(offset % 4, 0, "u32 at unaligned offset {offset}");
        // SAFETY: in bounds, aligned, and the memory outlives `self`.
        unsafe { &*(self.as_ptr().add(offset) as *const AtomicU32) }
    }

    /// `Acquire` load of the word at `offset`: what a reader uses for a guard.
    #[inline]
    pub fn load_acquire(&self, offset: usize) -> u64 {
        self.atomic_u64(offset).load(Ordering::Acquire)
    }

    /// `Relaxed` load of the word at `offset`.
    #[inline]
    pub fn load_relaxed(&self, offset: usize) -> u64 {
        self.atomic_u64(offset).load(Ordering::Relaxed)
    }

    /// `Release` store of the word at `offset`: what a writer uses for a guard
    /// in its own region before pushing it.
    #[inline]
    pub fn store_release(&self, offset: usize, value: u64) {
        self.atomic_u64(offset).store(value, Ordering::Release)
    }

    /// Copies `data` into the region at `offset`, word-atomically.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: in bounds; copy_untorn writes with atomic-width stores.
        unsafe { copy_untorn(self.as_ptr().add(offset), data.as_ptr(), data.len()) }
    }

    /// Copies `out.len()` bytes at `offset` into `out`, loading every
    /// 8-byte aligned region word wholly inside the range with one atomic
    /// load (so a concurrent write never shows a torn word).
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        let len = out.len();
        let base = self.as_ptr();
        let mut i = 0;
        let head = ((8 - (offset % 8)) % 8).min(len);
        // SAFETY: every access is in bounds (checked above); region words
        // are read with atomic loads at 8-aligned addresses.
        unsafe {
            while i < head {
                out[i] = std::ptr::read_volatile(base.add(offset + i));
                i += 1;
            }
            while len - i >= 8 {
                let w = (*(base.add(offset + i) as *const AtomicU64)).load(Ordering::Relaxed);
                out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
                i += 8;
            }
            while i < len {
                out[i] = std::ptr::read_volatile(base.add(offset + i));
                i += 1;
            }
        }
        std::sync::atomic::fence(Ordering::Acquire);
    }

    /// A shared slice of the region.
    ///
    /// # Safety
    /// No one (local thread or peer write) may modify the range while the
    /// slice lives: e.g. a ring slot that its sender will not reuse yet.
    #[inline]
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: in bounds; the caller guarantees no concurrent writes.
        unsafe { std::slice::from_raw_parts(self.as_ptr().add(offset), len) }
    }

    /// A mutable slice of the region.
    ///
    /// # Safety
    /// The caller must be the only one accessing the range while the slice
    /// lives (e.g. a sender constructing a message in a slot it acquired).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: in bounds; the caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().add(offset), len) }
    }
}

/// Copies `len` bytes from `src` to `dst` so that every 8-byte word that is
/// 8-byte aligned at `dst` and lies wholly inside the range is stored by one
/// atomic store (guarantee 2 of the crate docs).
///
/// On x86-64 the aligned middle is stored with 16-byte `movdqa` stores, which
/// Intel documents as atomic on processors that support AVX (SDM vol. 3A
/// §9.1.1) and which are at worst pairs of atomic 8-byte stores; elsewhere
/// with `AtomicU64` stores. Source bytes are loaded unaligned.
///
/// Stores are issued in ascending address order (capability 8,
/// [`crate::Fabric::address_ordered`]): a compiler fence follows each
/// vector store, so the compiler cannot reorder them, and x86-64 keeps
/// stores in program order. (Only within one 32-byte AVX store is the order
/// of its halves the processor's; both lie on one cache line.)
///
/// # Safety
/// `src..src+len` readable, `dst..dst+len` writable; the ranges must not
/// overlap.
#[inline]
pub unsafe fn copy_untorn(dst: *mut u8, src: *const u8, len: usize) {
    unsafe {
        let mut i = 0usize;
        // Head: bytes up to the first 8-aligned destination address.
        let head = ((8 - (dst as usize % 8)) % 8).min(len);
        while i < head {
            std::ptr::write_volatile(dst.add(i), std::ptr::read_volatile(src.add(i)));
            i += 1;
        }
        compiler_fence(Ordering::Release);
        // One word to reach 16-byte alignment, if needed.
        if len - i >= 8 && !(dst as usize + i).is_multiple_of(16) {
            let w = std::ptr::read_unaligned(src.add(i) as *const u64);
            (*(dst.add(i) as *const AtomicU64)).store(w, Ordering::Relaxed);
            compiler_fence(Ordering::Release);
            i += 8;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if len - i >= 256 && std::arch::is_x86_feature_detected!("avx") {
                i = copy_avx_aligned(dst, src, i, len);
            }
            i = copy_sse_aligned(dst, src, i, len);
        }
        while len - i >= 8 {
            let w = std::ptr::read_unaligned(src.add(i) as *const u64);
            (*(dst.add(i) as *const AtomicU64)).store(w, Ordering::Relaxed);
            compiler_fence(Ordering::Release);
            i += 8;
        }
        while i < len {
            std::ptr::write_volatile(dst.add(i), std::ptr::read_volatile(src.add(i)));
            i += 1;
        }
    }
}

/// 16-byte aligned `movdqa` stores from `i` while 16 bytes remain; returns
/// the new position. Intel documents these stores as atomic on processors
/// with AVX, so every 8-byte word inside is untorn.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn copy_sse_aligned(dst: *mut u8, src: *const u8, mut i: usize, len: usize) -> usize {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_store_si128};
    unsafe {
        if !(dst as usize + i).is_multiple_of(16) {
            return i; // fewer than 24 bytes were left to align; the word loop finishes
        }
        while len - i >= 64 {
            let s = src.add(i) as *const __m128i;
            let d = dst.add(i) as *mut __m128i;
            let (a, b, c, e) = (
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            );
            _mm_store_si128(d, a);
            compiler_fence(Ordering::Release);
            _mm_store_si128(d.add(1), b);
            compiler_fence(Ordering::Release);
            _mm_store_si128(d.add(2), c);
            compiler_fence(Ordering::Release);
            _mm_store_si128(d.add(3), e);
            compiler_fence(Ordering::Release);
            i += 64;
        }
        while len - i >= 16 {
            _mm_store_si128(dst.add(i) as *mut __m128i, _mm_loadu_si128(src.add(i) as *const __m128i));
            compiler_fence(Ordering::Release);
            i += 16;
        }
        i
    }
}

/// 32-byte aligned `vmovdqa` stores (after one 16-byte store if needed to
/// reach 32-byte alignment) while 128 bytes remain; returns the new
/// position. A 32-byte aligned store never crosses a cache line, and x86
/// processors perform it as one access (or, on cores with 128-bit data
/// paths, as two 16-byte aligned accesses), so no aligned 8-byte word inside
/// it is torn. Intel's manual spells out atomicity only for 16-byte aligned
/// stores; the conformance suite's torn-word check runs on this path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_avx_aligned(dst: *mut u8, src: *const u8, mut i: usize, len: usize) -> usize {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm_store_si128, _mm256_loadu_si256, _mm256_store_si256,
    };
    unsafe {
        if !(dst as usize + i).is_multiple_of(32) {
            _mm_store_si128(dst.add(i) as *mut __m128i, _mm_loadu_si128(src.add(i) as *const __m128i));
            compiler_fence(Ordering::Release);
            i += 16;
        }
        while len - i >= 128 {
            let s = src.add(i) as *const __m256i;
            let d = dst.add(i) as *mut __m256i;
            let (a, b, c, e) = (
                _mm256_loadu_si256(s),
                _mm256_loadu_si256(s.add(1)),
                _mm256_loadu_si256(s.add(2)),
                _mm256_loadu_si256(s.add(3)),
            );
            _mm256_store_si256(d, a);
            compiler_fence(Ordering::Release);
            _mm256_store_si256(d.add(1), b);
            compiler_fence(Ordering::Release);
            _mm256_store_si256(d.add(2), c);
            compiler_fence(Ordering::Release);
            _mm256_store_si256(d.add(3), e);
            compiler_fence(Ordering::Release);
            i += 128;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_region_is_aligned_and_zeroed() {
        let r = Region::new_heap(1000);
        assert_eq!(r.as_ptr() as usize % REGION_ALIGN, 0);
        assert_eq!(r.len(), 1000);
        let mut out = vec![1u8; 1000];
        r.read_bytes(0, &mut out);
        assert!(out.iter().all(|b| *b == 0));
    }

    #[test]
    fn copy_untorn_copies_every_alignment_and_length() {
        let src: Vec<u8> = (0..500u32).map(|i| (i * 7 + 3) as u8).collect();
        for dst_off in 0..17 {
            for src_off in 0..9 {
                for len in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 130, 200, 255, 256, 257, 300, 383, 400] {
                    let r = Region::new_heap(1024);
                    // SAFETY: in bounds of both buffers.
                    unsafe { copy_untorn(r.as_ptr().add(dst_off), src.as_ptr().add(src_off), len) };
                    let mut out = vec![0u8; 1024];
                    r.read_bytes(0, &mut out);
                    assert!(out[..dst_off].iter().all(|b| *b == 0));
                    assert_eq!(&out[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert!(out[dst_off + len..].iter().all(|b| *b == 0));
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "outside region")]
    fn out_of_bounds_access_is_a_bug() {
        Region::new_heap(64).atomic_u64(64);
    }
}
