//! Strangers against an authenticated R3P2 cluster (SECURITY.md), the
//! attacks of the security issue: a process re-binds a killed follower's
//! port and sends forged RAFT datagrams (a RequestVote with a huge term, an
//! AppendEntries that would truncate a log), unsealed or sealed with a
//! wrong secret; genuine datagrams it captured are replayed to another
//! replica and back to their sender. Every one is dropped and counted
//! before the Raft node sees it: the leader keeps its term and leadership,
//! no replica's term moves, and the committed value stays.

use ordo_auth::{Sealer, Secret};
use ordo_r2p2::auth::RAFT_LABEL;
use ordo_r2p2::header::{self, FLAG_AUTH, Header, MessageType, Policy};
use ordo_r2p2::{
    AuthConfig, Client, ClientConfig, KvOp, KvReply, NodeOptions, Policy as P, RunningNode, start_node,
};
use ordo_raft::{Entry, EntryKind, Message};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let sockets: Vec<_> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    sockets.iter().map(|s| s.local_addr().unwrap()).collect()
}

fn auth() -> AuthConfig {
    AuthConfig {
        cluster: Some(Secret::from_bytes(b"forged tests' cluster secret").unwrap()),
        admin: Some(Secret::from_bytes(b"forged tests' admin secret").unwrap()),
        ..Default::default()
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Three (or `n`) replicas on fresh loopback ports with [`auth`], logs in
/// memory; `tweak` adjusts each one's options.
fn cluster(peers: &[SocketAddr], tweak: impl Fn(usize, &mut NodeOptions)) -> Vec<RunningNode> {
    (0..peers.len())
        .map(|id| {
            let mut opts = NodeOptions::new(id, peers.to_vec(), None);
            opts.durable = false;
            opts.auth = auth();
            tweak(id, &mut opts);
            start_node(&opts).unwrap()
        })
        .collect()
}

/// A patient client of `servers`.
fn client(servers: &[SocketAddr]) -> Client {
    let mut config = ClientConfig::new(servers.to_vec());
    config.timeout = Duration::from_millis(50);
    config.retries = 100;
    Client::new(config).unwrap()
}

/// One datagram, packet 0 of `packet_count`, written by hand.
fn datagram(
    message_type: MessageType,
    policy: Policy,
    flags: u8,
    packet_count: u16,
    (client_id, request_id): (u64, u32),
    payload: &[u8],
) -> Vec<u8> {
    let h = Header {
        message_type,
        policy,
        flags,
        packet_id: 0,
        packet_count,
        client_id,
        request_id,
        leader_hint: 0,
        payload_len: payload.len() as u16,
    };
    let mut d = vec![0u8; header::HEADER_SIZE];
    header::encode(&h, &mut d);
    d.extend_from_slice(payload);
    d
}

/// A RAFT datagram claiming to come from replica `from` (index).
fn raft_datagram(from: usize, msg: &Message, seal_with: Option<(&Secret, u64)>) -> Vec<u8> {
    let mut payload = Vec::new();
    ordo_raft::encode(msg, &mut payload);
    let flags = if seal_with.is_some() { FLAG_AUTH } else { 0 };
    let mut d = datagram(MessageType::Raft, Policy::FixedRoute, flags, 1, (from as u64, 1), &payload);
    if let Some((secret, to)) = seal_with {
        let now = ordo_r2p2::auth::unix_now_ns();
        Sealer::new(secret.derive(RAFT_LABEL)).seal(&mut d, now, &to.to_be_bytes());
    }
    d
}

fn get(c: &mut Client, key: &str) -> Option<Vec<u8>> {
    let answer = c.call(P::ReplicatedRoute, &KvOp::Get { key: key.into() }.encode()).unwrap();
    match KvReply::decode(&answer).unwrap() {
        KvReply::Value(v) => v,
        other => panic!("{other:?}"),
    }
}

#[test]
fn forged_and_replayed_raft_datagrams_change_nothing() {
    let peers = free_addrs(3);
    let mut nodes: Vec<Option<RunningNode>> = (0..3)
        .map(|id| {
            let mut opts = NodeOptions::new(id, peers.clone(), None);
            opts.durable = false;
            opts.auth = auth();
            Some(start_node(&opts).unwrap())
        })
        .collect();
    let mut config = ClientConfig::new(peers.clone());
    config.timeout = Duration::from_millis(50);
    config.retries = 100;
    let mut client = Client::new(config).unwrap();
    client
        .call(P::ReplicatedRoute, &KvOp::Put { key: b"k".to_vec(), value: b"v1".to_vec() }.encode())
        .unwrap();
    let status = |n: &Option<RunningNode>| n.as_ref().unwrap().status().unwrap().clone();
    let leader = (0..3).find(|&i| status(&nodes[i]).is_leader()).expect("a leader");
    let (victim, other) = ((leader + 1) % 3, (leader + 2) % 3);
    let term = status(&nodes[leader]).term();
    wait_for("the other follower to learn the term", || status(&nodes[other]).term() == term);

    // The attacker takes the killed follower's address.
    nodes[victim].take().unwrap().shutdown();
    let mut attacker = None;
    wait_for("the victim's port to be free", || {
        attacker = UdpSocket::bind(peers[victim]).ok();
        attacker.is_some()
    });
    let attacker = attacker.unwrap();
    attacker.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // It captures a genuine datagram the leader seals for the victim.
    let mut buf = vec![0u8; 65_536];
    let captured = loop {
        let (n, from) = attacker.recv_from(&mut buf).expect("the leader keeps sending to the victim");
        if from == peers[leader] {
            break buf[..n].to_vec();
        }
    };
    assert_ne!(captured[3] & FLAG_AUTH, 0, "replica traffic is sealed");

    let (l, v, o) = (leader as u64 + 1, victim as u64 + 1, other as u64 + 1);
    let huge = 1u64 << 40;
    let vote = |to| Message::RequestVote {
        term: huge,
        from: v,
        to,
        last_log_index: huge,
        last_log_term: huge,
        transfer: true,
    };
    let truncate = Message::AppendEntries {
        term: term + 1,
        from: v,
        to: o,
        prev_index: 1,
        prev_term: term + 1,
        entries: vec![Entry {
            term: term + 1,
            index: 2,
            kind: EntryKind::Normal,
            data: b"FORGED".to_vec().into(),
        }]
        .into(),
        leader_commit: 2,
    };
    let wrong = Secret::from_bytes(b"the attacker's best guess").unwrap();
    let sends: Vec<(usize, Vec<u8>)> = vec![
        (leader, raft_datagram(victim, &vote(l), None)),
        (other, raft_datagram(victim, &vote(o), None)),
        (leader, raft_datagram(victim, &vote(l), Some((&wrong, leader as u64)))),
        (other, raft_datagram(victim, &truncate, None)),
        (other, raft_datagram(victim, &truncate, Some((&wrong, other as u64)))),
        // The genuine datagram, to another replica and back to its sender.
        (other, captured.clone()),
        (leader, captured.clone()),
    ];
    let before: Vec<_> =
        [leader, other].iter().map(|&i| nodes[i].as_ref().unwrap().server().stats()).collect();
    for _ in 0..3 {
        for (to, d) in &sends {
            attacker.send_to(d, peers[*to]).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let after: Vec<_> =
        [leader, other].iter().map(|&i| nodes[i].as_ref().unwrap().server().stats()).collect();
    let refused = |i: usize| {
        let (b, a) = (&before[i], &after[i]);
        (a.drop_unauthenticated - b.drop_unauthenticated) + (a.drop_bad_mac - b.drop_bad_mac)
    };
    assert_eq!(refused(0), 3 * 3, "the leader refused every forged or replayed datagram: {:?}", after[0]);
    assert_eq!(refused(1), 3 * 4, "the follower refused every forged or replayed datagram: {:?}", after[1]);
    assert_eq!(after[0].drop_bad_mac - before[0].drop_bad_mac, 3 * 2);

    let (ls, os) = (status(&nodes[leader]), status(&nodes[other]));
    assert!(ls.is_leader(), "leadership moved");
    assert_eq!((ls.term(), os.term()), (term, term), "a forged term was adopted");
    assert_eq!(get(&mut client, "k"), Some(b"v1".to_vec()));
    client
        .call(P::ReplicatedRoute, &KvOp::Put { key: b"k".to_vec(), value: b"v2".to_vec() }.encode())
        .unwrap();
    assert_eq!(get(&mut client, "k"), Some(b"v2".to_vec()), "the cluster still serves");
    for n in nodes.into_iter().flatten() {
        n.shutdown();
    }
}

#[test]
fn replicas_with_a_wrong_secret_are_not_heard() {
    let peers = free_addrs(3);
    let nodes: Vec<RunningNode> = (0..3)
        .map(|id| {
            let mut opts = NodeOptions::new(id, peers.clone(), None);
            opts.durable = false;
            opts.auth = auth();
            if id == 2 {
                opts.auth.cluster =
                    Some(Secret::from_bytes(b"a stale or stolen-then-rotated secret").unwrap());
            }
            start_node(&opts).unwrap()
        })
        .collect();
    let mut config = ClientConfig::new(peers[..2].to_vec());
    config.timeout = Duration::from_millis(50);
    config.retries = 100;
    let mut client = Client::new(config).unwrap();
    client
        .call(P::ReplicatedRoute, &KvOp::Put { key: b"k".to_vec(), value: b"v".to_vec() }.encode())
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let odd = nodes[2].status().unwrap();
    assert_eq!(odd.commit(), 0, "the replica with the wrong secret learned nothing");
    assert!(!odd.is_leader());
    let refused: u64 = nodes[..2].iter().map(|n| n.server().stats().drop_bad_mac).sum();
    assert!(refused > 0, "its campaigns were refused");
    for n in nodes {
        n.shutdown();
    }
}

#[test]
fn a_server_that_requires_client_macs_serves_only_sealed_requests() {
    let peers = free_addrs(1);
    let client_secret = Secret::from_bytes(b"forged tests' client secret").unwrap();
    let mut opts = NodeOptions::new(0, peers.clone(), None);
    opts.replicated = false;
    opts.auth =
        AuthConfig { client: Some(client_secret.clone()), require_client_mac: true, ..Default::default() };
    let node = start_node(&opts).unwrap();
    let put = KvOp::Get { key: b"k".to_vec() }.encode();
    let mut config = ClientConfig::new(peers.clone());
    config.timeout = Duration::from_millis(50);
    let mut stranger = Client::new(config.clone()).unwrap();
    match stranger.call(P::FixedRoute, &put) {
        Err(ordo_r2p2::CallError::Refused { code: ordo_r2p2::ErrorCode::Unauthorized, .. }) => {}
        other => panic!("an unsealed request was served: {other:?}"),
    }
    // A client with a wrong secret is refused too, and cannot even verify
    // the server's (sealed) refusal: it drops it and times out.
    config.secret = Some(Secret::from_bytes(b"not the client secret").unwrap());
    let mut wrong = Client::new(config.clone()).unwrap();
    match wrong.call(P::FixedRoute, &put) {
        Err(ordo_r2p2::CallError::Timeout { .. }) => {}
        other => panic!("a wrongly sealed request was served: {other:?}"),
    }
    assert!(wrong.stats().unauthenticated_answers >= 1);
    assert_eq!(node.server().stats().requests, 0, "no refused request reached the handler");
    config.secret = Some(client_secret);
    let answer = Client::new(config).unwrap().call(P::FixedRoute, &put).expect("a sealed request is served");
    assert_eq!(KvReply::decode(&answer).unwrap(), KvReply::Value(None));
    node.shutdown();
}

#[test]
fn a_fragment_flood_from_one_socket_holds_only_its_budget_while_the_cluster_serves() {
    let peers = free_addrs(3);
    let nodes = cluster(&peers, |_, _| {});
    let mut client = client(&peers);
    let put = |c: &mut Client, v: &str| {
        c.call(P::ReplicatedRoute, &KvOp::Put { key: b"k".to_vec(), value: v.as_bytes().to_vec() }.encode())
            .expect("the cluster serves")
    };
    put(&mut client, "before");
    // 1,333 never-finished "packet 0 of 1024" requests per replica, from one
    // socket, in bursts of 100, each after the replica's received count has
    // grown by the one before (the cluster's own traffic moves that count
    // too, a little): on a machine whose cores the test shares, a burst
    // faster than the replica drains its socket would be dropped by the
    // kernel, and the server never sees those, so no budget counts them.
    let flooder = UdpSocket::bind("127.0.0.1:0").unwrap();
    let budget = ordo_r2p2::ReassemblyConfig::default().max_partials_per_source as u64;
    for (i, to) in peers.iter().enumerate() {
        let received = || nodes[i].server().stats().datagrams_received;
        let mut floor = received();
        for request_id in 0..1333u32 {
            let d = datagram(MessageType::Request, Policy::LbRoute, 0, 1024, (7, request_id), &[0xAB; 1000]);
            flooder.send_to(&d, to).unwrap();
            if request_id % 100 == 99 {
                floor += 100;
                wait_for("the replica to read the burst", || received() >= floor);
            }
            if request_id % 200 == 0 {
                put(&mut client, &format!("during {i} {request_id}"));
            }
        }
    }
    put(&mut client, "after");
    assert_eq!(get(&mut client, "k"), Some(b"after".to_vec()));
    for n in &nodes {
        let s = n.server().stats();
        // Every flood fragment that arrived beyond the budget pushed out one
        // of the flooder's own; nobody else's partial was evicted.
        assert!(s.drop_source_budget >= 1333 - budget - 100, "{s:?}");
        assert_eq!(s.drop_evicted, 0, "{s:?}");
    }
    for n in nodes {
        n.shutdown();
    }
}

/// A captured admin command opens only at the server it was sealed for,
/// and only once: replayed there it is dropped without an answer, sent to
/// another server it is refused (its MAC names the destination).
#[test]
fn a_captured_admin_command_is_refused_at_other_servers_and_on_replay() {
    let peers = free_addrs(3);
    let nodes = cluster(&peers, |_, _| {});
    wait_for("a leader", || nodes.iter().any(|n| n.status().unwrap().is_leader()));
    let admin_key = auth().admin.unwrap().derive(ordo_r2p2::auth::ADMIN_LABEL);
    let mut d = datagram(MessageType::Admin, Policy::ReplicatedRoute, FLAG_AUTH, 1, (4242, 1), b"status");
    Sealer::new(admin_key).seal(&mut d, ordo_r2p2::auth::unix_now_ns(), &0u64.to_be_bytes());
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = vec![0u8; 65_536];
    let mut answer = |to: usize| -> Option<MessageType> {
        sock.send_to(&d, peers[to]).unwrap();
        let (n, _) = sock.recv_from(&mut buf).ok()?;
        Some(header::decode(&buf[..n], 1024).unwrap().0.message_type)
    };
    let first = answer(0).expect("server 0 answers the command sealed for it");
    assert!(matches!(first, MessageType::Response | MessageType::Redirect), "{first:?}");
    assert_eq!(answer(1), Some(MessageType::Error), "server 1 refuses a command sealed for server 0");
    let replays = nodes[0].server().stats().drop_replayed;
    assert_eq!(answer(0), None, "a replay gets no answer");
    assert_eq!(nodes[0].server().stats().drop_replayed, replays + 1);
    assert!(nodes[1].server().stats().drop_bad_mac >= 1);
    for n in nodes {
        n.shutdown();
    }
}

/// A client that holds the client secret accepts only answers sealed with
/// it by a listed server: a forged RESPONSE from a listed address (here a
/// plain socket playing the server) is dropped, and the request times out
/// rather than completing with the forgery.
#[test]
fn a_client_with_the_secret_ignores_forged_answers() {
    let fake = UdpSocket::bind("127.0.0.1:0").unwrap();
    fake.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let server = fake.local_addr().unwrap();
    let forger = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        let mut forged = 0;
        while let Ok((n, from)) = fake.recv_from(&mut buf) {
            let (h, _) = header::decode(&buf[..n], 1024).unwrap();
            let payload = KvReply::Value(Some(b"FORGED".to_vec())).encode();
            let d = datagram(MessageType::Response, h.policy, 0, 1, (h.client_id, h.request_id), &payload);
            fake.send_to(&d, from).unwrap();
            forged += 1;
            if forged == 3 {
                break;
            }
        }
        forged
    });
    let mut config = ClientConfig::new(vec![server]);
    config.timeout = Duration::from_millis(50);
    config.retries = 2;
    config.secret = Some(Secret::from_bytes(b"forged tests' client secret").unwrap());
    let mut client = Client::new(config).unwrap();
    match client.call(P::FixedRoute, &KvOp::Get { key: b"k".to_vec() }.encode()) {
        Err(ordo_r2p2::CallError::Timeout { .. }) => {}
        other => panic!("a forged answer was accepted: {other:?}"),
    }
    assert_eq!(forger.join().unwrap(), 3);
    assert_eq!(client.stats().unauthenticated_answers, 3);
    assert_eq!(client.stats().responses, 0);
}
