//! The conformance suite every [`Fabric`] backend must pass.
//!
//! A backend's tests implement [`Harness`] and call [`run_all`] (or the
//! single checks). The checks are behavioural: they fail if a guarantee of
//! the crate docs is broken, whatever the backend.
//!
//! | check | guarantee |
//! |---|---|
//! | [`fifo_order`] | 1: a word written with increasing values is never seen to go back |
//! | [`guarded_publish`] | 1+3: a reader that sees a guard sees all the data it guards, under flow control, concurrently |
//! | [`no_torn_words`] | 2: concurrent readers never see a word that mixes two writes |
//! | [`signaled_completion`] | 4: one completion per tag, data visible when it is reported |
//! | [`doorbell_wakeup`] | 6: a write wakes a reader parked on the doorbell |
//! | [`suspicion_after_peer_dies`] | 5: a dead peer is suspected, posts to it fail, others are unaffected |
//! | [`rejects_bad_posts`] | out-of-range and unknown-peer posts fail and change nothing |
//! | [`batched_publish`] | 7: data and guard posted as one batch publish like two posts, concurrently |
//! | [`batch_stops_at_a_bad_range`] | 7: a batch posts exactly the ranges before a bad one |
//! | [`address_order_within_a_write`] | 8 (where claimed): a reader that sees a write's last word sees every word below it; bytes stored after the post never land |
//!
//! Multi-process checks (SIGKILL of a peer process) need a binary to spawn and
//! live in the `ordo` package's integration tests; the tcp backend's
//! bad-frame rejection lives in its own tests.

use crate::{Fabric, FabricEvent, MemberId, PostError, Write, WriteTag};
use std::time::{Duration, Instant};

/// One member's part in a check: called repeatedly until it returns `true`.
pub type Part<F> = Box<dyn FnMut(&mut F) -> bool + Send>;

/// What a backend supplies to run the suite.
pub trait Harness {
    /// The backend's fabric endpoint.
    type Fabric: Fabric + Send + 'static;

    /// A group of `n` members (ids `0..n`) with regions of `region_len`
    /// bytes, every link up. Element `i` is member `i`.
    fn group(&mut self, n: usize, region_len: usize) -> Vec<Self::Fabric>;

    /// Runs `parts[i]` for `members[i]` until every part returns `true`, and
    /// gives the members back. Real backends run each part on its own thread
    /// (truly concurrently); the simulator interleaves them with its network.
    /// Panics if the parts do not finish within `limit`.
    fn run(
        &mut self,
        members: Vec<Self::Fabric>,
        parts: Vec<Part<Self::Fabric>>,
        limit: Duration,
    ) -> Vec<Self::Fabric>;

    /// Makes `member` fail the way a crashed process does. Default: drop it
    /// (which releases its liveness lock or closes its connections).
    fn kill(&mut self, member: Self::Fabric) {
        drop(member);
    }

    /// Starts a new incarnation of `member` of the last group created (after
    /// it was killed), or `None` if the harness cannot. Enables
    /// [`reconnect_after_restart`].
    fn restart(&mut self, member: MemberId) -> Option<Self::Fabric> {
        let _ = member;
        None
    }

    /// Whether the backend has a doorbell that incoming writes ring.
    fn has_doorbell(&self) -> bool;

    /// Lets time pass for a member that is waiting on the network (real
    /// backends: a short sleep; the simulator: advance its clock).
    fn pause(&mut self) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Runs every check of the suite.
pub fn run_all<H: Harness>(h: &mut H) {
    rejects_bad_posts(h);
    fifo_order(h);
    guarded_publish(h, 64, 3000);
    guarded_publish(h, 10 * 1024, 300);
    batched_publish(h, 64, 3000);
    batched_publish(h, 10 * 1024, 300);
    batch_stops_at_a_bad_range(h);
    address_order_within_a_write(h);
    no_torn_words(h);
    signaled_completion(h);
    if h.has_doorbell() {
        doorbell_wakeup(h);
    }
    suspicion_after_peer_dies(h);
    reconnect_after_restart(h);
}

/// Guarantee 5, the way back: after member 1 dies and a new incarnation of
/// it starts, `reconnect` succeeds (reporting `Reconnected` once), writes
/// flow again, and nothing posted to the dead incarnation shows up in the
/// new one's region. Skipped when the harness cannot restart members.
pub fn reconnect_after_restart<H: Harness>(h: &mut H) {
    let mut g = h.group(2, 4096);
    let victim = g.pop().expect("two members");
    h.kill(victim);
    let mut events = Vec::new();
    let start = Instant::now();
    let mut tag = 0;
    while !g[0].is_suspected(1) {
        assert!(start.elapsed() < Duration::from_secs(30), "dead peer never suspected");
        tag += 1;
        g[0].region().store_release(0, 0xDEAD);
        let _ = g[0].post_write(Write::signaled(1, 0, 8, WriteTag(tag)));
        g[0].poll_events(&mut events);
        h.pause();
    }
    let Some(new) = h.restart(1) else { return };
    let start = Instant::now();
    let incarnation = loop {
        match g[0].reconnect(1) {
            Ok(i) => break i,
            Err(crate::ReconnectError::Unreachable(..)) => {
                assert!(start.elapsed() < Duration::from_secs(30), "never reconnected");
                h.pause();
            }
            Err(e) => panic!("{e}"),
        }
    };
    events.clear();
    g[0].poll_events(&mut events);
    let reconnected = events.iter().filter(|e| matches!(e, FabricEvent::Reconnected { peer: 1, .. })).count();
    assert_eq!(reconnected, 1, "one Reconnected event: {events:?}");
    assert!(events.contains(&FabricEvent::Reconnected { peer: 1, incarnation }));
    assert!(!g[0].is_suspected(1));
    g.push(new);
    g[0].region().store_release(8, 77);
    g[0].post_write(Write::new(1, 8, 8)).unwrap();
    h.run(
        g,
        vec![
            Box::new(|_f| true),
            Box::new(|f| {
                assert_ne!(f.region().load_acquire(0), 0xDEAD, "a write to the dead incarnation landed");
                f.region().load_acquire(8) == 77
            }),
        ],
        Duration::from_secs(30),
    );
}

/// Posts `write`, retrying (with `progress` between tries) while the backend
/// reports back-pressure.
pub fn post_retrying<F: Fabric>(
    f: &mut F,
    write: Write,
    progress: &mut Vec<FabricEvent>,
) -> Result<(), PostError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f.post_write(write) {
            Err(PostError::Backpressure(_)) if Instant::now() < deadline => {
                f.poll_events(progress);
                std::thread::yield_now();
            }
            other => return other,
        }
    }
}

/// Out-of-range writes, writes to unknown peers and to oneself are refused
/// with the right error and change no remote byte.
pub fn rejects_bad_posts<H: Harness>(h: &mut H) {
    let mut g = h.group(2, 4096);
    let len = g[0].region().len();
    g[0].region().write_bytes(0, &[0xAB; 64]);
    assert!(matches!(g[0].post_write(Write::new(1, len - 8, 16)), Err(PostError::OutOfBounds { .. })));
    assert!(matches!(g[0].post_write(Write::new(1, usize::MAX - 4, 8)), Err(PostError::OutOfBounds { .. })));
    assert_eq!(g[0].post_write(Write::new(7, 0, 8)), Err(PostError::UnknownPeer(7)));
    assert_eq!(g[0].post_write(Write::new(0, 0, 8)), Err(PostError::UnknownPeer(0)));
    // A good write after the bad ones still lands, and only it.
    g[0].region().store_release(64, 1);
    g[0].post_write(Write::new(1, 64, 8)).unwrap();
    let g = h.run(
        g,
        vec![Box::new(|_f| true), Box::new(|f| f.region().load_acquire(64) == 1)],
        Duration::from_secs(20),
    );
    let mut out = [0u8; 64];
    g[1].region().read_bytes(0, &mut out);
    assert_eq!(out, [0u8; 64], "a refused write changed the peer's region");
}

/// Guarantee 7's failure rule: a batch whose second range lies outside the
/// region posts its first range, reports `posted: 1` with the range's
/// error, and posts nothing after it; a batch to an unknown peer posts
/// nothing.
pub fn batch_stops_at_a_bad_range<H: Harness>(h: &mut H) {
    let mut g = h.group(2, 4096);
    let len = g[0].region().len();
    g[0].region().store_release(0, 11);
    g[0].region().store_release(128, 33);
    let err = g[0].post_writes(1, &[(0, 8), (len - 8, 16), (128, 8)]).unwrap_err();
    assert_eq!(err.posted, 1, "{err}");
    assert!(matches!(err.error, PostError::OutOfBounds { .. }), "{err}");
    let err = g[0].post_writes(7, &[(0, 8)]).unwrap_err();
    assert_eq!((err.posted, err.error), (0, PostError::UnknownPeer(7)));
    // A marker after the bad batch: once it lands, so did the first range.
    g[0].region().store_release(256, 1);
    g[0].post_writes(1, &[(256, 8)]).unwrap();
    let g = h.run(
        g,
        vec![Box::new(|_f| true), Box::new(|f| f.region().load_acquire(256) == 1)],
        Duration::from_secs(20),
    );
    assert_eq!(g[1].region().load_acquire(0), 11, "the range before the bad one was posted");
    assert_eq!(g[1].region().load_acquire(128), 0, "a range after the bad one was posted");
}

/// Guarantee 1: a word that the writer sets to 1, 2, ..., K with one write
/// each is observed by the reader as non-decreasing and ends at K.
pub fn fifo_order<H: Harness>(h: &mut H) {
    const K: u64 = 20_000;
    let g = h.group(2, 4096);
    let writer: Part<H::Fabric> = {
        let mut next = 1u64;
        let mut events = Vec::new();
        Box::new(move |f| {
            for _ in 0..64 {
                if next > K {
                    return true;
                }
                f.region().store_release(0, next);
                post_retrying(f, Write::new(1, 0, 8), &mut events).unwrap();
                next += 1;
            }
            f.poll_events(&mut events);
            next > K
        })
    };
    let reader: Part<H::Fabric> = {
        let mut last = 0u64;
        Box::new(move |f| {
            let v = f.region().load_acquire(0);
            assert!(v >= last, "FIFO broken: saw {v} after {last}");
            last = v;
            v == K
        })
    };
    h.run(g, vec![writer, reader], Duration::from_secs(60));
}

const SLOTS: usize = 8;
const GUARD: usize = 0;
const ACK: usize = 64;
const DATA: usize = 128;

fn pattern(i: u64, k: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(k as u64 * 7) % 251) as u8
}

/// Guarantees 1 and 3 under concurrency: the writer streams `count` messages
/// of `size` bytes into an 8-slot ring at the reader, each followed by a
/// guard write; the reader, seeing guard `g`, checks every byte of messages
/// up to `g` and acks through its own write back. Any lost, reordered or
/// early-visible byte fails the check.
pub fn guarded_publish<H: Harness>(h: &mut H, size: usize, count: u64) {
    publish(h, size, count, false)
}

/// Guarantee 7: as [`guarded_publish`], but each message's data and its
/// guard go out as one [`Fabric::post_writes`] batch (guard last), so the
/// batch must keep the order of its writes for a concurrent reader.
pub fn batched_publish<H: Harness>(h: &mut H, size: usize, count: u64) {
    publish(h, size, count, true)
}

/// Posts `ranges` to `peer` as one batch, retrying the rest while the
/// backend reports back-pressure.
pub fn post_batch_retrying<F: Fabric>(
    f: &mut F,
    peer: MemberId,
    mut ranges: &[(usize, usize)],
    progress: &mut Vec<FabricEvent>,
) -> Result<(), PostError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f.post_writes(peer, ranges) {
            Ok(()) => return Ok(()),
            Err(p) if matches!(p.error, PostError::Backpressure(_)) && Instant::now() < deadline => {
                ranges = &ranges[p.posted..];
                f.poll_events(progress);
                std::thread::yield_now();
            }
            Err(p) => return Err(p.error),
        }
    }
}

fn publish<H: Harness>(h: &mut H, size: usize, count: u64, batched: bool) {
    let region_len = DATA + SLOTS * size;
    let g = h.group(2, region_len);
    let writer: Part<H::Fabric> = {
        let mut next = 1u64;
        let mut events = Vec::new();
        let mut scratch = vec![0u8; size];
        Box::new(move |f| {
            if next > count {
                return true;
            }
            let acked = f.region().load_acquire(ACK);
            let mut posted = false;
            while next <= count && next - acked <= SLOTS as u64 {
                let slot = DATA + ((next - 1) as usize % SLOTS) * size;
                for (k, b) in scratch.iter_mut().enumerate() {
                    *b = pattern(next, k);
                }
                f.region().write_bytes(slot, &scratch);
                if batched {
                    f.region().store_release(GUARD, next);
                    post_batch_retrying(f, 1, &[(slot, size), (GUARD, 8)], &mut events).unwrap();
                } else {
                    post_retrying(f, Write::new(1, slot, size), &mut events).unwrap();
                    f.region().store_release(GUARD, next);
                    post_retrying(f, Write::new(1, GUARD, 8), &mut events).unwrap();
                }
                next += 1;
                posted = true;
            }
            if !posted {
                f.poll_events(&mut events);
            }
            false
        })
    };
    let reader: Part<H::Fabric> = {
        let mut seen = 0u64;
        let mut events = Vec::new();
        let mut buf = vec![0u8; size];
        Box::new(move |f| {
            let guard = f.region().load_acquire(GUARD);
            assert!(guard >= seen, "guard went back from {seen} to {guard}");
            if guard == seen {
                return seen == count;
            }
            for i in seen + 1..=guard {
                let slot = DATA + ((i - 1) as usize % SLOTS) * size;
                f.region().read_bytes(slot, &mut buf);
                for (k, b) in buf.iter().enumerate() {
                    assert_eq!(*b, pattern(i, k), "message {i} byte {k} not visible under guard {guard}");
                }
            }
            seen = guard;
            f.region().store_release(ACK, seen);
            post_retrying(f, Write::new(0, ACK, 8), &mut events).unwrap();
            seen == count
        })
    };
    h.run(g, vec![writer, reader], Duration::from_secs(60));
}

/// Capability 8, checked only where the backend claims it: the writer
/// writes a 1 KiB block whose every word holds `v` (v = 1, 2, …), one write
/// each; the reader loads the block's *last* word with `Acquire`, then the
/// first word, then every other word: none may be older than the last word
/// it saw. (Without address order a reader can see the end of a write before
/// its start — the reason a guard must otherwise be a separate write.)
pub fn address_order_within_a_write<H: Harness>(h: &mut H) {
    const WORDS: usize = 128;
    const ROUNDS: u64 = 20_000;
    let g = h.group(2, 4096);
    if !g[0].address_ordered() {
        return;
    }
    let writer: Part<H::Fabric> = {
        let mut v = 1u64;
        let mut events = Vec::new();
        let block = vec![0u8; WORDS * 8];
        Box::new(move |f| {
            if v > ROUNDS {
                return true;
            }
            let mut b = block.clone();
            for w in b.chunks_mut(8) {
                w.copy_from_slice(&v.to_le_bytes());
            }
            f.region().write_bytes(0, &b);
            post_retrying(f, Write::new(1, 0, WORDS * 8), &mut events).unwrap();
            // The bytes were taken at post time: what the source holds
            // from now on must never land.
            f.region().write_bytes(0, &vec![0xFF; WORDS * 8]);
            v += 1;
            f.poll_events(&mut events);
            v > ROUNDS
        })
    };
    let reader: Part<H::Fabric> = {
        let mut last_seen = 0u64;
        Box::new(move |f| {
            let r = f.region();
            let top = r.load_acquire((WORDS - 1) * 8);
            assert_ne!(top, u64::MAX, "bytes stored after the post landed: not taken at post time");
            assert!(top >= last_seen, "the last word went back from {last_seen} to {top}");
            last_seen = top;
            // The first word right away (the widest window), then the rest.
            let first = r.load_acquire(0);
            assert_ne!(first, u64::MAX, "bytes stored after the post landed: not taken at post time");
            assert!(
                first >= top,
                "word 0 holds {first} below the write's last word {top}: not address-ordered"
            );
            for k in (1..WORDS - 1).rev() {
                let w = r.load_acquire(k * 8);
                assert_ne!(w, u64::MAX, "bytes stored after the post landed: not taken at post time");
                assert!(
                    w >= top,
                    "word {k} holds {w} below the write's last word {top}: not address-ordered"
                );
            }
            top == ROUNDS
        })
    };
    h.run(g, vec![writer, reader], Duration::from_secs(60));
}

/// Guarantee 2: the writer repeatedly writes a 512-byte block whose every
/// word has all eight bytes equal (`v` in each byte, `v` increasing), in one
/// write each time; the reader checks that every word it loads is uniform
/// and never goes back.
pub fn no_torn_words<H: Harness>(h: &mut H) {
    const GUARD_AT: usize = 1024;
    // 64 words: the 504-byte write exercises the backends' widest (32-byte
    // vector) store path, which needs 256 bytes or more.
    const WORDS: usize = 64;
    const ROUNDS: u64 = 5000;
    let g = h.group(2, 4096);
    let writer: Part<H::Fabric> = {
        let mut v = 1u64;
        let mut events = Vec::new();
        Box::new(move |f| {
            let word = (v % 255 + 1) * 0x0101_0101_0101_0101;
            for w in 0..WORDS {
                f.region().atomic_u64(w * 8).store(word, std::sync::atomic::Ordering::Relaxed);
            }
            // Offset the write by 8 so the backend's copy also has to handle
            // a block that does not start on a 16-byte boundary.
            post_retrying(f, Write::new(1, 8, (WORDS - 1) * 8), &mut events).unwrap();
            f.region().store_release(GUARD_AT, v);
            post_retrying(f, Write::new(1, GUARD_AT, 8), &mut events).unwrap();
            f.poll_events(&mut events);
            v += 1;
            v > ROUNDS
        })
    };
    let reader: Part<H::Fabric> = Box::new(move |f| {
        // Round g's block lands before guard g, and FIFO lets at most round
        // g2+1's block be visible when the guard reads g2; so each word must
        // hold the byte of a round in [g1, g2 + 1].
        let g1 = f.region().load_acquire(GUARD_AT);
        let mut bytes = [0u8; WORDS];
        for (w, byte) in bytes.iter_mut().enumerate().skip(1) {
            let x = f.region().atomic_u64(w * 8).load(std::sync::atomic::Ordering::Acquire);
            let b = x.to_le_bytes();
            assert!(b.iter().all(|y| *y == b[0]), "torn word {w}: {x:#018x}");
            *byte = b[0];
        }
        let g2 = f.region().load_acquire(GUARD_AT);
        if g1 > 0 && g2 + 1 - g1 < 250 {
            for (w, byte) in bytes.iter().enumerate().skip(1) {
                let ok = (g1..=g2 + 1).any(|v| (v % 255 + 1) as u8 == *byte);
                assert!(ok, "word {w} holds {byte}, not a round in [{g1}, {}]", g2 + 1);
            }
        }
        g2 == ROUNDS
    });
    h.run(g, vec![writer, reader], Duration::from_secs(60));
}

/// Guarantee 4: every signaled write yields exactly one completion with its
/// tag, and when it is reported the data is visible at the peer.
pub fn signaled_completion<H: Harness>(h: &mut H) {
    const N: u64 = 200;
    let g = h.group(3, 4096);
    let writer: Part<H::Fabric> = {
        let mut next = 0u64;
        let mut done: Vec<(MemberId, u64)> = Vec::new();
        let mut events = Vec::new();
        Box::new(move |f| {
            if next < N {
                f.region().store_release(256, next + 1);
                for peer in [1, 2] {
                    let tag = WriteTag(next * 10 + peer as u64);
                    post_retrying(f, Write::signaled(peer, 256, 8, tag), &mut events).unwrap();
                }
                next += 1;
            }
            f.poll_events(&mut events);
            for e in events.drain(..) {
                match e {
                    FabricEvent::Completed { peer, tag } => {
                        assert_eq!(tag.0 % 10, peer as u64, "completion for the wrong peer");
                        done.push((peer, tag.0));
                    }
                    other => panic!("unexpected event {other:?}"),
                }
            }
            if done.len() as u64 == 2 * N {
                let mut sorted = done.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), done.len(), "a tag completed twice");
                // Per peer, completions arrive in posting order.
                for peer in [1u32, 2] {
                    let seq: Vec<u64> = done.iter().filter(|d| d.0 == peer).map(|d| d.1).collect();
                    assert!(seq.windows(2).all(|w| w[0] < w[1]), "completions out of order");
                }
                return true;
            }
            false
        })
    };
    let idle = |f: &mut H::Fabric| f.region().load_acquire(256) == N;
    h.run(g, vec![writer, Box::new(idle), Box::new(idle)], Duration::from_secs(60));

    // Visibility at completion: a single signaled write whose completion the
    // writer waits for; the peer's byte must be there when it is reported.
    let mut g = h.group(2, 4096);
    g[0].region().store_release(8, 0xFEED);
    g[0].post_write(Write::signaled(1, 8, 8, WriteTag(1))).unwrap();
    let start = Instant::now();
    let mut events = Vec::new();
    loop {
        g[0].poll_events(&mut events);
        if let Some(e) = events.first() {
            assert_eq!(*e, FabricEvent::Completed { peer: 1, tag: WriteTag(1) });
            assert_eq!(g[1].region().load_acquire(8), 0xFEED, "completed before visible");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no completion");
        h.pause();
    }
}

/// Guarantee 6: a reader parked on its doorbell (with a 10 s timeout) is
/// woken by a write that lands while it sleeps.
pub fn doorbell_wakeup<H: Harness>(h: &mut H) {
    let g = h.group(2, 4096);
    let writer: Part<H::Fabric> = {
        let start = Instant::now();
        Box::new(move |f| {
            if start.elapsed() < Duration::from_millis(50) {
                std::thread::sleep(Duration::from_millis(5));
                return false;
            }
            f.region().store_release(0, 42);
            f.post_write(Write::new(1, 0, 8)).unwrap();
            true
        })
    };
    let reader: Part<H::Fabric> = Box::new(move |f| {
        let bell = f.doorbell().expect("backend has a doorbell").clone();
        let token = bell.prepare_park();
        if f.region().load_acquire(0) == 42 {
            bell.cancel(token);
            return true;
        }
        let start = Instant::now();
        let woken = bell.park(token, Duration::from_secs(10));
        let slept = start.elapsed();
        if f.region().load_acquire(0) == 42 {
            assert!(woken && slept < Duration::from_secs(5), "slept {slept:?} through a write");
            return true;
        }
        false
    });
    h.run(g, vec![writer, reader], Duration::from_secs(30));
}

/// Guarantee 5: after member 2 dies, member 0's signaled writes to it fail,
/// member 2 is suspected exactly once, posts to it are refused, and writes to
/// member 1 keep completing.
pub fn suspicion_after_peer_dies<H: Harness>(h: &mut H) {
    let mut g = h.group(3, 4096);
    let victim = g.pop().expect("three members");
    h.kill(victim);
    let start = Instant::now();
    let mut events = Vec::new();
    let mut suspected = 0;
    let mut posted = std::collections::BTreeSet::new();
    let mut resolved = std::collections::BTreeSet::new();
    let mut tag = 0u64;
    let mut done = false;
    while !done {
        assert!(start.elapsed() < Duration::from_secs(30), "dead peer never suspected: {events:?}");
        tag += 1;
        match g[0].post_write(Write::signaled(2, 0, 8, WriteTag(tag))) {
            Ok(()) => {
                posted.insert(tag);
            }
            Err(PostError::PeerSuspected(2)) => done = suspected == 1 && resolved == posted,
            Err(e) => panic!("unexpected post error {e}"),
        }
        g[0].poll_events(&mut events);
        for e in events.drain(..) {
            match e {
                FabricEvent::Suspected { peer: 2, .. } => suspected += 1,
                FabricEvent::Failed { peer: 2, tag, .. } | FabricEvent::Completed { peer: 2, tag } => {
                    assert!(posted.contains(&tag.0), "outcome for a tag never posted: {tag:?}");
                    assert!(resolved.insert(tag.0), "tag {tag:?} resolved twice");
                }
                other => panic!("unexpected event {other:?}"),
            }
        }
        h.pause();
    }
    assert_eq!(suspected, 1, "suspected once");
    assert_eq!(resolved, posted, "every signaled write resolved exactly once");
    assert!(g[0].is_suspected(2));
    assert!(!g[0].is_suspected(1));
    // The live peer is unaffected.
    g[0].region().store_release(16, 7);
    g[0].post_write(Write::signaled(1, 16, 8, WriteTag(u64::MAX))).unwrap();
    let start = Instant::now();
    loop {
        g[0].poll_events(&mut events);
        if events.contains(&FabricEvent::Completed { peer: 1, tag: WriteTag(u64::MAX) }) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "live peer stopped completing: {events:?}");
        h.pause();
    }
}

/// Runs `parts` on threads, one per member, each until it returns `true`;
/// the helper real backends use for [`Harness::run`]. Parts yield between
/// calls so two spinning parts share two cores; the whole run is bounded.
pub fn run_on_threads<F: Fabric + Send + 'static>(
    members: Vec<F>,
    parts: Vec<Part<F>>,
    limit: Duration,
) -> Vec<F> {
    assert_eq!(members.len(), parts.len(), "one part per member");
    let deadline = Instant::now() + limit;
    let handles: Vec<_> = members
        .into_iter()
        .zip(parts)
        .enumerate()
        .map(|(i, (mut f, mut part))| {
            std::thread::Builder::new()
                .name(format!("conformance-{i}"))
                .spawn(move || {
                    let mut idle_calls = 0u32;
                    while !part(&mut f) {
                        assert!(Instant::now() < deadline, "member {i} did not finish within {limit:?}");
                        idle_calls += 1;
                        if idle_calls.is_multiple_of(64) {
                            std::thread::yield_now();
                        }
                    }
                    f
                })
                .expect("spawn")
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
}
