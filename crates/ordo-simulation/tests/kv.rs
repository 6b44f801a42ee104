//! Seeded simulation of ordo-kv (see `src/kv.rs`): fresh seeds every run
//! with zero violations, determinism, and the deliberately stale-read
//! configuration, which the linearizability checker must catch.

use ordo_simulation::kv;

#[test]
fn fresh_seeds() {
    ordo_simulation::assert_fresh_seeds(kv::NAME, 500);
}

/// Seeds that must keep passing: 10133736097792388952 found a write
/// settled `Lost` at its (partitioned) old leader although the next leader
/// committed it (the old leader caught up by a snapshot covering it: now
/// `Unknown`), read back by a read that a follower's echo of the old
/// leader's barrier counter had confirmed with no round at all.
/// 1795756328056448151 (durable): a member accepted a new leader's diff
/// (Accepted = the epoch's count-0 header, above its last entry), helped
/// commit its log, crashed, and came back claiming only its last entry, so
/// it voted for a candidate lacking an acknowledged write (Accepted is now
/// persisted, after the log).
const PINNED: &[u64] = &[0, 1, 2, 42, 0xDEAD_BEEF, 10_133_736_097_792_388_952, 1_795_756_328_056_448_151];

#[test]
fn pinned_seeds() {
    for &seed in PINNED {
        kv::run(seed, false).unwrap();
    }
}

#[test]
fn deterministic() {
    for seed in [3, 77] {
        let p = kv::params(seed);
        assert_eq!(kv::simulate(seed, &p, false).digest(), kv::simulate(seed, &p, false).digest());
    }
}

/// Reads answered from a member's own copy (any member, no read index):
/// the checker finds a stale read in some of 60 seeds, and names the
/// linearizability checker.
#[test]
fn stale_reads_fail_the_checker() {
    let failures: Vec<String> = (0..60).filter_map(|seed| kv::run(seed, true).err()).collect();
    assert!(!failures.is_empty(), "stale local reads passed 60 seeds");
    assert!(failures.iter().all(|f| f.contains("linearizable")), "{failures:?}");
}

/// The histories are not trivial: operations complete, some overlap a
/// crash (unknown outcome), reads and CAS both happen.
#[test]
fn histories_have_substance() {
    let (mut ops, mut unknown, mut reads) = (0, 0, 0);
    for seed in 0..20 {
        let h = kv::simulate(seed, &kv::params(seed), false);
        let o = kv::operations(&h);
        ops += o.len();
        unknown += o.iter().filter(|o| o.ret.is_none()).count();
        reads += o.iter().filter(|o| matches!(o.kind, ordo_kv::lincheck::OpKind::Read(_))).count();
    }
    assert!(ops > 2_000, "{ops} operations in 20 seeds");
    assert!(unknown > 0, "no operation of unknown outcome in 20 seeds");
    assert!(reads > 500, "{reads} reads");
    eprintln!("20 seeds: {ops} operations, {unknown} unknown outcomes, {reads} reads");
}

#[test]
#[ignore]
fn trace_seed() {
    let seed: u64 = std::env::var("SEED").unwrap().parse().unwrap();
    let key: u8 = std::env::var("KEY").map_or(b'1', |k| k.as_bytes()[0]);
    let h = kv::simulate(seed, &kv::params(seed), false);
    for f in &h.faults {
        eprintln!("{:>9} FAULT {:?}", f.time_ns, f.fault);
    }
    for e in &h.entries {
        match &e.event {
            kv::KvEvent::Invoke { key: k, .. } if *k != key - b'0' => {}
            ev => eprintln!("{:>9} m{} i{} {:?}", e.time_ns, e.member, e.incarnation, ev),
        }
    }
}

#[test]
#[ignore]
fn minimal_prefix() {
    let seed: u64 = std::env::var("SEED").unwrap().parse().unwrap();
    let h = kv::simulate(seed, &kv::params(seed), false);
    let mut ops = kv::operations(&h);
    ops.retain(|o| o.key == b"k1");
    ops.sort_by_key(|o| o.call);
    let bad =
        |n: usize| ordo_kv::lincheck::check(&ops[..n], 1 << 26) != ordo_kv::lincheck::Verdict::Linearizable;
    let (mut lo, mut hi) = (0, ops.len());
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if bad(mid) { hi = mid } else { lo = mid }
    }
    eprintln!("first violating prefix: {hi} ops");
    for o in &ops[hi.saturating_sub(25)..hi] {
        eprintln!("{:>9} -> {:>9?} {:?}", o.call, o.ret, o.kind);
    }
}
