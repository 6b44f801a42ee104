//! The running example of the paper (acuerdo Fig. 3, §3.2-§3.4), step by
//! step, over a hand-driven network: every write waits in a per-link FIFO
//! queue until the script releases it, so each step of the story happens
//! exactly as told.
//!
//! 1. Node 1 leads epoch (0,1) and broadcasts ((0,1),1) and ((0,1),2).
//! 2. Node 3 finds both in one scan and accepts only the later one; the
//!    leader commits both; the followers commit them from its Commit entry.
//! 3. Node 1 broadcasts ((0,1),3), which reaches node 3 but not node 2, and
//!    fails.
//! 4. Node 2 times out first and proposes (0,2); node 3 rejects it as less
//!    up to date and proposes (0,3); node 2 joins; node 3 wins (0,3).
//! 5. Node 3's diff gives node 2 ((0,1),3); both commit it, then a new
//!    message of epoch (0,3).

use ordo_acuerdo::{Config, Effects, Engine, Epoch, Header, Note, Role, Target, Vote};
use ordo_fabric::{MemberId, Region};
use std::collections::{BTreeMap, VecDeque};

struct Node {
    engine: Option<Engine>,
    region: Region,
    delivered: Vec<(Header, Vec<u8>)>,
    fx: Effects,
}

/// Writes captured at post time and not yet landed: `(offset, bytes)`.
type Queue = VecDeque<(usize, Vec<u8>)>;

/// Members with regions, and a FIFO queue of captured writes per link.
struct Cluster {
    nodes: BTreeMap<MemberId, Node>,
    queues: BTreeMap<(MemberId, MemberId), Queue>,
}

const MS: u64 = 1_000_000;

impl Cluster {
    fn new(ids: &[MemberId]) -> Cluster {
        let mut nodes = BTreeMap::new();
        for &id in ids {
            let mut cfg = Config::new(ids.to_vec(), id);
            cfg.heartbeat_interval_ns = 50_000;
            cfg.heartbeat_timeout_ns = MS;
            cfg.election_timeout_ns = 10 * MS;
            // The script runs at fixed instants: Commit columns go out at
            // once rather than periodically.
            cfg.commit_push_interval_ns = 0;
            let region = Region::new_heap(ordo_acuerdo::Layout::new(&cfg).region_len);
            let engine = Engine::new(cfg, region.clone(), 0).expect("valid config");
            nodes.insert(
                id,
                Node { engine: Some(engine), region, delivered: Vec::new(), fx: Effects::default() },
            );
        }
        Cluster { nodes, queues: BTreeMap::new() }
    }

    fn engine(&mut self, id: MemberId) -> &mut Engine {
        self.nodes.get_mut(&id).and_then(|n| n.engine.as_mut()).expect("live node")
    }

    /// Polls `id` at `now`; captures every push into the link queues (as a
    /// fabric does at post time) and returns the notes and commit tickets.
    fn poll(&mut self, id: MemberId, now: u64) -> (Vec<Note>, Vec<Header>, Vec<MemberId>) {
        let ids: Vec<MemberId> = self.nodes.keys().copied().collect();
        let node = self.nodes.get_mut(&id).expect("node");
        let Some(engine) = node.engine.as_mut() else { return Default::default() };
        node.fx.clear();
        let delivered = &mut node.delivered;
        engine.poll(now, &mut node.fx, &mut |h: Header, p: &[u8]| delivered.push((h, p.to_vec())));
        let mut row_pushes_to = Vec::new();
        let row_len = engine.layout().row_used;
        for push in &node.fx.pushes {
            let mut bytes = vec![0; push.len];
            node.region.read_bytes(push.offset, &mut bytes);
            let targets: Vec<MemberId> = match push.to {
                Target::All => ids.iter().copied().filter(|m| *m != id).collect(),
                Target::Peer(p) => vec![p],
            };
            for t in targets {
                if push.len == row_len && push.offset < engine.layout().sst_len {
                    row_pushes_to.push(t);
                }
                self.queues.entry((id, t)).or_default().push_back((push.offset, bytes.clone()));
            }
        }
        (node.fx.notes.clone(), node.fx.committed.clone(), row_pushes_to)
    }

    /// Lets every queued write from `src` to `dst` land.
    fn deliver(&mut self, src: MemberId, dst: MemberId) {
        let queue = self.queues.remove(&(src, dst)).unwrap_or_default();
        let node = &self.nodes[&dst];
        if node.engine.is_some() {
            for (offset, bytes) in queue {
                node.region.write_bytes(offset, &bytes);
            }
        }
    }

    fn deliver_all(&mut self) {
        let links: Vec<(MemberId, MemberId)> = self.queues.keys().copied().collect();
        for (s, d) in links {
            self.deliver(s, d);
        }
    }

    /// Polls every live node and lets everything land, `rounds` times.
    fn settle(&mut self, now: u64, rounds: usize) {
        let ids: Vec<MemberId> = self.nodes.keys().copied().collect();
        for _ in 0..rounds {
            for &id in &ids {
                self.poll(id, now);
            }
            self.deliver_all();
        }
    }

    fn crash(&mut self, id: MemberId) {
        self.nodes.get_mut(&id).expect("node").engine = None;
        self.queues.retain(|(s, d), _| *s != id && *d != id);
    }

    fn delivered(&self, id: MemberId) -> Vec<Header> {
        self.nodes[&id].delivered.iter().map(|(h, _)| *h).collect()
    }

    /// The Accept entry of `row_member` as `at` sees it.
    fn accept_seen(&mut self, at: MemberId, row_member: MemberId) -> Header {
        let layout = self.engine(at).layout().clone();
        let row = self.nodes.keys().position(|m| *m == row_member).expect("member");
        let offset = layout.word(row, layout.columns.accept, 0);
        Header::decode(self.nodes[&at].region.load_acquire(offset))
    }
}

fn h(round: u32, leader: MemberId, count: u32) -> Header {
    Epoch::new(round, leader).header(count)
}

#[test]
fn figure_3_running_example() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let mut t = 0;

    // Node 1 proposes itself first; the others join its vote (rule 2).
    c.poll(1, t);
    c.deliver(1, 2);
    c.deliver(1, 3);
    c.settle(t, 4);
    let e1 = Epoch::new(0, 1);
    assert_eq!(c.engine(1).role(), Role::Leader);
    assert_eq!(c.engine(1).epoch(), e1);
    for f in [2, 3] {
        assert_eq!((c.engine(f).role(), c.engine(f).epoch()), (Role::Follower, e1));
    }

    // §3.2 Broadcasting: two messages with successive headers.
    t += 100_000;
    assert_eq!(c.engine(1).broadcast(b"m1"), Ok(h(0, 1, 1)));
    assert_eq!(c.engine(1).broadcast(b"m2"), Ok(h(0, 1, 2)));
    assert_eq!(c.engine(2).broadcast(b"x").unwrap_err().to_string(), "not the leader (redirect to Some(1))");
    c.poll(1, t);
    // Node 3 discovers both in one scan and acknowledges only the later one.
    c.deliver(1, 3);
    let (_, _, rows_to) = c.poll(3, t);
    assert_eq!(rows_to.iter().filter(|m| **m == 1).count(), 1, "one Accept push to the leader");
    assert_eq!(c.engine(3).accepted(), h(0, 1, 2));
    c.deliver(3, 1);
    assert_eq!(c.accept_seen(1, 3), h(0, 1, 2), "Accept_SST[3] at the leader");
    // The leader commits both: accepted at node 3 and locally (a quorum).
    let (_, committed, _) = c.poll(1, t);
    assert_eq!(committed, vec![h(0, 1, 1), h(0, 1, 2)]);
    assert_eq!(c.delivered(1), vec![h(0, 1, 1), h(0, 1, 2)]);
    assert!(c.delivered(2).is_empty(), "node 2 has not even received them yet");
    // The followers commit from the leader's Commit entry.
    c.settle(t, 3);
    for f in [2, 3] {
        assert_eq!(c.delivered(f), vec![h(0, 1, 1), h(0, 1, 2)], "node {f}");
    }

    // Node 1 sends ((0,1),3); it reaches node 3 only, and node 1 fails.
    t += 100_000;
    assert_eq!(c.engine(1).broadcast(b"m3"), Ok(h(0, 1, 3)));
    c.poll(1, t);
    c.deliver(1, 3);
    c.poll(3, t);
    assert_eq!(c.engine(3).accepted(), h(0, 1, 3));
    c.crash(1);
    let crash = t;

    // §3.3 Election. Node 2 times out first and proposes (0,2).
    c.poll(3, crash + 100_000); // a heartbeat of node 3 for node 2 to see
    c.deliver(3, 2);
    let (notes, _, _) = c.poll(2, crash + 1_200_000);
    let v2 = Vote { e_new: Epoch::new(0, 2), acpt: h(0, 1, 2) };
    assert!(notes.contains(&Note::Voted(v2)), "{notes:?}");
    assert_eq!(c.engine(2).role(), Role::Electing);
    // Node 3 joins the election and rejects node 2: its log is more up to
    // date (((0,1),3) > ((0,1),2)), so it proposes (0,3) itself (rule 1).
    c.deliver(2, 3);
    let (notes, _, _) = c.poll(3, crash + 1_300_000);
    let v3 = Vote { e_new: Epoch::new(0, 3), acpt: h(0, 1, 3) };
    assert!(notes.contains(&Note::Voted(v3)), "{notes:?}");
    // Node 2's proposed vote is smaller: it votes for node 3 (rule 2).
    c.deliver(3, 2);
    let (notes, _, _) = c.poll(2, crash + 1_400_000);
    assert!(notes.contains(&Note::Voted(v3)), "{notes:?}");
    // With the votes of nodes 2 and 3, node 3 wins epoch (0,3).
    c.deliver(2, 3);
    let (notes, _, _) = c.poll(3, crash + 1_500_000);
    let e3 = Epoch::new(0, 3);
    assert!(notes.contains(&Note::BecameLeader(e3)), "{notes:?}");
    assert!(c.engine(2).broadcast(b"x").is_err());

    // §3.4 Transition: node 3's diff ((0,3),0) gives node 2 ((0,1),3).
    c.poll(3, crash + 1_500_000);
    c.deliver(3, 2);
    let (notes, _, _) = c.poll(2, crash + 1_600_000);
    assert!(notes.contains(&Note::JoinedEpoch(e3)), "{notes:?}");
    assert_eq!((c.engine(2).role(), c.engine(2).epoch()), (Role::Follower, e3));
    assert!(c.engine(2).log_headers().any(|x| x == h(0, 1, 3)), "the diff carried ((0,1),3)");
    assert_eq!(c.engine(2).accepted(), h(0, 3, 0));
    c.settle(crash + 1_700_000, 3);
    for f in [2, 3] {
        assert_eq!(c.delivered(f), vec![h(0, 1, 1), h(0, 1, 2), h(0, 1, 3)], "node {f}");
    }
    // Broadcast goes on in epoch (0,3).
    assert_eq!(c.engine(3).broadcast(b"m4"), Ok(h(0, 3, 1)));
    c.settle(crash + 1_800_000, 5);
    for f in [2, 3] {
        assert_eq!(c.delivered(f), vec![h(0, 1, 1), h(0, 1, 2), h(0, 1, 3), h(0, 3, 1)], "node {f}");
        let payloads: Vec<&[u8]> = c.nodes[&f].delivered.iter().map(|(_, p)| p.as_slice()).collect();
        assert_eq!(payloads, vec![&b"m1"[..], b"m2", b"m3", b"m4"]);
    }
}

#[test]
fn broadcast_window_and_payload_limits() {
    let mut c = Cluster::new(&[0, 1, 2]);
    c.settle(0, 6);
    let leader = (0..3).find(|m| c.engine(*m).role() == Role::Leader).expect("a leader");
    let max = c.engine(leader).config().max_outstanding;
    let big = vec![0u8; c.engine(leader).config().max_payload + 1];
    assert!(matches!(c.engine(leader).broadcast(&big), Err(ordo_acuerdo::BroadcastError::TooLarge { .. })));
    for _ in 0..max {
        c.engine(leader).broadcast(b"x").expect("within the window");
    }
    assert_eq!(c.engine(leader).broadcast(b"x"), Err(ordo_acuerdo::BroadcastError::WouldBlock));
    c.settle(10, 30);
    c.engine(leader).broadcast(b"x").expect("the window opened after commits");
    for m in 0..3 {
        assert_eq!(c.delivered(m).len(), max as usize, "member {m}");
    }
}
