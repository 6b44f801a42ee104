//! The ordered push backlog every engine agent posts through.
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
//!   failure through the fabric's events); any other post error means the
//!   engine emitted an invalid push, a bug, and panics.

use ordo_fabric::{Fabric, MemberId, PostError, Write};
use std::collections::VecDeque;

/// A write an engine asks for: a byte range of the local region.
pub(crate) trait EnginePush: Copy + std::fmt::Debug {
    /// (region offset, length in bytes).
    fn range(&self) -> (usize, usize);
}

impl EnginePush for ordo_vsync::Push {
    fn range(&self) -> (usize, usize) {
        (self.offset, self.len)
    }
}

impl EnginePush for ordo_acuerdo::Push {
    fn range(&self) -> (usize, usize) {
        (self.offset, self.len)
    }
}

/// Whom one push goes to.
pub(crate) enum Targets<'t> {
    /// A list of peers (a subgroup's, the whole group's).
    Many(&'t [MemberId]),
    /// One peer.
    One(MemberId),
}

/// Pushes not yet posted to every target, oldest first, each with the index
/// of its next target.
#[derive(Debug)]
pub(crate) struct PushBacklog<P> {
    queue: VecDeque<(P, usize)>,
}

impl<P: EnginePush> PushBacklog<P> {
    pub(crate) fn new() -> Self {
        PushBacklog { queue: VecDeque::new() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Queues the pushes of one engine poll (draining `pushes`).
    pub(crate) fn extend(&mut self, pushes: &mut Vec<P>) {
        self.queue.extend(pushes.drain(..).map(|p| (p, 0)));
    }

    /// Posts oldest first to each push's targets, stopping at the first
    /// back-pressure; returns the writes posted (or skipped for a suspected
    /// peer).
    pub(crate) fn post<'t, F: Fabric>(
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
                match fabric.post_write(Write::new(to[*next], offset, len)) {
                    Ok(()) | Err(PostError::PeerSuspected(_)) => {
                        *next += 1;
                        posted += 1;
                    }
                    Err(PostError::Backpressure(_)) => return posted,
                    Err(e) => panic!("the engine emitted an invalid push {push:?}: {e}"),
                }
            }
            self.queue.pop_front();
        }
        posted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_fabric::loopback::{Loopback, loopback_group};
    use ordo_fabric::{Doorbell, FabricEvent, ReconnectError, Region};

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

    fn push(offset: usize) -> ordo_vsync::Push {
        ordo_vsync::Push { subgroup: Some(0), offset, len: 8 }
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
}
