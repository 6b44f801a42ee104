//! CPU cost of an Acuerdo commit at window 1, without threads or a real
//! fabric: three `AcuerdoDriver`s over the in-process loopback fabric on
//! one thread (a commit = the leader's send, a follower's accept, the
//! leader's commit). Prints ns per commit, polls per commit and ns per
//! poll; with `idle` as the second argument, the cost of a poll with
//! nothing to do at each member. The vsync counterpart is
//! `ordo-vsync`'s example of the same name (issue 12's profile).
//!
//! `cargo run --release -p ordo-acuerdo --example acuerdo_window1_loopback -- [COMMITS] [idle]`

use ordo_acuerdo::{Header, Role};
use std::time::Instant;

mod common;

fn main() {
    let mut ds = common::loopback_drivers(false);
    let t0 = Instant::now();
    let now = || t0.elapsed().as_nanos() as u64;
    let mut settled = Vec::new();
    let mut sink = |_: Header, _: &[u8]| {};
    common::elect(&mut ds, now);
    let l = ds.iter().position(|d| d.engine().role() == Role::Leader).unwrap();
    let f = (l + 1) % 3;
    let g = (l + 2) % 3;
    let iters: u64 = std::env::args().nth(1).map_or(1_000_000, |s| s.parse().unwrap());
    if std::env::args().nth(2).is_some_and(|s| s == "idle") {
        let mut spent = [0u64; 3];
        for _ in 0..iters {
            for (who, d) in ds.iter_mut().enumerate() {
                let t = Instant::now();
                let n = now();
                d.poll(n, &mut sink, &mut settled);
                spent[who] += t.elapsed().as_nanos() as u64;
            }
        }
        let roles: Vec<_> = ds.iter().map(|d| d.engine().role()).collect();
        println!(
            "idle polls, ns each (with two clock reads): {:?} roles {:?}",
            spent.map(|s| s / iters),
            roles
        );
        return;
    }
    let payload = [0u8; 10];
    let mut polls = 0u64;
    let start = Instant::now();
    for t in 0..iters {
        ds[l].submit(t, &payload).unwrap();
        settled.clear();
        loop {
            let n = now();
            ds[l].poll(n, &mut sink, &mut settled);
            polls += 1;
            if !settled.is_empty() {
                break;
            }
            ds[f].poll(n, &mut sink, &mut settled);
            polls += 1;
            if t % 4 == 0 {
                ds[g].poll(n, &mut sink, &mut settled);
                polls += 1;
            }
        }
    }
    let el = start.elapsed();
    println!(
        "{} ns/commit, {:.2} polls/commit, {} ns/poll",
        el.as_nanos() as u64 / iters,
        polls as f64 / iters as f64,
        el.as_nanos() as u64 / polls
    );
}
