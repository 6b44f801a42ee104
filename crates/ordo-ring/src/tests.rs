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
    assert_eq!(l.slot_size(), 64 + 128);
    assert_eq!(l.ring_len(), 64 + 4 * 192);
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
    assert_eq!(plan.data[0].unwrap(), (ring0 + 64, 4 * l.slot_size() + 64 + 10), "last slot trimmed");
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
