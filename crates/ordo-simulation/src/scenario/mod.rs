//! Scenario scripts: small cluster drivers that text scripts under
//! `testdata/` drive one command at a time, in the style of etcd-io/raft's
//! `testdata/*.txt` (datadriven): a command, its arguments and input, `----`,
//! and the output it must print. `REWRITE=1 cargo test -p ordo-simulation
//! --test scenarios` rewrites the expected output.
//!
//! One driver per engine, each over the production code:
//! - [`raft::RaftCluster`]: `ordo_raft::Node`s with in-memory durable state,
//!   a message queue, partitions, crashes and restarts from that state;
//! - [`acuerdo::AcuerdoCluster`]: `ordo_acuerdo::AcuerdoDriver`s over a
//!   [`ScriptFabric`] whose writes wait in per-link FIFO queues until the
//!   script lets them land;
//! - [`vsync::VsyncCluster`]: `ordo_vsync::VsyncDriver`s over the same fabric.
//!
//! The vocabulary is shared where it can be: `deliver`, `crash`,
//! `restart`, `partition` (input: one group of members per line), `heal`,
//! `tick`/`run`, `status`. Every script names the paper section it checks
//! in its opening comment.
//!
//! # Invariants
//! - A driver is deterministic: the same script prints the same output.
//! - A bad command or argument is an error line in the output (the script
//!   then fails against its expectation), never a panic of the harness; an
//!   engine's own assertion failing is a panic, as it should be.

pub mod acuerdo;
pub mod raft;
pub mod vsync;

use ordo_fabric::{
    Doorbell, Fabric, FabricEvent, FailureCause, MemberId, PostError, ReconnectError, Region, Write,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::rc::Rc;

/// A command's arguments as the script gives them (`key=value`,
/// `key=(a,b)`, or a bare `key`).
pub type Args = HashMap<String, Vec<String>>;

/// The value of `key` parsed as `T`, or `default` when absent.
pub fn arg<T: std::str::FromStr>(args: &Args, key: &str, default: T) -> Result<T, String> {
    match args.get(key).and_then(|v| v.first()) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("bad value {v:?} for {key}")),
    }
}

/// Every value of `key` parsed as `T` (empty when absent).
pub fn args_list<T: std::str::FromStr>(args: &Args, key: &str) -> Result<Vec<T>, String> {
    args.get(key)
        .map(|vs| vs.iter().map(|v| v.parse().map_err(|_| format!("bad value {v:?} for {key}"))).collect())
        .unwrap_or_else(|| Ok(Vec::new()))
}

/// The one bare word among the arguments that is a member id (`crash 2`),
/// or an error naming the command.
pub fn member_arg(args: &Args, command: &str) -> Result<u64, String> {
    let ids: Vec<u64> = args.keys().filter_map(|k| k.parse().ok()).collect();
    match ids[..] {
        [id] => Ok(id),
        [] => Err(format!("{command}: which member?")),
        _ => Err(format!("{command}: one member, not {ids:?}")),
    }
}

/// One status line per member, in id order: `id: down`, or `id: ` and what
/// `line` says of its live driver.
pub fn status_lines<'a, D: 'a>(
    members: impl IntoIterator<Item = (u64, Option<&'a D>)>,
    line: impl Fn(&D) -> String,
) -> String {
    let mut out = String::new();
    for (id, driver) in members {
        match driver {
            Some(d) => out += &format!("{id}: {}\n", line(d)),
            None => out += &format!("{id}: down\n"),
        }
    }
    out
}

/// Groups of a `partition` command's input: one group per line.
pub fn groups(input: &str) -> Result<Vec<Vec<u64>>, String> {
    input
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(|w| w.parse().map_err(|_| format!("bad member {w:?}"))).collect())
        .collect()
}

/// The directed links a partition into `groups` cuts.
pub fn cut_links(groups: &[Vec<u64>]) -> BTreeSet<(u64, u64)> {
    let mut cut = BTreeSet::new();
    for (i, a) in groups.iter().enumerate() {
        for (j, b) in groups.iter().enumerate() {
            if i != j {
                for x in a {
                    for y in b {
                        cut.insert((*x, *y));
                    }
                }
            }
        }
    }
    cut
}

/// A captured write waiting on a link.
struct InFlight {
    offset: usize,
    bytes: Vec<u8>,
}

/// The network the scripted fabric endpoints share.
#[derive(Default)]
pub struct ScriptNet {
    regions: BTreeMap<MemberId, Region>,
    queues: BTreeMap<(MemberId, MemberId), VecDeque<InFlight>>,
    cut: BTreeSet<(MemberId, MemberId)>,
    down: BTreeSet<MemberId>,
    incarnation: BTreeMap<MemberId, u64>,
    events: BTreeMap<MemberId, Vec<FabricEvent>>,
    /// Links each member has seen fail and not yet reconnected.
    suspected: BTreeMap<MemberId, BTreeSet<MemberId>>,
}

impl ScriptNet {
    /// A network of `members`, each with a zeroed region of `len` bytes.
    pub fn new(members: &[MemberId], len: usize) -> Rc<RefCell<ScriptNet>> {
        let mut net = ScriptNet::default();
        for &m in members {
            net.regions.insert(m, Region::new_heap(len));
            net.incarnation.insert(m, 1);
        }
        Rc::new(RefCell::new(net))
    }

    /// Lets every write queued from `src` to `dst` land (in order); returns
    /// how many. Writes to a member that is down are lost.
    pub fn deliver(&mut self, src: MemberId, dst: MemberId) -> usize {
        let queue = self.queues.remove(&(src, dst)).unwrap_or_default();
        let n = queue.len();
        if !self.down.contains(&dst) {
            let region = &self.regions[&dst];
            for w in queue {
                region.write_bytes(w.offset, &w.bytes);
            }
        }
        n
    }

    /// The `deliver [from=S to=(D,...)]` command: the writes queued on those
    /// links land (every link's without arguments).
    pub fn deliver_command(&mut self, args: &Args) -> Result<String, String> {
        let from: Vec<MemberId> = args_list(args, "from")?;
        let to: Vec<MemberId> = args_list(args, "to")?;
        if from.is_empty() && to.is_empty() {
            self.deliver_all();
        }
        for &src in &from {
            for &dst in &to {
                self.deliver(src, dst);
            }
        }
        Ok(String::new())
    }

    /// Lets every queued write land; returns how many.
    pub fn deliver_all(&mut self) -> usize {
        let links: Vec<(MemberId, MemberId)> = self.queues.keys().copied().collect();
        links.into_iter().map(|(s, d)| self.deliver(s, d)).sum()
    }

    /// The links with writes waiting, one line each (`src->dst: n writes`).
    pub fn describe_queues(&self) -> String {
        let mut out = String::new();
        for ((s, d), q) in &self.queues {
            if !q.is_empty() {
                out += &format!("{s}->{d}: {} writes\n", q.len());
            }
        }
        out
    }

    /// Cuts the links between `groups`: writes in flight across are lost,
    /// and (as a fabric must: a failed link stays down until reconnected)
    /// each side suspects the other; reconnecting fails until `heal`.
    pub fn partition(&mut self, groups: &[Vec<u64>]) {
        self.cut = cut_links(groups).into_iter().map(|(a, b)| (a as MemberId, b as MemberId)).collect();
        let cut = self.cut.clone();
        self.queues.retain(|link, _| !cut.contains(link));
        for (a, b) in cut {
            if !self.down.contains(&a) && !self.down.contains(&b) {
                self.suspect(a, b);
            }
        }
    }

    /// Heals every partition.
    pub fn heal(&mut self) {
        self.cut.clear();
    }

    /// `m` dies: its queued writes are lost and every live peer suspects it.
    pub fn crash(&mut self, m: MemberId) {
        self.down.insert(m);
        self.queues.retain(|(s, d), _| *s != m && *d != m);
        let peers: Vec<MemberId> = self.regions.keys().copied().filter(|p| *p != m).collect();
        for p in peers {
            self.suspect(p, m);
        }
    }

    fn suspect(&mut self, at: MemberId, peer: MemberId) {
        if self.suspected.entry(at).or_default().insert(peer) {
            self.events
                .entry(at)
                .or_default()
                .push(FabricEvent::Suspected { peer, cause: FailureCause::PeerDead });
        }
    }

    /// `m` comes back as a new incarnation with a zeroed region.
    pub fn restart(&mut self, m: MemberId, len: usize) -> u64 {
        self.down.remove(&m);
        self.regions.insert(m, Region::new_heap(len));
        self.suspected.remove(&m);
        self.events.remove(&m);
        let inc = self.incarnation.entry(m).or_insert(1);
        *inc += 1;
        *inc
    }
}

/// One member's endpoint of a [`ScriptNet`]: posts capture the bytes and
/// wait in the link's FIFO queue until the script delivers them.
pub struct ScriptFabric {
    me: MemberId,
    peers: Vec<MemberId>,
    region: Region,
    net: Rc<RefCell<ScriptNet>>,
}

impl ScriptFabric {
    /// `me`'s endpoint (its current region).
    pub fn new(net: &Rc<RefCell<ScriptNet>>, me: MemberId) -> ScriptFabric {
        let n = net.borrow();
        let peers = n.regions.keys().copied().filter(|p| *p != me).collect();
        ScriptFabric { me, peers, region: n.regions[&me].clone(), net: net.clone() }
    }
}

impl Fabric for ScriptFabric {
    fn member(&self) -> MemberId {
        self.me
    }

    fn peers(&self) -> &[MemberId] {
        &self.peers
    }

    fn region(&self) -> &Region {
        &self.region
    }

    fn post_write(&mut self, w: Write) -> Result<(), PostError> {
        if !self.peers.contains(&w.peer) {
            return Err(PostError::UnknownPeer(w.peer));
        }
        ordo_fabric::check_range(w.offset, w.len, self.region.len())?;
        let mut net = self.net.borrow_mut();
        if net.suspected.get(&self.me).is_some_and(|s| s.contains(&w.peer)) {
            return Err(PostError::PeerSuspected(w.peer));
        }
        if net.down.contains(&w.peer) {
            return Ok(()); // lost with the peer (its suspicion is already queued)
        }
        let mut bytes = vec![0; w.len];
        self.region.read_bytes(w.offset, &mut bytes);
        net.queues.entry((self.me, w.peer)).or_default().push_back(InFlight { offset: w.offset, bytes });
        Ok(())
    }

    fn poll_events(&mut self, events: &mut Vec<FabricEvent>) {
        if let Some(mine) = self.net.borrow_mut().events.get_mut(&self.me) {
            events.append(mine);
        }
    }

    fn doorbell(&self) -> Option<&Doorbell> {
        None
    }

    fn is_suspected(&self, peer: MemberId) -> bool {
        self.net.borrow().suspected.get(&self.me).is_some_and(|s| s.contains(&peer))
    }

    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError> {
        let mut net = self.net.borrow_mut();
        if net.down.contains(&peer) {
            return Err(ReconnectError::Unreachable(peer, "down".into()));
        }
        if net.cut.contains(&(self.me, peer)) {
            return Err(ReconnectError::Unreachable(peer, "partitioned".into()));
        }
        let incarnation = net.incarnation[&peer];
        if net.suspected.get_mut(&self.me).is_some_and(|s| s.remove(&peer)) {
            net.events.entry(self.me).or_default().push(FabricEvent::Reconnected { peer, incarnation });
        }
        Ok(incarnation)
    }
}
