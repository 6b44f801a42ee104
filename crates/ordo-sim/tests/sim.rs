//! The simulator's own tests: the fabric conformance suite on `SimFabric`,
//! determinism, fresh and pinned seeds of every workload, scripted faults.

use ordo_fabric::conformance::{Harness, run_all};
use ordo_fabric::{Fabric, FabricEvent, FailureCause, PostError, Write, WriteTag};
use ordo_sim::workloads::stream::StreamEvent;
use ordo_sim::workloads::{datagram_stream, fabric_stream, ring_multicast};
use ordo_sim::{
    NetAddr, RunOptions, SeedBatch, SimConfig, SimFabric, SimHarness, SimSocket, World, run_seeds,
    run_workload, simulate, workloads,
};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[test]
fn sim_fabric_passes_the_conformance_suite() {
    for seed in [1, 0xDEAD_BEEF] {
        let mut h = SimHarness::new(seed);
        run_all(&mut h);
    }
}

/// With writes landing in two steps (a reader sees them half-applied,
/// lower part first) the suite still passes: FIFO, untorn words, guarded
/// publishing and the address order this fabric claims all hold.
#[test]
fn sim_fabric_with_split_landing_passes_the_conformance_suite() {
    let mut h = SimHarness::new(3);
    h.config.fabric.split_land_ppm = 500_000;
    run_all(&mut h);
    // The address-order check again, alone: its writes did land split.
    ordo_fabric::conformance::address_order_within_a_write(&mut h);
    let split = h.world().map(|w| w.lock().unwrap().stats().writes_split);
    assert!(split.is_some_and(|n| n > 1000), "writes landed in two steps: {split:?}");
}

fn world(members: u32) -> Arc<Mutex<World>> {
    let cfg = SimConfig { members, region_len: 4096, ..SimConfig::default() };
    Arc::new(Mutex::new(World::new(cfg, 7)))
}

fn drain(f: &mut SimFabric) -> Vec<FabricEvent> {
    let mut v = Vec::new();
    f.poll_events(&mut v);
    v
}

#[test]
fn a_write_across_a_partition_breaks_the_link_and_nothing_after_it_lands() {
    let w = world(2);
    let mut g = SimFabric::attach_all(&w);
    g[0].region().store_release(0, 1);
    g[0].post_write(Write::new(1, 0, 8)).unwrap();
    w.lock().unwrap().cut(0, 1); // drops the write in flight
    w.lock().unwrap().heal(0, 1);
    // Posted after the loss: accepted but must never land.
    g[0].region().store_release(8, 2);
    g[0].post_write(Write::signaled(1, 8, 8, WriteTag(9))).unwrap();
    let timeout = w.lock().unwrap().config().fabric.completion_timeout_ns;
    w.lock().unwrap().advance_by(timeout + 1);
    assert_eq!(g[1].region().load_acquire(0), 0, "lost write landed");
    assert_eq!(g[1].region().load_acquire(8), 0, "a write after a lost one landed");
    assert_eq!(
        drain(&mut g[0]),
        vec![
            FabricEvent::Failed { peer: 1, tag: WriteTag(9), cause: FailureCause::TimedOut },
            FabricEvent::Suspected { peer: 1, cause: FailureCause::TimedOut },
        ]
    );
    assert_eq!(g[0].post_write(Write::new(1, 0, 8)), Err(PostError::PeerSuspected(1)));
    // The other direction never noticed anything.
    assert!(!g[1].is_suspected(0));
    assert_eq!(g[0].reconnect(1), Ok(1));
    assert_eq!(drain(&mut g[0]), vec![FabricEvent::Reconnected { peer: 1, incarnation: 1 }]);
    g[0].post_write(Write::new(1, 8, 8)).unwrap();
    w.lock().unwrap().advance_by(1_000_000);
    assert_eq!(g[1].region().load_acquire(8), 2);
}

#[test]
fn restart_gives_a_fresh_region_reached_only_after_reconnect() {
    let w = world(2);
    let mut g = SimFabric::attach_all(&w);
    g[0].region().store_release(0, 5);
    g[0].post_write(Write::new(1, 0, 8)).unwrap();
    w.lock().unwrap().advance_by(1_000_000);
    assert_eq!(g[1].region().load_acquire(0), 5);
    w.lock().unwrap().crash(1);
    assert_eq!(w.lock().unwrap().restart(1), 2);
    let mut new1 = SimFabric::attach(&w, 1);
    assert_eq!(new1.region().load_acquire(0), 0, "a restarted member's region is zeroed");
    // The old link points at incarnation 1: the write is lost.
    g[0].post_write(Write::new(1, 0, 8)).unwrap();
    assert_eq!(g[0].reconnect(1).map_err(|_| ()), Err(()), "not suspected yet");
    w.lock().unwrap().advance_by(10_000_000);
    assert_eq!(new1.region().load_acquire(0), 0);
    assert!(g[0].is_suspected(1));
    assert_eq!(g[0].reconnect(1), Ok(2));
    g[0].post_write(Write::new(1, 0, 8)).unwrap();
    w.lock().unwrap().advance_by(1_000_000);
    assert_eq!(new1.region().load_acquire(0), 5);
    // The dead incarnation's endpoint is inert.
    assert_eq!(g[1].post_write(Write::new(0, 0, 8)), Err(PostError::PeerSuspected(0)));
    assert!(drain(&mut g[1]).is_empty());
    // The new incarnation reaches member 0 right away.
    new1.region().store_release(64, 3);
    new1.post_write(Write::new(0, 64, 8)).unwrap();
    w.lock().unwrap().advance_by(1_000_000);
    assert_eq!(g[0].region().load_acquire(64), 3);
}

#[test]
fn datagrams_are_bounded_and_die_with_their_member() {
    let w = world(2);
    {
        let mut cfg = w.lock().unwrap();
        cfg.calm_network();
    }
    let mut a = SimSocket::bind(&w, 0, 1, 9).unwrap();
    let mut b = SimSocket::bind(&w, 1, 1, 9).unwrap();
    assert!(SimSocket::bind(&w, 1, 1, 9).is_err(), "port in use");
    let cap = w.lock().unwrap().config().net.queue_capacity;
    for i in 0..cap + 10 {
        a.send(NetAddr::new(1, 9), &(i as u32).to_le_bytes()).unwrap();
    }
    w.lock().unwrap().advance_by(10_000_000);
    assert_eq!(w.lock().unwrap().stats().datagrams_overflowed, 10);
    let mut got = 0;
    while b.recv().is_some() {
        got += 1;
    }
    assert_eq!(got, cap);
    a.send(NetAddr::new(1, 9), b"x").unwrap();
    w.lock().unwrap().advance_by(10_000_000);
    w.lock().unwrap().crash(1);
    assert_eq!(b.recv(), None, "queued datagrams die with the member");
    w.lock().unwrap().restart(1);
    let mut b2 = SimSocket::bind(&w, 1, 2, 9).unwrap();
    assert_eq!(b2.recv(), None);
    assert!(b.send(NetAddr::new(0, 9), b"y").is_err(), "old incarnation's socket is closed");
}

#[test]
fn same_seed_same_run_and_different_seeds_differ() {
    let opts = RunOptions::default();
    for name in workloads() {
        let a = run_workload(name, 12345, &opts).unwrap();
        let b = run_workload(name, 12345, &opts).unwrap();
        assert_eq!(a, b, "{name}: same seed, different report");
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["seed"], 12345, "the report serializes for the CLI");
        let c = run_workload(name, 12346, &opts).unwrap();
        assert_ne!(a.history_digest, c.history_digest, "{name}: different seeds, same history");
    }
    // Histories themselves, entry by entry.
    let h1 = simulate(fabric_stream::NAME, 99, &opts, fabric_stream::scenario(99, &opts)).1;
    let h2 = simulate(fabric_stream::NAME, 99, &opts, fabric_stream::scenario(99, &opts)).1;
    assert_eq!(h1, h2);
    let h1 = simulate(datagram_stream::NAME, 99, &opts, datagram_stream::scenario(99, &opts)).1;
    let h2 = simulate(datagram_stream::NAME, 99, &opts, datagram_stream::scenario(99, &opts)).1;
    assert_eq!(h1, h2);
}

fn fresh_seeds(name: &str) {
    let batch = SeedBatch::from_env(500);
    eprintln!(
        "{name}: {} seeds from base {} (replay this batch with ORDO_SIM_BASE_SEED={} ORDO_SIM_SEEDS={})",
        batch.count, batch.base, batch.base, batch.count
    );
    let start = Instant::now();
    let report = run_seeds(name, batch.seeds(), &RunOptions::default());
    eprintln!(
        "{name}: {} runs, {} passed, {} faults, {} fault points fired, {:.1} simulated s, {} steps, in {:?}",
        report.runs,
        report.passed,
        report.faults_fired,
        report.fault_points_fired,
        report.sim_time_ns as f64 / 1e9,
        report.steps,
        start.elapsed()
    );
    assert!(
        report.failures.is_empty(),
        "{} failing seeds; first: {}",
        report.failures.len(),
        report.failures[0]
    );
    if batch.count > 0 {
        assert!(report.faults_fired > 0, "the nemesis never fired");
    }
}

#[test]
fn fabric_stream_fresh_seeds() {
    fresh_seeds(fabric_stream::NAME);
}

#[test]
fn datagram_stream_fresh_seeds() {
    fresh_seeds(datagram_stream::NAME);
}

/// The ring workload has no nemesis (failure-free SMC path); what it must
/// exercise instead is the ring's rare path: a `fault!` point that pushes
/// only part of a ready batch.
#[test]
fn ring_multicast_fresh_seeds() {
    let batch = SeedBatch::from_env(500);
    eprintln!("{}: {} seeds from base {}", ring_multicast::NAME, batch.count, batch.base);
    let report = run_seeds(ring_multicast::NAME, batch.seeds(), &RunOptions::default());
    assert!(
        report.failures.is_empty(),
        "{} failing seeds; first: {}",
        report.failures.len(),
        report.failures[0]
    );
    if batch.count >= 100 {
        assert!(report.fault_points_fired > 0, "ring.send.partial_batch never fired");
    }
}

/// Seeds that must keep passing: interesting runs, and every seed that ever
/// failed (add it here with a note when you fix the bug it found).
const PINNED: &[(&str, u64)] = &[
    (fabric_stream::NAME, 0),
    (fabric_stream::NAME, 1),
    (fabric_stream::NAME, 12345),
    (datagram_stream::NAME, 0),
    (datagram_stream::NAME, 1),
    (datagram_stream::NAME, 12345),
    (ring_multicast::NAME, 0),
    (ring_multicast::NAME, 1),
    (ring_multicast::NAME, 12345),
];

#[test]
fn pinned_seeds() {
    let opts = RunOptions::default();
    for (name, seed) in PINNED {
        if let Err(f) = run_workload(name, *seed, &opts) {
            panic!("pinned seed failed: {f}");
        }
    }
}

#[test]
fn workloads_exercise_their_faults() {
    let opts = RunOptions::default();
    let mut crashes = 0;
    let mut suspicions = 0;
    let mut lost = 0;
    for seed in 0..40 {
        let r = run_workload(fabric_stream::NAME, seed, &opts).unwrap();
        crashes += r.sim.crashes;
        suspicions += r.world.suspicions;
        let d = run_workload(datagram_stream::NAME, seed, &opts).unwrap();
        lost += d.datagrams_lost;
        assert!(d.datagrams_sent > 0 && r.writes_landed > 0);
    }
    assert!(
        crashes > 0 && suspicions > 0 && lost > 0,
        "crashes {crashes} suspicions {suspicions} lost {lost}"
    );
}

#[test]
fn a_run_without_enough_time_fails_liveness_with_its_replay_command() {
    let opts = RunOptions { max_time_ns: Some(50_000), ..RunOptions::default() };
    let f = run_workload(fabric_stream::NAME, 3, &opts).unwrap_err();
    assert!(f.message.contains("liveness"), "{f}");
    assert_eq!(f.replay, "ordo sim --workload fabric-stream --seed 3");
    assert!(f.to_string().contains("seed 3"));
    let f = run_workload("no-such-workload", 1, &opts).unwrap_err();
    assert!(f.message.contains("fabric-stream"), "lists the known workloads: {f}");
}

#[test]
fn registry_lists_every_workload() {
    assert_eq!(workloads(), &["fabric-stream", "datagram-stream", "ring-multicast"]);
    let h: ordo_sim::History<StreamEvent> = ordo_sim::History::new(1);
    assert!(h.is_empty());
}

#[test]
fn harness_reports_no_doorbell() {
    let mut h = SimHarness::new(5);
    assert!(!h.has_doorbell());
    let g = h.group(2, 128);
    assert!(g[0].doorbell().is_none());
}
