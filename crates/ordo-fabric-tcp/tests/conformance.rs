//! The shared conformance suite, run on the tcp backend (members in one
//! process on loopback with ephemeral ports), over plain TCP and over TLS.

mod common;

use ordo_fabric::conformance::{self, Harness, Part};
use ordo_fabric::{Fabric, MemberId};
use ordo_fabric_tcp::TcpFabric;
use std::net::SocketAddr;
use std::time::Duration;

/// Remembers the last group's addresses so a member can be restarted at
/// its old address (where the survivors redial it).
struct TcpHarness {
    last: Vec<(MemberId, SocketAddr)>,
    region_len: usize,
    tls: Option<ordo_fabric_tcp::TlsSettings>,
}

impl Harness for TcpHarness {
    type Fabric = TcpFabric;

    fn group(&mut self, n: usize, region_len: usize) -> Vec<TcpFabric> {
        let tls = self.tls.clone();
        let g = common::group(n, region_len, |o| o.tls = tls.clone());
        self.last = g.iter().map(|f| (f.member(), f.local_addr())).collect();
        self.region_len = region_len;
        g
    }

    fn restart(&mut self, member: MemberId) -> Option<TcpFabric> {
        let (_, addr) = *self.last.iter().find(|(m, _)| *m == member)?;
        let mut o = common::options(member, self.region_len);
        o.listen = addr;
        o.tls = self.tls.clone();
        let peers = self.last.iter().copied().filter(|(m, _)| *m != member).collect();
        Some(TcpFabric::bind(o).expect("rebind the old address").connect(peers).expect("reconnect"))
    }

    fn run(
        &mut self,
        members: Vec<TcpFabric>,
        parts: Vec<Part<TcpFabric>>,
        limit: Duration,
    ) -> Vec<TcpFabric> {
        conformance::run_on_threads(members, parts, limit)
    }

    fn has_doorbell(&self) -> bool {
        true
    }
}

#[test]
fn tcp_passes_the_conformance_suite() {
    conformance::run_all(&mut TcpHarness { last: Vec::new(), region_len: 0, tls: None });
}

#[test]
fn tcp_over_tls_passes_the_conformance_suite() {
    let pki = common::tls::Pki::new();
    conformance::run_all(&mut TcpHarness { last: Vec::new(), region_len: 0, tls: Some(pki.member()) });
}
