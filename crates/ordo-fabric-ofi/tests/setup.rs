//! The set-up path: who may learn a member's address and memory key, and
//! what a mismatched peer gets.
#![cfg(feature = "ofi")]

use ordo_fabric::{Fabric, Write};
use ordo_fabric_ofi::{OfiFabric, OfiFabricError, OfiOptions};
use std::time::Duration;

fn options(member: u32, secret: &ordo_auth::Secret, region_len: usize) -> OfiOptions {
    let mut o = OfiOptions::new(member, "tcp;ofi_rxm", "127.0.0.1:0".parse().unwrap(), region_len);
    o.secret = Some(secret.clone());
    o.connect_timeout = Duration::from_secs(2);
    o.handshake_timeout = Duration::from_secs(1);
    o
}

#[test]
fn a_member_without_the_secret_learns_nothing_and_is_refused() {
    let secret = ordo_auth::Secret::generate();
    let a = OfiFabric::bind(options(0, &secret, 4096)).unwrap();
    let stranger = OfiFabric::bind(options(1, &ordo_auth::Secret::generate(), 4096)).unwrap();
    let err = stranger.connect(vec![(0, a.contact_addr())]).unwrap_err();
    assert!(matches!(err, OfiFabricError::Contact(_)), "{err}");
    assert!(err.to_string().contains("secret"), "{err}");
    // The honest member still comes up with a peer that holds the secret.
    let b = OfiFabric::bind(options(1, &secret, 4096)).unwrap();
    let (a_addr, b_addr) = (a.contact_addr(), b.contact_addr());
    let t = std::thread::spawn(move || b.connect(vec![(0, a_addr)]).unwrap());
    let mut a = a.connect(vec![(1, b_addr)]).unwrap();
    let b = t.join().unwrap();
    a.region().store_release(64, 42);
    a.post_write(Write::new(1, 64, 8)).unwrap();
    let start = std::time::Instant::now();
    while b.region().load_acquire(64) != 42 {
        assert!(start.elapsed() < Duration::from_secs(10), "the write never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_peer_with_another_region_length_is_an_error_naming_it() {
    let secret = ordo_auth::Secret::generate();
    let a = OfiFabric::bind(options(0, &secret, 4096)).unwrap();
    let b = OfiFabric::bind(options(1, &secret, 8192)).unwrap();
    let err = b.connect(vec![(0, a.contact_addr())]).unwrap_err().to_string();
    assert!(err.contains("4096") && err.contains("8192"), "{err}");
}

#[test]
fn an_unknown_provider_is_a_clear_error() {
    let secret = ordo_auth::Secret::generate();
    let mut o = options(0, &secret, 4096);
    o.provider = "no-such-provider".into();
    let err = OfiFabric::bind(o).unwrap_err().to_string();
    assert!(err.contains("no-such-provider") && err.contains("fi_getinfo"), "{err}");
}

#[test]
fn a_region_length_that_is_not_a_multiple_of_64_is_refused() {
    let secret = ordo_auth::Secret::generate();
    let err = OfiFabric::bind(options(0, &secret, 100)).unwrap_err().to_string();
    assert!(err.contains("multiple of 64"), "{err}");
}

/// Connected endpoints: a connection request needs a MAC under the set-up
/// key naming the acceptor's current incarnation; anything else is
/// rejected (the dialer's connection never comes up).
#[test]
fn a_connection_request_without_a_valid_mac_is_rejected() {
    use ordo_fabric_ofi::EndpointType;
    use ordo_fabric_ofi::sys::{CmEvent, Endpoint};
    let secret = ordo_auth::Secret::generate();
    let opts = |m| {
        let mut o = options(m, &secret, 4096);
        o.provider = "tcp".into();
        o.endpoint = EndpointType::Msg;
        o
    };
    let (a, b) = (OfiFabric::bind(opts(0)).unwrap(), OfiFabric::bind(opts(1)).unwrap());
    let (a_addr, b_addr) = (a.contact_addr(), b.contact_addr());
    let t = std::thread::spawn(move || b.connect(vec![(0, a_addr)]).unwrap());
    let a = a.connect(vec![(1, b_addr)]).unwrap();
    let _b = t.join().unwrap();
    // Someone who learned member 0's provider address (here: from its card)
    // but cannot make the MAC.
    let key = secret.derive(ordo_fabric_ofi::contact::KEY_LABEL);
    let cluster = ordo_fabric_ofi::contact::cluster_hash("ordo");
    let (card, _live) =
        ordo_fabric_ofi::contact::fetch_card(a.contact_addr(), 1, 0, cluster, &key, Duration::from_secs(1))
            .unwrap();
    let attempt = |param: Vec<u8>| -> bool {
        let mut ep = Endpoint::open(
            "tcp",
            EndpointType::Msg,
            None,
            ordo_fabric::Region::new_heap(4096),
            ordo_fabric::Region::new_heap(4096),
            7,
        )
        .unwrap();
        ep.connect(0, &card.name, &param).unwrap();
        let start = std::time::Instant::now();
        loop {
            match ep.event().unwrap() {
                Some(CmEvent::Connected { .. }) => return true,
                Some(CmEvent::Error { .. } | CmEvent::Shutdown { .. }) => return false,
                _ => {}
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no answer to the connection request");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    assert!(!attempt(vec![0u8; 36]), "a request with a zero MAC was accepted");
    // A well-formed request for another incarnation, MACed with another key.
    let mut p = Vec::new();
    p.extend_from_slice(&1u32.to_le_bytes());
    p.extend_from_slice(&5u64.to_le_bytes());
    p.extend_from_slice(&card.incarnation.to_le_bytes());
    let wrong = ordo_auth::Secret::generate().derive(ordo_fabric_ofi::contact::KEY_LABEL);
    let mac = wrong.tag(&[b"ordo ofi connect v1", &p]);
    p.extend_from_slice(&mac[..16]);
    assert!(!attempt(p.clone()), "a request MACed with another secret was accepted");
    // The same request MACed with the cluster's key is accepted.
    p.truncate(20);
    let mac = key.tag(&[b"ordo ofi connect v1", &p]);
    p.extend_from_slice(&mac[..16]);
    assert!(attempt(p), "a request with a valid MAC was refused");
}
