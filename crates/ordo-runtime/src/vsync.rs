//! Running the vsync engine for real: one predicate agent per member
//! ([`VsyncMember`]) that owns the member's fabric endpoint and engine,
//! application handles to send ([`SubgroupHandle`]), delivery handlers, and
//! [`Group`], the one-call way to bring a member up from an [`OrdoConfig`].
//!
//! # Invariants
//! - One predicate thread per member evaluates every subgroup's predicates
//!   (spindle §II-D); application threads only touch the lock-free slot
//!   producer (or, with `lock_free_send` off, take the group lock).
//! - The member is a [`VsyncDriver`] (the sans-I/O driver the simulation
//!   runs too) plus threads and a lock: pushes are posted in the order the
//!   engine emitted them, a push refused with back-pressure is retried
//!   before anything newer, and the engine is not polled again until all are
//!   posted (see `ordo_vsync::VsyncDriver`).
//! - With `post_after_unlock` (spindle §III-C) the group lock is released
//!   before posting; without it posting happens under the lock.
//! - Delivery handlers run on the predicate thread and must not block;
//!   [`Delivery::Worker`] copies each message into a preallocated buffer and
//!   hands it to a worker thread through a lock-free SPSC queue (rtrb)
//!   instead (spindle §III-D); when every buffer is in use the predicate
//!   thread waits for the worker (back-pressure, never an unbounded queue).

use crate::config::OrdoConfig;
use crate::wiring::{MemberFabric, WiringError, connect_fabric};
use crate::{Agent, Runner, RunnerError};
use ordo_fabric::{Doorbell, Fabric, MemberId};
use ordo_vsync::{
    Delivered, DeliverySink, Engine, GroupConfig, SendError, Sender, SubgroupStats, VsyncDriver,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A message handed to a delivery handler.
pub type Message<'a> = Delivered<'a>;

/// A delivery handler called with each delivered batch.
pub type BatchHandler = Box<dyn FnMut(&[Message<'_>]) + Send>;

/// What [`VsyncMember::new`] returns: the agent, a send handle per subgroup
/// it sends in, and the delivery worker thread if [`Delivery::Worker`].
pub type NewMember<F> = (VsyncMember<F>, Vec<Option<SubgroupHandle>>, Option<std::thread::JoinHandle<()>>);

/// How delivered messages reach the application.
pub enum Delivery {
    /// Called on the predicate thread with each batch (spindle §III-D,
    /// batched upcall) — or once per message when the group's
    /// `batched_upcall` switch is off. Must not block.
    Inline(BatchHandler),
    /// Messages are copied into one of `buffers` preallocated buffers and
    /// handled on a worker thread; the predicate thread never runs
    /// application code.
    Worker {
        /// Buffers in flight between the threads.
        buffers: usize,
        /// Called on the worker thread per message.
        handler: Box<dyn FnMut(&OwnedMessage) + Send>,
    },
    /// Delivered messages are counted and dropped.
    Discard,
}

/// A delivered message copied out of the ring (worker hand-off).
#[derive(Clone, Debug, Default)]
pub struct OwnedMessage {
    /// Subgroup index.
    pub subgroup: usize,
    /// The sender.
    pub sender: MemberId,
    /// Position in the subgroup's total order (-1 when unordered).
    pub seq: i64,
    /// The payload (its `len()` is the message length).
    pub payload: Vec<u8>,
}

/// Counters an application can read while the group runs.
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Application messages delivered here, all subgroups.
    pub delivered_messages: AtomicU64,
    /// Their bytes.
    pub delivered_bytes: AtomicU64,
}

struct Sink {
    mode: SinkMode,
    counters: Arc<LiveCounters>,
}

enum SinkMode {
    Inline(BatchHandler),
    Worker { full: rtrb::Producer<OwnedMessage>, empty: rtrb::Consumer<OwnedMessage> },
    Discard,
}

impl DeliverySink for Sink {
    fn deliver(&mut self, batch: &[Delivered<'_>]) {
        let bytes: u64 = batch.iter().map(|d| d.payload.len() as u64).sum();
        match &mut self.mode {
            // The driver already split batches when `batched_upcall` is off.
            SinkMode::Inline(f) => f(batch),
            SinkMode::Worker { full, empty } => {
                for d in batch {
                    let mut spins = 0u32;
                    let mut buf = loop {
                        match empty.pop() {
                            Ok(b) => break b,
                            Err(_) => {
                                // Every buffer is with the worker: wait for
                                // it (bounded back-pressure).
                                spins += 1;
                                if spins < 1000 {
                                    std::hint::spin_loop();
                                } else {
                                    std::thread::yield_now();
                                }
                            }
                        }
                    };
                    buf.subgroup = d.subgroup;
                    buf.sender = d.sender;
                    buf.seq = d.seq;
                    buf.payload.clear();
                    buf.payload.extend_from_slice(d.payload);
                    if full.push(buf).is_err() {
                        unreachable!("the full queue holds every buffer");
                    }
                }
            }
            SinkMode::Discard => {}
        }
        self.counters.delivered_messages.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.counters.delivered_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// An application's handle for one subgroup it sends in.
#[derive(Clone)]
pub struct SubgroupHandle {
    sender: Sender,
    /// `Some` when `lock_free_send` is off: sends take the group lock.
    lock: Option<Arc<Mutex<()>>>,
}

impl SubgroupHandle {
    /// The subgroup index.
    pub fn subgroup(&self) -> usize {
        self.sender.subgroup()
    }

    /// Largest payload.
    pub fn max_payload(&self) -> usize {
        self.sender.max_payload()
    }

    /// Builds a `len`-byte message in place and sends it; `WouldBlock` at
    /// once when every slot is in use.
    pub fn try_send_with(&self, len: usize, build: impl FnOnce(&mut [u8])) -> Result<(), SendError> {
        match &self.lock {
            None => self.sender.try_send_with(len, build),
            Some(lock) => {
                let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                self.sender.try_send_with(len, build)
            }
        }
    }

    /// Like [`try_send_with`](Self::try_send_with) but waits (spinning,
    /// then yielding, then sleeping up to 50 µs at a time) while the window
    /// is full, up to `timeout`.
    pub fn send_with(
        &self,
        len: usize,
        timeout: Duration,
        build: impl FnOnce(&mut [u8]),
    ) -> Result<(), SendError> {
        let mut build = Some(build);
        let start = Instant::now();
        let mut tries = 0u32;
        loop {
            match self.try_send_with(len, |buf| (build.take().expect("called once"))(buf)) {
                Err(SendError::WouldBlock) => {
                    if start.elapsed() >= timeout {
                        return Err(SendError::WouldBlock);
                    }
                    tries += 1;
                    if tries < 100 {
                        std::hint::spin_loop();
                    } else if tries < 200 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                other => return other,
            }
        }
    }

    /// Declares `rounds` rounds of silence (spindle §III-B).
    pub fn declare_inactive(&self, rounds: u64) {
        self.sender.declare_inactive(rounds);
    }
}

/// A member's predicate agent: a thin shell around the sans-I/O
/// [`VsyncDriver`] (engine, push backlog, upcall batching) that adds the
/// group lock, posting after unlock, the delivery modes and logging.
pub struct VsyncMember<F: Fabric> {
    driver: VsyncDriver<F>,
    sink: Sink,
    lock: Arc<Mutex<()>>,
    post_after_unlock: bool,
    counters: Arc<LiveCounters>,
}

impl<F: Fabric> VsyncMember<F> {
    /// The agent of `fabric.member()` in `group`, with `delivery`; and a
    /// handle for every subgroup it sends in (`None` elsewhere).
    pub fn new(
        fabric: F,
        group: GroupConfig,
        delivery: Delivery,
    ) -> Result<NewMember<F>, ordo_vsync::ConfigError> {
        let switches = group.switches;
        let bell = fabric.doorbell().cloned();
        let member_id = fabric.member();
        let (driver, senders) = VsyncDriver::new(fabric, group)?;
        let lock = Arc::new(Mutex::new(()));
        let handles = senders
            .into_iter()
            .map(|s| {
                s.map(|sender| {
                    if let Some(bell) = &bell {
                        sender.ring_on_commit(bell.clone());
                    }
                    SubgroupHandle { sender, lock: (!switches.lock_free_send).then(|| lock.clone()) }
                })
            })
            .collect();
        let counters = Arc::new(LiveCounters::default());
        let (mode, worker) = match delivery {
            Delivery::Inline(f) => (SinkMode::Inline(f), None),
            Delivery::Discard => (SinkMode::Discard, None),
            Delivery::Worker { buffers, mut handler } => {
                let buffers = buffers.max(1);
                let (full, mut full_rx) = rtrb::RingBuffer::<OwnedMessage>::new(buffers);
                let (mut empty_tx, empty) = rtrb::RingBuffer::<OwnedMessage>::new(buffers);
                let max = driver.engine().config().subgroups.iter().map(|s| s.max_payload).max().unwrap_or(0);
                for _ in 0..buffers {
                    let m = OwnedMessage { payload: Vec::with_capacity(max), ..Default::default() };
                    empty_tx.push(m).expect("sized for every buffer");
                }
                let worker = std::thread::Builder::new()
                    .name(format!("vsync-worker-{member_id}"))
                    .spawn(move || {
                        let mut idle = 0u32;
                        loop {
                            match full_rx.pop() {
                                Ok(m) => {
                                    idle = 0;
                                    handler(&m);
                                    if empty_tx.push(m).is_err() {
                                        unreachable!("the empty queue holds every buffer");
                                    }
                                }
                                Err(_) if full_rx.is_abandoned() => return,
                                Err(_) => {
                                    idle += 1;
                                    if idle < 100 {
                                        std::thread::yield_now();
                                    } else {
                                        std::thread::sleep(Duration::from_micros(50));
                                    }
                                }
                            }
                        }
                    })
                    .expect("spawn the delivery worker");
                (SinkMode::Worker { full, empty }, Some(worker))
            }
        };
        let member = VsyncMember {
            driver,
            sink: Sink { mode, counters: counters.clone() },
            lock,
            post_after_unlock: switches.post_after_unlock,
            counters,
        };
        Ok((member, handles, worker))
    }

    /// Counters readable while the member runs.
    pub fn counters(&self) -> Arc<LiveCounters> {
        self.counters.clone()
    }

    /// The engine (stats, delivered_num) — after the runner gave it back.
    pub fn engine(&self) -> &Engine {
        self.driver.engine()
    }

    /// Stats of subgroup `g`.
    pub fn stats(&self, g: usize) -> &SubgroupStats {
        self.driver.engine().stats(g)
    }

    /// Peers this member has suspected so far.
    pub fn suspected(&self) -> &[MemberId] {
        self.driver.suspected()
    }

    /// Whether nothing is waiting to be posted and every own slot is
    /// reclaimed.
    pub fn is_idle(&self) -> bool {
        self.driver.is_idle()
    }

    /// Fabric events: a suspected peer wedges the member (a view change,
    /// which would exclude it, is a later issue).
    fn handle_events(&mut self) -> usize {
        let member = self.driver.engine().member();
        self.driver.on_fabric_events(|peer, cause| {
            tracing::warn!(member, peer, %cause, "peer suspected; wedging");
        })
    }
}

impl<F: Fabric + Send> Agent for VsyncMember<F> {
    fn name(&self) -> &str {
        "vsync-predicates"
    }

    fn do_work(&mut self, _now_ns: u64) -> usize {
        let mut work = self.driver.post_backlog();
        if !self.driver.can_poll() {
            // Back-pressure: the engine may not run again until everything
            // it asked for is posted (see `Engine::poll`).
            return work + self.handle_events();
        }
        let lock = self.lock.clone();
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        work += self.driver.poll_engine(&mut self.sink);
        if self.post_after_unlock {
            drop(guard);
            work += self.driver.post_backlog();
        } else {
            work += self.driver.post_backlog();
            drop(guard);
        }
        work + self.handle_events()
    }

    fn doorbell(&self) -> Option<Doorbell> {
        self.driver.fabric().doorbell().cloned()
    }
}

/// Errors bringing a member up.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::ValidationError),
    /// The vsync group is invalid.
    #[error(transparent)]
    Vsync(#[from] ordo_vsync::ConfigError),
    /// The fabric did not come up.
    #[error(transparent)]
    Wiring(#[from] WiringError),
    /// Threads did not start.
    #[error(transparent)]
    Runner(#[from] RunnerError),
}

/// One running member of a vsync group (this process's member).
pub struct Group {
    runner: Option<Runner<VsyncMember<MemberFabric>>>,
    handles: Vec<Option<SubgroupHandle>>,
    counters: Arc<LiveCounters>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Group {
    /// Connects this member's fabric as `config` says (the region is sized
    /// for the `[vsync]` group if `fabric.region_bytes` is smaller), builds
    /// the engine, and starts its predicate thread.
    pub fn start(config: &OrdoConfig, delivery: Delivery) -> Result<Group, GroupError> {
        let group = config.vsync_group()?;
        let mut config = config.clone();
        let need = ordo_vsync::GroupLayout::new(&group).region_len.next_multiple_of(64);
        config.fabric.region_bytes = config.fabric.region_bytes.max(need);
        let fabric = connect_fabric(&config)?;
        let (member, handles, worker) = VsyncMember::new(fabric, group, delivery)?;
        let counters = member.counters();
        let runner = Runner::start(vec![member], &config.runner_options())?;
        Ok(Group { runner: Some(runner), handles, counters, worker })
    }

    /// The handle to send in subgroup `g`, if this member is a sender there.
    pub fn subgroup(&self, g: usize) -> Option<&SubgroupHandle> {
        self.handles.get(g).and_then(|h| h.as_ref())
    }

    /// Live delivery counters.
    pub fn counters(&self) -> &LiveCounters {
        &self.counters
    }

    /// Stops the predicate thread and returns the member (engine stats).
    pub fn stop(mut self) -> VsyncMember<MemberFabric> {
        let runner = self.runner.take().expect("running");
        runner.join().agents.pop().expect("one member")
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(r) = self.runner.take() {
            drop(r.join());
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
