//! Raft (Ongaro & Ousterhout; r3p2 Ch. 3) as a sans-I/O state machine, and
//! the durable log format it is persisted in. See the module docs.

pub mod storage;
pub mod types;

pub use types::*;
