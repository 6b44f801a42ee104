//! `vsync-views`: seeded simulation of vsync's **virtual synchrony** —
//! view changes under crashes and partitions — through the production
//! [`ViewMember`] (the view-change state machine of `ordo_vsync::view`
//! driving one `VsyncDriver` per view).
//!
//! `ordo sim --workload vsync-views --seed N` replays a seed.
//!
//! # What one seed draws
//! - 3..=5 members, 1..=2 subgroups (members ≥ 2 of them, senders a
//!   non-empty subset in a random rank order, window 1..=8, payload
//!   8..=64 bytes, mostly ordered, sometimes unordered), the Spindle
//!   switches (all, none, or a mix — always with null-sends: without them
//!   round-robin delivery waits for senders in lockstep, which a view
//!   change breaks), the fabric's delays and completion
//!   timeout; per sender 1..=40 messages at a random pace.
//! - Faults until a calm at 0.5..4 ms: crashes of random members (up to
//!   `n - 1` in all, so some seeds lose their majority), crashes aimed at
//!   the **view leader while a view change is under way** (every step of
//!   the change is hit over many seeds: before, during and after its
//!   prepare, accept and commit), splits of the group (a minority, a
//!   majority or half of it cut off, healed later) and single cut links.
//!   The control plane is the simulated datagram network (lossy,
//!   duplicating, reordering: the protocol retransmits). A crashed member
//!   may restart before the calm, and (in half the seeds) every dead or
//!   stopped member restarts at the calm — a herd of joiners: each is a
//!   new incarnation that joins, fetches its subgroups' state and goes on
//!   (its messages get new indices). At the calm every partition heals.
//! - The application: per subgroup, a count of delivered messages and a
//!   digest chained over them — what members snapshot and joiners restore.
//! - **Late subscribers** (a third of the seeds, `vsync-views` only): in
//!   each subgroup with members that never send, one of them starts
//!   outside it and **declares** itself in at a drawn time before the calm
//!   (`ViewMember::declare`: a view change whose decision carries the
//!   grown catalogue); it then fetches the subgroup's state like a joiner.
//!
//! # Checked
//! - **anomalies**: none (no ring faults, no undecodable control message,
//!   no refused send other than back-pressure or a wedge).
//! - **one catalogue per view**: members that install view `v` install the
//!   same catalogue (members per subgroup); it only grows; a declared
//!   member is in it from the view that answered it on.
//! - **view agreement**: members that install view `v` install the same
//!   member list; each incarnation installs consecutive views (an original
//!   one from view 1, a joiner from the view that admitted it).
//! - **partition safety**: every installed view keeps a majority of the
//!   view before it; a member that stopped in a minority (or was removed)
//!   installs nothing afterwards.
//! - **membership**: a member delivers in view `v` only if it is in `v` and
//!   in the subgroup (by `v`'s catalogue: a late subscriber not before it
//!   declared), and only messages of the subgroup's senders in `v`.
//! - **virtual synchrony**: the members that survive view `v` (install
//!   `v + 1`) delivered exactly the same messages in `v`, in the same order
//!   (ordered subgroups).
//! - **failure atomicity**: a message delivered in view `v` by anyone —
//!   crashed or removed members included — is delivered in `v` by every
//!   survivor of `v`.
//! - **no duplication / integrity / FIFO**: each member delivers each
//!   message at most once, with the bytes its sender sent, each sender's
//!   messages in send order (ordered subgroups, across views).
//! - **total order**: any two members deliver any two messages they both
//!   delivered in the same order (ordered subgroups, across views).
//! - **no loss for survivors**: every message sent by a member running at
//!   the end is delivered by every member running at the end that is in
//!   its subgroup (ordered subgroups: a message the trim aborted was resent).
//! - **state transfer**: members' snapshots of an ordered subgroup at one
//!   view's start are equal; a joiner restores one of the snapshots taken
//!   for its view (or an empty state when no holder was left).
//! - **liveness**: members running at the end (alive, not removed, not in a
//!   minority; joiners included) agree on the final view and are finished:
//!   all their sends made, every own slot reclaimed, no view change or
//!   state transfer pending; every live joiner was let in; and every member
//!   of an ordered subgroup active in the final view ends with the same
//!   state (count and digest).

use crate::SeedReport;
use crate::Workload;
use ordo_dds::{DomainCore, QosLevel, TopicConfig, TopicCore};
use ordo_fabric::MemberId;
use ordo_raft::storage::MemDisk;
use ordo_sim::rng::{SimRng, derive_seed, splitmix64, stream};
use ordo_sim::{
    Checker, Ctx, FabricConfig, FaultNote, History, NetAddr, Sim, SimConfig, SimFabric, SimProcess,
    SimSocket, Undo, UndoQueue, Violation, fnv64,
};
use ordo_vsync::view::{ControlMsg, Declaration, View, ViewGroup};
use ordo_vsync::{
    Delivered, DeliveryMode, GroupConfig, GroupLayout, MembershipEvent, SendError, SubgroupConfig, Switches,
    ViewMember,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// The workload's name.
pub const NAME: &str = "vsync-views";

/// The registry entry (`ordo sim --workload vsync-views`). It drives its
/// own faults; the options' switches do not apply.
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "vsync view changes through ViewMember: crashes (the view leader mid-change too), partitions, \
              restarts that rejoin with state transfer, a lossy control plane; view agreement, partition safety, \
              virtual synchrony, failure atomicity, resend, total order, state transfer, liveness",
    run: |seed, _| {
        let (digest, summary) = run(seed)?;
        Ok(SeedReport { workload: NAME.into(), seed, history_digest: digest, summary })
    },
};

/// The control plane's port on every member.
pub const CONTROL_PORT: u16 = 7100;
/// Retransmission interval of the view change.
const TICK_NS: u64 = 40_000;
/// Retry interval while writes are held back.
const RETRY_NS: u64 = 1_000;

/// What a member records.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ViewsEvent {
    /// Own message `index` of configured subgroup `subgroup` was committed.
    Sent {
        /// Configured subgroup.
        subgroup: usize,
        /// Index among the sender's messages there.
        index: u64,
    },
    /// A message was delivered.
    Delivered {
        /// Configured subgroup.
        subgroup: usize,
        /// Its sender.
        sender: MemberId,
        /// Its index among the sender's messages.
        index: u64,
        /// The view it was delivered in.
        view: u64,
        /// FNV-1a of the payload.
        digest: u64,
    },
    /// A view change started here.
    Wedged {
        /// The view being changed.
        view: u64,
    },
    /// A view was installed.
    Installed {
        /// Its number.
        view: u64,
        /// Its members.
        members: Vec<MemberId>,
        /// Messages delivered in the ragged-edge cleanup.
        ragged: usize,
        /// Own messages resent.
        resent: usize,
        /// Members of each configured subgroup in the view's catalogue.
        catalogue: Vec<Vec<MemberId>>,
    },
    /// This member's declaration into `subgroup` was answered: it is in.
    Declared {
        /// Configured subgroup.
        subgroup: usize,
    },
    /// Left out of the next view: stopped.
    Removed {
        /// The next view.
        next: u64,
    },
    /// In a minority: stopped.
    Minority {
        /// The view.
        view: u64,
    },
    /// This member took the state of `subgroup` for joiners of `view`.
    Snapshot {
        /// The joiners' first view.
        view: u64,
        /// Configured subgroup.
        subgroup: usize,
        /// Messages delivered there so far.
        count: u64,
        /// Chained digest of them.
        digest: u64,
    },
    /// This joiner restored the state of `subgroup` taken at `view`.
    Restored {
        /// Its first view.
        view: u64,
        /// Configured subgroup.
        subgroup: usize,
        /// Messages the state covers.
        count: u64,
        /// Chained digest.
        digest: u64,
    },
    /// The application state of each configured subgroup at the end of
    /// the run: (count, digest). Recorded by the harness for live members.
    FinalState {
        /// Per subgroup.
        state: Vec<(u64, u64)>,
    },
    /// `dds`: an in-place subscriber of topic `topic` got a sample (on a
    /// logged topic: after the log's sync).
    DdsSeen {
        /// The topic (= configured subgroup).
        topic: usize,
        /// The view it was delivered in.
        view: u64,
        /// Its position (ordered topics: in the total order).
        position: u64,
        /// Its publisher.
        sender: MemberId,
        /// The writer's sequence number (= the message index).
        seq: u64,
        /// FNV-1a of the sample's data.
        digest: u64,
    },
    /// `dds`: this member took topic `topic`'s state for joiners of `view`.
    DdsSnapshot {
        /// The joiners' first view.
        view: u64,
        /// The topic.
        topic: usize,
        /// FNV-1a of the snapshot.
        digest: u64,
    },
    /// `dds`: this joiner restored topic `topic`'s state.
    DdsRestored {
        /// The topic.
        topic: usize,
        /// FNV-1a of the restored snapshot.
        digest: u64,
        /// Its delivered count.
        delivered: u64,
        /// Its history: (position, sender, seq, data digest).
        history: Vec<(u64, MemberId, u64, u64)>,
    },
    /// `dds`: this joiner found no holder of topic `topic` (every member
    /// of it failed): the topic restarts, a new lineage at position 1.
    DdsReset {
        /// The topic.
        topic: usize,
    },
    /// `dds`: a (re)started member opened topic `topic`'s log after a power
    /// loss (unsynced writes dropped).
    DdsRecovered {
        /// The topic.
        topic: usize,
        /// The last position the log holds.
        delivered: u64,
        /// The history it replayed: (position, sender, seq, data digest).
        history: Vec<(u64, MemberId, u64, u64)>,
    },
    /// `dds`: per topic (delivered, FNV-1a of the topic's snapshot) at the
    /// end of the run. Recorded by the harness for live members.
    DdsFinal {
        /// Per topic.
        state: Vec<(u64, u64)>,
    },
    /// Finished (see the liveness checker).
    Finished,
    /// Left the finished state.
    Resumed,
    /// Something unexpected.
    Anomaly {
        /// What.
        what: String,
    },
}

/// One sender's plan in one configured subgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendPlan {
    /// Configured subgroup.
    pub subgroup: usize,
    /// Messages.
    pub count: u64,
    /// Least time between two sends.
    pub interval_ns: u64,
}

/// Everything a seed decides.
#[derive(Clone, Debug)]
pub struct Params {
    /// The configured group.
    pub group: GroupConfig,
    /// Per member: its sends.
    pub sends: Vec<Vec<SendPlan>>,
    /// The fabric.
    pub fabric: FabricConfig,
    /// Most crashes in the run.
    pub max_crashes: usize,
    /// Weights of crash, crash-the-leader-mid-change, split, cut, nothing.
    pub weights: [u32; 5],
    /// Faults stop and partitions heal here.
    pub calm_ns: u64,
    /// Chance (ppm) that a crashed member restarts (and rejoins) before
    /// the calm.
    pub restart_ppm: u32,
    /// Whether every dead or stopped member restarts at the calm.
    pub restart_at_calm: bool,
    /// The run ends here.
    pub end_ns: u64,
    /// `dds`: one topic per configured subgroup (the messages are DDS
    /// samples, every member runs a `DomainCore` over them).
    pub dds: Option<Arc<Vec<TopicConfig>>>,
    /// Late subscribers: (subgroup, member, when it declares itself in).
    /// `group` has them in; the group starts without them.
    pub late: Vec<(usize, MemberId, u64)>,
}

impl Params {
    /// The parameters of `seed`.
    pub fn draw(seed: u64) -> Params {
        let mut rng = SimRng::new(derive_seed(seed, stream::SCENARIO));
        let n = rng.range(3, 5) as u32;
        // Null-sends are always on: without them round-robin delivery waits
        // for every sender's next round (spindle §III-B), and senders whose
        // counts differ — as they do after a view change moves the rounds —
        // stall it legitimately.
        // Views copy (zero-copy is for a fixed group).
        let switches =
            Switches { null_sends: true, zero_copy: false, ..crate::vsync::draw_switches(&mut rng, 3) };
        let mut sends: Vec<Vec<SendPlan>> = vec![Vec::new(); n as usize];
        let mut subgroups = Vec::new();
        for g in 0..rng.range(1, 2) as usize {
            let mut all: Vec<MemberId> = (0..n).collect();
            rng.shuffle(&mut all);
            let size = rng.range(2, u64::from(n)) as usize;
            let mut members = all[..size].to_vec();
            let mut senders = members.clone();
            senders.truncate(rng.range(1, size as u64) as usize);
            rng.shuffle(&mut senders);
            members.sort_unstable();
            let mode = if rng.chance(200_000) { DeliveryMode::Unordered } else { DeliveryMode::Ordered };
            subgroups.push(SubgroupConfig {
                name: format!("g{g}"),
                descriptor: Vec::new(),
                members,
                senders: senders.clone(),
                window: rng.range(1, 8) as usize,
                max_payload: rng.range(8, 64) as usize,
                mode,
            });
            for s in senders {
                let interval_ns = if rng.chance(500_000) { rng.range(1_000, 60_000) } else { 0 };
                sends[s as usize].push(SendPlan { subgroup: g, count: rng.range(1, 40), interval_ns });
            }
        }
        let fabric = FabricConfig {
            delay_min_ns: rng.range(300, 2_000),
            delay_max_ns: rng.range(3_000, 20_000),
            spike_ppm: rng.range(0, 5_000) as u32,
            spike_max_ns: rng.range(10_000, 200_000),
            completion_timeout_ns: rng.range(60_000, 300_000),
            ..FabricConfig::default()
        };
        let group = GroupConfig { members: (0..n).collect(), subgroups, switches };
        group.validate().expect("drawn groups are valid");
        let calm_ns = rng.range(500_000, 4_000_000);
        // From a stream of their own: every other draw stays the seed's.
        let mut late_rng = SimRng::new(derive_seed(seed, stream::SCENARIO + 200));
        let mut late = Vec::new();
        if late_rng.chance(333_333) {
            for (g, s) in group.subgroups.iter().enumerate() {
                let quiet: Vec<MemberId> =
                    s.members.iter().copied().filter(|m| !s.senders.contains(m)).collect();
                if !quiet.is_empty() {
                    late.push((g, quiet[late_rng.index(quiet.len())], late_rng.range(0, calm_ns)));
                }
            }
        }
        Params {
            group,
            sends,
            fabric,
            max_crashes: rng.range(1, u64::from(n - 1)) as usize,
            weights: [
                rng.range(0, 3) as u32,
                rng.range(0, 4) as u32,
                rng.range(0, 2) as u32,
                rng.range(0, 2) as u32,
                2,
            ],
            calm_ns,
            restart_ppm: rng.range(0, 800_000) as u32,
            restart_at_calm: rng.chance(500_000),
            end_ns: calm_ns + 8_000_000,
            dds: None,
            late,
        }
    }

    /// The group the members start with: `group` without the late
    /// subscribers in their subgroups.
    pub fn initial_group(&self) -> GroupConfig {
        let mut g = self.group.clone();
        for &(sub, m, _) in &self.late {
            g.subgroups[sub].members.retain(|x| *x != m);
        }
        g
    }

    /// The parameters of `seed` for the `dds` workload: those of
    /// [`draw`](Self::draw), each subgroup a topic (unordered subgroups
    /// `unordered`, ordered ones atomic multicast, volatile or logged
    /// storage) with a small history, slots grown by the sample envelope.
    pub fn draw_dds(seed: u64) -> Params {
        let mut p = Params::draw(seed);
        p.late.clear();
        let mut rng = SimRng::new(derive_seed(seed, stream::SCENARIO + 100));
        let topics = p
            .group
            .subgroups
            .iter_mut()
            .enumerate()
            .map(|(g, s)| {
                s.max_payload += DDS_OVERHEAD;
                let qos = if s.mode == DeliveryMode::Unordered {
                    QosLevel::Unordered
                } else {
                    [QosLevel::AtomicMulticast, QosLevel::VolatileStorage, QosLevel::LoggedStorage]
                        [rng.index(3)]
                };
                TopicConfig {
                    name: format!("t{g}"),
                    qos,
                    publishers: s.senders.clone(),
                    subscribers: s.members.clone(),
                    max_sample: s.max_payload,
                    window: s.window,
                    history: rng.range(1, 20) as usize,
                    type_name: String::new(),
                }
            })
            .collect();
        p.dds = Some(Arc::new(topics));
        p
    }
}

/// Bytes a `dds` message adds around [`payload`]'s: the envelope and a
/// 2-byte key padded to 8.
pub const DDS_OVERHEAD: usize = ordo_dds::sample::HEADER + 8;

/// Message `index` of `sender` in configured subgroup `g`: [`payload`], or
/// in the `dds` workload a DDS sample (writer sequence = `index`, instance
/// key `k` and `index % 3`) whose data is [`payload`].
pub fn message(dds: bool, g: usize, sender: MemberId, index: u64, max_payload: usize) -> Vec<u8> {
    if !dds {
        return payload(g, sender, index, max_payload);
    }
    use ordo_dds::sample::{data_offset, encoded_len, write_header};
    let data = payload(g, sender, index, max_payload - DDS_OVERHEAD);
    let key = [b'k', (index % 3) as u8];
    let mut b = vec![0; encoded_len(key.len(), data.len())];
    write_header(&mut b, index, 0, &key);
    b[data_offset(key.len())..].copy_from_slice(&data);
    b
}

/// The payload of message `index` of `sender` in configured subgroup `g`:
/// the index (8 bytes, little-endian), then bytes that are a pure function
/// of all three, 8..=`max_payload` bytes in all.
pub fn payload(g: usize, sender: MemberId, index: u64, max_payload: usize) -> Vec<u8> {
    let mut state = (g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(sender) << 40) ^ index;
    let len = 8 + (splitmix64(&mut state) as usize) % (max_payload - 7);
    let mut out = index.to_le_bytes().to_vec();
    while out.len() < len {
        let w = splitmix64(&mut state).to_le_bytes();
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&w[..take]);
    }
    out
}

/// Per configured subgroup: (messages delivered, chained digest).
type AppState = Vec<(u64, u64)>;

/// Snapshots per (view, subgroup): (member, count, digest).
type Snaps = BTreeMap<(u64, usize), Vec<(MemberId, u64, u64)>>;

/// What the fault driver may know of the members (shared, one thread).
#[derive(Debug, Default)]
struct Shared {
    /// Per member: current view members while a change is under way.
    changing: Vec<Option<Vec<MemberId>>>,
    /// Per member: (incarnation, application state), kept current.
    state: Vec<Option<(u64, AppState)>>,
    /// `dds`: per member, per topic (delivered, snapshot digest), kept
    /// current.
    dds_state: Vec<Option<Vec<(u64, u64)>>>,
    /// `dds`: each member's disk per logged topic; it outlives the member's
    /// incarnations (a restart finds what was synced on it).
    disks: BTreeMap<(MemberId, usize), MemDisk>,
}

type Opener = Box<dyn FnMut(&ViewGroup, usize) -> Result<SimFabric, String>>;

/// Deliveries collected by the sink: (configured subgroup, sender, payload).
type Got = Rc<RefCell<Vec<(usize, MemberId, Vec<u8>)>>>;

/// The application: per configured subgroup, messages delivered and a
/// digest chained over them; snapshots and restores taken by the view
/// change (what a joiner must get right).
struct App {
    got: Got,
    state: Rc<RefCell<Vec<(u64, u64)>>>,
    /// Snapshots taken in the current call: (subgroup, count, digest).
    snaps: Rc<RefCell<Vec<(usize, u64, u64)>>>,
    /// Restores made in the current call: (subgroup, count, digest).
    restores: Rc<RefCell<Vec<(usize, u64, u64)>>>,
    /// `dds`: the member's DDS state over the same deliveries.
    dds: Option<DdsApp>,
}

/// `dds`: ordo-dds's production [`DomainCore`] fed by the member's
/// deliveries, snapshots and restores; its in-place subscribers record
/// what the application saw.
struct DdsApp {
    core: DomainCore<MemDisk>,
    /// The view deliveries of the current call happen in.
    view: u64,
    /// Events its subscribers and restores recorded in the current call.
    events: Arc<Mutex<Vec<ViewsEvent>>>,
    /// Snapshots taken in the current call: (topic, digest).
    snaps: Vec<(usize, u64)>,
}

fn dds_history(t: &ordo_dds::TopicCore<MemDisk>) -> Vec<(u64, MemberId, u64, u64)> {
    t.history().map(|s| (s.position, s.sender, s.envelope.seq, fnv64(s.data()))).collect()
}

fn chain(d: u64, payload: &[u8]) -> u64 {
    let mut b = d.to_le_bytes().to_vec();
    b.extend_from_slice(&fnv64(payload).to_le_bytes());
    fnv64(&b)
}

impl ordo_vsync::DeliverySink for App {
    fn deliver(&mut self, batch: &[Delivered<'_>]) {
        let mut st = self.state.borrow_mut();
        let mut g = self.got.borrow_mut();
        for d in batch {
            let s = &mut st[d.subgroup];
            s.0 += 1;
            s.1 = chain(s.1, d.payload);
            g.push((d.subgroup, d.sender, d.payload.to_vec()));
        }
        if let Some(d) = self.dds.as_mut() {
            d.core.deliver(d.view, batch);
        }
    }
}

impl ordo_vsync::StateTransfer for App {
    fn snapshot(&mut self, subgroup: usize) -> Vec<u8> {
        let (c, d) = self.state.borrow()[subgroup];
        self.snaps.borrow_mut().push((subgroup, c, d));
        let mut out = c.to_le_bytes().to_vec();
        out.extend_from_slice(&d.to_le_bytes());
        if let Some(dds) = self.dds.as_mut() {
            let snap = dds.core.snapshot(subgroup);
            dds.snaps.push((subgroup, fnv64(&snap)));
            out.extend_from_slice(&snap);
        }
        out
    }

    fn restore(&mut self, subgroup: usize, state: &[u8]) {
        if let Some(dds) = self.dds.as_mut() {
            // What the member daemon hands ordo-dds: the state past the
            // node's 16 bytes, empty when no holder was left.
            let mine = state.get(16..).unwrap_or_default();
            let ev = match dds.core.restore(subgroup, mine) {
                Ok(()) if mine.is_empty() => ViewsEvent::DdsReset { topic: subgroup },
                Ok(()) => {
                    let t = dds.core.topic(subgroup);
                    ViewsEvent::DdsRestored {
                        topic: subgroup,
                        digest: fnv64(mine),
                        delivered: t.delivered(),
                        history: dds_history(t),
                    }
                }
                Err(why) => ViewsEvent::Anomaly { what: format!("dds restore of topic {subgroup}: {why}") },
            };
            dds.events.lock().expect("events").push(ev);
        }
        let state = if self.dds.is_some() { state.get(..16).unwrap_or_default() } else { state };
        let v = if state.len() == 16 {
            (
                u64::from_le_bytes(state[..8].try_into().expect("8")),
                u64::from_le_bytes(state[8..].try_into().expect("8")),
            )
        } else {
            (0, 0)
        };
        self.state.borrow_mut()[subgroup] = v;
        self.restores.borrow_mut().push((subgroup, v.0, v.1));
    }
}

/// A member's DDS state: a topic per configured subgroup (logged ones over
/// the member's disk, which a restart finds after a power loss: its
/// unsynced writes dropped), and an in-place subscriber per topic it is in.
fn dds_app(ctx: &mut Ctx<'_, ViewsEvent>, topics: &[TopicConfig], shared: &Rc<RefCell<Shared>>) -> DdsApp {
    let me = ctx.member();
    let inc = ctx.incarnation();
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut cores = Vec::new();
    for (g, t) in topics.iter().enumerate() {
        let member = t.subscribers.contains(&me) || t.publishers.contains(&me);
        if t.qos != QosLevel::LoggedStorage || !member {
            cores.push(TopicCore::new(t.clone()));
            continue;
        }
        let disk = shared.borrow_mut().disks.entry((me, g)).or_default().clone();
        if inc > 1 {
            let mut x = (u64::from(me) << 32) ^ inc ^ ((g as u64) << 48);
            disk.crash(splitmix64(&mut x));
        }
        match TopicCore::with_log(t.clone(), disk, true) {
            Ok(c) => {
                ctx.record(ViewsEvent::DdsRecovered {
                    topic: g,
                    delivered: c.delivered(),
                    history: dds_history(&c),
                });
                cores.push(c);
            }
            Err(e) => {
                ctx.record(ViewsEvent::Anomaly { what: format!("dds log of topic {g} did not open: {e}") });
                cores.push(TopicCore::new(t.clone()));
            }
        }
    }
    let mut core = DomainCore::new(me, cores);
    if inc == 1 {
        // An original member (view 0): as `DomainParticipant` does.
        if let Err(why) = core.start_fresh() {
            ctx.record(ViewsEvent::Anomaly { what: format!("dds start: {why}") });
        }
    }
    // What a subscriber is shown at subscription (the history replayed
    // from this member's log, of whichever lineage) is not recorded: the
    // checkers judge what the group delivers from here on.
    let live = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for (g, t) in topics.iter().enumerate() {
        if t.subscribers.contains(&me) || t.publishers.contains(&me) {
            let (ev, live) = (events.clone(), live.clone());
            core.topic_mut(g).add_in_place(Box::new(move |info, data| {
                if !live.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                ev.lock().expect("events").push(ViewsEvent::DdsSeen {
                    topic: g,
                    view: info.view,
                    position: info.position,
                    sender: info.source,
                    seq: info.sequence,
                    digest: fnv64(data),
                })
            }));
        }
    }
    live.store(true, std::sync::atomic::Ordering::Relaxed);
    DdsApp { core, view: 0, events, snaps: Vec::new() }
}

struct Member {
    me: MemberId,
    vm: ViewMember<SimFabric, Opener>,
    sock: SimSocket,
    plans: Vec<SendPlan>,
    sent: Vec<u64>,
    next_at: Vec<u64>,
    next_tick: u64,
    stopped: bool,
    finished: bool,
    template: Arc<GroupConfig>,
    /// Message indices of this incarnation start here (a restarted member
    /// sends new messages, never its earlier incarnation's).
    first_index: u64,
    /// The `dds` workload: messages are DDS samples.
    dds: bool,
    /// This member's late subscriptions not answered yet: (subgroup, when).
    late: Vec<(usize, u64)>,
    app: App,
    shared: Rc<RefCell<Shared>>,
}

impl Member {
    fn new(ctx: &mut Ctx<'_, ViewsEvent>, params: &Params, shared: Rc<RefCell<Shared>>) -> Member {
        let me = ctx.member();
        let joining = ctx.incarnation() > 1;
        let world = ctx.fabric().world().clone();
        let region_len = world.lock().expect("world").config().region_len;
        let first = Arc::new(Mutex::new(Some(ctx.fabric().clone())));
        let open: Opener = Box::new(move |group: &ViewGroup, len: usize| {
            assert!(len <= region_len, "a view's region ({len} bytes) fits the simulated one ({region_len})");
            if let Some(f) = first.lock().expect("first").take()
                && group.view.id == 0
            {
                return Ok(f);
            }
            Ok(SimFabric::open_view(&world, me, group.view.id))
        });
        let vm = if joining {
            // A restarted member rejoins as a new incarnation.
            ViewMember::join(me, params.initial_group(), ctx.incarnation(), open)
                .expect("a configured member")
        } else {
            let view = View { id: 0, members: params.group.members.clone() };
            ViewMember::new(me, params.initial_group(), view, open).expect("a valid group")
        };
        let sock = ctx.bind(CONTROL_PORT).expect("the control port is free");
        let plans = params.sends[me as usize].clone();
        let dds = params.dds.as_ref().map(|topics| dds_app(ctx, topics, &shared));
        Member {
            me,
            vm,
            sock,
            sent: vec![0; plans.len()],
            next_at: vec![0; plans.len()],
            plans,
            next_tick: 0,
            stopped: false,
            finished: false,
            template: Arc::new(params.group.clone()),
            first_index: (ctx.incarnation() - 1) << 32,
            dds: params.dds.is_some(),
            late: params.late.iter().filter(|l| l.1 == me).map(|l| (l.0, l.2)).collect(),
            app: App {
                got: Rc::new(RefCell::new(Vec::new())),
                state: Rc::new(RefCell::new(vec![(0, 0); params.group.subgroups.len()])),
                snaps: Rc::new(RefCell::new(Vec::new())),
                restores: Rc::new(RefCell::new(Vec::new())),
                dds,
            },
            shared,
        }
    }

    /// Records what the sink collected, as delivered in `view`.
    fn record_deliveries(&mut self, ctx: &mut Ctx<'_, ViewsEvent>, view: u64) {
        for (g, sender, bytes) in self.app.got.borrow_mut().drain(..) {
            let index = if self.dds {
                ordo_dds::sample::Envelope::decode(&bytes).ok().map(|e| e.seq)
            } else {
                bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            };
            let Some(index) = index else {
                ctx.record(ViewsEvent::Anomaly {
                    what: format!("a {}-byte payload from m{sender}", bytes.len()),
                });
                continue;
            };
            ctx.record(ViewsEvent::Delivered { subgroup: g, sender, index, view, digest: fnv64(&bytes) });
        }
        if let Some(d) = self.app.dds.as_ref() {
            for e in d.events.lock().expect("events").drain(..) {
                ctx.record(e);
            }
        }
    }

    /// The view the next engine call delivers in.
    fn set_view(&mut self) {
        let view = self.vm.view().id;
        if let Some(d) = self.app.dds.as_mut() {
            d.view = view;
        }
    }

    fn record_membership(&mut self, ctx: &mut Ctx<'_, ViewsEvent>) {
        let view = self.vm.view().id;
        for (subgroup, count, digest) in self.app.snaps.borrow_mut().drain(..) {
            ctx.record(ViewsEvent::Snapshot { view, subgroup, count, digest });
        }
        if let Some(d) = self.app.dds.as_mut() {
            for (topic, digest) in d.snaps.drain(..) {
                ctx.record(ViewsEvent::DdsSnapshot { view, topic, digest });
            }
        }
        for e in self.vm.take_events() {
            ctx.record(match e {
                MembershipEvent::Wedged { view } => ViewsEvent::Wedged { view },
                MembershipEvent::Installed { view, ragged, resent, .. } => {
                    let catalogue = self.vm.template().subgroups.iter().map(|s| s.members.clone()).collect();
                    ViewsEvent::Installed { view: view.id, members: view.members, ragged, resent, catalogue }
                }
                MembershipEvent::Answered(a) => match a.outcome {
                    Ok(subgroup) => {
                        self.late.retain(|l| l.0 != subgroup);
                        ViewsEvent::Declared { subgroup }
                    }
                    Err(why) => {
                        ViewsEvent::Anomaly { what: format!("declaration of {:?} refused: {why}", a.name) }
                    }
                },
                MembershipEvent::Removed { next } => {
                    self.stopped = true;
                    ViewsEvent::Removed { next: next.id }
                }
                MembershipEvent::Minority { view, .. } => {
                    self.stopped = true;
                    ViewsEvent::Minority { view: view.id }
                }
                MembershipEvent::Restored { view, subgroup, .. } => {
                    // The state as restored (deliveries may follow in the
                    // same call).
                    let mut r = self.app.restores.borrow_mut();
                    let i =
                        r.iter().position(|x| x.0 == subgroup).expect("a restore for every Restored event");
                    let (_, count, digest) = r.remove(i);
                    ViewsEvent::Restored { view, subgroup, count, digest }
                }
                MembershipEvent::Failed { view, why } => {
                    self.stopped = true;
                    ViewsEvent::Anomaly { what: format!("view {} could not be opened: {why}", view.id) }
                }
            });
        }
        if self.stopped {
            // The daemon exits: its links and sockets close, so peers that
            // still count on it suspect it.
            let world = ctx.fabric().world().clone();
            world.lock().expect("world").crash(self.me);
        }
    }

    fn flush_outbox(&mut self) {
        for (to, msg) in self.vm.take_outbox() {
            // A closed socket (this member crashed) or a full network: the
            // protocol retransmits.
            let _ = self.sock.send(NetAddr::new(to, CONTROL_PORT), &msg.to_bytes());
        }
    }

    fn send(&mut self, ctx: &mut Ctx<'_, ViewsEvent>) -> usize {
        let now = ctx.now();
        let mut work = 0;
        for i in 0..self.plans.len() {
            let g = self.plans[i].subgroup;
            while self.sent[i] < self.plans[i].count && now >= self.next_at[i] {
                let Some(handle) = self.vm.sender(g) else { break };
                let max = self.template.subgroups[g].max_payload;
                let index = self.first_index + self.sent[i];
                let bytes = message(self.dds, g, self.me, index, max);
                match handle.try_send_with(bytes.len(), |buf| buf.copy_from_slice(&bytes)) {
                    Ok(()) => {
                        ctx.record(ViewsEvent::Sent { subgroup: g, index });
                        self.sent[i] += 1;
                        work += 1;
                        if self.plans[i].interval_ns > 0 {
                            self.next_at[i] = now + self.plans[i].interval_ns;
                        }
                    }
                    // Back-pressure: slots free up in a poll that reports
                    // work. Wedged: a view change is under way; the new
                    // view's handle takes the message afterwards.
                    Err(SendError::WouldBlock | SendError::Wedged) => break,
                    Err(e) => {
                        ctx.record(ViewsEvent::Anomaly { what: format!("send in subgroup {g}: {e}") });
                        self.sent[i] = self.plans[i].count;
                    }
                }
            }
            if self.sent[i] < self.plans[i].count && self.next_at[i] > now {
                ctx.wake_at(self.next_at[i]);
            }
        }
        work
    }

    fn is_finished(&self) -> bool {
        self.late.is_empty()
            && self.vm.is_settled()
            && self.sent.iter().zip(&self.plans).all(|(s, p)| *s == p.count)
            && self.vm.try_driver().is_some_and(|d| d.is_idle())
    }
}

impl SimProcess<ViewsEvent> for Member {
    fn poll(&mut self, ctx: &mut Ctx<'_, ViewsEvent>) -> usize {
        if self.stopped {
            return 0;
        }
        let now = ctx.now();
        let mut work = 0;
        // Control plane.
        while let Some((from, bytes)) = self.sock.recv() {
            let view = self.vm.view().id;
            self.set_view();
            match ControlMsg::decode(&bytes) {
                Ok(msg) => work += self.vm.on_control(from.member, msg, &mut self.app),
                Err(e) => ctx.record(ViewsEvent::Anomaly { what: format!("control frame from {from}: {e}") }),
            }
            self.record_deliveries(ctx, view);
            self.record_membership(ctx);
            if self.stopped {
                return work + 1;
            }
        }
        // Heartbeats, retransmissions, response timeouts.
        if now >= self.next_tick {
            let view = self.vm.view().id;
            self.set_view();
            self.vm.tick(&mut self.app);
            self.next_tick = now + TICK_NS;
            self.record_deliveries(ctx, view);
            self.record_membership(ctx);
            if self.stopped {
                return work + 1;
            }
        }
        // The engine.
        let view = self.vm.view().id;
        self.set_view();
        work += self.vm.do_work(&mut self.app);
        // A view installed by the last call delivers in the new view.
        self.set_view();
        self.record_deliveries(ctx, view);
        if let Some(d) = self.vm.try_driver() {
            for f in d.engine().faults() {
                ctx.record(ViewsEvent::Anomaly { what: format!("ring fault: {f:?}") });
            }
        }
        self.record_membership(ctx);
        if self.stopped {
            return work + 1;
        }
        work += self.send(ctx);
        // Late subscriptions due: declared once per incarnation (answered
        // at once if an earlier incarnation's already is in).
        if let Some(i) = self.late.iter().position(|l| l.1 <= now && l.1 != u64::MAX)
            && self.vm.is_settled()
        {
            let g = self.late[i].0;
            self.late[i].1 = u64::MAX;
            let d = Declaration::of(&self.template.subgroups[g], false);
            self.set_view();
            let view = self.vm.view().id;
            self.vm.declare(d, &mut self.app);
            self.record_deliveries(ctx, view);
            self.record_membership(ctx);
            if self.stopped {
                return work + 1;
            }
            work += 1;
        }
        if let Some(next) = self.late.iter().map(|l| l.1).filter(|t| *t != u64::MAX).min() {
            ctx.wake_at(next.max(now + 1));
        }
        self.flush_outbox();
        {
            let mut sh = self.shared.borrow_mut();
            sh.changing[self.me as usize] = self.vm.is_changing().then(|| self.vm.view().members.clone());
            sh.state[self.me as usize] = Some((ctx.incarnation(), self.app.state.borrow().clone()));
            if let Some(d) = self.app.dds.as_ref() {
                sh.dds_state[self.me as usize] =
                    Some(d.core.topics().iter().map(|t| (t.delivered(), fnv64(&t.snapshot()))).collect());
            }
        }
        ctx.wake_at(self.next_tick.max(now + 1));
        if self.vm.try_driver().is_some_and(|d| !d.can_poll()) {
            ctx.wake_at(now + RETRY_NS);
        }
        let done = self.is_finished();
        if done != self.finished {
            self.finished = done;
            ctx.record(if done { ViewsEvent::Finished } else { ViewsEvent::Resumed });
        }
        work
    }

    fn done(&self) -> bool {
        self.stopped || self.finished
    }
}

/// Runs one seed: the group, then the fault driver until the calm, then
/// the settling time. Returns the history.
pub fn simulate(seed: u64, params: &Params) -> History<ViewsEvent> {
    let n = params.group.members.len() as u32;
    let shared = Rc::new(RefCell::new(Shared {
        changing: vec![None; n as usize],
        state: vec![None; n as usize],
        dds_state: vec![None; n as usize],
        disks: BTreeMap::new(),
    }));
    let region_len = GroupLayout::new(&params.group).region_len;
    let mut net = ordo_sim::NetConfig::default();
    // The control plane is TCP in production, frames up to 64 KiB: a
    // state chunk (`STATE_CHUNK`, 32 KiB) travels whole.
    net.max_datagram_len = net.max_datagram_len.max(ordo_vsync::view::STATE_CHUNK + 1024);
    let config =
        SimConfig { members: n, region_len, fabric: params.fabric.clone(), net, ..SimConfig::default() };
    let p = Arc::new(params.clone());
    let sh = shared.clone();
    let factory: ordo_sim::Factory<ViewsEvent> =
        Box::new(move |ctx| Box::new(Member::new(ctx, &p, sh.clone())));
    let injector = ordo_fault::Injector::new(derive_seed(seed, stream::FAULT_POINTS), 20_000);
    let guard = ordo_fault::install(injector);
    let mut sim = Sim::new(seed, config, None, factory);
    let mut rng = SimRng::new(derive_seed(seed, stream::NEMESIS));
    let mut later = UndoQueue::default();
    let mut crashes = 0;
    let mut t = rng.range(20_000, 300_000);
    while t < params.calm_ns {
        later.run_due(&mut sim, t);
        sim.run_until(t);
        let alive: Vec<MemberId> = {
            let w = sim.world().lock().expect("world");
            (0..n).filter(|m| w.is_alive(*m)).collect()
        };
        let changing: Option<Vec<MemberId>> = shared
            .borrow()
            .changing
            .iter()
            .enumerate()
            .find_map(|(m, c)| c.clone().filter(|_| alive.contains(&(m as u32))));
        let mut step = rng.range(50_000, 400_000);
        match rng.weighted(&params.weights) {
            0 if crashes < params.max_crashes && !alive.is_empty() => {
                let victim = alive[rng.index(alive.len())];
                sim.crash(victim);
                crashes += 1;
                if rng.chance(params.restart_ppm) {
                    // It comes back as a new incarnation and rejoins.
                    later.push(t + rng.range(100_000, 1_500_000), Undo::Restart(victim));
                }
            }
            1 if crashes < params.max_crashes => {
                // The view leader, while a change is under way (or soon).
                if let Some(view) = changing {
                    if let Some(leader) = view.into_iter().find(|m| alive.contains(m)) {
                        sim.crash(leader);
                        crashes += 1;
                        if rng.chance(params.restart_ppm) {
                            later.push(t + rng.range(100_000, 1_500_000), Undo::Restart(leader));
                        }
                    }
                } else {
                    step = rng.range(5_000, 60_000);
                }
            }
            2 if n >= 2 => {
                let mut members: Vec<MemberId> = (0..n).collect();
                rng.shuffle(&mut members);
                let size = 1 + rng.below(u64::from(n - 1)) as usize;
                let mut side = members[..size].to_vec();
                side.sort_unstable();
                sim.split(side.clone());
                later.push(t + rng.range(50_000, 1_000_000), Undo::HealSplit(side));
            }
            3 => {
                let a = rng.below(u64::from(n)) as MemberId;
                let b = (a + 1 + rng.below(u64::from(n - 1)) as MemberId) % n;
                sim.cut(a, b);
                later.push(t + rng.range(50_000, 1_000_000), Undo::Heal(a, b));
            }
            _ => {}
        }
        t += step;
    }
    later.run_due(&mut sim, params.calm_ns);
    later.clear();
    sim.run_until(params.calm_ns);
    {
        let mut w = sim.world().lock().expect("world");
        w.heal_all();
    }
    // Every member that died or stopped comes back as a new incarnation and
    // rejoins (if a majority is still running to let it in).
    if params.restart_at_calm {
        for m in 0..n {
            sim.restart(m);
        }
    }
    sim.run_until(params.end_ns);
    // A view change under way at the end (a late suspicion) gets up to
    // 10 ms more to finish, so liveness judges a settled group.
    let mut t = params.end_ns;
    for _ in 0..10 {
        let alive: Vec<bool> = {
            let w = sim.world().lock().expect("world");
            (0..n).map(|m| w.is_alive(m)).collect()
        };
        let busy = shared.borrow().changing.iter().enumerate().any(|(m, c)| alive[m] && c.is_some());
        if !busy {
            break;
        }
        t += 1_000_000;
        sim.run_until(t);
    }
    drop(guard.finish());
    let alive: Vec<bool> = {
        let w = sim.world().lock().expect("world");
        (0..n).map(|m| w.is_alive(m)).collect()
    };
    let mut history = sim.into_history();
    let end = history.end_ns;
    for (m, st) in shared.borrow().state.iter().enumerate() {
        if let Some((inc, state)) = st
            && alive[m]
        {
            history.record(end, m as MemberId, *inc, ViewsEvent::FinalState { state: state.clone() });
            if let Some(d) = &shared.borrow().dds_state[m] {
                history.record(end, m as MemberId, *inc, ViewsEvent::DdsFinal { state: d.clone() });
            }
        }
    }
    history
}

/// Every checker, in order, for a run without late subscribers.
pub fn checkers(group: &GroupConfig) -> Vec<Box<dyn Checker<ViewsEvent>>> {
    checkers_with(group, group)
}

/// Every checker for the run of `params` (its late subscribers included).
pub fn checkers_for(params: &Params) -> Vec<Box<dyn Checker<ViewsEvent>>> {
    checkers_with(&params.group, &params.initial_group())
}

/// Every checker: `group` has every member that may be in each subgroup,
/// `initial` the members the run starts with.
pub fn checkers_with(group: &GroupConfig, initial: &GroupConfig) -> Vec<Box<dyn Checker<ViewsEvent>>> {
    let g = Arc::new(group.clone());
    let i = Arc::new(initial.clone());
    vec![
        Box::new(Anomalies),
        Box::new(ViewAgreement { group: g.clone() }),
        Box::new(CatalogueAgreement { initial: i.clone() }),
        Box::new(Membership { group: g.clone(), initial: i.clone() }),
        Box::new(Integrity { group: g.clone(), dds: false }),
        Box::new(VirtualSynchrony { group: g.clone(), initial: i.clone() }),
        Box::new(TotalOrder { group: g.clone() }),
        Box::new(NoLossForSurvivors { group: g.clone(), initial: i }),
        Box::new(StateTransferCheck { group: g.clone() }),
        Box::new(Liveness { group: g }),
    ]
}

/// Runs and checks one seed: (history digest, summary).
pub fn run(seed: u64) -> Result<(u64, String), String> {
    let params = Params::draw(seed);
    let history = std::panic::catch_unwind(|| simulate(seed, &params))
        .map_err(|p| format!("seed {seed}: panicked: {}", crate::panic_message(&*p)))?;
    ordo_sim::check_all(&history, &checkers_for(&params)).map_err(|v| format!("seed {seed}: {v}"))?;
    let views = history
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            ViewsEvent::Installed { view, .. } => Some(*view),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let crashes = history.faults.iter().filter(|f| matches!(f.fault, FaultNote::Crash { .. })).count();
    let summary = format!(
        "{NAME} seed {seed}: passed — {} members, {} views installed, {} crashes, {} history entries \
         (digest {:#018x})",
        params.group.members.len(),
        views,
        crashes,
        history.entries.len(),
        history.digest()
    );
    Ok((history.digest(), summary))
}

// ---------------------------------------------------------------------------
// Checkers
// ---------------------------------------------------------------------------

/// A message: (configured subgroup, sender, index).
type Msg = (usize, MemberId, u64);

pub(crate) fn violation(checker: &'static str, message: String) -> Result<(), Violation> {
    Err(Violation { checker, message })
}

/// Per member: its deliveries in order, with their view.
fn deliveries(h: &History<ViewsEvent>) -> BTreeMap<MemberId, Vec<(Msg, u64, u64)>> {
    let mut out: BTreeMap<MemberId, Vec<(Msg, u64, u64)>> = BTreeMap::new();
    for e in &h.entries {
        if let ViewsEvent::Delivered { subgroup, sender, index, view, digest } = e.event {
            out.entry(e.member).or_default().push(((subgroup, sender, index), view, digest));
        }
    }
    out
}

/// Installed views: id → members; and per member the ids it installed.
pub(crate) fn views(h: &History<ViewsEvent>, group: &GroupConfig) -> BTreeMap<u64, Vec<MemberId>> {
    let mut out = BTreeMap::new();
    out.insert(0, group.members.clone());
    for e in &h.entries {
        if let ViewsEvent::Installed { view, members, .. } = &e.event {
            out.entry(*view).or_insert_with(|| members.clone());
        }
    }
    out
}

/// Members of view `v` that installed view `v + 1` (its survivors;
/// joiners of `v + 1` are not).
fn survivors(h: &History<ViewsEvent>, v: u64) -> BTreeSet<MemberId> {
    let members: BTreeSet<MemberId> = h
        .entries
        .iter()
        .find_map(|e| match &e.event {
            ViewsEvent::Installed { view, members, .. } if *view == v => {
                Some(members.iter().copied().collect())
            }
            _ => None,
        })
        .unwrap_or_else(|| if v == 0 { (0..h.members).collect() } else { BTreeSet::new() });
    h.entries
        .iter()
        .filter_map(|e| match &e.event {
            ViewsEvent::Installed { view, .. } if *view == v + 1 && members.contains(&e.member) => {
                Some(e.member)
            }
            _ => None,
        })
        .collect()
}

/// Per member, the incarnation alive at the end (None: dead).
fn alive_at_end(h: &History<ViewsEvent>) -> BTreeMap<MemberId, u64> {
    let mut inc: BTreeMap<MemberId, Option<u64>> = (0..h.members).map(|m| (m, Some(1))).collect();
    for f in &h.faults {
        match f.fault {
            FaultNote::Crash { member } => {
                inc.insert(member, None);
            }
            FaultNote::Restart { member, incarnation } => {
                inc.insert(member, Some(incarnation));
            }
            _ => {}
        }
    }
    let stopped: BTreeSet<(MemberId, u64)> = h
        .entries
        .iter()
        .filter(|e| matches!(e.event, ViewsEvent::Removed { .. } | ViewsEvent::Minority { .. }))
        .map(|e| (e.member, e.incarnation))
        .collect();
    inc.into_iter().filter_map(|(m, i)| i.filter(|i| !stopped.contains(&(m, *i))).map(|i| (m, i))).collect()
}

/// Original members (first incarnation) running at the end: never
/// crashed, never stopped.
fn running(h: &History<ViewsEvent>) -> BTreeSet<MemberId> {
    let restarted: BTreeSet<MemberId> = h
        .faults
        .iter()
        .filter_map(|f| match f.fault {
            FaultNote::Restart { member, .. } => Some(member),
            _ => None,
        })
        .collect();
    alive_at_end(h).into_iter().filter(|(m, i)| *i == 1 && !restarted.contains(m)).map(|(m, _)| m).collect()
}

/// Per view, the members of each subgroup by its catalogue: view 0's is
/// the group the members start with (`initial`); later ones as installed
/// (the first installer's; `CatalogueAgreement` checks the rest agree).
fn catalogues(h: &History<ViewsEvent>, initial: &GroupConfig) -> BTreeMap<u64, Vec<Vec<MemberId>>> {
    let mut out = BTreeMap::new();
    out.insert(0, initial.subgroups.iter().map(|s| s.members.clone()).collect());
    for e in &h.entries {
        if let ViewsEvent::Installed { view, catalogue, .. } = &e.event {
            out.entry(*view).or_insert_with(|| catalogue.clone());
        }
    }
    out
}

/// Whether `m` is in subgroup `g` by view `v`'s catalogue.
fn in_catalogue(cats: &BTreeMap<u64, Vec<Vec<MemberId>>>, v: u64, g: usize, m: MemberId) -> bool {
    cats.get(&v).and_then(|c| c.get(g)).is_some_and(|ms| ms.contains(&m))
}

/// One catalogue per view; it only grows; a declared member is in every
/// later catalogue it installs.
struct CatalogueAgreement {
    initial: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for CatalogueAgreement {
    fn name(&self) -> &'static str {
        "one catalogue per view"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let cats = catalogues(h, &self.initial);
        let mut declared: BTreeSet<(MemberId, u64, usize)> = BTreeSet::new();
        for e in &h.entries {
            match &e.event {
                ViewsEvent::Installed { view, catalogue, .. } => {
                    if cats.get(view) != Some(catalogue) {
                        return violation(
                            self.name(),
                            format!(
                                "m{} installed view {view} with catalogue {catalogue:?}, others {:?}",
                                e.member,
                                cats.get(view)
                            ),
                        );
                    }
                    for &(m, inc, g) in &declared {
                        if m == e.member && inc == e.incarnation && !catalogue[g].contains(&m) {
                            return violation(
                                self.name(),
                                format!("m{m} declared into subgroup {g} but view {view} leaves it out"),
                            );
                        }
                    }
                }
                ViewsEvent::Declared { subgroup } => {
                    declared.insert((e.member, e.incarnation, *subgroup));
                }
                _ => {}
            }
        }
        let views: Vec<&Vec<Vec<MemberId>>> = cats.values().collect();
        for w in views.windows(2) {
            let grows = w[1].len() >= w[0].len() && w[0].iter().zip(w[1]).all(|(a, b)| b.starts_with(a));
            if !grows {
                return violation(self.name(), format!("the catalogue shrank: {:?} then {:?}", w[0], w[1]));
            }
        }
        Ok(())
    }
}

fn ordered(group: &GroupConfig, g: usize) -> bool {
    group.subgroups[g].mode == DeliveryMode::Ordered
}

struct Anomalies;

impl Checker<ViewsEvent> for Anomalies {
    fn name(&self) -> &'static str {
        "anomalies"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        for e in &h.entries {
            if let ViewsEvent::Anomaly { what } = &e.event {
                return violation(self.name(), format!("m{} at {} ns: {what}", e.member, e.time_ns));
            }
        }
        Ok(())
    }
}

struct ViewAgreement {
    group: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for ViewAgreement {
    fn name(&self) -> &'static str {
        "view agreement and partition safety"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let mut seen: BTreeMap<u64, Vec<MemberId>> = BTreeMap::new();
        seen.insert(0, self.group.members.clone());
        let mut last: BTreeMap<(MemberId, u64), u64> = BTreeMap::new();
        let mut stopped: BTreeSet<(MemberId, u64)> = BTreeSet::new();
        for e in &h.entries {
            let who = (e.member, e.incarnation);
            match &e.event {
                ViewsEvent::Installed { view, members, .. } => {
                    if stopped.contains(&who) {
                        return violation(
                            self.name(),
                            format!("m{} installed view {view} after it stopped", e.member),
                        );
                    }
                    // An original member starts in view 0; a joiner in the
                    // view that admitted it; then views follow one by one.
                    match last.get(&who) {
                        Some(prev) if *view != prev + 1 => {
                            return violation(
                                self.name(),
                                format!("m{} installed view {view} after view {prev}", e.member),
                            );
                        }
                        None if e.incarnation == 1 && *view != 1 => {
                            return violation(
                                self.name(),
                                format!("m{} installed view {view} after view 0", e.member),
                            );
                        }
                        _ => {}
                    }
                    last.insert(who, *view);
                    if let Some(other) = seen.get(view) {
                        if other != members {
                            return violation(
                                self.name(),
                                format!(
                                    "view {view}: m{} installed {members:?}, another member {other:?}",
                                    e.member
                                ),
                            );
                        }
                    } else {
                        seen.insert(*view, members.clone());
                    }
                    if !members.contains(&e.member) {
                        return violation(
                            self.name(),
                            format!("m{} installed view {view} without itself", e.member),
                        );
                    }
                    let Some(before) = seen.get(&(view - 1)) else { continue };
                    let kept = members.iter().filter(|m| before.contains(m)).count();
                    if kept < before.len() / 2 + 1 {
                        return violation(
                            self.name(),
                            format!(
                                "view {view} {members:?} keeps no majority of view {} {before:?}",
                                view - 1
                            ),
                        );
                    }
                }
                ViewsEvent::Removed { .. } | ViewsEvent::Minority { .. } => {
                    stopped.insert(who);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

struct Membership {
    group: Arc<GroupConfig>,
    initial: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for Membership {
    fn name(&self) -> &'static str {
        "delivery by members only"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let views = views(h, &self.group);
        let cats = catalogues(h, &self.initial);
        for e in &h.entries {
            if let ViewsEvent::Delivered { subgroup, sender, view, .. } = e.event {
                let Some(members) = views.get(&view) else {
                    return violation(self.name(), format!("m{} delivered in unknown view {view}", e.member));
                };
                let s = &self.group.subgroups[subgroup];
                let ok = members.contains(&e.member)
                    && members.contains(&sender)
                    && in_catalogue(&cats, view, subgroup, e.member)
                    && s.senders.contains(&sender);
                if !ok {
                    return violation(
                        self.name(),
                        format!(
                            "m{} delivered from m{sender} in subgroup {subgroup}, view {view} {members:?}",
                            e.member
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

pub(crate) struct Integrity {
    pub(crate) group: Arc<GroupConfig>,
    /// Messages are DDS samples ([`message`]).
    pub(crate) dds: bool,
}

impl Checker<ViewsEvent> for Integrity {
    fn name(&self) -> &'static str {
        "integrity, no duplication, FIFO"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let mut sent: BTreeMap<(usize, MemberId, u64), u64> = BTreeMap::new();
        let mut all_sent: BTreeSet<Msg> = BTreeSet::new();
        let mut got: BTreeSet<(MemberId, Msg)> = BTreeSet::new();
        let mut fifo: BTreeMap<(MemberId, usize, MemberId), u64> = BTreeMap::new();
        for e in &h.entries {
            match e.event {
                ViewsEvent::Sent { subgroup, index } => {
                    let next =
                        sent.entry((subgroup, e.member, e.incarnation)).or_insert((e.incarnation - 1) << 32);
                    if index != *next {
                        return violation(
                            self.name(),
                            format!("m{} sent index {index}, expected {next}", e.member),
                        );
                    }
                    *next += 1;
                    all_sent.insert((subgroup, e.member, index));
                }
                ViewsEvent::Delivered { subgroup, sender, index, digest, .. } => {
                    if !all_sent.contains(&(subgroup, sender, index)) {
                        return violation(
                            self.name(),
                            format!("m{} delivered unsent ({subgroup}, m{sender}, {index})", e.member),
                        );
                    }
                    let want = fnv64(&message(
                        self.dds,
                        subgroup,
                        sender,
                        index,
                        self.group.subgroups[subgroup].max_payload,
                    ));
                    if digest != want {
                        return violation(
                            self.name(),
                            format!(
                                "m{} delivered other bytes for ({subgroup}, m{sender}, {index})",
                                e.member
                            ),
                        );
                    }
                    if !got.insert((e.member, (subgroup, sender, index))) {
                        return violation(
                            self.name(),
                            format!("m{} delivered ({subgroup}, m{sender}, {index}) twice", e.member),
                        );
                    }
                    if ordered(&self.group, subgroup) {
                        let last = fifo.entry((e.member, subgroup, sender)).or_insert(0);
                        if index < *last {
                            return violation(
                                self.name(),
                                format!(
                                    "m{} delivered ({subgroup}, m{sender}, {index}) after index {}",
                                    e.member,
                                    *last - 1
                                ),
                            );
                        }
                        *last = index + 1;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

struct VirtualSynchrony {
    group: Arc<GroupConfig>,
    initial: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for VirtualSynchrony {
    fn name(&self) -> &'static str {
        "virtual synchrony and failure atomicity"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let all = deliveries(h);
        let views = views(h, &self.group);
        let cats = catalogues(h, &self.initial);
        for &v in views.keys() {
            let surv = survivors(h, v);
            if surv.is_empty() {
                continue;
            }
            for g in 0..self.group.subgroups.len() {
                let of = |m: MemberId| -> Vec<Msg> {
                    all.get(&m)
                        .map(|d| {
                            d.iter()
                                .filter(|(x, view, _)| *view == v && x.0 == g)
                                .map(|(x, _, _)| *x)
                                .collect()
                        })
                        .unwrap_or_default()
                };
                // Survivors that are in the subgroup deliver the same
                // sequence (ordered) or set (unordered: no guarantee
                // beyond integrity; skipped).
                if !ordered(&self.group, g) {
                    continue;
                }
                let in_g: Vec<MemberId> =
                    surv.iter().copied().filter(|m| in_catalogue(&cats, v, g, *m)).collect();
                let Some(&first) = in_g.first() else { continue };
                let reference = of(first);
                for &m in &in_g[1..] {
                    let seq = of(m);
                    if seq != reference {
                        return violation(
                            self.name(),
                            format!(
                                "view {v} subgroup {g}: survivors m{first} and m{m} delivered {reference:?} vs {seq:?}"
                            ),
                        );
                    }
                }
                // Anything anyone delivered in v is delivered by the survivors.
                let set: BTreeSet<Msg> = reference.iter().copied().collect();
                for (&m, d) in &all {
                    for (x, view, _) in d {
                        if *view == v && x.0 == g && !set.contains(x) {
                            return violation(
                                self.name(),
                                format!(
                                    "view {v}: m{m} delivered {x:?}, which survivor m{first} did not deliver in it"
                                ),
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

struct TotalOrder {
    group: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for TotalOrder {
    fn name(&self) -> &'static str {
        "total order across views"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let all = deliveries(h);
        for g in 0..self.group.subgroups.len() {
            if !ordered(&self.group, g) {
                continue;
            }
            let pos: Vec<(MemberId, BTreeMap<Msg, usize>)> = all
                .iter()
                .map(|(m, d)| {
                    let p = d
                        .iter()
                        .filter(|(x, _, _)| x.0 == g)
                        .enumerate()
                        .map(|(i, (x, _, _))| (*x, i))
                        .collect();
                    (*m, p)
                })
                .collect();
            for (i, (a, pa)) in pos.iter().enumerate() {
                for (b, pb) in &pos[i + 1..] {
                    // Common messages in a's order must be increasing in b's.
                    let mut common: Vec<(usize, usize, Msg)> =
                        pa.iter().filter_map(|(x, ia)| pb.get(x).map(|ib| (*ia, *ib, *x))).collect();
                    common.sort_unstable();
                    for w in common.windows(2) {
                        if w[1].1 < w[0].1 {
                            return violation(
                                self.name(),
                                format!(
                                    "subgroup {g}: m{a} delivered {:?} before {:?}, m{b} after",
                                    w[0].2, w[1].2
                                ),
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

struct NoLossForSurvivors {
    group: Arc<GroupConfig>,
    initial: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for NoLossForSurvivors {
    fn name(&self) -> &'static str {
        "no loss for survivors (resend)"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let run = running(h);
        let all = deliveries(h);
        let mut sent: BTreeMap<(usize, MemberId), u64> = BTreeMap::new();
        for e in &h.entries {
            if let ViewsEvent::Sent { subgroup, .. } = e.event {
                *sent.entry((subgroup, e.member)).or_insert(0) += 1;
            }
        }
        for (&(g, sender), &count) in &sent {
            if !run.contains(&sender) || !ordered(&self.group, g) {
                continue;
            }
            // A late subscriber got what came before it as state.
            for &m in run.iter().filter(|m| self.initial.subgroups[g].members.contains(m)) {
                let got: BTreeSet<u64> = all
                    .get(&m)
                    .map(|d| {
                        d.iter().filter(|(x, _, _)| x.0 == g && x.1 == sender).map(|(x, _, _)| x.2).collect()
                    })
                    .unwrap_or_default();
                if let Some(missing) = (0..count).find(|i| !got.contains(i)) {
                    return violation(
                        self.name(),
                        format!(
                            "m{m} never delivered message {missing} of m{sender} in subgroup {g} (both running at the end)"
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

struct Liveness {
    group: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for Liveness {
    fn name(&self) -> &'static str {
        "liveness"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        let alive = alive_at_end(h);
        let mut last_view: BTreeMap<(MemberId, u64), u64> = BTreeMap::new();
        let mut finished: BTreeSet<(MemberId, u64)> = BTreeSet::new();
        let mut final_state: BTreeMap<(MemberId, u64), Vec<(u64, u64)>> = BTreeMap::new();
        let mut dds_final: BTreeMap<(MemberId, u64), Vec<(u64, u64)>> = BTreeMap::new();
        for e in &h.entries {
            let who = (e.member, e.incarnation);
            match &e.event {
                ViewsEvent::Installed { view, .. } => {
                    last_view.insert(who, *view);
                }
                ViewsEvent::FinalState { state } => {
                    final_state.insert(who, state.clone());
                }
                ViewsEvent::DdsFinal { state } => {
                    dds_final.insert(who, state.clone());
                }
                ViewsEvent::Finished => {
                    finished.insert(who);
                }
                ViewsEvent::Resumed => {
                    finished.remove(&who);
                }
                _ => {}
            }
        }
        let in_view: Vec<(MemberId, u64)> = alive.iter().map(|(m, i)| (*m, *i)).collect();
        // Original members are in view 0 from the start; a joiner is in a
        // view once it installed one.
        let members: Vec<(MemberId, u64)> =
            in_view.iter().copied().filter(|w| w.1 == 1 || last_view.contains_key(w)).collect();
        if members.is_empty() {
            return Ok(());
        }
        let mut final_view = None;
        for w in &members {
            let v = last_view.get(w).copied().unwrap_or(0);
            if *final_view.get_or_insert(v) != v {
                return violation(
                    self.name(),
                    format!("running members end in different views ({last_view:?})"),
                );
            }
            if !finished.contains(w) {
                return violation(
                    self.name(),
                    format!("m{} (running, view {v}) is not finished at {} ns", w.0, h.end_ns),
                );
            }
        }
        // A live group lets every live joiner in.
        if let Some(w) = in_view.iter().find(|w| !members.contains(w)) {
            return violation(
                self.name(),
                format!("m{} (incarnation {}) never joined the live group", w.0, w.1),
            );
        }
        // At the end every member of a subgroup holds the same state.
        let final_members: Vec<MemberId> = h
            .entries
            .iter()
            .rev()
            .find_map(|e| match &e.event {
                ViewsEvent::Installed { view, members, .. } if Some(*view) == final_view => {
                    Some(members.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| self.group.members.clone());
        for (g, s) in self.group.subgroups.iter().enumerate() {
            if s.mode != DeliveryMode::Ordered {
                continue; // delivered on receipt: no common order, no common state
            }
            if !s.senders.iter().any(|m| final_members.contains(m)) {
                continue; // inactive in the final view: a joiner got no state for it yet
            }
            let states: Vec<(MemberId, (u64, u64))> = members
                .iter()
                .filter(|w| s.members.contains(&w.0) && final_members.contains(&w.0))
                .filter_map(|w| final_state.get(w).map(|st| (w.0, st[g])))
                .collect();
            if let Some((m0, first)) = states.first()
                && let Some((m, other)) = states.iter().find(|(_, st)| st != first)
            {
                return violation(
                    self.name(),
                    format!("subgroup {g}: m{m0} ends with state {first:?}, m{m} with {other:?}"),
                );
            }
            // `dds`: and the same topic state (delivered count, history).
            let topic: Vec<(MemberId, (u64, u64))> = members
                .iter()
                .filter(|w| s.members.contains(&w.0) && final_members.contains(&w.0))
                .filter_map(|w| dds_final.get(w).map(|st| (w.0, st[g])))
                .collect();
            if let Some((m0, first)) = topic.first()
                && let Some((m, other)) = topic.iter().find(|(_, st)| st != first)
            {
                return violation(
                    self.name(),
                    format!("topic {g}: m{m0} ends with (delivered, digest) {first:?}, m{m} with {other:?}"),
                );
            }
        }
        Ok(())
    }
}

struct StateTransferCheck {
    group: Arc<GroupConfig>,
}

impl Checker<ViewsEvent> for StateTransferCheck {
    fn name(&self) -> &'static str {
        "state transfer"
    }
    fn check(&self, h: &History<ViewsEvent>) -> Result<(), Violation> {
        // Per (view, subgroup): every member's snapshot at the join point.
        let mut snaps: Snaps = BTreeMap::new();
        for e in &h.entries {
            if let ViewsEvent::Snapshot { view, subgroup, count, digest } = e.event {
                snaps.entry((view, subgroup)).or_default().push((e.member, count, digest));
            }
        }
        for ((view, g), all) in &snaps {
            // Ordered subgroups: the same state at every member (virtual
            // synchrony); unordered ones deliver on receipt, in any order.
            if ordered(&self.group, *g)
                && let Some(other) = all.iter().find(|s| (s.1, s.2) != (all[0].1, all[0].2))
            {
                return violation(
                    self.name(),
                    format!(
                        "view {view} subgroup {g}: m{} snapshot {:?}, m{} {:?}",
                        all[0].0,
                        (all[0].1, all[0].2),
                        other.0,
                        (other.1, other.2)
                    ),
                );
            }
        }
        for e in &h.entries {
            if let ViewsEvent::Restored { view, subgroup, count, digest } = e.event {
                let ok = match snaps.get(&(view, subgroup)) {
                    Some(all) => all.iter().any(|s| (s.1, s.2) == (count, digest)),
                    None => (count, digest) == (0, 0),
                };
                if !ok {
                    return violation(
                        self.name(),
                        format!(
                            "joiner m{} restored ({count}, {digest:#x}) of subgroup {subgroup} at view {view}, not a state the members held ({:?})",
                            e.member,
                            snaps.get(&(view, subgroup))
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_carry_their_index_and_are_pure() {
        for k in [0u64, 1, 77] {
            let a = payload(1, 2, k, 40);
            assert_eq!(a, payload(1, 2, k, 40));
            assert!((8..=40).contains(&a.len()));
            assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), k);
        }
    }
}
