//! Cross-core latency of an Acuerdo commit at window 1, without the
//! runtime: three `AcuerdoDriver`s over the in-process loopback fabric, the
//! leader alone on one thread and both followers on another (pinned to
//! CPUs 1 and 0 where there are two), so every commit crosses cores twice:
//! the leader's message to a follower, the follower's ack back. Prints the
//! commit latency's p50 and p99 (submit to settled, at the leader).
//! `acuerdo_window1_loopback` is the same commit on one thread (its CPU
//! cost); together they tell how much of the latency is the cores' round
//! trip and how much the members' work on the path.
//!
//! `cargo run --release -p ordo-acuerdo --example acuerdo_window1_threads -- [COMMITS]`

use ordo_acuerdo::{Header, Role};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

mod common;

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn main() {
    let iters: usize = std::env::args().nth(1).map_or(300_000, |s| s.parse().expect("COMMITS"));
    let mut ds = common::loopback_drivers(false);
    let t0 = Instant::now();
    let now = move || t0.elapsed().as_nanos() as u64;
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    common::elect(&mut ds, now);
    let l = ds.iter().position(|d| d.engine().role() == Role::Leader).expect("a leader");
    let mut leader = ds.remove(l);
    let mut followers = ds;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let fthread = std::thread::spawn(move || {
        if cpus >= 2 {
            pin(0);
        }
        let mut settled = Vec::new();
        let mut sink = |_: Header, _: &[u8]| {};
        while !stop2.load(Ordering::Relaxed) {
            let n = now();
            for d in followers.iter_mut() {
                d.poll(n, &mut sink, &mut settled);
            }
        }
    });
    if cpus >= 2 {
        pin(1);
    }
    let payload = [0u8; 10];
    let mut lat = Vec::with_capacity(iters);
    for t in 0..iters as u64 + 10_000 {
        let start = Instant::now();
        leader.submit(t, &payload).expect("the leader accepts");
        settled.clear();
        while settled.is_empty() {
            leader.poll(now(), &mut sink, &mut settled);
        }
        if t >= 10_000 {
            lat.push(start.elapsed().as_nanos() as u64);
        }
    }
    stop.store(true, Ordering::Relaxed);
    fthread.join().expect("followers");
    lat.sort_unstable();
    println!(
        "leader alone on a core, followers on another: commit p50 {} ns, p99 {} ns ({} commits)",
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100],
        lat.len()
    );
}
