//! The broadcast limits (Fig. 4 with ordo's window and payload bounds) over
//! a hand-driven network: every write waits in a per-link FIFO queue until
//! the test releases it. The paper's running example (Fig. 3) is the
//! scenario script `testdata/acuerdo/fig3_running_example.txt`.

use ordo_acuerdo::{Config, Effects, Engine, Header, Note, Role, Target};
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

    fn delivered(&self, id: MemberId) -> Vec<Header> {
        self.nodes[&id].delivered.iter().map(|(h, _)| *h).collect()
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
