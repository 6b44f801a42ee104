//! The shared conformance suite, run on the tcp backend (members in one
//! process on loopback with ephemeral ports).

mod common;

use ordo_fabric::conformance::{self, Harness, Part};
use ordo_fabric_tcp::TcpFabric;
use std::time::Duration;

struct TcpHarness;

impl Harness for TcpHarness {
    type Fabric = TcpFabric;

    fn group(&mut self, n: usize, region_len: usize) -> Vec<TcpFabric> {
        common::group(n, region_len, |_| {})
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
    conformance::run_all(&mut TcpHarness);
}
