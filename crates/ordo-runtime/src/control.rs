//! The control plane of a member daemon: the view change's messages
//! ([`ControlMsg`]) over TCP, every frame sealed with the cluster secret.
//!
//! # Wire format (one frame)
//! ```text
//! +-------------------+------------------+-----------------------+---------------------------+
//! | len: u32 BE       | sender: u32 BE   | ControlMsg bytes      | trailer (24 B, ordo-auth   |
//! | (bytes after it)  |                  | (ordo_vsync::view)    | datagram: counter ‖ tag)   |
//! +-------------------+------------------+-----------------------+---------------------------+
//! ```
//! The tag covers the label `ordo control v1`, the destination member id
//! (so a frame sealed for one member does not verify at another), the
//! sender id and the message. Counters follow the wall clock; each receiver
//! keeps a replay window per member, so a captured frame replayed on a new
//! connection is refused.
//!
//! # Invariants
//! - Nothing from the network reaches the view change before its length is
//!   within [`MAX_FRAME`], its sender is a configured member, its tag
//!   verifies (when a secret is configured), its counter is fresh and its
//!   message decodes. A frame that fails any check closes its connection
//!   and is counted; it changes no state.
//! - Memory is bounded: at most [`MAX_INBOUND`] inbound connections, one
//!   frame buffer each, an inbound queue of [`INBOX`] messages (a full queue
//!   holds the reading connection back) and an outbound queue of [`OUTBOX`]
//!   (beyond it a message is dropped: the view change retransmits).
//! - The caller's thread never blocks on the network: connecting and
//!   writing happen on the writer thread.
//! - Without a secret (`security.allow_unauthenticated`) frames carry no
//!   trailer and anyone who reaches the port can take part in view changes;
//!   the daemon refuses that unless allowed.

use ordo_auth::{Opener, Sealer, Secret, TRAILER_LEN};
use ordo_fabric::{Doorbell, MemberId};
use ordo_vsync::view::ControlMsg;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Largest frame (after the length word).
pub const MAX_FRAME: usize = 64 * 1024;
/// Most inbound connections held at once.
pub const MAX_INBOUND: usize = 64;
/// Messages queued from the network for the member.
pub const INBOX: usize = 1024;
/// Messages queued for the network.
pub const OUTBOX: usize = 4096;
/// The key label of control frames.
pub const LABEL: &str = "ordo control v1";
/// Frames older than this (by the receiver's clock) are refused.
const MAX_AGE: Duration = Duration::from_secs(600);

/// Counters of the control plane.
#[derive(Debug, Default)]
pub struct ControlStats {
    /// Frames accepted.
    pub frames_in: AtomicU64,
    /// Frames handed to a connection.
    pub frames_out: AtomicU64,
    /// Frames refused: bad length, unknown sender, bad tag, replayed or
    /// stale counter, undecodable message.
    pub refused: AtomicU64,
    /// Outbound messages dropped (queue full or no connection).
    pub dropped: AtomicU64,
    /// Inbound connections open now.
    pub inbound: AtomicUsize,
}

/// A member's control plane: a listener, one reader thread per inbound
/// connection, one writer thread with a connection per peer.
pub struct ControlPlane {
    me: MemberId,
    out: SyncSender<(MemberId, ControlMsg)>,
    inbox: Receiver<(MemberId, ControlMsg)>,
    bell: Arc<Mutex<Option<Doorbell>>>,
    shutdown: Arc<AtomicBool>,
    stats: Arc<ControlStats>,
    local: SocketAddr,
    threads: Vec<JoinHandle<()>>,
}

/// Why the control plane did not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The listen address could not be bound.
    #[error("control plane: cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// This member has no address among the configured ones.
    #[error("control plane: member {0} has no control address")]
    NoAddress(MemberId),
}

fn now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn context(to: MemberId) -> [u8; 4] {
    to.to_be_bytes()
}

impl ControlPlane {
    /// Starts member `me`'s control plane listening on `listen`, with
    /// `members` (every member's id and address, this one's included).
    /// With `secret`, every frame is sealed and checked.
    pub fn start(
        me: MemberId,
        listen: SocketAddr,
        members: &[(MemberId, SocketAddr)],
        secret: Option<&Secret>,
    ) -> Result<ControlPlane, ControlError> {
        let listener =
            TcpListener::bind(listen).map_err(|source| ControlError::Listen { addr: listen, source })?;
        let local = listener.local_addr().map_err(|source| ControlError::Listen { addr: listen, source })?;
        listener.set_nonblocking(true).map_err(|source| ControlError::Listen { addr: listen, source })?;
        let mut ids: Vec<MemberId> = members.iter().map(|m| m.0).collect();
        ids.sort_unstable();
        ids.dedup();
        let addrs: HashMap<MemberId, SocketAddr> = members.iter().copied().collect();
        let key = secret.map(|s| s.derive(LABEL));
        let opener = key
            .clone()
            .map(|k| Arc::new(Mutex::new(Opener::for_peers(k, ids.len(), MAX_AGE.as_nanos() as u64))));
        let (out, out_rx) = sync_channel::<(MemberId, ControlMsg)>(OUTBOX);
        let (in_tx, inbox) = sync_channel::<(MemberId, ControlMsg)>(INBOX);
        let bell: Arc<Mutex<Option<Doorbell>>> = Arc::new(Mutex::new(None));
        let shutdown = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ControlStats::default());
        let mut threads = Vec::new();
        {
            let proto = Reader {
                me,
                ids: ids.clone(),
                opener,
                inbox: in_tx,
                bell: bell.clone(),
                shutdown: shutdown.clone(),
                stats: stats.clone(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("control-accept-{me}"))
                    .spawn(move || accept_loop(listener, proto))
                    .expect("spawn the control acceptor"),
            );
        }
        {
            let (shutdown, stats) = (shutdown.clone(), stats.clone());
            let sealer = key.map(Sealer::new);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("control-write-{me}"))
                    .spawn(move || write_loop(me, addrs, sealer, out_rx, shutdown, stats))
                    .expect("spawn the control writer"),
            );
        }
        Ok(ControlPlane { me, out, inbox, bell, shutdown, stats, local, threads })
    }

    /// This member.
    pub fn member(&self) -> MemberId {
        self.me
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Queues `msg` for `to` (dropped if the queue is full: the view change
    /// retransmits).
    pub fn send(&self, to: MemberId, msg: ControlMsg) {
        match self.out.try_send((to, msg)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The next message received, if any.
    pub fn try_recv(&self) -> Option<(MemberId, ControlMsg)> {
        self.inbox.try_recv().ok()
    }

    /// The doorbell rung when a message arrives (the member's current one).
    pub fn set_bell(&self, bell: Option<Doorbell>) {
        *self.bell.lock().unwrap_or_else(|p| p.into_inner()) = bell;
    }

    /// Counters.
    pub fn stats(&self) -> &ControlStats {
        &self.stats
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Accepts connections and gives each a reader thread with a copy of
/// `proto` (the shared context), at most [`MAX_INBOUND`] at once.
fn accept_loop(listener: TcpListener, proto: Reader) {
    let me = proto.me;
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    while !proto.shutdown.load(Ordering::Acquire) {
        readers.retain(|r| !r.is_finished());
        match listener.accept() {
            Ok((stream, from)) => {
                if readers.len() >= MAX_INBOUND {
                    tracing::warn!(member = me, %from, "control plane: too many connections; closing a new one");
                    continue;
                }
                let ctx = proto.clone();
                if let Ok(r) = std::thread::Builder::new()
                    .name(format!("control-read-{me}"))
                    .spawn(move || ctx.run(stream, from))
                {
                    readers.push(r);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::debug!(member = me, error = %e, "control plane: accept failed");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    for r in readers {
        let _ = r.join();
    }
}

/// What every reader thread shares (cheap to clone: ids and handles).
#[derive(Clone)]
struct Reader {
    me: MemberId,
    ids: Vec<MemberId>,
    opener: Option<Arc<Mutex<Opener>>>,
    inbox: SyncSender<(MemberId, ControlMsg)>,
    bell: Arc<Mutex<Option<Doorbell>>>,
    shutdown: Arc<AtomicBool>,
    stats: Arc<ControlStats>,
}

/// Why a frame was refused (the connection closes).
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("frame of {0} bytes (bounds 4..={MAX_FRAME})")]
    Length(usize),
    #[error("sender {0} is not a member")]
    UnknownSender(MemberId),
    #[error("authentication: {0}")]
    Auth(#[from] ordo_auth::OpenError),
    #[error("{0}")]
    Decode(#[from] ordo_vsync::view::DecodeError),
}

impl Reader {
    fn run(self, mut stream: TcpStream, from: SocketAddr) {
        self.stats.inbound.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
        let _ = stream.set_nodelay(true);
        let mut buf = Vec::with_capacity(1024);
        loop {
            match self.read_frame(&mut stream, &mut buf) {
                Ok(None) => break,
                Ok(Some(len)) => match self.check(&buf[..len]) {
                    Ok((sender, msg)) => {
                        self.stats.frames_in.fetch_add(1, Ordering::Relaxed);
                        if self.inbox.send((sender, msg)).is_err() {
                            break;
                        }
                        if let Some(b) = self.bell.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                            b.ring();
                        }
                    }
                    Err(e) => {
                        self.stats.refused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(member = self.me, %from, error = %e, "control plane: frame refused; closing");
                        break;
                    }
                },
                Err(e) => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(member = self.me, %from, error = %e, "control plane: frame refused; closing");
                    break;
                }
            }
        }
        self.stats.inbound.fetch_sub(1, Ordering::Relaxed);
    }

    /// Reads one frame into `buf`: `Ok(None)` at the end of the stream or
    /// shutdown.
    fn read_frame(&self, stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<usize>, FrameError> {
        let mut len = [0u8; 4];
        if !self.read_full(stream, &mut len) {
            return Ok(None);
        }
        let len = u32::from_be_bytes(len) as usize;
        if !(4..=MAX_FRAME).contains(&len) {
            return Err(FrameError::Length(len));
        }
        buf.resize(len, 0);
        if !self.read_full(stream, &mut buf[..len]) {
            return Ok(None);
        }
        Ok(Some(len))
    }

    /// Fills `out`, waiting through read timeouts unless shutting down;
    /// false at the end of the stream, an error or shutdown.
    fn read_full(&self, stream: &mut TcpStream, out: &mut [u8]) -> bool {
        let mut got = 0;
        while got < out.len() {
            if self.shutdown.load(Ordering::Acquire) {
                return false;
            }
            match stream.read(&mut out[got..]) {
                Ok(0) => return false,
                Ok(n) => got += n,
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    fn check(&self, frame: &[u8]) -> Result<(MemberId, ControlMsg), FrameError> {
        let sender = MemberId::from_be_bytes(frame[..4].try_into().expect("4 bytes"));
        let index = self.ids.binary_search(&sender).map_err(|_| FrameError::UnknownSender(sender))?;
        let body = match &self.opener {
            Some(opener) => {
                let n = opener.lock().unwrap_or_else(|p| p.into_inner()).open(
                    index as u64,
                    frame,
                    now_unix_ns(),
                    &context(self.me),
                )?;
                &frame[4..n]
            }
            None => &frame[4..],
        };
        Ok((sender, ControlMsg::decode(body)?))
    }
}

fn write_loop(
    me: MemberId,
    addrs: HashMap<MemberId, SocketAddr>,
    mut sealer: Option<Sealer>,
    out: Receiver<(MemberId, ControlMsg)>,
    shutdown: Arc<AtomicBool>,
    stats: Arc<ControlStats>,
) {
    let mut conns: HashMap<MemberId, TcpStream> = HashMap::new();
    // A peer we failed to reach is not dialed again before this time.
    let mut backoff: HashMap<MemberId, std::time::Instant> = HashMap::new();
    let mut frame = Vec::with_capacity(1024);
    while !shutdown.load(Ordering::Acquire) {
        let (to, msg) = match out.recv_timeout(Duration::from_millis(50)) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let Some(&addr) = addrs.get(&to) else {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        frame.clear();
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(&me.to_be_bytes());
        msg.encode(&mut frame);
        if let Some(s) = sealer.as_mut() {
            let mut body = frame.split_off(4);
            s.seal(&mut body, now_unix_ns(), &context(to));
            frame.extend_from_slice(&body);
        }
        let len = frame.len() - 4;
        debug_assert!(sealer.is_none() || len >= 4 + TRAILER_LEN);
        if len > MAX_FRAME {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        frame[..4].copy_from_slice(&(len as u32).to_be_bytes());
        // A cached connection whose peer closed it (the member died or
        // restarted) reads as EOF: write on a fresh one instead of losing
        // the frame into a dead socket.
        if conns.get(&to).is_some_and(|c| {
            let _ = c.set_nonblocking(true);
            let closed =
                !matches!(c.peek(&mut [0u8; 1]), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock);
            let _ = c.set_nonblocking(false);
            closed
        }) {
            conns.remove(&to);
        }
        let conn = match conns.entry(to) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                if backoff.get(&to).is_some_and(|t| std::time::Instant::now() < *t) {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
                        backoff.remove(&to);
                        e.insert(s)
                    }
                    Err(_) => {
                        backoff.insert(to, std::time::Instant::now() + Duration::from_millis(20));
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
            }
        };
        if conn.write_all(&frame).is_err() {
            conns.remove(&to);
            stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.frames_out.fetch_add(1, Ordering::Relaxed);
        }
    }
}
