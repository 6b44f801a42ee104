//! The `tcp` backend of the ordo fabric (DESIGN.md §2): one-sided ordered
//! writes between members on any hosts, over one TCP stream per pair of
//! members carrying `(offset, len, bytes)` frames that a receive thread
//! applies to the region in order.
//!
//! # Invariants (how the [`ordo_fabric`] guarantees are kept)
//! - **FIFO per peer.** There is one stream per peer pair, a post appends
//!   its whole frame to the peer's outbound queue under the link's lock, and
//!   the receiver applies frames strictly in stream order, each followed by
//!   a `Release` fence. WRITE sequence numbers (per stream, from 1) are
//!   checked on receipt.
//! - **Untorn words.** The sender snapshots the range with one atomic load
//!   per aligned word; the receiver stores with [`ordo_fabric::copy_untorn`].
//! - **Bad frames are never applied, not even partly.** Each header is
//!   validated (known kind, `len <= max_frame_bytes`, `offset + len <=
//!   region_len` with checked arithmetic, expected sequence number, no
//!   HELLO after the handshake) before any of its payload is touched, and a
//!   WRITE is applied only once its whole payload has arrived. A bad frame
//!   is logged with `tracing::error!`, closes the connection and raises
//!   [`FabricEvent::Suspected`](ordo_fabric::FabricEvent) with
//!   [`FailureCause::BadFrame`](ordo_fabric::FailureCause).
//! - **Signaled writes complete exactly once, in posting order**, when the
//!   peer's cumulative ACK covers them (sent after the write is applied, so
//!   completion implies visibility), or fail: `TimedOut` after
//!   `write_timeout` (checked by `poll_events`; it also takes the link down),
//!   `ConnectionLost`/`BadFrame` when the stream ends. Each link failure
//!   raises one `Suspected`; from then on posts to the peer return
//!   `PeerSuspected` and whatever was queued for the dead stream is
//!   discarded, never sent on a later one.
//! - **Bounded memory.** Per peer: a preallocated outbound ring of
//!   `send_buffer_bytes` (plus room for two ACKs) — a post that does not fit
//!   returns [`PostError::Backpressure`](ordo_fabric::PostError) having
//!   posted nothing; a receive buffer of one header plus `max_frame_bytes`,
//!   allocated at start-up, so a frame's `len` claim never sizes an
//!   allocation; at most `max_signaled_in_flight` unreported signaled writes.
//!   At most 64 handshakes are in progress at once, at most
//!   `max_handshakes_per_source` from one source address (beyond either one
//!   is closed, a stranger's before one from a member's address, a silent
//!   one before one that sent its HELLO, at random among equals), each for
//!   at most `handshake_timeout`.
//! - **Nothing from a stranger is applied.** A connection's frames reach
//!   the region only after its handshake has proved, both ways, that the
//!   peer holds the cluster secret (below); until then exactly the two
//!   handshake frames are read from it.
//!
//! # Frames
//! Every frame is a 24-byte little-endian header, then `len` payload bytes:
//!
//! | bytes | field | HELLO | WRITE | ACK | PROOF |
//! |---|---|---|---|---|---|
//! | 0 | kind | 1 | 2 | 3 | 4 |
//! | 1 | flags | 0 | bit 0: SIGNALED (ack me) | 0 | 0 |
//! | 2..4 | reserved | 0 | 0 | 0 | 0 |
//! | 4..8 | len (u32) | 48 | bytes to write | 0 | 32 |
//! | 8..16 | offset (u64) | 0 | region offset | 0 | 0 |
//! | 16..24 | seq (u64) | sender's incarnation | write seq (1, 2, ... per stream) | highest applied write seq | 0 |
//!
//! The HELLO payload (48 bytes): magic `"ORDO"`, protocol version (u16,
//! now 2), 2 reserved bytes, member id (u32), 4 reserved bytes, region
//! length (u64), FNV-1a hash of the cluster name (u64), and a 16-byte nonce,
//! fresh for every connection. The PROOF payload is a 32-byte
//! HMAC-SHA-256 tag. See [`frame`].
//!
//! # Connections and the handshake
//! The member with the lower id dials the higher id's listen address.
//! ```text
//! dialer                               acceptor
//!   HELLO_d (nonce_d)        ────────▶  checks version, cluster, region, id
//!                            ◀────────  HELLO_a (nonce_a), PROOF_a
//!   checks HELLO_a, PROOF_a
//!   PROOF_d                  ────────▶  checks PROOF_d; only now is the
//!                                       connection the peer's link
//! PROOF_x = HMAC-SHA-256(K, role_x ‖ HELLO_d ‖ HELLO_a)   (ordo_auth::handshake)
//! K = HMAC-SHA-256(cluster secret, "ordo tcp fabric handshake v2")
//! ```
//! Fresh nonces on both sides defeat a replayed handshake, the role label a
//! reflected one; tags are compared in constant time. A HELLO that does not
//! match (version, cluster, region length, expected member id) or a proof
//! that does not verify closes the connection; the first refusal from each
//! source address is logged with `tracing::error!`, later ones at debug
//! level. A refused connection never touches the link of the member it
//! claimed to be. Without a secret ([`TcpOptions::secret`] `None`) the
//! same handshake runs with a public key, which authenticates nothing.
//! After the handshake the stream is plain TCP: an attacker who can inject
//! into an established connection (on the path) is outside this backend's
//! threat model (SECURITY.md). `TCP_NODELAY` is on.
//! After a link fails, the dialing side redials every `reconnect_interval`
//! and the accepting side accepts a new HELLO from that member; the new
//! connection stands by (incoming writes on it are applied) until
//! [`Fabric::reconnect`](ordo_fabric::Fabric::reconnect) makes it the link,
//! reporting `Reconnected`.
//!
//! # Threads
//! Each [`TcpFabric`] runs one background I/O thread (a `mio::Poll`): it
//! accepts and dials, runs handshakes, reads and applies incoming frames,
//! rings the [`Doorbell`](ordo_fabric::Doorbell), records and sends ACKs,
//! and flushes outbound queues when sockets become writable. The caller's
//! thread posts: it copies the frame into the peer's outbound ring and
//! writes to the (non-blocking) socket at once; what the socket does not take
//! is flushed later by the I/O thread. The two share each peer's state
//! behind one mutex per peer. Dropping the fabric wakes the I/O thread
//! (a `mio::Waker`), which closes every socket and exits; `drop` joins it.

#![warn(missing_docs)]

pub mod frame;
mod io;
mod link;
mod ring;
mod tls;

mod fabric;

pub use fabric::{HANDSHAKE_KEY_LABEL, TcpBinding, TcpError, TcpFabric, TcpOptions};
pub use ordo_auth::Secret;
pub use tls::TlsSettings;
