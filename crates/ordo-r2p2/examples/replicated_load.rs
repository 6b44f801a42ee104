//! Open-loop load on three in-process replicas (a quick diagnostic; the
//! real benchmark is `ordo bench r3p2`). Usage: replicated_load [rps]
//! [secs] [sealed] [unreplicated] [park|spin]: with `sealed`, replica datagrams
//! carry the cluster secret's MAC, as `ordo r3p2 serve --secret-file`
//! does; with `unreplicated`, one server without Raft (FIXED_ROUTE), the
//! baseline replication is compared with; with `park`, the servers park
//! as soon as a turn finds nothing, so that each network thread's CPU time
//! (printed per request) is its work, not its idle spinning; with `spin`,
//! they never park (an idle turn then costs the same every time).
use ordo_agent::IdleStrategy;
use ordo_r2p2::{Client, ClientConfig, HandlerMode, NodeOptions, Policy, ServiceKind, start_node};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rps: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000.0);
    let secs: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let flag = |f: &str| args.iter().skip(3).any(|a| a == f);
    let secret = flag("sealed").then(ordo_auth::Secret::generate);
    let unreplicated = flag("unreplicated");
    let park = flag("park");
    let spin = flag("spin");
    let (members, policy) = if unreplicated { (1, Policy::FixedRoute) } else { (3, Policy::ReplicatedRoute) };
    let sockets: Vec<_> = (0..members).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let peers: Vec<_> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    drop(sockets);
    let mut threads: Vec<Vec<u32>> = Vec::new();
    let nodes: Vec<_> = (0..members)
        .map(|i| {
            let before = net_threads();
            let mut o = NodeOptions::new(i, peers.clone(), None);
            o.mode = HandlerMode::NetworkThread;
            o.service = ServiceKind::Spin { micros: 1 };
            o.auth.cluster = secret.clone();
            o.replicated = !unreplicated;
            if park {
                o.idle = IdleStrategy::BackoffPark {
                    spins: 0,
                    yields: 0,
                    park_min: Duration::from_micros(20),
                    park_max: Duration::from_millis(1),
                };
            }
            if spin {
                o.idle = IdleStrategy::BusySpin;
            }
            let node = start_node(&o).unwrap();
            threads.push(net_threads().into_iter().filter(|t| !before.contains(t)).collect());
            node
        })
        .collect();
    let mut c = Client::new(ClientConfig::new(peers.clone())).unwrap();
    c.call(policy, b"warm").unwrap();
    let gap = Duration::from_secs_f64(1.0 / rps);
    let cpu0: Vec<u64> = threads.iter().map(|t| t.iter().map(|&t| cpu_ns(t)).sum()).collect();
    let start = Instant::now();
    let mut next = start;
    let mut sent = std::collections::HashMap::new();
    let mut lat = Vec::new();
    let mut errors = 0;
    while start.elapsed().as_secs_f64() < secs {
        let now = Instant::now();
        while next <= now {
            let id = c.send(policy, b"x").unwrap();
            sent.insert(id, next);
            next += gap;
        }
        c.poll_responses();
        while let Some((id, r)) = c.try_recv() {
            if r.is_err() {
                errors += 1;
            }
            if let Some(t) = sent.remove(&id) {
                lat.push(t.elapsed().as_micros() as u64);
            }
        }
    }
    let done = lat.len().max(1) as f64;
    let cpu: Vec<String> = threads
        .iter()
        .zip(&cpu0)
        .map(|(t, c0)| {
            let used = t.iter().map(|&t| cpu_ns(t)).sum::<u64>().saturating_sub(*c0);
            format!("{:.2}", used as f64 / done / 1e3)
        })
        .collect();
    println!("server threads' CPU per request, µs (node order): {}", cpu.join(" "));
    lat.sort();
    let p = |q: f64| lat.get(((lat.len() as f64) * q) as usize).copied().unwrap_or(0);
    println!(
        "offered {rps} rps: done {} ({:.0}/s) errors {errors} p50 {} us p90 {} us p99 {} us max {} us",
        lat.len(),
        lat.len() as f64 / secs,
        p(0.5),
        p(0.9),
        p(0.99),
        lat.last().copied().unwrap_or(0)
    );
    for (i, n) in nodes.iter().enumerate() {
        // An unreplicated server has no Raft status.
        if let Some(s) = n.status() {
            println!(
                "node {i}: term {} leader {:?} commit {} applied {} syncs {}",
                s.term(),
                s.leader(),
                s.commit(),
                s.applied(),
                s.syncs()
            );
        }
        println!("   {:?}", n.server().stats());
    }
    let _ = c;
    for n in nodes {
        n.shutdown();
    }
}

/// This process's threads named like a network thread.
fn net_threads() -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let tid: u32 = e.file_name().to_string_lossy().parse().unwrap();
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == "r2p2-net" {
            out.push(tid);
        }
    }
    out
}

/// Time thread `tid` has run on a CPU, ns (`schedstat`).
fn cpu_ns(tid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}
