//! The member daemon (`ordo node`): one vsync member per process, from a
//! configuration, across views.
//!
//! A [`Node`] runs one agent on its own thread: the production
//! [`ViewMember`] (the view change of `ordo_vsync::view` driving one
//! `VsyncDriver` per view, the type the `vsync-views` simulation checks),
//! the control plane ([`ControlPlane`]: TCP, sealed with the cluster
//! secret), and, as the configuration asks, a load generator, a delivery
//! log and the status a [`crate::status`] endpoint serves.
//!
//! # Invariants
//! - Every view gets a new fabric endpoint: shm files or a tcp handshake
//!   named `CLUSTER` in view 0 and `CLUSTER-vN` in view N (a write or a
//!   link of another view never reaches it), over the view's members only,
//!   and the old endpoint is closed before the new one opens (a tcp member
//!   keeps its port).
//! - The agent's thread parks on the current view's fabric doorbell, which
//!   the control plane rings too, and never longer than a tick.
//! - The load generator sends only through the current view's handle; a
//!   wedged handle refuses without building the message, so nothing the
//!   generator counted as sent is lost unless its sender fails (resends
//!   are the view change's).
//! - A member that is removed, finds itself in a minority, or cannot open
//!   the next view's endpoint stops for good: [`Node::wait`] returns why.

use crate::config::{Backend, OrdoConfig};
use crate::control::{ControlError, ControlPlane};
use crate::wiring::{MemberFabric, WiringError, connect_fabric, connect_view_fabric};
use crate::{Agent, Runner, RunnerError};
use ordo_fabric::{Doorbell, Fabric, MemberId};
use ordo_vsync::view::{Declaration, Status, View, ViewGroup};
use ordo_vsync::{Delivered, DeliverySink, MembershipEvent, SendError, ViewMember};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type Opener = Box<dyn FnMut(&ViewGroup, usize) -> Result<MemberFabric, String> + Send>;

/// Why a node stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum NodeExit {
    /// Left out of the next view (suspected, or it left).
    Removed {
        /// The next view, without this member.
        next: u64,
    },
    /// Its unsuspected members were no majority: it stopped (partition
    /// safety).
    Minority {
        /// The view.
        view: u64,
        /// The members it suspected.
        suspects: Vec<MemberId>,
    },
    /// The next view's fabric endpoint did not open.
    Failed {
        /// The view.
        view: u64,
        /// Why.
        why: String,
    },
    /// Stopped by its owner.
    Stopped,
}

impl std::fmt::Display for NodeExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeExit::Removed { next } => {
                write!(f, "removed from the group (view {next} goes on without it)")
            }
            NodeExit::Minority { view, suspects } => write!(
                f,
                "in a minority of view {view} (suspects {suspects:?}): stopping, as partition safety requires"
            ),
            NodeExit::Failed { view, why } => write!(f, "could not open view {view}: {why}"),
            NodeExit::Stopped => write!(f, "stopped"),
        }
    }
}

/// One subgroup's counters at this member.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SubgroupStatus {
    /// Configured subgroup index.
    pub subgroup: usize,
    /// Application messages delivered here.
    pub delivered_messages: u64,
    /// Their bytes.
    pub delivered_bytes: u64,
    /// Messages this member's load generator sent.
    pub sent_messages: u64,
    /// Null rounds sent in the current view.
    pub nulls_sent: u64,
    /// Delivery batches in the current view, and their mean size.
    pub delivery_batches: u64,
    /// Mean messages per delivery batch in the current view.
    pub mean_batch: f64,
}

/// What `/status` shows (and `/metrics` exports).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This member.
    pub member: MemberId,
    /// `running`, `changing`, `removed`, `minority`, `failed` or `stopped`.
    pub state: String,
    /// The current view.
    pub view: u64,
    /// Its members, in rank order.
    pub members: Vec<MemberId>,
    /// The fabric backend.
    pub backend: String,
    /// The engine: `vsync` or `acuerdo`.
    pub engine: String,
    /// The acuerdo leader this member follows (acuerdo only).
    pub leader: Option<MemberId>,
    /// Per configured subgroup this member belongs to.
    pub subgroups: Vec<SubgroupStatus>,
    /// Peers suspected by this member's fabric so far.
    pub suspicions: u64,
    /// Views installed since start.
    pub view_changes: u64,
    /// Wedge-to-install time of the last view change, in milliseconds.
    pub last_view_change_ms: f64,
    /// Sum of wedge-to-install times, in seconds.
    pub view_change_seconds_sum: f64,
    /// Messages delivered in ragged-edge cleanups.
    pub ragged_delivered: u64,
    /// Own messages resent in new views.
    pub resent: u64,
    /// Control frames received, sent, refused, dropped.
    pub control: [u64; 4],
    /// Seconds since start.
    pub uptime_s: f64,
    /// Why it stopped, if it did.
    pub exit: Option<String>,
    /// Wall clock (Unix ns) of the last wedge (start of a view change).
    pub wedged_at_unix_ns: u64,
    /// Wall clock (Unix ns) at which the current view was installed.
    pub installed_at_unix_ns: u64,
    /// Wall clock (Unix ns) at which this status was taken (every tick).
    pub taken_at_unix_ns: u64,
}

/// Wall clock, Unix nanoseconds.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A cluster of daemons on this host, as `ordo cluster up` and `ordo bench
/// failover` make it.
#[derive(Clone, Debug)]
pub struct LocalCluster {
    /// Members (ids `0..members`).
    pub members: u32,
    /// The fabric.
    pub backend: Backend,
    /// Where the secret and logs live.
    pub dir: std::path::PathBuf,
    /// Member i uses base+i (tcp fabric), base+100+i (control),
    /// base+200+i (status).
    pub base_port: u16,
    /// The shm cluster name.
    pub cluster: String,
    /// `node.send_rate`.
    pub rate: u64,
    /// `node.message_bytes`.
    pub message_bytes: usize,
    /// Write `dir/delivered-ID.log`.
    pub delivery_log: bool,
}

impl LocalCluster {
    /// Member `id`'s configuration on top of `base`.
    pub fn member_config(&self, base: &OrdoConfig, id: MemberId) -> OrdoConfig {
        use crate::config::TcpPeer;
        let port = |offset: u32, i: u32| format!("127.0.0.1:{}", u32::from(self.base_port) + offset + i);
        let n = self.members;
        let mut c = base.clone();
        c.member.id = id;
        c.group.members = (0..n).collect();
        c.fabric.backend = self.backend;
        c.fabric.shm.cluster = self.cluster.clone();
        c.fabric.tcp.peers = (0..n).map(|i| TcpPeer { id: i, addr: port(0, i) }).collect();
        c.fabric.tcp.listen = None;
        c.security.secret_file = Some(self.dir.join("cluster.secret"));
        c.security.secret_env = None;
        c.node.control = (0..n).map(|i| TcpPeer { id: i, addr: port(100, i) }).collect();
        c.node.status = Some(port(200, id));
        c.node.send_rate = self.rate;
        c.node.message_bytes = self.message_bytes.max(8);
        if c.vsync.subgroups.is_empty() {
            c.vsync.max_payload = c.vsync.max_payload.max(c.node.message_bytes);
        }
        if self.delivery_log {
            c.node.delivery_log = Some(self.dir.join(format!("delivered-{id}.log")));
        }
        c
    }
}

/// `GET path` from a status endpoint at `addr`: the body.
pub fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use std::io::Read;
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300))
        .map_err(|_| "down".to_string())?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (_, body) = text.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    Ok(body.to_string())
}

/// Removes the shm region files of every view of `cluster` whose owners
/// are gone (`CLUSTER` in view 0, `CLUSTER-vN` after).
pub fn remove_view_files(dir: &std::path::Path, cluster: &str) {
    let _ = ordo_fabric_shm::remove_stale_files(dir, cluster);
    let prefix = format!("ordo-{cluster}-v");
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut views = std::collections::BTreeSet::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(&prefix)
            && let Some((v, _)) = rest.split_once("-m")
        {
            views.insert(v.to_string());
        }
    }
    for v in views {
        let _ = ordo_fabric_shm::remove_stale_files(dir, &format!("{cluster}-v{v}"));
    }
}

/// The status a daemon serves at `addr`.
pub fn fetch_status(addr: &str) -> Result<NodeStatus, String> {
    http_get(addr, "/status").and_then(|b| serde_json::from_str(&b).map_err(|e| e.to_string()))
}

struct Shared {
    status: Mutex<NodeStatus>,
    exit: Mutex<Option<NodeExit>>,
    exited: Condvar,
    /// Set by [`Node::leave`]; the agent starts the graceful leave.
    leave: std::sync::atomic::AtomicBool,
    /// Declarations from [`Node::declare`], for the agent.
    declare: Mutex<Vec<Declaration>>,
    /// Their outcomes by name (the configured index, or why refused),
    /// published after the view's send handles.
    declared: Mutex<std::collections::BTreeMap<String, Result<usize, String>>>,
    /// Signalled when an outcome is published.
    declared_cv: Condvar,
}

/// Counts deliveries and writes the delivery log.
struct NodeSink {
    view: u64,
    counts: Vec<(u64, u64)>,
    log: Option<BufWriter<File>>,
    log_error: bool,
    on_deliver: Option<DeliverFn>,
    snapshot: Option<SnapshotFn>,
    restore: Option<RestoreFn>,
    catalogue: Option<CatalogueFn>,
}

impl NodeSink {
    /// The counters of subgroup `g` (the catalogue grows at run time).
    fn counts(&mut self, g: usize) -> &mut (u64, u64) {
        if self.counts.len() <= g {
            self.counts.resize(g + 1, (0, 0));
        }
        &mut self.counts[g]
    }
}

/// The node's state of a subgroup: its delivered counters (16 bytes), then
/// the application's.
impl ordo_vsync::StateTransfer for NodeSink {
    fn snapshot(&mut self, subgroup: usize) -> Vec<u8> {
        let (m, b) = *self.counts(subgroup);
        let mut out = m.to_le_bytes().to_vec();
        out.extend_from_slice(&b.to_le_bytes());
        if let Some(f) = self.snapshot.as_mut() {
            out.extend_from_slice(&f(subgroup));
        }
        out
    }

    fn restore(&mut self, subgroup: usize, state: &[u8]) {
        if state.len() >= 16 {
            let m = u64::from_le_bytes(state[..8].try_into().expect("8 bytes"));
            let b = u64::from_le_bytes(state[8..16].try_into().expect("8 bytes"));
            *self.counts(subgroup) = (m, b);
        }
        if let Some(f) = self.restore.as_mut() {
            f(subgroup, state.get(16..).unwrap_or_default());
        }
    }

    fn catalogue(&mut self, template: &ordo_vsync::GroupConfig) {
        self.counts(template.subgroups.len().saturating_sub(1));
        if let Some(f) = self.catalogue.as_mut() {
            f(template);
        }
    }
}

/// An application's delivery upcall: each delivered batch, with the view
/// it was delivered in (subgroup indices are the configured ones). Runs on
/// the member's thread; must not block.
pub type DeliverFn = Box<dyn FnMut(u64, &[Delivered<'_>]) + Send>;

/// An application's view upcall: every [`MembershipEvent`] (wedged, new
/// view with who left, removed, minority, failed). Runs on the member's
/// thread; must not block.
pub type ViewFn = Box<dyn FnMut(&MembershipEvent) + Send>;

/// An application's state snapshot of a configured subgroup (taken on a
/// member that was in it, for a joiner).
pub type SnapshotFn = Box<dyn FnMut(usize) -> Vec<u8> + Send>;

/// An application's restore of a subgroup's state (on a joiner, before it
/// delivers anything there).
pub type RestoreFn = Box<dyn FnMut(usize, &[u8]) + Send>;

/// An application's view of the catalogue: every subgroup that exists
/// (configured and declared at run time), in configured order, before
/// anything of a view that has it is restored or delivered.
pub type CatalogueFn = Box<dyn FnMut(&ordo_vsync::GroupConfig) + Send>;

/// What an application embedding a [`Node`] hooks in.
#[derive(Default)]
pub struct NodeApp {
    /// The application's group (ordo-dds: its topics, possibly none yet),
    /// instead of `vsync.subgroups` (whose empty default is one subgroup of
    /// every member). Checked with `GroupConfig::validate_template`.
    pub template: Option<ordo_vsync::GroupConfig>,
    /// The catalogue, whenever it may have grown.
    pub catalogue: Option<CatalogueFn>,
    /// Delivered batches.
    pub on_deliver: Option<DeliverFn>,
    /// View changes.
    pub on_view: Option<ViewFn>,
    /// Its state of a subgroup, for a joiner (the node adds its own
    /// counters).
    pub snapshot: Option<SnapshotFn>,
    /// A joiner's restore of that state.
    pub restore: Option<RestoreFn>,
}

/// An application thread's send handle for one configured subgroup, valid
/// across views: it sends through the current view's ring. During a view
/// change it answers [`SendError::Wedged`] without calling `build` (retry
/// once the new view is installed: nothing the caller built is lost);
/// messages it sent before the change are delivered in the old view or
/// resent in the new one by this member.
#[derive(Clone)]
pub struct ViewSender {
    subgroup: usize,
    current: Arc<Mutex<Vec<Option<ordo_vsync::Sender>>>>,
}

impl ViewSender {
    /// The configured subgroup.
    pub fn subgroup(&self) -> usize {
        self.subgroup
    }

    /// Builds a `len`-byte message in place and sends it in the current
    /// view; `WouldBlock` when the window is full, `Wedged` during a view
    /// change or when this member is no sender of the subgroup in the
    /// current view.
    pub fn try_send_with(&self, len: usize, build: impl FnOnce(&mut [u8])) -> Result<(), SendError> {
        let sender =
            self.current.lock().unwrap_or_else(|p| p.into_inner()).get(self.subgroup).cloned().flatten();
        match sender {
            Some(s) => s.try_send_with(len, build),
            None => Err(SendError::Wedged),
        }
    }
}

/// FNV-1a, 64-bit: the delivery log's digest of a payload.
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl DeliverySink for NodeSink {
    fn deliver(&mut self, batch: &[Delivered<'_>]) {
        if let Some(f) = self.on_deliver.as_mut() {
            f(self.view, batch);
        }
        for d in batch {
            let c = self.counts(d.subgroup);
            c.0 += 1;
            c.1 += d.payload.len() as u64;
            if let Some(log) = self.log.as_mut() {
                let index =
                    d.payload.get(..8).map_or(u64::MAX, |b| u64::from_le_bytes(b.try_into().expect("8")));
                let line = writeln!(
                    log,
                    "{} {} {} {} {} {:016x}",
                    self.view,
                    d.subgroup,
                    d.sender,
                    index,
                    d.payload.len(),
                    fnv64(d.payload)
                );
                if line.is_err() && !self.log_error {
                    self.log_error = true;
                    tracing::error!("delivery log: write failed; no more lines will be written");
                }
            }
        }
    }
}

/// The payload of message `index` of `sender`: the index (8 bytes,
/// little-endian), then bytes that are a function of both.
pub fn payload(sender: MemberId, index: u64, buf: &mut [u8]) {
    buf[..8].copy_from_slice(&index.to_le_bytes());
    let mut x = index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(sender);
    for chunk in buf[8..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = x.to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

struct ViewAgent {
    me: MemberId,
    member: ViewMember<MemberFabric, Opener>,
    control: ControlPlane,
    sink: NodeSink,
    shared: Arc<Shared>,
    t0: Instant,
    tick: Duration,
    next_tick: Duration,
    /// Load: messages per second, bytes, and per configured subgroup the
    /// next index and the time its next message is due.
    rate: u64,
    message_bytes: usize,
    /// The load generator's first message index: 0 for an original
    /// member, the start time in µs for a joiner (a restarted member's
    /// messages never repeat its earlier incarnation's indices).
    first_index: u64,
    sent: Vec<u64>,
    due: Vec<Duration>,
    wedged_at: Option<Instant>,
    wedged_at_unix_ns: u64,
    installed_at_unix_ns: u64,
    view_changes: u64,
    last_change: Duration,
    change_sum: Duration,
    ragged: u64,
    resent: u64,
    suspicions: u64,
    stopped: bool,
    backend: Backend,
    on_view: Option<ViewFn>,
    /// The current view's send handles, for [`ViewSender`]s.
    senders: Arc<Mutex<Vec<Option<ordo_vsync::Sender>>>>,
    shared_key: Option<(u64, bool)>,
}

impl ViewAgent {
    /// Publishes the current view's send handles (none while changing),
    /// when the view or its state changed.
    fn share_senders(&mut self) {
        let running = self.member.is_settled();
        let key = (self.member.view().id, running);
        if self.shared_key == Some(key) {
            return;
        }
        self.shared_key = Some(key);
        let n = self.member.template().subgroups.len();
        if self.sent.len() < n {
            // Declared subgroups: no load generator there.
            self.sent.resize(n, 0);
            self.due.resize(n, Duration::MAX);
        }
        // An application thread's commit rings this view's doorbell, so a
        // parked agent posts it at once rather than at its next timeout
        // (without it a light-load round trip waited out a park: ~50 µs).
        let bell = self.member.try_driver().and_then(|d| d.fabric().doorbell().cloned());
        let v: Vec<Option<ordo_vsync::Sender>> = (0..n)
            .map(|g| {
                let s = if running { self.member.sender(g).cloned() } else { None };
                if let (Some(s), Some(b)) = (&s, &bell) {
                    s.ring_on_commit(b.clone());
                }
                s
            })
            .collect();
        *self.senders.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn send_load(&mut self) -> usize {
        if self.rate == 0 || !self.member.is_settled() {
            return 0;
        }
        let now = self.now();
        let step = Duration::from_nanos(1_000_000_000 / self.rate);
        let mut work = 0;
        for g in 0..self.sent.len() {
            let mut burst = 0;
            while self.due[g] <= now && burst < 64 {
                let Some(handle) = self.member.sender(g) else { break };
                let index = self.first_index + self.sent[g];
                let me = self.me;
                match handle.try_send_with(self.message_bytes, |b| payload(me, index, b)) {
                    Ok(()) => {
                        self.sent[g] += 1;
                        self.due[g] += step;
                        burst += 1;
                        work += 1;
                    }
                    Err(SendError::WouldBlock | SendError::Wedged) => break,
                    Err(e) => {
                        tracing::error!(member = self.me, subgroup = g, error = %e, "load generator: send refused");
                        self.rate = 0;
                        break;
                    }
                }
            }
            // Never owe more than a second of sends after a stall.
            if now.saturating_sub(self.due[g]) > Duration::from_secs(1) {
                self.due[g] = now;
            }
        }
        work
    }

    fn flush_outbox(&mut self) {
        for (to, msg) in self.member.take_outbox() {
            self.control.send(to, msg);
        }
    }

    fn handle_events(&mut self) {
        let mut outcomes = Vec::new();
        for e in self.member.take_events() {
            if let Some(f) = self.on_view.as_mut() {
                f(&e);
            }
            match e {
                MembershipEvent::Wedged { view } => {
                    self.wedged_at = Some(Instant::now());
                    self.wedged_at_unix_ns = unix_ns();
                    tracing::info!(member = self.me, view, "view change: wedged");
                }
                MembershipEvent::Restored { view, subgroup, bytes } => {
                    tracing::info!(member = self.me, view, subgroup, bytes, "state restored");
                }
                MembershipEvent::Installed { view, left, joined, ragged, resent } => {
                    let took = self.wedged_at.take().map(|t| t.elapsed()).unwrap_or_default();
                    self.installed_at_unix_ns = unix_ns();
                    self.view_changes += 1;
                    self.last_change = took;
                    self.change_sum += took;
                    self.ragged += ragged as u64;
                    self.resent += resent as u64;
                    tracing::info!(
                        member = self.me,
                        view = view.id,
                        members = ?view.members,
                        ?left,
                        ?joined,
                        ragged,
                        resent,
                        ms = took.as_secs_f64() * 1e3,
                        "view installed"
                    );
                    self.control
                        .set_bell(self.member.try_driver().and_then(|d| d.fabric().doorbell().cloned()));
                    if let Some(log) = self.sink.log.as_mut() {
                        let _ = log.flush();
                    }
                }
                MembershipEvent::Removed { next } => self.stop(NodeExit::Removed { next: next.id }),
                MembershipEvent::Minority { view, suspects } => {
                    self.stop(NodeExit::Minority { view: view.id, suspects })
                }
                MembershipEvent::Failed { view, why } => self.stop(NodeExit::Failed { view: view.id, why }),
                MembershipEvent::Answered(a) => {
                    match &a.outcome {
                        Ok(subgroup) => tracing::info!(member = self.me, a.name, subgroup, "declared"),
                        Err(why) => tracing::warn!(member = self.me, a.name, why, "declaration refused"),
                    }
                    outcomes.push((a.name, a.outcome));
                }
            }
        }
        self.suspicions += self.member.take_suspicions().len() as u64;
        self.share_senders();
        if !outcomes.is_empty() {
            // After the send handles: a declarer that learns its subgroup
            // finds its handle there.
            let mut d = self.shared.declared.lock().unwrap_or_else(|p| p.into_inner());
            d.extend(outcomes);
            self.shared.declared_cv.notify_all();
        }
    }

    fn stop(&mut self, why: NodeExit) {
        tracing::warn!(member = self.me, "{why}");
        self.stopped = true;
        if let Some(log) = self.sink.log.as_mut() {
            let _ = log.flush();
        }
        self.publish();
        let mut exit = self.shared.exit.lock().unwrap_or_else(|p| p.into_inner());
        exit.get_or_insert(why);
        self.shared.exited.notify_all();
    }

    fn publish(&mut self) {
        let running = self.member.running();
        let view = self.member.view().clone();
        let mut st = NodeStatus {
            member: self.me,
            state: match (running, self.member.status()) {
                (false, Status::Joining) => "joining".into(),
                (true, _) if self.member.awaits_state() => "joining".into(),
                (true, _) if self.member.is_changing() => "changing".into(),
                (true, _) => "running".into(),
                (false, Status::Removed) => "removed".into(),
                (false, Status::Minority) => "minority".into(),
                (false, Status::Running) => "failed".into(),
            },
            view: view.id,
            members: view.members.clone(),
            backend: format!("{:?}", self.backend).to_lowercase(),
            engine: "vsync".into(),
            suspicions: self.suspicions,
            view_changes: self.view_changes,
            last_view_change_ms: self.last_change.as_secs_f64() * 1e3,
            view_change_seconds_sum: self.change_sum.as_secs_f64(),
            ragged_delivered: self.ragged,
            resent: self.resent,
            control: {
                let c = self.control.stats();
                [
                    c.frames_in.load(Ordering::Relaxed),
                    c.frames_out.load(Ordering::Relaxed),
                    c.refused.load(Ordering::Relaxed),
                    c.dropped.load(Ordering::Relaxed),
                ]
            },
            uptime_s: self.t0.elapsed().as_secs_f64(),
            wedged_at_unix_ns: self.wedged_at_unix_ns,
            installed_at_unix_ns: self.installed_at_unix_ns,
            taken_at_unix_ns: unix_ns(),
            ..NodeStatus::default()
        };
        let group = self.member.group();
        for (g, &(msgs, bytes)) in self.sink.counts.iter().enumerate() {
            let mut s = SubgroupStatus {
                subgroup: g,
                delivered_messages: msgs,
                delivered_bytes: bytes,
                sent_messages: self.sent.get(g).copied().unwrap_or(0),
                ..SubgroupStatus::default()
            };
            if let Some(d) = self.member.try_driver()
                && let Some(i) = group.index[g]
            {
                let stats = d.engine().stats(i);
                s.nulls_sent = stats.nulls_sent;
                s.delivery_batches = stats.delivery_batches.batches;
                s.mean_batch = stats.delivery_batches.mean();
            }
            st.subgroups.push(s);
        }
        let exit = self.shared.exit.lock().unwrap_or_else(|p| p.into_inner()).clone();
        st.exit = exit.map(|e| e.to_string());
        if st.exit.is_some() && st.state == "running" {
            st.state = "stopped".into();
        }
        *self.shared.status.lock().unwrap_or_else(|p| p.into_inner()) = st;
    }
}

impl Agent for ViewAgent {
    fn name(&self) -> &str {
        "vsync-view-member"
    }

    fn do_work(&mut self, _now_ns: u64) -> usize {
        if self.stopped {
            return 0;
        }
        let mut work = 0;
        if self.shared.leave.swap(false, Ordering::AcqRel) {
            tracing::info!(member = self.me, view = self.member.view().id, "leaving the group");
            self.sink.view = self.member.view().id;
            self.member.leave(&mut self.sink);
            self.flush_outbox();
            self.handle_events();
            work += 1;
        }
        let declarations =
            std::mem::take(&mut *self.shared.declare.lock().unwrap_or_else(|p| p.into_inner()));
        for d in declarations {
            self.sink.view = self.member.view().id;
            self.member.declare(d, &mut self.sink);
            self.flush_outbox();
            self.handle_events();
            work += 1;
        }
        while let Some((from, msg)) = self.control.try_recv() {
            self.sink.view = self.member.view().id;
            work += 1 + self.member.on_control(from, msg, &mut self.sink);
            // Sent at once: a decision is opened by the next call, which
            // waits for the other members to open it too.
            self.flush_outbox();
            self.handle_events();
            if self.stopped {
                return work;
            }
        }
        let now = self.now();
        if now >= self.next_tick {
            self.sink.view = self.member.view().id;
            self.member.tick(&mut self.sink);
            self.flush_outbox();
            self.next_tick = now + self.tick;
            self.handle_events();
            if self.stopped {
                return work + 1;
            }
            if let Some(log) = self.sink.log.as_mut() {
                let _ = log.flush();
            }
            self.publish();
        }
        self.sink.view = self.member.view().id;
        work += self.member.do_work(&mut self.sink);
        self.flush_outbox();
        self.handle_events();
        if self.stopped {
            return work + 1;
        }
        work += self.send_load();
        self.flush_outbox();
        work
    }

    fn on_close(&mut self) {
        if let Some(log) = self.sink.log.as_mut() {
            let _ = log.flush();
        }
        if !self.stopped {
            self.stop(NodeExit::Stopped);
        }
    }

    /// Parks on the current view's doorbell (rung by fabric writes and
    /// control frames) until the next tick at the latest.
    fn park_until_work(&mut self, timeout: Duration) -> Option<bool> {
        let until_tick = self.next_tick.saturating_sub(self.now());
        let timeout = timeout.min(until_tick).max(Duration::from_micros(50));
        if self.stopped || !self.member.running() {
            std::thread::sleep(timeout);
            return Some(false);
        }
        let Some(bell) = self.member.try_driver().and_then(|d| d.fabric().doorbell().cloned()) else {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
            return Some(false);
        };
        let token = bell.prepare_park();
        // Re-check after announcing the park: anything that arrived since
        // the last duty cycle is handled now rather than after the timeout.
        if self.do_work(0) > 0 {
            bell.cancel(token);
            return Some(true);
        }
        Some(bell.park(token, timeout))
    }

    fn doorbell(&self) -> Option<Doorbell> {
        None
    }
}

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is invalid for a daemon.
    #[error(transparent)]
    Config(#[from] crate::ValidationError),
    /// An address does not resolve.
    #[error("cannot resolve {addr:?}: {why}")]
    Address {
        /// The address.
        addr: String,
        /// Why.
        why: String,
    },
    /// The cluster secret could not be read.
    #[error(transparent)]
    Secret(#[from] ordo_auth::SecretError),
    /// The control plane did not start.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The first view's fabric did not come up, or the group is invalid.
    #[error("view 0: {0}")]
    Start(String),
    /// The delivery log could not be opened.
    #[error("node.delivery_log {path}: {why}")]
    Log {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// The agent thread did not start.
    #[error(transparent)]
    Runner(#[from] RunnerError),
}

fn resolve(addr: &str) -> Result<SocketAddr, NodeError> {
    addr.to_socket_addrs()
        .map_err(|e| NodeError::Address { addr: addr.into(), why: e.to_string() })?
        .next()
        .ok_or_else(|| NodeError::Address { addr: addr.into(), why: "no address".into() })
}

/// The configuration of view `view` of `base`: the view's members, its
/// cluster name, a region large enough.
fn view_config(base: &OrdoConfig, view: &View, region_len: usize) -> OrdoConfig {
    let mut c = base.clone();
    c.group.members = view.members.clone();
    if view.id > 0 {
        c.fabric.shm.cluster = format!("{}-v{}", base.fabric.shm.cluster, view.id);
    }
    c.fabric.region_bytes = base.fabric.region_bytes.max(region_len.next_multiple_of(64));
    c.fabric.tcp.peers.retain(|p| view.members.contains(&p.id));
    c.node.control.retain(|p| view.members.contains(&p.id));
    // Members open a view within milliseconds of each other: a first dial
    // that finds no listener (or the old view's) is retried soon, so no
    // member waits long enough for the others to miss its heartbeats.
    c.fabric.tcp.reconnect_interval_ms = c.fabric.tcp.reconnect_interval_ms.min(5);
    c
}

/// A running member daemon.
pub struct Node {
    runner: Option<Runner<ViewAgent>>,
    acuerdo: Option<AcuerdoNode>,
    shared: Arc<Shared>,
    control_addr: Option<SocketAddr>,
    senders: Arc<Mutex<Vec<Option<ordo_vsync::Sender>>>>,
    /// Held by [`Node::declare`]: one declaration at a time, so two threads
    /// declaring one name do not take each other's answer.
    declaring: Mutex<()>,
}

/// An acuerdo member run by a [`Node`]: its agent, and the thread that
/// generates load (as the leader) and publishes the status.
struct AcuerdoNode {
    runner: Option<Runner<crate::acuerdo::AcuerdoMember<MemberFabric>>>,
    driver: Option<std::thread::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl AcuerdoNode {
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
        if let Some(r) = self.runner.take() {
            drop(r.join());
        }
    }
}

/// The acuerdo payload: index (8 bytes), the submitting member (4), then
/// [`payload`]'s filler.
fn acuerdo_payload(me: MemberId, index: u64, buf: &mut [u8]) {
    payload(me, index, buf);
    buf[8..12].copy_from_slice(&me.to_le_bytes());
}

/// The delivery log `node.delivery_log` names, opened for appending.
fn open_log(config: &OrdoConfig) -> Result<Option<BufWriter<File>>, NodeError> {
    let Some(p) = &config.node.delivery_log else { return Ok(None) };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| NodeError::Log { path: p.display().to_string(), why: e.to_string() })?;
    Ok(Some(BufWriter::new(file)))
}

/// A base port for a [`LocalCluster`] of `n` members whose fabric,
/// control, status, kv and kv-raft ports (base+i, base+100+i, base+200+i,
/// base+300+i; base+400+i free for UDP too) are all free now (None after
/// 500 tries). The ports lie below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), where no outgoing connection of
/// another process takes one between this check and the bind, and a
/// connect to a closed one cannot meet itself.
pub fn free_base_port(n: u32) -> Option<u16> {
    // Every port of the layout (base .. base+400+n) below the range; an
    // unusual range leaves no room there: anywhere, checked below.
    let span = 401 + n;
    let floor = u32::from(crate::wiring::LOCAL_PORT_FLOOR);
    let ephemeral_low = crate::wiring::ephemeral_low();
    let (low, high) = if ephemeral_low > floor + span + 1_000 {
        (floor, ephemeral_low - span)
    } else {
        (20_000, 65_535u32.checked_sub(span)?)
    };
    if high <= low {
        return None;
    }
    let seed = unix_ns() ^ u64::from(std::process::id());
    (0..500u64).find_map(|attempt| {
        let pick = seed.wrapping_mul(2_654_435_761).wrapping_add(attempt * 7919);
        let base = low + (pick % u64::from(high - low)) as u32;
        let free = (0..n).all(|i| {
            let port = |o: u32| u16::try_from(base + o + i).expect("the layout fits below 65,536");
            [0, 100, 200, 300].iter().all(|&o| std::net::TcpListener::bind(("127.0.0.1", port(o))).is_ok())
                && std::net::UdpSocket::bind(("127.0.0.1", port(400))).is_ok()
        });
        free.then(|| u16::try_from(base).expect("below high"))
    })
}

/// Starts an acuerdo member as `config` says (`node.engine = "acuerdo"`).
fn start_acuerdo(config: &OrdoConfig, app: NodeApp) -> Result<Node, NodeError> {
    use crate::acuerdo::{ClientEvent, MemberOptions, region_len, runtime_config, start_member};
    let me = config.member.id;
    let mut cfg = runtime_config(config.group.members.clone(), me);
    // A restarted member is a new, larger incarnation: the group catches
    // it up.
    cfg.incarnation = config.node.incarnation.max(1);
    cfg.max_payload = cfg.max_payload.max(config.node.message_bytes);
    cfg.validate().map_err(|e| NodeError::Start(e.to_string()))?;
    let mut c = config.clone();
    c.fabric.region_bytes = c.fabric.region_bytes.max(region_len(&cfg));
    let fabric = connect_fabric(&c).map_err(|e| NodeError::Start(e.to_string()))?;
    let log = open_log(config)?;
    let sink = Arc::new(Mutex::new(NodeSink {
        view: 0,
        counts: vec![(0, 0)],
        log,
        log_error: false,
        on_deliver: app.on_deliver,
        snapshot: app.snapshot,
        restore: app.restore,
        catalogue: None,
    }));
    let (s1, s2, s3) = (sink.clone(), sink.clone(), sink.clone());
    let options = MemberOptions {
        on_deliver: Some(Box::new(move |h, p| {
            let mut s = s1.lock().unwrap_or_else(|e| e.into_inner());
            s.view = u64::from(h.epoch.round);
            let sender = p.get(8..12).map_or(0, |b| MemberId::from_le_bytes(b.try_into().expect("4")));
            let d = Delivered { subgroup: 0, sender, seq: h.count as i64, round: 0, payload: p };
            s.deliver(std::slice::from_ref(&d));
        })),
        on_snapshot: Some(Box::new(move || {
            ordo_vsync::StateTransfer::snapshot(&mut *s2.lock().unwrap_or_else(|e| e.into_inner()), 0)
        })),
        on_restore: Some(Box::new(move |_, state| {
            ordo_vsync::StateTransfer::restore(&mut *s3.lock().unwrap_or_else(|e| e.into_inner()), 0, state)
        })),
        ..MemberOptions::default()
    };
    let (runner, mut client) = start_member(fabric, cfg, options).map_err(NodeError::Start)?;
    let shared = Arc::new(Shared {
        status: Mutex::new(NodeStatus::default()),
        exit: Mutex::new(None),
        exited: Condvar::new(),
        leave: std::sync::atomic::AtomicBool::new(false),
        declare: Mutex::new(Vec::new()),
        declared: Mutex::new(Default::default()),
        declared_cv: Condvar::new(),
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (rate, bytes, tick) =
        (config.node.send_rate, config.node.message_bytes, Duration::from_millis(config.node.tick_ms));
    let (sh, st, members, backend) =
        (shared.clone(), stop.clone(), config.group.members.clone(), config.fabric.backend);
    let driver = std::thread::Builder::new()
        .name(format!("acuerdo-node-{me}"))
        .spawn(move || {
            let t0 = Instant::now();
            let live = client.status().clone();
            let mut buf = vec![0u8; bytes];
            let (mut sent, mut due, mut next_status) = (0u64, Duration::ZERO, Duration::ZERO);
            let mut in_flight = 0u64;
            while !st.load(Ordering::Acquire) {
                let now = t0.elapsed();
                while let Some(e) = client.poll() {
                    if matches!(
                        e,
                        ClientEvent::Committed { .. }
                            | ClientEvent::Lost { .. }
                            | ClientEvent::Unknown { .. }
                            | ClientEvent::Rejected { .. }
                    ) {
                        in_flight = in_flight.saturating_sub(1);
                    }
                }
                // The leader orders every message: only it generates load.
                if rate > 0 && live.is_leader() {
                    let step = Duration::from_nanos(1_000_000_000 / rate);
                    if now.saturating_sub(due) > Duration::from_secs(1) {
                        due = now;
                    }
                    while due <= now && in_flight < 512 {
                        acuerdo_payload(me, sent, &mut buf);
                        if client.submit(&buf).is_err() {
                            break;
                        }
                        sent += 1;
                        in_flight += 1;
                        due += step;
                    }
                } else {
                    due = now;
                }
                if now >= next_status {
                    next_status = now + tick;
                    let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(log) = s.log.as_mut() {
                        let _ = log.flush();
                    }
                    let e = live.epoch();
                    let (m, b) = s.counts[0];
                    *sh.status.lock().unwrap_or_else(|e| e.into_inner()) = NodeStatus {
                        member: me,
                        state: format!("{:?}", live.role()).to_lowercase(),
                        view: u64::from(e.round),
                        members: members.clone(),
                        backend: format!("{backend:?}").to_lowercase(),
                        engine: "acuerdo".into(),
                        leader: live.leader(),
                        subgroups: vec![SubgroupStatus {
                            subgroup: 0,
                            delivered_messages: m,
                            delivered_bytes: b,
                            sent_messages: sent,
                            ..SubgroupStatus::default()
                        }],
                        view_changes: live.elections_won(),
                        uptime_s: t0.elapsed().as_secs_f64(),
                        taken_at_unix_ns: unix_ns(),
                        ..NodeStatus::default()
                    };
                }
                // Sleep until the next send is due (as the leader) or the
                // next status, not on a fixed short period: daemons share
                // few cores.
                let now = t0.elapsed();
                let until = if rate > 0 && live.is_leader() { due.min(next_status) } else { next_status };
                std::thread::sleep(until.saturating_sub(now).clamp(Duration::from_micros(50), tick));
            }
            if let Some(log) = sink.lock().unwrap_or_else(|e| e.into_inner()).log.as_mut() {
                let _ = log.flush();
            }
        })
        .map_err(|e| NodeError::Start(e.to_string()))?;
    Ok(Node {
        runner: None,
        acuerdo: Some(AcuerdoNode { runner: Some(runner), driver: Some(driver), stop }),
        shared,
        control_addr: None,
        senders: Arc::new(Mutex::new(Vec::new())),
        declaring: Mutex::new(()),
    })
}

impl Node {
    /// Starts this process's member as `config` describes
    /// ([`OrdoConfig::validate_node_daemon`]): the control plane, view 0's
    /// fabric (waiting for every member), and the agent thread.
    pub fn start(config: &OrdoConfig) -> Result<Node, NodeError> {
        Node::start_with(config, NodeApp::default())
    }

    /// As [`start`](Self::start), with an application's upcalls. With
    /// `node.engine = "acuerdo"` it runs an acuerdo member instead (no
    /// views: the leader orders everything, a restarted member catches up;
    /// delivery upcalls see subgroup 0, `view` the epoch's round; no view
    /// upcalls or send handles).
    pub fn start_with(config: &OrdoConfig, app: NodeApp) -> Result<Node, NodeError> {
        config.validate_node_daemon()?;
        if config.node.engine == crate::config::NodeEngine::Acuerdo {
            return start_acuerdo(config, app);
        }
        let me = config.member.id;
        let mut app = app;
        let template = match app.template.take() {
            Some(t) => {
                t.validate_template().map_err(|e| NodeError::Start(e.to_string()))?;
                t
            }
            None => config.vsync_group()?,
        };
        let secret = config.security.load_secret()?;
        if secret.is_none() && !config.security.allow_unauthenticated {
            return Err(crate::ValidationError::SecretMissing.into());
        }
        let mut members = Vec::new();
        for &m in &config.group.members {
            members.push((m, resolve(config.node.control_addr(m).expect("validated"))?));
        }
        let listen = members.iter().find(|m| m.0 == me).expect("validated").1;
        let control = ControlPlane::start(me, listen, &members, secret.as_ref())?;
        let control_addr = control.local_addr();
        let base = config.clone();
        // A member of a new view that never opens it (it died after the
        // decision) is suspected after this, not waited for.
        let wait = Duration::from_millis(config.node.tick_ms * u64::from(config.node.patience) * 4);
        let open: Opener = Box::new(move |group: &ViewGroup, len: usize| {
            let c = view_config(&base, &group.view, len);
            if group.view.id == 0 {
                connect_fabric(&c).map_err(|e: WiringError| e.to_string())
            } else {
                connect_view_fabric(&c, wait).map_err(|e: WiringError| e.to_string())
            }
        });
        let mut member = if config.node.join {
            let inc = if config.node.incarnation > 0 { config.node.incarnation } else { unix_ns().max(1) };
            ViewMember::join(me, template.clone(), inc, open)
        } else {
            let view = View { id: 0, members: config.group.members.clone() };
            ViewMember::new(me, template.clone(), view, open)
        }
        .map_err(|e| NodeError::Start(e.to_string()))?;
        member.set_patience(config.node.patience);
        control.set_bell(member.try_driver().and_then(|d| d.fabric().doorbell().cloned()));
        let log = open_log(config)?;
        let n = template.subgroups.len();
        let shared = Arc::new(Shared {
            status: Mutex::new(NodeStatus::default()),
            exit: Mutex::new(None),
            exited: Condvar::new(),
            leave: std::sync::atomic::AtomicBool::new(false),
            declare: Mutex::new(Vec::new()),
            declared: Mutex::new(Default::default()),
            declared_cv: Condvar::new(),
        });
        let senders_in: Vec<bool> = template.subgroups.iter().map(|s| s.senders.contains(&me)).collect();
        let senders = Arc::new(Mutex::new(vec![None; n]));
        let tick = Duration::from_millis(config.node.tick_ms);
        let mut agent = ViewAgent {
            me,
            member,
            control,
            sink: NodeSink {
                view: 0,
                counts: vec![(0, 0); n],
                log,
                log_error: false,
                on_deliver: app.on_deliver,
                snapshot: app.snapshot,
                restore: app.restore,
                catalogue: app.catalogue,
            },
            shared: shared.clone(),
            t0: Instant::now(),
            tick,
            next_tick: tick,
            rate: config.node.send_rate,
            message_bytes: config.node.message_bytes,
            sent: vec![0; n],
            first_index: if config.node.join { unix_ns() / 1000 } else { 0 },
            due: senders_in.iter().map(|s| if *s { Duration::ZERO } else { Duration::MAX }).collect(),
            wedged_at: None,
            wedged_at_unix_ns: 0,
            installed_at_unix_ns: 0,
            view_changes: 0,
            last_change: Duration::ZERO,
            change_sum: Duration::ZERO,
            ragged: 0,
            resent: 0,
            suspicions: 0,
            stopped: false,
            backend: config.fabric.backend,
            on_view: app.on_view,
            senders: senders.clone(),
            shared_key: None,
        };
        agent.share_senders();
        agent.publish();
        let mut options = config.runner_options();
        options.threading = crate::ThreadingMode::Dedicated;
        let runner = Runner::start(vec![agent], &options)?;
        Ok(Node {
            runner: Some(runner),
            acuerdo: None,
            shared,
            control_addr: Some(control_addr),
            senders,
            declaring: Mutex::new(()),
        })
    }

    /// A send handle for configured subgroup `g` that follows the views
    /// (None: no such subgroup).
    pub fn sender(&self, g: usize) -> Option<ViewSender> {
        let n = self.senders.lock().unwrap_or_else(|p| p.into_inner()).len();
        (g < n).then(|| ViewSender { subgroup: g, current: self.senders.clone() })
    }

    /// Asks to be in the subgroup `d.name` — created, through a view
    /// change, if no subgroup has that name; joined (as a sender if
    /// `d.sender`) if one has it with the same shape — and waits up to
    /// `timeout` for the answer: the subgroup's configured index (its
    /// [`sender`](Self::sender) handle is there), or why it is refused.
    /// A member newly in a subgroup receives its state before it delivers
    /// there. Vsync members only.
    pub fn declare(&self, d: Declaration, timeout: Duration) -> Result<usize, String> {
        if self.acuerdo.is_some() {
            return Err("declarations are for vsync members".into());
        }
        let _one = self.declaring.lock().unwrap_or_else(|p| p.into_inner());
        let name = d.name.clone();
        let mut done = self.shared.declared.lock().unwrap_or_else(|p| p.into_inner());
        done.remove(&name);
        self.shared.declare.lock().unwrap_or_else(|p| p.into_inner()).push(d);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = done.remove(&name) {
                return r;
            }
            if let Some(e) = self.shared.exit.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return Err(format!("the member stopped: {e}"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("no view change took the declaration of {name:?} within {timeout:?}"));
            }
            let wait = left.min(Duration::from_millis(50));
            done = self.shared.declared_cv.wait_timeout(done, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The control plane's address.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control_addr
    }

    /// The latest status (refreshed every tick).
    pub fn status(&self) -> NodeStatus {
        self.shared.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A shared handle on the status, for the status endpoint.
    pub fn status_source(&self) -> impl Fn() -> NodeStatus + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the member stops (removed, minority, failed) or
    /// `timeout` passes (`None`: still running).
    pub fn wait(&self, timeout: Duration) -> Option<NodeExit> {
        let deadline = Instant::now() + timeout;
        let mut exit = self.shared.exit.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(e) = exit.clone() {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            exit = self.shared.exited.wait_timeout(exit, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Leaves the group gracefully: the others install a view without this
    /// member (it is then [`NodeExit::Removed`]); its messages already sent
    /// are delivered or, past the ragged trim, lost with it.
    pub fn leave(&self) {
        self.shared.leave.store(true, Ordering::Release);
    }

    /// Stops the agent (flushing the delivery log) and returns why it had
    /// stopped, if it had.
    pub fn stop(mut self) -> NodeExit {
        if let Some(r) = self.runner.take() {
            drop(r.join());
        }
        if let Some(a) = self.acuerdo.as_mut() {
            a.stop();
        }
        self.shared.exit.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or(NodeExit::Stopped)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(r) = self.runner.take() {
            drop(r.join());
        }
        if let Some(a) = self.acuerdo.as_mut() {
            a.stop();
        }
    }
}
