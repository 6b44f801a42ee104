//! Open-loop load on three in-process replicas (a quick diagnostic; the
//! real benchmark is `ordo bench r3p2`; a target for `perf record`).
//! Usage: replicated_load [rps] [secs] [sealed] [unreplicated]: with
//! `sealed`, replica datagrams carry the cluster secret's MAC, as `ordo
//! r3p2 serve --secret-file` does; with `unreplicated`, one server without
//! Raft (FIXED_ROUTE), the baseline replication is compared with.
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
    let (members, policy) = if unreplicated { (1, Policy::FixedRoute) } else { (3, Policy::ReplicatedRoute) };
    let sockets: Vec<_> = (0..members).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let peers: Vec<_> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    drop(sockets);
    let nodes: Vec<_> = (0..members)
        .map(|i| {
            let mut o = NodeOptions::new(i, peers.clone(), None);
            o.mode = HandlerMode::NetworkThread;
            o.service = ServiceKind::Spin { micros: 1 };
            o.auth.cluster = secret.clone();
            o.replicated = !unreplicated;
            start_node(&o).unwrap()
        })
        .collect();
    let mut c = Client::new(ClientConfig::new(peers.clone())).unwrap();
    c.call(policy, b"warm").unwrap();
    let gap = Duration::from_secs_f64(1.0 / rps);
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
