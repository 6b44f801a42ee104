//! The [`Agent`]: a unit of work with a duty cycle (Aeron/Agrona's `Agent`).
//!
//! # Contract
//! - `do_work` is only ever called from one thread at a time (the runner owns
//!   the agent and moves it into exactly one thread), so an agent needs no
//!   internal locking for its own state. It must be `Send` to be run.
//! - `do_work` must not block: it does what is ready and returns how much it
//!   did. Returning 0 means "idle" and lets the runner's idle strategy spin,
//!   yield or park.
//! - `doorbell` is read once, when the runner is set up, before `on_start`;
//!   it must keep naming the same bell (or none) for the agent's life. Any
//!   event that makes `do_work` return non-zero must be followed by a ring of
//!   that bell (fabric backends ring it when a write lands), otherwise a
//!   parked runner notices the work only when its park times out.

use ordo_fabric::Doorbell;

/// A unit of work with a duty cycle: `do_work(now_ns) -> work_count`.
pub trait Agent {
    /// A short name for logs, thread names and panic reports.
    fn name(&self) -> &str;

    /// Called once on the agent's thread before the first `do_work`.
    fn on_start(&mut self) {}

    /// Does whatever work is ready and returns how much (0 = idle).
    ///
    /// `now_ns` is monotonic nanoseconds from the runner's [`Clock`](crate::Clock);
    /// an agent uses it for its timers instead of reading a clock itself.
    fn do_work(&mut self, now_ns: u64) -> usize;

    /// Called once on the agent's thread after the last `do_work`, when the
    /// runner stops (not after a panic: the agent's state is then unknown).
    fn on_close(&mut self) {}

    /// Parks the thread until this agent's own source of work has some, or
    /// `timeout` passes, for an agent that waits on something a doorbell
    /// cannot ring (a socket's readiness): `Some(woken)`. `None` (the
    /// default): the runner parks on [`doorbell`](Agent::doorbell). Used only
    /// when the agent runs alone on its thread. The agent owns the no-lost-
    /// wake-up protocol of its source (announce, re-check, wait), and must
    /// return within `timeout`; a runner's stop does not interrupt it (the
    /// agent's owner wakes it, or the timeout bounds the wait).
    fn park_until_work(&mut self, timeout: std::time::Duration) -> Option<bool> {
        let _ = timeout;
        None
    }

    /// The bell that incoming work rings, which an idle runner parks on.
    /// `None` means no one rings for this agent; the runner then parks with a
    /// bounded timeout on a private bell (only [`Runner::stop`](crate::Runner::stop)
    /// rings it), i.e. it sleeps for at most `park_max`.
    fn doorbell(&self) -> Option<Doorbell>;
}

impl<A: Agent + ?Sized> Agent for Box<A> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn on_start(&mut self) {
        (**self).on_start()
    }
    fn do_work(&mut self, now_ns: u64) -> usize {
        (**self).do_work(now_ns)
    }
    fn on_close(&mut self) {
        (**self).on_close()
    }
    fn park_until_work(&mut self, timeout: std::time::Duration) -> Option<bool> {
        (**self).park_until_work(timeout)
    }
    fn doorbell(&self) -> Option<Doorbell> {
        (**self).doorbell()
    }
}
