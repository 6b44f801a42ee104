//! Seeded simulation of ordo-dds over vsync view changes (see
//! `src/dds.rs`): fresh seeds every run, pinned seeds, determinism,
//! coverage of the interesting paths, and a bad history for every DDS
//! checker.

use ordo_dds::{QosLevel, TopicConfig};
use ordo_fabric::MemberId;
use ordo_sim::{Checker, History};
use ordo_simulation::dds as sim;
use ordo_simulation::vsync_views::{Params, ViewsEvent};
use std::sync::Arc;

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
    42,
    // A whole logged topic restarted from three logs of different lengths
    // (every member of it had crashed): positions diverged until a restore
    // with no holder started a new lineage.
    1_795_790_573_290_719_911,
    // A member crashed and rejoined in one view change (same id, new
    // incarnation): the restart is seen by its empty restore, not by ids.
    1_795_790_819_772_299_342,
    // Vsync: a suspicion installed the next view and the same poll reported
    // the old engine's counts for it (the leader panicked).
    1_795_790_900_102_686_267,
    // Joiners waited forever for a state larger than a simulated datagram
    // (the control plane carries 32 KiB chunks, as TCP does).
    1_795_790_422_424_809_416,
];

#[test]
fn pinned_seeds() {
    ordo_simulation::assert_pinned_seeds(sim::NAME, PINNED);
}

#[test]
fn same_seed_same_history() {
    let p = Params::draw_dds(77);
    let a = ordo_simulation::vsync_views::simulate(77, &p);
    let b = ordo_simulation::vsync_views::simulate(77, &p);
    assert_eq!(a, b);
    assert_ne!(sim::run(77).unwrap().0, sim::run(78).unwrap().0);
}

/// Over a few hundred seeds every path the checkers judge is taken: every
/// QoS level, restored histories, whole-topic restarts, logs replayed after
/// a power loss with samples in them.
#[test]
fn the_seeds_cover_restores_restarts_and_replays() {
    let (mut qos, mut restored, mut reset, mut replayed) = (std::collections::BTreeSet::new(), 0, 0, 0);
    for seed in 0..400u64 {
        let p = Params::draw_dds(seed);
        for t in p.dds.as_ref().unwrap().iter() {
            qos.insert(t.qos.name());
        }
        let h = ordo_simulation::vsync_views::simulate(seed, &p);
        for e in &h.entries {
            match &e.event {
                ViewsEvent::DdsRestored { history, .. } if !history.is_empty() => restored += 1,
                ViewsEvent::DdsReset { .. } => reset += 1,
                ViewsEvent::DdsRecovered { delivered, .. } if *delivered > 0 => replayed += 1,
                _ => {}
            }
        }
    }
    assert_eq!(qos.len(), 4, "{qos:?}");
    assert!(
        restored >= 20 && reset >= 2 && replayed >= 10,
        "restored {restored}, reset {reset}, replayed {replayed}"
    );
}

fn params(qos: QosLevel, history: usize) -> Params {
    let mut p = Params::draw_dds(5);
    p.group.subgroups.truncate(1);
    p.dds = Some(Arc::new(vec![TopicConfig {
        name: "t".into(),
        qos,
        publishers: p.group.subgroups[0].senders.clone(),
        subscribers: p.group.subgroups[0].members.clone(),
        max_sample: p.group.subgroups[0].max_payload,
        window: p.group.subgroups[0].window,
        history,
        type_name: String::new(),
    }]));
    p
}

fn checker(p: &Params, name: &str) -> Box<dyn Checker<ViewsEvent>> {
    sim::checkers(p).into_iter().find(|c| c.name().starts_with(name)).unwrap_or_else(|| panic!("{name}"))
}

fn history(entries: Vec<(MemberId, u64, ViewsEvent)>) -> History<ViewsEvent> {
    let mut h = History::new(3);
    for (i, (m, inc, e)) in entries.into_iter().enumerate() {
        h.record(i as u64, m, inc, e);
    }
    h
}

fn seen(position: u64, seq: u64, digest: u64) -> ViewsEvent {
    ViewsEvent::DdsSeen { topic: 0, view: 0, position, sender: 0, seq, digest }
}

#[test]
fn every_dds_checker_catches_its_violation() {
    let p = params(QosLevel::LoggedStorage, 3);
    // Two members disagree on the sample at a position.
    let bad = history(vec![(0, 1, seen(1, 0, 10)), (1, 1, seen(1, 1, 11))]);
    assert!(checker(&p, "dds positions").check(&bad).is_err());
    // A member sees a position twice.
    let bad = history(vec![(0, 1, seen(1, 0, 10)), (0, 1, seen(1, 0, 10))]);
    assert!(checker(&p, "dds positions").check(&bad).is_err());
    // A restored history disagrees with what others saw.
    let bad = history(vec![
        (0, 1, seen(1, 0, 10)),
        (1, 2, ViewsEvent::DdsRestored { topic: 0, digest: 5, delivered: 1, history: vec![(1, 0, 0, 99)] }),
        (1, 2, ViewsEvent::Restored { view: 1, subgroup: 0, count: 1, digest: 0 }),
    ]);
    assert!(checker(&p, "dds positions").check(&bad).is_err());
    // ... but after a whole-topic restart position 1 is a new sample.
    let ok = history(vec![
        (0, 1, seen(1, 0, 10)),
        (1, 2, ViewsEvent::DdsReset { topic: 0 }),
        (1, 2, ViewsEvent::Restored { view: 2, subgroup: 0, count: 0, digest: 0 }),
        (1, 2, ViewsEvent::DdsSeen { topic: 0, view: 2, position: 1, sender: 0, seq: 7, digest: 70 }),
    ]);
    assert!(checker(&p, "dds positions").check(&ok).is_ok());
    // A joiner restores a state nobody snapshotted for its view.
    let restored = |digest| {
        vec![
            (0, 1, ViewsEvent::DdsSnapshot { view: 1, topic: 0, digest: 5 }),
            (
                1,
                2,
                ViewsEvent::DdsRestored {
                    topic: 0,
                    digest,
                    delivered: 4,
                    history: vec![(2, 0, 1, 1), (3, 0, 2, 2), (4, 0, 3, 3)],
                },
            ),
            (1, 2, ViewsEvent::Restored { view: 1, subgroup: 0, count: 4, digest: 0 }),
        ]
    };
    assert!(checker(&p, "dds late-joiner").check(&history(restored(6))).is_err());
    assert!(checker(&p, "dds late-joiner").check(&history(restored(5))).is_ok());
    // A restored history that is not the last `history` positions.
    let bad = history(vec![
        (0, 1, ViewsEvent::DdsSnapshot { view: 1, topic: 0, digest: 5 }),
        (
            1,
            2,
            ViewsEvent::DdsRestored {
                topic: 0,
                digest: 5,
                delivered: 4,
                history: vec![(2, 0, 1, 1), (4, 0, 3, 3)],
            },
        ),
        (1, 2, ViewsEvent::Restored { view: 1, subgroup: 0, count: 4, digest: 0 }),
    ]);
    assert!(checker(&p, "dds late-joiner").check(&bad).is_err());
    // A power loss took a sample the member's subscriber had seen.
    let lost = history(vec![
        (0, 1, seen(1, 0, 10)),
        (0, 1, seen(2, 1, 11)),
        (0, 2, ViewsEvent::DdsRecovered { topic: 0, delivered: 1, history: vec![] }),
    ]);
    assert!(checker(&p, "dds logged storage").check(&lost).is_err());
    let kept = history(vec![
        (0, 1, seen(1, 0, 10)),
        (0, 1, seen(2, 1, 11)),
        (0, 2, ViewsEvent::DdsRecovered { topic: 0, delivered: 2, history: vec![] }),
    ]);
    assert!(checker(&p, "dds logged storage").check(&kept).is_ok());
    // Members of a topic end with different topic states.
    let p3 = params(QosLevel::VolatileStorage, 3);
    let mut entries: Vec<(MemberId, u64, ViewsEvent)> = Vec::new();
    for (i, m) in p3.group.members.iter().enumerate() {
        entries.push((*m, 1, ViewsEvent::FinalState { state: vec![(0, 0)] }));
        entries.push((*m, 1, ViewsEvent::DdsFinal { state: vec![(i as u64, 0)] }));
        entries.push((*m, 1, ViewsEvent::Finished));
    }
    let mut h = History::new(p3.group.members.len() as u32);
    for (i, (m, inc, e)) in entries.into_iter().enumerate() {
        h.record(i as u64, m, inc, e);
    }
    let err = checker(&p3, "liveness").check(&h).unwrap_err();
    assert!(format!("{err}").contains("topic 0"), "{err}");
}
