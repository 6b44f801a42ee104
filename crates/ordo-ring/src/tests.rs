use super::*;
use ordo_fabric::loopback::{Loopback, loopback_group};

const BASE: usize = 64;

fn setup(window: usize, max_payload: usize) -> (Vec<Loopback>, RingLayout) {
    let layout = RingLayout::new(window, max_payload);
    (loopback_group(2, BASE + layout.set_len(2)), layout)
}

fn send(p: &SlotProducer, bytes: &[u8]) -> bool {
    match p.try_acquire() {
        Some(mut g) => {
            g.payload()[..bytes.len()].copy_from_slice(bytes);
            g.commit(bytes.len(), 0);
            true
        }
        None => false,
    }
}

#[test]
fn layout_sizes_are_cache_line_multiples() {
    let l = RingLayout::new(4, 100);
    assert_eq!(l.slot_size(), 128, "16-byte header, 100 bytes, 8-byte trailer: two lines");
    assert_eq!(l.ring_len(), 64 + 4 * 128);
    assert_eq!(
        RingLayout::new(1, 40).slot_size(),
        64,
        "a 40-byte message is one line, header and trailer included"
    );
    assert_eq!(RingLayout::new(1, 41).slot_size(), 128);
    assert_eq!(l.ring_offset(64, 1), 64 + l.ring_len());
}

#[test]
fn a_batch_is_one_data_write_then_the_counter() {
    let (mut f, l) = setup(8, 100);
    let ring0 = l.ring_offset(BASE, 0);
    let (p, mut sp) = sender(f[0].region().clone(), ring0, l);
    for i in 0..5u8 {
        assert!(send(&p, &[i; 10]));
    }
    assert_eq!(sp.ready(), 5);
    let plan = sp.plan(u64::MAX).unwrap();
    assert_eq!((plan.first, plan.end), (0, 5));
    assert!(plan.data[1].is_none(), "no wrap: one data write");
    assert_eq!(
        plan.data[0].unwrap(),
        (ring0 + 64, 4 * l.slot_size() + MESSAGE_HEADER_LEN + 10),
        "last slot trimmed"
    );
    assert_eq!(SendPath::post(&plan, &mut f[0], &[1]).unwrap(), 2);
    let mut rx = RingReceiver::new(f[1].region().clone(), ring0, l);
    let mut metas = Vec::new();
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 5);
    for (i, m) in metas.iter().enumerate() {
        assert_eq!((m.index, m.len, m.flags), (i as u64, 10, 0));
        assert_eq!(rx.payload(m), &[i as u8; 10]);
    }
    assert!(sp.plan(u64::MAX).is_none(), "nothing new to push");
}

#[test]
fn a_wrapping_batch_is_two_data_writes() {
    let (mut f, l) = setup(4, 16);
    let ring0 = l.ring_offset(BASE, 0);
    let (p, mut sp) = sender(f[0].region().clone(), ring0, l);
    let mut rx = RingReceiver::new(f[1].region().clone(), ring0, l);
    for i in 0..3u8 {
        send(&p, &[i; 16]);
    }
    let plan = sp.plan(u64::MAX).unwrap();
    SendPath::post(&plan, &mut f[0], &[1]).unwrap();
    let mut metas = Vec::new();
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 3);
    rx.consume(3);
    sp.set_reclaimable(3);
    for i in 3..7u8 {
        assert!(send(&p, &[i; 16]), "slot {i} reusable");
    }
    let plan = sp.plan(u64::MAX).unwrap();
    assert_eq!((plan.first, plan.end), (3, 7));
    assert_eq!(plan.data[0].unwrap().0, ring0 + 64 + 3 * l.slot_size());
    assert_eq!(plan.data[1].unwrap().0, ring0 + 64, "wrapped part starts at slot 0");
    assert_eq!(SendPath::post(&plan, &mut f[0], &[1]).unwrap(), 3);
    let mut metas = Vec::new();
    metas.clear();
    rx.scan(u64::MAX, &mut metas).unwrap();
    let got: Vec<u8> = metas.iter().map(|m| rx.payload(m)[0]).collect();
    assert_eq!(got, vec![3, 4, 5, 6]);
}

#[test]
fn without_reclaim_the_window_applies_back_pressure() {
    let (f, l) = setup(3, 8);
    let (p, mut sp) = sender(f[0].region().clone(), l.ring_offset(BASE, 0), l);
    assert!(send(&p, b"a") && send(&p, b"b") && send(&p, b"c"));
    assert!(!send(&p, b"d"), "window full");
    sp.plan(u64::MAX).unwrap();
    assert!(!send(&p, b"d"), "published is not reclaimable");
    sp.set_reclaimable(1);
    assert!(send(&p, b"d"));
    assert!(!send(&p, b"e"));
}

#[test]
fn publish_waits_for_earlier_reservations() {
    let (f, l) = setup(8, 8);
    let (p, mut sp) = sender(f[0].region().clone(), l.ring_offset(BASE, 0), l);
    let first = p.try_acquire().unwrap();
    let mut second = p.try_acquire().unwrap();
    second.payload()[0] = 2;
    second.commit(1, 0);
    assert_eq!(sp.ready(), 0, "message 1 waits for message 0");
    first.commit(0, 7);
    assert_eq!(sp.ready(), 2);
    let plan = sp.plan(1).unwrap();
    assert_eq!(plan.messages(), 1, "limit respected (batching off)");
}

#[test]
fn a_dropped_guard_commits_an_abandoned_message() {
    let (f, l) = setup(8, 8);
    let (p, mut sp) = sender(f[0].region().clone(), l.ring_offset(BASE, 0), l);
    drop(p.try_acquire().unwrap());
    assert_eq!(sp.ready(), 1);
    sp.plan(u64::MAX).unwrap();
    let rx = RingReceiver::new(f[0].region().clone(), l.ring_offset(BASE, 0), l);
    assert_eq!(rx.meta(0).unwrap().flags, SlotGuard::ABANDONED);
}

#[test]
fn lying_headers_and_counters_are_errors_that_change_nothing() {
    let (f, l) = setup(4, 16);
    let ring = l.ring_offset(BASE, 1);
    let r = f[1].region();
    let mut rx = RingReceiver::new(r.clone(), ring, l);
    // The "sender" claims one message whose header says 1000 bytes.
    r.atomic_u64(ring + 64).store(1000, std::sync::atomic::Ordering::Relaxed);
    r.atomic_u64(ring + 72).store(1, std::sync::atomic::Ordering::Relaxed);
    r.store_release(ring, 1);
    let mut metas = Vec::new();
    assert_eq!(rx.scan(10, &mut metas), Err(RingError::BadLength { index: 0, len: 1000, max: 16 }));
    assert!(metas.is_empty());
    assert_eq!(rx.consumed(), 0);
    // Wrong index in the slot.
    r.atomic_u64(ring + 64).store(4, std::sync::atomic::Ordering::Relaxed);
    r.atomic_u64(ring + 72).store(10, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(rx.scan(10, &mut metas), Err(RingError::WrongIndex { index: 0, found: 9 }));
    // A zeroed slot is not message 0.
    r.atomic_u64(ring + 72).store(0, std::sync::atomic::Ordering::Relaxed);
    assert!(matches!(rx.scan(10, &mut metas), Err(RingError::WrongIndex { index: 0, .. })));
    // A counter beyond the window.
    r.store_release(ring, 5);
    assert!(matches!(rx.scan(10, &mut metas), Err(RingError::CounterTooFar { .. })));
}

#[test]
fn concurrent_producers_publish_every_message_exactly_once() {
    let (mut f, l) = setup(16, 16);
    let ring0 = l.ring_offset(BASE, 0);
    let (p, mut sp) = sender(f[0].region().clone(), ring0, l);
    let mut rx = RingReceiver::new(f[1].region().clone(), ring0, l);
    const PER: u64 = 2000;
    let producers: Vec<_> = (0..2u64)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut sent = 0;
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while sent < PER {
                    assert!(std::time::Instant::now() < deadline, "producer {t} stuck");
                    if let Some(mut g) = p.try_acquire() {
                        g.payload()[..16].copy_from_slice(&[(t * PER + sent).to_le_bytes(), [0; 8]].concat());
                        g.commit(16, 0);
                        sent += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut metas = Vec::new();
    let mut last_per_thread = [None::<u64>; 2];
    while seen.len() < 2 * PER as usize {
        if let Some(plan) = sp.plan(u64::MAX) {
            SendPath::post(&plan, &mut f[0], &[1]).unwrap();
        }
        metas.clear();
        let n = rx.scan(u64::MAX, &mut metas).unwrap();
        for m in &metas {
            let v = u64::from_le_bytes(rx.payload(m)[..8].try_into().unwrap());
            assert!(seen.insert(v), "message {v} twice");
            let t = (v / PER) as usize;
            assert!(last_per_thread[t].is_none_or(|last| last < v), "a producer's order was broken");
            last_per_thread[t] = Some(v);
        }
        rx.consume(n);
        sp.set_reclaimable(rx.consumed());
        std::thread::yield_now();
    }
    for h in producers {
        h.join().unwrap();
    }
}

#[test]
fn consume_is_checked_against_the_scan_not_the_peer_counter() {
    let (mut f, l) = setup(4, 16);
    let ring0 = l.ring_offset(BASE, 0);
    let (p, mut sp) = sender(f[0].region().clone(), ring0, l);
    send(&p, b"a");
    send(&p, b"b");
    SendPath::post(&sp.plan(u64::MAX).unwrap(), &mut f[0], &[1]).unwrap();
    let mut rx = RingReceiver::new(f[1].region().clone(), ring0, l);
    let mut metas = Vec::new();
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 2);
    // A lying peer rewinds its counter after our scan: consuming what we
    // validated must still work (no panic on peer input).
    f[1].region().store_release(ring0, 0);
    rx.consume(2);
    assert_eq!(rx.consumed(), 2);
}

#[test]
fn a_commit_rings_the_send_path_doorbell() {
    let (f, l) = setup(4, 16);
    let (p, _sp) = sender(f[0].region().clone(), l.ring_offset(BASE, 0), l);
    let bell = ordo_fabric::Doorbell::new_local();
    p.ring_on_commit(bell.clone());
    let token = bell.prepare_park();
    let before = bell.seq();
    send(&p, b"x");
    assert_eq!(bell.seq(), before + 1, "a parked send path is woken by the commit");
    bell.cancel(token);
}

fn setup_stamped(window: usize, max_payload: usize) -> (Vec<Loopback>, RingLayout) {
    let layout = RingLayout::new(window, max_payload).with_stamps(true);
    (loopback_group(2, BASE + layout.set_len(2)), layout)
}

/// A stamped ring's batch is its data writes alone (the trailer of its
/// last message included), and the receiver finds the messages by their
/// stamps with the counter never written; a wrapping batch is two writes.
#[test]
fn a_stamped_batch_is_one_write_without_a_counter() {
    let (mut f, l) = setup_stamped(4, 100);
    assert_eq!(l.slot_size(), RingLayout::new(4, 100).slot_size(), "stamps cost no slot space");
    let ring0 = l.ring_offset(BASE, 0);
    let (p, mut sp) = sender(f[0].region().clone(), ring0, l);
    let mut rx = RingReceiver::new(f[1].region().clone(), ring0, l);
    for i in 0..3u8 {
        assert!(send(&p, &[i; 10]));
    }
    let plan = sp.plan(u64::MAX).unwrap();
    assert_eq!(plan.guard, None);
    assert_eq!(
        plan.data[0].unwrap(),
        (ring0 + 64, 2 * l.slot_size() + MESSAGE_HEADER_LEN + 16 + 8),
        "ends at the trailer"
    );
    assert_eq!(SendPath::post(&plan, &mut f[0], &[1]).unwrap(), 1, "one write");
    assert_eq!(f[1].region().load_acquire(ring0), 0, "no counter reached the receiver");
    let mut metas = Vec::new();
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 3);
    assert_eq!(rx.published(), 3);
    for (i, m) in metas.iter().enumerate() {
        assert_eq!((m.index, m.len), (i as u64, 10));
        assert_eq!(rx.payload(m), &[i as u8; 10]);
    }
    rx.consume(3);
    sp.set_reclaimable(3);
    for i in 3..7u8 {
        assert!(send(&p, &[i; 10]));
    }
    let plan = sp.plan(u64::MAX).unwrap();
    assert_eq!(plan.writes().count(), 2, "wrapped: two data writes, no counter");
    SendPath::post(&plan, &mut f[0], &[1]).unwrap();
    metas.clear();
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 4);
    assert_eq!(metas.iter().map(|m| rx.payload(m)[0]).collect::<Vec<_>>(), vec![3, 4, 5, 6]);
    // Nothing more: the next slot holds message 3's stamp, not message 7's.
    rx.consume(4);
    metas.clear();
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 0);
}

/// A message whose header arrived but whose trailer did not (a write
/// landing in address order, seen half-way) is not there yet; once the
/// trailer lands, it is. A header claiming an impossible length is an
/// error that consumes nothing.
#[test]
fn a_stamped_message_counts_only_once_its_trailer_landed() {
    let (f, l) = setup_stamped(4, 64);
    let ring0 = l.ring_offset(BASE, 0);
    let (p, mut sp) = sender(f[0].region().clone(), ring0, l);
    let mut rx = RingReceiver::new(f[1].region().clone(), ring0, l);
    assert!(send(&p, &[7; 40]));
    let plan = sp.plan(u64::MAX).unwrap();
    let (off, len) = plan.data[0].unwrap();
    let (src, dst) = (f[0].region(), f[1].region());
    let copy = |from: usize, to: usize| {
        // SAFETY: in-bounds ranges of two distinct heap regions.
        unsafe { ordo_fabric::copy_untorn(dst.as_ptr().add(from), src.as_ptr().add(from), to - from) }
    };
    let mut metas = Vec::new();
    // Header and half the payload.
    copy(off, off + MESSAGE_HEADER_LEN + 20);
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 0, "no trailer yet");
    // Everything but the trailer.
    copy(off, off + len - 8);
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 0, "no trailer yet");
    copy(off, off + len);
    assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 1);
    assert_eq!(rx.payload(&metas[0]), &[7; 40]);
    rx.consume(1);
    // A lying header: stamp right, length impossible.
    let hdr = ring0 + 64 + l.slot_size();
    dst.atomic_u64(hdr).store(1000, std::sync::atomic::Ordering::Relaxed);
    dst.atomic_u64(hdr + 8).store(2, std::sync::atomic::Ordering::Relaxed);
    metas.clear();
    assert_eq!(rx.scan(u64::MAX, &mut metas), Err(RingError::BadLength { index: 1, len: 1000, max: 64 }));
    assert!(metas.is_empty());
    assert_eq!(rx.consumed(), 1);
}

/// Under a concurrent copier that lands each batch ascending, word by
/// word (what shm and tcp do), a stamped receiver never returns a message
/// whose payload is not complete: every payload is its index repeated.
/// (On a fabric without address order this could fail; the engines use
/// stamps only where `Fabric::address_ordered` says so.)
#[test]
fn a_stamped_receiver_never_sees_a_torn_message_under_a_concurrent_copier() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, mpsc};
    let l = RingLayout::new(8, 16 << 10).with_stamps(true);
    let (src, dst) = (Region::new_heap(BASE + l.set_len(1)), Region::new_heap(BASE + l.set_len(1)));
    let ring0 = l.ring_offset(BASE, 0);
    let (p, mut sp) = sender(src.clone(), ring0, l);
    let consumed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    const N: u64 = 5_000;
    // The "fabric": takes each write's bytes when it is posted (as every
    // address-ordered backend does: capability 8) and lands them later,
    // in posting order, ascending, a KiB at a time with a pause between
    // (a slow link: the window a reader must not use).
    let (tx, rx_plans) = mpsc::channel::<Vec<(usize, Vec<u8>)>>();
    let copier = {
        let dst = dst.clone();
        std::thread::spawn(move || {
            for writes in rx_plans {
                for (off, bytes) in writes {
                    for at in (0..bytes.len()).step_by(1024) {
                        let n = 1024.min(bytes.len() - at);
                        // SAFETY: an in-bounds range of the region; the
                        // source is this thread's own buffer.
                        unsafe {
                            ordo_fabric::copy_untorn(dst.as_ptr().add(off + at), bytes[at..].as_ptr(), n)
                        };
                        for _ in 0..100 {
                            std::hint::spin_loop();
                        }
                    }
                }
            }
        })
    };
    let reader = {
        let (dst, consumed, done) = (dst.clone(), consumed.clone(), done.clone());
        std::thread::spawn(move || {
            let mut rx = RingReceiver::new(dst, ring0, l);
            let mut metas = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while rx.consumed() < N {
                assert!(std::time::Instant::now() < deadline, "reader stuck at {}", rx.consumed());
                metas.clear();
                let n = rx.scan(u64::MAX, &mut metas).expect("well-formed");
                for m in &metas {
                    let want = (m.index % 251) as u8;
                    let len = 8 + (m.index as usize * 997) % 16_000;
                    assert_eq!(m.len, len, "message {}: length", m.index);
                    assert!(rx.payload(m).iter().all(|b| *b == want), "message {} torn", m.index);
                }
                rx.consume(n);
                consumed.store(rx.consumed(), Ordering::Release);
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut sent = 0u64;
    // (A reader that panicked ends the loop: its join reports why.)
    while !done.load(Ordering::Acquire) && !reader.is_finished() {
        assert!(std::time::Instant::now() < deadline, "writer stuck at {sent}");
        sp.set_reclaimable(consumed.load(Ordering::Acquire).min(sp.published()));
        while sent < N {
            let Some(mut g) = p.try_acquire() else { break };
            let len = 8 + (sent as usize * 997) % 16_000;
            g.payload()[..len].fill((sent % 251) as u8);
            g.commit(len, 0);
            sent += 1;
        }
        if let Some(plan) = sp.plan(u64::MAX) {
            assert_eq!(plan.guard, None);
            let writes = plan
                .writes()
                .map(|(off, len)| {
                    let mut bytes = vec![0; len];
                    src.read_bytes(off, &mut bytes);
                    (off, bytes)
                })
                .collect();
            tx.send(writes).expect("copier alive");
        }
        std::thread::yield_now();
    }
    drop(tx);
    reader.join().expect("reader");
    copier.join().expect("copier");
}

/// What the simulator found: a message whose header landed while the rest
/// of its write had not, over a trailer position holding an older
/// message's last payload word — zero-padded, a small number, here exactly
/// `k + 1`. That is not the trailer stamp; only the real one counts.
#[test]
fn a_stale_payload_word_is_not_a_trailer() {
    let (f, l) = setup_stamped(1, 64);
    let ring0 = l.ring_offset(BASE, 0);
    let r = f[1].region();
    let mut rx = RingReceiver::new(r.clone(), ring0, l);
    for k in 0..3u64 {
        let hdr = ring0 + 64;
        let trailer = hdr + MESSAGE_HEADER_LEN + 40;
        r.atomic_u64(hdr).store(38, std::sync::atomic::Ordering::Relaxed);
        r.atomic_u64(hdr + 8).store(k + 1, std::sync::atomic::Ordering::Relaxed);
        // An older message's last payload byte, zero-padded: `k + 1`.
        r.atomic_u64(trailer).store(k + 1, std::sync::atomic::Ordering::Relaxed);
        let mut metas = Vec::new();
        assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 0, "message {k}: a payload word is no trailer");
        r.atomic_u64(trailer).store(trailer_stamp(k), std::sync::atomic::Ordering::Relaxed);
        assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 1, "message {k}: its trailer landed");
        rx.consume(1);
    }
    // No stamp of the first million messages is a small number (a stale
    // zero-padded payload word), or 0 (zeroed memory).
    assert!((0..1_000_000u64).all(|k| trailer_stamp(k) > u64::from(u32::MAX)));
}

/// A scanned message is still there while its slot is untouched; once its
/// sender overwrites the slot past the reuse rule (a new session zeroing
/// the ring, or writing its own message 0 with other flags), in either
/// layout, it is not.
#[test]
fn a_scanned_message_is_still_there_until_its_slot_is_overwritten() {
    for stamped in [false, true] {
        let (mut f, l) = if stamped { setup_stamped(4, 100) } else { setup(4, 100) };
        let ring0 = l.ring_offset(BASE, 0);
        let (p, mut sp) = sender(f[0].region().clone(), ring0, l);
        let mut rx = RingReceiver::new(f[1].region().clone(), ring0, l);
        for i in 0..2u8 {
            assert!(send(&p, &[i; 10]));
        }
        SendPath::post(&sp.plan(u64::MAX).unwrap(), &mut f[0], &[1]).unwrap();
        let mut metas = Vec::new();
        assert_eq!(rx.scan(u64::MAX, &mut metas).unwrap(), 2);
        assert!(metas.iter().all(|m| rx.still_there(m)), "untouched (stamped: {stamped})");
        // Message 0's slot zeroed, as a new session does.
        let slot0 = ring0 + RING_HEADER_LEN;
        f[1].region().write_bytes(slot0, &vec![0; l.slot_size()]);
        assert!(!rx.still_there(&metas[0]) && rx.still_there(&metas[1]), "zeroed (stamped: {stamped})");
        // A new session's message 0: the same index, length and stamps,
        // other flags.
        let (p2, mut sp2) = sender(f[0].region().clone(), ring0, l);
        match p2.try_acquire() {
            Some(mut g) => {
                g.payload()[..10].copy_from_slice(&[0; 10]);
                g.commit(10, 7);
            }
            None => panic!("a fresh ring has room"),
        }
        SendPath::post(&sp2.plan(u64::MAX).unwrap(), &mut f[0], &[1]).unwrap();
        assert!(!rx.still_there(&metas[0]), "another session's message 0 (stamped: {stamped})");
    }
}
