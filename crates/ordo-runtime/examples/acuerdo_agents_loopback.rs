//! CPU cost of an Acuerdo commit at window 1 through the runtime's agents
//! (client queues, replies, events, status) on one thread over the
//! in-process loopback fabric: the counterpart of `ordo-acuerdo`'s
//! `acuerdo_window1_loopback`, which drives the bare drivers. The
//! difference is what the runtime adds per commit (issue 12's profile).
//!
//! `cargo run --release -p ordo-runtime --example acuerdo_agents_loopback -- [COMMITS]`

use ordo_acuerdo::{Config, Layout, Role};
use ordo_agent::Agent;
use ordo_fabric::loopback::loopback_group;
use ordo_runtime::acuerdo::{AcuerdoMember, ClientEvent, MemberOptions};
use std::time::Instant;

fn main() {
    let ids = vec![0u32, 1, 2];
    let cfg0 = Config::new(ids.clone(), 0);
    let len = Layout::new(&cfg0).region_len;
    let mut members = Vec::new();
    let mut clients = Vec::new();
    for (i, f) in loopback_group(3, len).into_iter().enumerate() {
        let mut c = Config::new(ids.clone(), i as u32);
        c.heartbeat_interval_ns = 1_000_000;
        c.heartbeat_timeout_ns = 20_000_000;
        c.election_timeout_ns = 30_000_000;
        let (m, client) = AcuerdoMember::new(f, c, 0, MemberOptions::default()).unwrap();
        members.push(m);
        clients.push(client);
    }
    let statuses: Vec<_> = members.iter().map(|m| m.status()).collect();
    let t0 = Instant::now();
    let now = || t0.elapsed().as_nanos() as u64;
    for _ in 0..2_000_000 {
        let n = now();
        for m in members.iter_mut() {
            m.do_work(n);
        }
        if statuses.iter().filter(|s| s.is_leader()).count() == 1
            && statuses.iter().all(|s| s.role() != Role::Electing)
        {
            break;
        }
    }
    let l = statuses.iter().position(|s| s.is_leader()).unwrap();
    let (f, g) = ((l + 1) % 3, (l + 2) % 3);
    let iters: u64 = std::env::args().nth(1).map_or(1_000_000, |s| s.parse().unwrap());
    let payload = [0u8; 10];
    let (mut cycles, mut committed) = (0u64, 0u64);
    let start = Instant::now();
    while committed < iters {
        clients[l].submit(&payload).unwrap();
        'wait: loop {
            let n = now();
            members[l].do_work(n);
            cycles += 1;
            while let Some(ev) = clients[l].poll() {
                if let ClientEvent::Committed { .. } = ev {
                    committed += 1;
                    break 'wait;
                }
            }
            members[f].do_work(n);
            if cycles % 4 == 0 {
                members[g].do_work(n);
            }
        }
    }
    let el = start.elapsed();
    println!(
        "{} ns/commit through the agents, {:.2} leader cycles/commit",
        el.as_nanos() as u64 / iters,
        cycles as f64 / iters as f64
    );
}
