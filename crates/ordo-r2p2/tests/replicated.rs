//! REPLICATED_ROUTE end to end on loopback UDP, in one process: three KV
//! replicas with durable logs in temporary directories, a client that finds
//! the leader by itself, leader failover, recovery from disk, snapshots and
//! duplicate suppression of retried writes.

use ordo_r2p2::{
    Client, ClientConfig, HandlerMode, KvOp, KvReply, NodeOptions, Policy, RunningNode, start_node,
};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let sockets: Vec<_> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    sockets.iter().map(|s| s.local_addr().unwrap()).collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ordo-r3p2-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn start(peers: &[SocketAddr], id: usize, dir: &std::path::Path, snapshot_interval: u64) -> RunningNode {
    let mut opts = NodeOptions::new(id, peers.to_vec(), Some(dir.join(id.to_string())));
    opts.mode = if id == 0 { HandlerMode::NetworkThread } else { HandlerMode::Workers(1) };
    opts.snapshot_interval = snapshot_interval;
    start_node(&opts).expect("node starts")
}

fn client(peers: &[SocketAddr]) -> Client {
    let mut config = ClientConfig::new(peers.to_vec());
    config.timeout = Duration::from_millis(50);
    config.retries = 60;
    Client::new(config).unwrap()
}

fn put(c: &mut Client, key: &str, value: &str) -> KvReply {
    let op = KvOp::Put { key: key.into(), value: value.into() };
    KvReply::decode(&c.call(Policy::ReplicatedRoute, &op.encode()).expect("put commits")).unwrap()
}

fn get(c: &mut Client, key: &str) -> Option<Vec<u8>> {
    let op = KvOp::Get { key: key.into() };
    match KvReply::decode(&c.call(Policy::ReplicatedRoute, &op.encode()).expect("get commits")).unwrap() {
        KvReply::Value(v) => v,
        other => panic!("unexpected {other:?}"),
    }
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn three_replicas_fail_over_and_recover_from_disk() {
    let dir = temp_dir("failover");
    let peers = free_addrs(3);
    let mut nodes: Vec<Option<RunningNode>> = (0..3).map(|i| Some(start(&peers, i, &dir, 50))).collect();
    let mut c = client(&peers);
    for i in 0..100 {
        put(&mut c, &format!("k{i}"), &format!("v{i}"));
    }
    assert_eq!(get(&mut c, "k7"), Some(b"v7".to_vec()));
    let leader = c.leader();
    let status = nodes[leader].as_ref().unwrap().status().unwrap().clone();
    assert!(status.is_leader());
    assert!(status.syncs() > 0, "a durable log syncs");
    assert!(status.snapshots() > 0, "100 writes with snapshot_interval 50 take a snapshot");

    // The leader dies; the others elect and the client follows.
    nodes[leader].take().unwrap().shutdown();
    for i in 100..150 {
        put(&mut c, &format!("k{i}"), &format!("v{i}"));
    }
    let new_leader = c.leader();
    assert_ne!(new_leader, leader);
    for i in (0..150).step_by(7) {
        assert_eq!(get(&mut c, &format!("k{i}")), Some(format!("v{i}").into_bytes()), "k{i}");
    }

    // The old leader restarts from its directory: snapshot + log, and catches up.
    nodes[leader] = Some(start(&peers, leader, &dir, 50));
    let target = nodes[new_leader].as_ref().unwrap().status().unwrap().commit();
    let restarted = nodes[leader].as_ref().unwrap().status().unwrap().clone();
    wait_for("the restarted replica to catch up", Duration::from_secs(10), || restarted.commit() >= target);
    assert!(!restarted.is_leader() || restarted.term() > status.term());

    // Now stop everything and restart all three from disk: nothing is lost.
    for n in nodes.iter_mut() {
        n.take().unwrap().shutdown();
    }
    let nodes: Vec<_> = (0..3).map(|i| start(&peers, i, &dir, 50)).collect();
    let mut c = client(&peers);
    for i in 0..150 {
        assert_eq!(get(&mut c, &format!("k{i}")), Some(format!("v{i}").into_bytes()), "k{i} after restart");
    }
    for n in nodes {
        n.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn retried_writes_apply_once() {
    let dir = temp_dir("dedup");
    let peers = free_addrs(3);
    let nodes: Vec<_> = (0..3).map(|i| start(&peers, i, &dir, 0)).collect();
    let mut c = client(&peers);
    put(&mut c, "warm", "up");
    // Append is not idempotent: a duplicate application would show.
    let op = KvOp::Append { key: b"log".to_vec(), value: b"x".to_vec() };
    let leader = c.leader();
    // Resend the very same (client id, request id) by hand through a raw
    // socket: the same R2P2 datagram three times.
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let header = ordo_r2p2::Header {
        message_type: ordo_r2p2::MessageType::Request,
        policy: Policy::ReplicatedRoute,
        flags: 0,
        packet_id: 0,
        packet_count: 1,
        client_id: 0xfeed,
        request_id: 1,
        leader_hint: 0,
        payload_len: 0,
    };
    let payload = op.encode();
    let mut datagram = vec![0u8; ordo_r2p2::header::HEADER_SIZE + payload.len()];
    let mut h = header;
    h.payload_len = payload.len() as u16;
    ordo_r2p2::header::encode(&h, &mut datagram);
    datagram[ordo_r2p2::header::HEADER_SIZE..].copy_from_slice(&payload);
    let mut answers = Vec::new();
    for _ in 0..3 {
        raw.send_to(&datagram, peers[leader]).unwrap();
        let mut buf = [0u8; 2048];
        let (n, _) = raw.recv_from(&mut buf).expect("the leader answers each copy");
        let (_, body) = ordo_r2p2::header::decode(&buf[..n], 16).unwrap();
        answers.push(KvReply::decode(body).unwrap());
    }
    assert!(answers.iter().all(|a| *a == KvReply::Value(Some(b"x".to_vec()))), "{answers:?}");
    assert_eq!(get(&mut c, "log"), Some(b"x".to_vec()), "three copies applied once");
    let status = nodes[leader].status().unwrap();
    assert!(status.duplicates() >= 2, "duplicates answered from the session table");
    for n in nodes {
        n.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One server at a time (Raft thesis §4.1) over real processes' sockets: a
/// spare joins as a learner, catches up, is promoted; an original voter is
/// removed; the cluster then survives the loss of another original member.
#[test]
fn membership_change_adds_a_spare_and_removes_a_voter() {
    let dir = temp_dir("membership");
    let peers = free_addrs(4);
    let start_spare_aware = |id: usize| {
        let mut opts = NodeOptions::new(id, peers.clone(), Some(dir.join(id.to_string())));
        opts.initial_voters = Some(3);
        opts.snapshot_interval = 40;
        start_node(&opts).expect("node starts")
    };
    let mut nodes: Vec<Option<RunningNode>> = (0..4).map(|i| Some(start_spare_aware(i))).collect();
    let mut c = client(&peers[..3]);
    for i in 0..100 {
        put(&mut c, &format!("k{i}"), &format!("v{i}"));
    }
    let spare = nodes[3].as_ref().unwrap().status().unwrap().clone();
    assert_eq!(spare.commit(), 0, "a spare outside the membership receives nothing");
    assert!(!spare.is_leader());

    let mut admin = client(&peers);
    let answer = String::from_utf8(admin.admin(b"add-learner 4").expect("learner added")).unwrap();
    assert!(answer.contains("learners {4}"), "{answer}");
    // Promotion waits for the learner to catch up (the leader refuses before).
    let start = Instant::now();
    let answer = loop {
        match admin.admin(b"promote 4") {
            Ok(a) => break String::from_utf8(a).unwrap(),
            Err(e) => {
                assert!(start.elapsed() < Duration::from_secs(10), "promotion never accepted: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert!(answer.contains("voters {1, 2, 3, 4}"), "{answer}");
    assert!(spare.commit() > 100, "the new voter caught up (log or snapshot)");

    // Remove the first original member (id 1) and stop it.
    let answer = String::from_utf8(admin.admin(b"remove 1").expect("server removed")).unwrap();
    assert!(answer.contains("voters {2, 3, 4}"), "{answer}");
    nodes[0].take().unwrap().shutdown();
    // Lose one more original member: {2,3,4} minus one is still a quorum.
    nodes[1].take().unwrap().shutdown();
    let mut c = client(&peers);
    put(&mut c, "after", "change");
    assert_eq!(get(&mut c, "k42"), Some(b"v42".to_vec()));
    assert_eq!(get(&mut c, "after"), Some(b"change".to_vec()));
    let status = String::from_utf8(admin.admin(b"status").unwrap()).unwrap();
    assert!(status.contains("voters {2, 3, 4}"), "{status}");
    assert!(admin.admin(b"frobnicate 9").is_err(), "bad commands are refused");
    for n in nodes.into_iter().flatten() {
        n.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
