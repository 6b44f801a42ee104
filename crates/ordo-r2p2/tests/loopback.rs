//! End-to-end tests over real loopback UDP sockets.

use ordo_r2p2::header::{self, HEADER_SIZE, Header};
use ordo_r2p2::{
    CallError, Client, ClientConfig, ClientRef, ErrorCode, HandlerMode, MessageType, Policy,
    ReplicatedRequest, Replication, ReplicationOutput, Server, ServerConfig, handler_fn, simple,
};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn config(mode: HandlerMode) -> ServerConfig {
    ServerConfig { handler_mode: mode, ..ServerConfig::default() }
}

fn echo_server(mode: HandlerMode) -> Server {
    Server::bind(config(mode), simple(|request: &[u8]| request.to_vec())).expect("bind")
}

fn client_for(servers: Vec<SocketAddr>) -> Client {
    Client::new(ClientConfig::new(servers)).expect("client")
}

#[test]
fn echo_with_workers() {
    let server = echo_server(HandlerMode::Workers(2));
    let mut client = client_for(vec![server.local_addr()]);
    for i in 0..50u32 {
        let payload = i.to_be_bytes();
        assert_eq!(client.call(Policy::FixedRoute, &payload).unwrap(), payload);
    }
    let stats = server.stats();
    assert_eq!(stats.requests, 50);
    assert_eq!(stats.responses_sent, 50);
    assert_eq!(stats.total_drops(), 0);
    server.shutdown();
}

/// `wait_precise` blocks until an answer comes, not for its whole timeout,
/// and with nothing coming it waits about its timeout (microseconds, where
/// epoll's are whole milliseconds), then reports nothing ready.
#[test]
fn a_precise_wait_ends_with_the_answer_or_its_timeout() {
    let server = echo_server(HandlerMode::NetworkThread);
    let mut client = client_for(vec![server.local_addr()]);
    let id = client.send(Policy::FixedRoute, b"ping").expect("send");
    let started = Instant::now();
    let mut ready = 0;
    while ready == 0 && started.elapsed() < Duration::from_secs(5) {
        ready = client.wait_precise(Duration::from_secs(2));
    }
    assert_eq!(ready, 1);
    assert!(started.elapsed() < Duration::from_secs(1), "woken by the answer: {:?}", started.elapsed());
    assert_eq!(client.try_recv().map(|(got, r)| (got, r.unwrap())), Some((id, b"ping".to_vec())));
    // Nothing in flight: the wait lasts its timeout.
    let started = Instant::now();
    assert_eq!(client.wait_precise(Duration::from_micros(1500)), 0);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_micros(1500) && waited < Duration::from_millis(500), "{waited:?}");
    // A request in flight to nobody: the wait ends at its deadline (its
    // timeout, 200 ms here), not after the 10 s asked.
    let nobody = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = ClientConfig::new(vec![nobody.local_addr().unwrap()]);
    config.timeout = Duration::from_millis(200);
    config.retries = 0;
    let mut lonely = Client::new(config).unwrap();
    lonely.send(Policy::FixedRoute, b"anyone?").expect("send");
    let started = Instant::now();
    lonely.wait_precise(Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    server.shutdown();
}

/// The busy-polling server: a network thread that never parks, pinned to
/// the last CPU, with SO_BUSY_POLL asked for (refused or not, it serves);
/// a burst of requests in flight comes back whole through its batched
/// receives and sends.
#[test]
fn a_busy_polling_pinned_server_serves_bursts() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = ServerConfig {
        handler_mode: HandlerMode::NetworkThread,
        idle: ordo_agent::IdleStrategy::BackoffPark {
            spins: 10,
            yields: 1_000_000,
            park_min: Duration::from_micros(50),
            park_max: Duration::from_millis(1),
        },
        busy_poll_us: Some(50),
        pin_cpu: Some(cpus - 1),
        ..ServerConfig::default()
    };
    let server = Server::bind(config, simple(|request: &[u8]| request.to_vec())).expect("bind");
    // The network thread is pinned: one r2p2 thread allows only that CPU.
    let pinned = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(5));
        std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten().any(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            comm.starts_with("r2p2")
                && status.lines().any(|l| {
                    l.split_whitespace().collect::<Vec<_>>()
                        == ["Cpus_allowed_list:", &(cpus - 1).to_string()]
                })
        })
    });
    assert!(pinned || cpus == 1, "no r2p2 thread is pinned to cpu {}", cpus - 1);
    let mut client = client_for(vec![server.local_addr()]);
    for round in 0..20u32 {
        let ids: Vec<_> = (0..40u32)
            .map(|i| client.send(Policy::FixedRoute, &(round * 100 + i).to_le_bytes()).expect("send"))
            .collect();
        let mut got = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < ids.len() {
            assert!(Instant::now() < deadline, "answers missing");
            client.wait(Duration::from_millis(10));
            while let Some((id, result)) = client.try_recv() {
                got.insert(id, result.expect("answered"));
            }
        }
        for (k, id) in ids.iter().enumerate() {
            assert_eq!(got[id], (round * 100 + k as u32).to_le_bytes());
        }
    }
    let stats = server.stats();
    assert_eq!((stats.requests, stats.responses_sent, stats.drop_send_failed), (800, 800, 0));
    server.shutdown();
}

/// Pinning reports a CPU it cannot use, and pins to one it can.
#[test]
fn pinning_a_thread() {
    assert!(ordo_r2p2::pin_current_thread(1 << 20).is_err());
    std::thread::spawn(|| {
        ordo_r2p2::pin_current_thread(0).expect("cpu 0 exists");
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        assert!(
            status.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Cpus_allowed_list:", "0"])
        );
    })
    .join()
    .expect("pinned thread");
}

#[test]
fn echo_on_network_thread() {
    let server = echo_server(HandlerMode::NetworkThread);
    let mut client = client_for(vec![server.local_addr()]);
    for i in 0..50u32 {
        assert_eq!(client.call(Policy::LbRoute, &i.to_le_bytes()).unwrap(), i.to_le_bytes());
    }
    assert_eq!(client.call(Policy::FixedRoute, b"").unwrap(), b"");
    server.shutdown();
}

#[test]
fn multi_datagram_request_and_response_in_both_modes() {
    for mode in [HandlerMode::Workers(1), HandlerMode::NetworkThread] {
        // The response is the request reversed and doubled: 40 KB back.
        let server = Server::bind(
            config(mode),
            simple(|request: &[u8]| {
                let mut out: Vec<u8> = request.iter().rev().copied().collect();
                out.extend_from_slice(request);
                out
            }),
        )
        .unwrap();
        let mut client = client_for(vec![server.local_addr()]);
        let request: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let response = client.call(Policy::FixedRoute, &request).unwrap();
        assert_eq!(response.len(), 40_000);
        assert!(response[..20_000].iter().eq(request.iter().rev()));
        assert_eq!(&response[20_000..], &request[..]);
        assert!(server.stats().datagrams_received >= 15, "{:?}", server.stats());
        server.shutdown();
    }
}

#[test]
fn many_concurrent_async_requests() {
    let server = echo_server(HandlerMode::Workers(2));
    let mut config = ClientConfig::new(vec![server.local_addr()]);
    config.timeout = Duration::from_millis(200);
    config.retries = 5;
    let mut client = Client::new(config).unwrap();
    let mut expected = HashMap::new();
    for i in 0..400u32 {
        let payload = format!("request {i}").into_bytes();
        let id = client.send(Policy::LbRoute, &payload).unwrap();
        expected.insert(id, payload);
    }
    assert_eq!(client.in_flight(), 400);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !expected.is_empty() && Instant::now() < deadline {
        client.wait(Duration::from_millis(50));
        while let Some((id, result)) = client.try_recv() {
            let want = expected.remove(&id).expect("each id completes once");
            assert_eq!(result.unwrap(), want);
        }
    }
    assert!(expected.is_empty(), "{} requests never completed", expected.len());
    assert_eq!(client.in_flight(), 0);
    server.shutdown();
}

#[test]
fn lb_route_spreads_over_two_servers() {
    let a = Server::bind(config(HandlerMode::Workers(1)), simple(|_: &[u8]| b"a".to_vec())).unwrap();
    let b = Server::bind(config(HandlerMode::NetworkThread), simple(|_: &[u8]| b"b".to_vec())).unwrap();
    let mut client = client_for(vec![a.local_addr(), b.local_addr()]);
    let mut seen = HashMap::new();
    for _ in 0..20 {
        *seen.entry(client.call(Policy::LbRoute, b"?").unwrap()).or_insert(0) += 1;
    }
    assert_eq!(seen.get(b"a".as_slice()), Some(&10));
    assert_eq!(seen.get(b"b".as_slice()), Some(&10));
    // FIXED_ROUTE sticks to `fixed_server` (0).
    for _ in 0..5 {
        assert_eq!(client.call(Policy::FixedRoute, b"?").unwrap(), b"a");
    }
    assert_eq!((a.stats().requests, b.stats().requests), (15, 10));
}

#[test]
fn replicated_route_without_hook_is_refused() {
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let server = Server::bind(
        config(HandlerMode::Workers(1)),
        simple(move |r: &[u8]| {
            counter.fetch_add(1, Ordering::SeqCst);
            r.to_vec()
        }),
    )
    .unwrap();
    let mut client = client_for(vec![server.local_addr()]);
    match client.call(Policy::ReplicatedRoute, b"write") {
        Err(CallError::Refused { code: ErrorCode::NotReplicated, reason }) => {
            assert!(reason.contains("no replication hook"), "{reason}")
        }
        other => panic!("expected a NotReplicated refusal, got {other:?}"),
    }
    assert_eq!(handled.load(Ordering::SeqCst), 0, "the handler must not run unreplicated");
    assert_eq!(server.stats().errors_sent, 1);
}

#[test]
fn retry_reuses_request_id_after_a_dropped_response() {
    let seen: Arc<Mutex<Vec<(u64, u32)>>> = Arc::default();
    let log = seen.clone();
    let server = Server::bind(
        config(HandlerMode::Workers(1)),
        handler_fn(move |request, handle, responder| {
            let client = handle.client();
            let mut log = log.lock().unwrap();
            log.push((client.client_id, client.request_id));
            if log.len() == 1 {
                let _lost = handle; // "lose" the first answer
                return;
            }
            responder.send_response(handle, request.to_vec());
        }),
    )
    .unwrap();
    let mut config = ClientConfig::new(vec![server.local_addr()]);
    config.timeout = Duration::from_millis(30);
    let mut client = Client::new(config).unwrap();
    assert_eq!(client.call(Policy::FixedRoute, b"again").unwrap(), b"again");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], seen[1], "the retry carries the same (client id, request id)");
    assert_eq!(seen[0].0, client.client_id());
    assert_eq!(client.stats().retries, 1);
}

#[test]
fn call_times_out_against_a_silent_server() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = ClientConfig::new(vec![silent.local_addr().unwrap()]);
    config.timeout = Duration::from_millis(10);
    config.retries = 2;
    let mut client = Client::new(config).unwrap();
    match client.call(Policy::FixedRoute, b"anyone?") {
        Err(CallError::Timeout { attempts: 3 }) => {}
        other => panic!("expected timeout, got {other:?}"),
    }
}

#[test]
fn answers_later_from_another_thread() {
    let server = Server::bind(
        config(HandlerMode::Workers(1)),
        handler_fn(|request, handle, responder| {
            let remote = responder.remote();
            let answer = [b"late:".as_slice(), request].concat();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                remote.send_response(handle, answer);
            });
        }),
    )
    .unwrap();
    let mut client = client_for(vec![server.local_addr()]);
    assert_eq!(client.call(Policy::FixedRoute, b"x").unwrap(), b"late:x");
}

fn raw(message_type: MessageType, packet_id: u16, packet_count: u16, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        message_type,
        policy: Policy::FixedRoute,
        flags: 0,
        packet_id,
        packet_count,
        client_id: 1,
        request_id: 1,
        leader_hint: 0,
        payload_len: payload.len() as u16,
    };
    let mut d = vec![0u8; HEADER_SIZE];
    header::encode(&header, &mut d);
    d.extend_from_slice(payload);
    d
}

#[test]
fn bad_datagrams_are_counted_and_harmless() {
    let server = echo_server(HandlerMode::Workers(1));
    let to = server.local_addr();
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    let good = raw(MessageType::Request, 0, 1, b"hi");
    let mut bad_magic = good.clone();
    bad_magic[0] = 0;
    let mut bad_type = good.clone();
    bad_type[2] = 0xF0;
    let mut zero_count = good.clone();
    zero_count[6..8].copy_from_slice(&0u16.to_be_bytes());
    let mut huge_count = raw(MessageType::Request, 1, 3, b"x");
    huge_count[6..8].copy_from_slice(&u16::MAX.to_be_bytes());
    let mut id_beyond = good.clone();
    id_beyond[4..6].copy_from_slice(&5u16.to_be_bytes());
    let mut trailing = good.clone();
    trailing.push(1);
    let datagrams: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xCC],
        good[..HEADER_SIZE + 1].to_vec(),
        bad_magic,
        bad_type,
        zero_count,
        huge_count,
        id_beyond,
        trailing,
        raw(MessageType::Response, 0, 1, b"not for a server"),
        raw(MessageType::Raft, 0, 1, b"no hook"),
        raw(MessageType::Request, 1, 3, b"half a message"),
    ];
    for d in &datagrams {
        attacker.send_to(d, to).unwrap();
    }
    let mut client = client_for(vec![to]);
    assert_eq!(client.call(Policy::FixedRoute, b"still alive").unwrap(), b"still alive");
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.stats().datagrams_received < datagrams.len() as u64 + 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = server.stats();
    assert_eq!(stats.drop_truncated, 3, "{stats:?}");
    assert_eq!(stats.drop_bad_magic, 1);
    assert_eq!(stats.drop_unknown_type, 1);
    assert_eq!(stats.drop_zero_packet_count, 1);
    assert_eq!(stats.drop_packet_count_too_large, 1);
    assert_eq!(stats.drop_packet_id_out_of_range, 1);
    assert_eq!(stats.drop_trailing_bytes, 1);
    assert_eq!(stats.drop_unexpected_type, 2);
    assert_eq!(stats.decode_drops(), 9);
    assert_eq!(stats.requests, 1, "only the client's request and no half message completed");
    server.shutdown();
}

/// A toy hook: the replica `leader` proposes by telling every peer, applies
/// at once (no quorum: this tests the transport's plumbing, not Raft);
/// followers redirect clients and apply what the leader forwards with
/// `respond: false`. The leader answers duplicates from a reply cache.
struct ToyHook {
    me: usize,
    leader: usize,
    peers: usize,
    replies: HashMap<(u64, u32), Option<Vec<u8>>>,
    observed: Arc<AtomicUsize>,
}

impl Replication for ToyHook {
    fn on_request(&mut self, request: ReplicatedRequest, _now_ns: u64, out: &mut ReplicationOutput) {
        if self.me != self.leader {
            out.redirect(request.client, self.leader as u16);
            return;
        }
        let key = (request.client.client_id, request.client.request_id);
        if let Some(cached) = self.replies.get(&key) {
            if let Some(reply) = cached {
                out.respond(request.client, reply.clone());
            }
            return; // a duplicate: never applied twice
        }
        self.replies.insert(key, None);
        for peer in (0..self.peers).filter(|p| *p != self.me) {
            out.send_to_peer(peer, request.payload.clone());
        }
        out.apply(request.client, request.payload, true);
    }

    fn on_peer_message(&mut self, from: usize, message: &[u8], _now_ns: u64, out: &mut ReplicationOutput) {
        assert_eq!(from, self.leader);
        let nobody = ClientRef { addr: SocketAddr::from(([127, 0, 0, 1], 9)), client_id: 0, request_id: 0 };
        out.apply(nobody, message.to_vec(), false);
    }

    fn tick(&mut self, _now_ns: u64, _out: &mut ReplicationOutput) {}

    fn on_response(
        &mut self,
        client: ClientRef,
        response: Vec<u8>,
        sent: bool,
        _out: &mut ReplicationOutput,
    ) {
        assert_eq!(sent, self.me == self.leader);
        self.observed.fetch_add(1, Ordering::SeqCst);
        if sent {
            self.replies.insert((client.client_id, client.request_id), Some(response));
        }
    }

    fn leader_hint(&self) -> Option<u16> {
        Some(self.leader as u16)
    }
}

fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let sockets: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    sockets.iter().map(|s| s.local_addr().unwrap()).collect()
}

#[test]
fn replicated_route_through_a_hook_redirects_then_goes_straight_to_the_leader() {
    let peers = free_addrs(2);
    let applied: Vec<Arc<Mutex<Vec<Vec<u8>>>>> = (0..2).map(|_| Arc::default()).collect();
    let observed: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::default()).collect();
    let servers: Vec<Server> = (0..2)
        .map(|me| {
            let config = ServerConfig {
                bind: peers[me],
                peers: peers.clone(),
                node_id: me as u64,
                handler_mode: if me == 0 { HandlerMode::NetworkThread } else { HandlerMode::Workers(2) },
                ..ServerConfig::default()
            };
            let log = applied[me].clone();
            let handler = simple(move |request: &[u8]| {
                let mut log = log.lock().unwrap();
                log.push(request.to_vec());
                format!("applied #{}", log.len()).into_bytes()
            });
            let hook =
                ToyHook { me, leader: 1, peers: 2, replies: HashMap::new(), observed: observed[me].clone() };
            Server::bind_replicated(config, handler, Box::new(hook)).unwrap()
        })
        .collect();
    let mut client = client_for(peers.clone());
    assert_eq!(client.leader(), 0);
    let big = vec![7u8; 5000]; // several datagrams, also between replicas
    assert_eq!(client.call(Policy::ReplicatedRoute, b"one").unwrap(), b"applied #1");
    assert_eq!(client.leader(), 1);
    assert_eq!(client.stats().redirects, 1);
    assert_eq!(client.call(Policy::ReplicatedRoute, &big).unwrap(), b"applied #2");
    assert_eq!(client.call(Policy::ReplicatedRoute, b"three").unwrap(), b"applied #3");
    assert_eq!(client.stats().redirects, 1, "the leader hint avoids further redirects");
    // A duplicate (same client id and request id, e.g. a retry) sent raw
    // twice to the leader: answered from the hook's cache, applied once.
    let raw_client = UdpSocket::bind("127.0.0.1:0").unwrap();
    raw_client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut request = raw(MessageType::Request, 0, 1, b"four");
    request[2] = (MessageType::Request as u8) << 4 | Policy::ReplicatedRoute as u8;
    let mut answers = Vec::new();
    for _ in 0..2 {
        raw_client.send_to(&request, peers[1]).unwrap();
        let mut buf = [0u8; 2048];
        let (len, _) = raw_client.recv_from(&mut buf).unwrap();
        let (header, payload) = header::decode(&buf[..len], 16).unwrap();
        assert_eq!(
            (header.message_type, header.request_id, header.leader()),
            (MessageType::Response, 1, Some(1))
        );
        answers.push(payload.to_vec());
    }
    assert_eq!(answers, vec![b"applied #4".to_vec(), b"applied #4".to_vec()]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while (applied[0].lock().unwrap().len() < 4 || servers[0].stats().drop_follower_responses < 4)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let leader_log = applied[1].lock().unwrap().clone();
    assert_eq!(*applied[0].lock().unwrap(), leader_log, "same requests in the same order on both replicas");
    assert_eq!(leader_log, vec![b"one".to_vec(), big, b"three".to_vec(), b"four".to_vec()]);
    let (follower, leader) = (servers[0].stats(), servers[1].stats());
    assert_eq!(follower.redirects_sent, 1);
    assert_eq!(follower.peer_messages_received, 4);
    assert_eq!(follower.drop_follower_responses, 4);
    assert_eq!(leader.peer_messages_sent, 4);
    assert_eq!(leader.committed_applied, 4);
    assert_eq!(leader.responses_sent, 5, "four applied answers and one from the cache");
    assert_eq!(observed[1].load(Ordering::SeqCst), 4, "the cached reply is not observed again");
    assert_eq!(observed[0].load(Ordering::SeqCst), 4);
}

#[test]
fn full_worker_queues_drop_and_count_instead_of_queueing_without_bound() {
    let config =
        ServerConfig { handler_mode: HandlerMode::Workers(1), queue_depth: 2, ..ServerConfig::default() };
    let server = Server::bind(
        config,
        simple(|r: &[u8]| {
            std::thread::sleep(Duration::from_millis(20));
            r.to_vec()
        }),
    )
    .unwrap();
    let mut config = ClientConfig::new(vec![server.local_addr()]);
    config.timeout = Duration::from_millis(300);
    config.retries = 0;
    let mut client = Client::new(config).unwrap();
    for i in 0..10u8 {
        client.send(Policy::FixedRoute, &[i]).unwrap();
    }
    let (mut ok, mut timed_out) = (0, 0);
    while ok + timed_out < 10 {
        client.wait(Duration::from_millis(100));
        while let Some((_, result)) = client.try_recv() {
            match result {
                Ok(_) => ok += 1,
                Err(CallError::Timeout { attempts: 1 }) => timed_out += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }
    let stats = server.stats();
    assert!(ok >= 2, "{ok} answered: at least the queue depth");
    assert_eq!(stats.drop_queue_full, timed_out as u64, "{stats:?}");
    assert_eq!(stats.requests, 10);
}

/// The next datagram of `client`'s request `id` that `server` receives
/// (others, such as retries of other requests, are skipped), running the
/// client meanwhile (its retries leave only while it runs).
fn next_datagram_of(server: &UdpSocket, client: &mut Client, id: u32) -> (Header, SocketAddr) {
    let client_id = client.client_id();
    next_datagram_in(server, client, client_id, id)
}

/// The next datagram of request `id` of session `client_id` (the client
/// is polled meanwhile, so it retries).
fn next_datagram_in(
    server: &UdpSocket,
    client: &mut Client,
    client_id: u64,
    id: u32,
) -> (Header, SocketAddr) {
    server.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 2048];
    loop {
        match server.recv_from(&mut buf) {
            Ok((n, from)) => {
                let (h, _) = header::decode(&buf[..n], 8).expect("a well-formed datagram");
                if h.request_id == id && h.client_id == client_id {
                    return (h, from);
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                client.poll_responses();
            }
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "no datagram of request {id}");
    }
}

fn respond(server: &UdpSocket, to: SocketAddr, request: &Header) {
    let reply =
        Header { message_type: MessageType::Response, flags: 0, leader_hint: 0, payload_len: 2, ..*request };
    let mut d = vec![0u8; HEADER_SIZE];
    header::encode(&reply, &mut d);
    d.extend_from_slice(b"ok");
    server.send_to(&d, to).unwrap();
}

/// Waits until request `id` completes; returns whether it was answered.
fn completion_of(client: &mut Client, id: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        client.wait(Duration::from_millis(5));
        while let Some((done, result)) = client.try_recv() {
            if done == id {
                return result.is_ok();
            }
        }
        assert!(Instant::now() < deadline, "request {id} never completed");
    }
}

/// With `report_answered` (the default) each REPLICATED_ROUTE datagram
/// names the client's oldest request still outstanding — every lower one
/// completed, answered or given up — and a retry names it anew; other
/// routes, and a client with the switch off, say nothing.
#[test]
fn replicated_requests_name_the_oldest_outstanding_one_and_retries_name_it_anew() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = ClientConfig::new(vec![server.local_addr().unwrap()]);
    config.timeout = Duration::from_millis(500);
    config.retries = 1;
    let mut client = Client::new(config.clone()).unwrap();
    // Three in flight: each says request 1 may be unanswered.
    let ids: Vec<u32> = (0..3).map(|_| client.send(Policy::ReplicatedRoute, b"x").unwrap()).collect();
    let mut first = Vec::new();
    for &id in &ids {
        let (h, from) = next_datagram_of(&server, &mut client, id);
        assert_eq!(h.answered_below(), Some(ids[0]), "request {id}");
        first.push((h, from));
    }
    // 1 and 2 answered: the next request says 3.
    for (h, from) in &first[..2] {
        respond(&server, *from, h);
        assert!(completion_of(&mut client, h.request_id));
    }
    let fourth = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    assert_eq!(next_datagram_of(&server, &mut client, fourth).0.answered_below(), Some(ids[2]));
    // 3 answered: the retry of 4 (after its timeout) says 4.
    respond(&server, first[2].1, &first[2].0);
    assert!(completion_of(&mut client, ids[2]));
    let (retry, _) = next_datagram_of(&server, &mut client, fourth);
    assert_eq!(retry.answered_below(), Some(fourth), "a retry names the oldest outstanding anew");
    // 4 is given up (no answer to its two attempts): the next says 5.
    assert!(!completion_of(&mut client, fourth), "given up");
    let fifth = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    assert_eq!(next_datagram_of(&server, &mut client, fifth).0.answered_below(), Some(fifth));
    // Another route says nothing; nor does a client with the switch off.
    let lb = client.send(Policy::LbRoute, b"x").unwrap();
    assert_eq!(next_datagram_of(&server, &mut client, lb).0.answered_below(), None);
    config.report_answered = false;
    let mut quiet = Client::new(config).unwrap();
    let id = quiet.send(Policy::ReplicatedRoute, b"x").unwrap();
    let (h, _) = next_datagram_of(&server, &mut quiet, id);
    assert_eq!((h.answered_below(), h.flags & header::FLAG_ANSWERED), (None, 0));
}

/// After `u32::MAX` the client's ids wrap into a new session: new requests
/// carry a new client id and spans of that session only; a request of the
/// old session still in flight is retried under the old id and its answer
/// taken, while an answer naming the wrong session completes nothing.
#[test]
fn request_ids_wrap_into_a_new_client_id_and_the_old_sessions_requests_still_complete() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = ClientConfig::new(vec![server.local_addr().unwrap()]);
    config.timeout = Duration::from_millis(300);
    config.retries = 3;
    config.first_request_id = u32::MAX - 1;
    let mut client = Client::new(config).unwrap();
    let old = client.client_id();
    let a = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    let b = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    assert_eq!((a, b), (u32::MAX - 1, u32::MAX));
    let new = client.client_id();
    assert_ne!(new, old, "a new client id after the session's last id");
    assert_eq!((client.stats().new_sessions, client.next_request_id()), (1, 1));
    let c = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    let d = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    assert_eq!((c, d), (1, 2));
    let (ha, from) = next_datagram_in(&server, &mut client, old, a);
    let (hb, _) = next_datagram_in(&server, &mut client, old, b);
    assert_eq!((ha.answered_below(), hb.answered_below()), (Some(a), Some(a)), "the old session's spans");
    let (hc, _) = next_datagram_of(&server, &mut client, c);
    let (hd, _) = next_datagram_of(&server, &mut client, d);
    assert_eq!((hc.answered_below(), hd.answered_below()), (Some(c), Some(c)), "the new session's own spans");
    // a answered; b's retry keeps the old id and no longer names a span.
    respond(&server, from, &ha);
    assert!(completion_of(&mut client, a));
    let (retry, _) = next_datagram_in(&server, &mut client, old, b);
    assert_eq!(retry.answered_below(), None, "no span for a session that is over");
    respond(&server, from, &retry);
    assert!(completion_of(&mut client, b), "the old session's answer is taken");
    // An answer to id 2 naming the old session is not d's.
    let stale = client.stats().stale_responses;
    respond(&server, from, &Header { client_id: old, ..hd });
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.stats().stale_responses == stale {
        assert!(Instant::now() < deadline, "the wrong session's answer is counted stale");
        client.wait(Duration::from_millis(5));
    }
    assert!(client.try_recv().is_none(), "nothing completed by it");
    respond(&server, from, &hd);
    assert!(completion_of(&mut client, d));
    respond(&server, from, &hc);
    assert!(completion_of(&mut client, c));
}

/// An ERROR saying the client's session expired fails that request with
/// the code, and the client's next requests go in a new session (a new
/// client id, ids from 1); a request of the old session still outstanding
/// is retried under its old id and its answer taken. The same ERROR for a
/// request of an older session changes nothing.
#[test]
fn a_session_expired_answer_fails_its_request_and_the_next_go_in_a_new_session() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = ClientConfig::new(vec![server.local_addr().unwrap()]);
    config.timeout = Duration::from_millis(300);
    config.retries = 3;
    let mut client = Client::new(config).unwrap();
    let old = client.client_id();
    let a = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    let b = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    let (ha, from) = next_datagram_of(&server, &mut client, a);
    let (hb, _) = next_datagram_of(&server, &mut client, b);
    let expire = |h: &Header| {
        let reply =
            Header { message_type: MessageType::Error, flags: 0, leader_hint: 0, payload_len: 3, ..*h };
        let mut d = vec![0u8; HEADER_SIZE];
        header::encode(&reply, &mut d);
        d.extend_from_slice(&[ErrorCode::SessionExpired as u8, b'n', b'o']);
        server.send_to(&d, from).unwrap();
    };
    expire(&ha);
    let deadline = Instant::now() + Duration::from_secs(10);
    let result = loop {
        client.wait(Duration::from_millis(5));
        if let Some((id, result)) = client.try_recv() {
            assert_eq!(id, a);
            break result;
        }
        assert!(Instant::now() < deadline, "request {a} never completed");
    };
    assert!(matches!(result, Err(CallError::Refused { code: ErrorCode::SessionExpired, .. })), "{result:?}");
    let new = client.client_id();
    assert_ne!(new, old, "a new session");
    assert_eq!((client.stats().new_sessions, client.next_request_id()), (1, 1));
    let c = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    let (hc, _) = next_datagram_of(&server, &mut client, c);
    assert_eq!((hc.client_id, hc.request_id, hc.answered_below()), (new, 1, Some(1)));
    // b, of the old session: retried under the old id, its answer taken; an
    // expiry for it changes no session.
    let (retry, _) = next_datagram_in(&server, &mut client, old, b);
    assert_eq!((retry.answered_below(), hb.answered_below()), (None, Some(a)));
    expire(&retry);
    assert!(!completion_of(&mut client, b), "the old session's request fails with the expiry");
    assert_eq!((client.client_id(), client.stats().new_sessions), (new, 1), "no second new session");
    respond(&server, from, &hc);
    assert!(completion_of(&mut client, c));
}

/// With the client secret, an answer sealed for another client (replayed
/// here by someone who saw it) is refused before its counter is checked: it
/// does not move the client's replay window, so this client's own answer,
/// sealed earlier by the same server and arriving after it, is still taken.
#[test]
fn another_clients_sealed_answer_is_refused_without_moving_the_replay_window() {
    let secret = ordo_auth::Secret::from_bytes(b"loopback tests' client secret").unwrap();
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = ClientConfig::new(vec![server.local_addr().unwrap()]);
    config.timeout = Duration::from_millis(300);
    config.retries = 1;
    config.secret = Some(secret.clone());
    let mut client = Client::new(config).unwrap();
    let id = client.send(Policy::ReplicatedRoute, b"x").unwrap();
    let (request, from) = next_datagram_of(&server, &mut client, id);
    // The server's answers, sealed as a server holding the client secret
    // seals them (context: the client id the answer is for).
    let sealed = |client_id: u64, now_ns: u64| {
        let reply = Header {
            message_type: MessageType::Response,
            flags: header::FLAG_AUTH,
            leader_hint: 0,
            payload_len: 2,
            client_id,
            ..request
        };
        let mut d = vec![0u8; HEADER_SIZE];
        header::encode(&reply, &mut d);
        d.extend_from_slice(b"ok");
        let mut sealer = ordo_auth::Sealer::new(secret.derive(ordo_r2p2::auth::ANSWER_LABEL));
        sealer.seal(&mut d, now_ns, &client_id.to_be_bytes());
        d
    };
    let now = ordo_r2p2::auth::unix_now_ns();
    // Another client's answer, 20 ms (~19,500 counter ticks) later than
    // this client's: past the 4,096 a window remembers below its top.
    server.send_to(&sealed(client.client_id() ^ 1, now + 20_000_000), from).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.stats().unauthenticated_answers == 0 {
        assert!(Instant::now() < deadline, "the other client's answer is refused");
        client.wait(Duration::from_millis(5));
    }
    server.send_to(&sealed(client.client_id(), now), from).unwrap();
    assert!(completion_of(&mut client, id), "this client's own answer is taken");
    assert_eq!(client.stats().unauthenticated_answers, 1);
}
