//! Scenario tests of the Raft core: a few `Node`s driven in memory by a
//! tiny deterministic router. Every message goes through the wire codec.
//! After every pump the harness checks election safety (one leader per
//! term) and state machine safety (every node applies the same entry at
//! each index).

use ordo_raft::{
    Config, DecodeLimits, Entry, EntryKind, HardState, Index, Membership, MembershipChange, Message, Node,
    NodeId, ProposeError, Ready, Recovered, Role, Snapshot, StepError, Term, decode, decode_membership,
    encode,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The durable state of one node, as the caller would keep it.
#[derive(Default)]
struct Store {
    hard: HardState,
    snapshot: Option<Snapshot>,
    entries: Vec<Entry>,
}

struct Peer {
    node: Node,
    store: Store,
    /// The application state: committed Normal entries (index, data).
    app: Vec<(Index, Vec<u8>)>,
    /// When false, the harness persists but does not call `advance`.
    auto_advance: bool,
    /// (index, term) persisted but not yet reported.
    unreported: Option<(Index, Term)>,
    /// The membership it was first started with.
    initial: Membership,
}

struct Cluster {
    peers: BTreeMap<NodeId, Peer>,
    queue: VecDeque<Message>,
    /// Directed links that drop messages.
    cut: BTreeSet<(NodeId, NodeId)>,
    leaders: BTreeMap<Term, NodeId>,
    committed: BTreeMap<Index, (Term, Vec<u8>)>,
    limits: DecodeLimits,
    delivered: u64,
    snapshots_delivered: u64,
    /// Every message the nodes produced, when `recording`.
    sent: Vec<Message>,
    recording: bool,
    /// AppendReply rejections delivered, per sender.
    rejects: BTreeMap<NodeId, u64>,
    /// Random message loss and reordering: (PRNG state, loss percent).
    chaos: Option<(u64, u64)>,
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn config(id: NodeId) -> Config {
    let mut c = Config::new(id, 0x5EED ^ (id * 7919));
    c.election_ticks = 10;
    c.heartbeat_ticks = 2;
    c.max_entries_per_append = 8;
    c.max_inflight_appends = 4;
    c
}

fn encode_app(app: &[(Index, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, d) in app {
        out.extend_from_slice(&i.to_le_bytes());
        out.extend_from_slice(&(d.len() as u32).to_le_bytes());
        out.extend_from_slice(d);
    }
    out
}

fn decode_app(mut b: &[u8]) -> Vec<(Index, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let i = u64::from_le_bytes(b[..8].try_into().unwrap());
        let n = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
        out.push((i, b[12..12 + n].to_vec()));
        b = &b[12 + n..];
    }
    out
}

impl Cluster {
    fn new(n: u64) -> Cluster {
        Cluster::with(n, config)
    }

    fn with(n: u64, cfg: impl Fn(NodeId) -> Config) -> Cluster {
        let membership = Membership::with_voters(1..=n);
        let mut c = Cluster {
            peers: BTreeMap::new(),
            queue: VecDeque::new(),
            cut: BTreeSet::new(),
            leaders: BTreeMap::new(),
            committed: BTreeMap::new(),
            limits: DecodeLimits::default(),
            delivered: 0,
            snapshots_delivered: 0,
            rejects: BTreeMap::new(),
            sent: Vec::new(),
            recording: false,
            chaos: None,
        };
        for id in 1..=n {
            c.add_peer(id, cfg(id), membership.clone());
        }
        c
    }

    fn add_peer(&mut self, id: NodeId, cfg: Config, membership: Membership) {
        let node = Node::new(cfg, Recovered::default(), membership.clone()).unwrap();
        let peer = Peer {
            node,
            store: Store::default(),
            app: Vec::new(),
            auto_advance: true,
            unreported: None,
            initial: membership,
        };
        self.peers.insert(id, peer);
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.peers[&id].node
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.peers.get_mut(&id).unwrap().node
    }

    fn isolate(&mut self, id: NodeId) {
        for &other in self.peers.keys() {
            if other != id {
                self.cut.insert((id, other));
                self.cut.insert((other, id));
            }
        }
    }

    fn heal(&mut self) {
        self.cut.clear();
    }

    /// Handles every node's `Ready` (persist, advance, apply, send), then
    /// delivers queued messages, until nothing moves.
    fn pump(&mut self) {
        for _ in 0..10_000 {
            let mut busy = false;
            let ids: Vec<NodeId> = self.peers.keys().copied().collect();
            for id in ids {
                if self.process_ready(id) {
                    busy = true;
                }
            }
            while let Some(msg) = self.queue.pop_front() {
                busy = true;
                if self.cut.contains(&(msg.from(), msg.to())) {
                    continue;
                }
                if let Some((state, loss)) = self.chaos.as_mut() {
                    let r = xorshift(state);
                    if r % 100 < *loss {
                        continue;
                    }
                    if r.is_multiple_of(7) && !self.queue.is_empty() {
                        // Reorder: deliver it after the next one.
                        self.queue.insert(1, msg);
                        continue;
                    }
                }
                let Some(peer) = self.peers.get_mut(&msg.to()) else { continue };
                let mut bytes = Vec::new();
                encode(&msg, &mut bytes);
                let decoded = decode(&bytes, &self.limits).expect("node produced an invalid message");
                assert_eq!(decoded, msg);
                match decoded {
                    Message::InstallSnapshot { .. } => self.snapshots_delivered += 1,
                    Message::AppendReply { success: false, from, .. } => {
                        *self.rejects.entry(from).or_default() += 1;
                    }
                    _ => {}
                }
                peer.node.step(decoded).unwrap();
                self.delivered += 1;
            }
            if !busy {
                return;
            }
        }
        panic!("the cluster did not quiesce");
    }

    /// One network round: handles every node's `Ready`, then delivers the
    /// messages queued so far (not the answers they cause), so appends stay
    /// in flight while new entries arrive.
    fn step_round(&mut self) {
        let ids: Vec<NodeId> = self.peers.keys().copied().collect();
        for id in ids {
            self.process_ready(id);
        }
        for _ in 0..self.queue.len() {
            let Some(msg) = self.queue.pop_front() else { return };
            let Some(peer) = self.peers.get_mut(&msg.to()) else { continue };
            peer.node.step(msg).unwrap();
            self.delivered += 1;
        }
    }

    fn process_ready(&mut self, id: NodeId) -> bool {
        let peer = self.peers.get_mut(&id).unwrap();
        if !peer.node.has_ready() {
            return false;
        }
        let rd = peer.node.ready();
        assert!(!rd.is_empty());
        if let Some(ss) = rd.soft_state
            && ss.role == Role::Leader
        {
            let previous = self.leaders.insert(ss.term, id);
            assert!(previous.is_none() || previous == Some(id), "two leaders in term {}", ss.term);
            // Leader completeness: every committed entry is in its log.
            let first = peer.node.first_index();
            for (&index, (term, data)) in self.committed.range(first..) {
                let e = peer.node.entry(index).expect("new leader lacks a committed entry");
                assert_eq!((&e.term, &e.data[..]), (term, &data[..]), "new leader differs at {index}");
            }
            if let Some((&index, (term, _))) = self.committed.range(..first).next_back() {
                assert!(peer.node.term_at(first - 1).is_some() && index < first && *term <= ss.term);
            }
        }
        if let Some(snap) = &rd.snapshot {
            peer.store.snapshot = Some(snap.clone());
            peer.store.entries.clear();
            peer.app = decode_app(&snap.data);
        }
        let last = rd.entries.last().map(|e| (e.index, e.term));
        if peer.node.config().hand_out_entries {
            assert_eq!(rd.appended, last, "appended names the last entry handed out");
        } else {
            assert!(rd.entries.is_empty(), "no entries for a caller that keeps no log");
        }
        if let Some(first) = rd.entries.first() {
            peer.store.entries.retain(|e| e.index < first.index);
            if let Some(last) = peer.store.entries.last() {
                assert_eq!(last.index + 1, first.index, "durable log would have a gap");
            }
            peer.store.entries.extend(rd.entries.iter().cloned());
        }
        if let Some(hs) = rd.hard_state {
            assert!(hs.term >= peer.store.hard.term, "term went backwards");
            peer.store.hard = hs;
        }
        if let Some(point) = rd.persist_point() {
            if peer.auto_advance {
                peer.node.advance(point.0, point.1);
            } else {
                peer.unreported = Some(point);
            }
        }
        for e in &rd.committed {
            // State machine safety: one entry per index across the cluster.
            let seen = self.committed.entry(e.index).or_insert((e.term, e.data.to_vec()));
            assert_eq!(*seen, (e.term, e.data.to_vec()), "divergent commit at {}", e.index);
            if e.kind == EntryKind::Normal {
                if let Some((last, _)) = peer.app.last() {
                    assert!(*last < e.index, "applied out of order");
                }
                peer.app.push((e.index, e.data.to_vec()));
            }
        }
        if self.recording {
            self.sent.extend(rd.messages.iter().cloned());
        }
        self.queue.extend(rd.messages);
        true
    }

    /// Crash and restart `id` from its durable state.
    fn restart(&mut self, id: NodeId, cfg: Config) {
        let peer = self.peers.get_mut(&id).unwrap();
        let recovered = Recovered {
            hard_state: peer.store.hard,
            snapshot: peer.store.snapshot.clone(),
            entries: peer.store.entries.clone(),
        };
        peer.node = Node::new(cfg, recovered, peer.initial.clone()).unwrap();
        peer.app = peer.store.snapshot.as_ref().map(|s| decode_app(&s.data)).unwrap_or_default();
    }

    /// The application of `id` snapshots its state and compacts.
    fn compact(&mut self, id: NodeId) {
        let peer = self.peers.get_mut(&id).unwrap();
        let applied = peer.node.applied_index();
        let data = encode_app(&peer.app);
        if let Ok(meta) = peer.node.compact(applied, data.clone()) {
            peer.store.entries.retain(|e| e.index > meta.index);
            peer.store.snapshot = Some(Snapshot { meta, data });
        }
    }

    fn tick(&mut self, n: usize) {
        for _ in 0..n {
            for peer in self.peers.values_mut() {
                peer.node.tick();
            }
            self.pump();
        }
    }

    fn leader(&self) -> Option<NodeId> {
        let leaders: Vec<NodeId> =
            self.peers.iter().filter(|(_, p)| p.node.role() == Role::Leader).map(|(id, _)| *id).collect();
        // Several nodes may think they lead (in different terms); take the
        // one of the highest term.
        leaders.into_iter().max_by_key(|id| self.node(*id).term())
    }

    fn elect(&mut self) -> NodeId {
        for _ in 0..200 {
            self.tick(1);
            if let Some(l) = self.leader()
                && self.peers.values().all(|p| p.node.leader() == Some(l) || self.cut_off(p.node.id()))
            {
                return l;
            }
        }
        panic!("no leader elected");
    }

    fn cut_off(&self, id: NodeId) -> bool {
        self.cut.iter().any(|(a, _)| *a == id)
    }

    fn propose(&mut self, leader: NodeId, data: &[u8]) -> Index {
        let index = self.node_mut(leader).propose(data.to_vec()).unwrap();
        self.pump();
        index
    }

    /// Proposes every payload at `leader`, then runs until the group has
    /// applied them (a pump, and ticks for the commit index to reach every
    /// follower).
    fn replicate_all(&mut self, leader: NodeId, payloads: &[Vec<u8>]) {
        for p in payloads {
            self.node_mut(leader).propose(p.clone()).unwrap();
        }
        self.pump();
        self.tick(3);
    }

    /// Every member applied exactly `want` and knows the leader's last
    /// index as committed.
    fn assert_applied_everywhere(&self, leader: NodeId, want: &[Vec<u8>], context: &str) {
        for &id in self.peers.keys() {
            assert_eq!(self.app_data(id), want, "{context}: node {id}");
            assert_eq!(self.node(id).commit_index(), self.node(leader).last_index(), "{context}: node {id}");
        }
    }

    fn app_data(&self, id: NodeId) -> Vec<Vec<u8>> {
        self.peers[&id].app.iter().map(|(_, d)| d.clone()).collect()
    }
}

fn payloads(range: std::ops::Range<u32>) -> Vec<Vec<u8>> {
    range.map(|i| format!("cmd-{i}").into_bytes()).collect()
}

#[test]
fn elects_exactly_one_leader() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let term = c.node(leader).term();
    assert!(term >= 1);
    for id in 1..=3 {
        assert_eq!(c.node(id).leader(), Some(leader));
        assert_eq!(c.node(id).term(), term);
        assert_eq!(c.node(id).role() == Role::Leader, id == leader);
    }
    // The leader's Noop of its term is committed everywhere.
    let noop = c.node(leader).last_index();
    assert_eq!(c.node(leader).entry(noop).unwrap().kind, EntryKind::Noop);
    for id in 1..=3 {
        assert_eq!(c.node(id).commit_index(), noop, "node {id} leader {leader} {:?}", c.node(id).stats());
    }
    // Stays stable: no new elections while everybody is connected.
    c.tick(100);
    assert_eq!(c.leader(), Some(leader));
    assert_eq!(c.node(leader).term(), term);
}

#[test]
fn replicates_and_commits_in_order() {
    let mut c = Cluster::new(5);
    let leader = c.elect();
    let want = payloads(0..50);
    c.replicate_all(leader, &want);
    c.assert_applied_everywhere(leader, &want, "five members");
    // Batching: far fewer AppendEntries than entries x followers.
    let follower = (1..=5).find(|&i| i != leader).unwrap();
    assert_eq!(c.peers[&follower].store.entries.len() as u64, c.node(leader).last_index());
}

/// Followers at the same next index get one slice of the leader's log
/// between them, not a copy each.
#[test]
fn followers_at_the_same_index_share_the_entries_of_their_appends() {
    let mut c = Cluster::new(5);
    let leader = c.elect();
    c.pump();
    for p in payloads(0..3) {
        c.node_mut(leader).propose(p).unwrap();
    }
    let rd = c.node_mut(leader).ready();
    let appends: Vec<&[Entry]> = rd
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::AppendEntries { entries, .. } if !entries.is_empty() => Some(&entries[..]),
            _ => None,
        })
        .collect();
    assert_eq!(appends.len(), 4, "one append per follower");
    assert!(appends.iter().all(|e| e.len() == 3 && e.as_ptr() == appends[0].as_ptr()), "one slice");
}

/// A leader whose followers answer a batch's append hands out that
/// append's entries as `Ready::committed`: the same vector, not a second
/// clone of each entry from the log. Two appends answered together commit
/// as one range that neither holds: that one comes from the log.
#[test]
fn a_leader_hands_out_its_followers_append_as_committed() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    c.pump();
    // The leader's side of a turn by hand: its `Ready`, made durable at
    // once, its messages queued.
    let leader_turn = |c: &mut Cluster| -> Ready {
        let rd = c.node_mut(leader).ready();
        if let Some((index, term)) = rd.persist_point() {
            c.node_mut(leader).advance(index, term);
        }
        c.queue.extend(rd.messages.iter().cloned());
        rd
    };
    let append_of = |rd: &Ready| -> *const Entry {
        let sent = rd.messages.iter().filter_map(|m| match m {
            Message::AppendEntries { entries, .. } if !entries.is_empty() => Some(entries.as_ptr()),
            _ => None,
        });
        let sent: Vec<*const Entry> = sent.collect();
        assert_eq!(sent.len(), 2, "one append per follower");
        assert_eq!(sent[0], sent[1], "one slice for both");
        sent[0]
    };
    let shared = |c: &Cluster| c.node(leader).stats().committed_shared;
    let before = shared(&c);
    let want = payloads(0..4);
    for p in &want {
        c.node_mut(leader).propose(p.clone()).unwrap();
    }
    let sent = append_of(&leader_turn(&mut c));
    // The appends reach the followers, their answers the leader.
    c.step_round();
    c.step_round();
    let rd = leader_turn(&mut c);
    assert_eq!(rd.committed.as_ptr(), sent, "the append's own entries");
    let data: Vec<&[u8]> = rd.committed.iter().map(|e| &e.data[..]).collect();
    assert_eq!(data, want.iter().map(|p| &p[..]).collect::<Vec<_>>());
    assert_eq!(shared(&c), before + 1);
    // Two appends in flight, answered before the leader's next turn.
    let more = payloads(4..8);
    for batch in more.chunks(2) {
        for p in batch {
            c.node_mut(leader).propose(p.clone()).unwrap();
        }
        append_of(&leader_turn(&mut c));
    }
    c.step_round();
    c.step_round();
    let rd = leader_turn(&mut c);
    let data: Vec<&[u8]> = rd.committed.iter().map(|e| &e.data[..]).collect();
    assert_eq!(data, more.iter().map(|p| &p[..]).collect::<Vec<_>>(), "both batches, from the log");
    assert_eq!(shared(&c), before + 1, "neither append holds the range");
    // Pipelined (the steady state under load): a turn's proposals go out
    // while the previous turn's append commits.
    let mut previous = None;
    for turn in 0..4u32 {
        for p in payloads(100 + 3 * turn..103 + 3 * turn) {
            c.node_mut(leader).propose(p).unwrap();
        }
        let rd = leader_turn(&mut c);
        if let Some(sent) = previous {
            assert_eq!(rd.committed.as_ptr(), sent, "turn {turn} commits the previous turn's append");
            assert_eq!(rd.committed.len(), 3);
        }
        previous = Some(append_of(&rd));
        c.step_round();
        c.step_round();
    }
    assert_eq!(shared(&c), before + 4);
}

/// A caller that keeps no log of its own (`hand_out_entries` off) gets no
/// entries in its `Ready`s but the same persistence points, so the group
/// commits and applies as one whose members store every entry.
#[test]
fn nodes_that_hand_out_no_entries_commit_by_their_persist_points() {
    for hand_out in [true, false] {
        let mut c = Cluster::with(3, |id| Config { hand_out_entries: hand_out, ..config(id) });
        let leader = c.elect();
        let want = payloads(0..40);
        c.replicate_all(leader, &want);
        c.assert_applied_everywhere(leader, &want, &format!("hand_out_entries {hand_out}"));
        for id in 1..=3 {
            let stored = c.peers[&id].store.entries.len() as u64;
            assert_eq!(stored, if hand_out { c.node(leader).last_index() } else { 0 });
        }
    }
}

/// Regression (found by `ordo bench r3p2`): under a steady stream of
/// proposals a follower always lags by the appends in flight, and every
/// answer to an empty (commit-carrying) append used to trigger another
/// empty append — a message storm that pushed commit latency to tens of
/// milliseconds. Messages per committed entry must stay small.
#[test]
fn pipelined_load_sends_a_bounded_number_of_messages_per_entry() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    c.pump();
    let before = c.delivered;
    let entries = 600u32;
    for p in payloads(0..entries) {
        c.node_mut(leader).propose(p).unwrap();
        c.step_round();
    }
    c.pump();
    let messages = c.delivered - before;
    for id in 1..=3 {
        assert_eq!(c.node(id).commit_index(), c.node(leader).last_index());
    }
    // Per entry and follower: an append, its answer, and a commit-carrying
    // append with its answer, plus a little slack (the storm was ~600 per
    // entry and follower).
    assert!(
        messages <= u64::from(entries) * 2 * 5,
        "{messages} messages for {entries} entries on 2 followers"
    );
}

/// A batch of proposals made between two `ready`s (one server loop turn)
/// leaves in as few AppendEntries per follower as the batch limit allows,
/// not one per proposal (issue 12: the leader's datagrams per request).
#[test]
fn proposals_between_two_readies_leave_in_batched_appends() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    c.pump();
    let first = c.node(leader).last_index() + 1;
    for p in payloads(0..10) {
        let index = c.node_mut(leader).propose(p).unwrap();
        assert!(index >= first);
    }
    let rd = c.node_mut(leader).ready();
    let appends: Vec<(NodeId, Vec<Index>)> = rd
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::AppendEntries { to, entries, .. } => {
                Some((*to, entries.iter().map(|e| e.index).collect()))
            }
            _ => None,
        })
        .collect();
    // Ten entries, at most `max_entries_per_append` (8) an append: two
    // appends per follower (before: one per proposal, ten).
    let all: Vec<Index> = (first..first + 10).collect();
    for f in (1..=3).filter(|&i| i != leader) {
        let to_f: Vec<&Vec<Index>> = appends.iter().filter(|(to, _)| *to == f).map(|(_, e)| e).collect();
        assert_eq!(to_f.len(), 2, "{appends:?}");
        assert_eq!(to_f.into_iter().flatten().copied().collect::<Vec<_>>(), all);
    }
    assert_eq!(rd.entries.len(), 10, "the entries are handed out for persistence with them");
}

/// Under steady load (a proposal every round) the moving commit index rides
/// on the next round's appends: the leader sends (almost) no empty
/// AppendEntries to announce it (before: one per follower per answer that
/// moved it, each answered again).
#[test]
fn a_moving_commit_index_rides_on_the_next_appends() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    c.pump();
    c.recording = true;
    let rounds = 100u32;
    for p in payloads(0..rounds) {
        c.node_mut(leader).propose(p).unwrap();
        c.step_round();
    }
    let (with_entries, empty) = appends_from(&c.sent, leader);
    assert!(with_entries >= 2 * rounds as usize - 4, "{with_entries} appends with entries");
    assert!(empty <= 4, "{empty} empty appends announced a commit index under load");
    c.pump();
    for id in 1..=3 {
        assert_eq!(c.node(id).commit_index(), c.node(leader).last_index(), "node {id} learns the commit");
    }
}

/// Appends from `leader` in `sent`: (with entries, empty).
fn appends_from(sent: &[Message], leader: NodeId) -> (usize, usize) {
    let (mut with_entries, mut empty) = (0, 0);
    for m in sent {
        if let Message::AppendEntries { from, entries, .. } = m
            && *from == leader
        {
            if entries.is_empty() { empty += 1 } else { with_entries += 1 }
        }
    }
    (with_entries, empty)
}

/// One request at light load, announcing a moved commit index
/// (`announce_commit`, etcd's way) and not: announced, every follower gets
/// the entry, then an empty append with the commit index (answered
/// again); not announced, only the entry, and the followers learn the
/// commit index with the next heartbeat.
#[test]
fn without_commit_announcements_a_lone_request_costs_one_append_per_follower() {
    for announce in [true, false] {
        let mut c = Cluster::with(3, |id| Config { announce_commit: announce, ..config(id) });
        let leader = c.elect();
        c.pump();
        c.recording = true;
        let index = c.node_mut(leader).propose(b"lone".to_vec()).unwrap();
        c.pump();
        assert_eq!(c.node(leader).commit_index(), index, "the leader commits without heartbeats");
        let (with_entries, empty) = appends_from(&c.sent, leader);
        assert_eq!(with_entries, 2, "announce {announce}: one append with the entry per follower");
        let followers: Vec<NodeId> = (1..=3).filter(|&i| i != leader).collect();
        if announce {
            assert_eq!(empty, 2, "announced: an empty append per follower");
            assert!(followers.iter().all(|&f| c.node(f).commit_index() == index));
        } else {
            assert_eq!(empty, 0, "not announced: no empty append");
            assert!(followers.iter().all(|&f| c.node(f).commit_index() < index), "told nothing yet");
            let heartbeat = c.node(leader).config().heartbeat_ticks as usize;
            c.tick(heartbeat);
            for f in followers {
                assert_eq!(c.node(f).commit_index(), index, "follower {f} learns it from the heartbeat");
            }
        }
    }
}

/// Without announcements, an answer that moves the commit index still
/// sends the follower what it lacks: with one append in flight and one
/// entry per append, a burst of proposals commits with no tick at all.
#[test]
fn without_commit_announcements_a_narrow_window_still_drains() {
    let mut c = Cluster::with(3, |id| Config {
        announce_commit: false,
        max_inflight_appends: 1,
        max_entries_per_append: 1,
        ..config(id)
    });
    let leader = c.elect();
    c.pump();
    let mut last = 0;
    for p in payloads(0..20) {
        last = c.node_mut(leader).propose(p).unwrap();
    }
    c.pump();
    assert_eq!(c.node(leader).commit_index(), last, "every proposal commits without ticks");
    for f in (1..=3).filter(|&i| i != leader) {
        assert_eq!(c.node(f).last_index(), last, "follower {f} holds every entry");
        // Told with each next append: all but the last commit.
        assert!(c.node(f).commit_index() >= last - 1, "follower {f} lags by at most one entry");
    }
}

#[test]
fn non_leader_refuses_proposals_with_a_hint() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    assert_eq!(
        c.node_mut(follower).propose(b"x".to_vec()),
        Err(ProposeError::NotLeader { leader: Some(leader) })
    );
    let too_big = vec![0u8; c.node(leader).config().max_entry_bytes as usize + 1];
    assert!(matches!(c.node_mut(leader).propose(too_big), Err(ProposeError::TooLarge { .. })));
}

#[test]
fn proposals_are_bounded_by_max_uncommitted() {
    let mut c = Cluster::with(3, |id| {
        let mut cfg = config(id);
        cfg.max_uncommitted_entries = 5;
        cfg
    });
    let leader = c.elect();
    c.isolate(leader);
    let mut accepted = 0;
    while c.node_mut(leader).propose(b"p".to_vec()).is_ok() {
        accepted += 1;
        assert!(accepted <= 5);
    }
    assert_eq!(accepted, 5);
    assert_eq!(c.node_mut(leader).propose(b"p".to_vec()), Err(ProposeError::Busy));
}

#[test]
fn reelects_after_leader_isolation_and_old_leader_rejoins() {
    let mut c = Cluster::new(3);
    let old = c.elect();
    let old_term = c.node(old).term();
    c.propose(old, b"before");
    c.isolate(old);
    let mut new = None;
    for _ in 0..100 {
        c.tick(1);
        if let Some(l) = c.leader()
            && l != old
        {
            new = Some(l);
            break;
        }
    }
    let new = new.expect("the majority elects a new leader");
    assert!(c.node(new).term() > old_term);
    c.propose(new, b"after");
    let other = (1..=3).find(|&i| i != old && i != new).unwrap();
    assert_eq!(c.app_data(other), vec![b"before".to_vec(), b"after".to_vec()]);
    // The isolated old leader committed nothing new.
    assert_eq!(c.app_data(old), vec![b"before".to_vec()]);
    c.heal();
    c.tick(20);
    assert_eq!(c.node(old).role(), Role::Follower);
    assert_eq!(c.node(old).leader(), Some(new));
    assert_eq!(c.app_data(old), vec![b"before".to_vec(), b"after".to_vec()]);
}

#[test]
fn pre_vote_keeps_a_partitioned_node_from_inflating_its_term() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let term = c.node(leader).term();
    let victim = (1..=3).find(|&i| i != leader).unwrap();
    c.isolate(victim);
    c.tick(200);
    assert_eq!(c.node(victim).term(), term, "pre-vote must not raise the term");
    assert_eq!(c.node(victim).role(), Role::PreCandidate);
    c.heal();
    c.tick(20);
    assert_eq!(c.leader(), Some(leader), "the rejoining node must not disrupt the leader");
    assert_eq!(c.node(leader).term(), term);
    assert_eq!(c.node(victim).leader(), Some(leader));
}

#[test]
fn without_pre_vote_the_rejoining_node_forces_a_new_term() {
    // The control experiment for the test above.
    let mut c = Cluster::with(3, |id| {
        let mut cfg = config(id);
        cfg.pre_vote = false;
        cfg
    });
    let leader = c.elect();
    let term = c.node(leader).term();
    let victim = (1..=3).find(|&i| i != leader).unwrap();
    c.isolate(victim);
    c.tick(200);
    assert!(c.node(victim).term() > term + 3);
    c.heal();
    let new_leader = c.elect();
    assert!(c.node(new_leader).term() > term);
}

#[test]
fn leader_stickiness_ignores_vote_requests() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let term = c.node(leader).term();
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let intruder = (1..=3).find(|&i| i != leader && i != follower).unwrap();
    let last = c.node(follower).last_index();
    let before = c.node(follower).stats().ignored_in_lease;
    c.node_mut(follower)
        .step(Message::RequestVote {
            term: term + 5,
            from: intruder,
            to: follower,
            last_log_index: last + 10,
            last_log_term: term,
            transfer: false,
        })
        .unwrap();
    assert_eq!(c.node(follower).term(), term);
    assert_eq!(c.node(follower).stats().ignored_in_lease, before + 1);
}

#[test]
fn check_quorum_makes_an_isolated_leader_step_down() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    c.isolate(leader);
    c.tick(25);
    assert_ne!(c.node(leader).role(), Role::Leader);
    assert!(matches!(c.node_mut(leader).propose(b"x".to_vec()), Err(ProposeError::NotLeader { .. })));
}

#[test]
fn divergent_uncommitted_suffix_is_overwritten() {
    let mut c = Cluster::new(3);
    let old = c.elect();
    c.propose(old, b"committed");
    let base = c.node(old).last_index();
    c.isolate(old);
    // Accepted by the isolated leader, never replicated.
    for p in payloads(0..5) {
        c.node_mut(old).propose(p).unwrap();
    }
    c.pump();
    let stale_term = c.node(old).term();
    assert_eq!(c.node(old).last_index(), base + 5);
    let mut new = None;
    for _ in 0..100 {
        c.tick(1);
        if let Some(l) = c.leader()
            && l != old
        {
            new = Some(l);
            break;
        }
    }
    let new = new.unwrap();
    c.propose(new, b"winner");
    c.heal();
    c.tick(30);
    // The old leader's uncommitted suffix was replaced by the new term's.
    for i in base + 1..=c.node(new).last_index() {
        assert_eq!(c.node(old).term_at(i), c.node(new).term_at(i), "index {i}");
        assert_ne!(c.node(old).term_at(i), Some(stale_term));
    }
    assert_eq!(c.node(old).last_index(), c.node(new).last_index());
    assert_eq!(c.app_data(old), vec![b"committed".to_vec(), b"winner".to_vec()]);
    // The durable log was truncated the same way.
    let durable = &c.peers[&old].store.entries;
    assert_eq!(durable.len() as u64, c.node(new).last_index());
    assert!(durable.iter().filter(|e| e.index > base).all(|e| e.term > stale_term));
}

#[test]
fn lagging_follower_catches_up_through_install_snapshot() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let lagger = (1..=3).find(|&i| i != leader).unwrap();
    c.isolate(lagger);
    for p in payloads(0..30) {
        c.propose(leader, &p);
    }
    let applied = c.node(leader).applied_index();
    let data = encode_app(&c.peers[&leader].app);
    let meta = c.node_mut(leader).compact(applied, data).unwrap();
    assert_eq!(meta.index, applied);
    assert_eq!(meta.membership, Membership::with_voters(1..=3));
    assert_eq!(c.node(leader).first_index(), applied + 1);
    assert!(c.node_mut(leader).compact(applied, Vec::new()).is_err());
    c.propose(leader, b"after-snapshot");
    c.heal();
    c.tick(30);
    let snap = c.peers[&lagger].store.snapshot.as_ref().expect("the lagger received a snapshot");
    assert_eq!(snap.meta.index, applied);
    let mut want = payloads(0..30);
    want.push(b"after-snapshot".to_vec());
    assert_eq!(c.app_data(lagger), want);
    assert_eq!(c.node(lagger).commit_index(), c.node(leader).commit_index());
    assert_eq!(c.node(lagger).first_index(), applied + 1);
}

#[test]
fn learner_is_added_caught_up_promoted_and_a_server_removed() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    for p in payloads(0..20) {
        c.propose(leader, &p);
    }
    // Node 4 starts empty: it learns the membership from the leader.
    c.add_peer(4, config(4), Membership::default());
    c.cut.insert((leader, 4));
    c.node_mut(leader).propose_membership(MembershipChange::AddLearner(4)).unwrap();
    assert!(c.node(leader).membership().learners.contains(&4));
    assert_eq!(
        c.node_mut(leader).propose_membership(MembershipChange::RemoveServer(4)),
        Err(ProposeError::ChangePending)
    );
    c.pump();
    c.tick(3);
    assert!(!c.node(leader).membership_change_pending());
    // Not caught up while cut off.
    assert!(matches!(
        c.node_mut(leader).propose_membership(MembershipChange::PromoteLearner(4)),
        Err(ProposeError::NotCaughtUp { id: 4, .. })
    ));
    c.heal();
    c.tick(10);
    assert_eq!(c.app_data(4), payloads(0..20));
    assert!(c.node(4).membership().learners.contains(&4));
    c.node_mut(leader).propose_membership(MembershipChange::PromoteLearner(4)).unwrap();
    c.pump();
    c.tick(3);
    for id in 1..=4 {
        assert_eq!(c.node(id).membership().voters, BTreeSet::from([1, 2, 3, 4]), "node {id}");
    }
    let victim = (1..=3).find(|&i| i != leader).unwrap();
    c.node_mut(leader).propose_membership(MembershipChange::RemoveServer(victim)).unwrap();
    c.pump();
    c.tick(3);
    let expected: BTreeSet<NodeId> = (1..=4).filter(|&i| i != victim).collect();
    assert_eq!(c.node(leader).membership().voters, expected);
    // The remaining three commit without the removed one.
    c.isolate(victim);
    c.propose(leader, b"three-voters");
    assert_eq!(c.app_data(4).last().unwrap(), b"three-voters");
    // Invalid changes.
    assert!(matches!(
        c.node_mut(leader).propose_membership(MembershipChange::PromoteLearner(99)),
        Err(ProposeError::InvalidChange(_))
    ));
    assert!(matches!(
        c.node_mut(leader).propose_membership(MembershipChange::AddLearner(4)),
        Err(ProposeError::InvalidChange(_))
    ));
}

#[test]
fn leader_that_removes_itself_steps_down_after_commit() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let index = c.node_mut(leader).propose_membership(MembershipChange::RemoveServer(leader)).unwrap();
    // In effect at once: the leader no longer counts itself.
    assert!(!c.node(leader).membership().voters.contains(&leader));
    assert_eq!(c.node(leader).role(), Role::Leader);
    c.pump();
    assert!(c.node(leader).commit_index() >= index);
    assert_ne!(c.node(leader).role(), Role::Leader);
    // The others elect a leader among themselves (TimeoutNow makes it quick).
    let mut new = None;
    for _ in 0..100 {
        c.tick(1);
        if let Some(l) = c.leader()
            && l != leader
        {
            new = Some(l);
            break;
        }
    }
    let new = new.expect("a remaining voter leads");
    c.tick(50);
    assert_eq!(c.leader(), Some(new));
    assert_ne!(c.node(leader).role(), Role::Leader);
    assert_ne!(c.node(leader).role(), Role::Candidate);
    c.propose(new, b"two-voters");
    let others: Vec<NodeId> = (1..=3).filter(|&i| i != leader).collect();
    for id in others {
        assert_eq!(c.app_data(id), vec![b"two-voters".to_vec()]);
    }
}

#[test]
fn leader_counts_its_own_entry_only_once_durable() {
    // Single voter: the leader's own durability is the whole quorum.
    let mut c = Cluster::new(1);
    let leader = c.elect();
    c.peers.get_mut(&leader).unwrap().auto_advance = false;
    let index = c.propose(leader, b"x");
    assert_eq!(c.node(leader).commit_index(), index - 1);
    assert!(c.app_data(leader).is_empty());
    let (i, t) = c.peers[&leader].unreported.unwrap();
    // A stale report (wrong term) is ignored.
    c.node_mut(leader).advance(i, t + 1);
    assert_eq!(c.node(leader).commit_index(), index - 1);
    c.node_mut(leader).advance(i, t);
    c.pump();
    assert_eq!(c.node(leader).commit_index(), index);
    assert_eq!(c.app_data(leader), vec![b"x".to_vec()]);

    // Three voters, one down: the remaining follower's ack alone is not a
    // quorum while the leader's copy is volatile.
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let down = (1..=3).find(|&i| i != leader).unwrap();
    c.isolate(down);
    c.peers.get_mut(&leader).unwrap().auto_advance = false;
    let index = c.propose(leader, b"y");
    c.tick(5);
    let follower = (1..=3).find(|&i| i != leader && i != down).unwrap();
    assert_eq!(c.node(leader).match_index(follower), Some(index));
    assert!(c.node(leader).commit_index() < index);
    let (i, t) = c.peers[&leader].unreported.unwrap();
    c.node_mut(leader).advance(i, t);
    c.pump();
    assert_eq!(c.node(leader).commit_index(), index);
}

#[test]
fn restart_from_durable_state_preserves_term_vote_and_log() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    for p in payloads(0..5) {
        c.propose(leader, &p);
    }
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let store = &c.peers[&follower].store;
    let recovered = Recovered {
        hard_state: store.hard,
        snapshot: store.snapshot.clone(),
        entries: store.entries.clone(),
    };
    let node = Node::new(config(follower), recovered, Membership::with_voters(1..=3)).unwrap();
    assert_eq!(node.term(), c.node(follower).term());
    assert_eq!(node.vote(), c.node(follower).vote());
    assert_eq!(node.last_index(), c.node(follower).last_index());
    assert_eq!(node.role(), Role::Follower);
    // A corrupt recovered log is refused.
    let mut entries = c.peers[&follower].store.entries.clone();
    entries.remove(1);
    let bad = Recovered { hard_state: store.hard, snapshot: None, entries };
    assert!(Node::new(config(follower), bad, Membership::with_voters(1..=3)).is_err());
}

#[test]
fn leadership_transfer_hands_over_to_a_caught_up_voter() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let target = (1..=3).find(|&i| i != leader).unwrap();
    c.propose(leader, b"x");
    c.node_mut(leader).transfer_leadership(target).unwrap();
    c.pump();
    assert_eq!(c.leader(), Some(target));
    assert_eq!(c.node(leader).leader(), Some(target));
}

#[test]
fn malformed_and_misaddressed_messages_are_rejected_without_effect() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let term = c.node(follower).term();
    let last = c.node(follower).last_index();
    let before = (c.node(follower).term(), c.node(follower).last_index(), c.node(follower).commit_index());
    // Entries not contiguous.
    let bad = Message::AppendEntries {
        term,
        from: leader,
        to: follower,
        prev_index: last,
        prev_term: term,
        entries: vec![Entry { term, index: last + 2, kind: EntryKind::Normal, data: vec![].into() }].into(),
        leader_commit: last + 2,
    };
    assert!(matches!(c.node_mut(follower).step(bad.clone()), Err(StepError::Invalid(_))));
    // The wire cannot even say it (an append's indexes are implicit): the
    // encoder refuses to write it.
    assert!(std::panic::catch_unwind(|| encode(&bad, &mut Vec::new())).is_err());
    // Entry term above the message term; membership data garbage.
    for entry in [
        Entry { term: term + 1, index: last + 1, kind: EntryKind::Normal, data: vec![].into() },
        Entry { term, index: last + 1, kind: EntryKind::Membership, data: vec![1, 2, 3].into() },
    ] {
        let bad = Message::AppendEntries {
            term,
            from: leader,
            to: follower,
            prev_index: last,
            prev_term: term,
            entries: vec![entry].into(),
            leader_commit: 0,
        };
        assert!(matches!(c.node_mut(follower).step(bad), Err(StepError::Invalid(_))));
    }
    // Misaddressed.
    let wrong = Message::TimeoutNow { term, from: leader, to: 77 };
    assert!(matches!(c.node_mut(follower).step(wrong), Err(StepError::WrongRecipient { .. })));
    // Out-of-range indexes from a peer are ignored, not trusted.
    c.node_mut(leader)
        .step(Message::AppendReply {
            term,
            from: follower,
            to: leader,
            success: true,
            index: u64::MAX,
            hint_index: 0,
            hint_term: 0,
        })
        .unwrap();
    assert!(c.node(leader).match_index(follower).unwrap() <= c.node(leader).last_index());
    c.node_mut(leader)
        .step(Message::AppendReply {
            term,
            from: follower,
            to: leader,
            success: false,
            index: last,
            hint_index: 0,
            hint_term: 0,
        })
        .unwrap();
    c.pump();
    assert_eq!(
        (c.node(follower).term(), c.node(follower).last_index(), c.node(follower).commit_index()),
        before
    );
    assert_eq!(c.node(follower).stats().invalid, 3);
    // Still a healthy cluster.
    c.propose(leader, b"ok");
    assert_eq!(c.app_data(follower), vec![b"ok".to_vec()]);
}

#[test]
fn membership_entries_carry_decodable_configurations() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    c.add_peer(4, config(4), Membership::default());
    let index = c.node_mut(leader).propose_membership(MembershipChange::AddLearner(4)).unwrap();
    c.pump();
    let entry = c.node(leader).entry(index).unwrap().clone();
    assert_eq!(entry.kind, EntryKind::Membership);
    let m = decode_membership(&entry.data, &DecodeLimits::default()).unwrap();
    assert_eq!(m.voters, BTreeSet::from([1, 2, 3]));
    assert_eq!(m.learners, BTreeSet::from([4]));
}

#[test]
fn config_validation_rejects_bad_values() {
    let mut cfg = config(1);
    assert!(cfg.validate().is_ok());
    cfg.heartbeat_ticks = cfg.election_ticks;
    assert!(cfg.validate().is_err());
    let mut cfg = config(0);
    cfg.id = 0;
    assert!(Node::new(cfg, Recovered::default(), Membership::default()).is_err());
    let mut cfg = config(1);
    cfg.max_inflight_appends = 0;
    assert!(cfg.validate().is_err());
}

#[test]
fn lossy_network_still_converges() {
    // Drop every third delivery for a while; the cluster must still commit
    // everything once the network is reliable again.
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let mut dropped = 0u64;
    for round in 0..40u32 {
        c.node_mut(leader).propose(format!("p{round}").into_bytes()).ok();
        for id in 1..=3 {
            c.process_ready(id);
        }
        let msgs: Vec<Message> = c.queue.drain(..).collect();
        for (k, m) in msgs.into_iter().enumerate() {
            if k % 3 == 0 {
                dropped += 1;
                continue;
            }
            c.queue.push_back(m);
        }
        c.pump();
        for p in c.peers.values_mut() {
            p.node.tick();
        }
    }
    assert!(dropped > 0);
    c.tick(40);
    let l = c.leader().unwrap();
    let want = c.app_data(l);
    assert!(!want.is_empty());
    for id in 1..=3 {
        assert_eq!(c.app_data(id), want);
        assert_eq!(c.node(id).commit_index(), c.node(l).commit_index());
    }
}

#[test]
fn randomized_faults_preserve_safety_and_converge() {
    // Loss, reordering, partitions, crashes with restart from the durable
    // state, and compaction, over many seeds. The harness checks election
    // safety, leader completeness and state machine safety throughout; at
    // the end the healed cluster must agree on everything.
    // RAFT_CHAOS_SEEDS=N runs more seeds (the default keeps the test fast).
    let seeds: u64 = std::env::var("RAFT_CHAOS_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let (mut restarts, mut snapshots_installed, mut commits) = (0u64, 0u64, 0u64);
    let mut membership_changes = 0u64;
    for seed in 1..=seeds {
        let cfg = move |id: NodeId| {
            let mut c = config(id);
            c.seed = seed * 1000 + id;
            c.max_entries_per_append = 3;
            c.max_inflight_appends = 2;
            c
        };
        let n = if seed % 2 == 0 { 5 } else { 3 };
        let mut c = Cluster::with(n, cfg);
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let loss = std::env::var("RAFT_CHAOS_LOSS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
        c.chaos = Some((rng, loss));
        let mut proposed = 0u32;
        let mut next_id = n + 1;
        for _ in 0..400 {
            let peers = next_id - 1;
            let r = xorshift(&mut rng);
            if let Some(l) = c.leader()
                && r.is_multiple_of(3)
                && c.node_mut(l).propose(format!("s{seed}-{proposed}").into_bytes()).is_ok()
            {
                proposed += 1;
            }
            match r % 97 {
                0 => c.isolate(1 + xorshift(&mut rng) % peers),
                1..=3 => c.heal(),
                4 => {
                    let id = 1 + xorshift(&mut rng) % peers;
                    c.restart(id, cfg(id));
                    restarts += 1;
                }
                5 | 6 => c.compact(1 + xorshift(&mut rng) % peers),
                7 | 8 => {
                    // One-server membership changes: add a fresh learner,
                    // promote it, remove a random voter.
                    if let Some(l) = c.leader() {
                        let m = c.node(l).membership().clone();
                        let change = if let Some(&learner) = m.learners.iter().next() {
                            MembershipChange::PromoteLearner(learner)
                        } else if m.voters.len() > 3 {
                            let k = xorshift(&mut rng) as usize % m.voters.len();
                            MembershipChange::RemoveServer(*m.voters.iter().nth(k).unwrap())
                        } else {
                            c.add_peer(next_id, cfg(next_id), Membership::default());
                            next_id += 1;
                            MembershipChange::AddLearner(next_id - 1)
                        };
                        if c.node_mut(l).propose_membership(change).is_ok() {
                            membership_changes += 1;
                        }
                    }
                }
                _ => {}
            }
            c.tick(1);
        }
        c.heal();
        c.chaos = None;
        c.tick(60);
        let l = c.leader().unwrap_or_else(|| panic!("seed {seed}: no leader after healing"));
        c.propose(l, b"final");
        c.tick(5);
        let want = c.app_data(l);
        assert_eq!(want.last().map(|v| v.as_slice()), Some(&b"final"[..]), "seed {seed}");
        let m = c.node(l).membership().clone();
        for id in m.voters.iter().chain(m.learners.iter()).copied() {
            assert_eq!(c.app_data(id), want, "seed {seed} node {id}");
            assert_eq!(c.node(id).commit_index(), c.node(l).commit_index(), "seed {seed} node {id}");
            assert_eq!(c.node(id).leader(), Some(l), "seed {seed} node {id}");
        }
        assert!(proposed > 0);
        commits += want.len() as u64;
        snapshots_installed += c.snapshots_delivered;
    }
    // The faults were real.
    assert!(restarts > seeds / 2, "restarts {restarts}");
    assert!(snapshots_installed > 0);
    assert!(commits > seeds * 20, "commits {commits}");
    assert!(membership_changes > 0);
    eprintln!(
        "chaos: {seeds} seeds, {restarts} restarts, {snapshots_installed} snapshots, {commits} commits, \
         {membership_changes} membership changes"
    );
}

#[test]
fn fast_backtracking_repairs_a_long_divergent_log_in_few_round_trips() {
    let mut c = Cluster::new(3);
    let old = c.elect();
    c.isolate(old);
    for p in payloads(0..60) {
        c.node_mut(old).propose(p).unwrap();
    }
    c.pump();
    let mut new = None;
    for _ in 0..100 {
        c.tick(1);
        if let Some(l) = c.leader()
            && l != old
        {
            new = Some(l);
            break;
        }
    }
    let new = new.unwrap();
    for p in payloads(100..140) {
        c.node_mut(new).propose(p).unwrap();
    }
    c.pump();
    c.rejects.clear();
    c.heal();
    c.tick(10);
    assert_eq!(c.node(old).last_index(), c.node(new).last_index());
    assert_eq!(c.app_data(old), payloads(100..140));
    // One entry-by-entry walk back would need ~20 rejections; the hint
    // needs one or two.
    let rejects = c.rejects.get(&old).copied().unwrap_or(0);
    assert!(rejects <= 3, "{rejects} rejections");
}

#[test]
fn pipelining_keeps_at_most_max_inflight_appends_per_follower_and_batches_the_backlog() {
    let mut c = Cluster::new(3);
    let leader = c.elect();
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let cfg = c.node(leader).config().clone();
    let appends_to = |c: &Cluster| -> Vec<usize> {
        c.sent
            .iter()
            .filter_map(|m| match m {
                Message::AppendEntries { to, entries, .. } if *to == follower && !entries.is_empty() => {
                    Some(entries.len())
                }
                _ => None,
            })
            .collect()
    };
    // Everything to the follower is lost: the window caps what is sent.
    c.cut.insert((leader, follower));
    c.recording = true;
    for p in payloads(0..200) {
        c.node_mut(leader).propose(p).unwrap();
        c.pump();
    }
    assert_eq!(appends_to(&c).len(), cfg.max_inflight_appends);
    // Once the link heals, the backlog goes in full batches.
    c.sent.clear();
    c.heal();
    c.tick(20);
    assert_eq!(c.app_data(follower), payloads(0..200));
    let sizes = appends_to(&c);
    let full = sizes.iter().filter(|&&n| n == cfg.max_entries_per_append).count();
    assert!(full >= 200 / cfg.max_entries_per_append - 1, "{sizes:?}");
    assert!(sizes.len() <= 200 / cfg.max_entries_per_append + 4, "{sizes:?}");
}

#[test]
fn follower_commits_only_entries_verified_against_this_leader() {
    // A follower holding stale entries from term 1 must not commit them on
    // the word of a term-2 leader's commit index before verifying them.
    let stale: Vec<Entry> = (1..=5)
        .map(|i| Entry { term: 1, index: i, kind: EntryKind::Normal, data: vec![i as u8].into() })
        .collect();
    let recovered = Recovered {
        hard_state: HardState { term: 1, vote: None, commit: 0 },
        snapshot: None,
        entries: stale,
    };
    let mut node = Node::new(config(2), recovered, Membership::with_voters(1..=3)).unwrap();
    let heartbeat = Message::AppendEntries {
        term: 2,
        from: 1,
        to: 2,
        prev_index: 0,
        prev_term: 0,
        entries: vec![].into(),
        leader_commit: 10,
    };
    node.step(heartbeat).unwrap();
    assert_eq!(node.commit_index(), 0);
    assert_eq!(node.leader(), Some(1));
    // Verifying index 3 (prev 3, term 1 matches) lets it commit through 3.
    node.step(Message::AppendEntries {
        term: 2,
        from: 1,
        to: 2,
        prev_index: 3,
        prev_term: 1,
        entries: vec![].into(),
        leader_commit: 10,
    })
    .unwrap();
    assert_eq!(node.commit_index(), 3);
    let rd = node.ready();
    assert_eq!(rd.hard_state, Some(HardState { term: 2, vote: None, commit: 3 }));
    assert!(rd.messages.iter().any(|m| matches!(m, Message::AppendReply { success: true, index: 3, .. })));
    // Recovered entries are durable, so they are applied at once.
    assert_eq!(rd.committed.len(), 3);
    // A conflicting append below the commit index is refused.
    let before = node.stats().unexpected;
    node.step(Message::AppendEntries {
        term: 2,
        from: 1,
        to: 2,
        prev_index: 3,
        prev_term: 1,
        entries: vec![Entry { term: 2, index: 4, kind: EntryKind::Normal, data: vec![].into() }].into(),
        leader_commit: 3,
    })
    .unwrap();
    assert_eq!(node.term_at(4), Some(2), "uncommitted conflicting suffix replaced");
    assert_eq!(node.last_index(), 4);
    assert_eq!(node.stats().unexpected, before);
}

#[test]
fn votes_are_granted_once_per_term_and_only_to_up_to_date_candidates() {
    let entries: Vec<Entry> =
        (1..=3).map(|i| Entry { term: 2, index: i, kind: EntryKind::Normal, data: vec![].into() }).collect();
    let recovered =
        Recovered { hard_state: HardState { term: 2, vote: None, commit: 0 }, snapshot: None, entries };
    let mut node = Node::new(config(1), recovered, Membership::with_voters(1..=3)).unwrap();
    let ask = |from, last_log_index, last_log_term| Message::RequestVote {
        term: 3,
        from,
        to: 1,
        last_log_index,
        last_log_term,
        transfer: false,
    };
    // Behind (shorter log of the same term): refused, but the term moves.
    node.step(ask(2, 2, 2)).unwrap();
    assert_eq!((node.term(), node.vote()), (3, None));
    // Up to date: granted.
    node.step(ask(3, 3, 2)).unwrap();
    assert_eq!(node.vote(), Some(3));
    // Another candidate in the same term: refused even if more up to date.
    node.step(ask(2, 9, 3)).unwrap();
    assert_eq!(node.vote(), Some(3));
    let rd = node.ready();
    assert_eq!(rd.hard_state, Some(HardState { term: 3, vote: Some(3), commit: 0 }));
    let grants: Vec<(u64, bool)> = rd
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::VoteReply { to, granted, .. } => Some((*to, *granted)),
            _ => None,
        })
        .collect();
    assert_eq!(grants, vec![(2, false), (3, true), (2, false)]);
}
