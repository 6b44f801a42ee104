//! What application code sees: the [`Handler`] trait, the right to answer
//! one request ([`ResponseHandle`]), the ways to answer ([`Responder`] on
//! the handler's thread, [`RemoteResponder`] from any thread), and the
//! [`Job`]s an executor runs.
//!
//! # Invariants
//! - A handle is answered at most once (it is moved into the answer).
//! - A follower's answer to a committed request (`will_respond() == false`)
//!   is shown to the replication hook and never sent.
//! - Every queue between threads is bounded: a worker waits (yielding)
//!   while its response queue is full; a full [`RemoteResponder`] queue
//!   drops the answer and counts it.

use crate::header::{ErrorCode, MessageType, Policy};
use crate::replication::ClientRef;
use crate::stats::Counters;
use rtrb::{Producer, PushError};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The right (and duty) to answer one request, once. Moving it to another
/// thread and answering through a [`RemoteResponder`] is allowed; dropping
/// it without answering leaves the client to retry.
#[derive(Debug)]
pub struct ResponseHandle {
    pub(crate) client: ClientRef,
    pub(crate) policy: Policy,
    pub(crate) respond: bool,
}

impl ResponseHandle {
    /// Who asked.
    pub fn client(&self) -> ClientRef {
        self.client
    }
    /// The request's policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }
    /// False for committed requests applied on a follower: the answer is
    /// computed and dropped.
    pub fn will_respond(&self) -> bool {
        self.respond
    }
}

/// An answer on its way to the network thread (a handler's answer, a
/// snapshot for the hook, or the hook's own reply); opaque outside the crate.
#[derive(Debug)]
pub struct Outgoing {
    pub(crate) to: SocketAddr,
    pub(crate) message_type: MessageType,
    pub(crate) policy: Policy,
    pub(crate) client_id: u64,
    pub(crate) request_id: u32,
    pub(crate) leader_hint: Option<u16>,
    pub(crate) payload: Vec<u8>,
    /// False: a follower's answer, shown to the hook and then dropped.
    pub(crate) send: bool,
    /// A handler's answer to a REPLICATED_ROUTE request: handed to the hook
    /// ([`Replication::on_response`]) once it is sent or dropped.
    pub(crate) observe: bool,
    /// A handler's snapshot for the hook ([`Replication::on_snapshot`]);
    /// nothing is sent.
    pub(crate) snapshot: Option<Option<Vec<u8>>>,
}

impl Outgoing {
    pub(crate) fn response(handle: &ResponseHandle, payload: Vec<u8>) -> Self {
        Outgoing {
            to: handle.client.addr,
            message_type: MessageType::Response,
            policy: handle.policy,
            client_id: handle.client.client_id,
            request_id: handle.client.request_id,
            leader_hint: None,
            payload,
            send: handle.respond,
            observe: handle.policy == Policy::ReplicatedRoute,
            snapshot: None,
        }
    }
    pub(crate) fn snapshot(handle: &ResponseHandle, state: Option<Vec<u8>>) -> Self {
        let mut item = Outgoing::response(handle, Vec::new());
        item.send = false;
        item.observe = false;
        item.snapshot = Some(state);
        item
    }
    pub(crate) fn error(client: ClientRef, policy: Policy, code: ErrorCode, reason: &str) -> Self {
        let mut payload = Vec::with_capacity(1 + reason.len());
        payload.push(code as u8);
        payload.extend_from_slice(reason.as_bytes());
        Outgoing {
            to: client.addr,
            message_type: MessageType::Error,
            policy,
            client_id: client.client_id,
            request_id: client.request_id,
            leader_hint: None,
            payload,
            send: true,
            observe: false,
            snapshot: None,
        }
    }
}

/// What wakes the thread that sends answers (the server's network thread;
/// nothing in a simulation, which polls).
pub(crate) type WakeFn = Box<dyn Fn() + Send + Sync>;

pub(crate) struct RemoteQueue {
    pub(crate) queue: Mutex<VecDeque<Outgoing>>,
    capacity: usize,
    counters: Arc<Counters>,
    wake: Option<WakeFn>,
}

/// Answers requests from any thread (a cloneable, `Send` handle to the
/// network thread, behind a small mutex-protected bounded queue). Slower
/// than [`Responder::send_response`]; meant for answers produced later.
#[derive(Clone)]
pub struct RemoteResponder {
    pub(crate) inner: Arc<RemoteQueue>,
}

impl RemoteResponder {
    /// A bounded queue of `capacity` answers; `wake` (if any) is called
    /// after each answer is queued.
    pub(crate) fn new(capacity: usize, counters: Arc<Counters>, wake: Option<WakeFn>) -> Self {
        RemoteResponder {
            inner: Arc::new(RemoteQueue { queue: Mutex::new(VecDeque::new()), capacity, counters, wake }),
        }
    }

    /// Moves every queued answer into `out`; returns how many.
    pub(crate) fn drain_into(&self, out: &mut Vec<Outgoing>) -> usize {
        let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = queue.len();
        out.extend(queue.drain(..));
        n
    }

    /// Whether answers are waiting.
    pub(crate) fn is_pending(&self) -> bool {
        !self.inner.queue.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Sends the answer to `handle`'s request (dropped and counted when the
    /// queue is full; a follower's answer is shown to the hook and dropped).
    pub fn send_response(&self, handle: ResponseHandle, response: Vec<u8>) {
        {
            let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if queue.len() >= self.inner.capacity {
                Counters::bump_shared(&self.inner.counters.drop_remote_queue_full);
                return;
            }
            queue.push_back(Outgoing::response(&handle, response));
        }
        if let Some(wake) = &self.inner.wake {
            wake();
        }
    }
}

pub(crate) enum Sink<'a> {
    /// Straight into the list of answers of the thread that sends them.
    Net(&'a mut Vec<Outgoing>),
    /// A worker's SPSC response queue; `notify` wakes the network thread.
    Worker { queue: &'a mut Producer<Outgoing>, notify: &'a dyn Fn(), stop: &'a AtomicBool },
}

/// Given to a handler with each request: the fast way to answer, from the
/// thread the handler runs on.
pub struct Responder<'a> {
    pub(crate) sink: Sink<'a>,
    pub(crate) remote: &'a RemoteResponder,
}

impl Responder<'_> {
    /// Sends the answer to `handle`'s request. On a worker this pushes onto
    /// the worker's SPSC response queue (waiting, yielding, while it is
    /// full); on the network thread it queues the datagrams directly.
    /// Answers to REPLICATED_ROUTE requests are sent (a follower's,
    /// `respond: false`, dropped and counted) and then handed to the hook
    /// ([`Replication::on_response`](crate::Replication::on_response)).
    pub fn send_response(&mut self, handle: ResponseHandle, response: Vec<u8>) {
        self.push(Outgoing::response(&handle, response));
    }

    fn push(&mut self, item: Outgoing) {
        let mut item = item;
        match &mut self.sink {
            Sink::Net(out) => out.push(item),
            Sink::Worker { queue, notify, stop } => {
                loop {
                    match queue.push(item) {
                        Ok(()) => break,
                        Err(PushError::Full(back)) => {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            item = back;
                            notify();
                            std::thread::yield_now();
                        }
                    }
                }
                notify();
            }
        }
    }

    /// A handle for answering later or from another thread.
    pub fn remote(&self) -> RemoteResponder {
        self.remote.clone()
    }
}

/// Application code: called once per request (per arrival for FIXED/LB, per
/// commit for REPLICATED). `Sync` because worker threads share it.
pub trait Handler: Send + Sync + 'static {
    /// Handles `request`; answer with `responder.send_response(handle, ..)`
    /// now, or later through [`Responder::remote`], or never.
    fn on_request(&self, request: &[u8], handle: ResponseHandle, responder: &mut Responder<'_>);

    /// The state built by the REPLICATED_ROUTE requests applied so far,
    /// serialized (called on the thread that applies them, between two of
    /// them, when the replication hook takes a snapshot to compact its log).
    /// `None` (the default): this handler keeps no replicated state to
    /// snapshot, and the hook keeps its whole log.
    fn snapshot(&self) -> Option<Vec<u8>> {
        None
    }

    /// Replaces the replicated state by a [`snapshot`](Handler::snapshot)'s
    /// (a restarted or lagging replica installing one). Called in order with
    /// the applied requests.
    fn restore(&self, state: &[u8]) -> Result<(), String> {
        let _ = state;
        Err("this handler does not restore snapshots".into())
    }
}

/// A [`Handler`] from a closure `Fn(&[u8], ResponseHandle, &mut Responder)`
/// (see [`handler_fn`]).
pub struct FnHandler<F>(F);

impl<F> Handler for FnHandler<F>
where
    F: Fn(&[u8], ResponseHandle, &mut Responder<'_>) + Send + Sync + 'static,
{
    fn on_request(&self, request: &[u8], handle: ResponseHandle, responder: &mut Responder<'_>) {
        (self.0)(request, handle, responder)
    }
}

/// Wraps an event-style closure as a [`Handler`] (R2P2's `recv_cb`).
pub fn handler_fn<F>(f: F) -> FnHandler<F>
where
    F: Fn(&[u8], ResponseHandle, &mut Responder<'_>) + Send + Sync + 'static,
{
    FnHandler(f)
}

/// A [`Handler`] that answers every request with `f(request)` at once.
pub struct SimpleHandler<F>(F);

impl<F> Handler for SimpleHandler<F>
where
    F: Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static,
{
    fn on_request(&self, request: &[u8], handle: ResponseHandle, responder: &mut Responder<'_>) {
        let response = (self.0)(request);
        responder.send_response(handle, response);
    }
}

/// Wraps `Fn(&[u8]) -> Vec<u8>` as a [`Handler`].
pub fn simple<F>(f: F) -> SimpleHandler<F>
where
    F: Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static,
{
    SimpleHandler(f)
}

/// The placeholder client of snapshot and restore jobs (never answered).
pub(crate) const NO_CLIENT: ClientRef = ClientRef {
    addr: SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0)),
    client_id: 0,
    request_id: 0,
};

/// Work for a [`Handler`]: a request to answer, or a snapshot or restore
/// that the replication hook asked for. Run by an
/// [`Executor`](crate::core::Executor) on the thread it chooses.
#[derive(Debug)]
pub struct Job {
    pub(crate) handle: ResponseHandle,
    pub(crate) payload: Vec<u8>,
    pub(crate) kind: JobKind,
}

/// What a job asks of the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// `on_request(payload)`.
    Request,
    /// `snapshot()`, answered to the hook's `on_snapshot`.
    Snapshot,
    /// `restore(payload)`.
    Restore,
}

impl Job {
    /// Runs the job on the current thread.
    pub fn run(self, handler: &dyn Handler, responder: &mut Responder<'_>) {
        match self.kind {
            JobKind::Request => handler.on_request(&self.payload, self.handle, responder),
            JobKind::Snapshot => {
                let state = handler.snapshot();
                responder.push(Outgoing::snapshot(&self.handle, state));
            }
            JobKind::Restore => {
                if let Err(e) = handler.restore(&self.payload) {
                    tracing::error!(error = %e, "r2p2: the handler could not restore a replicated snapshot");
                }
            }
        }
    }
}
