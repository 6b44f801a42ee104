//! The Raft scenario driver: `ordo_raft::Node`s (the core R3P2 runs) with
//! in-memory durable state, driven by script commands.
//!
//! Commands:
//! - `cluster voters=N [election-ticks=10] [heartbeat-ticks=2] [pre-vote=true]`
//! - `campaign ID` — the node starts an election now
//! - `propose ID data=X` — a client proposal at node ID
//! - `transfer ID to=T` — leadership transfer
//! - `tick [n=1]` — every live node ticks, then the network settles, `n` times
//! - `deliver` — process every node's `Ready` and deliver messages until
//!   nothing moves; prints each delivered message (`from->to Kind term=T`)
//! - `partition` (input: groups), `heal`, `crash ID`, `restart ID`
//! - `compact ID` — the application snapshots and the log is compacted
//! - `status` — one line per node: role, term, leader, commit, last index,
//!   the applied data
//!
//! Every `Ready` is handled as the persistence contract says (persist, then
//! advance, then send), and every delivered message goes through the wire
//! codec.

use super::{Args, arg, cut_links, groups, member_arg};
use ordo_raft::{
    Config, DecodeLimits, Entry, EntryKind, HardState, Index, Membership, Message, Node, NodeId, Recovered,
    Role, Snapshot, decode, encode,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

#[derive(Default)]
struct Store {
    hard: HardState,
    snapshot: Option<Snapshot>,
    entries: Vec<Entry>,
}

struct Peer {
    node: Option<Node>,
    store: Store,
    app: Vec<(Index, Vec<u8>)>,
    config: Config,
}

/// A scripted Raft cluster.
#[derive(Default)]
pub struct RaftCluster {
    peers: BTreeMap<NodeId, Peer>,
    membership: Membership,
    queue: VecDeque<Message>,
    cut: BTreeSet<(u64, u64)>,
}

/// The application's snapshot: one `index data` line per applied entry
/// (script data is one word).
fn encode_app(app: &[(Index, Vec<u8>)]) -> Vec<u8> {
    app.iter().map(|(i, d)| format!("{i} {}\n", String::from_utf8_lossy(d))).collect::<String>().into_bytes()
}

fn decode_app(b: &[u8]) -> Vec<(Index, Vec<u8>)> {
    String::from_utf8_lossy(b)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(i, d)| Some((i.parse().ok()?, d.as_bytes().to_vec())))
        .collect()
}

impl RaftCluster {
    /// Runs one script command; returns what it prints.
    pub fn handle(&mut self, directive: &str, args: &Args, input: &str) -> Result<String, String> {
        match directive {
            "cluster" => self.cluster(args),
            "campaign" => {
                let id = member_arg(args, "campaign")?;
                self.node(id)?.campaign();
                Ok(self.pump())
            }
            "propose" => {
                let id = member_arg(args, "propose")?;
                let data: String = arg(args, "data", String::new())?;
                let out = match self.node(id)?.propose(data.into_bytes()) {
                    Ok(index) => format!("proposed at index {index}\n"),
                    Err(e) => format!("refused: {e}\n"),
                };
                Ok(out + &self.pump())
            }
            "transfer" => {
                let id = member_arg(args, "transfer")?;
                let to: u64 = arg(args, "to", 0)?;
                let out = match self.node(id)?.transfer_leadership(to) {
                    Ok(()) => String::new(),
                    Err(e) => format!("refused: {e}\n"),
                };
                Ok(out + &self.pump())
            }
            "tick" => {
                let n: usize = arg(args, "n", 1)?;
                let mut out = String::new();
                for _ in 0..n {
                    for peer in self.peers.values_mut() {
                        if let Some(node) = peer.node.as_mut() {
                            node.tick();
                        }
                    }
                    out += &self.pump();
                }
                Ok(out)
            }
            "deliver" => Ok(self.pump()),
            "partition" => {
                self.cut = cut_links(&groups(input)?);
                Ok(String::new())
            }
            "heal" => {
                self.cut.clear();
                Ok(String::new())
            }
            "crash" => {
                let id = member_arg(args, "crash")?;
                self.peer(id)?.node = None;
                self.queue.retain(|m| m.to() != id && m.from() != id);
                Ok(String::new())
            }
            "restart" => {
                let id = member_arg(args, "restart")?;
                let membership = self.membership.clone();
                let peer = self.peer(id)?;
                let recovered = Recovered {
                    hard_state: peer.store.hard,
                    snapshot: peer.store.snapshot.clone(),
                    entries: peer.store.entries.clone(),
                };
                let node =
                    Node::new(peer.config.clone(), recovered, membership).map_err(|e| e.to_string())?;
                peer.app = peer.store.snapshot.as_ref().map(|s| decode_app(&s.data)).unwrap_or_default();
                peer.node = Some(node);
                Ok(self.pump())
            }
            "compact" => {
                let id = member_arg(args, "compact")?;
                let peer = self.peer(id)?;
                let node = peer.node.as_mut().ok_or("node is down")?;
                let data = encode_app(&peer.app);
                match node.compact(node.applied_index(), data.clone()) {
                    Ok(meta) => {
                        peer.store.entries.retain(|e| e.index > meta.index);
                        let out = format!("compacted through index {} (term {})\n", meta.index, meta.term);
                        peer.store.snapshot = Some(Snapshot { meta, data });
                        Ok(out)
                    }
                    Err(e) => Ok(format!("refused: {e}\n")),
                }
            }
            "status" => Ok(self.status()),
            other => Err(format!("unknown command {other}")),
        }
    }

    fn cluster(&mut self, args: &Args) -> Result<String, String> {
        let voters: u64 = arg(args, "voters", 3)?;
        let election: u64 = arg(args, "election-ticks", 10)?;
        let heartbeat: u64 = arg(args, "heartbeat-ticks", 2)?;
        let pre_vote: bool = arg(args, "pre-vote", true)?;
        self.membership = Membership::with_voters(1..=voters);
        for id in 1..=voters {
            let mut config = Config::new(id, 0x5EED ^ (id * 7919));
            config.election_ticks = election;
            config.heartbeat_ticks = heartbeat;
            config.pre_vote = pre_vote;
            let node = Node::new(config.clone(), Recovered::default(), self.membership.clone())
                .map_err(|e| e.to_string())?;
            self.peers
                .insert(id, Peer { node: Some(node), store: Store::default(), app: Vec::new(), config });
        }
        Ok(self.status())
    }

    fn peer(&mut self, id: NodeId) -> Result<&mut Peer, String> {
        self.peers.get_mut(&id).ok_or_else(|| format!("no node {id}"))
    }

    fn node(&mut self, id: NodeId) -> Result<&mut Node, String> {
        self.peer(id)?.node.as_mut().ok_or_else(|| format!("node {id} is down"))
    }

    /// Handles every `Ready` and delivers messages until nothing moves;
    /// returns the delivered messages, one per line.
    fn pump(&mut self) -> String {
        let limits = DecodeLimits::default();
        let mut out = String::new();
        for _ in 0..10_000 {
            let mut busy = false;
            for peer in self.peers.values_mut() {
                busy |= process_ready(peer, &mut self.queue);
            }
            while let Some(msg) = self.queue.pop_front() {
                busy = true;
                if self.cut.contains(&(msg.from(), msg.to())) {
                    continue;
                }
                let Some(node) = self.peers.get_mut(&msg.to()).and_then(|p| p.node.as_mut()) else {
                    continue;
                };
                let mut bytes = Vec::new();
                encode(&msg, &mut bytes);
                let decoded = decode(&bytes, &limits).expect("a node produced an invalid message");
                let _ = writeln!(out, "{}->{} {} term={}", msg.from(), msg.to(), msg.kind_name(), msg.term());
                if let Err(e) = node.step(decoded) {
                    let _ = writeln!(out, "  step error: {e}");
                }
            }
            if !busy {
                return out;
            }
        }
        out + "the cluster did not quiesce\n"
    }

    fn status(&self) -> String {
        let mut out = String::new();
        for (id, peer) in &self.peers {
            let Some(node) = &peer.node else {
                let _ = writeln!(out, "{id}: down");
                continue;
            };
            let role = match node.role() {
                Role::Leader => "leader",
                Role::Follower => "follower",
                Role::Candidate => "candidate",
                Role::PreCandidate => "pre-candidate",
            };
            let applied: Vec<String> =
                peer.app.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
            let _ = writeln!(
                out,
                "{id}: {role} term={} leader={} commit={} last={} applied=[{}]",
                node.term(),
                node.leader().map_or("none".to_string(), |l| l.to_string()),
                node.commit_index(),
                node.last_index(),
                applied.join(" ")
            );
        }
        out
    }
}

/// Persist → advance → apply → send, as the contract of `Node::ready` says.
fn process_ready(peer: &mut Peer, queue: &mut VecDeque<Message>) -> bool {
    let Some(node) = peer.node.as_mut() else { return false };
    if !node.has_ready() {
        return false;
    }
    let rd = node.ready();
    if let Some(snap) = &rd.snapshot {
        peer.store.snapshot = Some(snap.clone());
        peer.store.entries.clear();
        peer.app = decode_app(&snap.data);
    }
    if let Some(first) = rd.entries.first() {
        peer.store.entries.retain(|e| e.index < first.index);
        peer.store.entries.extend(rd.entries.iter().cloned());
    }
    if let Some(hs) = rd.hard_state {
        peer.store.hard = hs;
    }
    if let Some((index, term)) = rd.persist_point() {
        node.advance(index, term);
    }
    for e in &rd.committed {
        if e.kind == EntryKind::Normal {
            peer.app.push((e.index, e.data.to_vec()));
        }
    }
    queue.extend(rd.messages);
    true
}
