//! `ordo-kv-core`: the one key-value state machine of ordo — the table
//! (keys, values, stamped expiry), the writes that change it as log
//! entries, and their deterministic application ([`state::KvState`]) —
//! with no I/O and no engine. `ordo-kv` serves it as Redis over acuerdo or
//! over R3P2's Raft; `ordo-r2p2`'s `KvService` (the R3P2 thesis' service
//! and its UDP protocol) applies its operations to it too.
//!
//! # Invariants
//! - Same entries in the same order, same table and same replies, on
//!   every replica and every engine.
//! - A malformed entry or snapshot is refused and changes nothing.

#![warn(missing_docs)]

pub mod glob;
pub mod state;
