//! The vsync member driver: the engine, its fabric endpoint, the ordered
//! push backlog and delivery batching — everything a member does except
//! threads, locks and clocks.
//!
//! The runtime's predicate agent (`ordo_runtime::VsyncMember`) and the
//! seeded simulation (the `vsync` workload of `ordo-simulation`) both drive
//! this one type, so the posting order, the back-pressure rule and the
//! upcall batching that the simulation checks are the ones that run.
//!
//! # Invariants
//! - The engine is polled only when the backlog is empty (asserted): its
//!   previous poll's pushes are all posted before it plans again (see
//!   [`ordo_fabric::backlog`]).
//! - With `batched_upcall` off, the sink sees one message per call, in the
//!   engine's delivery order; with it on, the engine's batches as they are.
//! - A suspected peer wedges the engine and is remembered once; the writes
//!   held back for it are dropped ([`PushBacklog::forget_peer`]).
//!
//! # A duty cycle
//! ```text
//! post_backlog()            // what the last poll asked for, oldest first
//! if can_poll():            // nothing held back by back-pressure
//!     poll_engine(sink)     // predicates: receive, deliver, plan pushes
//!     post_backlog()        // (the runtime may release its lock first)
//! on_fabric_events()        // suspicions wedge
//! ```
//! [`VsyncDriver::do_work`] is that cycle without a lock.

use crate::config::{ConfigError, GroupConfig};
use crate::engine::{Delivered, DeliverySink, Effects, Engine, Push, Sender};
use ordo_fabric::backlog::{PushBacklog, PushRange, Targets};
use ordo_fabric::{Fabric, FabricEvent, FailureCause, MemberId};

impl PushRange for Push {
    fn range(&self) -> (usize, usize) {
        (self.offset, self.len)
    }
}

/// One member's engine, fabric endpoint and pushes waiting to be posted.
pub struct VsyncDriver<F: Fabric> {
    engine: Engine,
    fabric: F,
    effects: Effects,
    backlog: PushBacklog<Push>,
    batched_upcall: bool,
    events: Vec<FabricEvent>,
    suspected: Vec<MemberId>,
}

/// Adapts a sink to unbatched upcalls (spindle's baseline: one upcall per
/// message).
struct OneByOne<'s, S: ?Sized>(&'s mut S);

impl<S: DeliverySink + ?Sized> DeliverySink for OneByOne<'_, S> {
    fn deliver(&mut self, batch: &[Delivered<'_>]) {
        for d in batch {
            self.0.deliver(std::slice::from_ref(d));
        }
    }
}

impl<F: Fabric> VsyncDriver<F> {
    /// The driver of `fabric.member()` in `group`, and a send handle for
    /// every subgroup the member sends in (`None` elsewhere).
    pub fn new(fabric: F, mut group: GroupConfig) -> Result<(Self, Vec<Option<Sender>>), ConfigError> {
        // Stamped slots only where the fabric is address-ordered.
        group.switches.stamped_slots &= fabric.address_ordered();
        let batched_upcall = group.switches.batched_upcall;
        let (engine, senders) =
            Engine::with_peer_regions(group, fabric.member(), fabric.region().clone(), |p| {
                fabric.peer_region(p)
            })?;
        assert_eq!(engine.member(), fabric.member());
        let driver = VsyncDriver {
            engine,
            fabric,
            effects: Effects::default(),
            backlog: PushBacklog::new(),
            batched_upcall,
            events: Vec::new(),
            suspected: Vec::new(),
        };
        Ok((driver, senders))
    }

    /// Posts the backlog, oldest first, stopping at the first push a peer
    /// refuses with back-pressure (later writes never overtake it); returns
    /// the writes posted.
    pub fn post_backlog(&mut self) -> usize {
        let engine = &self.engine;
        self.backlog.post(&mut self.fabric, |push| Targets::Many(engine.peers_of(push.subgroup)))
    }

    /// Whether the engine may run: nothing of its last poll is held back.
    pub fn can_poll(&self) -> bool {
        self.backlog.is_empty()
    }

    /// Runs the engine's predicates once, delivering to `sink` (batched or
    /// one by one as the switches say) and queueing its pushes (not yet
    /// posted). Returns the engine's work count.
    ///
    /// Panics if the backlog is not empty (see the module invariants).
    pub fn poll_engine(&mut self, sink: &mut impl DeliverySink) -> usize {
        assert!(self.can_poll(), "the engine is polled only once its pushes are all posted");
        self.effects.clear();
        let work = if self.batched_upcall {
            self.engine.poll(&mut self.effects, sink)
        } else {
            self.engine.poll(&mut self.effects, &mut OneByOne(sink))
        };
        debug_assert!(self.effects.pushes.iter().all(|p| p.len > 0), "the engine pushes non-empty ranges");
        self.backlog.extend(&mut self.effects.pushes);
        work
    }

    /// Reads the fabric's events: a suspected peer wedges the member (the
    /// state a view change starts from) and is reported to `on_suspect`.
    /// Returns the number of suspicions.
    pub fn on_fabric_events(&mut self, mut on_suspect: impl FnMut(MemberId, &FailureCause)) -> usize {
        let mut work = 0;
        self.fabric.poll_events(&mut self.events);
        for e in self.events.drain(..) {
            if let FabricEvent::Suspected { peer, cause } = e {
                on_suspect(peer, &cause);
                if !self.suspected.contains(&peer) {
                    self.suspected.push(peer);
                }
                self.backlog.forget_peer(peer);
                self.engine.wedge();
                work += 1;
            }
        }
        debug_assert!(work == 0 || self.engine.is_wedged());
        work
    }

    /// Wedges the engine (a view change started elsewhere).
    pub fn wedge(&mut self) {
        self.engine.wedge();
    }

    /// The ragged-edge delivery of a failed view, batched or one by one as
    /// the switches say (see [`Engine::deliver_ragged`]).
    pub fn deliver_ragged(&mut self, trims: &[Vec<u64>], sink: &mut impl DeliverySink) -> usize {
        if self.batched_upcall {
            self.engine.deliver_ragged(trims, sink)
        } else {
            self.engine.deliver_ragged(trims, &mut OneByOne(sink))
        }
    }

    /// One duty cycle with no lock: post, poll if allowed, post, events.
    pub fn do_work(&mut self, sink: &mut impl DeliverySink) -> usize {
        let mut work = self.post_backlog();
        if self.can_poll() {
            work += self.poll_engine(sink);
            work += self.post_backlog();
        }
        work + self.on_fabric_events(|_, _| {})
    }

    /// Whether nothing is waiting to be posted and every own slot is
    /// reclaimed.
    pub fn is_idle(&self) -> bool {
        self.backlog.is_empty() && self.engine.is_idle()
    }

    /// Pushes not yet posted to all of their peers.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// The engine (stats, delivered_num, faults).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The fabric endpoint.
    pub fn fabric(&self) -> &F {
        &self.fabric
    }

    /// Peers suspected so far, each once.
    pub fn suspected(&self) -> &[MemberId] {
        &self.suspected
    }
}
