//! The fabric conformance suite on libfabric's software providers:
//! `tcp;ofi_rxm` (writes ordered by the provider) and `shm` (no
//! write-after-write order promised, so the endpoint fences).
#![cfg(feature = "ofi")]

use ordo_fabric::conformance::{self, Harness, Part};
use ordo_fabric::{Fabric, MemberId};
use ordo_fabric_ofi::{OfiFabric, OfiOptions};
use std::net::SocketAddr;
use std::time::Duration;

struct OfiHarness {
    provider: &'static str,
    endpoint: ordo_fabric_ofi::EndpointType,
    secret: ordo_auth::Secret,
    last: Vec<(MemberId, SocketAddr)>,
    region_len: usize,
}

impl OfiHarness {
    fn new(provider: &'static str) -> OfiHarness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("ORDO_LOG"))
            .with_test_writer()
            .try_init();
        OfiHarness {
            provider,
            endpoint: ordo_fabric_ofi::EndpointType::Rdm,
            secret: ordo_auth::Secret::generate(),
            last: Vec::new(),
            region_len: 0,
        }
    }

    fn options(&self, member: MemberId, listen: SocketAddr, region_len: usize) -> OfiOptions {
        let mut o = OfiOptions::new(member, self.provider, listen, region_len);
        o.endpoint = self.endpoint;
        o.secret = Some(self.secret.clone());
        o.cluster = "conformance".into();
        o
    }
}

/// Binds every member on an ephemeral contact port, then connects them
/// all (each waits for its peers' contact ports, which are already open).
fn group(h: &OfiHarness, n: usize, region_len: usize) -> Vec<OfiFabric> {
    let bindings: Vec<_> = (0..n as MemberId)
        .map(|m| OfiFabric::bind(h.options(m, "127.0.0.1:0".parse().unwrap(), region_len)).expect("bind"))
        .collect();
    let addrs: Vec<(MemberId, SocketAddr)> =
        bindings.iter().enumerate().map(|(i, b)| (i as MemberId, b.contact_addr())).collect();
    bindings
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            b.connect(addrs.iter().copied().filter(|p| p.0 != i as MemberId).collect()).expect("connect")
        })
        .collect()
}

impl Harness for OfiHarness {
    type Fabric = OfiFabric;

    fn group(&mut self, n: usize, region_len: usize) -> Vec<OfiFabric> {
        let g = group(self, n, region_len);
        self.last = g.iter().map(|f| (f.member(), f.contact_addr())).collect();
        self.region_len = region_len;
        g
    }

    fn restart(&mut self, member: MemberId) -> Option<OfiFabric> {
        let (_, addr) = *self.last.iter().find(|(m, _)| *m == member)?;
        let o = self.options(member, addr, self.region_len);
        let peers = self.last.iter().copied().filter(|(m, _)| *m != member).collect();
        Some(OfiFabric::bind(o).expect("rebind the old contact address").connect(peers).expect("reconnect"))
    }

    fn kill(&mut self, member: OfiFabric) {
        member.crash();
    }

    fn run(
        &mut self,
        members: Vec<OfiFabric>,
        parts: Vec<Part<OfiFabric>>,
        limit: Duration,
    ) -> Vec<OfiFabric> {
        conformance::run_on_threads(members, parts, limit)
    }

    fn has_doorbell(&self) -> bool {
        // Every provider tested here carries remote CQ data.
        true
    }
}

#[test]
fn ofi_tcp_rxm_passes_the_conformance_suite() {
    let mut h = OfiHarness::new("tcp;ofi_rxm");
    let g = h.group(2, 4096);
    assert!(!g[0].fenced(), "tcp;ofi_rxm promises write-after-write order: {:?}", g[0].provider());
    drop(g);
    conformance::run_all(&mut h);
}

/// Connected endpoints (`FI_EP_MSG`, RDMA's reliable connections) on
/// libfabric's `tcp` provider: the whole suite.
#[test]
fn ofi_tcp_msg_passes_the_conformance_suite() {
    let mut h = OfiHarness::new("tcp");
    h.endpoint = ordo_fabric_ofi::EndpointType::Msg;
    let g = h.group(2, 4096);
    assert!(!g[0].fenced(), "tcp promises write-after-write order: {:?}", g[0].provider());
    drop(g);
    conformance::run_all(&mut h);
}

/// The whole suite on `shm`, which reports no write-after-write order (the
/// endpoint fences) and returns each endpoint's completions in order: the
/// two checks that kill a member pass only because every peer gets its
/// own send endpoint (with one endpoint, a write outstanding to the dead
/// peer held back every later completion, and the live peer timed out).
#[test]
fn ofi_shm_passes_the_conformance_suite() {
    let mut h = OfiHarness::new("shm");
    let g = h.group(2, 4096);
    assert!(g[0].fenced(), "shm does not promise write-after-write order: {:?}", g[0].provider());
    drop(g);
    conformance::run_all(&mut h);
}

/// FIFO across the providers' protocol switch: a small write (inlined,
/// copied by the target when it polls) followed by a large one (which
/// `shm` copies straight into the target's memory from the sender): a
/// reader that sees the large write must see the small one before it.
fn small_then_large(provider: &'static str) {
    const SMALL: usize = 0;
    const LARGE: usize = 4096;
    const LARGE_LEN: usize = 64 * 1024;
    const ROUNDS: u64 = 2000;
    let mut h = OfiHarness::new(provider);
    let g = h.group(2, LARGE + LARGE_LEN);
    let writer: Part<OfiFabric> = {
        let mut next = 1u64;
        let mut events = Vec::new();
        Box::new(move |f| {
            if next > ROUNDS {
                return true;
            }
            // Wait until the reader acknowledged the previous round (it
            // writes the round it saw to our SMALL word).
            if f.region().load_acquire(SMALL + 8) + 1 < next {
                f.poll_events(&mut events);
                return false;
            }
            f.region().store_release(SMALL, next);
            conformance::post_retrying(f, ordo_fabric::Write::new(1, SMALL, 8), &mut events).unwrap();
            f.region().store_release(LARGE + LARGE_LEN - 8, next);
            conformance::post_retrying(f, ordo_fabric::Write::new(1, LARGE, LARGE_LEN), &mut events).unwrap();
            next += 1;
            false
        })
    };
    let reader: Part<OfiFabric> = {
        let mut seen = 0u64;
        let mut events = Vec::new();
        Box::new(move |f| {
            let large = f.region().load_acquire(LARGE + LARGE_LEN - 8);
            if large > seen {
                let small = f.region().load_acquire(SMALL);
                assert!(
                    small >= large,
                    "round {large}'s large write landed before its earlier small write ({small})"
                );
                seen = large;
                f.region().store_release(SMALL + 8, seen);
                conformance::post_retrying(f, ordo_fabric::Write::new(0, SMALL + 8, 8), &mut events).unwrap();
            }
            seen == ROUNDS
        })
    };
    h.run(g, vec![writer, reader], Duration::from_secs(60));
}

#[test]
fn ofi_shm_keeps_a_small_write_ahead_of_a_later_large_one() {
    small_then_large("shm");
}

#[test]
fn ofi_tcp_rxm_keeps_a_small_write_ahead_of_a_later_large_one() {
    small_then_large("tcp;ofi_rxm");
}

/// Bytes are taken when a write is posted: the writer overwrites a block
/// with poison right after posting it (as an engine overwrites a counter
/// or a reused slot after posting it); providers read their source when
/// they transmit, which under load is later, so without the staging copy
/// the peer receives poison.
fn bytes_are_taken_when_posted(provider: &'static str, endpoint: ordo_fabric_ofi::EndpointType) {
    const BLOCK: usize = 64 * 1024;
    const BLOCKS: usize = 8;
    const ROUNDS: u64 = 400;
    const POISON: u64 = 0xDEAD_BEEF_DEAD_BEEF;
    let mut h = OfiHarness::new(provider);
    h.endpoint = endpoint;
    let g = h.group(2, BLOCKS * BLOCK + 64);
    let writer: Part<OfiFabric> = {
        let mut k = 1u64;
        let mut events = Vec::new();
        Box::new(move |f| {
            if k > ROUNDS {
                // Let the last writes drain.
                f.poll_events(&mut events);
                return true;
            }
            let at = ((k as usize) % BLOCKS) * BLOCK;
            for w in 0..BLOCK / 8 {
                f.region().atomic_u64(at + w * 8).store(k, std::sync::atomic::Ordering::Relaxed);
            }
            conformance::post_retrying(f, ordo_fabric::Write::new(1, at, BLOCK), &mut events).unwrap();
            for w in 0..BLOCK / 8 {
                f.region().atomic_u64(at + w * 8).store(POISON, std::sync::atomic::Ordering::Relaxed);
            }
            k += 1;
            false
        })
    };
    let reader: Part<OfiFabric> = {
        let start = std::time::Instant::now();
        Box::new(move |f| {
            for b in 0..BLOCKS {
                for w in (0..BLOCK / 8).step_by(61) {
                    let v = f.region().load_acquire(b * BLOCK + w * 8);
                    assert_ne!(v, POISON, "block {b} word {w}: bytes stored after the post were sent");
                }
            }
            start.elapsed() > Duration::from_millis(1500)
        })
    };
    h.run(g, vec![writer, reader], Duration::from_secs(60));
}

#[test]
fn ofi_tcp_rxm_takes_the_bytes_when_posted() {
    bytes_are_taken_when_posted("tcp;ofi_rxm", ordo_fabric_ofi::EndpointType::Rdm);
}

#[test]
fn ofi_tcp_connected_takes_the_bytes_when_posted() {
    bytes_are_taken_when_posted("tcp", ordo_fabric_ofi::EndpointType::Msg);
}

#[test]
fn ofi_shm_takes_the_bytes_when_posted() {
    bytes_are_taken_when_posted("shm", ordo_fabric_ofi::EndpointType::Rdm);
}
