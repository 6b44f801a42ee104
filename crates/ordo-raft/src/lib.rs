//! Raft (Ongaro & Ousterhout; r3p2 Ch. 3) as a sans-I/O state machine, and
//! the durable log format it is persisted in.
//!
//! - [`types`]: the values the core and the durable log share.
//! - [`node`]: the Raft core ([`Node`], its `Ready` API, the persistence
//!   contract and the protocol invariants) — start reading there.
//! - [`message`] and [`codec`]: the messages and their wire format.
//! - [`config`]: every parameter and limit.
//! - [`storage`]: the durable log.

pub mod codec;
pub mod config;
mod log;
pub mod message;
pub mod node;
mod progress;
mod rng;
pub mod rsm;
pub mod storage;
pub mod types;

/// The shared byte buffer of [`Entry::data`].
pub use bytes::Bytes;
pub use codec::{DecodeError, DecodeLimits, decode, decode_membership, encode, encode_membership};
pub use config::{Config, ConfigError};
pub use message::Message;
pub use node::{
    CompactError, MembershipChange, Node, NodeError, NodeStats, ProposeError, Ready, Role, SoftState,
    StepError,
};
pub use types::*;
