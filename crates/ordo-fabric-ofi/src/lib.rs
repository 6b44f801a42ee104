//! The `ofi` backend of the ordo fabric (DESIGN.md §2): one-sided RMA
//! writes through libfabric, the interface Derecho uses for RDMA. It runs
//! on reliable-datagram endpoints (`FI_EP_RDM`: `verbs;ofi_rxm` for
//! InfiniBand and RoCE, `tcp;ofi_rxm` and `tcp` on any network, `shm` on
//! one host) or on connected endpoints (`FI_EP_MSG`: `verbs` — RDMA's
//! reliable connections, what Derecho uses — and `tcp`), chosen by
//! [`EndpointType`].
//!
//! Built only with the `ofi` cargo feature (off by default): without it
//! the crate is empty and the workspace needs nothing beyond cargo. With
//! it, `build.rs` finds the system libfabric (≥ 1.17) with pkg-config and
//! compiles a small C shim (`csrc/shim.c`) over libfabric's `static inline`
//! calls against the installed headers.
//!
//! # How the [`ordo_fabric`] guarantees are kept
//! - **FIFO per peer.** Where the provider promises write-after-write
//!   order for writes of the region's size (`FI_ORDER_WAW` /
//!   `FI_ORDER_RMA_WAW` in `tx_attr.msg_order` and `max_order_waw_size`),
//!   writes go to the provider as they are posted. Where it does not (the
//!   `shm` provider of 1.17 reports only `FI_ORDER_SAS`), the endpoint
//!   *fences*: every write asks for `FI_DELIVERY_COMPLETE`, and a post to a
//!   peer waits (polling, bounded by `write_timeout`) until the previous
//!   write to that peer has landed, so its bytes are read when it is
//!   posted and it cannot overtake. Data
//!   and guard are always separate writes (Derecho issue #47): nothing
//!   relies on the order of bytes within a write, and the backend says no
//!   to capability 8 ([`Fabric::address_ordered`](ordo_fabric::Fabric)).
//! - **Bytes are taken at post time.** Providers read a write's source
//!   when they transmit it, possibly after the caller stored a later value
//!   (a guard would then overtake the data it guards), so every write is
//!   sent from a copy in a registered staging ring (local access only),
//!   released by the write's completion — or when the endpoint it was
//!   posted on is closed — never merely because its link went down.
//! - **Untorn words** rest on the provider copying aligned words whole
//!   (memcpy, the kernel's copy for CMA, a NIC's DMA): what RDMA gives
//!   Derecho's SST. The conformance suite checks it on every provider
//!   tested.
//! - **Signaled writes complete exactly once**, when the provider reports
//!   delivery (`FI_COMPLETION | FI_DELIVERY_COMPLETE`), or fail: an error
//!   completion, or no completion within `write_timeout` (checked by
//!   `poll_events` and the progress agent). A completion names its write by
//!   a slot and a generation, so one that arrives after its link went down
//!   (and was already reported failed) is ignored.
//! - **Failures are suspicions.** A failed or timed-out write, or the end
//!   of the peer's liveness connection (its process died or dropped its
//!   endpoint), takes the link down once: one `Suspected`, every pending
//!   signaled write `Failed`, later posts
//!   `PeerSuspected` until [`Fabric::reconnect`](ordo_fabric::Fabric)
//!   fetches the peer's card again (a new incarnation: new address, key,
//!   base).
//! - **Progress.** Providers with manual data progress (`shm`, `rxm`)
//!   move data — incoming writes included — only while the endpoint polls
//!   its completion queue, so each endpoint runs a progress agent thread:
//!   it polls while writes are in flight and for 200 µs after its last
//!   work, then blocks on the completion queue's wait fd (`FI_WAIT_FD`:
//!   the tcp providers) for at most a millisecond, or, without one (`shm`),
//!   naps that grow a microsecond at a time up to 50 µs; `poll_events`
//!   polls too. Every libfabric call is made under one mutex
//!   (`FI_THREAD_DOMAIN`).
//! - **Doorbell.** One-sided writes raise no event at the target, so the
//!   last write of every post carries remote CQ data (`FI_REMOTE_CQ_DATA`,
//!   the writer's id): the target's provider reports its arrival — after
//!   the data is in place — as a completion, and whoever reaps it (the
//!   progress agent) rings the member's [`Doorbell`](ordo_fabric::Doorbell).
//!   Providers without CQ data get no doorbell.
//! - **Connected endpoints.** Each member listens on a passive endpoint
//!   (its address is in the card) and dials one connection to every peer,
//!   on which it writes; the peer accepts a request only if its private
//!   data carries a MAC under the set-up key naming the acceptor's current
//!   incarnation, and holds at most 256 accepted connections. A
//!   connection's shutdown or error takes the dialer's link down.

//! # Set-up and security
//! Addresses, memory keys and region bases travel over the set-up path of
//! [`contact`]: each member's contact port hands its card only to a dialer
//! that proved the cluster secret (mutual HMAC challenge-response). The
//! memory key is random per endpoint (64 bits where the provider lets the
//! application choose it), so a stranger who can reach the provider's port
//! but not the secret cannot aim a write at the region. The provider's
//! own traffic is not authenticated or encrypted: on a network an attacker
//! can observe, a key seen on the wire is a capability (as an RDMA rkey
//! is). See SECURITY.md.
//!
//! # Known limits
//! - libfabric 1.17's `shm` provider reports no write-after-write order, so
//!   every write waits for the previous one's delivery (one round trip
//!   through the peer's progress agent per write). It also returns an
//!   endpoint's completions in order — a write outstanding to a peer that
//!   died would hold back every later completion and live peers would time
//!   out — so on `shm` every peer gets its own send endpoint, each with its
//!   own completion queue (the conformance suite's death checks fail
//!   without them; sharing one queue left their progress undriven). Use ordo's own `shm` backend
//!   on one host; `ofi` with `shm` is for testing the ofi path. A killed
//!   process leaves its `shm` region files in `/dev/shm`:
//!   [`remove_stale_shm_files`] (run at every `shm` bind) removes those of
//!   dead processes.
//! - On `tcp;ofi_rxm`, about 1 in 40 runs of the Acuerdo kill test saw one
//!   follower skip some 35 ring entries at the ring's first wrap with no
//!   failure reported (cause open; `ofi_rxm_kill_9_the_leader_under_load`
//!   is the ignored reproduction). The runtime's default is therefore
//!   connected `tcp` endpoints.
//! - In one process, providers may share peer mappings between endpoints;
//!   tests kill in-process members with [`OfiFabric::crash`].
//! - Not built: target-side events without CQ data (`FI_RMA_EVENT`),
//!   shared receive contexts, memory registration per endpoint on connected
//!   endpoints (`FI_MR_ENDPOINT` is honoured on RDM only).

#![warn(missing_docs)]

#[cfg(feature = "ofi")]
pub mod contact;
#[cfg(feature = "ofi")]
mod fabric;
#[cfg(feature = "ofi")]
pub mod sys;

#[cfg(feature = "ofi")]
pub use fabric::{OfiBinding, OfiFabric, OfiFabricError, OfiOptions, remove_stale_shm_files};
#[cfg(feature = "ofi")]
pub use sys::{EndpointType, OfiError, ProviderAttr};
