//! R2P2 (request/response pair protocol over UDP) with Raft inside it.

pub mod disk;
