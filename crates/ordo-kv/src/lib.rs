//! `ordo-kv`: the replicated hash table of acuerdo §4.3 — every replica of
//! an acuerdo group applies the same log of writes to a hash table — served
//! to Redis clients (RESP2, and RESP3 after `HELLO 3`) by every replica.
//!
//! - [`state`]: the commands that change the table, their log entries and
//!   the deterministic state machine (expiry decided by the leader's stamp).
//! - [`command`]: Redis commands parsed into writes, reads and connection
//!   commands; reads answered from a state.
//! - [`resp`]: bounded RESP framing over the `redis-protocol` codec.
//! - [`server`]: `ordo kv serve` — the acuerdo member and the RESP front
//!   end: writes through the leader, linearizable reads by read index,
//!   forwarding or MOVED at followers, AUTH with the client secret.
//! - [`disk`]: `kv.durability = "disk"` — the promise, the checksummed
//!   segment log of `ordo-raft::storage` and table snapshots, written before
//!   a replica's Accept leaves it and read back when it restarts.
//! - [`raft`]: `kv.engine = "raft"` — the same state machine under R3P2
//!   (Raft inside R2P2's `REPLICATED_ROUTE`), the second engine.
//! - [`vsync`]: `kv.engine = "vsync"` — the same state machine over one
//!   ordered subgroup of every replica (virtual synchrony, no leader).
//! - [`lincheck`]: a linearizability checker for key-value histories (the
//!   kill tests and the simulation record histories and check them).
//!
//! # Invariants
//! - One state machine: every replica applies the same committed entries in
//!   the same order to a [`state::KvState`], and replies are the state
//!   machine's, computed where the entry is applied.
//! - A request that is malformed or over a bound gets an error and changes
//!   nothing; nothing is applied that the leader did not stamp and the
//!   group did not commit.

#![warn(missing_docs)]

pub use ordo_kv_core::{glob, state};

pub mod client;
pub mod command;
pub mod disk;
mod engine;
pub mod lincheck;
pub mod raft;
pub mod resp;
pub mod server;
pub mod vsync;

pub use server::{KvCounters, KvError, KvServer};
pub use state::{Entry, KvState, Reply, Write};
