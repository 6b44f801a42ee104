//! Seeded simulation of the Acuerdo engine (see `src/acuerdo.rs` for
//! what a seed draws and what is checked): fresh seeds every run, pinned
//! seeds, determinism, and a bad history that every checker must reject.

use ordo_simulation::acuerdo as common;

use common::{AcEvent, Params};
use ordo_acuerdo::{Epoch, Header};
use ordo_sim::{Checker, FaultNote, History, SeedBatch};

/// Seeds that must keep passing. Each found a bug in an earlier version:
/// 1006 (followers took a restarted leader's new heartbeat for their
/// leader's: no election), 1008 (a diff reached a follower before the
/// leader's row: election storm), 1052 (a long diff outlived the election
/// timeout: abdication loop), 1098 (catch-up slower than the load with a
/// window of 2); 779912 (a candidate of a smaller epoch won with a stale
/// vote after a bigger epoch committed: the up-to-date checker now compares
/// epochs, as the paper states the property); 904066 (slots freed by an
/// ack were refilled only at the next poll: catch-up too slow to drain);
/// 1795635509833003969 (a reconnected link was reset only at the driver's
/// next event poll, so one poll went on with the old ring session over the
/// new link, and a member that had lost writes with the failure won an
/// election without a committed message: leader-up-to-date violated);
/// 1795812687847933577 and 1795812713054347380 (a checker false positive:
/// an old epoch's message committed only by a bigger epoch's diff was
/// required of a stale winner of a smaller epoch, which commits nothing;
/// the checker now dates a commit by the epoch it was delivered in);
/// 1993, 3575 and 8165 (epochs of 2-3 messages: a leader renewing its full
/// epoch restarted the state transfer of a restarted member every few
/// messages, which never caught up; renewal now waits for catch-ups).
const PINNED: &[u64] = &[
    0,
    1,
    2,
    42,
    1006,
    1008,
    1052,
    1098,
    1993,
    3575,
    8165,
    779_912,
    904_066,
    1_795_635_509_833_003_969,
    1_795_812_687_847_933_577,
    1_795_812_713_054_347_380,
    0xDEAD_BEEF,
];

#[test]
fn fresh_seeds() {
    ordo_simulation::assert_fresh_seeds(common::NAME, 500);
}

/// Fresh seeds whose fabric writes often land in two steps (lower part
/// first): a stamped ring never hands on a half-landed message, and a ring
/// session reset's zeroing lands ahead of the new session's data.
#[test]
fn fresh_seeds_with_writes_landing_in_two_steps() {
    let opts = ordo_sim::RunOptions { split_land_ppm: Some(300_000), ..ordo_sim::RunOptions::default() };
    ordo_simulation::assert_fresh_seeds_with(common::NAME, 300, &opts);
}

#[test]
#[ignore]
fn failure_census() {
    let batch = SeedBatch::from_env(500);
    let mut kinds = std::collections::BTreeMap::new();
    let mut examples = std::collections::BTreeMap::new();
    for s in batch.seeds() {
        if let Err(e) = common::run(s) {
            let k = e.split(':').nth(1).unwrap_or("").trim().to_string();
            *kinds.entry(k.clone()).or_insert(0) += 1;
            examples.entry(k).or_insert(e);
        }
    }
    for (k, n) in &kinds {
        eprintln!("{n:4} {k}\n     e.g. {}", examples[k]);
    }
}

#[test]
#[ignore]
fn trace_seed() {
    let seed: u64 = std::env::var("SEED").unwrap().parse().unwrap();
    let mut p = Params::draw(seed);
    p.trace = true;
    let h = common::simulate(seed, &p);
    for f in &h.faults {
        eprintln!("{:>9} FAULT {:?}", f.time_ns, f.fault);
    }
    for e in &h.entries {
        match &e.event {
            AcEvent::Deliver { .. } | AcEvent::Broadcast { .. } => {}
            ev => eprintln!("{:>9} m{}.{} {:?}", e.time_ns, e.member, e.incarnation, ev),
        }
    }
    let _ = ordo_sim::check_all(&h, &common::checkers()).map_err(|v| eprintln!("{v}"));
}

#[test]
fn pinned_seeds() {
    ordo_simulation::assert_pinned_seeds(common::NAME, PINNED);
}

#[test]
fn same_seed_same_history() {
    let p = Params::draw(777);
    let a = common::simulate(777, &p);
    let b = common::simulate(777, &p);
    assert_eq!(a, b, "same seed, different history");
    assert_ne!(a.digest(), common::simulate(778, &Params::draw(778)).digest());
}

#[test]
fn without_faults_everything_commits_everywhere() {
    for seed in 0..20 {
        let mut p = Params::draw(seed);
        p.faults = false;
        let h = common::simulate(seed, &p);
        let checkers: Vec<Box<dyn Checker<AcEvent>>> = common::checkers().into_iter().take(7).collect();
        ordo_sim::check_all(&h, &checkers).unwrap_or_else(|v| panic!("seed {seed}: {v}"));
        let leaders: Vec<u32> = h
            .entries
            .iter()
            .filter_map(|e| match e.event {
                AcEvent::Elected { epoch, .. } => Some(Header::decode(epoch).epoch.leader),
                _ => None,
            })
            .collect();
        let renewed = h.entries.iter().filter(|e| matches!(e.event, AcEvent::EpochRenewed { .. })).count();
        // One election at the start, and one per full epoch its leader
        // renewed (`Params::epoch_messages`), which it wins again.
        assert_eq!(leaders.len(), 1 + renewed, "seed {seed}: elections only at the start and at renewals");
        assert!(leaders.iter().all(|l| *l == leaders[0]), "seed {seed}: one leader throughout: {leaders:?}");
        let delivered = h.entries.iter().filter(|e| matches!(e.event, AcEvent::Deliver { .. })).count();
        assert!(delivered > 100 * p.members as usize, "seed {seed}: {delivered} deliveries");
    }
}

/// Log garbage collection is on in drawn runs (the engine's default):
/// elections are won with a truncated log and restarted members catch up
/// by state transfer, and every checker passes. With the switch off (the
/// log kept whole, catch-up by replay), every checker passes too.
#[test]
fn log_gc_on_and_off() {
    let mut truncated_winners = 0;
    for seed in 0..240 {
        let mut p = Params::draw(seed);
        p.log_gc = seed % 2 == 0;
        p.faults = seed % 6 != 0;
        let h = std::panic::catch_unwind(|| common::simulate(seed, &p))
            .unwrap_or_else(|_| panic!("seed {seed} (log_gc {}) panicked", p.log_gc));
        ordo_sim::check_all(&h, &common::checkers())
            .unwrap_or_else(|v| panic!("seed {seed} (log_gc {}, faults {}): {v}", p.log_gc, p.faults));
        let restores = h.entries.iter().filter(|e| matches!(e.event, AcEvent::Restored { .. })).count();
        if !p.log_gc {
            assert_eq!(restores, 0, "seed {seed}: state transfer with log_gc off");
        }
        truncated_winners += h
            .entries
            .iter()
            .filter(|e| matches!(e.event, AcEvent::Elected { floor, .. } if floor != 0))
            .count();
    }
    eprintln!("log_gc: {truncated_winners} elections won with a truncated log");
    assert!(truncated_winners > 50, "only {truncated_winners} elections won with a truncated log");
}

/// The seeds exercise what they claim: leader crashes, restarts that catch
/// up from a diff, repeated elections, partitions.
#[test]
fn seeds_cover_the_interesting_paths() {
    let (mut crashes, mut restarts, mut elections, mut splits, mut leader_crashes) = (0, 0, 0, 0, 0);
    let (mut restores, mut restored_msgs, mut renewals) = (0, 0, 0);
    for seed in 2000..2060 {
        let h = common::simulate(seed, &Params::draw(seed));
        ordo_sim::check_all(&h, &common::checkers()).unwrap_or_else(|v| panic!("seed {seed}: {v}"));
        let mut leader = None;
        let mut events: Vec<(u64, Option<&AcEvent>, Option<&FaultNote>)> = h
            .entries
            .iter()
            .map(|e| (e.time_ns, Some(&e.event), None))
            .chain(h.faults.iter().map(|f| (f.time_ns, None, Some(&f.fault))))
            .collect();
        events.sort_by_key(|e| e.0);
        for (_, ev, fault) in events {
            match (ev, fault) {
                (Some(AcEvent::Restored { count, .. }), _) => {
                    restores += 1;
                    restored_msgs += count;
                }
                (Some(AcEvent::EpochRenewed { .. }), _) => renewals += 1,
                (Some(AcEvent::Elected { epoch, .. }), _) => {
                    elections += 1;
                    leader = Some(Header::decode(*epoch).epoch.leader);
                }
                (_, Some(FaultNote::Crash { member })) => {
                    crashes += 1;
                    leader_crashes += usize::from(leader == Some(*member));
                }
                (_, Some(FaultNote::Restart { .. })) => restarts += 1,
                (_, Some(FaultNote::Split { .. })) => splits += 1,
                _ => {}
            }
        }
    }
    eprintln!(
        "60 seeds: {crashes} crashes ({leader_crashes} of the leader), {restarts} restarts, {elections} elections, {splits} splits, {restores} restores by state transfer ({restored_msgs} messages), {renewals} epochs renewed"
    );
    assert!(renewals > 100, "only {renewals} full epochs renewed");
    assert!(crashes > 60 && leader_crashes > 20 && restarts > 60 && elections > 120 && splits > 30);
    assert!(restores > 30, "only {restores} restores by state transfer");
}

// ---------------------------------------------------------------------------
// Every checker rejects a bad history.
// ---------------------------------------------------------------------------

fn hw(round: u32, leader: u32, count: u32) -> u64 {
    Epoch::new(round, leader).header(count).encode()
}

/// A good history: m0 leads (1,0) and sends two messages; all deliver
/// them; a calm; m1 leads (1,1) with both in its log and sends a third,
/// delivered everywhere.
fn good() -> History<AcEvent> {
    let mut h = History::new(3);
    let (a, b, c) = (hw(1, 0, 1), hw(1, 0, 2), hw(1, 1, 1));
    h.record(1, 0, 1, AcEvent::Elected { epoch: hw(1, 0, 0), log: vec![], floor: 0 });
    h.record(2, 0, 1, AcEvent::Broadcast { header: a, digest: 10 });
    h.record(3, 0, 1, AcEvent::Broadcast { header: b, digest: 11 });
    for m in 0..3 {
        h.record(4, m, 1, AcEvent::Deliver { header: a, digest: 10, epoch: hw(1, 0, 0) });
        h.record(5, m, 1, AcEvent::Deliver { header: b, digest: 11, epoch: hw(1, 0, 0) });
    }
    h.note(6, FaultNote::Calm);
    h.record(7, 1, 1, AcEvent::Elected { epoch: hw(1, 1, 0), log: vec![a, b], floor: 0 });
    h.record(8, 1, 1, AcEvent::Broadcast { header: c, digest: 12 });
    for m in 0..3 {
        h.record(9, m, 1, AcEvent::Deliver { header: c, digest: 12, epoch: hw(1, 1, 0) });
    }
    h
}

fn rejects(checker: &dyn Checker<AcEvent>, h: &History<AcEvent>) {
    let v = checker.check(h).expect_err("bad history accepted");
    eprintln!("{v}");
}

fn all_accept(h: &History<AcEvent>) {
    for c in common::checkers() {
        c.check(h).unwrap_or_else(|v| panic!("good history rejected: {v}"));
    }
}

#[test]
fn the_good_history_passes_every_checker() {
    all_accept(&good());
}

#[test]
fn integrity_rejects_unsent_or_altered_messages() {
    let mut h = good();
    h.record(10, 2, 1, AcEvent::Deliver { header: hw(7, 2, 1), digest: 1, epoch: hw(7, 2, 0) });
    rejects(&common::Integrity, &h);
    let mut h = good();
    if let AcEvent::Deliver { digest, .. } = &mut h.entries[4].event {
        *digest = 99;
    }
    rejects(&common::Integrity, &h);
}

#[test]
fn no_duplication_rejects_a_second_delivery() {
    let mut h = good();
    h.record(10, 2, 1, AcEvent::Deliver { header: hw(1, 0, 1), digest: 10, epoch: hw(1, 0, 0) });
    rejects(&common::NoDuplication, &h);
}

#[test]
fn total_order_rejects_diverging_members() {
    let mut h = History::new(2);
    let (a, b) = (hw(1, 0, 1), hw(1, 0, 2));
    h.record(1, 0, 1, AcEvent::Deliver { header: a, digest: 1, epoch: hw(1, 0, 0) });
    h.record(1, 0, 1, AcEvent::Deliver { header: b, digest: 2, epoch: hw(1, 0, 0) });
    h.record(1, 1, 1, AcEvent::Deliver { header: b, digest: 2, epoch: hw(1, 0, 0) });
    rejects(&common::TotalOrder, &h);
}

#[test]
fn one_leader_per_epoch_rejects_two_winners_and_reused_headers() {
    let mut h = good();
    h.record(10, 0, 1, AcEvent::Elected { epoch: hw(1, 1, 0), log: vec![], floor: 0 });
    rejects(&common::OneLeaderPerEpoch, &h);
    let mut h = good();
    h.record(10, 1, 2, AcEvent::Elected { epoch: hw(1, 1, 0), log: vec![], floor: 0 });
    rejects(&common::OneLeaderPerEpoch, &h);
    let mut h = good();
    h.record(10, 1, 1, AcEvent::Broadcast { header: hw(1, 1, 1), digest: 77 });
    rejects(&common::OneLeaderPerEpoch, &h);
}

#[test]
fn leader_up_to_date_rejects_a_leader_missing_a_committed_message() {
    let mut h = good();
    h.record(
        10,
        2,
        1,
        AcEvent::Elected { epoch: hw(2, 2, 0), log: vec![hw(1, 0, 1), hw(1, 1, 1)], floor: 0 },
    );
    rejects(&common::LeaderUpToDate, &h);
    // A candidate of an epoch smaller than one that committed (it won with
    // a stale vote; it can commit nothing) need not know that epoch's
    // messages, only those committed before its own epoch.
    let mut h = good();
    h.record(10, 2, 1, AcEvent::Elected { epoch: hw(0, 2, 0), log: vec![], floor: 0 });
    common::LeaderUpToDate.check(&h).expect("nothing was committed before (0,2)");
    // Log garbage collection: entries at or below the winner's floor may be
    // missing from its log if it delivered them itself, in this incarnation.
    let mut h = good();
    h.record(10, 2, 1, AcEvent::Elected { epoch: hw(2, 2, 0), log: vec![hw(1, 1, 1)], floor: hw(1, 0, 2) });
    common::LeaderUpToDate.check(&h).expect("the floor covers what m2 delivered");
    let mut h = good();
    h.record(10, 2, 2, AcEvent::Elected { epoch: hw(2, 2, 0), log: vec![hw(1, 1, 1)], floor: hw(1, 0, 2) });
    rejects(&common::LeaderUpToDate, &h); // a new incarnation delivered nothing
    let mut h = good();
    h.record(10, 2, 1, AcEvent::Elected { epoch: hw(2, 2, 0), log: vec![hw(1, 0, 2)], floor: hw(1, 0, 1) });
    rejects(&common::LeaderUpToDate, &h); // (1,1),1 is above the floor
    // Seeds 1795812687847933577 and 1795812713054347380: a message of an
    // old epoch that only a bigger epoch's diff committed (m0 had it alone
    // in (1,0); m0 won (3,0) and delivered it there) is not committed
    // before a stale winner of an epoch in between, (2,2).
    let mut h = good();
    let old = hw(1, 1, 2);
    h.record(10, 1, 1, AcEvent::Broadcast { header: old, digest: 13 });
    h.record(
        11,
        0,
        1,
        AcEvent::Elected {
            epoch: hw(3, 0, 0),
            log: vec![hw(1, 0, 1), hw(1, 0, 2), hw(1, 1, 1), old],
            floor: 0,
        },
    );
    h.record(12, 0, 1, AcEvent::Deliver { header: old, digest: 13, epoch: hw(3, 0, 0) });
    let stale =
        AcEvent::Elected { epoch: hw(2, 2, 0), log: vec![hw(1, 0, 1), hw(1, 0, 2), hw(1, 1, 1)], floor: 0 };
    h.record(13, 2, 1, stale.clone());
    common::LeaderUpToDate.check(&h).expect("(1,1),2 was committed in (3,0), after (2,2)");
    // Delivered in its own epoch (1,1) instead, it was committed before (2,2).
    let mut h = good();
    h.record(10, 1, 1, AcEvent::Broadcast { header: old, digest: 13 });
    h.record(11, 1, 1, AcEvent::Deliver { header: old, digest: 13, epoch: hw(1, 1, 0) });
    h.record(12, 2, 1, stale);
    rejects(&common::LeaderUpToDate, &h);
}

#[test]
fn no_committed_loss_rejects_a_survivor_without_the_prefix() {
    let mut h = good();
    h.note(10, FaultNote::Crash { member: 2 });
    h.note(11, FaultNote::Restart { member: 2, incarnation: 2 });
    h.record(12, 2, 2, AcEvent::Deliver { header: hw(1, 0, 1), digest: 10, epoch: hw(1, 0, 0) });
    rejects(&common::NoCommittedLoss, &h);
    // Dead at the end: not a survivor.
    h.note(13, FaultNote::Crash { member: 2 });
    common::NoCommittedLoss.check(&h).expect("only survivors count");
}

#[test]
fn liveness_rejects_a_run_without_progress_after_the_calm() {
    let mut h = good();
    h.entries.retain(|e| e.time_ns < 8);
    rejects(&common::Liveness, &h);
    let mut h = good();
    h.entries.retain(|e| !(e.member == 2 && e.time_ns == 9));
    rejects(&common::Liveness, &h);
}

#[test]
fn anomalies_are_reported() {
    let mut h = good();
    h.record(10, 1, 1, AcEvent::Anomaly { what: "post failed".into() });
    rejects(&common::Anomalies, &h);
}

/// `good()` plus m2 restarting (incarnation 2), restoring a snapshot of
/// the first two messages with `hash`, and delivering the third.
fn with_restore(count: u64, hash: u64, then: (u64, u64)) -> History<AcEvent> {
    let mut h = good();
    h.note(10, FaultNote::Crash { member: 2 });
    h.note(11, FaultNote::Restart { member: 2, incarnation: 2 });
    h.record(12, 2, 2, AcEvent::Restored { header: hw(1, 0, 2), count, hash });
    h.record(13, 2, 2, AcEvent::Deliver { header: then.0, digest: then.1, epoch: then.0 & !0xFFFF_FFFF });
    h
}

#[test]
fn restored_state_checks_snapshots_against_the_order() {
    let right = common::mix(common::mix(0, 10), 11);
    all_accept(&with_restore(2, right, (hw(1, 1, 1), 12)));
    rejects(&common::RestoredState, &with_restore(2, right ^ 1, (hw(1, 1, 1), 12)));
    // The header (1,0),2 is the second message: a snapshot of one message
    // cannot end there.
    rejects(&common::RestoredState, &with_restore(1, common::mix(0, 10), (hw(1, 1, 1), 12)));
    // Delivering after a restore continues at the snapshot's position.
    rejects(&common::TotalOrder, &with_restore(2, right, (hw(1, 0, 2), 11)));
    // A restore counts as delivering the prefix; without it m2 lost two.
    let mut h = with_restore(2, right, (hw(1, 1, 1), 12));
    h.entries.retain(|e| !matches!(e.event, AcEvent::Restored { .. }));
    rejects(&common::NoCommittedLoss, &h);
}
