//! [`SimFabric`]: a member's endpoint on the simulated fabric, implementing
//! [`ordo_fabric::Fabric`].
//!
//! # Invariants (on top of the world's, see `world.rs`)
//! - A posted write's bytes are captured from the poster's region *at post
//!   time*; changing the local region afterwards does not change the write.
//! - Writes land through [`Region::write_bytes`], i.e. with
//!   [`ordo_fabric::copy_untorn`]: no torn aligned words.
//! - Posting never partially applies: every error leaves the world as it was.
//! - `reconnect` succeeds only on a link that was declared down and only
//!   while the peer is alive and not partitioned from this member; it then
//!   connects to the peer's *current* incarnation and reports
//!   [`FabricEvent::Reconnected`].
//! - An endpoint belongs to one incarnation of its member: after that
//!   incarnation crashed, it posts nothing (`PeerSuspected`), reports no
//!   events and cannot reconnect. Clones of an endpoint share everything.
//! - A batch ([`Fabric::post_writes`]) draws one delivery delay: its writes
//!   land together, in order, as behind one doorbell.
//! - There is no doorbell: the simulator itself wakes the member when a write
//!   lands in its region.

use crate::world::{InFlightWrite, LinkState, World};
use ordo_fabric::{
    Doorbell, Fabric, FabricEvent, MemberId, PartialPost, PostError, ReconnectError, Region, Write,
    check_range,
};
use std::fmt;
use std::sync::{Arc, Mutex};

impl World {
    fn current_view(&self, member: MemberId, incarnation: u64, view: u64) -> bool {
        self.current(member, incarnation) && self.members[member as usize].view == view
    }

    fn current(&self, member: MemberId, incarnation: u64) -> bool {
        let m = &self.members[member as usize];
        m.alive && m.incarnation == incarnation
    }

    pub(crate) fn fabric_post(
        &mut self,
        member: MemberId,
        incarnation: u64,
        view: u64,
        w: Write,
    ) -> Result<(), PostError> {
        self.fabric_post_in(member, incarnation, view, w, &mut None)
    }

    /// Posts `ranges` to `peer` as one batch: one delivery delay drawn for
    /// all of them (they land together, in order), as one doorbell would.
    pub(crate) fn fabric_post_batch(
        &mut self,
        member: MemberId,
        incarnation: u64,
        view: u64,
        peer: MemberId,
        ranges: &[(usize, usize)],
    ) -> Result<(), PartialPost> {
        let mut delay = None;
        for (posted, &(offset, len)) in ranges.iter().enumerate() {
            self.fabric_post_in(member, incarnation, view, Write::new(peer, offset, len), &mut delay)
                .map_err(|error| PartialPost { posted, error })?;
        }
        Ok(())
    }

    /// One write; `delay` is the batch's delivery delay (drawn by its first
    /// write that travels).
    fn fabric_post_in(
        &mut self,
        member: MemberId,
        incarnation: u64,
        view: u64,
        w: Write,
        delay: &mut Option<u64>,
    ) -> Result<(), PostError> {
        if w.peer == member || w.peer >= self.cfg.members {
            return Err(PostError::UnknownPeer(w.peer));
        }
        check_range(w.offset, w.len, self.cfg.region_len)?;
        let max = self.cfg.fabric.max_write_len;
        if w.len > max {
            return Err(PostError::TooLarge { len: w.len, max });
        }
        if !self.current(member, incarnation) || self.members[member as usize].view != view {
            // A crashed incarnation's endpoint, or one of a view left.
            return Err(PostError::PeerSuspected(w.peer));
        }
        let k = self.idx(member, w.peer);
        let peer = &self.members[w.peer as usize];
        if peer.alive && !self.is_cut(member, w.peer) && self.links[k].state == LinkState::Up {
            if peer.view < view {
                // The peer has not installed this view yet: retry.
                return Err(PostError::Backpressure(w.peer));
            }
            if peer.view > view {
                // The peer left this view: nobody reads the write.
                self.stats.writes_stale += 1;
                return Ok(());
            }
        }
        let limit = self.cfg.fabric.max_inflight_per_link;
        match self.links[k].state {
            LinkState::Down => return Err(PostError::PeerSuspected(w.peer)),
            _ if self.flights[k].queue.len() >= limit || self.links[k].pending.len() >= limit => {
                return Err(PostError::Backpressure(w.peer));
            }
            _ => {}
        }
        // From here on the post is accepted.
        self.stats.writes_posted += 1;
        if let Some(tag) = w.signal {
            self.links[k].pending.push_back(tag);
        }
        if matches!(self.links[k].state, LinkState::Broken { .. }) {
            self.stats.writes_lost += 1;
            return Ok(());
        }
        let dst = &self.members[w.peer as usize];
        if self.is_cut(member, w.peer) || !dst.alive || dst.incarnation != self.links[k].peer_incarnation {
            self.stats.writes_lost += 1;
            self.break_link(member, w.peer);
            return Ok(());
        }
        let mut bytes = vec![0u8; w.len];
        self.members[member as usize].region.read_bytes(w.offset, &mut bytes);
        let delay = match *delay {
            Some(d) => d,
            None => {
                let f = &self.cfg.fabric;
                let mut d = self.rng_fabric.range(f.delay_min_ns, f.delay_max_ns);
                if self.rng_fabric.chance(f.spike_ppm) {
                    d += self.rng_fabric.range(0, f.spike_max_ns);
                }
                *delay = Some(d);
                d
            }
        };
        let land = (self.now_ns() + delay).max(self.flights[k].last_land_ns);
        // Split landing (capability 8 as a reader sees it): the lower part
        // at `land`, the rest later — in posting order, before any later
        // write. The cut is at a word boundary of the region, so no word
        // tears (guarantee 2); a signal goes with the last part.
        let ppm = self.cfg.fabric.split_land_ppm;
        let cut = if ppm > 0 && w.len >= 16 && self.rng_fabric.chance(ppm) {
            let first = (w.offset + 8).next_multiple_of(8) - w.offset;
            let last = (w.offset + w.len - 1) / 8 * 8 - w.offset;
            (first <= last)
                .then(|| first + 8 * self.rng_fabric.range(0, ((last - first) / 8) as u64) as usize)
        } else {
            None
        };
        let mut parts = Vec::with_capacity(2);
        match cut {
            Some(cut) => {
                let later = land + self.rng_fabric.range(0, delay);
                let upper = bytes[cut..].to_vec();
                let mut lower = bytes;
                lower.truncate(cut);
                parts.push((land, w.offset, lower, None, false));
                parts.push((later, w.offset + cut, upper, w.signal, true));
                self.stats.writes_split += 1;
            }
            None => parts.push((land, w.offset, bytes, w.signal, true)),
        }
        for (at, offset, bytes, signal, last) in parts {
            self.flights[k].last_land_ns = at;
            let id = self.fresh_id();
            self.flights[k].queue.push_back(InFlightWrite { id, view, offset, bytes, signal, last });
            self.schedule(at, crate::world::Event::Land { src: member, dst: w.peer, id });
        }
        Ok(())
    }

    pub(crate) fn fabric_reconnect(
        &mut self,
        member: MemberId,
        incarnation: u64,
        peer: MemberId,
    ) -> Result<u64, ReconnectError> {
        if peer == member || peer >= self.cfg.members {
            return Err(ReconnectError::UnknownPeer(peer));
        }
        if !self.current(member, incarnation) {
            return Err(ReconnectError::Unreachable(peer, "this endpoint's member crashed".into()));
        }
        let k = self.idx(member, peer);
        match self.links[k].state {
            LinkState::Up => Ok(self.links[k].peer_incarnation),
            LinkState::Broken { .. } => Err(ReconnectError::Unreachable(
                peer,
                "link failure not yet detected; wait for Suspected".into(),
            )),
            LinkState::Down if !self.members[peer as usize].alive => {
                Err(ReconnectError::Unreachable(peer, "peer is dead".into()))
            }
            LinkState::Down if self.is_cut(member, peer) => {
                Err(ReconnectError::Unreachable(peer, "peer is partitioned away".into()))
            }
            LinkState::Down => {
                let peer_incarnation = self.members[peer as usize].incarnation;
                let link = &mut self.links[k];
                debug_assert!(link.pending.is_empty() && self.flights[k].queue.is_empty());
                link.epoch += 1;
                link.peer_incarnation = peer_incarnation;
                link.state = LinkState::Up;
                self.members[member as usize]
                    .events
                    .push_back(FabricEvent::Reconnected { peer, incarnation: peer_incarnation });
                self.stats.reconnects += 1;
                tracing::debug!(member, peer, peer_incarnation, now = self.now_ns(), "reconnected");
                Ok(peer_incarnation)
            }
        }
    }

    pub(crate) fn fabric_poll(
        &mut self,
        member: MemberId,
        incarnation: u64,
        view: u64,
        out: &mut Vec<FabricEvent>,
    ) {
        if self.current_view(member, incarnation, view) {
            out.extend(self.members[member as usize].events.drain(..));
        }
    }

    pub(crate) fn fabric_suspects(&self, member: MemberId, incarnation: u64, peer: MemberId) -> bool {
        if !self.current(member, incarnation) {
            return true;
        }
        peer != member
            && peer < self.cfg.members
            && self.links[self.idx(member, peer)].state == LinkState::Down
    }
}

/// One member's endpoint (of one incarnation) on the simulated fabric.
#[derive(Clone)]
pub struct SimFabric {
    member: MemberId,
    incarnation: u64,
    view: u64,
    peers: Vec<MemberId>,
    region: Region,
    world: Arc<Mutex<World>>,
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFabric")
            .field("member", &self.member)
            .field("incarnation", &self.incarnation)
            .finish()
    }
}

impl SimFabric {
    /// The endpoint of `member`'s current incarnation.
    pub fn attach(world: &Arc<Mutex<World>>, member: MemberId) -> SimFabric {
        let w = world.lock().expect("world lock");
        assert!(member < w.members(), "member {member} does not exist");
        SimFabric {
            member,
            incarnation: w.incarnation(member),
            view: w.view_of(member),
            peers: (0..w.members()).filter(|p| *p != member).collect(),
            region: w.region(member),
            world: world.clone(),
        }
    }

    /// The endpoint of `member` in view `view`: the member moves to that
    /// view ([`World::begin_view`]: a new zeroed region, fresh links); its
    /// endpoints of earlier views post nothing more and report no events.
    pub fn open_view(world: &Arc<Mutex<World>>, member: MemberId, view: u64) -> SimFabric {
        world.lock().expect("world lock").begin_view(member, view);
        SimFabric::attach(world, member)
    }

    /// The view this endpoint belongs to.
    pub fn view(&self) -> u64 {
        self.view
    }

    /// One endpoint per member of `world`, element `i` for member `i`.
    pub fn attach_all(world: &Arc<Mutex<World>>) -> Vec<SimFabric> {
        let n = world.lock().expect("world lock").members();
        (0..n).map(|m| SimFabric::attach(world, m)).collect()
    }

    /// The incarnation this endpoint belongs to.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The world this endpoint lives in.
    pub fn world(&self) -> &Arc<Mutex<World>> {
        &self.world
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().expect("world lock")
    }
}

impl Fabric for SimFabric {
    fn member(&self) -> MemberId {
        self.member
    }

    fn peers(&self) -> &[MemberId] {
        &self.peers
    }

    fn region(&self) -> &Region {
        &self.region
    }

    fn post_write(&mut self, write: Write) -> Result<(), PostError> {
        self.lock().fabric_post(self.member, self.incarnation, self.view, write)
    }

    fn post_writes(&mut self, peer: MemberId, ranges: &[(usize, usize)]) -> Result<(), PartialPost> {
        self.lock().fabric_post_batch(self.member, self.incarnation, self.view, peer, ranges)
    }

    /// A simulated write lands all at once.
    fn address_ordered(&self) -> bool {
        true
    }

    /// The peer's region of this view, while the peer is alive in it: the
    /// simulated host shares memory (zero-copy reads see stores at once).
    fn peer_region(&self, peer: MemberId) -> Option<Region> {
        let w = self.lock();
        (peer != self.member
            && peer < w.members()
            && w.is_alive(peer)
            && w.view_of(peer) == self.view
            && w.view_of(self.member) == self.view)
            .then(|| w.region(peer))
    }

    fn poll_events(&mut self, events: &mut Vec<FabricEvent>) {
        self.lock().fabric_poll(self.member, self.incarnation, self.view, events)
    }

    fn doorbell(&self) -> Option<&Doorbell> {
        None
    }

    fn is_suspected(&self, peer: MemberId) -> bool {
        self.lock().fabric_suspects(self.member, self.incarnation, peer)
    }

    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError> {
        self.lock().fabric_reconnect(self.member, self.incarnation, peer)
    }
}
