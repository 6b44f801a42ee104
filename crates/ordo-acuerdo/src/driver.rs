//! The Acuerdo member driver: the engine, its fabric endpoint, the ordered
//! push backlog, link recovery and ticket settlement — everything a member
//! does except threads, client queues and clocks.
//!
//! The runtime's agent (`ordo_runtime::acuerdo::AcuerdoMember`) and the
//! seeded simulation (the `acuerdo` workload of `ordo-simulation`) both
//! drive this one type, so the posting order, the back-pressure rule, the
//! reconnect policy and the commit/loss decision for every ticket that the
//! simulation checks are the ones that run.
//!
//! # Invariants
//! - The engine is polled only when the backlog is empty (asserted; see
//!   [`ordo_fabric::backlog`]): a poll's pushes are all posted, in order, to
//!   each target in order ([`Target::All`] fans out to every peer in sorted
//!   order), before the engine plans again.
//! - A driver poll is either an urgent step ([`Engine::poll_urgent`]: only
//!   the commit path — the leader's commit rule and fresh messages, a
//!   follower's acks — when there is something on it) or a full
//!   [`Engine::poll`]; at most [`URGENT_RUN_MAX`] urgent steps in a row, so
//!   under any load every phase runs at least every eighth poll.
//! - A suspected peer's held-back writes are dropped, and the peer is
//!   retried with [`Fabric::reconnect`] every `reconnect_interval_ns`; a
//!   [`FabricEvent::Reconnected`] (a healed fault or a restarted peer's new
//!   incarnation) becomes [`Engine::on_link_reset`], which re-sends what the
//!   new link needs (ring session, row, diff).
//! - Every ticket accepted by [`AcuerdoDriver::submit`] is settled exactly
//!   once, in header order: [`Settled::Committed`] when the engine reports
//!   its header committed, [`Settled::Lost`] when a later header of this
//!   member committed first or the commit point passed it (the epoch that
//!   held it ended without it), [`Settled::Unknown`] when the commit point
//!   passed it by a restored snapshot (it may be inside).
//! - A poll at or after the engine's requested wake time counts as work, so
//!   a runner that polls on every duty cycle never sleeps through a
//!   heartbeat it owes.

use crate::config::{Config, ConfigError};
use crate::engine::{BroadcastError, DeliverySink, Effects, Engine, Push, Target};
use crate::header::Header;
use ordo_fabric::backlog::{PushBacklog, PushRange, Targets};
use ordo_fabric::{Fabric, FabricEvent, MemberId};
use std::collections::VecDeque;

/// Urgent steps ([`Engine::poll_urgent`]) in a row before a full poll.
///
/// At window 1 every poll of a loaded leader lies on a commit's path (it
/// sends the next message or commits the last), so a full poll (~1.5× an
/// urgent step) lands on the path once in `URGENT_RUN_MAX + 1` leader
/// polls. With 3 it landed on every second commit and cost the window-1
/// p50 ~60-80 ns (~8 %); with 7 it is one commit in four, off the median
/// (BENCHMARKS.md, "Fewer full polls on the commit path"). 15 gained no
/// more at window 1 and cost ~5 % of the 3-member throughput at window
/// 64 in the same runs (7 did not). What a full poll alone runs
/// (heartbeats, failure detection, elections, reads, garbage collection)
/// waits at most 7 urgent steps, about a µs, against timers of
/// milliseconds.
pub const URGENT_RUN_MAX: u32 = 7;

impl PushRange for Push {
    fn range(&self) -> (usize, usize) {
        (self.offset, self.len)
    }
}

/// How a ticket ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The message with this header is committed (delivered in order).
    Committed {
        /// The caller's ticket.
        ticket: u64,
        /// Its place in the total order.
        header: Header,
    },
    /// The message will never commit (its epoch ended without it).
    Lost {
        /// The caller's ticket.
        ticket: u64,
        /// The header it had been given.
        header: Header,
    },
    /// This member cannot tell: it restored a leader's snapshot covering
    /// the header (state transfer), so the message is committed if the
    /// group committed it before the snapshot, and never otherwise.
    Unknown {
        /// The caller's ticket.
        ticket: u64,
        /// The header it had been given.
        header: Header,
    },
}

/// One member's engine, fabric endpoint, pushes waiting to be posted,
/// suspected links and unsettled tickets.
pub struct AcuerdoDriver<F: Fabric> {
    engine: Engine,
    fabric: F,
    effects: Effects,
    backlog: PushBacklog<Push>,
    peers: Vec<MemberId>,
    /// Accepted tickets not yet settled, in header order.
    pending: VecDeque<(Header, u64)>,
    events: Vec<FabricEvent>,
    /// Suspected peers and when to try reconnecting them next.
    suspected: Vec<(MemberId, u64)>,
    reconnect_interval_ns: u64,
    wake_at_ns: u64,
    /// Polls in a row that were urgent steps only.
    urgent_run: u32,
    suspicions: u64,
    reconnections: u64,
}

impl<F: Fabric> AcuerdoDriver<F> {
    /// The driver of `cfg.me` over `fabric` (whose region must be zeroed and
    /// at least [`crate::Layout::region_len`] bytes). A suspected peer is
    /// retried every `reconnect_interval_ns` (0: on every event poll).
    /// Stamped rings ([`Config::ring_stamps`]) only where the fabric is
    /// address-ordered.
    pub fn new(
        fabric: F,
        mut cfg: Config,
        now_ns: u64,
        reconnect_interval_ns: u64,
    ) -> Result<Self, ConfigError> {
        assert_eq!(fabric.member(), cfg.me, "the fabric endpoint is not cfg.me's");
        cfg.ring_stamps &= fabric.address_ordered();
        let engine = Engine::new(cfg, fabric.region().clone(), now_ns)?;
        Ok(AcuerdoDriver {
            peers: engine.peers(),
            engine,
            fabric,
            effects: Effects::default(),
            backlog: PushBacklog::new(),
            pending: VecDeque::new(),
            events: Vec::new(),
            suspected: Vec::new(),
            reconnect_interval_ns,
            wake_at_ns: now_ns,
            urgent_run: 0,
            suspicions: 0,
            reconnections: 0,
        })
    }

    /// The driver of a member restarted from its durable state (durable
    /// mode, see [`Engine::recover`]).
    pub fn recover(
        fabric: F,
        cfg: Config,
        now_ns: u64,
        reconnect_interval_ns: u64,
        recovered: crate::Recovered,
    ) -> Result<Self, ConfigError> {
        assert_eq!(fabric.member(), cfg.me, "the fabric endpoint is not cfg.me's");
        let mut cfg = cfg;
        cfg.ring_stamps &= fabric.address_ordered();
        let engine = Engine::recover(cfg, fabric.region().clone(), now_ns, recovered)?;
        let mut d = Self::new(fabric, engine.config().clone(), now_ns, reconnect_interval_ns)?;
        d.peers = engine.peers();
        d.engine = engine;
        Ok(d)
    }

    /// Posts the backlog, oldest first, stopping at the first push a peer
    /// refuses with back-pressure; returns the writes posted.
    pub fn post_backlog(&mut self) -> usize {
        let peers = &self.peers;
        self.backlog.post(&mut self.fabric, |push| match push.to {
            Target::All => Targets::Many(peers),
            Target::Peer(p) => Targets::One(p),
        })
    }

    /// Whether the engine may run: nothing of its last poll is held back.
    pub fn can_poll(&self) -> bool {
        self.backlog.is_empty()
    }

    /// Proposes `payload` (leader only) and tracks `ticket` until it is
    /// settled by a later [`poll`](Self::poll).
    pub fn submit(&mut self, ticket: u64, payload: &[u8]) -> Result<Header, BroadcastError> {
        let header = self.engine.broadcast(payload)?;
        debug_assert!(self.pending.back().is_none_or(|(h, _)| *h < header), "headers of one leader grow");
        self.pending.push_back((header, ticket));
        Ok(header)
    }

    /// Asks for a linearizable read (leader only, see
    /// [`Engine::read_index`]); `ticket` comes back in the
    /// [`effects`](Self::effects) of a later poll, ready or failed.
    pub fn read_index(&mut self, ticket: u64) -> Result<(), BroadcastError> {
        self.engine.read_index(ticket)
    }

    /// Proposes `payload` (leader only) without tracking its fate.
    pub fn broadcast(&mut self, payload: &[u8]) -> Result<Header, BroadcastError> {
        self.engine.broadcast(payload)
    }

    /// Runs the engine once: deliveries and state transfer go to `sink`,
    /// settled tickets to `settled`, its pushes are queued and posted.
    /// Returns the work done. The poll's notes stay readable in
    /// [`effects`](Self::effects) until the next poll.
    ///
    /// Panics if the backlog is not empty (see the module invariants).
    pub fn poll(&mut self, now_ns: u64, sink: &mut impl DeliverySink, settled: &mut Vec<Settled>) -> usize {
        assert!(self.can_poll(), "the engine is polled only once its pushes are all posted");
        let mut work = usize::from(now_ns >= self.wake_at_ns);
        self.effects.clear();
        // The commit path alone (`Engine::poll_urgent`): a fresh message
        // leaves the leader, a follower's ack leaves, the leader commits,
        // without the other phases before or after them; those run in a
        // full poll at least every `URGENT_RUN_MAX + 1` polls (so the
        // commit path never starves them).
        let urgent = if self.urgent_run < URGENT_RUN_MAX {
            self.engine.poll_urgent(now_ns, &mut self.effects, sink)
        } else {
            0
        };
        if urgent > 0 {
            self.urgent_run += 1;
            work += urgent;
        } else {
            self.urgent_run = 0;
            work += self.engine.poll(now_ns, &mut self.effects, sink);
            self.wake_at_ns = self.effects.wake_at_ns.unwrap_or(u64::MAX);
        }
        self.settle(settled);
        self.backlog.extend(&mut self.effects.pushes);
        work + self.post_backlog()
    }

    /// Commit notifications and lost tickets after a poll. A header this
    /// member never delivered because a restored snapshot covered it is
    /// [`Settled::Unknown`], not lost (found by the `kv` simulation: a
    /// write reported lost had been committed by the next leader).
    fn settle(&mut self, settled: &mut Vec<Settled>) {
        let restored = self
            .effects
            .notes
            .iter()
            .filter_map(|n| match n {
                crate::engine::Note::Restored { header, .. } => Some(*header),
                _ => None,
            })
            .max();
        let gone = |ph: Header, ticket: u64| match restored {
            Some(base) if ph <= base => Settled::Unknown { ticket, header: ph },
            _ => Settled::Lost { ticket, header: ph },
        };
        for &h in &self.effects.committed {
            while let Some(&(ph, ticket)) = self.pending.front() {
                if ph > h {
                    break;
                }
                self.pending.pop_front();
                settled.push(if ph == h {
                    Settled::Committed { ticket, header: h }
                } else {
                    gone(ph, ticket)
                });
            }
        }
        let committed = self.engine.committed();
        while let Some(&(ph, ticket)) = self.pending.front() {
            if ph > committed {
                break;
            }
            self.pending.pop_front();
            settled.push(gone(ph, ticket));
        }
        debug_assert!(self.pending.front().is_none_or(|(h, _)| *h > committed));
    }

    /// Reads the fabric's events (each is shown to `on_event` first):
    /// suspicions drop the peer's held-back writes and schedule reconnects,
    /// reconnections reset the engine's link; then tries the reconnects that
    /// are due. Returns the events that changed something.
    pub fn on_fabric_events(&mut self, now_ns: u64, mut on_event: impl FnMut(&FabricEvent)) -> usize {
        let mut work = self.handle_events(now_ns, &mut on_event);
        let mut reconnected = false;
        for i in 0..self.suspected.len() {
            let (peer, at) = self.suspected[i];
            if now_ns >= at {
                self.suspected[i].1 = now_ns.saturating_add(self.reconnect_interval_ns.max(1));
                reconnected |= self.fabric.reconnect(peer).is_ok();
            }
        }
        if reconnected {
            // The link is up from now on: its `Reconnected` must become a
            // link reset before the engine runs again, or the next poll
            // would go on with the old ring session over the new link,
            // where writes posted before the failure may be missing.
            work += self.handle_events(now_ns, &mut on_event);
        }
        work
    }

    fn handle_events(&mut self, now_ns: u64, on_event: &mut impl FnMut(&FabricEvent)) -> usize {
        let mut work = 0;
        self.fabric.poll_events(&mut self.events);
        for e in std::mem::take(&mut self.events) {
            match e {
                FabricEvent::Suspected { peer, .. } => {
                    on_event(&e);
                    self.suspicions += 1;
                    self.backlog.forget_peer(peer);
                    if !self.suspected.iter().any(|s| s.0 == peer) {
                        self.suspected.push((peer, now_ns.saturating_add(self.reconnect_interval_ns)));
                    }
                    work += 1;
                }
                FabricEvent::Reconnected { peer, .. } => {
                    on_event(&e);
                    self.reconnections += 1;
                    // Writes planned for the old link and still held back
                    // must not reach the new one (the reset re-sends).
                    self.backlog.forget_peer(peer);
                    self.suspected.retain(|s| s.0 != peer);
                    self.engine.on_link_reset(peer);
                    work += 1;
                }
                FabricEvent::Completed { .. } | FabricEvent::Failed { .. } => {}
            }
        }
        work
    }

    /// What the last poll reported (notes, commits, wake time; its pushes
    /// are already in the backlog).
    pub fn effects(&self) -> &Effects {
        &self.effects
    }

    /// When the engine wants to be polled again (`u64::MAX`: no timer).
    pub fn wake_at_ns(&self) -> u64 {
        self.wake_at_ns
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The fabric endpoint.
    pub fn fabric(&self) -> &F {
        &self.fabric
    }

    /// Peers suspected so far (count) and links reconnected (count).
    pub fn link_counts(&self) -> (u64, u64) {
        (self.suspicions, self.reconnections)
    }

    /// Pushes waiting for the fabric.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// Tickets accepted and not yet settled.
    pub fn unsettled(&self) -> usize {
        self.pending.len()
    }
}
