//! Seeded simulation of vsync view changes (see `src/vsync_views.rs` for
//! what is drawn and checked): fresh seeds every run, pinned seeds,
//! determinism, coverage of the interesting paths, and a bad history for
//! every checker.

use ordo_simulation::vsync_views as sim;

use ordo_fabric::MemberId;
use ordo_sim::{Checker, History};
use sim::ViewsEvent;

#[test]
fn fresh_seeds() {
    ordo_simulation::assert_fresh_seeds(sim::NAME, 500);
}

/// Seeds that must keep passing (add every seed that ever failed, with a
/// note).
const PINNED: &[u64] = &[
    0,
    1,
    2,
    3,
    42,
    5000,
    12345,
    0xDEAD_BEEF,
    // Found by the `dds` workload: a suspicion installed the next view and
    // the same poll's next suspicion reported the old engine's counts for
    // it; the leader proposed a decision that did not fit the view (panic).
    1_795_790_900_102_686_267,
];

#[test]
fn pinned_seeds() {
    ordo_simulation::assert_pinned_seeds(sim::NAME, PINNED);
}

#[test]
fn same_seed_same_history_and_different_seeds_differ() {
    let p = sim::Params::draw(31);
    let a = sim::simulate(31, &p);
    let b = sim::simulate(31, &p);
    assert_eq!(a, b, "histories entry by entry");
    let c = sim::run(32).unwrap();
    assert_ne!(sim::run(31).unwrap().0, c.0);
}

fn history(entries: Vec<(MemberId, ViewsEvent)>) -> History<ViewsEvent> {
    let mut h = History::new(3);
    for (i, (m, e)) in entries.into_iter().enumerate() {
        h.record(i as u64, m, 1, e);
    }
    h
}

/// Three members, all senders of one ordered subgroup.
fn three() -> ordo_vsync::GroupConfig {
    ordo_vsync::GroupConfig {
        members: vec![0, 1, 2],
        subgroups: vec![ordo_vsync::SubgroupConfig {
            name: String::new(),
            descriptor: Vec::new(),
            members: vec![0, 1, 2],
            senders: vec![0, 1, 2],
            window: 4,
            max_payload: 32,
            mode: ordo_vsync::DeliveryMode::Ordered,
        }],
        switches: ordo_vsync::Switches::SPINDLE,
    }
}

fn checker(name: &str) -> Box<dyn Checker<ViewsEvent>> {
    sim::checkers(&three())
        .into_iter()
        .find(|c| c.name().starts_with(name))
        .unwrap_or_else(|| panic!("{name}"))
}

fn sent(m: MemberId, index: u64) -> (MemberId, ViewsEvent) {
    (m, ViewsEvent::Sent { subgroup: 0, index })
}

fn delivered(m: MemberId, sender: MemberId, index: u64, view: u64) -> (MemberId, ViewsEvent) {
    let digest = ordo_sim::fnv64(&sim::payload(0, sender, index, 32));
    (m, ViewsEvent::Delivered { subgroup: 0, sender, index, view, digest })
}

fn installed(m: MemberId, view: u64, members: Vec<MemberId>) -> (MemberId, ViewsEvent) {
    let catalogue = three().subgroups.iter().map(|s| s.members.clone()).collect();
    (m, ViewsEvent::Installed { view, members, ragged: 0, resent: 0, catalogue })
}

#[test]
fn every_checker_catches_its_violation() {
    // Two members install different views 1.
    let h = history(vec![installed(0, 1, vec![0, 1]), installed(1, 1, vec![1, 2])]);
    assert!(checker("view agreement").check(&h).is_err());
    // A view of one member out of three is no majority.
    let h = history(vec![installed(0, 1, vec![0])]);
    assert!(checker("view agreement").check(&h).is_err());
    // Survivors of view 0 delivered different messages in it.
    let h = history(vec![
        sent(2, 0),
        delivered(0, 2, 0, 0),
        installed(0, 1, vec![0, 1]),
        installed(1, 1, vec![0, 1]),
    ]);
    assert!(checker("virtual synchrony").check(&h).is_err());
    // A member removed in view 1 delivered there.
    let h = history(vec![sent(0, 0), installed(1, 1, vec![0, 1]), delivered(2, 0, 0, 1)]);
    assert!(checker("delivery by members").check(&h).is_err());
    // Two members install view 1 with different catalogues; a catalogue
    // that shrinks; a declared member left out of the next one; a late
    // subscriber delivering before the view that took it in.
    let cat = |m: MemberId, view: u64, c: Vec<Vec<MemberId>>| {
        (m, ViewsEvent::Installed { view, members: vec![0, 1, 2], ragged: 0, resent: 0, catalogue: c })
    };
    let h = history(vec![cat(0, 1, vec![vec![0, 1, 2]]), cat(1, 1, vec![vec![0, 1]])]);
    assert!(checker("one catalogue").check(&h).is_err());
    let h = history(vec![cat(0, 1, vec![vec![0, 1, 2]]), cat(0, 2, vec![vec![0, 1]])]);
    assert!(checker("one catalogue").check(&h).is_err());
    let h = history(vec![(2, ViewsEvent::Declared { subgroup: 0 }), cat(2, 1, vec![vec![0, 1]])]);
    assert!(checker("one catalogue").check(&h).is_err());
    let h = history(vec![
        sent(0, 0),
        delivered(2, 0, 0, 0),
        (2, ViewsEvent::Declared { subgroup: 0 }),
        cat(2, 1, vec![vec![0, 1, 2]]),
    ]);
    let mut initial = three();
    initial.subgroups[0].members.retain(|m| *m != 2);
    let late_aware = sim::checkers_with(&three(), &initial);
    let membership = late_aware.iter().find(|c| c.name().starts_with("delivery by members")).unwrap();
    assert!(membership.check(&h).is_err());
    // Delivering in the view that took it in is fine.
    let h = history(vec![
        (2, ViewsEvent::Declared { subgroup: 0 }),
        cat(2, 1, vec![vec![0, 1, 2]]),
        sent(0, 0),
        delivered(2, 0, 0, 1),
    ]);
    membership.check(&h).unwrap_or_else(|v| panic!("{v}"));
    // Duplicate delivery across views.
    let h = history(vec![sent(0, 0), delivered(1, 0, 0, 0), delivered(1, 0, 0, 1)]);
    assert!(checker("integrity").check(&h).is_err());
    // Two members deliver two messages in opposite orders.
    let h = history(vec![
        sent(0, 0),
        sent(1, 0),
        delivered(0, 0, 0, 0),
        delivered(0, 1, 0, 0),
        delivered(2, 1, 0, 0),
        delivered(2, 0, 0, 0),
    ]);
    assert!(checker("total order").check(&h).is_err());
    // A running sender's message never delivered at a running member.
    let h = history(vec![sent(0, 0), delivered(0, 0, 0, 0)]);
    assert!(checker("no loss").check(&h).is_err());
    // Running members not finished.
    let h = history(vec![sent(0, 0)]);
    assert!(checker("liveness").check(&h).is_err());
    // And the same checkers accept a consistent history.
    let ok = history(vec![
        sent(0, 0),
        delivered(0, 0, 0, 0),
        delivered(1, 0, 0, 0),
        delivered(2, 0, 0, 0),
        (0, ViewsEvent::Finished),
        (1, ViewsEvent::Finished),
        (2, ViewsEvent::Finished),
    ]);
    for c in sim::checkers(&three()) {
        c.check(&ok).unwrap_or_else(|v| panic!("{v}"));
    }
}

/// Prints the history of `ORDO_DEBUG_SEED` (a debugging aid, not a check).
#[test]
#[ignore]
fn print_history() {
    let seed: u64 = std::env::var("ORDO_DEBUG_SEED").map(|s| s.parse().unwrap()).unwrap_or(0);
    let params = sim::Params::draw(seed);
    println!("{params:?}");
    let h = sim::simulate(seed, &params);
    for f in &h.faults {
        println!("{:>9} FAULT {:?}", f.time_ns, f.fault);
    }
    for e in &h.entries {
        println!("{:>9} m{} {:?}", e.time_ns, e.member, e.event);
    }
    println!("{:?}", ordo_sim::check_all(&h, &sim::checkers_for(&params)));
}

/// The seeds exercise what they claim to: view changes, ragged edges,
/// resends, minorities, removals, survivors that finish.
#[test]
fn seeds_cover_the_interesting_paths() {
    let (mut views, mut ragged, mut resent, mut minority, mut removed, mut survived, mut multi) =
        (0, 0, 0, 0, 0, 0, 0);
    let (mut restored, mut restored_state, mut late) = (0, 0, 0);
    let seeds = 300;
    for seed in 5000..5000 + seeds {
        let params = sim::Params::draw(seed);
        let h = sim::simulate(seed, &params);
        ordo_sim::check_all(&h, &sim::checkers_for(&params)).unwrap_or_else(|v| panic!("seed {seed}: {v}"));
        let mut top = 0;
        let mut finished = false;
        for e in &h.entries {
            match &e.event {
                sim::ViewsEvent::Installed { view, ragged: r, resent: s, .. } => {
                    top = top.max(*view);
                    ragged += usize::from(*r > 0);
                    resent += usize::from(*s > 0);
                }
                sim::ViewsEvent::Minority { .. } => minority += 1,
                sim::ViewsEvent::Restored { count, .. } => {
                    restored += 1;
                    restored_state += usize::from(*count > 0);
                }
                sim::ViewsEvent::Removed { .. } => removed += 1,
                sim::ViewsEvent::Declared { .. } => late += 1,
                sim::ViewsEvent::Finished => finished = true,
                _ => {}
            }
        }
        views += u32::from(top >= 1);
        multi += u32::from(top >= 2);
        survived += u32::from(top >= 1 && finished);
    }
    println!(
        "{seeds} seeds: {views} with a view change, {multi} with two or more, {survived} finished after one; \
         installs with a ragged edge {ragged}, with resends {resent}; minority stops {minority}, removals {removed}; \
         joiners' restores {restored} ({restored_state} with a non-empty state); late subscribers declared {late}"
    );
    assert!(late >= 40, "late subscribers declare themselves in ({late})");
    assert!(
        restored >= 50 && restored_state >= 20,
        "joiners restore state ({restored}, {restored_state} non-empty)"
    );
    assert!(views >= 60, "view changes happen ({views})");
    assert!(multi >= 10, "successive view changes happen ({multi})");
    assert!(survived >= 50, "survivors finish after a view change ({survived})");
    assert!(ragged >= 30 && resent >= 10, "ragged edges ({ragged}) and resends ({resent}) happen");
    assert!(minority >= 10 && removed >= 5, "minorities ({minority}) and removals ({removed}) happen");
}
