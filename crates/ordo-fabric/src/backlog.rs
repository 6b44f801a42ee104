//! The ordered push backlog every engine driver posts through.
//!
//! An engine asks for *pushes* (byte ranges of its own region, each to a
//! list of peers or one peer); a driver queues them here and posts them to
//! the fabric. Both the runtime's agents and the simulator's processes post
//! through this one type (via the engines' drivers), so the order and the
//! back-pressure rule that the simulation checks are the ones that run.
//!
//! # Invariants
//! - Pushes are posted in the order they were added, each to all of its
//!   targets; a push a peer refuses with back-pressure stays at the front
//!   (remembering which targets already have it) and nothing behind it is
//!   posted first, so FIFO per peer holds.
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

use crate::{Fabric, MemberId, PostError, Write};
use std::collections::VecDeque;

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

/// Pushes not yet posted to every target, oldest first, each with the index
/// of its next target, and peers whose remaining writes are dropped.
#[derive(Debug)]
pub struct PushBacklog<P> {
    queue: VecDeque<(P, usize)>,
    /// Peers suspected while pushes were held back: skipped from now on for
    /// the pushes already queued (cleared once the queue drains).
    forgotten: Vec<MemberId>,
}

impl<P: PushRange> Default for PushBacklog<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: PushRange> PushBacklog<P> {
    /// An empty backlog.
    pub fn new() -> Self {
        PushBacklog { queue: VecDeque::new(), forgotten: Vec::new() }
    }

    /// Whether every queued push reached all of its targets.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Pushes not yet posted to all of their targets.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Queues the pushes of one engine poll (draining `pushes`).
    pub fn extend(&mut self, pushes: &mut Vec<P>) {
        self.queue.extend(pushes.drain(..).map(|p| (p, 0)));
    }

    /// Drops every queued write to `peer` (it was suspected): the pushes
    /// already queued skip it from now on.
    pub fn forget_peer(&mut self, peer: MemberId) {
        if !self.queue.is_empty() && !self.forgotten.contains(&peer) {
            self.forgotten.push(peer);
        }
    }

    /// Posts oldest first to each push's targets, stopping at the first
    /// back-pressure; returns the writes posted (or skipped for a suspected
    /// or forgotten peer).
    pub fn post<'t, F: Fabric + ?Sized>(
        &mut self,
        fabric: &mut F,
        targets: impl Fn(&P) -> Targets<'t>,
    ) -> usize {
        let mut posted = 0;
        while let Some((push, next)) = self.queue.front_mut() {
            let targets = targets(push);
            let to: &[MemberId] = match &targets {
                Targets::Many(list) => list,
                Targets::One(peer) => std::slice::from_ref(peer),
            };
            let (offset, len) = push.range();
            while *next < to.len() {
                let peer = to[*next];
                if self.forgotten.contains(&peer) {
                    *next += 1;
                    posted += 1;
                    continue;
                }
                match fabric.post_write(Write::new(peer, offset, len)) {
                    Ok(()) | Err(PostError::PeerSuspected(_)) => {
                        *next += 1;
                        posted += 1;
                    }
                    Err(PostError::Backpressure(_)) => return posted,
                    Err(e) => panic!("the engine emitted an invalid push {push:?}: {e}"),
                }
            }
            assert_eq!(*next, to.len(), "a push leaves the front only once every target has it");
            self.queue.pop_front();
        }
        self.forgotten.clear();
        posted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback::{Loopback, loopback_group};
    use crate::{Doorbell, FabricEvent, ReconnectError, Region};

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
        let mut f = Flaky { inner, allow: None, applied: Vec::new() };
        let mut b = PushBacklog::new();
        let peers = [1, 2];
        b.extend(&mut vec![push(0), push(64)]);
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 4);
        assert_eq!(f.applied, vec![(1, 0), (2, 0), (1, 64), (2, 64)]);
        assert!(b.is_empty());

        // Peer 1 gets the first push, then peer 2 is refused: nothing behind
        // it is posted, and the retry resumes at peer 2 without re-posting.
        f.applied.clear();
        b.extend(&mut vec![push(128), push(192)]);
        f.allow = Some(1);
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 1);
        assert_eq!(f.applied, vec![(1, 128)]);
        assert_eq!(b.len(), 2, "the refused push stays at the front");
        f.allow = None;
        assert_eq!(b.post(&mut f, |_| Targets::Many(&peers)), 3);
        assert_eq!(f.applied, vec![(1, 128), (2, 128), (1, 192), (2, 192)]);
        assert!(b.is_empty());

        // A single-peer target.
        b.extend(&mut vec![push(256)]);
        assert_eq!(b.post(&mut f, |_| Targets::One(2)), 1);
        assert_eq!(f.applied.last(), Some(&(2, 256)));
    }

    #[test]
    fn a_forgotten_peer_gets_none_of_the_held_back_writes() {
        let inner = loopback_group(3, 1024).remove(0);
        let mut f = Flaky { inner, allow: Some(1), applied: Vec::new() };
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
