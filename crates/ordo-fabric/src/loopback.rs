//! An in-process fabric that applies every write synchronously: a test
//! double for unit tests of the layers above (SST, rings), where the
//! transport is not what is being tested. It has no failures, no doorbell
//! and no completions; real backends and the simulator cover those.
//!
//! # Invariants
//! Writes are copied with [`copy_untorn`] at post time, so FIFO and untorn
//! words hold trivially.

use crate::{
    Doorbell, Fabric, FabricEvent, MemberId, PostError, ReconnectError, Region, Write, check_range,
    copy_untorn,
};

/// One member's endpoint of a loopback group.
pub struct Loopback {
    me: MemberId,
    peers: Vec<MemberId>,
    regions: Vec<Region>,
}

/// `n` endpoints (members `0..n`) sharing `n` heap regions of `len` bytes.
pub fn loopback_group(n: usize, len: usize) -> Vec<Loopback> {
    let regions: Vec<Region> = (0..n).map(|_| Region::new_heap(len)).collect();
    (0..n as MemberId)
        .map(|me| Loopback {
            me,
            peers: (0..n as MemberId).filter(|p| *p != me).collect(),
            regions: regions.clone(),
        })
        .collect()
}

impl Loopback {
    /// Another member's region (tests inspect it directly).
    pub fn region_of(&self, member: MemberId) -> &Region {
        &self.regions[member as usize]
    }
}

impl Fabric for Loopback {
    fn member(&self) -> MemberId {
        self.me
    }
    fn peers(&self) -> &[MemberId] {
        &self.peers
    }
    fn region(&self) -> &Region {
        &self.regions[self.me as usize]
    }
    fn post_write(&mut self, w: Write) -> Result<(), PostError> {
        if !self.peers.contains(&w.peer) {
            return Err(PostError::UnknownPeer(w.peer));
        }
        check_range(w.offset, w.len, self.region().len())?;
        let src = self.regions[self.me as usize].as_ptr();
        let dst = self.regions[w.peer as usize].as_ptr();
        // SAFETY: distinct heap regions of the same length; range checked.
        unsafe { copy_untorn(dst.add(w.offset), src.add(w.offset), w.len) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        Ok(())
    }
    fn address_ordered(&self) -> bool {
        cfg!(target_arch = "x86_64")
    }
    fn peer_region(&self, peer: MemberId) -> Option<Region> {
        self.peers.contains(&peer).then(|| self.regions[peer as usize].clone())
    }
    fn poll_events(&mut self, _: &mut Vec<FabricEvent>) {}
    fn doorbell(&self) -> Option<&Doorbell> {
        None
    }
    fn is_suspected(&self, _: MemberId) -> bool {
        false
    }
    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError> {
        Err(ReconnectError::Unreachable(peer, "loopback links never fail".into()))
    }
}
