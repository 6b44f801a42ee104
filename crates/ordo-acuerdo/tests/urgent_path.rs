//! The commit path of `AcuerdoDriver` (`Engine::poll_urgent`): at window 1
//! a commit takes one urgent step at each of leader, follower, leader —
//! none of them a full poll — and under any load a full poll still runs
//! at least every `URGENT_RUN_MAX + 1`-th poll of a member.

use ordo_acuerdo::{AcuerdoDriver, Header, Role, Settled, URGENT_RUN_MAX};
use ordo_fabric::loopback::Loopback;

#[path = "../examples/common/mod.rs"]
mod common;

/// An elected group, the time (ns) it got there (a few rounds after the
/// election: every follower joined, nothing is in flight), and its leader.
fn group(durable: bool) -> (Vec<AcuerdoDriver<Loopback>>, u64, usize) {
    let mut ds = common::loopback_drivers(durable);
    let mut t = 0;
    let now = common::elect(&mut ds, || {
        t += 10_000;
        t
    });
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    for _ in 0..8 {
        for d in ds.iter_mut() {
            d.poll(now, &mut sink, &mut settled);
        }
    }
    assert!(settled.is_empty());
    let leader = ds.iter().position(|d| d.engine().role() == Role::Leader).expect("a leader");
    (ds, now, leader)
}

/// Whether the driver's last poll was a full engine poll (only a full poll
/// sets the wake time in its effects).
fn was_full(d: &AcuerdoDriver<Loopback>) -> bool {
    d.effects().wake_at_ns.is_some()
}

#[test]
fn a_window_one_commit_is_three_urgent_steps() {
    let (mut ds, now, l) = group(false);
    let f = (l + 1) % 3;
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    let before = ds[f].engine().accepted();
    let h = ds[l].submit(7, b"payload").expect("the leader takes it");
    // 1. The leader's poll sends it, and does nothing else.
    assert!(ds[l].poll(now, &mut sink, &mut settled) > 0);
    assert!(!was_full(&ds[l]), "the leader's send was an urgent step");
    assert!(settled.is_empty());
    // 2. The follower's poll accepts and acknowledges it.
    assert!(ds[f].poll(now, &mut sink, &mut settled) > 0);
    assert!(!was_full(&ds[f]), "the follower's ack was an urgent step");
    assert_eq!(ds[f].engine().accepted(), h);
    assert!(ds[f].engine().accepted() > before);
    // 3. The leader's next poll commits it (a quorum: itself and f).
    ds[l].poll(now, &mut sink, &mut settled);
    assert!(!was_full(&ds[l]), "the leader's commit was an urgent step");
    assert_eq!(settled, vec![Settled::Committed { ticket: 7, header: h }]);
    assert_eq!(ds[l].engine().committed(), h);
}

#[test]
fn under_load_a_full_poll_runs_at_least_every_eighth_poll() {
    let (mut ds, start, l) = group(false);
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    let mut since_full = [0usize; 3];
    let mut urgent_polls = 0;
    let mut ticket = 0;
    let mut longest = 0;
    for round in 0..2_000u64 {
        let now = start + round * 1_000;
        for (i, d) in ds.iter_mut().enumerate() {
            // Keep the leader's window full: every poll has something to send.
            while i == l && d.unsettled() < 8 {
                ticket += 1;
                d.submit(ticket, b"x").expect("room in the window");
            }
            d.poll(now, &mut sink, &mut settled);
            if was_full(d) {
                since_full[i] = 0;
            } else {
                since_full[i] += 1;
                urgent_polls += 1;
            }
            assert!(
                since_full[i] <= URGENT_RUN_MAX as usize,
                "member {i}: {} polls in a row without a full one",
                since_full[i]
            );
            longest = longest.max(since_full[i]);
        }
    }
    assert!(urgent_polls > 1_000, "the commit path ran as urgent steps ({urgent_polls})");
    assert_eq!(longest, URGENT_RUN_MAX as usize, "under load the leader's runs reach the bound");
    assert!(settled.len() > 1_000, "messages commit under load ({})", settled.len());
    assert!(settled.iter().all(|s| matches!(s, Settled::Committed { .. })));
}

#[test]
fn durable_mode_takes_no_urgent_step() {
    let (mut ds, start, l) = group(true);
    let f = (l + 1) % 3;
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    ds[l].submit(1, b"payload").expect("the leader takes it");
    for round in 0..20u64 {
        for i in [l, f] {
            ds[i].poll(start + round, &mut sink, &mut settled);
            assert!(was_full(&ds[i]), "durable mode: every poll is a full one (the ack waits for persist)");
        }
    }
    assert!(matches!(settled.as_slice(), [Settled::Committed { ticket: 1, .. }]));
}

/// Broadcasts a full ring left behind are still unsent: the leader's next
/// urgent step puts them into the slots the follower's acks freed, without
/// waiting for a full poll.
#[test]
fn what_a_full_ring_left_behind_goes_out_in_the_next_urgent_step() {
    let (mut ds, now, l) = group(false);
    let f = (l + 1) % 3;
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    let slots = 16; // Config::new's window: slots of each ring
    let mut last = None;
    for ticket in 0..slots as u64 + 4 {
        last = Some(ds[l].submit(ticket, b"m").expect("room in max_outstanding"));
    }
    let last = last.unwrap();
    // The leader fills the ring to f (four are left behind); f takes them.
    assert!(ds[l].poll(now, &mut sink, &mut settled) > 0);
    assert!(!was_full(&ds[l]));
    assert!(ds[f].poll(now, &mut sink, &mut settled) > 0);
    assert!(!was_full(&ds[f]));
    assert!(ds[f].engine().accepted() < last, "a full ring held some back");
    // The leader's next urgent step (after a send step, the commit rule
    // runs first) commits what f acknowledged and sends the rest into the
    // freed slots; f's next urgent step takes them.
    assert!(ds[l].poll(now, &mut sink, &mut settled) > 0);
    assert!(!was_full(&ds[l]), "an urgent step");
    assert!(!settled.is_empty(), "the first ring's worth committed");
    assert!(ds[f].poll(now, &mut sink, &mut settled) > 0);
    assert!(!was_full(&ds[f]), "an urgent step");
    assert_eq!(ds[f].engine().accepted(), last, "the rest went out in the leader's urgent step");
}

/// The leader's commit rule reads first the quorum that let its last
/// commit through; when that quorum's follower stops acknowledging, the
/// other follower's ack still commits (the rule falls back to every row),
/// and from then on that follower is the one read first.
#[test]
fn a_silent_follower_of_the_last_quorum_does_not_stall_commits() {
    let (mut ds, now, l) = group(false);
    let (f1, f2) = ((l + 1) % 3, (l + 2) % 3);
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    // m1 commits through f1 alone (f2 never polls from here on).
    let h1 = ds[l].submit(1, b"m1").expect("the leader takes it");
    ds[l].poll(now, &mut sink, &mut settled);
    ds[f1].poll(now, &mut sink, &mut settled);
    ds[l].poll(now, &mut sink, &mut settled);
    ds[l].poll(now, &mut sink, &mut settled);
    assert_eq!(settled, vec![Settled::Committed { ticket: 1, header: h1 }]);
    // Now f1 falls silent and f2 catches up: m2 commits through f2.
    let h2 = ds[l].submit(2, b"m2").expect("the leader takes it");
    for _ in 0..4 {
        ds[l].poll(now, &mut sink, &mut settled);
    }
    assert_eq!(settled.len(), 1, "no quorum holds m2 before f2 takes it");
    for _ in 0..4 {
        ds[f2].poll(now, &mut sink, &mut settled);
    }
    assert_eq!(ds[f2].engine().accepted(), h2, "f2 accepted m1 and m2");
    for _ in 0..4 {
        ds[l].poll(now, &mut sink, &mut settled);
    }
    assert_eq!(settled.last(), Some(&Settled::Committed { ticket: 2, header: h2 }), "committed through f2");
    // m3 too, with f1 still silent.
    let h3 = ds[l].submit(3, b"m3").expect("the leader takes it");
    ds[l].poll(now, &mut sink, &mut settled);
    ds[f2].poll(now, &mut sink, &mut settled);
    ds[l].poll(now, &mut sink, &mut settled);
    ds[l].poll(now, &mut sink, &mut settled);
    assert_eq!(settled.last(), Some(&Settled::Committed { ticket: 3, header: h3 }));
    assert_eq!(ds[l].engine().committed(), h3);
}

/// With both followers level (every message acknowledged by both), the
/// leader's commit hint names the follower its broadcasts reach first,
/// the lower row (`send` walks the links in row order): at window 1 the
/// next commit then reads the line whose ack lands first, and commits
/// through it without reading every row.
#[test]
fn level_followers_leave_the_hint_on_the_one_posted_first() {
    let (mut ds, now, l) = group(false);
    let (f1, f2) = ((l + 1) % 3, (l + 2) % 3);
    let first = f1.min(f2) as u8;
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    for ticket in 1..=3u64 {
        let h = ds[l].submit(ticket, b"m").expect("the leader takes it");
        // Both followers take it; the leader commits and then runs full
        // polls (the next rows read are of the last full read).
        for _ in 0..4 {
            for d in ds.iter_mut() {
                d.poll(now, &mut sink, &mut settled);
            }
        }
        assert_eq!(settled.last(), Some(&Settled::Committed { ticket, header: h }));
        assert_eq!(ds[f1].engine().accepted(), h);
        assert_eq!(ds[f2].engine().accepted(), h);
        assert_eq!(ds[l].engine().commit_hint(), &[first], "level followers: the lower row is read first");
    }
    // The follower posted second alone takes the next message: the hinted
    // read finds nothing new, every row is read, and the hint moves to it.
    let second = f1.max(f2);
    let h = ds[l].submit(9, b"m").expect("the leader takes it");
    ds[l].poll(now, &mut sink, &mut settled);
    ds[second].poll(now, &mut sink, &mut settled);
    ds[l].poll(now, &mut sink, &mut settled);
    assert_eq!(settled.last(), Some(&Settled::Committed { ticket: 9, header: h }));
    assert_eq!(ds[l].engine().commit_hint(), &[second as u8]);
}

/// A periodic Commit push carries the head of the row (the acks, the
/// heartbeat and Commit), not the lines a follower reads on every receive
/// (ring sessions, votes, status, read_seq), so its cached copies of them
/// stay valid; the heartbeat's full push still refreshes every column.
#[test]
fn a_commit_push_carries_the_rows_head_and_the_heartbeat_the_whole_row() {
    let (mut ds, now, l) = group(false);
    let f = (l + 1) % 3;
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    let layout = ds[l].engine().layout().clone();
    let (c, row_l) = (layout.columns, l);
    let at_f =
        |ds: &[AcuerdoDriver<Loopback>], word: usize| ds[l].fabric().region_of(f as u32).load_acquire(word);
    let read_seq = layout.word(row_l, c.read_seq, 0);
    let commit = layout.word(row_l, c.commit, 0);
    assert!(layout.head_push.offset + layout.head_push.len <= layout.word(0, c.read_seq, 0));
    // A mark in f's copy of the leader's read_seq: only a full row push
    // overwrites it.
    let real = at_f(&ds, read_seq);
    ds[l].fabric().region_of(f as u32).store_release(read_seq, real + 1_000);
    // 20 µs later (past the Commit push interval, before the next
    // heartbeat) a message commits and its Commit goes out.
    let t1 = now + 20_000;
    let h = ds[l].submit(1, b"m").expect("the leader takes it");
    // (Polls at t1 and once more a push interval later: an earlier
    // Commit may have gone out at t1 and set the next push's time.)
    let interval = ds[l].engine().config().commit_push_interval_ns;
    for t in [t1, t1, t1, t1 + interval, t1 + interval] {
        for d in ds.iter_mut() {
            d.poll(t, &mut sink, &mut settled);
        }
    }
    assert_eq!(settled.last(), Some(&Settled::Committed { ticket: 1, header: h }));
    assert_eq!(at_f(&ds, commit), h.encode(), "the Commit push reached f");
    assert_eq!(at_f(&ds, read_seq), real + 1_000, "the Commit push left the rest of the row alone");
    // Past the heartbeat interval the whole row goes out again.
    let t2 = now + 2 * ds[l].engine().config().heartbeat_interval_ns;
    for _ in 0..4 {
        for d in ds.iter_mut() {
            d.poll(t2, &mut sink, &mut settled);
        }
    }
    assert_eq!(at_f(&ds, read_seq), real, "the heartbeat's full push refreshed every column");
}
