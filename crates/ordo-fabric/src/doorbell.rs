//! The doorbell: how a write that lands wakes a parked poller.
//!
//! # Protocol (a Dekker handshake with an asymmetric fence)
//! - **Ringer** (after its data is written): a *light* barrier; if
//!   `waiters > 0`: `seq += 1`, `futex_wake(seq)`. With no one parked the
//!   ringer does one load of a read-mostly word: no syscall on the data path.
//! - **Parker**: `waiters += 1`; a *heavy* barrier; `token = seq`; re-check
//!   for work; if none, `futex_wait(seq, token, timeout)`; `waiters -= 1`.
//!
//! Either the ringer sees `waiters > 0` (and wakes or changes `seq` so the
//! wait returns at once), or the parker's re-check sees the ringer's data.
//! So a parked poller never sleeps through a write that landed before it
//! parked — at worst it sleeps until its timeout, which the caller bounds.
//!
//! The store-to-load order this needs costs a full fence on both sides in
//! the symmetric form; on the ringer, the data path, that fence waits for
//! the store just posted to reach the peer's cache line — a cross-core
//! round trip per post (profiling `bench acuerdo` found 90 % of
//! `post_writes` there). Ringing is frequent and parking is rare, so the
//! cost moves to the parker (the pattern of userspace RCU and folly's
//! asymmetric barriers): every process that rings registers with Linux's
//! `membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED)`, its light
//! barrier is then a compiler fence, and the parker's heavy barrier is
//! `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, which runs a full memory
//! barrier on every CPU running a thread of a registered process. Where
//! the kernel lacks it (or registration is refused), both sides fall back
//! to `fence(SeqCst)` — each side decides for itself, and every mix is
//! correct: an unregistered ringer fences, and a parker always fences and
//! issues the membarrier when the kernel has it.
//!
//! The words live in shared memory (the shm backend puts them in a region
//! file's header, so another process can ring them) or on the heap.

use linux_futex::{AsFutex, Shared};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering, compiler_fence, fence};
use std::time::Duration;

/// The asymmetric barrier pair (see the module docs).
mod barrier {
    use super::*;
    use std::sync::OnceLock;

    const CMD_QUERY: libc::c_long = 0;
    const CMD_GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
    const CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_long = 1 << 2;

    /// (the kernel has the expedited global membarrier, this process is
    /// registered for it).
    static STATE: OnceLock<(bool, bool)> = OnceLock::new();

    fn membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes (cmd, flags, cpu_id) and touches no memory.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long, 0 as libc::c_long) }
    }

    /// Queries the kernel and registers this process once. Called before
    /// any doorbell handle exists, so no ring ever skips its fence unless
    /// the registration had succeeded.
    pub(super) fn init() -> (bool, bool) {
        *STATE.get_or_init(|| {
            let q = membarrier(CMD_QUERY);
            let want = CMD_GLOBAL_EXPEDITED | CMD_REGISTER_GLOBAL_EXPEDITED;
            let supported = q >= 0 && q & want == want;
            let registered = supported && membarrier(CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
            (supported, registered)
        })
    }

    /// The ringer's side: a compiler fence once registered, else a full one.
    #[inline]
    pub(super) fn light() {
        if STATE.get().is_some_and(|s| s.1) {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    /// The parker's side: a full fence, and a barrier on every CPU running
    /// a registered process where the kernel has it.
    pub(super) fn heavy() {
        fence(Ordering::SeqCst);
        if init().0 && membarrier(CMD_GLOBAL_EXPEDITED) != 0 {
            // Cannot happen once QUERY said yes; a ringer that skipped its
            // fence could then delay this park until its timeout.
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "ordo: membarrier(GLOBAL_EXPEDITED) failed; a parked poller may wake only at its timeout"
                )
            });
        }
    }

    /// Whether this process rings with the light barrier.
    pub(super) fn asymmetric() -> bool {
        init().1
    }
}

/// Whether this process's rings skip the full fence (the asymmetric
/// barrier is in use: see the module docs).
pub fn asymmetric_barrier() -> bool {
    barrier::asymmetric()
}

/// The two words of a doorbell, in their own cache line.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct DoorbellWords {
    /// Bumped by a ringer that saw a waiter; the futex word.
    pub seq: AtomicU32,
    /// Number of pollers parked or about to park.
    pub waiters: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<DoorbellWords>() == 64);

/// A handle on a doorbell (cheap to clone; clones ring the same bell).
#[derive(Clone)]
pub struct Doorbell {
    words: NonNull<DoorbellWords>,
    /// Identifies the bell across mappings: (0, address) on the heap,
    /// (1, caller's key such as an inode) for shared memory.
    key: (u8, u64),
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the words are atomics; the owner keeps the memory alive.
unsafe impl Send for Doorbell {}
unsafe impl Sync for Doorbell {}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell")
            .field("seq", &self.words().seq.load(Ordering::Relaxed))
            .field("waiters", &self.words().waiters.load(Ordering::Relaxed))
            .finish()
    }
}

/// Proof that [`Doorbell::prepare_park`] ran; pass it to `park` or `cancel`.
#[derive(Debug)]
#[must_use = "a prepared park must be finished with park() or cancel()"]
pub struct ParkToken {
    seq: u32,
}

impl Doorbell {
    /// A doorbell on the heap, for rings within one process.
    pub fn new_local() -> Doorbell {
        barrier::init();
        let owner = Arc::new(DoorbellWords::default());
        let words = NonNull::from(&*owner);
        Doorbell { words, key: (0, words.as_ptr() as u64), _owner: owner }
    }

    /// A doorbell whose words live in memory owned by `owner` (a mapping).
    /// `key` must be the same for every mapping of the same words (e.g. the
    /// file's inode) and differ between bells, so [`ptr_eq`](Self::ptr_eq)
    /// can tell whether two handles ring the same bell.
    ///
    /// # Safety
    /// `words` must point to a valid, 64-byte aligned `DoorbellWords` that
    /// lives as long as `owner`.
    pub unsafe fn from_raw(
        words: NonNull<DoorbellWords>,
        owner: Arc<dyn Any + Send + Sync>,
        key: u64,
    ) -> Doorbell {
        barrier::init();
        Doorbell { words, key: (1, key), _owner: owner }
    }

    fn words(&self) -> &DoorbellWords {
        // SAFETY: valid for the life of the owner we hold.
        unsafe { self.words.as_ref() }
    }

    /// Wakes parked pollers if there are any. Call after the data is written.
    #[inline]
    pub fn ring(&self) {
        barrier::light();
        let w = self.words();
        if w.waiters.load(Ordering::Relaxed) > 0 {
            w.seq.fetch_add(1, Ordering::Release);
            AsFutex::<Shared>::as_futex(&w.seq).wake(i32::MAX);
        }
    }

    /// First half of parking: announce the waiter. The caller must then
    /// re-check for work and call [`park`](Self::park) or
    /// [`cancel`](Self::cancel).
    pub fn prepare_park(&self) -> ParkToken {
        let w = self.words();
        w.waiters.fetch_add(1, Ordering::SeqCst);
        barrier::heavy();
        ParkToken { seq: w.seq.load(Ordering::Acquire) }
    }

    /// Sleeps until a ring after `prepare_park`, or `timeout`. Returns `true`
    /// if it was (possibly) woken by a ring, `false` on timeout.
    pub fn park(&self, token: ParkToken, timeout: Duration) -> bool {
        let w = self.words();
        let futex = AsFutex::<Shared>::as_futex(&w.seq);
        let woken = match futex.wait_for(token.seq, timeout) {
            Ok(()) => true,
            Err(linux_futex::TimedWaitError::WrongValue) => true,
            Err(linux_futex::TimedWaitError::Interrupted) => true,
            Err(linux_futex::TimedWaitError::TimedOut) => false,
        };
        w.waiters.fetch_sub(1, Ordering::SeqCst);
        woken
    }

    /// Abandons a prepared park (the re-check found work).
    pub fn cancel(&self, token: ParkToken) {
        let _ = token;
        self.words().waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether two handles ring the same bell (the same words, possibly
    /// through different mappings).
    pub fn ptr_eq(&self, other: &Doorbell) -> bool {
        self.key == other.key
    }

    /// The current ring count (advances only when someone was parked).
    pub fn seq(&self) -> u32 {
        self.words().seq.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    /// The handshake under stress: a thread parks with a 30 s timeout
    /// whenever it has seen every write so far; the other writes a counter
    /// then rings the moment the previous write was seen, 3,000 times, so
    /// each write races the parker's announcement. A lost wake-up would
    /// leave the parker asleep for 30 s (the test's limit is far below).
    /// With the asymmetric barrier the ringer has no fence at all, so this
    /// is what checks the membarrier side (removing it fails this test).
    /// How often the parker gets to park depends on how the two threads
    /// are scheduled (from none to a third of the rounds here), so batches
    /// run until 100 parks in all, up to 20 batches, and at least one park
    /// is required.
    #[test]
    fn no_ring_is_lost_under_a_race_with_parking() {
        const ROUNDS: u64 = 3_000;
        let mut total = 0;
        for _batch in 0..20 {
            let bell = Doorbell::new_local();
            let data = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let (b2, d2, s2) = (bell.clone(), data.clone(), seen.clone());
            let parker = std::thread::spawn(move || {
                let mut parks = 0u64;
                loop {
                    let v = d2.load(Ordering::Acquire);
                    s2.store(v, Ordering::Release);
                    if v == ROUNDS {
                        return parks;
                    }
                    let t = b2.prepare_park();
                    if d2.load(Ordering::Acquire) != v {
                        b2.cancel(t);
                        continue;
                    }
                    parks += 1;
                    b2.park(t, Duration::from_secs(30));
                }
            });
            let start = Instant::now();
            for i in 1..=ROUNDS {
                data.store(i, Ordering::Release);
                bell.ring();
                while seen.load(Ordering::Acquire) < i {
                    assert!(
                        start.elapsed() < Duration::from_secs(20),
                        "round {i}: the parker slept through a ring"
                    );
                    std::hint::spin_loop();
                }
            }
            let parks = parker.join().unwrap();
            total += parks;
            eprintln!("{ROUNDS} rounds, {parks} parks, asymmetric barrier: {}", asymmetric_barrier());
            if total >= 100 {
                return;
            }
        }
        assert!(total > 0, "the parker never parked in 20 batches: the race was not exercised");
    }

    #[test]
    fn ring_without_waiters_changes_nothing() {
        let bell = Doorbell::new_local();
        bell.ring();
        assert_eq!(bell.seq(), 0);
    }

    #[test]
    fn park_times_out_without_a_ring() {
        let bell = Doorbell::new_local();
        let t = bell.prepare_park();
        let start = Instant::now();
        assert!(!bell.park(t, Duration::from_millis(5)));
        assert!(start.elapsed() >= Duration::from_millis(4));
    }

    #[test]
    fn a_ring_wakes_a_parked_thread_long_before_its_timeout() {
        let bell = Doorbell::new_local();
        let flag = Arc::new(AtomicBool::new(false));
        let (b2, f2) = (bell.clone(), flag.clone());
        let sleeper = std::thread::spawn(move || {
            let start = Instant::now();
            loop {
                if f2.load(Ordering::Acquire) {
                    return start.elapsed();
                }
                let t = b2.prepare_park();
                if f2.load(Ordering::Acquire) {
                    b2.cancel(t);
                    continue;
                }
                b2.park(t, Duration::from_secs(10));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::Release);
        bell.ring();
        let waited = sleeper.join().unwrap();
        assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    }
}
