//! The ordered push backlog every engine driver posts through.
//!
//! An engine asks for *pushes* (byte ranges of its own region, each to a
//! list of peers or one peer); a driver queues them here and posts them to
//! the fabric. Both the runtime's agents and the simulator's processes post
//! through this one type (via the engines' drivers), so the order and the
//! back-pressure rule that the simulation checks are the ones that run.
//!
//! # Invariants
//! - Each peer gets the pushes that target it in the order they were added
//!   (FIFO per peer), posted as **one batch per peer** with
//!   [`Fabric::post_writes`] (one fence and one doorbell on shm, one send on
//!   tcp). A batch a peer refuses part-way with back-pressure resumes, for
//!   that peer, at the first range not posted; nothing behind it reaches
//!   that peer first. Peers do not wait for each other: there is no order
//!   between writes to different peers (there is none on RDMA either).
//! - Callers do not poll their engine again while the backlog is not empty:
//!   a write captures its bytes when posted, and a later poll may advance a
//!   ring counter that a held-back counter write would then carry ahead of
//!   its data (found by the vsync simulation). So the backlog holds at most
//!   one poll's pushes.
//! - Posting to a suspected peer is skipped (the engine learns of the
//!   failure through the fabric's events), and [`PushBacklog::forget_peer`]
//!   drops what was held back for a peer once it is suspected: a write
//!   planned for the failed link must never reach a reconnected one, where
//!   the engine re-pushes what the new incarnation needs. Any other post
//!   error means the engine emitted an invalid push, a bug, and panics.
//! - Every target of a push is one of the fabric's peers (asserted).
//! - Posting allocates nothing once the scratch lists have grown to one
//!   poll's size. A fresh queue whose pushes each go to one peer, no peer
//!   twice (a slot per follower, an ack), is posted push by push: each is
//!   that peer's whole batch, so the rules above hold unchanged.

use crate::{Fabric, MemberId, PartialPost, PostError};

/// A write an engine asks for: a byte range of the local region.
pub trait PushRange: Copy + std::fmt::Debug {
    /// (region offset, length in bytes).
    fn range(&self) -> (usize, usize);
}

/// Whom one push goes to.
pub enum Targets<'t> {
    /// A list of peers (a subgroup's, the whole group's).
    Many(&'t [MemberId]),
    /// One peer.
    One(MemberId),
}

impl Targets<'_> {
    fn contains(&self, peer: MemberId) -> bool {
        match self {
            Targets::Many(list) => list.contains(&peer),
            Targets::One(p) => *p == peer,
        }
    }

    fn len(&self) -> usize {
        match self {
            Targets::Many(list) => list.len(),
            Targets::One(_) => 1,
        }
    }
}

/// One poll's pushes, and for each peer the first of them it has not got.
#[derive(Debug)]
pub struct PushBacklog<P> {
    queue: Vec<P>,
    /// The fabric's peers and, for each, the index in `queue` of the next
    /// push not yet posted (or skipped) to it.
    cursors: Vec<(MemberId, usize)>,
    /// Peers suspected while pushes were held back: skipped from now on for
    /// the pushes already queued (cleared once the queue drains).
    forgotten: Vec<MemberId>,
    /// Scratch: one peer's batch, and the queue index of each range in it.
    ranges: Vec<(usize, usize)>,
    at: Vec<usize>,
}

impl<P: PushRange> Default for PushBacklog<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: PushRange> PushBacklog<P> {
    /// An empty backlog.
    pub fn new() -> Self {
        PushBacklog {
            queue: Vec::new(),
            cursors: Vec::new(),
            forgotten: Vec::new(),
            ranges: Vec::new(),
            at: Vec::new(),
        }
    }

    /// Whether every queued push reached all of its targets.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Pushes not yet posted to all of their targets.
    pub fn len(&self) -> usize {
        let done = self.cursors.iter().map(|c| c.1).min().unwrap_or(0);
        self.queue.len() - done.min(self.queue.len())
    }

    /// Queues the pushes of one engine poll (draining `pushes`).
    pub fn extend(&mut self, pushes: &mut Vec<P>) {
        self.queue.append(pushes);
    }

    /// Drops every queued write to `peer` (it was suspected): the pushes
    /// already queued skip it from now on.
    pub fn forget_peer(&mut self, peer: MemberId) {
        if !self.queue.is_empty() && !self.forgotten.contains(&peer) {
            self.forgotten.push(peer);
        }
    }

    /// Posts each peer its batch (see the module invariants); returns the
    /// writes posted (or skipped for a suspected or forgotten peer). What a
    /// peer refused with back-pressure stays for the next call.
    pub fn post<'t, F: Fabric + ?Sized>(
        &mut self,
        fabric: &mut F,
        targets: impl Fn(&P) -> Targets<'t>,
    ) -> usize {
        if self.queue.is_empty() {
            self.forgotten.clear();
            return 0;
        }
        // The common case: a fresh queue whose pushes each go to one peer,
        // no peer twice (a leader's slot per follower, an ack). Each
        // peer's batch is its one push; a peer that refuses it keeps it:
        // the cursors then say so, and the next call takes the general
        // path below from there.
        if self.cursors.is_empty() && self.forgotten.is_empty() && self.queue.len() <= 8 {
            let mut single = [0 as MemberId; 8];
            let distinct = self.queue.iter().enumerate().all(|(i, push)| match targets(push) {
                Targets::One(p) if !single[..i].contains(&p) => {
                    single[i] = p;
                    true
                }
                _ => false,
            });
            if distinct {
                let n = self.queue.len();
                let mut refused = [false; 8];
                for i in 0..n {
                    let peer = single[i];
                    assert!(
                        fabric.peers().contains(&peer),
                        "the engine emitted a push to {peer}, not a peer"
                    );
                    let result = fabric.post_writes(peer, &[self.queue[i].range()]);
                    refused[i] = refused_after(result, peer, |_| self.queue[i]).is_some();
                }
                let posted = refused[..n].iter().filter(|r| !**r).count();
                if posted == n {
                    self.queue.clear();
                } else {
                    // A refused peer's next push is its one push; every
                    // other peer is done with this queue.
                    let next = |p: MemberId| (0..n).find(|&i| refused[i] && single[i] == p).unwrap_or(n);
                    self.cursors.extend(fabric.peers().iter().map(|&p| (p, next(p))));
                }
                return posted;
            }
        }
        // On the first call for this queue, count the (push, target) pairs:
        // the batches must cover every one of them.
        let mut expected = None;
        if self.cursors.is_empty() {
            self.cursors.extend(fabric.peers().iter().map(|&p| (p, 0)));
            let mut n = 0;
            for push in &self.queue {
                n += targets(push).len();
            }
            expected = Some(n);
        }
        let mut posted = 0;
        let mut matched = 0;
        for c in 0..self.cursors.len() {
            let (peer, from) = self.cursors[c];
            if from == self.queue.len() {
                continue;
            }
            self.ranges.clear();
            self.at.clear();
            for (i, push) in self.queue.iter().enumerate().skip(from) {
                if targets(push).contains(peer) {
                    self.ranges.push(push.range());
                    self.at.push(i);
                }
            }
            matched += self.ranges.len();
            let mut next = self.queue.len();
            if self.ranges.is_empty() || self.forgotten.contains(&peer) {
                posted += self.ranges.len();
            } else {
                let result = fabric.post_writes(peer, &self.ranges);
                match refused_after(result, peer, |n| self.queue[self.at[n]]) {
                    None => posted += self.ranges.len(),
                    Some(n) => {
                        posted += n;
                        next = self.at[n];
                    }
                }
            }
            self.cursors[c].1 = next;
        }
        if let Some(n) = expected {
            assert_eq!(matched, n, "the engine emitted a push to a member that is not a peer of this fabric");
        }
        if self.cursors.iter().all(|c| c.1 == self.queue.len()) {
            self.queue.clear();
            self.cursors.clear();
            self.forgotten.clear();
        }
        posted
    }
}

/// What became of one peer's batch: `None` when every range was posted
/// (or skipped: the peer is suspected, see the module invariants),
/// `Some(n)` when back-pressure refused it after its first `n` ranges.
/// Any other error means the engine emitted an invalid push (`push(n)`,
/// the range that failed): a bug, and a panic.
fn refused_after<P: std::fmt::Debug>(
    result: Result<(), PartialPost>,
    peer: MemberId,
    push: impl FnOnce(usize) -> P,
) -> Option<usize> {
    match result {
        Ok(()) | Err(PartialPost { error: PostError::PeerSuspected(_), .. }) => None,
        Err(PartialPost { posted, error: PostError::Backpressure(_) }) => Some(posted),
        Err(PartialPost { posted, error }) => {
            panic!("the engine emitted an invalid push {:?} to {peer}: {error}", push(posted))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback::{Loopback, loopback_group};
    use crate::{Doorbell, FabricEvent, ReconnectError, Region, Write};

    #[derive(Clone, Copy, Debug)]
    struct TestPush {
        offset: usize,
        len: usize,
    }

    impl PushRange for TestPush {
        fn range(&self) -> (usize, usize) {
            (self.offset, self.len)
        }
    }

    /// Loopback that accepts `allow` more posts (all if `None`), then
    /// refuses with back-pressure; records what it applied.
    struct Flaky {
        inner: Loopback,
        allow: Option<usize>,
        applied: Vec<(MemberId, usize)>,
        /// (peer, ranges) of every batch asked for.
        batches: Vec<(MemberId, usize)>,
    }

    impl Fabric for Flaky {
        fn member(&self) -> MemberId {
            self.inner.member()
        }
        fn peers(&self) -> &[MemberId] {
            self.inner.peers()
        }
        fn region(&self) -> &Region {
            self.inner.region()
        }
        fn post_write(&mut self, w: Write) -> Result<(), PostError> {
            match &mut self.allow {
                Some(0) => return Err(PostError::Backpressure(w.peer)),
                Some(n) => *n -= 1,
                None => {}
            }
            self.applied.push((w.peer, w.offset));
            self.inner.post_write(w)
        }
        fn post_writes(&mut self, peer: MemberId, ranges: &[(usize, usize)]) -> Result<(), PartialPost> {
            self.batches.push((peer, ranges.len()));
            for (posted, &(offset, len)) in ranges.iter().enumerate() {
                self.post_write(Write::new(peer, offset, len))
                    .map_err(|error| PartialPost { posted, error })?;
            }
            Ok(())
        }
        fn poll_events(&mut self, e: &mut Vec<FabricEvent>) {
            self.inner.poll_events(e)
        }
        fn doorbell(&self) -> Option<&Doorbell> {
            None
        }
        fn is_suspected(&self, p: MemberId) -> bool {
            self.inner.is_suspected(p)
        }
        fn reconnect(&mut self, p: MemberId) -> Result<u64, ReconnectError> {
            self.inner.reconnect(p)
        }
    }

    fn push(offset: usize) -> TestPush {
        TestPush { offset, len: 8 }
    }

    #[test]
    fn back_pressure_holds_the_front_and_nothing_overtakes_it() {
        let inner = loopback_group(3, 1024).remove(0);
        let mut f = Flaky { inner, allow: None, applied: Vec::new(), batches: Vec::new() };
        let mut b = PushBacklog::new();
        let peers = [1, 2];
        b.extend(&mut vec![push(0), push(64)]);
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 4);
        assert_eq!(f.applied, vec![(1, 0), (1, 64), (2, 0), (2, 64)], "one batch per peer, in order");
        assert_eq!(f.batches, vec![(1, 2), (2, 2)]);
        assert!(b.is_empty());

        // Peer 1's batch is refused after its first write, peer 2's is not:
        // peer 1 resumes at the second push without re-posting the first,
        // and peer 2 did not wait for it.
        f.applied.clear();
        b.extend(&mut vec![push(128), push(192)]);
        f.allow = Some(1);
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 1);
        assert_eq!(f.applied, vec![(1, 128)]);
        assert_eq!(b.len(), 2, "no push reached every target");
        f.allow = None;
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 3);
        assert_eq!(f.applied, vec![(1, 128), (1, 192), (2, 128), (2, 192)]);
        assert!(b.is_empty());

        // Peer 2 is refused outright: peer 1 gets everything meanwhile.
        f.applied.clear();
        b.extend(&mut vec![push(320), push(384)]);
        f.allow = Some(2);
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 2);
        assert_eq!(b.len(), 2);
        f.allow = None;
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 2);
        assert_eq!(f.applied, vec![(1, 320), (1, 384), (2, 320), (2, 384)]);

        // A single-peer target.
        b.extend(&mut vec![push(256)]);
        assert_eq!(b.post(&mut f, |_| Targets::One(2)), 1);
        assert_eq!(f.applied.last(), Some(&(2, 256)));
    }

    /// One push to each of several peers (a leader's slot per follower):
    /// posted one batch per peer; a peer that refuses keeps its push, and
    /// the next call posts it alone, without re-posting the others'.
    #[test]
    fn one_push_per_peer_posts_each_once_and_keeps_a_refused_one() {
        let inner = loopback_group(3, 1024).remove(0);
        let mut f = Flaky { inner, allow: None, applied: Vec::new(), batches: Vec::new() };
        let mut b = PushBacklog::new();
        let to = |p: &TestPush| Targets::One(if p.offset < 512 { 1 } else { 2 });
        b.extend(&mut vec![push(0), push(512)]);
        assert_eq!(b.post(&mut f, to), 2);
        assert_eq!(f.applied, vec![(1, 0), (2, 512)]);
        assert_eq!(f.batches, vec![(1, 1), (2, 1)]);
        assert!(b.is_empty());

        // Peer 2 refuses its push: peer 1's is posted once, peer 2's later.
        f.applied.clear();
        f.allow = Some(1);
        b.extend(&mut vec![push(64), push(576)]);
        assert_eq!(b.post(&mut f, to), 1);
        assert_eq!(f.applied, vec![(1, 64)]);
        assert_eq!(b.len(), 1, "peer 2's push is held back");
        f.allow = None;
        assert_eq!(b.post(&mut f, to), 1);
        assert_eq!(f.applied, vec![(1, 64), (2, 576)], "nothing reposted to peer 1");
        assert!(b.is_empty());

        // Two pushes to one peer are one batch of two (not the fast path).
        f.batches.clear();
        b.extend(&mut vec![push(128), push(192)]);
        assert_eq!(b.post(&mut f, to), 2);
        assert_eq!(f.batches, vec![(1, 2)]);
    }

    #[test]
    fn a_forgotten_peer_gets_none_of_the_held_back_writes() {
        let inner = loopback_group(3, 1024).remove(0);
        let mut f = Flaky { inner, allow: Some(1), applied: Vec::new(), batches: Vec::new() };
        let mut b = PushBacklog::new();
        let peers = [1, 2];
        b.extend(&mut vec![push(0), push(64)]);
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 1);
        b.forget_peer(2);
        f.allow = None;
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 3);
        assert_eq!(f.applied, vec![(1, 0), (1, 64)], "peer 2 got nothing after it was forgotten");
        assert!(b.is_empty());
        // Forgetting ends with the queue: later pushes reach peer 2 again.
        b.extend(&mut vec![push(128)]);
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 2);
        assert_eq!(f.applied[2..], [(1, 128), (2, 128)]);
    }
}
