//! Authenticated R2P2 datagrams (SECURITY.md).
//!
//! # What is authenticated, with which secret
//! | message | secret | checked |
//! |---|---|---|
//! | RAFT (replica → replica) | the cluster secret | always, when the server has one |
//! | Admin (operator → replicas) | the admin secret, a separate one | always: without an admin secret configured, admin commands are refused |
//! | REQUEST (client → server) | the client secret | when `require_client_mac` is set |
//! | RESPONSE, REDIRECT, ERROR (server → client) | the client secret | by clients that hold it: a server with a client secret seals every answer |
//!
//! # Wire format
//! An authenticated datagram has `FLAG_AUTH` in its header and ends, after
//! its `payload_len` payload bytes, in the [`ordo_auth::datagram`] trailer:
//! a big-endian u64 counter and the first 16 bytes of HMAC-SHA-256 over
//! the header, the payload and the counter. The key is derived from the
//! secret with the message class's label ([`RAFT_LABEL`], [`ADMIN_LABEL`],
//! [`CLIENT_LABEL`]), so a client's MAC is no admin MAC and neither is a
//! replica's. Every MAC also covers the destination server's id (not sent:
//! the receiver supplies its own node id; a client uses the server's index
//! in its `servers` list, which is therefore in id order), so a datagram
//! captured on its way to one server does not verify at another. The sender is the header's `client_id` (a replica's node id
//! for RAFT), covered by the MAC; the Raft term, log entries and every other
//! field of the payload are covered too.
//!
//! # Invariants
//! - Every datagram is checked **before** reassembly: a forged fragment
//!   costs one MAC computation and holds no memory.
//! - A RAFT datagram reaches the Raft node only if its MAC verifies, its
//!   sender id is a replica's other than ours, and its counter is fresh for
//!   that sender (a replay window per replica); otherwise it is dropped and
//!   counted (`drop_unauthenticated`, `drop_bad_mac`, `drop_replayed`).
//! - An admin command or a request refused for its credential gets an
//!   ERROR [`ErrorCode::Unauthorized`](crate::header::ErrorCode) reply and
//!   changes nothing. A replayed or stale one is dropped without a reply
//!   (it may be the network's duplicate of a request that was served).
//! - Memory for client and admin replay windows is bounded
//!   (`client_windows` each), with freshness bounds (`client_max_age` in
//!   the past, `max_clock_skew` in the future) on counters, which client
//!   sealers draw from the wall clock, and a floor (the server's start, then
//!   the top of every evicted window) that a new sender must pass.

use crate::header::{FLAG_AUTH, Header, MessageType};
use ordo_auth::{OpenError, Opener, Sealer, Secret};
use std::time::Duration;

/// Label of the key that MACs RAFT datagrams.
pub const RAFT_LABEL: &str = "ordo r2p2 raft v1";
/// Label of the key that MACs Admin datagrams.
pub const ADMIN_LABEL: &str = "ordo r2p2 admin v1";
/// Label of the key that MACs client REQUEST datagrams.
pub const CLIENT_LABEL: &str = "ordo r2p2 client v1";
/// Label of the key that MACs answers to clients (from the client secret).
pub const ANSWER_LABEL: &str = "ordo r2p2 answer v1";

/// Who must prove what to a server (see the module docs).
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// The cluster secret: RAFT datagrams are sealed with it and only
    /// sealed ones are accepted. `None`: replica traffic is trusted by
    /// source address only (closed test networks).
    pub cluster: Option<Secret>,
    /// The admin secret. `None`: admin commands are refused.
    pub admin: Option<Secret>,
    /// The client secret: requests sealed with it are checked.
    pub client: Option<Secret>,
    /// Refuse requests that are not sealed with the client secret.
    pub require_client_mac: bool,
    /// Client and admin counters must lie within this of the server's
    /// clock (default 120 s).
    pub client_max_age: Duration,
    /// Client (and, separately, admin) replay windows kept (default 4096).
    pub client_windows: usize,
    /// RAFT counters older than this by the receiver's clock are refused
    /// (default 10 min; 0: no check); replica clocks must agree to within
    /// it. After a receiver restarts (its windows empty), a genuine RAFT
    /// datagram younger than this can be accepted once more — which Raft,
    /// built for networks that duplicate and delay, tolerates.
    pub peer_max_age: Duration,
    /// How far ahead of the server's clock a client's or admin's counter
    /// may be (default 5 s), and how far before the server's start the
    /// first accepted one may be.
    pub max_clock_skew: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            cluster: None,
            admin: None,
            client: None,
            require_client_mac: false,
            client_max_age: Duration::from_secs(120),
            client_windows: 4096,
            peer_max_age: Duration::from_secs(600),
            max_clock_skew: Duration::from_secs(5),
        }
    }
}

/// Why an incoming datagram failed authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No MAC where one is required.
    Missing,
    /// A MAC that does not verify, or a sender we do not accept.
    BadMac,
    /// A replayed or stale counter.
    Replayed,
    /// Too many recent clients to track another.
    Busy,
    /// An admin command, and this server has no admin secret.
    AdminDisabled,
}

impl Refusal {
    fn from_open(e: OpenError) -> Refusal {
        match e {
            OpenError::Replayed(_) | OpenError::Stale { .. } => Refusal::Replayed,
            OpenError::Busy => Refusal::Busy,
            OpenError::Truncated | OpenError::BadTag | OpenError::UnknownSender(_) => Refusal::BadMac,
        }
    }

    /// The explanation an ERROR reply carries.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::Missing => "unauthorized: this message needs a MAC made with the right secret",
            Refusal::BadMac => "unauthorized: the MAC does not verify (wrong secret?)",
            Refusal::Replayed => "unauthorized: replayed or stale datagram (check the clock)",
            Refusal::Busy => "overloaded: too many recent clients to track another; retry",
            Refusal::AdminDisabled => {
                "unauthorized: admin commands are disabled (no admin secret configured)"
            }
        }
    }
}

/// A server's checks and its RAFT sealer.
pub(crate) struct ServerAuth {
    raft_sealer: Option<Sealer>,
    answer_sealer: Option<Sealer>,
    raft: Option<Opener>,
    admin: Option<Opener>,
    client: Option<Opener>,
    require_client_mac: bool,
    node_id: u64,
}

impl ServerAuth {
    /// `now_unix_ns`: the server's start (the clients' first floor).
    pub(crate) fn new(config: &AuthConfig, replicas: usize, node_id: u64, now_unix_ns: u64) -> ServerAuth {
        let nanos = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        let age = nanos(config.client_max_age).max(1);
        let skew = nanos(config.max_clock_skew).max(1);
        let peer_age = nanos(config.peer_max_age);
        let windows = config.client_windows.max(1);
        let clients =
            |label| move |s: &Secret| Opener::for_clients(s.derive(label), windows, age, skew, now_unix_ns);
        ServerAuth {
            raft_sealer: config.cluster.as_ref().map(|s| Sealer::new(s.derive(RAFT_LABEL))),
            answer_sealer: config.client.as_ref().map(|s| Sealer::new(s.derive(ANSWER_LABEL))),
            raft: config
                .cluster
                .as_ref()
                .map(|s| Opener::for_peers(s.derive(RAFT_LABEL), replicas, peer_age)),
            admin: config.admin.as_ref().map(clients(ADMIN_LABEL)),
            client: config.client.as_ref().map(clients(CLIENT_LABEL)),
            require_client_mac: config.require_client_mac,
            node_id,
        }
    }

    /// Checks one decoded datagram (`header` from `datagram`) before it is
    /// reassembled; `wall_clock` is read only for a datagram that has a MAC
    /// to check (nothing else pays for a clock read).
    pub(crate) fn check(
        &mut self,
        header: &Header,
        datagram: &[u8],
        wall_clock: impl FnOnce() -> u64,
    ) -> Result<(), Refusal> {
        let sealed = header.flags & FLAG_AUTH != 0;
        let opener = match header.message_type {
            MessageType::Raft => {
                let Some(opener) = self.raft.as_mut() else { return Ok(()) };
                if header.client_id == self.node_id {
                    return Err(Refusal::BadMac); // our own id: a reflection
                }
                opener
            }
            MessageType::Admin => self.admin.as_mut().ok_or(Refusal::AdminDisabled)?,
            MessageType::Request => match self.client.as_mut() {
                Some(opener) if sealed || self.require_client_mac => opener,
                _ if self.require_client_mac => return Err(Refusal::Missing),
                _ => return Ok(()),
            },
            // Servers accept no other type; the core counts them.
            _ => return Ok(()),
        };
        if !sealed {
            return Err(Refusal::Missing);
        }
        let context = destination_context(self.node_id);
        opener
            .open(header.client_id, datagram, wall_clock(), &context)
            .map(|_| ())
            .map_err(Refusal::from_open)
    }

    /// Seals a RAFT datagram for replica `to` in place (a no-op without a
    /// cluster secret).
    pub(crate) fn seal_raft(&mut self, datagram: &mut Vec<u8>, now_unix_ns: u64, to: u64) {
        if let Some(sealer) = self.raft_sealer.as_mut() {
            sealer.seal(datagram, now_unix_ns, &destination_context(to));
        }
    }

    /// Whether RAFT datagrams are sealed (their headers carry `FLAG_AUTH`).
    pub(crate) fn seals_raft(&self) -> bool {
        self.raft_sealer.is_some()
    }

    /// Whether answers to clients are sealed (a client secret is configured).
    pub(crate) fn seals_answers(&self) -> bool {
        self.answer_sealer.is_some()
    }

    /// Seals an answer to client `client_id` in place (a no-op without a
    /// client secret).
    pub(crate) fn seal_answer(&mut self, datagram: &mut Vec<u8>, now_unix_ns: u64, client_id: u64) {
        if let Some(sealer) = self.answer_sealer.as_mut() {
            sealer.seal(datagram, now_unix_ns, &destination_context(client_id));
        }
    }
}

/// What every MAC covers besides the datagram: the destination server's id.
pub(crate) fn destination_context(to: u64) -> [u8; 8] {
    to.to_be_bytes()
}

/// The wall clock in nanoseconds since the Unix epoch.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
