//! Loopback sanity benchmark: closed-loop latency and open-loop throughput
//! of an echo server, in both handler modes.
//! `cargo run --release -p ordo-r2p2 --example echo_latency`

use ordo_r2p2::{Client, ClientConfig, HandlerMode, Policy, Server, ServerConfig, simple};
use std::time::{Duration, Instant};

fn main() {
    for mode in [HandlerMode::NetworkThread, HandlerMode::Workers(1)] {
        let config = ServerConfig { handler_mode: mode, ..ServerConfig::default() };
        let server = Server::bind(config, simple(|r: &[u8]| r.to_vec())).expect("bind");
        let mut client = Client::new(ClientConfig::new(vec![server.local_addr()])).expect("client");
        let payload = [7u8; 64];
        let mut latencies_ns: Vec<u64> = (0..20_000)
            .map(|_| {
                let start = Instant::now();
                client.call(Policy::FixedRoute, &payload).expect("call");
                start.elapsed().as_nanos() as u64
            })
            .collect();
        latencies_ns.sort_unstable();
        let at =
            |q: f64| latencies_ns[((latencies_ns.len() as f64 * q) as usize).min(latencies_ns.len() - 1)];
        println!("{mode:?}: closed loop p50 {} ns, p99 {} ns, p99.9 {} ns", at(0.5), at(0.99), at(0.999));

        let total = 200_000u64;
        let window = 128;
        let (mut sent, mut done, mut failed) = (0u64, 0u64, 0u64);
        let start = Instant::now();
        while done < total {
            while sent < total && client.in_flight() < window {
                client.send(Policy::LbRoute, &payload).expect("send");
                sent += 1;
            }
            client.wait(Duration::from_millis(10));
            while let Some((_, result)) = client.try_recv() {
                done += 1;
                failed += result.is_err() as u64;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{mode:?}: open loop {:.0} req/s ({failed} failed), server {:?}",
            total as f64 / secs,
            server.stats().total_drops()
        );
        server.shutdown();
    }
}
