//! R2P2 (request/response pair protocol over UDP) with Raft inside it
//! (r3p2, EPFL 2019; R2P2, USENIX ATC'19).
//!
//! # Invariants
//! - **A request is named by `(client_id, request_id)`.** The client picks a
//!   64-bit id once (random by default) and numbers its requests; retries
//!   and redirects resend the *same* pair, so a replication hook can apply a
//!   request once however often it arrives, at whichever replica.
//! - **Delivery.** UDP may lose, duplicate and reorder datagrams. The client
//!   retries after `timeout`, up to `retries` times; FIXED_ROUTE and
//!   LB_ROUTE are therefore *at-least-once* (a retry may run the handler
//!   again; handlers must tolerate that or be idempotent). REPLICATED_ROUTE
//!   gets what the hook provides (exactly-once application with a per-client
//!   table in the log). A result is reported to the caller exactly once.
//! - **Never falsely replicated.** A server without a replication hook answers
//!   REPLICATED_ROUTE with ERROR `NotReplicated`; it never executes it.
//! - **Bounds.** Datagrams carry at most `mtu_payload` payload bytes; a message
//!   has at most `max_packets` datagrams and `max_message_bytes` bytes;
//!   at most `max_partial_messages` incomplete messages are held, for at most
//!   `timeout_ns`; worker queues hold `queue_depth` entries. Beyond a bound
//!   things are dropped and counted ([`Stats`]), never queued without limit —
//!   except committed REPLICATED requests, which wait in order for worker 0.
//! - **Threads.** The network thread owns socket, reassembly and the hook;
//!   handlers run on it ([`HandlerMode::NetworkThread`]) or on workers fed by
//!   SPSC queues ([`HandlerMode::Workers`]); REPLICATED handlers run in
//!   commit order on one thread (worker 0 or the network thread).
//!
//! # Modules
//! - [`header`]: the wire header (layout and divergences from R2P2 there).
//! - [`reassembly`]: sans-I/O split and reassembly with bounds.
//! - [`server`], [`client`], [`replication`] (the REPLICATED_ROUTE hook).
//!
//! # Example
//! ```
//! use ordo_r2p2::{Client, ClientConfig, HandlerMode, Policy, Server, ServerConfig, simple};
//!
//! let config = ServerConfig { handler_mode: HandlerMode::Workers(1), ..ServerConfig::default() };
//! let server = Server::bind(config, simple(|request: &[u8]| request.to_ascii_uppercase()))?;
//! let mut client = Client::new(ClientConfig::new(vec![server.local_addr()]))?;
//! assert_eq!(client.call(Policy::FixedRoute, b"hello")?, b"HELLO");
//!
//! // Open loop: many requests in flight.
//! let ids: Vec<_> = (0..10).map(|i| client.send(Policy::LbRoute, &[b'a' + i])).collect::<Result<_, _>>()?;
//! let mut done = 0;
//! while done < ids.len() {
//!     client.wait(std::time::Duration::from_millis(100));
//!     while let Some((_id, result)) = client.try_recv() {
//!         assert_eq!(result?.len(), 1);
//!         done += 1;
//!     }
//! }
//! // No replication hook: REPLICATED_ROUTE is refused, not faked.
//! assert!(client.call(Policy::ReplicatedRoute, b"x").is_err());
//! server.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod auth;
pub mod client;
pub mod core;
pub mod disk;
mod handler;
pub mod header;
pub mod kv;
mod mmsg;
pub mod node;
pub mod raft;
pub mod reassembly;
pub mod replication;
pub mod server;
mod stats;

pub use auth::AuthConfig;
pub use client::{CallError, Client, ClientConfig, ClientStats, RequestId};
pub use core::{CoreConfig, Executor, InlineExecutor, ServerCore, Transport};
pub use header::{DecodeError, ErrorCode, Header, MessageType, Policy};
pub use kv::{KvOp, KvReply, KvService, KvState};
pub use node::{
    CROWDED_IDLE, NodeCore, NodeOptions, NodeReplication, RunningNode, ServiceKind, SpinService, start_node,
};
pub use raft::{RaftOptions, RaftReplication, RaftStatus};
pub use reassembly::{Reassembler, ReassemblyConfig, ReassemblyStats};
pub use replication::{ClientRef, ReplicatedRequest, Replication, ReplicationAction, ReplicationOutput};
pub use server::{
    FnHandler, Handler, HandlerMode, Job, Outgoing, RemoteResponder, Responder, ResponseHandle, SOCKET_IDLE,
    Server, ServerConfig, SimpleHandler, handler_fn, pin_current_thread, simple,
};
pub use stats::Stats;
