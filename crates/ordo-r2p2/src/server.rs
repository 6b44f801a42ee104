//! The R2P2 server: one network thread, optional worker threads — the
//! I/O shell around the sans-I/O [`ServerCore`] (which the simulation drives
//! too): the socket, the `mio` poll, the idle strategy, the clock and the
//! worker threads live here; decoding, routing, the replication hook's
//! actions and encoding live in the core.
//!
//! # Threads and queues (r3p2 §4.5)
//! Both kinds of thread are `ordo-agent` agents run by a `Runner`, with the
//! duty cycles and idle strategies every ordo agent has.
//! - The **network thread** owns the UDP socket, the [`Reassembler`](crate::Reassembler), the
//!   replication hook and all sending. It polls the nonblocking socket in a
//!   duty cycle; when a cycle finds nothing it follows the configured
//!   [`IdleStrategy`], and *parking* is a blocking `mio` poll on the socket
//!   with the park timeout (`Agent::park_until_work`: a datagram, a
//!   worker's answer or shutdown wakes it at once).
//! - In [`HandlerMode::Workers`]`(n)` handlers run on `n` worker agents
//!   (parked on their doorbell when idle), each
//!   fed by its own SPSC request queue (network → worker) and answering
//!   through its own SPSC response queue (worker → network); the network
//!   thread splits answers into datagrams and sends them. In
//!   [`HandlerMode::NetworkThread`] handlers run inline on the network thread
//!   (the thesis' original design, for reproducing r3p2 §5.1).
//!
//! # Invariants
//! - Routing, replication and counting are the core's (see
//!   [`crate::core`]); the shell adds: committed requests run in commit
//!   order on one thread (worker 0, or the network thread), FIXED/LB
//!   requests round-robin over the workers with room.
//! - [`Server::shutdown`] (or drop) stops and joins every thread; answers
//!   still queued are dropped.

pub use crate::handler::{
    FnHandler, Handler, Job, Outgoing, RemoteResponder, Responder, ResponseHandle, SimpleHandler, handler_fn,
    simple,
};

use crate::core::{CoreConfig, DEFAULT_REMOTE_QUEUE_DEPTH, Executor, InlineExecutor, ServerCore, Transport};
use crate::handler::Sink;
use crate::header::{HEADER_SIZE, MAX_DATAGRAM};
use crate::mmsg::{Flushed, RecvBatch, SendQueue};
use crate::reassembly::ReassemblyConfig;
use crate::replication::Replication;
use crate::stats::{Counters, Stats};
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token, Waker};
use ordo_agent::{Agent, IdleStrategy, Runner, RunnerOptions, ThreadingMode};
use ordo_fabric::Doorbell;
use rtrb::{Consumer, Producer, PushError, RingBuffer};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::thread;
use std::time::Duration;

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

/// The idle strategy of a thread that polls a UDP socket where it has the
/// cores to itself: a server's network thread ([`ServerConfig::idle`],
/// `ordo r3p2 serve`) and a [`Client`](crate::Client) waiting for its
/// answer ([`ClientConfig::idle`](crate::ClientConfig::idle)). Yield at
/// the first idle turn, 250 times, then park (from 20 µs, doubling to 1
/// ms). Such a thread's idle turn is a system call (`recvmmsg`), not a
/// cache-line read, so a spin buys little over a yield; and a spin holds
/// the core against the thread its datagram just woke, which the kernel
/// often places on the waker's CPU (a sync wake-up; on a VM whose halted
/// vCPUs read as preempted, always). `Client::call` against an
/// unreplicated `ordo r3p2 serve`, 500 calls/s on 2 vCPUs (`ordo bench
/// r3p2 --figures calls`, BENCHMARKS.md, fifteenth session): p50 123.9 µs
/// with both spinning 200 turns first (the agents' default), 67.8 µs with
/// only the server yielding at once, 21.1 µs with both. A node's workers
/// take the same strategy (`NodeOptions::idle` covers both; not measured
/// apart).
pub const SOCKET_IDLE: IdleStrategy = IdleStrategy::BackoffPark {
    spins: 0,
    yields: 250,
    park_min: std::time::Duration::from_micros(20),
    park_max: std::time::Duration::from_millis(1),
};

/// Server configuration; every field has a default.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to bind (port 0: any free port, see [`Server::local_addr`]).
    pub bind: SocketAddr,
    /// Where handlers run.
    pub handler_mode: HandlerMode,
    /// Idle strategy of the network thread (default [`SOCKET_IDLE`]).
    pub idle: IdleStrategy,
    /// Idle strategy of worker threads (parking on the worker's doorbell).
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
    /// the replication hook; empty without replication. RAFT messages are
    /// accepted only from these addresses.
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
    /// Secrets and what must be authenticated ([`crate::auth`]).
    pub auth: crate::auth::AuthConfig,
    /// `SO_BUSY_POLL` on the socket, µs: a receive with nothing queued
    /// polls the device queue this long before sleeping (NAPI devices only:
    /// no effect on loopback; raising it past `net.core.busy_read` needs
    /// `CAP_NET_ADMIN`, and where it is refused the server logs that and
    /// runs without it). `None`: not set.
    pub busy_poll_us: Option<u32>,
    /// Pin the network thread to this CPU (`sched_setaffinity`; where it is
    /// refused the server logs that and runs unpinned). `None`: not pinned.
    pub pin_cpu: Option<usize>,
    /// Batched system calls (default): `recvmmsg` reads up to 16 datagrams
    /// a call, and a loop turn's datagrams leave in one `sendmmsg` at its
    /// end. Off: one datagram per call, sent at once (the comparison's
    /// baseline, `bench r3p2 --figures syscalls`).
    pub syscall_batching: bool,
}

impl ServerConfig {
    /// The part of the configuration the sans-I/O core uses.
    pub fn core(&self) -> CoreConfig {
        CoreConfig {
            peers: self.peers.clone(),
            node_id: self.node_id,
            mtu_payload: self.mtu_payload,
            reassembly: self.reassembly,
            tick_interval: self.tick_interval,
            auth: self.auth.clone(),
            wall_clock: Some(crate::auth::unix_now_ns),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            handler_mode: HandlerMode::Workers(1),
            idle: SOCKET_IDLE,
            worker_idle: IdleStrategy::DEFAULT,
            mtu_payload: 1400,
            reassembly: ReassemblyConfig::default(),
            queue_depth: 1024,
            remote_queue_depth: DEFAULT_REMOTE_QUEUE_DEPTH,
            peers: Vec::new(),
            node_id: 0,
            tick_interval: Duration::from_millis(1),
            recv_batch: 64,
            socket_buffer_bytes: Some(4 << 20),
            auth: crate::auth::AuthConfig::default(),
            busy_poll_us: None,
            pin_cpu: None,
            syscall_batching: true,
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

struct WorkerLink {
    requests: Producer<Job>,
    responses: Consumer<Outgoing>,
    /// The worker agent's doorbell (its runner parks on it).
    bell: Doorbell,
}

impl WorkerLink {
    /// Called after pushing a job: wakes the worker if it is parked (the
    /// doorbell's protocol loses no wake-up).
    fn notify(&self) {
        self.bell.ring();
    }
}

/// A running R2P2 server. Dropping it shuts it down.
pub struct Server {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    wake: Arc<NetWake>,
    counters: Arc<Counters>,
    remote: RemoteResponder,
    network: Option<Runner<NetworkLoop>>,
    workers: Vec<Runner<Worker>>,
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

    pub(crate) fn start(
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
        if let Some(us) = config.busy_poll_us {
            match set_busy_poll(&socket, us) {
                Ok(()) => tracing::info!(us, "r2p2 socket busy-polls (SO_BUSY_POLL)"),
                Err(e) => tracing::warn!(us, error = %e, "SO_BUSY_POLL refused; running without it"),
            }
        }
        let local_addr = socket.local_addr()?;
        let poll = Poll::new()?;
        poll.registry().register(&mut socket, SOCKET, Interest::READABLE)?;
        let wake =
            Arc::new(NetWake { parked: AtomicBool::new(false), waker: Waker::new(poll.registry(), WAKE)? });
        let stop = Arc::new(AtomicBool::new(false));
        let core = ServerCore::new(config.core(), hook);
        let counters = core.counters().clone();
        let remote = {
            let wake = wake.clone();
            core.remote_responder(config.remote_queue_depth, Some(Box::new(move || drop(wake.waker.wake()))))
        };

        let mut links = Vec::new();
        let mut worker_agents = Vec::new();
        if let HandlerMode::Workers(n) = config.handler_mode {
            for _ in 0..n {
                let (request_tx, request_rx) = RingBuffer::<Job>::new(config.queue_depth);
                let (response_tx, response_rx) = RingBuffer::<Outgoing>::new(config.queue_depth);
                let bell = Doorbell::new_local();
                worker_agents.push(Worker {
                    requests: request_rx,
                    responses: response_tx,
                    bell: bell.clone(),
                    handler: handler.clone(),
                    stop: stop.clone(),
                    wake: wake.clone(),
                    remote: remote.clone(),
                });
                links.push(WorkerLink { requests: request_tx, responses: response_rx, bell });
            }
        }
        let executor = if links.is_empty() {
            Handlers::Inline(InlineExecutor::with_remote(handler, remote.clone()))
        } else {
            Handlers::Pool(WorkerPool { links, next_worker: 0, remote: remote.clone() })
        };
        let runner_error = |e: ordo_agent::RunnerError| io::Error::other(e.to_string());
        // One runner per worker: a handler that panics stops its own worker
        // (its queue then fills and requests to it are dropped and counted),
        // not the others.
        let mut options = RunnerOptions::new(ThreadingMode::Dedicated, config.worker_idle);
        options.thread_name_prefix = "r2p2".into();
        let mut workers = Vec::with_capacity(worker_agents.len());
        for worker in worker_agents {
            workers.push(Runner::start(vec![worker], &options).map_err(runner_error)?);
        }
        let network = NetworkLoop {
            recv_batch: config.recv_batch,
            core,
            executor,
            net: UdpTransport {
                socket,
                queue: SendQueue::new(if config.syscall_batching { SEND_BATCH } else { 1 }),
                counters: counters.clone(),
                at_once: !config.syscall_batching,
            },
            poll,
            events: Events::with_capacity(8),
            batch: RecvBatch::new(
                if config.syscall_batching { config.recv_batch.min(RECV_BATCH_BUFFERS) } else { 1 },
                MAX_DATAGRAM + 1,
            ),
            pin_cpu: config.pin_cpu,
            stop: stop.clone(),
            wake: wake.clone(),
            now_ns: 0,
        };
        let mut options = RunnerOptions::new(ThreadingMode::Dedicated, config.idle);
        options.thread_name_prefix = "r2p2".into();
        let network = match Runner::start(vec![network], &options) {
            Ok(runner) => runner,
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                drop(workers);
                return Err(runner_error(e));
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
        let mut panic = None;
        if let Some(network) = self.network.take() {
            network.stop();
            // The network agent parks in `poll`, which no doorbell rings.
            let _ = self.wake.waker.wake();
            if let Err(p) = network.try_join() {
                panic = Some(p);
            }
        }
        for worker in self.workers.drain(..) {
            if let Err(p) = worker.try_join() {
                panic = panic.or(Some(p));
            }
        }
        if let Some(p) = panic {
            if propagate && !thread::panicking() {
                p.resume();
            }
            tracing::error!("{p}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_and_join(false);
    }
}

/// A worker thread's agent: runs the jobs the network thread queues for
/// it, answering through its SPSC response queue.
struct Worker {
    requests: Consumer<Job>,
    responses: Producer<Outgoing>,
    bell: Doorbell,
    handler: Arc<dyn Handler>,
    stop: Arc<AtomicBool>,
    wake: Arc<NetWake>,
    remote: RemoteResponder,
}

/// Jobs a worker runs per duty cycle before its runner looks around.
const WORKER_BATCH: usize = 64;
/// Receive buffers of the network thread (each holds a whole datagram).
const RECV_BATCH_BUFFERS: usize = 16;
/// Datagrams a turn queues before its `sendmmsg` goes out early.
const SEND_BATCH: usize = 64;

impl Agent for Worker {
    fn name(&self) -> &str {
        "worker"
    }

    fn do_work(&mut self, _now_ns: u64) -> usize {
        let mut work = 0;
        while work < WORKER_BATCH {
            let Ok(job) = self.requests.pop() else { break };
            let wake = &self.wake;
            let notify = || wake.notify();
            let mut responder = Responder {
                sink: Sink::Worker { queue: &mut self.responses, notify: &notify, stop: &self.stop },
                remote: &self.remote,
            };
            job.run(&*self.handler, &mut responder);
            work += 1;
        }
        work
    }

    fn doorbell(&self) -> Option<Doorbell> {
        Some(self.bell.clone())
    }
}

/// The worker threads as the core's [`Executor`]: FIXED/LB requests go
/// round-robin to a worker with room, committed jobs to worker 0 in order.
struct WorkerPool {
    links: Vec<WorkerLink>,
    next_worker: usize,
    remote: RemoteResponder,
}

impl Executor for WorkerPool {
    fn run_any(&mut self, job: Job) -> Result<(), Job> {
        let n = self.links.len();
        let mut job = job;
        for i in 0..n {
            let index = (self.next_worker + i) % n;
            match self.links[index].requests.push(job) {
                Ok(()) => {
                    self.links[index].notify();
                    self.next_worker = (index + 1) % n;
                    return Ok(());
                }
                Err(PushError::Full(back)) => job = back,
            }
        }
        Err(job)
    }

    fn run_ordered(&mut self, job: Job) -> Result<(), Job> {
        match self.links[0].requests.push(job) {
            Ok(()) => {
                self.links[0].notify();
                Ok(())
            }
            Err(PushError::Full(back)) => Err(back),
        }
    }

    fn collect_answers(&mut self, out: &mut Vec<Outgoing>) -> usize {
        let mut work = 0;
        for link in &mut self.links {
            while let Ok(item) = link.responses.pop() {
                out.push(item);
                work += 1;
            }
        }
        work + self.remote.drain_into(out)
    }
}

/// Where the network thread's handlers run.
enum Handlers {
    Inline(InlineExecutor),
    Pool(WorkerPool),
}

impl Handlers {
    fn answers_pending(&self) -> bool {
        match self {
            Handlers::Inline(_) => false,
            Handlers::Pool(pool) => {
                pool.links.iter().any(|l| !l.responses.is_empty()) || pool.remote.is_pending()
            }
        }
    }
}

impl Executor for Handlers {
    fn run_any(&mut self, job: Job) -> Result<(), Job> {
        match self {
            Handlers::Inline(e) => e.run_any(job),
            Handlers::Pool(e) => e.run_any(job),
        }
    }
    fn run_ordered(&mut self, job: Job) -> Result<(), Job> {
        match self {
            Handlers::Inline(e) => e.run_ordered(job),
            Handlers::Pool(e) => e.run_ordered(job),
        }
    }
    fn collect_answers(&mut self, out: &mut Vec<Outgoing>) -> usize {
        match self {
            Handlers::Inline(e) => e.collect_answers(out),
            Handlers::Pool(e) => e.collect_answers(out),
        }
    }
}

/// The UDP socket as the core's [`Transport`]: datagrams are queued and
/// leave in one `sendmmsg` per loop turn ([`crate::mmsg`]).
struct UdpTransport {
    socket: UdpSocket,
    queue: SendQueue,
    counters: Arc<Counters>,
    /// Send each datagram at once (syscall batching off).
    at_once: bool,
}

impl UdpTransport {
    /// Sends what the turn queued; datagrams the kernel refused are counted.
    fn flush(&mut self) -> usize {
        let f = self.queue.flush(&self.socket);
        self.count(f);
        f.sent + f.dropped
    }

    fn count(&self, f: Flushed) {
        self.counters.drop_send_failed.fetch_add(f.dropped as u64, Ordering::Relaxed);
    }
}

impl Transport for UdpTransport {
    fn send_datagram(&mut self, to: SocketAddr, datagram: &[u8]) -> io::Result<()> {
        let f = self.queue.push(&self.socket, to, datagram);
        self.count(f);
        if self.at_once {
            self.flush();
        }
        Ok(())
    }
}

/// The network thread's agent: the socket and its poll around the core.
struct NetworkLoop {
    recv_batch: usize,
    core: ServerCore,
    executor: Handlers,
    net: UdpTransport,
    poll: Poll,
    events: Events,
    batch: RecvBatch,
    stop: Arc<AtomicBool>,
    wake: Arc<NetWake>,
    /// The time of the last duty cycle (for the park's tick deadline).
    now_ns: u64,
    /// Pin the thread to this CPU when it starts.
    pin_cpu: Option<usize>,
}

impl NetworkLoop {
    /// Reads up to `recv_batch` datagrams (`recvmmsg`, a batch per call)
    /// and hands each to the core.
    fn receive(&mut self, now_ns: u64) -> usize {
        let (mut work, mut read) = (0, 0);
        while read < self.recv_batch {
            let n = match self.batch.recv(&self.net.socket) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // E.g. ICMP port unreachable surfacing as ECONNREFUSED.
                    tracing::debug!(error = %e, "r2p2 recv error");
                    work += 1;
                    read += 1;
                    continue;
                }
            };
            read += n;
            for i in 0..n {
                match self.batch.get(i) {
                    Some((from, bytes)) => {
                        work += self.core.on_datagram(now_ns, from, bytes, &mut self.executor, &mut self.net)
                    }
                    None => {
                        Counters::bump(&self.core.counters().drop_truncated);
                        work += 1;
                    }
                }
            }
        }
        work
    }
}

impl Agent for NetworkLoop {
    fn name(&self) -> &str {
        "net"
    }

    /// One turn: receive a batch, the timers when due, the end of the turn.
    fn do_work(&mut self, now_ns: u64) -> usize {
        self.now_ns = now_ns;
        let mut work = self.receive(now_ns);
        work += self.core.on_timers(now_ns, &mut self.executor, &mut self.net);
        work += self.core.end_turn(now_ns, &mut self.executor, &mut self.net);
        // Everything the turn sent leaves now, in one system call.
        work + self.net.flush()
    }

    fn on_start(&mut self) {
        if let Some(cpu) = self.pin_cpu {
            match pin_current_thread(cpu) {
                Ok(()) => tracing::info!(cpu, "r2p2 network thread pinned"),
                Err(e) => {
                    tracing::warn!(cpu, error = %e, "cannot pin the r2p2 network thread; running unpinned")
                }
            }
        }
    }

    fn on_close(&mut self) {
        self.net.flush();
    }

    /// Parks in a blocking `mio` poll on the socket, at most until the next
    /// tick: a datagram, a worker's answer ([`NetWake`]) or shutdown wakes
    /// it at once.
    fn park_until_work(&mut self, timeout: Duration) -> Option<bool> {
        let until_tick = Duration::from_nanos(self.core.next_tick_ns().saturating_sub(self.now_ns));
        let timeout = timeout.min(until_tick).max(IdleStrategy::MIN_PARK);
        self.wake.parked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut woken = false;
        if !self.executor.answers_pending() && !self.stop.load(Ordering::SeqCst) {
            // Readiness is edge-triggered: we only get here after a receive
            // that hit WouldBlock, so no datagram is missed.
            match self.poll.poll(&mut self.events, Some(timeout)) {
                Ok(()) => woken = !self.events.is_empty(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => tracing::warn!(error = %e, "r2p2 poll failed"),
            }
        }
        self.wake.parked.store(false, Ordering::SeqCst);
        Some(woken)
    }

    fn doorbell(&self) -> Option<Doorbell> {
        None
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

/// `SO_BUSY_POLL` of `us` microseconds on `socket`.
pub(crate) fn set_busy_poll(socket: &impl std::os::fd::AsRawFd, us: u32) -> io::Result<()> {
    set_socket_option(socket, libc::SO_BUSY_POLL, us as usize)
}

/// Pins the calling thread to `cpu` (one of the CPUs this process may run
/// on).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let allowed = core_affinity::get_core_ids().unwrap_or_default();
    let Some(&core) = allowed.iter().find(|c| c.id == cpu) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {cpu} is not available here")));
    };
    if core_affinity::set_for_current(core) {
        Ok(())
    } else {
        Err(io::Error::other(format!("cannot pin to cpu {cpu}")))
    }
}

/// Sets the `SOL_SOCKET` integer option `option` to `value` (capped at
/// `c_int::MAX`).
fn set_socket_option(
    socket: &impl std::os::fd::AsRawFd,
    option: libc::c_int,
    value: usize,
) -> io::Result<()> {
    let value = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
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
    if rc != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Asks for `bytes` of kernel receive and send buffer on `socket`.
pub(crate) fn set_socket_buffers(socket: &UdpSocket, bytes: usize) -> io::Result<()> {
    for option in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        set_socket_option(socket, option, bytes)?;
    }
    Ok(())
}
