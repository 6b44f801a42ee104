//! Strangers on the tcp fabric's port (SECURITY.md): a connection that does
//! not prove the cluster secret — a wrong secret, no proof, a replayed
//! handshake, an impostor listener — writes nothing, cuts no link, and a
//! flood of half-open connections from one source does not keep a member
//! out. Every test asserts the region and the links, not a log line.

mod common;

use common::{FakePeer, hello, wait_for_event, wait_until};
use ordo_auth::Secret;
use ordo_auth::handshake::{self, Role};
use ordo_fabric::{Fabric, FabricEvent, ReconnectError, Write, WriteTag};
use ordo_fabric_tcp::frame::{FrameHeader, encode_proof};
use ordo_fabric_tcp::{HANDSHAKE_KEY_LABEL, TcpError, TcpFabric};
use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const REGION: usize = 4096;
const LIMIT: Duration = Duration::from_secs(10);
/// Where the stranger aims: member 0's heartbeat-like word in member 1's region.
const TARGET: usize = 64;

fn forged_write() -> Vec<u8> {
    let mut bytes = FrameHeader::write(TARGET as u64, 8, 1, true).encode().to_vec();
    bytes.extend_from_slice(&0xBAD0_BAD0_BAD0_BAD0u64.to_le_bytes());
    bytes
}

/// Reads until the fabric closes the stream; returns what it sent first.
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the fabric did not close a refused connection: {e}"),
        }
    }
}

/// The real link 0 → 1 still carries a signaled write, and member 1 saw no
/// event about member 0.
fn assert_link_intact(g: &mut [TcpFabric], tag: u64) {
    let mut events = Vec::new();
    g[1].poll_events(&mut events);
    assert_eq!(events, vec![], "the stranger disturbed member 1's link to member 0");
    g[0].region().store_release(256, tag);
    g[0].post_write(Write::signaled(1, 256, 8, WriteTag(tag))).unwrap();
    let events = wait_for_event(&mut g[0], LIMIT, |_| true);
    assert_eq!(events, vec![FabricEvent::Completed { peer: 1, tag: WriteTag(tag) }]);
    assert_eq!(g[1].region().load_acquire(256), tag);
    assert_eq!(g[1].region().load_acquire(TARGET), 0, "a stranger's write reached the region");
}

#[test]
fn a_stranger_with_a_wrong_secret_or_no_proof_writes_nothing_and_cuts_no_link() {
    let mut g = common::group(2, REGION, |_| {});
    let addr = g[1].local_addr();

    // (a) A wrong secret: HELLO as member 0, a proof made with another key,
    // then a signaled WRITE into member 0's word.
    let mut stream = TcpStream::connect(addr).unwrap();
    let ours = hello(0, REGION, 99).encode();
    stream.write_all(&ours).unwrap();
    let mut answer = [0u8; 56 + 72];
    stream.read_exact(&mut answer).expect("the fabric answers a matching HELLO with its HELLO and PROOF");
    let wrong = Secret::from_bytes(b"not the cluster secret at all").unwrap().derive(HANDSHAKE_KEY_LABEL);
    let proof = handshake::proof(&wrong, Role::Dialer, &ours, &answer[..72]);
    let _ = stream.write_all(&encode_proof(&proof));
    let _ = stream.write_all(&forged_write());
    let got = read_until_closed(&mut stream);
    assert!(got.is_empty(), "the fabric acknowledged something: {got:?}");
    assert_link_intact(&mut g, 1);

    // (b) No proof at all (the old protocol): HELLO, then a WRITE at once.
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(&hello(0, REGION, 100).encode()).unwrap();
    let _ = stream.write_all(&forged_write());
    let got = read_until_closed(&mut stream);
    assert_eq!(got.len(), 72 + 56, "only the fabric's own HELLO and PROOF came back");
    assert_link_intact(&mut g, 2);

    // (c) No HELLO at all: a WRITE first.
    let mut stream = TcpStream::connect(addr).unwrap();
    let _ = stream.write_all(&forged_write());
    assert!(read_until_closed(&mut stream).is_empty());
    assert_link_intact(&mut g, 3);
}

#[test]
fn a_replayed_handshake_is_refused() {
    // Member 1 alone, its peer 0 played by a fake that holds the secret.
    let mut o = common::options(1, REGION);
    o.reconnect_interval = Duration::from_millis(20);
    let binding = TcpFabric::bind(o).unwrap();
    let addr = binding.local_addr();
    let unused: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let connecting = std::thread::spawn(move || binding.connect(vec![(0, unused)]).unwrap());
    // A genuine handshake, recorded.
    let ours = hello(0, REGION, 7);
    let (mut genuine, _, (dialer_hello, acceptor_hello)) = FakePeer::open(addr, &ours);
    let key = common::secret().derive(HANDSHAKE_KEY_LABEL);
    let proof = encode_proof(&handshake::proof(&key, Role::Dialer, &dialer_hello, &acceptor_hello));
    genuine.write_all(&proof).unwrap();
    let mut fabric = connecting.join().unwrap();
    drop(genuine);
    wait_for_event(&mut fabric, LIMIT, |e| matches!(e, FabricEvent::Suspected { .. }));

    // The captured bytes, replayed on a new connection, with a WRITE after.
    let mut replay = TcpStream::connect(addr).unwrap();
    replay.write_all(&dialer_hello).unwrap();
    replay.write_all(&proof).unwrap();
    let _ = replay.write_all(&forged_write());
    let got = read_until_closed(&mut replay);
    assert_eq!(got.len(), 72 + 56, "the fabric answered with a fresh HELLO and PROOF only");
    assert_ne!(&got[..72], &acceptor_hello[..], "the fabric's nonce is fresh");
    assert!(matches!(fabric.reconnect(0), Err(ReconnectError::Unreachable(0, _))), "no standby link");
    assert_eq!(fabric.region().load_acquire(TARGET), 0);
    let mut events = Vec::new();
    fabric.poll_events(&mut events);
    assert_eq!(events, vec![]);
}

#[test]
fn members_with_different_secrets_never_link() {
    let results = common::try_group(2, REGION, |i, o| {
        o.connect_timeout = Duration::from_millis(800);
        if i == 1 {
            o.secret = Some(Secret::from_bytes(b"an impostor's own secret").unwrap());
        }
    });
    for r in results {
        assert!(matches!(r, Err(TcpError::ConnectTimeout { .. })), "{r:?}");
    }
}

/// Member 0 of `g` (linked to member 1, listening at `addr1`) restarts as a
/// new incarnation; checks that member 1 takes its new link within 5 s and
/// that it carries a signaled write of `tag`; returns how long it took.
fn restart_member_0(g: &mut Vec<TcpFabric>, addr1: SocketAddr, tag: u64) -> Duration {
    drop(g.remove(0));
    wait_for_event(&mut g[0], LIMIT, |e| matches!(e, FabricEvent::Suspected { .. }));
    let started = Instant::now();
    let mut o = common::options(0, REGION);
    o.peers = vec![(1, addr1)];
    let mut restarted = TcpFabric::connect(o).expect("member 0 gets in despite the flood");
    let mut result = Err(ReconnectError::UnknownPeer(0));
    wait_until(LIMIT, "member 1 to take member 0's new link", || {
        result = g[0].reconnect(0);
        result.is_ok()
    });
    let took = started.elapsed();
    assert_eq!(result, Ok(restarted.incarnation()));
    assert!(took < Duration::from_secs(5), "member 0 was kept out for {took:?}");
    restarted.region().store_release(256, tag);
    restarted.post_write(Write::signaled(1, 256, 8, WriteTag(tag))).unwrap();
    let events = wait_for_event(&mut restarted, LIMIT, |_| true);
    assert_eq!(events, vec![FabricEvent::Completed { peer: 1, tag: WriteTag(tag) }]);
    assert_eq!(g[0].region().load_acquire(256), tag);
    took
}

/// A TCP connection to `to` from the loopback address `127.0.0.<host>`
/// (std cannot bind a TCP socket before connecting, so through libc).
fn connect_from(host: u8, to: SocketAddr) -> Option<TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else { return None };
    let sockaddr = |ip: [u8; 4], port: u16| {
        // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
        let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_port = port.to_be();
        a.sin_addr.s_addr = u32::from_be_bytes(ip).to_be();
        a
    };
    let (local, remote) = (sockaddr([127, 0, 0, host], 0), sockaddr(to.ip().octets(), to.port()));
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh descriptor, owned by the returned stream (closed on
    // every path by its drop); the addresses outlive the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let stream = TcpStream::from_raw_fd(fd);
        let ok = libc::bind(fd, (&raw const local).cast(), len) == 0
            && libc::connect(fd, (&raw const remote).cast(), len) == 0;
        ok.then_some(stream)
    }
}

#[test]
fn a_flood_of_half_open_connections_from_many_sources_keeps_no_member_out() {
    let mut g = common::group(2, REGION, |o| o.handshake_timeout = Duration::from_millis(500));
    let addr1 = g[1].local_addr();
    // Two threads open connections without pause from 127.0.0.2..=127.0.0.33
    // (never saying anything) while member 0 restarts.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let flooders: Vec<_> = (0..2u8)
        .map(|t| {
            let (stop, opened) = (stop.clone(), opened.clone());
            std::thread::spawn(move || {
                let mut held = std::collections::VecDeque::new();
                let mut host = 2 + t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(s) = connect_from(host, addr1) {
                        held.push_back(s);
                        opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if held.len() > 300 {
                        held.pop_front();
                    }
                    host = if host >= 32 { 2 + t } else { host + 2 };
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let took = restart_member_0(&mut g, addr1, 78);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    eprintln!(
        "member 0 relinked {took:?} after its restart, under a flood of {} connections from 31 addresses",
        opened.load(std::sync::atomic::Ordering::Relaxed)
    );
}

#[test]
fn a_flood_of_half_open_connections_from_one_source_keeps_no_member_out() {
    let mut g = common::group(2, REGION, |o| o.handshake_timeout = Duration::from_millis(500));
    let addr1 = g[1].local_addr();
    // 200 connections that never say anything, all from 127.0.0.1, and
    // more opened while member 0 restarts.
    let idle: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(addr1).unwrap()).collect();
    assert_link_intact(&mut g, 4);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = TcpStream::connect(addr1) {
                    held.push(s);
                }
                if held.len() > 400 {
                    held.drain(..200);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    // Member 0 restarts (a new incarnation) and must get its link back.
    let took = restart_member_0(&mut g, addr1, 77);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flooder.join().unwrap();
    drop(idle);
    eprintln!("member 0 relinked {took:?} after its restart, under a flood from the same address");
}
