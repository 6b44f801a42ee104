//! `vsync`: Derecho's atomic multicast with every Spindle optimization, as a
//! sans-I/O engine (spindle §II-§III, DESIGN.md §4).
//!
//! A top-level group of members is divided into **subgroups**, each with its
//! members, its senders (in rank order), a window and a maximum payload.
//! Every sender has a slot ring ([`ordo_ring`]) in every member's region;
//! every member has a row in the SST ([`ordo_sst`]) with, per subgroup,
//! `received_num`, `delivered_num` and per-sender receive counts (spindle
//! Table I).
//!
//! **Total order** is round-robin over the senders: message `k` of the
//! sender with rank `i` has `seq = k × S + i` (S senders). A message is
//! delivered when every member has received it: `seq ≤ min received_num`
//! (spindle §II-D). **Unordered** subgroups deliver on receipt.
//!
//! The engine does no I/O: [`Engine::poll`] evaluates the send, receive,
//! null-send, delivery and reclaim predicates of every subgroup over the
//! local region, emits [`Push`]es for the runtime to post (data before
//! counters, as the fabric requires) and hands delivered batches to a
//! [`DeliverySink`]. The same code runs under `ordo-sim` and the runtime: both drive a
//! [`VsyncDriver`] (its seeded workload lives in `ordo-simulation`).
//!
//! The Spindle optimizations are [`Switches`]; [`Switches::BASELINE`] turns
//! all off to rerun the paper's before/after experiments. Three of them
//! (posting after unlocking, lock-free sends, batched upcalls) are carried
//! out by the runtime, which owns threads and locks.
//!
//! **Views.** An engine serves one view. It can be **wedged**
//! ([`Engine::wedge`]): sends, receives and deliveries stop, the `wedged`
//! SST flag is pushed — the state a view change starts from. The view
//! change itself ([`view`]: suspicion, a Paxos-decided next view and ragged
//! trim, partition safety) delivers the failed view's ragged edge
//! ([`Engine::deliver_ragged`]), collects what the survivors resend
//! ([`Engine::undelivered_own`]) and starts a new engine for the next view.

#![warn(missing_docs)]

mod config;
mod driver;
mod engine;
mod layout;
mod membership;
mod stats;
pub mod view;

pub use config::{ConfigError, DeliveryMode, GroupConfig, MAX_PAYLOAD, MAX_WINDOW, SubgroupConfig, Switches};
pub use driver::VsyncDriver;
pub use engine::{
    Delivered, DeliverySink, Effects, Engine, NULL_COUNT_MASK, NULL_FLAG, PeerFault, Push, SendError, Sender,
};
pub use layout::{GroupLayout, SubgroupColumns};
pub use membership::{MembershipEvent, StateTransfer, ViewMember};
pub use stats::{BatchHistogram, SubgroupStats};

#[cfg(test)]
mod tests;
