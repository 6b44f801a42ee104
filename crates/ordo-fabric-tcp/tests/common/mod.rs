//! Helpers shared by the tcp fabric's integration tests.
#![allow(dead_code)]

/// The counting allocator (the tests that measure the heap install it).
pub mod alloc;
/// Test certificates for TLS links.
pub mod tls;

use ordo_auth::handshake::{self, Role};
use ordo_fabric::{Fabric, FabricEvent, MemberId};
use ordo_fabric_tcp::frame::{
    HELLO_FRAME_LEN, Hello, PROOF_FRAME_LEN, PROTOCOL_VERSION, cluster_hash, decode_proof, encode_proof,
};
use ordo_fabric_tcp::{HANDSHAKE_KEY_LABEL, Secret, TcpError, TcpFabric, TcpOptions};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub const CLUSTER: &str = "ordo-tcp-tests";

/// The test cluster's secret (every member in these tests holds it).
pub fn secret() -> Secret {
    Secret::from_bytes(b"the tcp fabric tests' cluster secret").unwrap()
}

/// Options on an ephemeral loopback port, with a write timeout that rides
/// out a loaded 2-core test machine.
pub fn options(member: MemberId, region_len: usize) -> TcpOptions {
    let mut o = TcpOptions::new(member, "127.0.0.1:0".parse().unwrap(), region_len);
    o.cluster = CLUSTER.to_string();
    o.send_buffer_bytes = 2 << 20;
    o.write_timeout = Duration::from_secs(5);
    o.connect_timeout = Duration::from_secs(10);
    o.reconnect_interval = Duration::from_millis(20);
    o.secret = Some(secret());
    o
}

/// A group of `n` members (ids `0..n`), every link up; `tweak` adjusts options.
pub fn group(n: usize, region_len: usize, tweak: impl Fn(&mut TcpOptions)) -> Vec<TcpFabric> {
    try_group(n, region_len, |_, o| tweak(o)).into_iter().map(|r| r.expect("connect")).collect()
}

/// Starts `n` members (ids `0..n`) on loopback, each connecting on its own
/// thread; `tweak` adjusts member `i`'s options. Returns each one's result.
pub fn try_group(
    n: usize,
    region_len: usize,
    tweak: impl Fn(MemberId, &mut TcpOptions),
) -> Vec<Result<TcpFabric, TcpError>> {
    let bindings: Vec<_> = (0..n)
        .map(|i| {
            let mut o = options(i as MemberId, region_len);
            tweak(i as MemberId, &mut o);
            TcpFabric::bind(o).expect("bind")
        })
        .collect();
    let addrs: Vec<SocketAddr> = bindings.iter().map(|b| b.local_addr()).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = bindings
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                let peers: Vec<(MemberId, SocketAddr)> =
                    (0..n).filter(|&j| j != i).map(|j| (j as MemberId, addrs[j])).collect();
                s.spawn(move || b.connect(peers))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("connect thread")).collect()
    })
}

/// Polls `f` until `pred` holds for an event, collecting all events; panics
/// after `limit`.
pub fn wait_for_event(
    f: &mut TcpFabric,
    limit: Duration,
    mut pred: impl FnMut(&FabricEvent) -> bool,
) -> Vec<FabricEvent> {
    let deadline = Instant::now() + limit;
    let mut events = Vec::new();
    loop {
        let before = events.len();
        f.poll_events(&mut events);
        if events[before..].iter().any(&mut pred) {
            return events;
        }
        assert!(Instant::now() < deadline, "expected event not seen within {limit:?}: {events:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until `cond` holds, sleeping briefly between checks.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A hand-driven peer: a raw std stream that speaks (or breaks) the protocol.
pub struct FakePeer {
    pub stream: TcpStream,
    pub their_hello: Hello,
}

/// The HELLO a correct member `member` of the test cluster would send.
pub fn hello(member: MemberId, region_len: usize, incarnation: u64) -> Hello {
    Hello {
        version: PROTOCOL_VERSION,
        member,
        region_len: region_len as u64,
        cluster_hash: cluster_hash(CLUSTER),
        incarnation,
        nonce: handshake::nonce(),
    }
}

impl FakePeer {
    /// Dials `addr` and runs the whole handshake as the dialer holding the
    /// test secret: sends `ours`, reads and checks the fabric's HELLO and
    /// PROOF, sends our PROOF.
    pub fn connect(addr: SocketAddr, ours: &Hello) -> FakePeer {
        let (mut stream, their_hello, transcript) = Self::open(addr, ours);
        let key = secret().derive(HANDSHAKE_KEY_LABEL);
        let proof = handshake::proof(&key, Role::Dialer, &transcript.0, &transcript.1);
        stream.write_all(&encode_proof(&proof)).unwrap();
        FakePeer { stream, their_hello }
    }

    /// Dials, sends `ours`, reads the fabric's HELLO and PROOF and checks
    /// the PROOF with the test secret; returns the stream (our PROOF not
    /// sent), their HELLO, and both encoded HELLOs (dialer's, acceptor's).
    pub fn open(addr: SocketAddr, ours: &Hello) -> (TcpStream, Hello, (Vec<u8>, Vec<u8>)) {
        let mut stream = TcpStream::connect(addr).expect("dial the fabric");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let our_bytes = ours.encode();
        stream.write_all(&our_bytes).unwrap();
        let mut buf = [0u8; HELLO_FRAME_LEN];
        stream.read_exact(&mut buf).expect("the fabric answers with a HELLO");
        let their_hello = Hello::decode(&buf).expect("a valid HELLO");
        let mut proof = [0u8; PROOF_FRAME_LEN];
        stream.read_exact(&mut proof).expect("the fabric proves the secret");
        let key = secret().derive(HANDSHAKE_KEY_LABEL);
        let tag = decode_proof(&proof).expect("a PROOF frame");
        assert!(
            handshake::verify(&key, Role::Acceptor, &our_bytes, &buf, tag),
            "the fabric's proof verifies"
        );
        (stream, their_hello, (our_bytes.to_vec(), buf.to_vec()))
    }

    /// Asserts that the fabric closes the stream (EOF or reset) within `limit`,
    /// skipping whatever it sent before.
    pub fn expect_closed(&mut self, limit: Duration) {
        expect_closed(&mut self.stream, limit);
    }
}

/// Asserts that the other end closes `stream` within `limit`.
pub fn expect_closed(stream: &mut TcpStream, limit: Duration) {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("stream not closed by the fabric: {e}"),
        }
        assert!(Instant::now() < deadline, "stream not closed by the fabric within {limit:?}");
    }
}
