//! `ordo-dds`: OMG DDS-style publish/subscribe (DCPS) on vsync, with the
//! four QoS levels of Spindle's DDS (spindle §IV-F).
//!
//! One top-level vsync group holds every participant; each topic — in
//! `[dds]`, or created at run time by [`DomainParticipant::create_topic`]
//! and a first writer or reader, through a view change that adds it to the
//! group's catalogue — is one subgroup of its publishers (the senders) and
//! subscribers
//! (spindle §II-A: "topics are hashed to pick the subgroup", "publish is
//! implemented as a multicast, and subscribe watching for matching
//! multicasts and then does an upcall"). Samples are built in place in the
//! ring slot ([`DataWriter::write_with`], [`DataWriter::loan`]).
//!
//! # QoS levels (`dds.topics[].qos`) and the DDS vocabulary
//! | level | vsync | kept | DDS reliability / durability |
//! |---|---|---|---|
//! | `unordered` | unordered subgroup: delivered on receipt | no | RELIABLE per publisher, no total order / VOLATILE |
//! | `atomic-multicast` | ordered subgroup (total order, failure atomicity) | no | RELIABLE + total order / VOLATILE |
//! | `volatile-storage` | ordered | last `history` samples in every member's memory; a joiner restores them | RELIABLE + total order / TRANSIENT |
//! | `logged-storage` | ordered | as volatile, and appended to a checksummed log (fsynced) before any reader sees it; replayed after a restart | RELIABLE + total order / PERSISTENT |
//!
//! Readers choose `KEEP_LAST(n)` (per instance key) or `KEEP_ALL` (up to
//! `max_samples`, then new samples are rejected and counted: a slow reader
//! never stalls the group).
//!
//! # Modules
//! - [`sample`]: the envelope one vsync message carries.
//! - [`types`]: sample types (`Bytes`, `String`, `Json`, `KeyedJson`, `Pod`).
//! - [`core`]: the sans-I/O topic state (positions, history, log, reader
//!   queues) the member and the simulator both drive.
//! - [`participant`]: `DomainParticipant`, `Topic`, `DataWriter`,
//!   `DataReader`, `WaitSet`.
//!
//! # Invariants
//! See each module; in short: members agree on every ordered sample's
//! position, a logged sample is durable at a member before a reader there
//! sees it, and bad input is counted or refused, never applied.

#![warn(missing_docs)]

pub mod client;
pub mod core;
pub mod participant;
pub mod relay;
pub mod sample;
pub mod types;
pub mod wire;

pub use crate::core::{
    DomainCore, History, InPlaceFn, ReaderQos, ReaderStatus, SampleInfo, StoredSample, TopicCore, TopicStats,
};
pub use ordo_runtime::{DdsConfig, QosLevel, TopicConfig};
pub use participant::{
    DataReader, DataWriter, DdsError, DomainParticipant, InPlaceSubscription, Sample, Topic, WaitSet,
    log_dir, slot_payload, vsync_layout,
};
pub use types::{Bytes, Json, JsonKey, KeyedJson, Pod, TopicType};
