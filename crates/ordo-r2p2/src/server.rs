//! The R2P2 server: one network thread, optional worker threads.
//!
//! # Threads and queues (r3p2 §4.5)
//! - The **network thread** owns the UDP socket, the [`Reassembler`], the
//!   replication hook and all sending. It polls the nonblocking socket in a
//!   duty cycle; when a cycle finds nothing it follows the configured
//!   [`IdleStrategy`], and *parking* is a blocking `mio` poll on the socket
//!   with the park timeout (a datagram, a worker's answer or shutdown wakes
//!   it at once).
//! - In [`HandlerMode::Workers`]`(n)` handlers run on `n` worker threads, each
//!   fed by its own SPSC request queue (network → worker) and answering
//!   through its own SPSC response queue (worker → network); the network
//!   thread splits answers into datagrams and sends them. In
//!   [`HandlerMode::NetworkThread`] handlers run inline on the network thread
//!   (the thesis' original design, for reproducing r3p2 §5.1).
//!
//! # Invariants
//! - FIXED_ROUTE and LB_ROUTE requests are executed locally, at least once
//!   per arrival: a client retry executes the handler again (no reply
//!   cache). A request that finds every worker queue full is dropped and
//!   counted; the client's retry is the back-pressure.
//! - REPLICATED_ROUTE requests never execute without replication: with no
//!   hook configured they are answered with ERROR [`ErrorCode::NotReplicated`].
//!   With a hook, committed requests run in commit order on one thread
//!   (worker 0, or the network thread) — see [`crate::replication`].
//! - Every datagram or message discarded increments one named counter of
//!   [`Stats`]; a bad datagram never panics the server.
//! - [`Server::shutdown`] (or drop) stops and joins every thread; answers
//!   still queued are dropped.

use crate::header::{
    self, ErrorCode, FLAG_LEADER_HINT, HEADER_SIZE, Header, MAX_DATAGRAM, MessageType, Policy,
};
use crate::reassembly::{self, Message, Reassembler, ReassemblyConfig};
use crate::replication::{ClientRef, ReplicatedRequest, Replication, ReplicationAction, ReplicationOutput};
use crate::stats::{Counters, Stats};
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token, Waker};
use ordo_runtime::{IdleAction, IdleStrategy, Idler};
use rtrb::{Consumer, Producer, PushError, RingBuffer};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

const SOCKET: Token = Token(0);
const WAKE: Token = Token(1);

/// Where request handlers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerMode {
    /// Inline on the network thread (no queues; handler time delays I/O).
    NetworkThread,
    /// On this many worker threads (≥ 1) fed by SPSC queues.
    Workers(usize),
}

/// Server configuration; every field has a default.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to bind (port 0: any free port, see [`Server::local_addr`]).
    pub bind: SocketAddr,
    /// Where handlers run.
    pub handler_mode: HandlerMode,
    /// Idle strategy of the network thread.
    pub idle: IdleStrategy,
    /// Idle strategy of worker threads (parking = `thread::park_timeout`).
    pub worker_idle: IdleStrategy,
    /// Payload bytes per datagram when sending.
    pub mtu_payload: usize,
    /// Bounds for incoming messages (also bounds outgoing packet counts).
    pub reassembly: ReassemblyConfig,
    /// Capacity of each worker's request queue and response queue.
    pub queue_depth: usize,
    /// Capacity of the queue behind [`RemoteResponder`].
    pub remote_queue_depth: usize,
    /// Replica addresses, indexed by replica id (this server included), for
    /// the replication hook; empty without replication.
    pub peers: Vec<SocketAddr>,
    /// This replica's id, sent as `client_id` on RAFT messages.
    pub node_id: u64,
    /// Period of [`Replication::tick`] and of reassembly expiry.
    pub tick_interval: Duration,
    /// Most datagrams read per duty cycle before other work is done.
    pub recv_batch: usize,
    /// SO_RCVBUF / SO_SNDBUF to ask for (the kernel caps it at
    /// `net.core.rmem_max` / `wmem_max`); `None` keeps the OS default.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            handler_mode: HandlerMode::Workers(1),
            idle: IdleStrategy::DEFAULT,
            worker_idle: IdleStrategy::DEFAULT,
            mtu_payload: 1400,
            reassembly: ReassemblyConfig::default(),
            queue_depth: 1024,
            remote_queue_depth: 4096,
            peers: Vec::new(),
            node_id: 0,
            tick_interval: Duration::from_millis(1),
            recv_batch: 64,
            socket_buffer_bytes: Some(4 << 20),
        }
    }
}

/// The right (and duty) to answer one request, once. Moving it to another
/// thread and answering through a [`RemoteResponder`] is allowed; dropping
/// it without answering leaves the client to retry.
#[derive(Debug)]
pub struct ResponseHandle {
    client: ClientRef,
    policy: Policy,
    respond: bool,
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

/// An answer on its way to the network thread.
#[derive(Debug)]
struct Outgoing {
    to: SocketAddr,
    message_type: MessageType,
    policy: Policy,
    client_id: u64,
    request_id: u32,
    leader_hint: Option<u16>,
    payload: Vec<u8>,
    /// False: a follower's answer, shown to the hook and then dropped.
    send: bool,
    /// A handler's answer to a REPLICATED_ROUTE request: shown to the hook
    /// ([`Replication::on_response`]) before it is sent or dropped.
    observe: bool,
    /// A handler's snapshot for the hook ([`Replication::on_snapshot`]);
    /// nothing is sent.
    snapshot: Option<Option<Vec<u8>>>,
}

impl Outgoing {
    fn response(handle: &ResponseHandle, payload: Vec<u8>) -> Self {
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
    fn snapshot(handle: &ResponseHandle, state: Option<Vec<u8>>) -> Self {
        let mut item = Outgoing::response(handle, Vec::new());
        item.send = false;
        item.observe = false;
        item.snapshot = Some(state);
        item
    }
    fn error(client: ClientRef, policy: Policy, code: ErrorCode, reason: &str) -> Self {
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

/// Wakes the network thread when it is parked in `poll`.
struct NetWake {
    parked: AtomicBool,
    waker: Waker,
}

impl NetWake {
    /// Called after publishing work for the network thread. The fence pairs
    /// with the one after `parked.store(true)` (Dekker): either the network
    /// thread sees the work in its re-check, or we see it parked.
    fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }
}

struct RemoteQueue {
    queue: Mutex<VecDeque<Outgoing>>,
    capacity: usize,
    counters: Arc<Counters>,
    wake: Arc<NetWake>,
}

/// Answers requests from any thread (a cloneable, `Send` handle to the
/// network thread, behind a small mutex-protected bounded queue). Slower
/// than [`Responder::send_response`]; meant for answers produced later.
#[derive(Clone)]
pub struct RemoteResponder {
    inner: Arc<RemoteQueue>,
}

impl RemoteResponder {
    /// Sends the answer to `handle`'s request (dropped and counted when the
    /// queue is full; a follower's answer is shown to the hook and dropped).
    pub fn send_response(&self, handle: ResponseHandle, response: Vec<u8>) {
        {
            let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if queue.len() >= self.inner.capacity {
                Counters::bump(&self.inner.counters.drop_remote_queue_full);
                return;
            }
            queue.push_back(Outgoing::response(&handle, response));
        }
        let _ = self.inner.wake.waker.wake();
    }
}

enum Sink<'a> {
    Net(&'a mut Vec<Outgoing>),
    Worker { queue: &'a mut Producer<Outgoing>, wake: &'a NetWake, stop: &'a AtomicBool },
}

/// Given to a handler with each request: the fast way to answer, from the
/// thread the handler runs on.
pub struct Responder<'a> {
    sink: Sink<'a>,
    remote: &'a RemoteResponder,
}

impl Responder<'_> {
    /// Sends the answer to `handle`'s request. On a worker this pushes onto
    /// the worker's SPSC response queue (waiting, yielding, while it is
    /// full); on the network thread it queues the datagrams directly.
    /// Answers to REPLICATED_ROUTE requests are first shown to the hook
    /// ([`Replication::on_response`]); a follower's (`respond: false`) is
    /// then dropped and counted.
    pub fn send_response(&mut self, handle: ResponseHandle, response: Vec<u8>) {
        self.push(Outgoing::response(&handle, response));
    }

    fn push(&mut self, item: Outgoing) {
        let mut item = item;
        match &mut self.sink {
            Sink::Net(out) => out.push(item),
            Sink::Worker { queue, wake, stop } => {
                loop {
                    match queue.push(item) {
                        Ok(()) => break,
                        Err(PushError::Full(back)) => {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            item = back;
                            wake.notify();
                            thread::yield_now();
                        }
                    }
                }
                wake.notify();
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
const NO_CLIENT: ClientRef = ClientRef {
    addr: SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0)),
    client_id: 0,
    request_id: 0,
};

struct Job {
    handle: ResponseHandle,
    payload: Vec<u8>,
    kind: JobKind,
}

/// What a job asks of the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobKind {
    /// `on_request(payload)`.
    Request,
    /// `snapshot()`, answered to the hook's `on_snapshot`.
    Snapshot,
    /// `restore(payload)`.
    Restore,
}

impl Job {
    /// Runs the job on the current thread.
    fn run(self, handler: &dyn Handler, responder: &mut Responder<'_>) {
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

struct WorkerLink {
    requests: Producer<Job>,
    responses: Consumer<Outgoing>,
    parked: Arc<AtomicBool>,
    thread: Thread,
}

impl WorkerLink {
    /// Called after pushing a job; pairs with the worker's fence (see
    /// [`NetWake::notify`]).
    fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
    }
}

/// A running R2P2 server. Dropping it shuts it down.
pub struct Server {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    wake: Arc<NetWake>,
    counters: Arc<Counters>,
    remote: RemoteResponder,
    network: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds the socket and starts the threads, with no replication hook
    /// (REPLICATED_ROUTE requests are refused with ERROR `NotReplicated`).
    pub fn bind(config: ServerConfig, handler: impl Handler) -> io::Result<Server> {
        Self::start(config, Arc::new(handler), None)
    }

    /// Like [`Server::bind`], with `hook` serving REPLICATED_ROUTE and RAFT.
    pub fn bind_replicated(
        config: ServerConfig,
        handler: impl Handler,
        hook: Box<dyn Replication>,
    ) -> io::Result<Server> {
        Self::start(config, Arc::new(handler), Some(hook))
    }

    fn start(
        config: ServerConfig,
        handler: Arc<dyn Handler>,
        hook: Option<Box<dyn Replication>>,
    ) -> io::Result<Server> {
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        if config.handler_mode == HandlerMode::Workers(0) {
            return Err(invalid("HandlerMode::Workers needs at least one worker"));
        }
        if config.mtu_payload == 0 || config.mtu_payload > MAX_DATAGRAM - HEADER_SIZE {
            return Err(invalid("mtu_payload must be in 1..=65483"));
        }
        if config.queue_depth == 0 || config.recv_batch == 0 {
            return Err(invalid("queue_depth and recv_batch must be positive"));
        }
        if config.reassembly.max_partial_messages == 0 || config.reassembly.max_packets == 0 {
            return Err(invalid("reassembly bounds must be positive"));
        }
        let mut socket = UdpSocket::bind(config.bind)?;
        if let Some(bytes) = config.socket_buffer_bytes {
            set_socket_buffers(&socket, bytes)?;
        }
        let local_addr = socket.local_addr()?;
        let poll = Poll::new()?;
        poll.registry().register(&mut socket, SOCKET, Interest::READABLE)?;
        let wake =
            Arc::new(NetWake { parked: AtomicBool::new(false), waker: Waker::new(poll.registry(), WAKE)? });
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let remote = RemoteResponder {
            inner: Arc::new(RemoteQueue {
                queue: Mutex::new(VecDeque::new()),
                capacity: config.remote_queue_depth,
                counters: counters.clone(),
                wake: wake.clone(),
            }),
        };

        let mut links = Vec::new();
        let mut workers = Vec::new();
        if let HandlerMode::Workers(n) = config.handler_mode {
            for index in 0..n {
                let (request_tx, request_rx) = RingBuffer::<Job>::new(config.queue_depth);
                let (response_tx, response_rx) = RingBuffer::<Outgoing>::new(config.queue_depth);
                let parked = Arc::new(AtomicBool::new(false));
                let worker = Worker {
                    requests: request_rx,
                    responses: response_tx,
                    parked: parked.clone(),
                    handler: handler.clone(),
                    idle: config.worker_idle,
                    stop: stop.clone(),
                    wake: wake.clone(),
                    remote: remote.clone(),
                };
                let join = thread::Builder::new()
                    .name(format!("r2p2-worker-{index}"))
                    .spawn(move || worker.run())?;
                links.push(WorkerLink {
                    requests: request_tx,
                    responses: response_rx,
                    parked,
                    thread: join.thread().clone(),
                });
                workers.push(join);
            }
        }

        let network = NetworkLoop {
            reassembler: Reassembler::new(config.reassembly),
            config,
            socket,
            poll,
            handler,
            hook,
            hook_out: ReplicationOutput::default(),
            links,
            backlog: VecDeque::new(),
            outgoing: Vec::new(),
            remote_drain: Vec::new(),
            scratch: Vec::with_capacity(MAX_DATAGRAM),
            recv_buf: vec![0u8; MAX_DATAGRAM + 1],
            next_worker: 0,
            peer_sequence: 0,
            stop: stop.clone(),
            wake: wake.clone(),
            remote: remote.clone(),
            counters: counters.clone(),
            started: Instant::now(),
        };
        let network = match thread::Builder::new().name("r2p2-net".into()).spawn(move || network.run()) {
            Ok(join) => join,
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                for worker in workers {
                    worker.thread().unpark();
                    let _ = worker.join();
                }
                return Err(e);
            }
        };
        Ok(Server { local_addr, stop, wake, counters, remote, network: Some(network), workers })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// A responder usable from any thread.
    pub fn remote_responder(&self) -> RemoteResponder {
        self.remote.clone()
    }

    /// Stops and joins every thread. Re-raises a handler panic.
    pub fn shutdown(mut self) {
        self.stop_and_join(true);
    }

    fn stop_and_join(&mut self, propagate: bool) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.waker.wake();
        let mut panic = None;
        if let Some(network) = self.network.take()
            && let Err(p) = network.join()
        {
            panic = Some(p);
        }
        for worker in self.workers.drain(..) {
            worker.thread().unpark();
            if let Err(p) = worker.join() {
                panic = panic.or(Some(p));
            }
        }
        if let Some(p) = panic
            && propagate
            && !thread::panicking()
        {
            std::panic::resume_unwind(p);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_and_join(false);
    }
}

struct Worker {
    requests: Consumer<Job>,
    responses: Producer<Outgoing>,
    parked: Arc<AtomicBool>,
    handler: Arc<dyn Handler>,
    idle: IdleStrategy,
    stop: Arc<AtomicBool>,
    wake: Arc<NetWake>,
    remote: RemoteResponder,
}

impl Worker {
    fn run(mut self) {
        let mut idler = Idler::new(self.idle);
        loop {
            match self.requests.pop() {
                Ok(job) => {
                    idler.reset();
                    let mut responder = Responder {
                        sink: Sink::Worker { queue: &mut self.responses, wake: &self.wake, stop: &self.stop },
                        remote: &self.remote,
                    };
                    job.run(&*self.handler, &mut responder);
                }
                Err(_) => {
                    if self.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match idler.idle(0) {
                        Some(IdleAction::Park(timeout)) => {
                            self.parked.store(true, Ordering::SeqCst);
                            fence(Ordering::SeqCst);
                            if self.requests.is_empty() && !self.stop.load(Ordering::SeqCst) {
                                thread::park_timeout(timeout);
                            }
                            self.parked.store(false, Ordering::SeqCst);
                        }
                        Some(action) => action.spin_or_yield(),
                        None => {}
                    }
                }
            }
        }
    }
}

struct NetworkLoop {
    config: ServerConfig,
    socket: UdpSocket,
    poll: Poll,
    reassembler: Reassembler,
    handler: Arc<dyn Handler>,
    hook: Option<Box<dyn Replication>>,
    hook_out: ReplicationOutput,
    links: Vec<WorkerLink>,
    /// Committed requests waiting for room in worker 0's queue (never dropped).
    backlog: VecDeque<Job>,
    outgoing: Vec<Outgoing>,
    remote_drain: Vec<Outgoing>,
    scratch: Vec<u8>,
    recv_buf: Vec<u8>,
    next_worker: usize,
    peer_sequence: u32,
    stop: Arc<AtomicBool>,
    wake: Arc<NetWake>,
    remote: RemoteResponder,
    counters: Arc<Counters>,
    started: Instant,
}

impl NetworkLoop {
    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    fn run(mut self) {
        let mut idler = Idler::new(self.config.idle);
        let mut events = Events::with_capacity(8);
        let tick_ns = self.config.tick_interval.as_nanos().max(1) as u64;
        let mut next_tick_ns = 0u64;
        while !self.stop.load(Ordering::SeqCst) {
            let mut now_ns = self.now_ns();
            let mut work = self.receive(now_ns);
            if now_ns >= next_tick_ns {
                next_tick_ns = now_ns + tick_ns;
                if self.reassembler.partial_count() > 0 {
                    self.reassembler.expire(now_ns);
                }
                if let Some(hook) = self.hook.as_mut() {
                    hook.tick(now_ns, &mut self.hook_out);
                    work += self.execute_hook_actions();
                }
            }
            if let Some(hook) = self.hook.as_mut() {
                hook.flush(now_ns, &mut self.hook_out);
                work += self.execute_hook_actions();
            }
            work += self.flush_backlog();
            work += self.collect_answers();
            work += self.send_outgoing();
            self.counters.mirror_reassembly(&self.reassembler.stats());
            match idler.idle(work) {
                None => {}
                Some(IdleAction::Park(timeout)) => {
                    now_ns = self.now_ns();
                    let until_tick = Duration::from_nanos(next_tick_ns.saturating_sub(now_ns));
                    let timeout = timeout.min(until_tick).max(IdleStrategy::MIN_PARK);
                    self.wake.parked.store(true, Ordering::SeqCst);
                    fence(Ordering::SeqCst);
                    if !self.answers_pending() && !self.stop.load(Ordering::SeqCst) {
                        // Readiness is edge-triggered: we only get here after a
                        // receive that hit WouldBlock, so no datagram is missed.
                        if let Err(e) = self.poll.poll(&mut events, Some(timeout))
                            && e.kind() != io::ErrorKind::Interrupted
                        {
                            tracing::warn!(error = %e, "r2p2 poll failed");
                        }
                    }
                    self.wake.parked.store(false, Ordering::SeqCst);
                }
                Some(action) => action.spin_or_yield(),
            }
        }
    }

    fn answers_pending(&self) -> bool {
        self.links.iter().any(|l| !l.responses.is_empty())
            || !self.remote.inner.queue.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Reads up to `recv_batch` datagrams and dispatches complete messages.
    fn receive(&mut self, now_ns: u64) -> usize {
        let mut work = 0;
        for _ in 0..self.config.recv_batch {
            let (len, from) = match self.socket.recv_from(&mut self.recv_buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. ICMP port unreachable surfacing as ECONNREFUSED.
                    tracing::debug!(error = %e, "r2p2 recv error");
                    work += 1;
                    continue;
                }
            };
            work += 1;
            Counters::bump(&self.counters.datagrams_received);
            let message = match header::decode(&self.recv_buf[..len], self.config.reassembly.max_packets) {
                Ok((header, payload)) => self.reassembler.on_packet(from, &header, payload, now_ns),
                Err(e) => {
                    self.counters.on_decode_error(&e);
                    None
                }
            };
            if let Some(message) = message {
                self.on_message(message, now_ns);
            }
        }
        work
    }

    fn on_message(&mut self, message: Message, now_ns: u64) {
        let client =
            ClientRef { addr: message.from, client_id: message.client_id, request_id: message.request_id };
        match (message.message_type, message.policy) {
            (MessageType::Request, Policy::FixedRoute | Policy::LbRoute) => {
                Counters::bump(&self.counters.requests);
                let job = Job {
                    handle: ResponseHandle { client, policy: message.policy, respond: true },
                    payload: message.payload,
                    kind: JobKind::Request,
                };
                self.dispatch_local(job);
            }
            (MessageType::Request, Policy::ReplicatedRoute) => {
                Counters::bump(&self.counters.requests);
                match self.hook.as_mut() {
                    Some(hook) => {
                        Counters::bump(&self.counters.requests_replicated);
                        hook.on_request(
                            ReplicatedRequest { client, payload: message.payload },
                            now_ns,
                            &mut self.hook_out,
                        );
                        self.execute_hook_actions();
                    }
                    None => self.outgoing.push(Outgoing::error(
                        client,
                        Policy::ReplicatedRoute,
                        ErrorCode::NotReplicated,
                        "REPLICATED_ROUTE refused: this server has no replication hook",
                    )),
                }
            }
            (MessageType::Admin, _) => match self.hook.as_mut() {
                Some(hook) => {
                    hook.on_admin(
                        ReplicatedRequest { client, payload: message.payload },
                        now_ns,
                        &mut self.hook_out,
                    );
                    self.execute_hook_actions();
                }
                None => self.outgoing.push(Outgoing::error(
                    client,
                    message.policy,
                    ErrorCode::NotReplicated,
                    "admin command refused: this server has no replication hook",
                )),
            },
            (MessageType::Raft, _) => {
                let Some(hook) = self.hook.as_mut() else {
                    Counters::bump(&self.counters.drop_unexpected_type);
                    return;
                };
                let Some(from) = self.config.peers.iter().position(|p| *p == message.from) else {
                    Counters::bump(&self.counters.drop_unknown_peer);
                    return;
                };
                Counters::bump(&self.counters.peer_messages_received);
                hook.on_peer_message(from, &message.payload, now_ns, &mut self.hook_out);
                self.execute_hook_actions();
            }
            _ => Counters::bump(&self.counters.drop_unexpected_type),
        }
    }

    /// Runs a FIXED/LB request: inline, or on the next worker with room.
    fn dispatch_local(&mut self, job: Job) {
        if self.links.is_empty() {
            self.run_inline(job);
            return;
        }
        let n = self.links.len();
        let mut job = job;
        for i in 0..n {
            let index = (self.next_worker + i) % n;
            match self.links[index].requests.push(job) {
                Ok(()) => {
                    self.links[index].notify();
                    self.next_worker = (index + 1) % n;
                    return;
                }
                Err(PushError::Full(back)) => job = back,
            }
        }
        Counters::bump(&self.counters.drop_queue_full);
    }

    fn run_inline(&mut self, job: Job) {
        let mut responder = Responder { sink: Sink::Net(&mut self.outgoing), remote: &self.remote };
        job.run(&*self.handler, &mut responder);
    }

    /// Executes the hook's actions in order; returns how many.
    fn execute_hook_actions(&mut self) -> usize {
        let mut actions = std::mem::take(&mut self.hook_out.actions);
        let count = actions.len();
        for action in actions.drain(..) {
            match action {
                ReplicationAction::SendToPeer { peer, message } => self.send_to_peer(peer, &message),
                ReplicationAction::Apply { client, payload, respond } => {
                    Counters::bump(&self.counters.committed_applied);
                    let job = Job {
                        handle: ResponseHandle { client, policy: Policy::ReplicatedRoute, respond },
                        payload,
                        kind: JobKind::Request,
                    };
                    self.run_replicated(job);
                }
                ReplicationAction::Snapshot => {
                    let job = Job {
                        handle: ResponseHandle {
                            client: NO_CLIENT,
                            policy: Policy::ReplicatedRoute,
                            respond: false,
                        },
                        payload: Vec::new(),
                        kind: JobKind::Snapshot,
                    };
                    self.run_replicated(job);
                }
                ReplicationAction::Restore { state } => {
                    let job = Job {
                        handle: ResponseHandle {
                            client: NO_CLIENT,
                            policy: Policy::ReplicatedRoute,
                            respond: false,
                        },
                        payload: state,
                        kind: JobKind::Restore,
                    };
                    self.run_replicated(job);
                }
                ReplicationAction::Redirect { client, leader } => {
                    let payload =
                        self.config.peers.get(leader as usize).map(|a| a.to_string()).unwrap_or_default();
                    self.outgoing.push(Outgoing {
                        to: client.addr,
                        message_type: MessageType::Redirect,
                        policy: Policy::ReplicatedRoute,
                        client_id: client.client_id,
                        request_id: client.request_id,
                        leader_hint: Some(leader),
                        payload: payload.into_bytes(),
                        send: true,
                        observe: false,
                        snapshot: None,
                    });
                }
                ReplicationAction::Respond { client, payload } => {
                    let handle = ResponseHandle { client, policy: Policy::ReplicatedRoute, respond: true };
                    let mut item = Outgoing::response(&handle, payload);
                    item.observe = false; // the hook's own reply, not a handler's
                    self.outgoing.push(item);
                }
                ReplicationAction::Refuse { client, code, reason } => {
                    self.outgoing.push(Outgoing::error(client, Policy::ReplicatedRoute, code, &reason));
                }
            }
        }
        // Hand the (empty) buffer back so its capacity is reused.
        debug_assert!(self.hook_out.actions.is_empty(), "hook actions are only pushed from hook calls");
        self.hook_out.actions = actions;
        count
    }

    /// Runs a replicated job in order: inline, or behind the others on
    /// worker 0.
    fn run_replicated(&mut self, job: Job) {
        if self.links.is_empty() {
            self.run_inline(job);
        } else {
            self.backlog.push_back(job);
            self.flush_backlog();
        }
    }

    /// Moves committed requests, in order, into worker 0's queue.
    fn flush_backlog(&mut self) -> usize {
        let mut moved = 0;
        while let Some(job) = self.backlog.pop_front() {
            match self.links[0].requests.push(job) {
                Ok(()) => moved += 1,
                Err(PushError::Full(back)) => {
                    self.backlog.push_front(back);
                    break;
                }
            }
        }
        if moved > 0 {
            self.links[0].notify();
        }
        moved
    }

    fn collect_answers(&mut self) -> usize {
        let mut work = 0;
        for link in &mut self.links {
            while let Ok(item) = link.responses.pop() {
                self.outgoing.push(item);
                work += 1;
            }
        }
        {
            let mut queue = self.remote.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            self.remote_drain.extend(queue.drain(..));
        }
        work += self.remote_drain.len();
        self.outgoing.append(&mut self.remote_drain);
        work
    }

    fn send_outgoing(&mut self) -> usize {
        let count = self.outgoing.len();
        if count == 0 {
            return 0;
        }
        let leader = self.hook.as_ref().and_then(|h| h.leader_hint());
        let mut outgoing = std::mem::take(&mut self.outgoing);
        let counters = self.counters.clone();
        let mut hook_called = false;
        for item in outgoing.drain(..) {
            if let Some(state) = item.snapshot {
                if let Some(hook) = self.hook.as_mut() {
                    hook.on_snapshot(state, &mut self.hook_out);
                    hook_called = true;
                }
                continue;
            }
            if item.observe
                && let Some(hook) = self.hook.as_mut()
            {
                let client =
                    ClientRef { addr: item.to, client_id: item.client_id, request_id: item.request_id };
                hook.on_response(client, &item.payload, item.send, &mut self.hook_out);
                hook_called = true;
            }
            if !item.send {
                Counters::bump(&counters.drop_follower_responses);
                continue;
            }
            let hint = item.leader_hint.or(leader);
            let header = Header {
                message_type: item.message_type,
                policy: item.policy,
                flags: if hint.is_some() { FLAG_LEADER_HINT } else { 0 },
                packet_id: 0,
                packet_count: 1,
                client_id: item.client_id,
                request_id: item.request_id,
                leader_hint: hint.unwrap_or(0),
                payload_len: 0,
            };
            let counter = match item.message_type {
                MessageType::Response => &counters.responses_sent,
                MessageType::Redirect => &counters.redirects_sent,
                _ => &counters.errors_sent,
            };
            // Counted before the send so that an answer is never observed by
            // its client before it is counted (tests and monitors rely on it).
            Counters::bump(counter);
            self.send_message(&header, &item.payload, item.to);
        }
        self.outgoing = outgoing;
        if hook_called && !self.hook_out.actions.is_empty() {
            self.execute_hook_actions();
        }
        count
    }

    fn send_to_peer(&mut self, peer: usize, message: &[u8]) {
        let Some(&to) = self.config.peers.get(peer) else {
            Counters::bump(&self.counters.drop_unknown_peer);
            return;
        };
        self.peer_sequence = self.peer_sequence.wrapping_add(1);
        let header = Header {
            message_type: MessageType::Raft,
            policy: Policy::FixedRoute,
            flags: 0,
            packet_id: 0,
            packet_count: 1,
            client_id: self.config.node_id,
            request_id: self.peer_sequence,
            leader_hint: 0,
            payload_len: 0,
        };
        Counters::bump(&self.counters.peer_messages_sent);
        self.send_message(&header, message, to);
    }

    /// Splits and sends one message; false if it was dropped.
    fn send_message(&mut self, header: &Header, payload: &[u8], to: SocketAddr) -> bool {
        let socket = &self.socket;
        let counters = &self.counters;
        let mut all_sent = true;
        let split = reassembly::split(
            header,
            payload,
            self.config.mtu_payload,
            self.config.reassembly.max_packets,
            &mut self.scratch,
            |datagram| match send_datagram(socket, datagram, to) {
                Ok(()) => Counters::bump(&counters.datagrams_sent),
                Err(e) => {
                    tracing::debug!(error = %e, %to, "r2p2 send failed");
                    Counters::bump(&counters.drop_send_failed);
                    all_sent = false;
                }
            },
        );
        if split.is_err() {
            Counters::bump(&self.counters.drop_response_too_large);
            return false;
        }
        all_sent
    }
}

/// Sends one datagram, retrying briefly while the socket buffer is full
/// (bounded: then the datagram is dropped; UDP senders may drop).
pub(crate) fn send_datagram(socket: &UdpSocket, datagram: &[u8], to: SocketAddr) -> io::Result<()> {
    let mut tries = 0;
    loop {
        match socket.send_to(datagram, to) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && tries < 1000 => {
                tries += 1;
                thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    }
}

/// Asks for `bytes` of kernel receive and send buffer on `socket`.
pub(crate) fn set_socket_buffers(socket: &UdpSocket, bytes: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for option in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // SAFETY: a valid socket fd, and a pointer/length to a live c_int.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
