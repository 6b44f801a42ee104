//! The simulated world: members, their regions and links, the datagram
//! network, and one queue of timed events.
//!
//! # Invariants
//! - **Determinism.** Every choice is drawn from seeded [`SimRng`] streams;
//!   events are ordered by `(time, sequence number)`, the sequence number
//!   being assigned when the event is scheduled; every collection that is
//!   iterated is ordered (`BTreeMap`, `Vec`). So a world built from the same
//!   seed and driven by the same calls goes through the same states.
//! - **FIFO per pair.** A write from `src` to `dst` lands at a time no earlier
//!   than every earlier write from `src` to `dst` (equal times land in posting
//!   order). Pairs are independent, so writes to different peers reorder.
//! - **Nothing lands after a lost write.** A write that cannot be delivered
//!   (partition, dead or restarted peer) *breaks* its link: the link's queue
//!   is dropped, every later post to it is dropped too until the link is
//!   reconnected (to a new epoch), and [`FabricEvent::Suspected`] is raised
//!   `completion_timeout_ns` after the break. So a guard can never land
//!   without the data posted before it.
//! - **Signaled writes resolve exactly once**: a `Completed` (after landing
//!   plus an ack delay, in posting order per link) or a `Failed` when the link
//!   is declared down.
//! - **Bounded.** In-flight writes per link, pending signaled writes per link,
//!   datagram size and receive queues are bounded by [`SimConfig`]; a full
//!   link answers [`PostError::Backpressure`], a full receive queue drops
//!   (and counts) the datagram.
//! - **Crash** makes a member's current incarnation dead at once: its
//!   in-flight writes are dropped, writes in flight to it are lost (breaking
//!   the senders' links), its sockets and queued datagrams vanish. **Restart**
//!   gives it a new incarnation with a fresh zeroed region and links up to
//!   every peer's current incarnation; peers reach it only after their own
//!   link to it broke, was suspected and was reconnected.

use crate::clock::SimClock;
use crate::net::NetState;
use crate::rng::{SimRng, derive_seed, stream};
use ordo_fabric::{FabricEvent, FailureCause, MemberId, Region, WriteTag};
use std::collections::{BTreeMap, VecDeque};

/// The fabric's timing and limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    /// Smallest delay between posting a write and its landing.
    pub delay_min_ns: u64,
    /// Largest ordinary delay.
    pub delay_max_ns: u64,
    /// Probability (ppm) that a write is delayed by an extra spike.
    pub spike_ppm: u32,
    /// Largest extra spike delay.
    pub spike_max_ns: u64,
    /// Delay between a signaled write landing and its completion at the sender.
    pub ack_delay_min_ns: u64,
    /// Largest ack delay.
    pub ack_delay_max_ns: u64,
    /// Time after a link breaks until it is declared down (suspected).
    pub completion_timeout_ns: u64,
    /// Largest single write.
    pub max_write_len: usize,
    /// Most writes in flight (and most unresolved signaled writes) per link.
    pub max_inflight_per_link: usize,
    /// Probability (ppm) that a write lands in two steps, its lower part
    /// (up to a word boundary) first and the rest up to a delivery delay
    /// later: what a reader can see of a write on an address-ordered fabric
    /// (capability 8; this fabric claims it) while it is being applied. 0
    /// (the default): writes land whole, and no randomness is drawn for it.
    pub split_land_ppm: u32,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            delay_min_ns: 1_000,
            delay_max_ns: 20_000,
            spike_ppm: 2_000,
            spike_max_ns: 300_000,
            ack_delay_min_ns: 500,
            ack_delay_max_ns: 5_000,
            completion_timeout_ns: 500_000,
            max_write_len: 1 << 20,
            max_inflight_per_link: 4096,
            split_land_ppm: 0,
        }
    }
}

/// The datagram network's behaviour and limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// Smallest one-way delay of a datagram.
    pub delay_min_ns: u64,
    /// Largest ordinary delay (datagrams with different delays reorder).
    pub delay_max_ns: u64,
    /// Probability (ppm) of an extra spike delay.
    pub spike_ppm: u32,
    /// Largest extra spike delay.
    pub spike_max_ns: u64,
    /// Probability (ppm) that a datagram is lost.
    pub loss_ppm: u32,
    /// Probability (ppm) that a datagram is delivered twice.
    pub duplicate_ppm: u32,
    /// Receive queue capacity per socket; arrivals beyond it are dropped.
    pub queue_capacity: usize,
    /// Largest datagram payload.
    pub max_datagram_len: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            delay_min_ns: 5_000,
            delay_max_ns: 50_000,
            spike_ppm: 2_000,
            spike_max_ns: 500_000,
            loss_ppm: 20_000,
            duplicate_ppm: 10_000,
            queue_capacity: 256,
            max_datagram_len: 1472,
        }
    }
}

/// Everything that shapes a world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of members (ids `0..members`).
    pub members: u32,
    /// Length of every member's region in bytes.
    pub region_len: usize,
    /// The simulated fabric.
    pub fabric: FabricConfig,
    /// The simulated datagram network.
    pub net: NetConfig,
    /// Simulated CPU cost of one poll of a process (drawn per poll).
    pub poll_cost_min_ns: u64,
    /// Largest CPU cost of a poll.
    pub poll_cost_max_ns: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            members: 3,
            region_len: 64 * 1024,
            fabric: FabricConfig::default(),
            net: NetConfig::default(),
            poll_cost_min_ns: 100,
            poll_cost_max_ns: 2_000,
        }
    }
}

/// Counters of what happened in a world (reported after a run).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorldStats {
    /// Writes accepted by `post_write`.
    pub writes_posted: u64,
    /// Writes applied to the destination region (a split write once, when
    /// its last part lands).
    pub writes_landed: u64,
    /// Writes that landed in two steps (`FabricConfig::split_land_ppm`).
    pub writes_split: u64,
    /// Writes dropped because their link broke (partition, crash, restart).
    pub writes_lost: u64,
    /// Writes dropped because sender and receiver were in different views.
    pub writes_stale: u64,
    /// `Completed` events.
    pub completions: u64,
    /// `Failed` events.
    pub failed_writes: u64,
    /// `Suspected` events.
    pub suspicions: u64,
    /// Successful reconnects.
    pub reconnects: u64,
    /// Datagrams handed to the network.
    pub datagrams_sent: u64,
    /// Datagrams queued at their destination.
    pub datagrams_delivered: u64,
    /// Lost to random loss or a partition.
    pub datagrams_lost: u64,
    /// Datagrams sent twice by the network.
    pub datagrams_duplicated: u64,
    /// Dropped because the receive queue was full.
    pub datagrams_overflowed: u64,
    /// Dropped because no socket was bound at the destination (or it crashed).
    pub datagrams_unbound: u64,
}

/// The state of one direction of a link, as its sender sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// Writes are delivered.
    Up,
    /// A write was lost at `since_ns`; every post is dropped until the link
    /// is declared down at `since_ns + completion_timeout_ns`.
    Broken { since_ns: u64 },
    /// Suspected: posts are refused until a reconnect.
    Down,
}

#[derive(Debug)]
pub(crate) struct Link {
    /// The incarnation of the peer this link was connected to.
    pub(crate) peer_incarnation: u64,
    /// Bumped by every (re)connection; stale events carry an old epoch.
    pub(crate) epoch: u64,
    pub(crate) state: LinkState,
    /// Signaled writes posted and not yet completed or failed, in order.
    pub(crate) pending: VecDeque<WriteTag>,
}

#[derive(Debug)]
pub(crate) struct InFlightWrite {
    pub(crate) id: u64,
    /// The view of the endpoint that posted it.
    pub(crate) view: u64,
    pub(crate) offset: usize,
    pub(crate) bytes: Vec<u8>,
    pub(crate) signal: Option<WriteTag>,
    /// The last (or only) part of its write (split landing).
    pub(crate) last: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Flight {
    pub(crate) queue: VecDeque<InFlightWrite>,
    pub(crate) last_land_ns: u64,
    pub(crate) last_complete_ns: u64,
}

#[derive(Debug)]
pub(crate) struct MemberState {
    pub(crate) alive: bool,
    pub(crate) incarnation: u64,
    pub(crate) region: Region,
    pub(crate) events: VecDeque<FabricEvent>,
    /// The view whose region this member holds (0 until a view change).
    pub(crate) view: u64,
}

/// A fault-schedule step, carried through the event queue (see `sim.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NemesisAction {
    Tick,
    HealPair(MemberId, MemberId),
    HealSplit(Vec<MemberId>),
    Restart(MemberId),
    Calm,
}

#[derive(Debug)]
pub(crate) enum Event {
    Land { src: MemberId, dst: MemberId, id: u64 },
    Complete { src: MemberId, dst: MemberId, epoch: u64, tag: WriteTag },
    SuspectDue { src: MemberId, dst: MemberId, epoch: u64 },
    Deliver { id: u64 },
    Poll { member: MemberId },
    Timer { member: MemberId, incarnation: u64 },
    Nemesis(NemesisAction),
}

/// What a step of the world handed to the scheduler.
#[derive(Debug)]
pub(crate) enum Stepped {
    /// A network event, already applied.
    Network,
    Poll {
        member: MemberId,
        key: (u64, u64),
    },
    Timer {
        member: MemberId,
        incarnation: u64,
    },
    Nemesis(NemesisAction),
}

/// The whole simulated world. Shared by endpoints as `Arc<Mutex<World>>`
/// (never contended: a simulation runs in one thread).
#[derive(Debug)]
pub struct World {
    pub(crate) cfg: SimConfig,
    pub(crate) clock: SimClock,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    pub(crate) rng_fabric: SimRng,
    pub(crate) rng_net: SimRng,
    pub(crate) members: Vec<MemberState>,
    pub(crate) links: Vec<Link>,
    pub(crate) flights: Vec<Flight>,
    /// Symmetric partition counts per pair: cut while > 0.
    cuts: Vec<u32>,
    pub(crate) net: NetState,
    woken: Vec<bool>,
    pub(crate) next_id: u64,
    pub(crate) stats: WorldStats,
}

impl World {
    /// A world of `cfg.members` live members, all links up, every
    /// incarnation 1, drawing from streams derived from `seed`.
    pub fn new(cfg: SimConfig, seed: u64) -> World {
        assert!(cfg.members >= 1, "a world needs a member");
        assert!(cfg.fabric.delay_min_ns <= cfg.fabric.delay_max_ns, "fabric delay range");
        assert!(cfg.net.delay_min_ns <= cfg.net.delay_max_ns, "net delay range");
        assert!(cfg.poll_cost_min_ns <= cfg.poll_cost_max_ns, "poll cost range");
        assert!(
            cfg.fabric.max_inflight_per_link > 0 && cfg.net.queue_capacity > 0,
            "limits must be positive"
        );
        let n = cfg.members as usize;
        let members = (0..n)
            .map(|_| MemberState {
                alive: true,
                incarnation: 1,
                region: Region::new_heap(cfg.region_len),
                events: VecDeque::new(),
                view: 0,
            })
            .collect();
        let links = (0..n * n)
            .map(|_| Link { peer_incarnation: 1, epoch: 1, state: LinkState::Up, pending: VecDeque::new() })
            .collect();
        World {
            clock: SimClock::new(),
            seq: 0,
            queue: BTreeMap::new(),
            rng_fabric: SimRng::new(derive_seed(seed, stream::FABRIC)),
            rng_net: SimRng::new(derive_seed(seed, stream::NET)),
            members,
            links,
            flights: (0..n * n).map(|_| Flight::default()).collect(),
            cuts: vec![0; n * n],
            net: NetState::default(),
            woken: vec![false; n],
            next_id: 0,
            stats: WorldStats::default(),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// Current simulated time.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Counters so far.
    pub fn stats(&self) -> &WorldStats {
        &self.stats
    }

    /// Number of members.
    pub fn members(&self) -> u32 {
        self.cfg.members
    }

    /// Whether `member`'s current incarnation is alive.
    pub fn is_alive(&self, member: MemberId) -> bool {
        self.members[member as usize].alive
    }

    /// `member`'s current incarnation (the first is 1).
    pub fn incarnation(&self, member: MemberId) -> u64 {
        self.members[member as usize].incarnation
    }

    /// The region of `member`'s current incarnation.
    pub fn region(&self, member: MemberId) -> Region {
        self.members[member as usize].region.clone()
    }

    /// Whether the pair `a`-`b` is partitioned.
    pub fn is_cut(&self, a: MemberId, b: MemberId) -> bool {
        self.cuts[self.idx(a, b)] > 0
    }

    pub(crate) fn idx(&self, src: MemberId, dst: MemberId) -> usize {
        src as usize * self.cfg.members as usize + dst as usize
    }

    pub(crate) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(crate) fn wake(&mut self, member: MemberId) {
        self.woken[member as usize] = true;
    }

    /// Members that something happened to since the last call, in id order.
    pub(crate) fn take_woken(&mut self, out: &mut Vec<MemberId>) {
        for (m, w) in self.woken.iter_mut().enumerate() {
            if std::mem::take(w) {
                out.push(m as MemberId);
            }
        }
    }

    /// Schedules `event` at `time_ns` (clamped to now); returns its key.
    pub(crate) fn schedule(&mut self, time_ns: u64, event: Event) -> (u64, u64) {
        self.seq += 1;
        let key = (time_ns.max(self.now_ns()), self.seq);
        self.queue.insert(key, event);
        key
    }

    /// Time of the next event, if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.queue.first_key_value().map(|(k, _)| k.0)
    }

    /// Takes the next event due at or before `limit_ns`, advances the clock
    /// to it and applies it if it is a network event.
    pub(crate) fn step(&mut self, limit_ns: u64) -> Option<Stepped> {
        let (&key, _) = self.queue.first_key_value()?;
        if key.0 > limit_ns {
            return None;
        }
        let event = self.queue.remove(&key).expect("first key present");
        self.clock.advance_to(key.0);
        Some(match event {
            Event::Land { src, dst, id } => {
                self.on_land(src, dst, id);
                Stepped::Network
            }
            Event::Complete { src, dst, epoch, tag } => {
                self.on_complete(src, dst, epoch, tag);
                Stepped::Network
            }
            Event::SuspectDue { src, dst, epoch } => {
                self.on_suspect_due(src, dst, epoch);
                Stepped::Network
            }
            Event::Deliver { id } => {
                self.on_deliver(id);
                Stepped::Network
            }
            Event::Poll { member } => Stepped::Poll { member, key },
            Event::Timer { member, incarnation } => Stepped::Timer { member, incarnation },
            Event::Nemesis(action) => Stepped::Nemesis(action),
        })
    }

    /// Applies every event due up to `now + dt_ns` and moves the clock
    /// there. Only for worlds without processes (the conformance harness):
    /// scheduler events are discarded.
    pub fn advance_by(&mut self, dt_ns: u64) {
        let target = self.now_ns().saturating_add(dt_ns);
        while self.step(target).is_some() {}
        self.clock.advance_to(target);
        self.woken.iter_mut().for_each(|w| *w = false);
    }

    // ----- partitions -------------------------------------------------

    /// Cuts the pair `a`-`b` (counted: each cut needs its own heal). Writes
    /// in flight either way are lost and break their links.
    pub fn cut(&mut self, a: MemberId, b: MemberId) {
        assert_ne!(a, b, "a member cannot be cut from itself");
        let (i, j) = (self.idx(a, b), self.idx(b, a));
        self.cuts[i] += 1;
        self.cuts[j] += 1;
        for (x, y) in [(a, b), (b, a)] {
            let k = self.idx(x, y);
            let busy = !self.flights[k].queue.is_empty() || !self.links[k].pending.is_empty();
            if self.members[x as usize].alive && busy {
                self.break_link(x, y);
            }
        }
    }

    /// Undoes one [`cut`](Self::cut) of the pair.
    pub fn heal(&mut self, a: MemberId, b: MemberId) {
        let (i, j) = (self.idx(a, b), self.idx(b, a));
        self.cuts[i] = self.cuts[i].saturating_sub(1);
        self.cuts[j] = self.cuts[j].saturating_sub(1);
    }

    /// Cuts every pair with one member in `side` and the other outside it.
    pub fn split(&mut self, side: &[MemberId]) {
        for (a, b) in self.across(side) {
            self.cut(a, b);
        }
    }

    /// Undoes one [`split`](Self::split) with the same `side`.
    pub fn heal_split(&mut self, side: &[MemberId]) {
        for (a, b) in self.across(side) {
            self.heal(a, b);
        }
    }

    fn across(&self, side: &[MemberId]) -> Vec<(MemberId, MemberId)> {
        let mut pairs = Vec::new();
        for a in side.iter().copied() {
            for b in 0..self.cfg.members {
                if !side.contains(&b) {
                    pairs.push((a, b));
                }
            }
        }
        pairs
    }

    /// Removes every partition.
    pub fn heal_all(&mut self) {
        self.cuts.iter_mut().for_each(|c| *c = 0);
    }

    /// Stops random faults of the network: no more loss, duplicates or
    /// delay spikes (ordinary delays, hence reordering, stay).
    pub fn calm_network(&mut self) {
        self.cfg.net.loss_ppm = 0;
        self.cfg.net.duplicate_ppm = 0;
        self.cfg.net.spike_ppm = 0;
        self.cfg.fabric.spike_ppm = 0;
    }

    // ----- crash and restart ------------------------------------------

    /// Crashes `member`'s current incarnation (see the module invariants).
    pub fn crash(&mut self, member: MemberId) {
        let m = member as usize;
        if !self.members[m].alive {
            return;
        }
        self.members[m].alive = false;
        self.members[m].events.clear();
        self.woken[m] = false;
        for peer in 0..self.cfg.members {
            if peer == member {
                continue;
            }
            let out = self.idx(member, peer);
            self.stats.writes_lost += self.flights[out].queue.len() as u64;
            self.flights[out].queue.clear();
            self.links[out].pending.clear();
            self.links[out].state = LinkState::Down;
            let inc = self.idx(peer, member);
            let busy = !self.flights[inc].queue.is_empty() || !self.links[inc].pending.is_empty();
            if self.members[peer as usize].alive && busy {
                self.break_link(peer, member);
            }
        }
        self.net_crash(member);
    }

    /// Starts a new incarnation of a crashed `member` with a zeroed region;
    /// returns the incarnation. Panics if the member is alive (a bug).
    pub fn restart(&mut self, member: MemberId) -> u64 {
        let m = member as usize;
        assert!(!self.members[m].alive, "restart of live member {member}");
        let region = Region::new_heap(self.cfg.region_len);
        let state = &mut self.members[m];
        state.alive = true;
        state.incarnation += 1;
        state.region = region;
        state.events.clear();
        state.view = 0;
        for peer in 0..self.cfg.members {
            if peer == member {
                continue;
            }
            let peer_incarnation = self.members[peer as usize].incarnation;
            let out = self.idx(member, peer);
            let link = &mut self.links[out];
            link.peer_incarnation = peer_incarnation;
            link.epoch += 1;
            link.state = LinkState::Up;
            link.pending.clear();
        }
        self.members[m].incarnation
    }

    /// `member` moves to view `view` (a vsync view change): a new zeroed
    /// region (a new SST and ring layout, like a new registration), fresh
    /// outgoing links to every peer's current incarnation, and no pending
    /// events. Writes posted in another view never land in it: one in
    /// flight from an earlier view is dropped on arrival, one posted to a
    /// peer that has not reached this view yet is refused with
    /// back-pressure (the peer is still cleaning up; retry), one posted from
    /// an earlier view to a peer past it is dropped. Panics unless the
    /// member is alive and `view` is later than its current one.
    pub fn begin_view(&mut self, member: MemberId, view: u64) {
        let m = member as usize;
        assert!(self.members[m].alive, "view change of dead member {member}");
        assert!(view > self.members[m].view, "views only move forward");
        self.members[m].region = Region::new_heap(self.cfg.region_len);
        self.members[m].events.clear();
        self.members[m].view = view;
        for peer in 0..self.cfg.members {
            if peer == member {
                continue;
            }
            let peer_incarnation = self.members[peer as usize].incarnation;
            let out = self.idx(member, peer);
            self.stats.writes_lost += self.flights[out].queue.len() as u64;
            self.flights[out].queue.clear();
            let link = &mut self.links[out];
            link.peer_incarnation = peer_incarnation;
            link.epoch += 1;
            link.state = LinkState::Up;
            link.pending.clear();
        }
    }

    /// The view whose region `member` holds.
    pub fn view_of(&self, member: MemberId) -> u64 {
        self.members[member as usize].view
    }

    // ----- fabric internals -------------------------------------------

    /// Marks the link `src`→`dst` broken now (if it was up): drops its
    /// queue and schedules the suspicion.
    pub(crate) fn break_link(&mut self, src: MemberId, dst: MemberId) {
        let k = self.idx(src, dst);
        self.stats.writes_lost += self.flights[k].queue.len() as u64;
        self.flights[k].queue.clear();
        if self.links[k].state == LinkState::Up {
            let now = self.now_ns();
            self.links[k].state = LinkState::Broken { since_ns: now };
            let epoch = self.links[k].epoch;
            let due = now + self.cfg.fabric.completion_timeout_ns;
            self.schedule(due, Event::SuspectDue { src, dst, epoch });
            tracing::trace!(src, dst, now, "link broken");
        }
    }

    fn on_land(&mut self, src: MemberId, dst: MemberId, id: u64) {
        let k = self.idx(src, dst);
        if self.flights[k].queue.front().is_none_or(|w| w.id != id) {
            return; // dropped when its link broke
        }
        let write = self.flights[k].queue.pop_front().expect("front checked");
        let link = &self.links[k];
        // A queue is dropped whenever its delivery became impossible.
        assert_eq!(link.state, LinkState::Up, "write in flight on a link that is not up");
        assert!(
            self.members[dst as usize].alive
                && self.members[dst as usize].incarnation == link.peer_incarnation
                && !self.is_cut(src, dst),
            "write in flight to an unreachable peer"
        );
        if write.view == self.members[dst as usize].view {
            self.members[dst as usize].region.write_bytes(write.offset, &write.bytes);
            self.stats.writes_landed += u64::from(write.last);
            self.wake(dst);
        } else {
            // Posted in a view the destination has left: that region is
            // gone (the write still completes, as RDMA to a deregistered
            // region would fail only the new registration's users).
            self.stats.writes_stale += 1;
        }
        if let Some(tag) = write.signal {
            let epoch = self.links[k].epoch;
            let delay =
                self.rng_fabric.range(self.cfg.fabric.ack_delay_min_ns, self.cfg.fabric.ack_delay_max_ns);
            let at = (self.now_ns() + delay).max(self.flights[k].last_complete_ns);
            self.flights[k].last_complete_ns = at;
            self.schedule(at, Event::Complete { src, dst, epoch, tag });
        }
    }

    fn on_complete(&mut self, src: MemberId, dst: MemberId, epoch: u64, tag: WriteTag) {
        let k = self.idx(src, dst);
        let link = &mut self.links[k];
        if link.epoch != epoch || link.state != LinkState::Up || !self.members[src as usize].alive {
            return; // it fails when the link is declared down
        }
        if let Some(pos) = link.pending.iter().position(|t| *t == tag) {
            // Completions of one link are scheduled in posting order.
            assert_eq!(pos, 0, "completion out of posting order");
            link.pending.remove(pos);
            self.members[src as usize].events.push_back(FabricEvent::Completed { peer: dst, tag });
            self.stats.completions += 1;
            self.wake(src);
        }
    }

    fn on_suspect_due(&mut self, src: MemberId, dst: MemberId, epoch: u64) {
        let k = self.idx(src, dst);
        if self.links[k].epoch != epoch || !matches!(self.links[k].state, LinkState::Broken { .. }) {
            return;
        }
        if !self.members[src as usize].alive {
            return;
        }
        self.links[k].state = LinkState::Down;
        let pending = std::mem::take(&mut self.links[k].pending);
        let events = &mut self.members[src as usize].events;
        for tag in pending {
            events.push_back(FabricEvent::Failed { peer: dst, tag, cause: FailureCause::TimedOut });
            self.stats.failed_writes += 1;
        }
        events.push_back(FabricEvent::Suspected { peer: dst, cause: FailureCause::TimedOut });
        self.stats.suspicions += 1;
        tracing::debug!(src, dst, now = self.now_ns(), "peer suspected");
        self.wake(src);
    }
}
