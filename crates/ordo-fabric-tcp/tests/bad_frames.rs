//! Malformed input from a peer: a raw stream completes a valid handshake
//! pretending to be member 0, then misbehaves. The fabric (member 1) must
//! close the connection, suspect the peer with `BadFrame`, and apply nothing
//! of the bad frame. Also: handshake mismatches, partial frames, the wire
//! format itself, and the signaled-write timeout.

mod common;

use common::alloc;

#[global_allocator]
static ALLOC: alloc::CountingAlloc = alloc::CountingAlloc;

use common::{FakePeer, hello, wait_for_event, wait_until};
use ordo_fabric::{Fabric, FabricEvent, FailureCause, MemberId, PostError, ReconnectError, Write, WriteTag};
use ordo_fabric_tcp::frame::{FLAG_SIGNALED, FrameHeader, FrameKind, HEADER_LEN, Hello, cluster_hash};
use ordo_fabric_tcp::{TcpFabric, TcpOptions};
use std::io::{Read, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

const REGION: usize = 4096;
const MAX_FRAME: usize = 1024;
const LIMIT: Duration = Duration::from_secs(10);

/// Member 1 on loopback, whose only peer (0) is played by a [`FakePeer`].
fn fabric_with_fake_peer(tweak: impl FnOnce(&mut TcpOptions)) -> (TcpFabric, FakePeer) {
    let mut o = common::options(1, REGION);
    o.max_frame_bytes = MAX_FRAME;
    tweak(&mut o);
    let binding = TcpFabric::bind(o).unwrap();
    let addr = binding.local_addr();
    // Member 1 never dials member 0 (the lower id dials), so 0's address is unused.
    let unused: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let connecting = std::thread::spawn(move || binding.connect(vec![(0, unused)]).unwrap());
    let fake = FakePeer::connect(addr, &hello(0, REGION, 1));
    let fabric = connecting.join().unwrap();
    assert_eq!(fake.their_hello.member, 1);
    assert_eq!(fake.their_hello.incarnation, fabric.incarnation());
    (fabric, fake)
}

/// Connects a new incarnation of the fake member 0 and makes it the link.
fn reconnect_fake(fabric: &mut TcpFabric, incarnation: u64) -> FakePeer {
    let fake = FakePeer::connect(fabric.local_addr(), &hello(0, REGION, incarnation));
    let mut result = Err(ReconnectError::UnknownPeer(0));
    wait_until(LIMIT, "the new connection to stand by", || {
        result = fabric.reconnect(0);
        result.is_ok()
    });
    assert_eq!(result, Ok(incarnation));
    assert!(!fabric.is_suspected(0));
    let events = wait_for_event(fabric, LIMIT, |e| matches!(e, FabricEvent::Reconnected { .. }));
    assert_eq!(events, vec![FabricEvent::Reconnected { peer: 0, incarnation }]);
    fake
}

fn assert_region_zero(fabric: &TcpFabric) {
    let mut out = vec![0u8; REGION];
    fabric.region().read_bytes(0, &mut out);
    assert!(out.iter().all(|b| *b == 0), "a refused frame changed the region");
}

/// Sends `bytes`, then expects: connection closed, exactly one
/// `Suspected{0, cause}`, region unchanged.
fn send_and_expect_rejection(fabric: &mut TcpFabric, fake: &mut FakePeer, bytes: &[u8], cause: FailureCause) {
    // The peer may close while we write; that is fine.
    let _ = fake.stream.write_all(bytes);
    fake.expect_closed(LIMIT);
    let events = wait_for_event(fabric, LIMIT, |e| matches!(e, FabricEvent::Suspected { .. }));
    assert_eq!(events, vec![FabricEvent::Suspected { peer: 0, cause }]);
    assert!(fabric.is_suspected(0));
    assert_eq!(fabric.post_write(Write::new(0, 0, 8)), Err(PostError::PeerSuspected(0)));
    assert_region_zero(fabric);
}

fn frame(header: FrameHeader, payload_len: usize) -> Vec<u8> {
    let mut bytes = header.encode().to_vec();
    bytes.extend(std::iter::repeat_n(0xEEu8, payload_len));
    bytes
}

#[test]
fn bad_frames_close_the_connection_and_are_never_applied() {
    let (mut fabric, mut fake) = fabric_with_fake_peer(|_| {});

    // (a) A WRITE that ends past the region.
    let header = FrameHeader::write((REGION - 4) as u64, 8, 1, false);
    send_and_expect_rejection(&mut fabric, &mut fake, &frame(header, 8), FailureCause::BadFrame);

    // (a') One whose offset + len overflows u64.
    let mut fake = reconnect_fake(&mut fabric, 2);
    let header = FrameHeader::write(u64::MAX - 3, 8, 1, false);
    send_and_expect_rejection(&mut fabric, &mut fake, &frame(header, 8), FailureCause::BadFrame);

    // (b) A WRITE longer than max_frame_bytes (sent whole).
    let mut fake = reconnect_fake(&mut fabric, 3);
    let header = FrameHeader::write(0, MAX_FRAME as u32 + 8, 1, false);
    send_and_expect_rejection(&mut fabric, &mut fake, &frame(header, MAX_FRAME + 8), FailureCause::BadFrame);

    // (b') A 4 GiB claim with no payload: refused at once, no allocation of its size.
    let mut fake = reconnect_fake(&mut fabric, 4);
    alloc::reset_largest();
    let header = FrameHeader::write(0, u32::MAX, 1, false);
    send_and_expect_rejection(&mut fabric, &mut fake, &frame(header, 16), FailureCause::BadFrame);
    assert!(alloc::largest_allocation() < 16 << 20, "allocated {} bytes", alloc::largest_allocation());

    // (c) An unknown kind.
    let mut fake = reconnect_fake(&mut fabric, 5);
    let header = FrameHeader { kind: 0x7F, flags: 0, reserved: 0, len: 8, offset: 0, seq: 1 };
    send_and_expect_rejection(&mut fabric, &mut fake, &frame(header, 8), FailureCause::BadFrame);

    // A HELLO after the handshake.
    let mut fake = reconnect_fake(&mut fabric, 6);
    send_and_expect_rejection(&mut fabric, &mut fake, &hello(0, REGION, 6).encode(), FailureCause::BadFrame);

    // Unknown flags, and a sequence number that skips.
    let mut fake = reconnect_fake(&mut fabric, 7);
    let header = FrameHeader { flags: 0x80, ..FrameHeader::write(0, 8, 1, false) };
    send_and_expect_rejection(&mut fabric, &mut fake, &frame(header, 8), FailureCause::BadFrame);
    let mut fake = reconnect_fake(&mut fabric, 8);
    let header = FrameHeader::write(0, 8, 2, false);
    send_and_expect_rejection(&mut fabric, &mut fake, &frame(header, 8), FailureCause::BadFrame);

    // An ACK of a write that was never posted.
    let mut fake = reconnect_fake(&mut fabric, 9);
    send_and_expect_rejection(&mut fabric, &mut fake, &FrameHeader::ack(5).encode(), FailureCause::BadFrame);

    // A WRITE whose payload never fully arrives: nothing of it is applied.
    let mut fake = reconnect_fake(&mut fabric, 10);
    let header = FrameHeader::write(0, 64, 1, false);
    let mut bytes = frame(header, 64);
    bytes.truncate(HEADER_LEN + 32);
    fake.stream.write_all(&bytes).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    fake.stream.shutdown(Shutdown::Write).unwrap();
    let events = wait_for_event(&mut fabric, LIMIT, |e| matches!(e, FabricEvent::Suspected { .. }));
    assert_eq!(events, vec![FabricEvent::Suspected { peer: 0, cause: FailureCause::ConnectionLost }]);
    assert_region_zero(&fabric);

    // Frames before a bad one in the same segment are applied, the bad one not.
    let mut fake = reconnect_fake(&mut fabric, 11);
    let mut bytes = FrameHeader::write(64, 8, 1, false).encode().to_vec();
    bytes.extend_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
    bytes.extend(frame(FrameHeader::write(128, MAX_FRAME as u32 + 1, 2, false), 64));
    fake.stream.write_all(&bytes).unwrap();
    fake.expect_closed(LIMIT);
    wait_for_event(&mut fabric, LIMIT, |e| {
        *e == FabricEvent::Suspected { peer: 0, cause: FailureCause::BadFrame }
    });
    assert_eq!(fabric.region().load_acquire(64), 0x1122_3344_5566_7788);
    let mut out = vec![0u8; REGION];
    fabric.region().read_bytes(0, &mut out);
    out[64..72].fill(0);
    assert!(out.iter().all(|b| *b == 0), "the bad frame was applied");
}

/// Sends a raw HELLO and expects the fabric to close without answering.
fn expect_hello_refused(fabric: &mut TcpFabric, hello: &Hello) {
    let mut stream = TcpStream::connect(fabric.local_addr()).unwrap();
    let _ = stream.write_all(&hello.encode());
    let mut buf = [0u8; 64];
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    match stream.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a mismatched HELLO was answered: {other:?}"),
    }
    assert!(matches!(fabric.reconnect(0), Err(ReconnectError::Unreachable(0, _))));
    let mut events = Vec::new();
    fabric.poll_events(&mut events);
    assert_eq!(events, vec![], "a refused handshake reported events");
    assert_region_zero(fabric);
}

#[test]
fn mismatched_hellos_are_refused() {
    let (mut fabric, fake) = fabric_with_fake_peer(|_| {});
    // Take the link down first so that a refused HELLO cannot be confused
    // with one replacing the live link.
    fake.stream.shutdown(Shutdown::Both).unwrap();
    wait_for_event(&mut fabric, LIMIT, |e| matches!(e, FabricEvent::Suspected { .. }));

    // (d) Wrong cluster, wrong region length, wrong version, unknown member,
    // a member that should be dialed rather than dial, and a non-HELLO first frame.
    let good = hello(0, REGION, 2);
    expect_hello_refused(&mut fabric, &Hello { cluster_hash: cluster_hash("another-cluster"), ..good });
    expect_hello_refused(&mut fabric, &Hello { region_len: REGION as u64 * 2, ..good });
    expect_hello_refused(&mut fabric, &Hello { version: good.version + 1, ..good });
    expect_hello_refused(&mut fabric, &Hello { member: 7, ..good });
    expect_hello_refused(&mut fabric, &Hello { member: 1, ..good });
    let mut stream = TcpStream::connect(fabric.local_addr()).unwrap();
    let _ = stream.write_all(&frame(FrameHeader::write(0, 8, 1, false), 8));
    common::expect_closed(&mut stream, LIMIT);
    assert_region_zero(&fabric);

    // A correct HELLO still gets in afterwards.
    let _fake = reconnect_fake(&mut fabric, 3);
}

#[test]
fn wire_format_and_acks_match_the_docs() {
    let (mut fabric, mut fake) = fabric_with_fake_peer(|_| {});
    fabric.region().write_bytes(100, b"hello, tcp fabric");
    fabric.post_write(Write::new(0, 100, 17)).unwrap();
    fabric.post_write(Write::signaled(0, 100, 5, WriteTag(77))).unwrap();
    let mut read_frame = |expect_seq: u64, expect_len: usize, flags: u8| {
        let mut h = [0u8; HEADER_LEN];
        fake.stream.read_exact(&mut h).unwrap();
        let header = FrameHeader::decode(&h);
        assert_eq!(header.kind, FrameKind::Write as u8);
        assert_eq!((header.flags, header.offset, header.seq), (flags, 100, expect_seq));
        assert_eq!(header.len as usize, expect_len);
        let mut payload = vec![0u8; expect_len];
        fake.stream.read_exact(&mut payload).unwrap();
        payload
    };
    assert_eq!(read_frame(1, 17, 0), b"hello, tcp fabric");
    assert_eq!(read_frame(2, 5, FLAG_SIGNALED), b"hello");
    // Nothing completes before the ACK ...
    let mut events = Vec::new();
    fabric.poll_events(&mut events);
    assert_eq!(events, vec![]);
    // ... and exactly one completion after it.
    fake.stream.write_all(&FrameHeader::ack(2).encode()).unwrap();
    let events = wait_for_event(&mut fabric, LIMIT, |_| true);
    assert_eq!(events, vec![FabricEvent::Completed { peer: 0, tag: WriteTag(77) }]);

    // Incoming: a signaled WRITE is applied and acked cumulatively.
    let mut bytes = FrameHeader::write(8, 8, 1, false).encode().to_vec();
    bytes.extend_from_slice(&5u64.to_le_bytes());
    bytes.extend_from_slice(&FrameHeader::write(16, 8, 2, true).encode());
    bytes.extend_from_slice(&6u64.to_le_bytes());
    fake.stream.write_all(&bytes).unwrap();
    let mut h = [0u8; HEADER_LEN];
    fake.stream.read_exact(&mut h).unwrap();
    assert_eq!(FrameHeader::decode(&h), FrameHeader::ack(2));
    assert_eq!(fabric.region().load_acquire(8), 5);
    assert_eq!(fabric.region().load_acquire(16), 6);

    // Posting errors.
    assert_eq!(fabric.post_write(Write::new(1, 0, 8)), Err(PostError::UnknownPeer(1)));
    assert_eq!(
        fabric.post_write(Write::new(0, 0, MAX_FRAME + 1)),
        Err(PostError::TooLarge { len: MAX_FRAME + 1, max: MAX_FRAME })
    );
}

#[test]
fn unacknowledged_signaled_writes_time_out_and_suspect_the_peer() {
    let (mut fabric, mut fake) = fabric_with_fake_peer(|o| o.write_timeout = Duration::from_millis(200));
    fabric.post_write(Write::signaled(0, 0, 8, WriteTag(1))).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    fabric.post_write(Write::signaled(0, 8, 8, WriteTag(2))).unwrap();
    let events = wait_for_event(&mut fabric, LIMIT, |e| matches!(e, FabricEvent::Suspected { .. }));
    assert_eq!(
        events,
        vec![
            FabricEvent::Failed { peer: 0, tag: WriteTag(1), cause: FailureCause::TimedOut },
            FabricEvent::Failed { peer: 0, tag: WriteTag(2), cause: FailureCause::LinkDown },
            FabricEvent::Suspected { peer: 0, cause: FailureCause::TimedOut },
        ]
    );
    assert_eq!(fabric.post_write(Write::new(0, 0, 8)), Err(PostError::PeerSuspected(0)));
    fake.expect_closed(LIMIT);
    // Nothing more is reported for the dead link.
    std::thread::sleep(Duration::from_millis(50));
    let mut events = Vec::new();
    fabric.poll_events(&mut events);
    assert_eq!(events, vec![]);
}

#[test]
fn connect_fails_clearly_when_a_peer_never_comes() {
    let mut o = common::options(0, REGION);
    o.connect_timeout = Duration::from_millis(300);
    // A port nobody listens on: bind one, note it, close it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    o.peers = vec![(1 as MemberId, dead)];
    let err = TcpFabric::connect(o).unwrap_err();
    assert!(
        matches!(err, ordo_fabric_tcp::TcpError::ConnectTimeout { ref missing, .. } if missing == &[1]),
        "{err}"
    );

    let mut o = common::options(0, REGION);
    o.peers = vec![(0, dead)];
    assert!(matches!(TcpFabric::connect(o), Err(ordo_fabric_tcp::TcpError::Config(_))));
}
