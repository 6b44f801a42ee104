//! Engine tests over the in-process loopback fabric: each test drives every
//! member's predicate loop and posts its pushes, like the runtime does.

use super::*;
use ordo_fabric::loopback::{Loopback, loopback_group};
use ordo_fabric::{Fabric, MemberId, Write};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Got {
    subgroup: usize,
    sender: MemberId,
    seq: i64,
    round: u64,
    payload: Vec<u8>,
}

struct Node {
    engine: Engine,
    fabric: Loopback,
    senders: Vec<Option<Sender>>,
    effects: Effects,
    got: Vec<Got>,
    upcalls: usize,
}

fn group(cfg: GroupConfig) -> Vec<Node> {
    let len = GroupLayout::new(&cfg).region_len;
    let fabrics = loopback_group(cfg.members.len(), len);
    fabrics
        .into_iter()
        .map(|fabric| {
            let (engine, senders) =
                Engine::with_peer_regions(cfg.clone(), fabric.member(), fabric.region().clone(), |p| {
                    fabric.peer_region(p)
                })
                .unwrap();
            Node { engine, fabric, senders, effects: Effects::default(), got: Vec::new(), upcalls: 0 }
        })
        .collect()
}

/// Polls every node once and posts its pushes; returns total work.
fn step(nodes: &mut [Node]) -> usize {
    step_with(nodes, |_| {})
}

/// [`step`], showing every push to `on_push` before it is posted.
fn step_with(nodes: &mut [Node], mut on_push: impl FnMut(&Push)) -> usize {
    let mut work = 0;
    for n in nodes.iter_mut() {
        n.effects.clear();
        let got = &mut n.got;
        let upcalls = &mut n.upcalls;
        work += n.engine.poll(&mut n.effects, &mut |batch: &[Delivered<'_>]| {
            *upcalls += 1;
            for d in batch {
                got.push(Got {
                    subgroup: d.subgroup,
                    sender: d.sender,
                    seq: d.seq,
                    round: d.round,
                    payload: d.payload.to_vec(),
                });
            }
        });
        for p in &n.effects.pushes {
            on_push(p);
            for peer in n.engine.peers(p.subgroup) {
                n.fabric.post_write(Write::new(peer, p.offset, p.len)).unwrap();
            }
        }
    }
    work
}

fn payload(sender: MemberId, k: u64) -> Vec<u8> {
    let len = 1 + ((sender as u64 * 31 + k * 7) % 40) as usize;
    (0..len).map(|i| (sender as u64 * 13 + k + i as u64) as u8).collect()
}

/// Each sender in `plan` sends its count of messages (as slots allow);
/// runs until nothing moves for a while. Returns the steps taken.
fn run(nodes: &mut [Node], g: usize, plan: &[(usize, u64)]) -> usize {
    let mut sent = vec![0u64; nodes.len()];
    let mut idle = 0;
    for steps in 0..200_000 {
        let mut work = 0;
        for &(i, count) in plan {
            let sender = nodes[i].senders[g].clone().expect("a sender");
            let me = nodes[i].engine.member();
            while sent[i] < count {
                let p = payload(me, sent[i]);
                match sender.try_send_with(p.len(), |buf| buf.copy_from_slice(&p)) {
                    Ok(()) => {
                        sent[i] += 1;
                        work += 1;
                    }
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("{e}"),
                }
                if sent[i].is_multiple_of(3) {
                    break; // interleave sending with the predicates
                }
            }
        }
        work += step(nodes);
        idle = if work == 0 { idle + 1 } else { 0 };
        if idle > 5 {
            return steps;
        }
    }
    panic!("did not settle");
}

fn cfg(members: u32, senders: &[u32], window: usize, switches: Switches) -> GroupConfig {
    GroupConfig {
        members: (0..members).collect(),
        subgroups: vec![SubgroupConfig {
            name: String::new(),
            descriptor: Vec::new(),
            members: (0..members).collect(),
            senders: senders.to_vec(),
            window,
            max_payload: 64,
            mode: DeliveryMode::Ordered,
        }],
        switches,
    }
}

/// The round-robin order every member must deliver (spindle §II-A).
fn expected_order(senders: &[u32], counts: &[u64]) -> Vec<(MemberId, u64)> {
    let rounds = counts.iter().copied().max().unwrap_or(0);
    let mut v = Vec::new();
    for k in 0..rounds {
        for (rank, s) in senders.iter().enumerate() {
            if k < counts[rank] {
                v.push((*s, k));
            }
        }
    }
    v
}

fn check_total_order(nodes: &[Node], senders: &[u32], counts: &[u64]) {
    let want = expected_order(senders, counts);
    for n in nodes {
        let got: Vec<(MemberId, u64)> = n.got.iter().map(|d| (d.sender, d.round)).collect();
        assert_eq!(got, want, "member {} delivered a different sequence", n.engine.member());
        for d in &n.got {
            assert_eq!(d.payload, payload(d.sender, d.round), "payload intact");
        }
        let seqs: Vec<i64> = n.got.iter().map(|d| d.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs increase");
    }
}

#[test]
fn all_senders_deliver_the_same_round_robin_sequence() {
    for switches in [Switches::SPINDLE, Switches::BASELINE] {
        let mut nodes = group(cfg(3, &[0, 1, 2], 4, switches));
        run(&mut nodes, 0, &[(0, 40), (1, 40), (2, 40)]);
        check_total_order(&nodes, &[0, 1, 2], &[40, 40, 40]);
        for n in &nodes {
            assert!(n.engine.is_idle(), "every slot reclaimed");
            assert_eq!(n.engine.stats(0).nulls_sent, 0, "equal senders need no nulls");
        }
    }
}

/// Zero-copy: the same total order and payloads, every slot reclaimed,
/// and not one byte of any ring posted (only SST columns travel); a
/// receiver's own region never holds another sender's ring data.
#[test]
fn zero_copy_delivers_the_same_sequence_without_posting_ring_data() {
    for base in [Switches::SPINDLE, Switches::BASELINE] {
        let switches = Switches { zero_copy: true, ..base };
        let c = cfg(3, &[0, 1, 2], 4, switches);
        let layout = GroupLayout::new(&c);
        let mut nodes = group(c);
        // Count the bytes posted into ring space.
        let rings = layout.sst_len..layout.region_len;
        let mut ring_bytes = 0usize;
        let mut sent = [0u64; 3];
        for _ in 0..20_000 {
            for (i, count) in sent.iter_mut().enumerate() {
                let sender = nodes[i].senders[0].clone().expect("a sender");
                let me = nodes[i].engine.member();
                if *count < 60 {
                    let p = payload(me, *count);
                    if sender.try_send_with(p.len(), |buf| buf.copy_from_slice(&p)).is_ok() {
                        *count += 1;
                    }
                }
            }
            step_with(&mut nodes, |p| {
                if rings.contains(&p.offset) {
                    ring_bytes += p.len;
                }
            });
            if nodes.iter().all(|n| n.got.len() == 180) {
                break;
            }
        }
        check_total_order(&nodes, &[0, 1, 2], &[60, 60, 60]);
        assert_eq!(ring_bytes, 0, "zero-copy posts no ring bytes ({base:?})");
        for _ in 0..10 {
            step(&mut nodes);
        }
        for n in &nodes {
            assert!(n.engine.is_idle(), "every slot reclaimed");
            // Member 0's copy of member 1's ring was never written.
            let ring1 = layout.ring(0, 1);
            if n.engine.member() != 1 {
                assert_eq!(n.fabric.region().load_acquire(ring1), 0, "no copy of a peer's ring counter");
            }
        }
    }
}

#[test]
fn batching_needs_fewer_pushes_than_the_baseline() {
    let pushes = |switches| {
        let mut nodes = group(cfg(3, &[0, 1, 2], 16, switches));
        run(&mut nodes, 0, &[(0, 200), (1, 200), (2, 200)]);
        check_total_order(&nodes, &[0, 1, 2], &[200, 200, 200]);
        let s = nodes[0].engine.stats(0).clone();
        (s.pushes, s.delivery_batches.mean(), nodes[0].upcalls)
    };
    let (base_pushes, base_batch, base_upcalls) = pushes(Switches::BASELINE);
    let (opt_pushes, opt_batch, opt_upcalls) = pushes(Switches::SPINDLE);
    assert!(opt_pushes * 2 < base_pushes, "pushes: spindle {opt_pushes}, baseline {base_pushes}");
    assert_eq!(base_batch, 1.0, "baseline delivers one at a time");
    assert!(opt_batch > 1.5, "opportunistic delivery batches, mean {opt_batch}");
    assert!(opt_upcalls < base_upcalls);
}

#[test]
fn null_sends_let_one_sender_run_alone_and_stop_when_it_stops() {
    let mut nodes = group(cfg(3, &[0, 1, 2], 4, Switches::SPINDLE));
    run(&mut nodes, 0, &[(1, 30)]);
    let want: Vec<(MemberId, u64)> = (0..30).map(|k| (1, k)).collect();
    for n in &nodes {
        let got: Vec<(MemberId, u64)> = n.got.iter().map(|d| (d.sender, d.round)).collect();
        assert_eq!(got, want, "member {} waited for silent senders", n.engine.member());
    }
    // Null rounds keep silent senders within one round of the active one.
    for i in [0usize, 2] {
        let nulls = nodes[i].engine.stats(0).nulls_sent;
        assert!((29..=30).contains(&nulls), "member {i} sent {nulls} null rounds");
    }
    assert_eq!(nodes[1].engine.stats(0).nulls_sent, 0);
    // Quiescence: with nobody sending, polling emits nothing.
    for _ in 0..20 {
        assert_eq!(step(&mut nodes), 0, "no work, no nulls, when nobody sends");
    }
}

#[test]
fn without_null_sends_a_silent_sender_stalls_delivery() {
    let mut switches = Switches::SPINDLE;
    switches.null_sends = false;
    let mut nodes = group(cfg(3, &[0, 1, 2], 4, switches));
    run(&mut nodes, 0, &[(1, 10)]);
    for n in &nodes {
        assert!(n.got.is_empty(), "M(1,0) follows M(0,0), which never comes");
    }
}

#[test]
fn declared_inactivity_sends_the_rounds_at_once() {
    let mut nodes = group(cfg(2, &[0, 1], 4, Switches::SPINDLE));
    nodes[0].senders[0].as_ref().unwrap().declare_inactive(1000);
    run(&mut nodes, 0, &[(1, 50)]);
    assert_eq!(nodes[0].engine.stats(0).nulls_sent, 1000);
    assert_eq!(nodes[0].engine.stats(0).null_slots, 1, "one slot carries the count");
    assert_eq!(nodes[1].got.len(), 50);
    assert_eq!(nodes[0].got.len(), 50);
    assert!(nodes[1].engine.stats(0).nulls_sent <= 1, "the active sender does not fill the declared rounds");
}

/// A declaration larger than one null slot can name (`NULL_COUNT_MASK - 1`
/// rounds) goes out in several slots instead of stopping the predicate
/// thread; delivery goes on past it.
#[test]
fn a_declaration_too_big_for_one_slot_goes_out_in_several() {
    let mut nodes = group(cfg(2, &[0, 1], 4, Switches::SPINDLE));
    let rounds = u64::from(NULL_COUNT_MASK) + 5;
    nodes[0].senders[0].as_ref().unwrap().declare_inactive(rounds);
    run(&mut nodes, 0, &[(1, 20)]);
    let stats = nodes[0].engine.stats(0);
    // (Plus a few null rounds to keep up with the active sender's 20.)
    assert!((rounds..=rounds + 20).contains(&stats.nulls_sent), "{} null rounds", stats.nulls_sent);
    assert!(stats.null_slots >= 2, "a full slot and the rest: {} slots", stats.null_slots);
    assert_eq!((nodes[0].got.len(), nodes[1].got.len()), (20, 20));
}

#[test]
fn non_senders_receive_and_never_send() {
    let mut nodes = group(cfg(4, &[1, 3], 4, Switches::SPINDLE));
    run(&mut nodes, 0, &[(1, 25), (3, 20)]);
    check_total_order(&nodes, &[1, 3], &[25, 20]);
    assert!(nodes[0].senders[0].is_none() && nodes[2].senders[0].is_none());
}

#[test]
fn unordered_mode_delivers_on_receipt_in_sender_order() {
    let mut c = cfg(3, &[0, 1], 4, Switches::SPINDLE);
    c.subgroups[0].mode = DeliveryMode::Unordered;
    let mut nodes = group(c);
    run(&mut nodes, 0, &[(0, 30)]);
    for n in &nodes {
        let got: Vec<u64> = n.got.iter().filter(|d| d.sender == 0).map(|d| d.round).collect();
        assert_eq!(got, (0..30).collect::<Vec<_>>(), "FIFO per sender, no waiting for sender 1");
        assert!(n.got.iter().all(|d| d.seq == -1));
    }
    assert!(nodes[0].engine.is_idle());
}

#[test]
fn subgroups_are_independent_and_one_thread_serves_them_all() {
    let sub = |members: Vec<u32>, senders: Vec<u32>| SubgroupConfig {
        name: String::new(),
        descriptor: Vec::new(),
        members,
        senders,
        window: 3,
        max_payload: 64,
        mode: DeliveryMode::Ordered,
    };
    let c = GroupConfig {
        members: vec![0, 1, 2, 3, 4],
        subgroups: vec![
            sub(vec![0, 1, 2], vec![0, 1, 2]),
            sub(vec![0, 1, 3], vec![0, 1]),
            sub(vec![0, 2, 4], vec![4]),
        ],
        switches: Switches::SPINDLE,
    };
    let mut nodes = group(c);
    run(&mut nodes, 1, &[(0, 10), (1, 10)]);
    run(&mut nodes, 2, &[(4, 7)]);
    for n in &nodes {
        let m = n.engine.member();
        let in_1 = n.got.iter().filter(|d| d.subgroup == 1).count();
        let in_2 = n.got.iter().filter(|d| d.subgroup == 2).count();
        assert_eq!(in_1, if [0, 1, 3].contains(&m) { 20 } else { 0 }, "member {m}");
        assert_eq!(in_2, if [0, 2, 4].contains(&m) { 7 } else { 0 }, "member {m}");
        assert!(n.got.iter().all(|d| d.subgroup != 0));
    }
}

#[test]
fn a_wedged_member_stops_sending_and_delivering() {
    let mut nodes = group(cfg(2, &[0, 1], 4, Switches::SPINDLE));
    nodes[0].engine.wedge();
    assert_eq!(nodes[0].senders[0].as_ref().unwrap().try_send_with(1, |_| {}), Err(SendError::Wedged));
    let s1 = nodes[1].senders[0].clone().unwrap();
    s1.try_send_with(1, |b| b[0] = 9).unwrap();
    for _ in 0..10 {
        step(&mut nodes);
    }
    assert!(nodes[0].got.is_empty(), "wedged member delivers nothing");
    let wedged = nodes[1].engine.layout().wedged;
    let sst = ordo_sst::Sst::new(
        nodes[1].fabric.region().clone(),
        0,
        nodes[1].engine.layout().sst.clone(),
        &[0, 1],
        1,
    )
    .unwrap();
    assert!(sst.flag(0, wedged), "the wedged flag reached the peer");
}

#[test]
fn a_peer_writing_garbage_into_its_ring_is_a_fault_not_a_panic() {
    for stamped_slots in [false, true] {
        let mut nodes = group(cfg(2, &[0, 1], 4, Switches { stamped_slots, ..Switches::SPINDLE }));
        assert_eq!(nodes[0].engine.layout().rings[0].stamped, stamped_slots);
        let ring = nodes[0].engine.layout().ring(0, 1);
        let r = nodes[0].fabric.region().clone();
        // "Member 1" claims message 0 (its stamp; and, counter-guarded, the
        // counter) with a header that says 1 MB.
        r.atomic_u64(ring + 64).store(1 << 20, std::sync::atomic::Ordering::Relaxed);
        r.atomic_u64(ring + 72).store(1, std::sync::atomic::Ordering::Relaxed);
        r.store_release(ring, 1);
        step(&mut nodes);
        assert_eq!(nodes[0].engine.faults().len(), 1, "stamped: {stamped_slots}");
        assert_eq!(nodes[0].engine.faults()[0].sender, 1);
        step(&mut nodes);
        assert_eq!(nodes[0].engine.faults().len(), 1, "reported once");
    }
}

#[test]
fn oversize_sends_and_bad_configs_are_refused() {
    let nodes = group(cfg(2, &[0, 1], 4, Switches::SPINDLE));
    let s = nodes[0].senders[0].as_ref().unwrap();
    assert_eq!(s.try_send_with(65, |_| {}), Err(SendError::TooLarge { len: 65, max: 64 }));
    let mut bad = cfg(2, &[0, 5], 4, Switches::SPINDLE);
    assert!(bad.validate().is_err());
    bad = cfg(2, &[0, 1], 0, Switches::SPINDLE);
    assert!(bad.validate().is_err());
    let c = cfg(2, &[0, 1], 4, Switches::SPINDLE);
    let small = ordo_fabric::Region::new_heap(64);
    assert!(Engine::new(c, 0, small).is_err(), "region too small");
}

#[test]
fn the_ragged_edge_is_delivered_alike_and_the_rest_is_listed_for_resending() {
    let mut nodes = group(cfg(3, &[0, 1], 8, Switches::SPINDLE));
    // Member 2 stops polling (it "dies") after the first messages: nothing
    // is stable beyond what it received, so the survivors hold a ragged
    // edge of received, undelivered messages.
    let s0 = nodes[0].senders[0].clone().unwrap();
    let s1 = nodes[1].senders[0].clone().unwrap();
    s0.try_send_with(3, |b| b.copy_from_slice(b"a-0")).unwrap();
    s1.try_send_with(3, |b| b.copy_from_slice(b"b-0")).unwrap();
    for _ in 0..10 {
        step(&mut nodes);
    }
    let (alive, _dead) = nodes.split_at_mut(2);
    for k in 1..4u8 {
        s0.try_send_with(3, |b| b.copy_from_slice(&[b'a', b'-', b'0' + k])).unwrap();
    }
    s1.try_send_with(3, |b| b.copy_from_slice(b"b-1")).unwrap();
    for _ in 0..10 {
        step(alive);
    }
    // Sender 0 commits one more message that it never publishes.
    alive[0].engine.wedge();
    alive[1].engine.wedge();
    s0.try_send_with(3, |b| b.copy_from_slice(b"a-9")).expect_err("a wedged member's handle refuses");
    let before: Vec<usize> = alive.iter().map(|n| n.got.len()).collect();
    assert_eq!(before, vec![2, 2], "only round 0 was stable while member 2 lived");
    let r0 = alive[0].engine.received_rounds();
    let r1 = alive[1].engine.received_rounds();
    // Sender 1 answered sender 0's rounds with nulls (null-sends on).
    assert_eq!(r0[0][0], 4);
    assert!(r0[0][1] >= 2);
    assert_eq!(r0, r1);
    step(alive);
    assert_eq!(alive[0].engine.received_rounds(), r0, "a wedged engine's counts are frozen");
    // The leader's trim for sender 0 is lower than what both received, as
    // when another survivor had received less.
    let trims = vec![vec![2, r0[0][1]]];
    for n in alive.iter_mut() {
        let got = &mut n.got;
        let delivered = n.engine.deliver_ragged(&trims, &mut |batch: &[Delivered<'_>]| {
            for d in batch {
                got.push(Got {
                    subgroup: 0,
                    sender: d.sender,
                    seq: d.seq,
                    round: d.round,
                    payload: d.payload.to_vec(),
                });
            }
        });
        assert_eq!(delivered, 2, "rounds 1 of both senders");
    }
    assert_eq!(alive[0].got, alive[1].got, "both survivors deliver the same ragged edge");
    let order: Vec<&[u8]> = alive[0].got.iter().map(|g| g.payload.as_slice()).collect();
    assert_eq!(order, vec![&b"a-0"[..], b"b-0", b"a-1", b"b-1"]);
    assert_eq!(
        alive[0].engine.undelivered_own(&trims),
        vec![(0, b"a-2".to_vec()), (0, b"a-3".to_vec())],
        "sender 0 resends its messages past the trim, in order"
    );
    assert!(alive[1].engine.undelivered_own(&trims).is_empty(), "sender 1 lost nothing");
}
