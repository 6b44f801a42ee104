//! The `leadercost` figure: the network thread's work per request, the
//! leader of three replicas against the unreplicated server, measured on
//! one thread with no socket and no scheduler in the way.
//!
//! Where every member has a core of its own, the replicated peak is bound
//! by the leader's network thread (BENCHMARKS.md, 16-core runs: the leader
//! at ~100 % CPU at and past every replicated peak, the followers lower).
//! On a shared machine the peak searches of `peakloss` spread by more than
//! any change to that thread's work; this figure measures the work itself.
//!
//! # How
//! - Each server is what `ordo r3p2 serve` runs on its network thread,
//!   built by [`NodeOptions::core`]: the sans-I/O `ServerCore` with the
//!   node's own Raft hook (log in memory, replica traffic sealed with a
//!   cluster secret) and its handler inline — the configuration of the
//!   `peakloss` figure (`spin:1`, handlers on the network thread).
//! - The cores are wired in memory: what a core sends in a turn is copied
//!   to the receivers' inboxes after the turn; datagrams to the client are
//!   checked (every request answered once, with a response).
//! - A loop turn of the leader takes `batch` new client requests plus the
//!   followers' answers to its previous turn (the steady state under load:
//!   appends pipelined turn by turn), then its timers and the end of the
//!   turn — exactly the calls of the network loop (`server.rs`). Each
//!   member's turns are timed on their own (moving datagrams is not). The unreplicated
//!   server's turns take `batch` requests each.
//! - The requests come from one client (the load generator's), or from
//!   `MANY_CLIENTS` in turn: each replica keeps a session per client
//!   (its window of applied ids and answers, snapshotted with the log),
//!   which the unreplicated server does not. Each request names the oldest
//!   request not answered yet (the answered span, as `Client` sends by
//!   default), so a session holds only the answers still owed.
//! - Left out on both sides: the system calls (one `recvmmsg` and one
//!   `sendmmsg` per turn, the same per client datagram on both sides; the
//!   leader's extra replica datagrams share them).
//!
//! # Invariants
//! - A sample whose requests are not all answered, each exactly once, with
//!   a response, is an error, not a figure.
//! - The cores are the production code (`NodeOptions::core`), never a
//!   copy; the harness only moves bytes and reads the clock.

use crate::noise::{Comparison, Probe, Retry, interleave};
use ordo_r2p2::header::{self, HEADER_SIZE, Header, MessageType, Policy};
use ordo_r2p2::{HandlerMode, NodeCore, NodeOptions, ServiceKind, Transport};
use std::io;
use std::net::SocketAddr;
use std::time::Instant;

/// The client's address (never bound: nothing leaves this process).
const CLIENT: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 9));
/// Synthetic time between two requests (a 200k/s load), ns: ticks and
/// heartbeats fall due as they would at such a rate.
const GAP_NS: u64 = 5_000;
/// Requests a sample runs untimed before it measures.
const WARMUP: u64 = 5_000;
/// The many-clients point's clients (a server's worth: each replica keeps
/// a session per client).
const MANY_CLIENTS: u32 = 1_000;

/// Datagrams in flight: one flat buffer, so moving them allocates nothing
/// in the timed turns.
#[derive(Default)]
struct Datagrams {
    bytes: Vec<u8>,
    /// (sender or receiver, start, length).
    items: Vec<(SocketAddr, usize, usize)>,
}

impl Datagrams {
    fn push(&mut self, addr: SocketAddr, datagram: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(datagram);
        self.items.push((addr, start, datagram.len()));
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }
}

impl Transport for Datagrams {
    fn send_datagram(&mut self, to: SocketAddr, datagram: &[u8]) -> io::Result<()> {
        self.push(to, datagram);
        Ok(())
    }
}

/// One server and its queues.
struct Member {
    node: NodeCore,
    addr: SocketAddr,
    inbox: Datagrams,
    outbox: Datagrams,
}

impl Member {
    /// One network-loop turn: every datagram in the inbox, the timers, the
    /// end of the turn (the calls `NetworkLoop::do_work` makes).
    fn turn(&mut self, now_ns: u64) {
        let NodeCore { core, exec, .. } = &mut self.node;
        for &(from, start, len) in &self.inbox.items {
            core.on_datagram(now_ns, from, &self.inbox.bytes[start..start + len], exec, &mut self.outbox);
        }
        self.inbox.clear();
        core.on_timers(now_ns, exec, &mut self.outbox);
        core.end_turn(now_ns, exec, &mut self.outbox);
    }
}

/// The servers of one sample, the client's bookkeeping and the clock.
struct Cluster {
    members: Vec<Member>,
    policy: Policy,
    now_ns: u64,
    next_request: u32,
    answered: u64,
    /// Answers that were not a response to a request not yet answered.
    wrong: u64,
    scratch: Vec<u8>,
    /// Request ids answered, by id (every id at most once).
    seen: Vec<bool>,
    /// The oldest request not answered yet (every lower id was): each
    /// request says it, as `Client` does by default (the answered span).
    oldest_unanswered: u32,
    /// Client ids the requests take in turn (each its own session in the
    /// replicas' session table).
    clients: u32,
}

impl Cluster {
    /// `members` servers (1: unreplicated) as `peakloss` runs them, serving
    /// `clients` clients in turn.
    fn new(members: usize, clients: u32) -> Result<Cluster, String> {
        let addrs: Vec<SocketAddr> =
            (0..members).map(|i| SocketAddr::from(([127, 0, 0, 1], 7100 + i as u16))).collect();
        let secret = (members > 1).then(ordo_auth::Secret::generate);
        let mut built = Vec::new();
        for (id, &addr) in addrs.iter().enumerate() {
            let mut opts = NodeOptions::new(id, addrs.clone(), None);
            opts.mode = HandlerMode::NetworkThread;
            opts.service = ServiceKind::Spin { micros: 1 };
            opts.replicated = members > 1;
            opts.auth.cluster = secret.clone();
            let node = opts.core().map_err(|e| format!("leadercost: node {id}: {e}"))?;
            built.push(Member { node, addr, inbox: Datagrams::default(), outbox: Datagrams::default() });
        }
        let policy = if members > 1 { Policy::ReplicatedRoute } else { Policy::FixedRoute };
        let mut cluster = Cluster {
            members: built,
            policy,
            now_ns: 1_000_000_000,
            next_request: 1,
            answered: 0,
            wrong: 0,
            scratch: Vec::new(),
            seen: vec![false],
            oldest_unanswered: 1,
            clients: clients.max(1),
        };
        if members > 1 {
            cluster.elect()?;
        }
        Ok(cluster)
    }

    fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| m.node.status.as_ref().is_some_and(|s| s.is_leader()))
    }

    /// Runs every member's turns, a millisecond apart, until one leads and
    /// every member knows its first commit (the election's no-op, in a
    /// fresh cluster): the measured requests then find no election work
    /// left on any member.
    fn elect(&mut self) -> Result<(), String> {
        for _ in 0..2_000 {
            for i in 0..self.members.len() {
                self.turn(i);
            }
            self.now_ns += 1_000_000;
            if let Some(l) = self.leader() {
                let status = self.members[l].node.status.as_ref().expect("replicated");
                if status.commit() > 0
                    && self
                        .members
                        .iter()
                        .all(|m| m.node.status.as_ref().expect("replicated").commit() == status.commit())
                {
                    return Ok(());
                }
            }
        }
        Err("leadercost: no leader after 2 s of simulated time".into())
    }

    /// Member `i`'s turn, then its datagrams delivered.
    fn turn(&mut self, i: usize) {
        let now = self.now_ns;
        self.members[i].turn(now);
        self.deliver(i);
    }

    /// Moves member `i`'s sent datagrams to their receivers.
    fn deliver(&mut self, i: usize) {
        let out = std::mem::take(&mut self.members[i].outbox);
        let from = self.members[i].addr;
        for &(to, start, len) in &out.items {
            let datagram = &out.bytes[start..start + len];
            if to == CLIENT {
                self.on_answer(datagram);
            } else if let Some(m) = self.members.iter_mut().find(|m| m.addr == to) {
                m.inbox.push(from, datagram);
            }
        }
        self.members[i].outbox = out;
        self.members[i].outbox.clear();
    }

    fn on_answer(&mut self, datagram: &[u8]) {
        let fresh = match header::decode(datagram, 1) {
            Ok((h, _)) if h.message_type == MessageType::Response => {
                let id = h.request_id as usize;
                match self.seen.get_mut(id) {
                    Some(seen) if !*seen => {
                        *seen = true;
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        if fresh {
            self.answered += 1;
        } else {
            self.wrong += 1;
        }
    }

    /// Queues `n` new client requests in `to`'s inbox.
    fn requests(&mut self, to: usize, n: u64) {
        for _ in 0..n {
            let id = self.next_request;
            self.next_request += 1;
            self.seen.push(false);
            let payload = u64::from(id).to_le_bytes();
            while self.seen.get(self.oldest_unanswered as usize) == Some(&true) {
                self.oldest_unanswered += 1;
            }
            let mut header = Header {
                message_type: MessageType::Request,
                policy: self.policy,
                flags: 0,
                packet_id: 0,
                packet_count: 1,
                client_id: 42 + u64::from(id % self.clients),
                request_id: id,
                leader_hint: 0,
                payload_len: payload.len() as u16,
            };
            // Every id below the oldest unanswered one was answered, this
            // client's among them.
            header.set_answered_below(self.oldest_unanswered);
            self.scratch.clear();
            self.scratch.resize(HEADER_SIZE, 0);
            header::encode(&header, &mut self.scratch);
            self.scratch.extend_from_slice(&payload);
            self.members[to].inbox.push(CLIENT, &self.scratch);
        }
    }

    /// `requests` requests, `batch` per leader turn (each follower's turn
    /// follows the leader's); returns the leader's and the followers' time
    /// in their turns, ns (`timed`: else 0).
    fn run(&mut self, requests: u64, batch: u64, timed: bool) -> Result<Spent, String> {
        let leader =
            if self.members.len() > 1 { self.leader().ok_or("leadercost: lost the leader")? } else { 0 };
        let mut spent = Spent::default();
        let mut left = requests;
        while left > 0 {
            let n = batch.min(left);
            left -= n;
            self.requests(leader, n);
            let now = self.now_ns;
            let t0 = Instant::now();
            leader_turn(&mut self.members[leader], now);
            let t1 = Instant::now();
            self.deliver(leader);
            let mut followers = 0;
            for f in (0..self.members.len()).filter(|&f| f != leader) {
                let t0 = Instant::now();
                follower_turn(&mut self.members[f], now);
                followers += t0.elapsed().as_nanos() as u64;
                self.deliver(f);
            }
            if timed {
                spent.leader += t1.duration_since(t0).as_nanos() as u64;
                spent.followers += followers;
            }
            self.now_ns += n * GAP_NS;
        }
        Ok(spent)
    }

    /// Untimed turns until every request sent is answered (or a bound).
    fn drain(&mut self) -> Result<(), String> {
        for _ in 0..1_000 {
            if self.answered + 1 == u64::from(self.next_request) {
                break;
            }
            for i in 0..self.members.len() {
                self.turn(i);
            }
            self.now_ns += GAP_NS;
        }
        let sent = u64::from(self.next_request) - 1;
        if self.answered != sent || self.wrong != 0 {
            return Err(format!(
                "leadercost: {} of {sent} requests answered, {} stray answers: the harness or the core is broken",
                self.answered, self.wrong
            ));
        }
        Ok(())
    }
}

/// The leader's timed turn: a frame of its own, so a profile of this
/// figure (`perf record --call-graph dwarf`) separates its work from the
/// followers'.
#[inline(never)]
fn leader_turn(m: &mut Member, now_ns: u64) {
    m.turn(now_ns);
    // Not a tail call, and not folded into `follower_turn`.
    std::hint::black_box(1u8);
}

/// A follower's timed turn (see [`leader_turn`]).
#[inline(never)]
fn follower_turn(m: &mut Member, now_ns: u64) {
    m.turn(now_ns);
    std::hint::black_box(2u8);
}

/// Time spent in turns, ns.
#[derive(Clone, Copy, Debug, Default)]
struct Spent {
    leader: u64,
    followers: u64,
}

/// One sample's work per request, ns.
#[derive(Clone, Copy, Debug)]
pub struct Work {
    /// The leader's (or the lone server's) network thread.
    pub leader_ns: f64,
    /// Every replica's network thread together.
    pub group_ns: f64,
}

/// One sample: a fresh cluster of `members`, `requests` timed requests of
/// `clients` clients in turn, in turns of `batch`; the work per request.
pub fn sample(members: usize, clients: u32, batch: u64, requests: u64) -> Result<Work, String> {
    let mut cluster = Cluster::new(members, clients)?;
    cluster.run(WARMUP, batch, false)?;
    let spent = cluster.run(requests, batch, true)?;
    cluster.drain()?;
    let per = |ns: u64| ns as f64 / requests as f64;
    Ok(Work { leader_ns: per(spent.leader), group_ns: per(spent.leader + spent.followers) })
}

/// The figure: per batch size, the leader of three against the
/// unreplicated server, interleaved, `rounds` rounds.
pub fn leader_cost(quick: bool, progress: &mut impl FnMut(&str)) -> Result<Vec<Comparison>, String> {
    let (rounds, requests) = if quick { (3, 40_000) } else { (5, 200_000) };
    progress(&format!(
        "leadercost: the network thread's work per request, in memory on one thread (no system calls), {requests} requests per sample, {rounds} rounds interleaved"
    ));
    let mut out = Vec::new();
    // One client (the load generator's), and a server's worth of clients:
    // the replicas keep a session per client (its applied window and
    // answers), which the unreplicated server does not.
    for (batch, clients) in [(1u64, 1u32), (16, 1), (64, 1), (16, MANY_CLIENTS)] {
        let side = |members: usize| {
            move || {
                let probe = Probe::start();
                let ns = sample(members, clients, batch, requests)?;
                Ok((ns, probe.stop()))
            }
        };
        let rounds = interleave(rounds, Retry::default(), side(1), side(3))?;
        let who = if clients == 1 { String::new() } else { format!(", {clients} clients in turn") };
        let leader = Comparison::of(
            &format!(
                "network thread's work per request, {batch} request(s) per turn{who}, 1 µs handler inline, replica traffic sealed: leader of 3 / unreplicated"
            ),
            "ns/request",
            ("unreplicated", "leader of 3"),
            &rounds,
            |w: &Work| Some(w.leader_ns),
        );
        let group = Comparison::of(
            &format!(
                "the same, all three replicas' network threads together / unreplicated ({batch} request(s) per turn{who}; what counts where the group shares the cores)"
            ),
            "ns/request",
            ("unreplicated", "3 replicas"),
            &rounds,
            |w: &Work| Some(w.group_ns),
        );
        for c in [leader, group] {
            progress(&c.line(|v| format!("{v:.0} ns")));
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_is_answered_once_and_the_leader_works_more_than_a_lone_server() {
        // The least of three samples each: a descheduled turn inflates one.
        let least = |members: usize| {
            (0..3)
                .map(|_| sample(members, 1, 16, 2_000).unwrap())
                .fold((f64::MAX, f64::MAX), |m, w| (m.0.min(w.leader_ns), m.1.min(w.group_ns)))
        };
        let alone = least(1);
        let (leader, group) = least(3);
        assert!(alone.0 > 0.0 && leader > 0.0);
        assert_eq!(alone.0, alone.1, "a lone server is its whole group");
        // The leader runs the same handler and answers the same requests,
        // and seals and replicates them besides; the followers run the
        // handler too.
        assert!(leader > alone.0, "leader {leader} ns/request, unreplicated {}", alone.0);
        assert!(group > leader + alone.0, "group {group} ns/request, leader {leader}");
    }

    #[test]
    fn a_lost_answer_is_an_error_not_a_figure() {
        let mut cluster = Cluster::new(3, 1).unwrap();
        cluster.run(100, 4, false).unwrap();
        // A request the client counts as sent that no server ever saw.
        cluster.next_request += 1;
        cluster.seen.push(false);
        let err = cluster.drain().unwrap_err();
        assert!(err.contains("100 of 101"), "{err}");
    }
}
