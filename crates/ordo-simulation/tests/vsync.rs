//! Seeded simulation checks of the vsync engine through the runtime's
//! `VsyncDriver` (see `src/vsync.rs` for what is drawn and checked): fresh
//! seeds every run, pinned seeds, determinism, and a bad history for every
//! checker.

use ordo_simulation::vsync as sim;

use ordo_fabric::MemberId;
use ordo_sim::{Checker, History, RunOptions, simulate};
use ordo_vsync::{DeliveryMode, GroupConfig, SubgroupConfig, Switches};
use sim::VsyncEvent;

#[test]
fn fresh_seeds() {
    ordo_simulation::assert_fresh_seeds(sim::NAME, 2000);
}

/// Fresh seeds whose fabric writes often land in two steps (lower part
/// first): stamped rings must never deliver a half-landed message, nor
/// counters publish one.
#[test]
fn fresh_seeds_with_writes_landing_in_two_steps() {
    ordo_simulation::assert_fresh_seeds_with(sim::NAME, 500, &split_landing());
}

fn split_landing() -> RunOptions {
    RunOptions { split_land_ppm: Some(300_000), ..RunOptions::default() }
}

/// Seeds with writes landing in two steps that once failed:
/// 1795777381327141288 (a stamped ring took message 3 as landed while only
/// its header had: the trailer stamp was `k + 1`, and the word at the
/// trailer's position — an older, longer message's last payload byte,
/// zero-padded — read 4. Trailer stamps are now `(k + 1) · C`).
const PINNED_SPLIT: &[u64] = &[1_795_777_381_327_141_288];

#[test]
fn pinned_seeds_with_writes_landing_in_two_steps() {
    ordo_simulation::assert_pinned_seeds_with(sim::NAME, PINNED_SPLIT, &split_landing());
}

/// Seeds that must keep passing (add every seed that ever failed, with a
/// note).
const PINNED: &[u64] = &[0, 1, 2, 3, 42, 12345, 0xDEAD_BEEF];

#[test]
fn pinned_seeds() {
    ordo_simulation::assert_pinned_seeds(sim::NAME, PINNED);
}

#[test]
fn same_seed_same_history_and_different_seeds_differ() {
    let opts = RunOptions::default();
    let a = sim::run(777, &opts).unwrap();
    let b = sim::run(777, &opts).unwrap();
    assert_eq!(a, b, "same seed, different report");
    let c = sim::run(778, &opts).unwrap();
    assert_ne!(a.history_digest, c.history_digest);
    let h1 = simulate(sim::NAME, 31, &opts, sim::scenario(31, &opts)).1;
    let h2 = simulate(sim::NAME, 31, &opts, sim::scenario(31, &opts)).1;
    assert_eq!(h1, h2, "histories entry by entry");
}

/// The seeds exercise what they claim to: nulls, declared inactivity,
/// back-pressure, both modes, the baseline and Spindle.
#[test]
fn seeds_cover_the_interesting_paths() {
    let opts = RunOptions::default();
    let (mut nulls, mut declared, mut backpressure, mut unordered, mut baseline, mut spindle) =
        (0, 0, 0, 0, 0, 0);
    let mut non_senders = 0;
    for seed in 1000..1080 {
        let p = sim::Params::draw(seed);
        baseline += u32::from(p.group.switches == Switches::BASELINE);
        spindle += u32::from(p.group.switches == Switches::SPINDLE);
        unordered += p.group.subgroups.iter().filter(|s| s.mode == DeliveryMode::Unordered).count();
        non_senders += p.group.subgroups.iter().filter(|s| s.senders.len() < s.members.len()).count();
        let (report, history, checkers) = simulate(sim::NAME, seed, &opts, sim::scenario(seed, &opts));
        ordo_sim::check_all(&history, &checkers).unwrap_or_else(|v| panic!("seed {seed}: {v}"));
        assert_eq!(report.outcome, ordo_sim::Outcome::Idle, "seed {seed} ends with nothing left to do");
        for e in &history.entries {
            match e.event {
                VsyncEvent::NullsSent { .. } => nulls += 1,
                VsyncEvent::Declared { .. } => declared += 1,
                VsyncEvent::Backpressure { .. } => backpressure += 1,
                _ => {}
            }
        }
    }
    eprintln!(
        "80 seeds: {nulls} null events, {declared} declarations, {backpressure} back-pressure stops, \
         {unordered} unordered subgroups, {non_senders} with non-senders, {baseline} baseline, {spindle} spindle"
    );
    assert!(nulls > 0 && declared > 0 && backpressure > 0 && unordered > 0 && non_senders > 0);
    assert!(baseline > 0 && spindle > 0);
}

// ---------------------------------------------------------------------------
// Every checker fails on a bad history.
// ---------------------------------------------------------------------------

/// Subgroup 0: ordered, members 0..3, senders [1, 0] (rank 0 is m1).
/// Subgroup 1: unordered, members [1, 2], sender [2].
fn group(null_sends: bool) -> GroupConfig {
    let mut switches = Switches::SPINDLE;
    switches.null_sends = null_sends;
    GroupConfig {
        members: vec![0, 1, 2],
        subgroups: vec![
            SubgroupConfig {
                name: String::new(),
                descriptor: Vec::new(),
                members: vec![0, 1, 2],
                senders: vec![1, 0],
                window: 4,
                max_payload: 64,
                mode: DeliveryMode::Ordered,
            },
            SubgroupConfig {
                name: String::new(),
                descriptor: Vec::new(),
                members: vec![1, 2],
                senders: vec![2],
                window: 4,
                max_payload: 64,
                mode: DeliveryMode::Unordered,
            },
        ],
        switches,
    }
}

fn digest(g: usize, s: MemberId, k: u64) -> (u32, u64) {
    let mut v = Vec::new();
    sim::payload(g, s, k, 64, &mut v);
    (v.len() as u32, ordo_sim::fnv64(&v))
}

fn sent(h: &mut History<VsyncEvent>, t: u64, g: usize, s: MemberId, k: u64) {
    let (len, digest) = digest(g, s, k);
    h.record(t, s, 1, VsyncEvent::Sent { subgroup: g, sender: s, index: k, len, digest });
}

#[allow(clippy::too_many_arguments)]
fn delivered(
    h: &mut History<VsyncEvent>,
    t: u64,
    m: MemberId,
    g: usize,
    s: MemberId,
    k: u64,
    round: u64,
    seq: i64,
) {
    let (len, digest) = digest(g, s, k);
    h.record(t, m, 1, VsyncEvent::Delivered { subgroup: g, sender: s, seq, round, len, digest });
}

/// A correct history: in subgroup 0, m1 (rank 0) sends 2 messages, m0
/// (rank 1) sends 1 after sending one null round (round 0); in subgroup 1,
/// m2 sends 2.
fn good() -> History<VsyncEvent> {
    let mut h = History::new(3);
    sent(&mut h, 10, 0, 1, 0);
    sent(&mut h, 10, 0, 1, 1);
    sent(&mut h, 10, 1, 2, 0);
    sent(&mut h, 10, 1, 2, 1);
    h.record(20, 0, 1, VsyncEvent::NullsSent { subgroup: 0, rounds: 1 });
    sent(&mut h, 30, 0, 0, 0);
    for m in [1, 2] {
        delivered(&mut h, 40, m, 1, 2, 0, 0, -1);
        delivered(&mut h, 40, m, 1, 2, 1, 1, -1);
    }
    // Order: M(m1,0)=seq 0, [null m0 round 0 = seq 1], M(m1,1)=seq 2, M(m0,0) at round 1 = seq 3.
    for m in [0, 1, 2] {
        delivered(&mut h, 50, m, 0, 1, 0, 0, 0);
        delivered(&mut h, 50, m, 0, 1, 1, 1, 2);
        delivered(&mut h, 60, m, 0, 0, 0, 1, 3);
    }
    for m in [0, 1, 2] {
        h.record(70, m, 1, VsyncEvent::Finished);
    }
    h.end_ns = 80;
    h
}

fn checkers(null_sends: bool) -> Vec<Box<dyn Checker<VsyncEvent>>> {
    sim::checkers(&group(null_sends))
}

/// Runs every checker; returns the name of the first that fails.
fn first_failure(h: &History<VsyncEvent>, null_sends: bool) -> Option<&'static str> {
    ordo_sim::check_all(h, &checkers(null_sends)).err().map(|v| {
        eprintln!("{v}");
        v.checker
    })
}

fn only(h: &History<VsyncEvent>, name: &str, null_sends: bool) -> Result<(), ordo_sim::Violation> {
    let cs = checkers(null_sends);
    let c = cs.iter().find(|c| c.name() == name).expect("a checker of that name");
    c.check(h)
}

fn edit(h: &mut History<VsyncEvent>, pick: impl Fn(&ordo_sim::Entry<VsyncEvent>) -> bool) -> &mut VsyncEvent {
    &mut h.entries.iter_mut().find(|e| pick(e)).expect("an entry to edit").event
}

fn is_delivery(e: &ordo_sim::Entry<VsyncEvent>, m: MemberId, g: usize, round: u64) -> bool {
    e.member == m
        && matches!(e.event, VsyncEvent::Delivered { subgroup, round: r, .. } if subgroup == g && r == round)
}

#[test]
fn the_good_history_passes_every_checker() {
    assert_eq!(first_failure(&good(), true), None);
}

#[test]
fn anomalies_checker_catches_anomalies_and_bad_sends() {
    let mut h = good();
    h.record(75, 2, 1, VsyncEvent::Anomaly { what: "posting failed".into() });
    assert!(only(&h, "vsync-anomalies", true).is_err());
    let mut h = good();
    sent(&mut h, 75, 0, 2, 0); // m2 is not a sender of subgroup 0
    assert!(only(&h, "vsync-anomalies", true).is_err());
    let mut h = good();
    if let VsyncEvent::Sent { index, .. } =
        edit(&mut h, |e| matches!(e.event, VsyncEvent::Sent { index: 1, .. }))
    {
        *index = 5;
    }
    assert!(only(&h, "vsync-anomalies", true).is_err());
}

#[test]
fn integrity_checker_catches_changed_bytes_and_strangers() {
    let mut h = good();
    if let VsyncEvent::Delivered { digest, .. } = edit(&mut h, |e| is_delivery(e, 2, 0, 1)) {
        *digest ^= 1;
    }
    assert!(only(&h, "vsync-integrity", true).is_err());
    // All members agree on the changed bytes: still not what was sent.
    let mut h = good();
    for e in h.entries.iter_mut() {
        if let VsyncEvent::Delivered { subgroup: 1, round: 0, len, .. } = &mut e.event {
            *len += 1;
        }
    }
    assert!(only(&h, "vsync-integrity", true).is_err());
    // m0 is not a member of subgroup 1.
    let mut h = good();
    delivered(&mut h, 75, 0, 1, 2, 0, 0, -1);
    assert!(only(&h, "vsync-integrity", true).is_err());
    // A message never sent.
    let mut h = good();
    delivered(&mut h, 75, 1, 1, 2, 2, 7, -1);
    assert!(only(&h, "vsync-integrity", true).is_err());
}

#[test]
fn duplication_checker_catches_a_second_delivery() {
    let mut h = good();
    delivered(&mut h, 75, 1, 1, 2, 1, 1, -1);
    assert_eq!(only(&h, "vsync-no-duplication", true).unwrap_err().checker, "vsync-no-duplication");
    assert!(only(&good(), "vsync-no-duplication", true).is_ok());
}

#[test]
fn total_order_checker_catches_wrong_seqs_reorders_and_divergence() {
    // A seq that is not round × S + rank.
    let mut h = good();
    if let VsyncEvent::Delivered { seq, .. } = edit(&mut h, |e| is_delivery(e, 0, 0, 1)) {
        *seq = 1;
    }
    assert!(only(&h, "vsync-total-order", true).is_err());
    // Two members deliver in different orders.
    let mut h = good();
    let idx: Vec<usize> = (0..h.entries.len())
        .filter(|&i| {
            h.entries[i].member == 2
                && matches!(h.entries[i].event, VsyncEvent::Delivered { subgroup: 0, .. })
        })
        .collect();
    let (a, b) = (idx[1], idx[2]);
    let ea = h.entries[a].event.clone();
    h.entries[a].event = h.entries[b].event.clone();
    h.entries[b].event = ea;
    assert!(only(&h, "vsync-total-order", true).is_err());
    // One member skips a message the others deliver (the sequences are not
    // prefixes of each other).
    let mut h = good();
    let i = h
        .entries
        .iter()
        .position(|e| is_delivery(e, 1, 0, 0) && matches!(e.event, VsyncEvent::Delivered { sender: 1, .. }))
        .unwrap();
    h.entries.remove(i);
    assert!(only(&h, "vsync-total-order", true).is_err());
}

#[test]
fn fifo_checker_catches_reorders_and_gaps_in_an_unordered_subgroup() {
    // m2 delivers m2's round 1 before round 0.
    let mut h = good();
    let a = h.entries.iter().position(|e| is_delivery(e, 2, 1, 0)).unwrap();
    let b = h.entries.iter().position(|e| is_delivery(e, 2, 1, 1)).unwrap();
    h.entries.swap(a, b);
    assert!(only(&h, "vsync-fifo", true).is_err());
    // m1 skips round 0 (a gap), delivering only round 1.
    let mut h = good();
    let a = h.entries.iter().position(|e| is_delivery(e, 1, 1, 0)).unwrap();
    h.entries.remove(a);
    assert!(only(&h, "vsync-fifo", true).is_err());
    // Unordered deliveries carry no seq.
    let mut h = good();
    if let VsyncEvent::Delivered { seq, .. } = edit(&mut h, |e| is_delivery(e, 1, 1, 0)) {
        *seq = 0;
    }
    assert!(only(&h, "vsync-fifo", true).is_err());
}

#[test]
fn liveness_checker_catches_lost_messages_and_unfinished_members() {
    let mut h = good();
    let last = h
        .entries
        .iter()
        .rposition(|e| is_delivery(e, 0, 0, 1) && matches!(e.event, VsyncEvent::Delivered { sender: 0, .. }))
        .unwrap();
    h.entries.remove(last);
    assert!(only(&h, "vsync-liveness", true).is_err());
    let mut h = good();
    h.record(75, 1, 1, VsyncEvent::Resumed);
    assert!(only(&h, "vsync-liveness", true).is_err());
    let mut h = good();
    h.entries.retain(|e| !(e.member == 2 && e.event == VsyncEvent::Finished));
    assert!(only(&h, "vsync-liveness", true).is_err());
    // A message sent that nobody delivered.
    let mut h = good();
    sent(&mut h, 75, 1, 2, 2);
    assert!(only(&h, "vsync-liveness", true).is_err());
}

#[test]
fn null_send_checker_catches_unneeded_late_and_forbidden_nulls() {
    assert!(only(&good(), "vsync-null-sends", true).is_ok());
    // Null-sends off: the good history's null is forbidden.
    assert!(only(&good(), "vsync-null-sends", false).is_err());
    // Too many rounds: m0 sends 3 null rounds (4 rounds; A = 2).
    let mut h = good();
    if let VsyncEvent::NullsSent { rounds, .. } =
        edit(&mut h, |e| matches!(e.event, VsyncEvent::NullsSent { .. }))
    {
        *rounds = 3;
    }
    assert!(only(&h, "vsync-null-sends", true).is_err());
    // One unneeded null round: m1 (rank 0) sends null round 2, seq 4 —
    // after the last message (seq 3) — within the bound but answering
    // nothing.
    let mut h = good();
    h.record(55, 1, 1, VsyncEvent::NullsSent { subgroup: 0, rounds: 1 });
    let v = only(&h, "vsync-null-sends", true).unwrap_err();
    assert!(v.message.contains("precedes no message"), "{v}");
    // A needed null, but sent after everyone delivered the last message.
    let mut h = good();
    let i = h.entries.iter().position(|e| matches!(e.event, VsyncEvent::NullsSent { .. })).unwrap();
    let mut e = h.entries.remove(i);
    e.time_ns = 65;
    h.entries.insert(h.entries.len() - 3, e);
    let v = only(&h, "vsync-null-sends", true).unwrap_err();
    assert!(v.message.contains("after every member delivered"), "{v}");
    // Nulls from a non-sender.
    let mut h = good();
    h.record(55, 2, 1, VsyncEvent::NullsSent { subgroup: 0, rounds: 1 });
    assert!(only(&h, "vsync-null-sends", true).is_err());
    // Declared rounds are allowed beyond the bound, and must come first.
    let mut h = good();
    h.entries.insert(
        0,
        ordo_sim::Entry {
            time_ns: 0,
            member: 0,
            incarnation: 1,
            event: VsyncEvent::Declared { subgroup: 0, rounds: 1 },
        },
    );
    assert!(only(&h, "vsync-null-sends", true).is_ok(), "m0's null round 0 was its declared round");
    let mut h = good();
    h.entries.insert(
        0,
        ordo_sim::Entry {
            time_ns: 0,
            member: 1,
            incarnation: 1,
            event: VsyncEvent::Declared { subgroup: 0, rounds: 1 },
        },
    );
    assert!(only(&h, "vsync-null-sends", true).is_err(), "m1 declared round 0 but sent a message in it");
}

#[test]
fn a_failing_seed_prints_its_replay_command() {
    let opts = RunOptions { max_steps: Some(50), ..RunOptions::default() };
    let f = sim::run(5, &opts).unwrap_err();
    assert!(f.message.contains("liveness"), "{f}");
    assert_eq!(f.replay, "ordo sim --workload vsync --seed 5");
    assert!(f.to_string().contains("seed 5"));
}

#[test]
fn the_checkers_judge_real_histories_too() {
    // A real run, tampered with: the checkers see it.
    let opts = RunOptions::default();
    let (_, mut h, cs) = simulate(sim::NAME, 9, &opts, sim::scenario(9, &opts));
    ordo_sim::check_all(&h, &cs).unwrap();
    let i = h.entries.iter().rposition(|e| matches!(e.event, VsyncEvent::Delivered { .. })).unwrap();
    h.entries.remove(i);
    assert!(ordo_sim::check_all(&h, &cs).is_err());
}

/// Regression (found by seed 327 of an earlier draw): a sender that declares
/// R rounds of inactivity in a subgroup with window 1 could never send again
/// unless the other senders sent R rounds of application messages: the
/// declared rounds rode in a null slot reclaimed only once every member
/// *delivered* its last round (R - 1), which the others never reach (they
/// null-fill only up to the batch's first round). Fixed by reusing a null
/// slot once every member has consumed it.
#[test]
fn declared_inactivity_then_resume_with_window_1() {
    use sim::{MemberPlan, Params, SenderPlan};
    let plan = |count, start_ns, declare| MemberPlan {
        sends: vec![SenderPlan {
            subgroup: 0,
            count,
            start_ns,
            burst: 1,
            interval_ns: 0,
            pause: None,
            declare,
        }],
        ..MemberPlan::default()
    };
    let params = Params {
        group: GroupConfig {
            members: vec![0, 1],
            subgroups: vec![SubgroupConfig {
                name: String::new(),
                descriptor: Vec::new(),
                members: vec![0, 1],
                senders: vec![0, 1],
                window: 1,
                max_payload: 16,
                mode: DeliveryMode::Ordered,
            }],
            switches: Switches::SPINDLE,
        },
        members: vec![plan(3, 0, 0), plan(2, 50_000, 5)],
        fabric: ordo_sim::FabricConfig::default(),
    };
    let opts = RunOptions::default();
    let r = ordo_sim::execute(sim::NAME, 1, &opts, sim::scenario_with(params));
    assert!(r.is_ok(), "{}", r.unwrap_err());
}

/// Replay aid: `SEED=N [SUB=g] cargo test -p ordo-vsync --release --test sim
/// debug_seed -- --ignored --nocapture` prints the seed's parameters, each
/// member's last events, every checker's verdict (and subgroup g's sends,
/// declarations and nulls).
#[test]
#[ignore = "replay aid; needs SEED"]
fn debug_seed() {
    let seed: u64 = std::env::var("SEED").unwrap().parse().unwrap();
    let opts = RunOptions::default();
    let p = sim::Params::draw(seed);
    eprintln!("{p:#?}");
    let (r, h, cs) = simulate(sim::NAME, seed, &opts, sim::scenario(seed, &opts));
    eprintln!("{:?} {}", r.outcome, r.sim_time_ns);
    for m in 0..h.members {
        let evs: Vec<_> = h.entries.iter().filter(|e| e.member == m).collect();
        eprintln!("--- m{m}: {} events; last 12:", evs.len());
        for e in evs.iter().rev().take(12).rev() {
            eprintln!("  {} {:?}", e.time_ns, e.event);
        }
    }
    for c in &cs {
        eprintln!("{}: {:?}", c.name(), c.check(&h));
    }
    if let Ok(g) = std::env::var("SUB") {
        let g: usize = g.parse().unwrap();
        for e in &h.entries {
            match e.event {
                VsyncEvent::Sent { subgroup, .. }
                | VsyncEvent::NullsSent { subgroup, .. }
                | VsyncEvent::Declared { subgroup, .. }
                    if subgroup == g =>
                {
                    eprintln!("  {} m{} {:?}", e.time_ns, e.member, e.event)
                }
                _ => {}
            }
        }
    }
}
