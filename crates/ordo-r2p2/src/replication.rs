//! The replication hook behind `REPLICATED_ROUTE` (r3p2 §3).
//!
//! The server's network thread owns one [`Replication`] value and calls it
//! for every REPLICATED_ROUTE request, every RAFT message from a peer and
//! every tick. The hook does no I/O: it answers by pushing
//! [`ReplicationAction`]s into a [`ReplicationOutput`], which the network
//! thread executes **in order** right after the call returns.
//!
//! # Contract
//! - Calls are serial, on the network thread, with monotonic `now_ns`.
//!   A hook must not block: the whole server stops while it runs.
//! - `Apply` actions are handed to the application handler in exactly the
//!   order they were pushed, across calls: in `HandlerMode::NetworkThread`
//!   on the network thread, in `HandlerMode::Workers(n)` always on worker 0
//!   (a FIFO SPSC queue, with an unbounded-by-design backlog in front of it:
//!   committed entries are never dropped). The hook must push `Apply` in log
//!   (commit) order, on every replica, so every replica's handler sees the
//!   same sequence. Handlers serving REPLICATED_ROUTE must therefore be
//!   deterministic functions of that sequence.
//! - `Apply { respond: true }` on the leader sends the handler's answer to
//!   the client; `respond: false` (followers, r3p2 §3.3) runs the handler and
//!   drops its answer (counted in `drop_follower_responses`). Either way the
//!   answer is then handed to [`Replication::on_response`] (a reply cache).
//! - Duplicate suppression is the hook's job: a client retries with the same
//!   `(client_id, request_id)`, possibly at another replica, and the hook
//!   should apply each pair once (e.g. a per-client table kept in the log).
//!   The transport itself executes FIXED/LB requests at least once per
//!   arrival.
//! - Peers are named by their index in `ServerConfig::peers`; a RAFT
//!   datagram from an address not in that list is dropped before the hook
//!   sees it (`drop_unknown_peer`). Peer messages of any size are split and
//!   reassembled by the transport like any other message.
//! - [`Replication::leader_hint`] is read after each call; when `Some`, every
//!   response the server sends carries it, so clients find the leader
//!   without a redirect hop.

use crate::header::ErrorCode;
use std::net::SocketAddr;

/// Who asked: enough to answer a request from any thread or after a delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientRef {
    /// The client's socket address (where the answer goes).
    pub addr: SocketAddr,
    /// The client's id (header).
    pub client_id: u64,
    /// The request's id (header).
    pub request_id: u32,
}

/// A complete REPLICATED_ROUTE request handed to the hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicatedRequest {
    /// Who sent it; keep it with the log entry to answer on commit.
    pub client: ClientRef,
    /// The request payload (the application's bytes).
    pub payload: Vec<u8>,
    /// The client's lowest request id that may still be unanswered: every
    /// lower one was answered or given up, so its answer need not be kept
    /// (the header's answered span; 0 when the client did not say).
    pub answered_below: u32,
}

/// One effect requested by the hook, executed by the network thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicationAction {
    /// Send `message` to replica `peer` (index into `ServerConfig::peers`)
    /// as a RAFT message.
    SendToPeer {
        /// Peer index.
        peer: usize,
        /// Opaque hook bytes.
        message: Vec<u8>,
    },
    /// Run the handler on a committed request, in commit order.
    Apply {
        /// Who asked (on followers this may be any value; it is not used
        /// when `respond` is false).
        client: ClientRef,
        /// The request payload.
        payload: Vec<u8>,
        /// Send the handler's answer (leader) or drop it (follower).
        respond: bool,
    },
    /// Answer the client with REDIRECT: "the leader is replica `leader`".
    Redirect {
        /// Who asked.
        client: ClientRef,
        /// Leader index into `ServerConfig::peers` (the server adds its
        /// address to the message when it knows it).
        leader: u16,
    },
    /// Answer the client with RESPONSE `payload` directly (e.g. a cached
    /// answer to a duplicate of an already-applied request).
    Respond {
        /// Who asked.
        client: ClientRef,
        /// The answer.
        payload: Vec<u8>,
    },
    /// Ask the handler for a snapshot of its replicated state, in order with
    /// the `Apply`s (after every earlier one, before every later one); the
    /// answer comes to [`Replication::on_snapshot`].
    Snapshot,
    /// Replace the handler's replicated state by `state` (a snapshot), in
    /// order with the `Apply`s.
    Restore {
        /// A [`crate::Handler::snapshot`]'s bytes.
        state: Vec<u8>,
    },
    /// Answer the client with ERROR.
    Refuse {
        /// Who asked.
        client: ClientRef,
        /// Why.
        code: ErrorCode,
        /// A human-readable reason.
        reason: String,
    },
}

/// Where a hook writes its effects; drained by the network thread after each
/// call (the buffer is reused, so a hook must not keep references).
#[derive(Debug, Default)]
pub struct ReplicationOutput {
    /// The effects, in the order they must happen.
    pub actions: Vec<ReplicationAction>,
}

impl ReplicationOutput {
    /// Queues a RAFT message to `peer`.
    pub fn send_to_peer(&mut self, peer: usize, message: Vec<u8>) {
        self.actions.push(ReplicationAction::SendToPeer { peer, message });
    }
    /// Queues a committed request for the handler (commit order!).
    pub fn apply(&mut self, client: ClientRef, payload: Vec<u8>, respond: bool) {
        self.actions.push(ReplicationAction::Apply { client, payload, respond });
    }
    /// Queues a REDIRECT to the client.
    pub fn redirect(&mut self, client: ClientRef, leader: u16) {
        self.actions.push(ReplicationAction::Redirect { client, leader });
    }
    /// Queues a RESPONSE to the client (not shown to `on_response`).
    pub fn respond(&mut self, client: ClientRef, payload: Vec<u8>) {
        self.actions.push(ReplicationAction::Respond { client, payload });
    }
    /// Queues a snapshot request to the handler (in order with `apply`).
    pub fn snapshot(&mut self) {
        self.actions.push(ReplicationAction::Snapshot);
    }
    /// Queues a restore of the handler's state (in order with `apply`).
    pub fn restore(&mut self, state: Vec<u8>) {
        self.actions.push(ReplicationAction::Restore { state });
    }
    /// Queues an ERROR reply to the client.
    pub fn refuse(&mut self, client: ClientRef, code: ErrorCode, reason: impl Into<String>) {
        self.actions.push(ReplicationAction::Refuse { client, code, reason: reason.into() });
    }
}

/// The pluggable replication engine behind REPLICATED_ROUTE (see the module
/// docs for the full contract).
pub trait Replication: Send + 'static {
    /// A client's complete REPLICATED_ROUTE request arrived at this replica.
    /// A leader proposes it (and later `apply`s it); a follower typically
    /// `redirect`s.
    fn on_request(&mut self, request: ReplicatedRequest, now_ns: u64, out: &mut ReplicationOutput);

    /// A complete RAFT message arrived from replica `from`.
    fn on_peer_message(&mut self, from: usize, message: &[u8], now_ns: u64, out: &mut ReplicationOutput);

    /// Periodic timer (every `ServerConfig::tick_interval`, and whenever the
    /// network thread is otherwise idle at most that late): heartbeats,
    /// elections, retransmissions.
    fn tick(&mut self, now_ns: u64, out: &mut ReplicationOutput);

    /// The handler answered a committed request (`Apply`): `response` is its
    /// answer, handed over once it was sent (`sent`: to the client, on the
    /// leader) or dropped (a follower's). Called on the network thread, in the order the
    /// answers reach it — with one handler thread for replicated requests
    /// that is commit order, unless a handler answers later through a
    /// `RemoteResponder`. Lets a hook keep a per-client reply cache on every
    /// replica, to answer retried duplicates with `respond` (exactly-once).
    fn on_response(&mut self, client: ClientRef, response: Vec<u8>, sent: bool, out: &mut ReplicationOutput) {
        let _ = (client, response, sent, out);
    }

    /// The handler's answer to an [`ReplicationAction::Snapshot`], in order
    /// with the `on_response`s of the applied requests (`None`: the handler
    /// keeps no snapshot-able state).
    fn on_snapshot(&mut self, state: Option<Vec<u8>>, out: &mut ReplicationOutput) {
        let _ = (state, out);
    }

    /// Called once per turn of the network loop, after the turn's received
    /// messages and tick: the place to persist a batch (one fsync for
    /// everything the turn produced: group commit) and release what waited
    /// for it.
    fn flush(&mut self, now_ns: u64, out: &mut ReplicationOutput) {
        let _ = (now_ns, out);
    }

    /// A client's control command (message type Admin), e.g. a membership
    /// change. The default refuses it.
    fn on_admin(&mut self, request: ReplicatedRequest, now_ns: u64, out: &mut ReplicationOutput) {
        let _ = now_ns;
        out.refuse(request.client, ErrorCode::Rejected, "this replication hook takes no admin commands");
    }

    /// The leader as this replica believes it, stamped on every response.
    fn leader_hint(&self) -> Option<u16> {
        None
    }
}

/// A boxed hook is a hook (the server stores `Box<dyn Replication>`).
impl<R: Replication + ?Sized> Replication for Box<R> {
    fn on_request(&mut self, request: ReplicatedRequest, now_ns: u64, out: &mut ReplicationOutput) {
        (**self).on_request(request, now_ns, out)
    }
    fn on_peer_message(&mut self, from: usize, message: &[u8], now_ns: u64, out: &mut ReplicationOutput) {
        (**self).on_peer_message(from, message, now_ns, out)
    }
    fn tick(&mut self, now_ns: u64, out: &mut ReplicationOutput) {
        (**self).tick(now_ns, out)
    }
    fn on_response(&mut self, client: ClientRef, response: Vec<u8>, sent: bool, out: &mut ReplicationOutput) {
        (**self).on_response(client, response, sent, out)
    }
    fn on_snapshot(&mut self, state: Option<Vec<u8>>, out: &mut ReplicationOutput) {
        (**self).on_snapshot(state, out)
    }
    fn flush(&mut self, now_ns: u64, out: &mut ReplicationOutput) {
        (**self).flush(now_ns, out)
    }
    fn on_admin(&mut self, request: ReplicatedRequest, now_ns: u64, out: &mut ReplicationOutput) {
        (**self).on_admin(request, now_ns, out)
    }
    fn leader_hint(&self) -> Option<u16> {
        (**self).leader_hint()
    }
}
