//! Durable mode ([`crate::Config::durable`]): what a poll changed is handed
//! to the application to write before anything the poll publishes leaves
//! the member, and a member restarts from what it wrote
//! ([`Engine::recover`]).
//!
//! # Invariants
//! - Every log change (an append, a diff's truncation, a snapshot's
//!   clearing) marks `dirty_from`; every E_new or vote change marks
//!   `promise_dirty`. One [`DeliverySink::persist`] per poll, before the
//!   commit step, covers them all: pushes are posted only after `poll`
//!   returns, so no Accept, vote or E_new is seen by a peer before it is
//!   durable, and the leader's own Accept — counted by the commit rule in
//!   the same poll — is durable when it is counted. Hence a committed
//!   message is durable at a quorum.
//! - [`Engine::recover`] starts a member with its promises, its restored
//!   application state (`base`) and its stored log above it: synced (it
//!   holds its own log, so it may vote and lead), Committed = `base`,
//!   Accepted = its last stored header; what it stored above `base` is
//!   delivered once a leader's epoch commits it again (the diff commit).

use super::{DeliverySink, Engine, Persist, Recovered};
use crate::config::{Config, ConfigError};
use crate::header::Header;
use ordo_fabric::Region;

impl Engine {
    /// Marks the log changed from `h` on (durable mode).
    pub(super) fn log_dirty(&mut self, h: Header) {
        if self.cfg.durable {
            self.dirty_from = Some(self.dirty_from.map_or(h, |d| d.min(h)));
        }
    }

    /// Hands the poll's changes to the application (durable mode).
    pub(super) fn persist(&mut self, sink: &mut impl DeliverySink) {
        if !self.cfg.durable
            || (self.dirty_from.is_none()
                && !self.promise_dirty
                && self.restored.is_none()
                && self.accepted == self.persisted_accepted)
        {
            return;
        }
        let from = self.dirty_from.take();
        let entries =
            from.map_or_else(Vec::new, |f| self.log.range(f..).map(|(h, b)| (*h, b.as_slice())).collect());
        let change = Persist {
            e_new: self.e_new,
            vote: self.my_vote,
            log_from: from,
            entries,
            restored: self.restored,
            accepted: self.accepted,
        };
        sink.persist(&change);
        self.persisted_accepted = self.accepted;
        self.promise_dirty = false;
        self.restored = None;
    }

    /// A member of `cfg` restarted from its durable state `rec` (durable
    /// mode; the region is this incarnation's, zeroed). The application
    /// must already hold the state `rec.base` covers.
    pub fn recover(cfg: Config, region: Region, now_ns: u64, rec: Recovered) -> Result<Engine, ConfigError> {
        let mut cfg = cfg;
        // It holds its own log: it is not a member that forgot (see the
        // crate docs, "Restarts").
        cfg.incarnation = 1;
        let mut e = Engine::new(cfg, region, now_ns)?;
        if rec.log.windows(2).any(|w| w[0].0 >= w[1].0)
            || rec.log.first().is_some_and(|(h, _)| *h <= rec.base)
        {
            return Err(ConfigError::Members("the recovered log is not in order above its base".into()));
        }
        let last = rec.log.last().map_or(rec.base, |(h, _)| *h);
        // Accepted: a diff's count-0 header may lie above the last entry
        // (a new leader's log held without new entries yet).
        let accepted = last.max(rec.accepted);
        if accepted.epoch > rec.e_new || rec.vote.e_new > rec.e_new {
            return Err(ConfigError::Members("the recovered promise is below the recovered log".into()));
        }
        e.e_new = rec.e_new;
        e.store(e.layout.columns.e_new, 0, e.e_new.encode());
        if !rec.vote.is_none() {
            e.my_vote = rec.vote;
            for (i, w) in rec.vote.encode().into_iter().enumerate() {
                e.store(e.layout.columns.vote, i, w);
            }
            e.votes[e.my_row] = rec.vote;
        }
        e.log = rec.log.into_iter().collect();
        e.accepted = accepted;
        e.persisted_accepted = accepted;
        // The epoch whose leader's log it holds: it may return to following
        // that leader, and it never wins that epoch again (it may have led
        // it: headers of it were handed out).
        e.e_cur = accepted.epoch;
        e.store(e.layout.columns.accept, 0, accepted.encode());
        e.committed = rec.base;
        e.log_floor = rec.base;
        e.next = rec.base.succ();
        e.store(e.layout.columns.commit, 0, rec.base.encode());
        e.dirty_all = true;
        Ok(e)
    }
}
