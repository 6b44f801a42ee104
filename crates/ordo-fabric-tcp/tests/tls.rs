//! TLS links (mutual, one CA): members with certificates link and carry
//! writes; a plaintext peer, a peer whose certificate another CA signed,
//! and one without a client certificate write nothing.

mod common;

use common::tls::Pki;
use common::{hello, wait_for_event};
use ordo_fabric::{Fabric, FabricEvent, Write, WriteTag};
use ordo_fabric_tcp::{TcpError, TcpFabric, TlsSettings};
use std::io::{Read, Write as _};
use std::net::TcpStream;
use std::time::Duration;

const REGION: usize = 4096;
const LIMIT: Duration = Duration::from_secs(10);

fn pair(
    a: Option<TlsSettings>,
    b: Option<TlsSettings>,
    timeout: Duration,
) -> Vec<Result<TcpFabric, TcpError>> {
    let tls = [a, b];
    common::try_group(2, REGION, |i, o| {
        o.connect_timeout = timeout;
        o.tls = tls[i as usize].clone();
    })
}

#[test]
fn members_link_over_tls_and_large_writes_arrive() {
    let pki = Pki::new();
    let mut g: Vec<TcpFabric> =
        pair(Some(pki.member()), Some(pki.member()), LIMIT).into_iter().map(|r| r.unwrap()).collect();
    let data: Vec<u8> = (0..REGION).map(|i| (i * 7) as u8).collect();
    g[0].region().write_bytes(0, &data);
    for round in 0..50u64 {
        g[0].post_write(Write::signaled(1, 0, REGION, WriteTag(round))).unwrap();
        let events = wait_for_event(&mut g[0], LIMIT, |_| true);
        assert_eq!(events, vec![FabricEvent::Completed { peer: 1, tag: WriteTag(round) }]);
    }
    let mut out = vec![0u8; REGION];
    g[1].region().read_bytes(0, &mut out);
    assert_eq!(out, data);
}

#[test]
fn a_tls_member_and_a_plain_member_never_link() {
    let pki = Pki::new();
    let results = pair(Some(pki.member()), None, Duration::from_millis(800));
    assert!(results.iter().all(|r| matches!(r, Err(TcpError::ConnectTimeout { .. }))));
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let (ours, theirs) = (Pki::new(), Pki::new());
    let results = pair(Some(ours.member()), Some(theirs.member()), Duration::from_millis(800));
    assert!(results.iter().all(|r| matches!(r, Err(TcpError::ConnectTimeout { .. }))));
}

#[test]
fn a_plaintext_stranger_writes_nothing_to_a_tls_member() {
    let pki = Pki::new();
    let mut g: Vec<TcpFabric> =
        pair(Some(pki.member()), Some(pki.member()), LIMIT).into_iter().map(|r| r.unwrap()).collect();
    // A correct HELLO and a WRITE, in the clear: not TLS, so refused.
    let mut s = TcpStream::connect(g[1].local_addr()).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let _ = s.write_all(&hello(0, REGION, 5).encode());
    let mut frame = ordo_fabric_tcp::frame::FrameHeader::write(64, 8, 1, false).encode().to_vec();
    frame.extend_from_slice(&[0xEE; 8]);
    let _ = s.write_all(&frame);
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {} // a TLS alert
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("not closed: {e}"),
        }
    }
    assert_eq!(g[1].region().load_acquire(64), 0);
    let mut events = Vec::new();
    g[1].poll_events(&mut events);
    assert_eq!(events, vec![], "the stranger disturbed the link");
    g[0].region().store_release(128, 9);
    g[0].post_write(Write::signaled(1, 128, 8, WriteTag(1))).unwrap();
    wait_for_event(&mut g[0], LIMIT, |e| matches!(e, FabricEvent::Completed { .. }));
    assert_eq!(g[1].region().load_acquire(128), 9);
}

#[test]
fn settings_load_from_pem_files_and_bad_files_are_clear_errors() {
    let pki = Pki::new();
    let dir = std::env::temp_dir().join(format!("ordo-tls-pem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, ca) = pki.member_pem();
    let (c, k, a) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("ca.pem"));
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    std::fs::write(&a, ca).unwrap();
    TlsSettings::from_pem_files(&c, &k, &a).expect("PEM files load");
    let err = TlsSettings::from_pem_files(&c, &dir.join("missing.pem"), &a).unwrap_err();
    assert!(err.to_string().contains("missing.pem"), "{err}");
    std::fs::write(&a, "not a certificate").unwrap();
    let err = TlsSettings::from_pem_files(&c, &k, &a).unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
