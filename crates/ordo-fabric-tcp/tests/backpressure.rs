//! Back-pressure: a peer that stops reading makes posts return
//! `Backpressure` once `send_buffer_bytes` are queued, instead of growing
//! memory; when it reads again, posting resumes and every frame arrives in
//! order. (Its own binary: it measures the process's live heap.)

mod common;

use common::alloc;

#[global_allocator]
static ALLOC: alloc::CountingAlloc = alloc::CountingAlloc;

use common::{FakePeer, hello};
use ordo_fabric::{Fabric, PostError, Write};
use ordo_fabric_tcp::TcpFabric;
use ordo_fabric_tcp::frame::{FrameHeader, FrameKind, HEADER_LEN};
use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const REGION: usize = 64 * 1024;
const WRITE_LEN: usize = 60 * 1024;
const SEND_BUFFER: usize = 256 * 1024;

#[test]
fn a_peer_that_does_not_read_gets_backpressure_not_memory() {
    let mut o = common::options(1, REGION);
    o.max_frame_bytes = 64 * 1024;
    o.send_buffer_bytes = SEND_BUFFER;
    let binding = TcpFabric::bind(o).unwrap();
    let addr = binding.local_addr();
    let unused: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let connecting = std::thread::spawn(move || binding.connect(vec![(0, unused)]).unwrap());
    // Keep the fake's receive buffer small so the kernel absorbs little.
    let mut fake = FakePeer::connect(addr, &hello(0, REGION, 1));
    let mut fabric = connecting.join().unwrap();
    fabric.region().write_bytes(0, &vec![0x5Au8; WRITE_LEN]);

    let live_before = alloc::live_bytes();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut posted = 0u64;
    loop {
        match fabric.post_write(Write::new(0, 0, WRITE_LEN)) {
            Ok(()) => posted += 1,
            Err(PostError::Backpressure(0)) => break,
            Err(e) => panic!("unexpected post error {e}"),
        }
        // Loopback socket buffers hold a few MiB at most; 100k posts would be ~6 GiB.
        assert!(posted < 100_000 && Instant::now() < deadline, "no back-pressure after {posted} posts");
    }
    // It stays refused while the peer does not read, and memory did not grow.
    for _ in 0..100 {
        assert_eq!(fabric.post_write(Write::new(0, 0, WRITE_LEN)), Err(PostError::Backpressure(0)));
    }
    let grown = alloc::live_bytes().saturating_sub(live_before);
    assert!(grown < 1 << 20, "posting under back-pressure grew the heap by {grown} bytes");
    assert!(!fabric.is_suspected(0));

    // The peer reads again: everything queued arrives, in order, and posting resumes.
    let reader = std::thread::spawn(move || {
        let mut payload = vec![0u8; WRITE_LEN];
        let mut seq = 0u64;
        let mut header = [0u8; HEADER_LEN];
        loop {
            if fake.stream.read_exact(&mut header).is_err() {
                return seq;
            }
            let h = FrameHeader::decode(&header);
            assert_eq!(h.kind, FrameKind::Write as u8);
            assert_eq!(h.seq, seq + 1, "frames out of order");
            seq = h.seq;
            fake.stream.read_exact(&mut payload[..h.len as usize]).unwrap();
            assert!(payload.iter().all(|b| *b == 0x5A));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut resumed = 0u64;
    while resumed < 20 {
        match fabric.post_write(Write::new(0, 0, WRITE_LEN)) {
            Ok(()) => resumed += 1,
            Err(PostError::Backpressure(0)) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("unexpected post error {e}"),
        }
        assert!(Instant::now() < deadline, "posting did not resume");
    }
    // Dropping the fabric flushes nothing further; the reader sees EOF after
    // a prefix of what was posted, in order.
    std::thread::sleep(Duration::from_millis(100));
    drop(fabric);
    let received = reader.join().unwrap();
    assert!(received > posted, "received {received} frames of {}", posted + resumed);
    assert!(received <= posted + resumed);
}
