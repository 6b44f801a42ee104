//! REPLICATED_ROUTE end to end on loopback UDP, in one process: three KV
//! replicas with durable logs in temporary directories, a client that finds
//! the leader by itself, leader failover, recovery from disk, snapshots and
//! duplicate suppression of retried writes. Replica traffic is sealed with
//! a cluster secret and admin commands with an admin secret throughout.

use ordo_auth::Secret;
use ordo_r2p2::{
    AuthConfig, CallError, Client, ClientConfig, HandlerMode, KvOp, KvReply, NodeOptions, Policy,
    RunningNode, start_node,
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

fn cluster_secret() -> Secret {
    Secret::from_bytes(b"replicated tests' cluster secret").unwrap()
}

fn admin_secret() -> Secret {
    Secret::from_bytes(b"replicated tests' admin secret").unwrap()
}

fn auth() -> AuthConfig {
    AuthConfig { cluster: Some(cluster_secret()), admin: Some(admin_secret()), ..Default::default() }
}

fn start(peers: &[SocketAddr], id: usize, dir: &std::path::Path, snapshot_interval: u64) -> RunningNode {
    let mut opts = NodeOptions::new(id, peers.to_vec(), Some(dir.join(id.to_string())));
    opts.auth = auth();
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

/// An R2P2 request of `client_id`, built by hand: `Append` of `value` to
/// the key `log`; `answered`: it says every earlier request of the client
/// was answered (the answered span, 0).
fn raw_append(client_id: u64, request_id: u32, answered: bool, value: &[u8]) -> Vec<u8> {
    let payload = KvOp::Append { key: b"log".to_vec(), value: value.to_vec() }.encode();
    let mut h = ordo_r2p2::Header {
        message_type: ordo_r2p2::MessageType::Request,
        policy: Policy::ReplicatedRoute,
        flags: 0,
        packet_id: 0,
        packet_count: 1,
        client_id,
        request_id,
        leader_hint: 0,
        payload_len: payload.len() as u16,
    };
    if answered {
        h.set_answered_below(request_id);
    }
    let mut d = vec![0u8; ordo_r2p2::header::HEADER_SIZE];
    ordo_r2p2::header::encode(&h, &mut d);
    d.extend_from_slice(&payload);
    d
}

#[test]
fn retried_writes_apply_once() {
    let dir = temp_dir("dedup");
    let peers = free_addrs(3);
    let nodes: Vec<_> = (0..3).map(|i| start(&peers, i, &dir, 0)).collect();
    let mut c = client(&peers);
    put(&mut c, "warm", "up");
    // Append is not idempotent: a duplicate application would show.
    let leader = c.leader();
    // Resend the very same (client id, request id) by hand through a raw
    // socket: the same R2P2 datagram three times.
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let datagram = raw_append(0xfeed, 1, false, b"x");
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

/// The answered span end to end: the real client's requests let every
/// replica forget the answers it has; a raw client that says request 1 was
/// answered then sends request 1 again is told its session expired, and
/// request 1 is not applied twice.
#[test]
fn answers_a_client_has_are_forgotten_and_a_late_copy_is_not_applied() {
    let dir = temp_dir("answered");
    let peers = free_addrs(3);
    let nodes: Vec<_> = (0..3).map(|i| start(&peers, i, &dir, 0)).collect();
    let mut c = client(&peers);
    for i in 0..20 {
        put(&mut c, "k", &i.to_string());
    }
    // One request at a time: each says every earlier one was answered.
    let deadline = Instant::now() + Duration::from_secs(10);
    while nodes.iter().any(|n| n.status().unwrap().answers_forgotten() < 19) {
        assert!(Instant::now() < deadline, "every replica forgets the answers the client has");
        std::thread::sleep(Duration::from_millis(10));
    }
    let leader = c.leader();
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 2048];
    let first = raw_append(0xfeed, 1, false, b"x");
    raw.send_to(&first, peers[leader]).unwrap();
    raw.recv_from(&mut buf).expect("request 1 answered");
    raw.send_to(&raw_append(0xfeed, 2, true, b"y"), peers[leader]).unwrap();
    raw.recv_from(&mut buf).expect("request 2 answered");
    // Request 2 said request 1 was answered: a late copy of 1 is not
    // applied, and the answer says the session no longer holds it.
    raw.send_to(&first, peers[leader]).unwrap();
    let (n, _) = raw.recv_from(&mut buf).expect("an answer to a request below the floor");
    let (h, body) = ordo_r2p2::header::decode(&buf[..n], 16).unwrap();
    assert_eq!((h.message_type, h.request_id), (ordo_r2p2::MessageType::Error, 1));
    assert_eq!(ordo_r2p2::ErrorCode::from_byte(body[0]), ordo_r2p2::ErrorCode::SessionExpired);
    assert_eq!(get(&mut c, "log"), Some(b"xy".to_vec()), "request 1 applied once");
    for n in nodes {
        n.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Someone sending as a client (no client MAC required here) says every
/// request of it below `u32::MAX` was answered: the replicas' session of
/// that client then holds none of its next requests. The client's next
/// request is refused with SESSION_EXPIRED, not applied, and not left to
/// time out; the client takes a new client id and goes on.
#[test]
fn a_forged_answered_span_costs_the_client_one_request_not_its_session() {
    let dir = temp_dir("expired");
    let peers = free_addrs(3);
    let nodes: Vec<_> = (0..3).map(|i| start(&peers, i, &dir, 0)).collect();
    let mut c = client(&peers);
    put(&mut c, "warm", "up");
    let victim = c.client_id();
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    raw.send_to(&raw_append(victim, u32::MAX, true, b"F"), peers[c.leader()]).unwrap();
    let mut buf = [0u8; 2048];
    raw.recv_from(&mut buf).expect("the forged request is answered");
    let append = |v: &[u8]| KvOp::Append { key: b"log".to_vec(), value: v.to_vec() }.encode();
    match c.call(Policy::ReplicatedRoute, &append(b"r")) {
        Err(CallError::Refused { code: ordo_r2p2::ErrorCode::SessionExpired, .. }) => {}
        other => panic!("the request below the forged floor was not refused as expired: {other:?}"),
    }
    assert_ne!(c.client_id(), victim, "a new session");
    let reply = KvReply::decode(&c.call(Policy::ReplicatedRoute, &append(b"s")).expect("appended")).unwrap();
    assert_eq!(reply, KvReply::Value(Some(b"Fs".to_vec())), "the refused request was not applied");
    assert_eq!(c.stats().new_sessions, 1);
    for n in nodes {
        n.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client's request ids wrap after `u32::MAX`: it takes a new client id
/// (a new session at the replicas) rather than reusing ids the replicas'
/// session has seen — those would be ignored below its answered floor, or
/// answered with old answers. Requests of the old session still in flight
/// across the switch are answered too (sealed to the old id), and every
/// append applies once.
#[test]
fn request_ids_that_wrap_start_a_new_session_and_nothing_is_lost_or_applied_twice() {
    let dir = temp_dir("wrap");
    let peers = free_addrs(3);
    // Answers are sealed to the client id: the old session's too.
    let client_secret = Secret::from_bytes(b"replicated tests' client secret").unwrap();
    let nodes: Vec<_> = (0..3)
        .map(|id| {
            let mut opts = NodeOptions::new(id, peers.clone(), Some(dir.join(id.to_string())));
            opts.auth =
                AuthConfig { client: Some(client_secret.clone()), require_client_mac: true, ..auth() };
            start_node(&opts).expect("node starts")
        })
        .collect();
    let mut config = ClientConfig::new(peers.clone());
    config.secret = Some(client_secret);
    config.timeout = Duration::from_millis(50);
    config.retries = 60;
    config.first_request_id = u32::MAX - 3;
    let mut c = Client::new(config).unwrap();
    let first_id = c.client_id();
    let append = |v: u8| KvOp::Append { key: b"log".to_vec(), value: vec![v] }.encode();
    // Eight in flight at once: four below the wrap, four above it.
    let mut sent = Vec::new();
    for v in b'a'..=b'h' {
        sent.push(c.send(Policy::ReplicatedRoute, &append(v)).expect("sent"));
    }
    assert_eq!(sent, [u32::MAX - 3, u32::MAX - 2, u32::MAX - 1, u32::MAX, 1, 2, 3, 4]);
    assert_ne!(c.client_id(), first_id, "a new session after the wrap");
    assert_eq!(c.stats().new_sessions, 1);
    let mut answered = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while answered.len() < sent.len() {
        assert!(Instant::now() < deadline, "every request answered: {answered:?}");
        c.wait(Duration::from_millis(10));
        while let Some((id, result)) = c.try_recv() {
            result.unwrap_or_else(|e| panic!("request {id} failed: {e}"));
            answered.push(id);
        }
    }
    // Then one at a time in the new session.
    for v in b'i'..=b'p' {
        let reply = KvReply::decode(&c.call(Policy::ReplicatedRoute, &append(v)).expect("appended")).unwrap();
        assert!(matches!(reply, KvReply::Value(Some(ref log)) if log.len() == usize::from(v - b'a') + 1));
    }
    let mut log = get(&mut c, "log").expect("the log");
    log.sort_unstable();
    assert_eq!(log, (b'a'..=b'p').collect::<Vec<_>>(), "each append applied exactly once");
    assert_eq!(c.next_request_id(), 14, "ids 1..=13 in the new session");
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
        opts.auth = auth();
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

    // Without the admin secret (or with a wrong one) nothing changes.
    let mut stranger = client(&peers);
    match stranger.admin(b"remove 1") {
        Err(CallError::Refused { code: ordo_r2p2::ErrorCode::Unauthorized, .. }) => {}
        other => panic!("an unauthenticated admin command was not refused: {other:?}"),
    }
    let mut config = ClientConfig::new(peers.clone());
    config.admin_secret = Some(Secret::from_bytes(b"a guess at the admin secret").unwrap());
    config.timeout = Duration::from_millis(50);
    match Client::new(config).unwrap().admin(b"remove 1") {
        Err(CallError::Refused { code: ordo_r2p2::ErrorCode::Unauthorized, .. }) => {}
        other => panic!("a wrongly signed admin command was not refused: {other:?}"),
    }

    let mut config = ClientConfig::new(peers.clone());
    config.timeout = Duration::from_millis(50);
    config.retries = 60;
    config.admin_secret = Some(admin_secret());
    let mut admin = Client::new(config).unwrap();
    let status = String::from_utf8(admin.admin(b"status").unwrap()).unwrap();
    assert!(status.contains("voters {1, 2, 3}"), "the refused commands changed the membership: {status}");
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

/// Three `RaftReplication` hooks driven in one thread (no sockets), with one
/// follower whose handler answers snapshot requests late, as a worker does.
mod late_snapshot {
    use ordo_r2p2::{
        ClientRef, KvOp, KvState, RaftOptions, RaftReplication, ReplicatedRequest, Replication,
        ReplicationAction, ReplicationOutput,
    };
    use ordo_raft::storage::{MemDisk, SNAPSHOT_FILE, decode_snapshot};
    use std::collections::VecDeque;
    use std::net::SocketAddr;

    struct Cluster {
        hooks: Vec<RaftReplication<MemDisk>>,
        disks: Vec<MemDisk>,
        kv: Vec<KvState>,
        mail: VecDeque<(usize, usize, Vec<u8>)>,
        now: u64,
        /// The follower whose snapshot answers are held, and whether it is
        /// cut off from the others.
        slow: Option<usize>,
        cut: bool,
        /// Held answers: the handler's state when each snapshot was asked.
        held: VecDeque<Vec<u8>>,
        next_request: u32,
        /// The hooks' own answers (`Respond`), by replica.
        responds: Vec<(usize, ClientRef, Vec<u8>)>,
    }

    impl Cluster {
        fn new() -> Cluster {
            let mut hooks = Vec::new();
            let mut disks = Vec::new();
            for me in 0..3 {
                let mut opts = RaftOptions::new(me, 3);
                opts.snapshot_interval = 5;
                let disk = MemDisk::new();
                disks.push(disk.clone());
                hooks.push(RaftReplication::open(disk, opts).unwrap());
            }
            Cluster {
                hooks,
                disks,
                kv: vec![KvState::default(); 3],
                mail: VecDeque::new(),
                now: 0,
                slow: None,
                cut: false,
                held: VecDeque::new(),
                next_request: 1,
                responds: Vec::new(),
            }
        }

        fn execute(&mut self, i: usize, out: &mut ReplicationOutput) {
            let mut queue: VecDeque<ReplicationAction> = out.actions.drain(..).collect();
            while let Some(action) = queue.pop_front() {
                match action {
                    ReplicationAction::SendToPeer { peer, message } => {
                        self.mail.push_back((i, peer, message))
                    }
                    ReplicationAction::Apply { client, payload, respond } => {
                        let reply = self.kv[i].apply(&payload).encode();
                        self.hooks[i].on_response(client, reply, respond, out);
                        queue.extend(out.actions.drain(..));
                    }
                    ReplicationAction::Snapshot => {
                        if self.slow == Some(i) {
                            self.held.push_back(self.kv[i].snapshot());
                        } else {
                            self.hooks[i].on_snapshot(Some(self.kv[i].snapshot()), out);
                            queue.extend(out.actions.drain(..));
                        }
                    }
                    ReplicationAction::Restore { state } => {
                        self.kv[i] = KvState::from_snapshot(&state).unwrap();
                    }
                    ReplicationAction::Respond { client, payload } => {
                        self.responds.push((i, client, payload))
                    }
                    _ => {}
                }
            }
        }

        fn cut_off(&self, i: usize) -> bool {
            self.cut && self.slow == Some(i)
        }

        fn turn(&mut self) {
            self.now += 1_000_000;
            let mut out = ReplicationOutput::default();
            for i in 0..3 {
                self.hooks[i].tick(self.now, &mut out);
                self.execute(i, &mut out);
            }
            for _ in 0..self.mail.len() {
                let (from, to, message) = self.mail.pop_front().unwrap();
                if self.cut_off(from) || self.cut_off(to) {
                    continue;
                }
                self.hooks[to].on_peer_message(from, &message, self.now, &mut out);
                self.execute(to, &mut out);
            }
            for i in 0..3 {
                self.hooks[i].flush(self.now, &mut out);
                self.execute(i, &mut out);
            }
        }

        fn leader(&self) -> Option<usize> {
            (0..3).find(|&i| self.hooks[i].replica().node().is_leader())
        }

        fn write(&mut self) {
            let leader = self.leader().expect("a leader");
            let client = ClientRef {
                addr: SocketAddr::from(([127, 0, 0, 1], 9)),
                client_id: 77,
                request_id: self.next_request,
            };
            self.next_request += 1;
            let op = KvOp::Put { key: b"k".to_vec(), value: self.next_request.to_le_bytes().to_vec() };
            let mut out = ReplicationOutput::default();
            self.hooks[leader].on_request(
                ReplicatedRequest { client, payload: op.encode(), answered_below: client.request_id },
                self.now,
                &mut out,
            );
            self.execute(leader, &mut out);
            for _ in 0..3 {
                self.turn();
            }
        }
    }

    /// A follower's handler is still serializing a snapshot when the leader
    /// installs a newer one on it: that late answer must not become the
    /// replica's next snapshot (nor stop the replica).
    #[test]
    fn a_snapshot_answered_after_a_restore_is_dropped() {
        let mut c = Cluster::new();
        for _ in 0..2000 {
            if c.leader().is_some() {
                break;
            }
            c.turn();
        }
        let leader = c.leader().expect("a leader is elected");
        let f = (leader + 1) % 3;
        c.slow = Some(f);
        for _ in 0..20 {
            if !c.held.is_empty() {
                break;
            }
            c.write();
        }
        assert_eq!(c.held.len(), 1, "the follower was asked for a snapshot");
        // Cut the follower off while the leader snapshots and compacts far
        // beyond it, then let it back: it gets an InstallSnapshot.
        c.cut = true;
        for _ in 0..30 {
            c.write();
        }
        c.cut = false;
        for _ in 0..200 {
            if c.hooks[f].replica().stats().snapshots_installed > 0 && c.held.len() >= 2 {
                break;
            }
            c.write();
        }
        assert!(c.hooks[f].replica().stats().snapshots_installed > 0, "the follower installed a snapshot");
        assert_eq!(c.held.len(), 2, "the follower was asked for a new snapshot after the restore");
        let (stale, fresh) = (c.held[0].clone(), c.held[1].clone());
        assert_ne!(stale, fresh);
        c.slow = None;
        let mut out = ReplicationOutput::default();
        c.hooks[f].on_snapshot(Some(stale), &mut out);
        c.execute(f, &mut out);
        c.hooks[f].on_snapshot(Some(fresh.clone()), &mut out);
        c.execute(f, &mut out);
        let bytes = c.disks[f].contents(SNAPSHOT_FILE).expect("a snapshot file");
        let snap = decode_snapshot(&bytes, SNAPSHOT_FILE).expect("a valid snapshot file");
        assert!(snap.data.ends_with(&fresh), "the persisted snapshot holds the state it was taken at");
        // And the replica goes on working.
        for _ in 0..10 {
            c.write();
        }
        for _ in 0..20 {
            c.turn();
        }
        assert_eq!(c.kv[f], c.kv[leader]);
    }

    /// A leader that removes itself steps down the moment the change
    /// commits; the admin command is still answered.
    #[test]
    fn a_leader_that_removes_itself_answers_the_admin_command() {
        let mut c = Cluster::new();
        for _ in 0..2000 {
            if c.leader().is_some() {
                break;
            }
            c.turn();
        }
        let leader = c.leader().expect("a leader is elected");
        c.write(); // the leader has committed an entry of its term
        let admin = ClientRef { addr: SocketAddr::from(([127, 0, 0, 1], 10)), client_id: 5, request_id: 1 };
        let command = format!("remove {}", leader + 1).into_bytes();
        let mut out = ReplicationOutput::default();
        c.hooks[leader].on_admin(
            ReplicatedRequest { client: admin, payload: command, answered_below: 0 },
            c.now,
            &mut out,
        );
        c.execute(leader, &mut out);
        for _ in 0..50 {
            c.turn();
        }
        assert!(!c.hooks[leader].replica().node().is_leader(), "the removed leader stepped down");
        let answers: Vec<String> = c
            .responds
            .iter()
            .filter(|(_, to, _)| *to == admin)
            .map(|(_, _, p)| String::from_utf8_lossy(p).into_owned())
            .collect();
        assert!(
            answers.iter().any(|a| a.starts_with("committed at index")),
            "the admin command is answered: {answers:?}"
        );
    }
}

/// A moved commit index rides on the next append or heartbeat by default:
/// a lone write costs the leader one append per follower (two RAFT
/// messages), where announcing it (`announce_commit`, etcd's way) costs an
/// empty append per follower more. Counted at the leader over sequential
/// writes, less what it sends in an idle period as long (heartbeats); an
/// attempt during which leadership moved is run again.
#[test]
fn a_lone_write_costs_one_append_per_follower_unless_commits_are_announced() {
    let writes = 100u64;
    for announce in [false, true] {
        let peers = free_addrs(3);
        let nodes: Vec<RunningNode> = (0..3)
            .map(|id| {
                let mut opts = NodeOptions::new(id, peers.clone(), None);
                opts.auth = auth();
                opts.announce_commit = announce;
                start_node(&opts).expect("node starts")
            })
            .collect();
        let mut c = client(&peers);
        let mut measured = None;
        for attempt in 0..3 {
            put(&mut c, "warm", "up");
            let Some(leader) = nodes.iter().position(|n| n.status().is_some_and(|s| s.is_leader())) else {
                continue;
            };
            let term = |n: &RunningNode| n.status().map(|s| s.term());
            let (term0, sent) = (term(&nodes[leader]), || nodes[leader].server().stats().peer_messages_sent);
            let before = sent();
            let start = Instant::now();
            for i in 0..writes {
                put(&mut c, &format!("k{attempt}-{i}"), "v");
            }
            let (busy, elapsed) = (sent() - before, start.elapsed());
            let before = sent();
            std::thread::sleep(elapsed);
            let idle = sent() - before;
            let kept = nodes[leader].status().is_some_and(|s| s.is_leader()) && term(&nodes[leader]) == term0;
            if kept {
                measured = Some((busy.saturating_sub(idle), busy, idle));
                break;
            }
        }
        let (cost, busy, idle) = measured.expect("a leader held on through one of three attempts");
        let per_write = cost as f64 / writes as f64;
        if announce {
            assert!(
                per_write >= 3.0,
                "announced: an append and an announcement per follower ({busy} - {idle} idle)"
            );
        } else {
            assert!(
                per_write < 3.0,
                "not announced: one append per follower per write ({busy} - {idle} idle)"
            );
        }
        for n in nodes {
            n.shutdown();
        }
    }
}
