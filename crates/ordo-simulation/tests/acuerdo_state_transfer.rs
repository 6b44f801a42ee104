//! State transfer, scripted: a follower is down long enough that log
//! garbage collection (on by default) drops entries it has not committed;
//! it restarts with empty state, catches up by a snapshot of the
//! application (the sim app: running hash and count of delivered digests)
//! plus the log suffix, and then delivers new messages in the same order as
//! the others. A lockstep network: every push lands before the next poll.

use ordo_simulation::acuerdo as common;

use common::{App, AppEvent};
use ordo_acuerdo::{BroadcastError, Config, Effects, Engine, Header, Layout, Note, Role, Target};
use ordo_fabric::{MemberId, Region};

const US: u64 = 1_000;

struct Node {
    engine: Option<Engine>,
    region: Region,
    app: App,
    notes: Vec<Note>,
}

struct Group {
    ids: Vec<MemberId>,
    nodes: Vec<Node>,
    now: u64,
    fx: Effects,
    buf: Vec<u8>,
    sent: u64,
}

fn config(ids: &[MemberId], me: MemberId, incarnation: u64) -> Config {
    let mut cfg = Config::new(ids.to_vec(), me);
    assert!(cfg.log_gc, "log garbage collection is on by default");
    cfg.incarnation = incarnation;
    cfg.window = 8;
    cfg.max_payload = 32; // small chunks: the snapshot spans many ring slots
    cfg.max_outstanding = 16;
    cfg
}

impl Group {
    fn new(ids: &[MemberId]) -> Group {
        let nodes = ids.iter().map(|&id| Group::node(ids, id, 1, 0)).collect();
        Group { ids: ids.to_vec(), nodes, now: 0, fx: Effects::default(), buf: Vec::new(), sent: 0 }
    }

    fn node(ids: &[MemberId], id: MemberId, incarnation: u64, now: u64) -> Node {
        let cfg = config(ids, id, incarnation);
        let region = Region::new_heap(Layout::new(&cfg).region_len);
        let engine = Engine::new(cfg, region.clone(), now).expect("valid config");
        Node { engine: Some(engine), region, app: App::default(), notes: Vec::new() }
    }

    fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| n.engine.as_ref().is_some_and(|e| e.role() == Role::Leader))
    }

    /// One lockstep round; the leader first takes up to `load` messages.
    fn round(&mut self, load: &mut u64) {
        self.now += 10 * US;
        if let Some(l) = self.leader() {
            while *load > 0 {
                let payload = format!("message {:08}", self.sent);
                match self.nodes[l].engine.as_mut().expect("live").broadcast(payload.as_bytes()) {
                    Ok(_) => {
                        self.sent += 1;
                        *load -= 1;
                    }
                    Err(BroadcastError::WouldBlock) => break,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        for i in 0..self.nodes.len() {
            let node = &mut self.nodes[i];
            let Some(engine) = node.engine.as_mut() else { continue };
            self.fx.clear();
            engine.poll(self.now, &mut self.fx, &mut node.app);
            node.notes.append(&mut self.fx.notes);
            let src = node.region.clone();
            for push in &self.fx.pushes {
                self.buf.resize(push.len, 0);
                src.read_bytes(push.offset, &mut self.buf);
                for (j, other) in self.ids.iter().enumerate() {
                    let hit = match push.to {
                        Target::All => j != i,
                        Target::Peer(m) => *other == m,
                    };
                    if hit && self.nodes[j].engine.is_some() {
                        self.nodes[j].region.write_bytes(push.offset, &self.buf);
                    }
                }
            }
        }
    }

    fn run_until(&mut self, what: &str, mut load: u64, done: impl Fn(&Group) -> bool) {
        let deadline = self.now + 2_000_000 * US;
        while !done(self) || load > 0 {
            assert!(self.now < deadline, "stuck waiting for {what}: {}", self.describe());
            self.round(&mut load);
        }
    }

    fn describe(&self) -> String {
        self.nodes
            .iter()
            .filter_map(|n| n.engine.as_ref().map(Engine::describe))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn engine(&self, i: usize) -> &Engine {
        self.nodes[i].engine.as_ref().expect("live")
    }

    fn all_committed(&self, count: u64) -> bool {
        self.nodes.iter().all(|n| n.engine.is_none() || n.app.count >= count)
    }

    /// Delivered headers of node `i` (this incarnation), with positions.
    fn delivered(&self, i: usize) -> Vec<(u64, Header)> {
        let mut pos = 0;
        let mut out = Vec::new();
        for ev in &self.nodes[i].app.log {
            match ev {
                AppEvent::Delivered { header, .. } => {
                    out.push((pos, *header));
                    pos += 1;
                }
                AppEvent::Restored { count, .. } => pos = *count,
                AppEvent::BadSnapshot(what) => panic!("bad snapshot: {what}"),
            }
        }
        out
    }
}

#[test]
fn a_restarted_follower_behind_the_log_floor_catches_up_by_snapshot() {
    let ids: Vec<MemberId> = vec![0, 1, 2];
    let mut g = Group::new(&ids);
    g.run_until("a leader", 0, |g| g.leader().is_some());
    g.run_until("the first messages", 200, |g| g.all_committed(200));
    let leader = g.leader().expect("leader");
    let victim = (leader + 1) % 3;
    let victim_committed = g.engine(victim).committed();

    // The victim crashes; the others keep committing. Once it is suspected
    // its frozen Commit column no longer pins the log: GC passes it.
    g.nodes[victim].engine = None;
    g.run_until("GC past the crashed member", 3_000, |g| g.all_committed(3_200));
    let l = g.engine(leader);
    assert!(
        l.log_floor() > victim_committed,
        "the log floor {:?} did not pass the crashed member's commit {victim_committed:?}",
        l.log_floor()
    );
    assert!(l.log_len() <= 64, "the log holds {} entries with a member down", l.log_len());

    // The victim restarts with empty state (a new incarnation, a zeroed
    // region); the fabric reports the new incarnation to the others.
    g.nodes[victim] = Group::node(&ids, ids[victim], 2, g.now);
    for i in 0..3 {
        if i != victim {
            g.nodes[i].engine.as_mut().expect("live").on_link_reset(ids[victim]);
        }
    }
    g.run_until("the restarted member to sync", 0, |g| g.engine(victim).is_synced());
    let restored: Vec<_> = g.nodes[victim]
        .notes
        .iter()
        .filter_map(|n| match n {
            Note::Restored { header, bytes } => Some((*header, *bytes)),
            _ => None,
        })
        .collect();
    assert_eq!(restored.len(), 1, "one restore: {:?}", g.nodes[victim].notes);
    let (snap_header, snap_bytes) = restored[0];
    assert!(snap_header > victim_committed);
    assert!(snap_bytes > 2 * 32, "a snapshot of {snap_bytes} bytes spans several 32-byte chunks");
    assert!(
        g.nodes[leader]
            .notes
            .iter()
            .any(|n| matches!(n, Note::SnapshotSent { header, .. } if *header == snap_header)),
        "the leader sent the snapshot"
    );

    // New messages: every member delivers them in the same order, and the
    // restarted member's application state equals the others'.
    let total = g.sent + 500;
    g.run_until("new messages everywhere", 500, |g| g.all_committed(total));
    let reference = g.delivered(leader);
    let mine = g.delivered(victim);
    assert!(!mine.is_empty());
    assert!(mine.iter().all(|(p, _)| *p > 3_000), "the restarted member replayed old messages");
    for (p, h) in &mine {
        assert_eq!(reference[*p as usize], (*p, *h), "order differs at position {p}");
    }
    assert_eq!(mine.last(), reference.last());
    for i in 0..3 {
        assert_eq!(
            (g.nodes[i].app.count, g.nodes[i].app.hash),
            (g.nodes[leader].app.count, g.nodes[leader].app.hash)
        );
    }
    // Bounded memory again once everyone caught up.
    g.run_until("logs to shrink", 0, |g| (0..3).all(|i| g.engine(i).log_len() <= 32));
}
