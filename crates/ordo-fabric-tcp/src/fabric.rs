//! [`TcpFabric`]: the member's handle; posts writes from the caller's thread
//! and reports events. See the crate docs for the guarantees.

use crate::frame::{self, FrameHeader, HEADER_LEN, Hello, PROTOCOL_VERSION};
use crate::io::{IoConfig, IoThread, WAKER};
use crate::link::{Link, LinkState, Pending, Shared, Status};
use crate::ring::read_untorn;
use mio::net::TcpListener;
use mio::{Poll, Waker};
use ordo_fabric::{
    Doorbell, Fabric, FabricEvent, FailureCause, MemberId, PartialPost, PostError, ReconnectError, Region,
    Write, WriteTag, check_range,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Room reserved in each outbound ring beyond `send_buffer_bytes`, so the
/// receive path can always queue a (coalesced) ACK even when posts filled
/// the ring.
const ACK_RESERVE: usize = 2 * HEADER_LEN;

/// Configuration of one member's tcp fabric endpoint.
///
/// Every member of a group must agree on `cluster` and `region_len`
/// (checked by the handshake) and on the id → address map in `peers`.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    /// This member's id.
    pub member: MemberId,
    /// Address to listen on for peers with lower ids (port 0: pick one; see
    /// [`TcpFabric::bind`]).
    pub listen: SocketAddr,
    /// Every other member and its listen address.
    pub peers: Vec<(MemberId, SocketAddr)>,
    /// Length of the region in bytes (the same at every member).
    pub region_len: usize,
    /// Largest write accepted in one frame, sent or received (default 1 MiB).
    pub max_frame_bytes: usize,
    /// Bound on bytes queued per peer and not yet taken by its socket;
    /// beyond it posts return [`PostError::Backpressure`] (default 8 MiB).
    pub send_buffer_bytes: usize,
    /// Bound on signaled writes per peer whose completion is not yet
    /// reported; beyond it signaled posts return `Backpressure` (default 65536).
    pub max_signaled_in_flight: usize,
    /// A signaled write not acknowledged within this time fails with
    /// [`FailureCause::TimedOut`] and takes the link down (default 1 s).
    pub write_timeout: Duration,
    /// How long [`TcpFabric::connect`] waits for every link, and how long a
    /// handshake may take (default 10 s).
    pub connect_timeout: Duration,
    /// Delay between dial attempts to a peer whose link is down (default 100 ms).
    pub reconnect_interval: Duration,
    /// Name of the group; members of another cluster are refused (default "ordo").
    pub cluster: String,
    /// The cluster secret every member holds. Each connection's handshake
    /// proves it both ways before any frame is applied; a peer without it
    /// writes nothing. `None` (the default) runs the same handshake with a
    /// key everyone knows: no authentication, for closed test networks only
    /// (logged as a warning at start-up).
    pub secret: Option<ordo_auth::Secret>,
    /// Longest a handshake may take once its connection is up (default
    /// 1 s); a connection that has not proved itself by then is closed.
    pub handshake_timeout: Duration,
    /// Most handshakes in progress from one source address (default 8;
    /// 64 in all); beyond it the oldest from that source is closed.
    pub max_handshakes_per_source: usize,
    /// TLS for every connection (mutual, certificates from one CA; see
    /// [`TlsSettings`](crate::TlsSettings)); `None` (default): plain TCP.
    pub tls: Option<crate::tls::TlsSettings>,
    /// A peer not linked within `connect_timeout` is suspected (a
    /// [`FabricEvent::Suspected`](ordo_fabric::FabricEvent::Suspected) on the
    /// first poll, posts to it refused) instead of failing `connect` — for a
    /// new view whose member may have died after the view was decided.
    /// Default false.
    pub suspect_missing_peers: bool,
}

/// The label of the tcp fabric's handshake key (see SECURITY.md).
pub const HANDSHAKE_KEY_LABEL: &str = "ordo tcp fabric handshake v2";
/// What keys the handshake when no secret is configured: public, so no
/// authentication at all.
const UNAUTHENTICATED_SECRET: &[u8] = b"ordo tcp fabric without a secret";

impl TcpOptions {
    /// Options with the defaults above and no peers yet.
    pub fn new(member: MemberId, listen: SocketAddr, region_len: usize) -> TcpOptions {
        TcpOptions {
            member,
            listen,
            peers: Vec::new(),
            region_len,
            max_frame_bytes: 1 << 20,
            send_buffer_bytes: 8 << 20,
            max_signaled_in_flight: 65_536,
            write_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            reconnect_interval: Duration::from_millis(100),
            cluster: "ordo".to_string(),
            secret: None,
            handshake_timeout: Duration::from_secs(1),
            max_handshakes_per_source: 8,
            tls: None,
            suspect_missing_peers: false,
        }
    }

    /// These options with `secret` as the cluster secret.
    pub fn with_secret(mut self, secret: ordo_auth::Secret) -> TcpOptions {
        self.secret = Some(secret);
        self
    }

    fn handshake_key(&self) -> ordo_auth::Key {
        match &self.secret {
            Some(secret) => secret.derive(HANDSHAKE_KEY_LABEL),
            None => ordo_auth::Secret::from_bytes(UNAUTHENTICATED_SECRET)
                .expect("long enough")
                .derive(HANDSHAKE_KEY_LABEL),
        }
    }

    /// These options with `peers` as the peer list.
    pub fn with_peers(mut self, peers: Vec<(MemberId, SocketAddr)>) -> TcpOptions {
        self.peers = peers;
        self
    }

    /// Checks the options for operator mistakes.
    pub fn validate(&self) -> Result<(), TcpError> {
        let bad = |why: String| Err(TcpError::Config(why));
        if self.max_frame_bytes == 0 || self.max_frame_bytes > u32::MAX as usize {
            return bad(format!("max_frame_bytes {} must be in 1..=u32::MAX", self.max_frame_bytes));
        }
        if self.send_buffer_bytes < HEADER_LEN + self.max_frame_bytes {
            return bad(format!(
                "send_buffer_bytes {} cannot hold one maximal frame of {} bytes",
                self.send_buffer_bytes,
                HEADER_LEN + self.max_frame_bytes
            ));
        }
        if self.max_handshakes_per_source == 0 || self.handshake_timeout.is_zero() {
            return bad("max_handshakes_per_source and handshake_timeout must be positive".to_string());
        }
        if self.max_signaled_in_flight == 0 {
            return bad("max_signaled_in_flight must be at least 1".to_string());
        }
        let mut ids: Vec<MemberId> = self.peers.iter().map(|p| p.0).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return bad(format!("peer ids {ids:?} are not unique"));
        }
        if ids.contains(&self.member) {
            return bad(format!("member {} lists itself as a peer", self.member));
        }
        Ok(())
    }
}

/// Errors of setting up a tcp fabric endpoint (operator mistakes and
/// unreachable peers at start-up; faults after start-up are events).
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    /// The options are inconsistent.
    #[error("invalid tcp fabric options: {0}")]
    Config(String),
    /// The listen address could not be bound (in use, not local, ...).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address that could not be bound.
        addr: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Creating the poller, waker or I/O thread failed.
    #[error("tcp fabric set-up failed: {0}")]
    Io(#[from] std::io::Error),
    /// Some links were not up within `connect_timeout`.
    #[error("member {member}: no link to peers {missing:?} within {timeout:?}")]
    ConnectTimeout {
        /// This endpoint's member id.
        member: MemberId,
        /// Peers with no link up at the deadline.
        missing: Vec<MemberId>,
        /// How long was waited (the `connect_timeout` option).
        timeout: Duration,
    },
}

/// A bound but not yet connected endpoint: first step of the two-step
/// start-up that lets every member learn the others' ephemeral ports.
pub struct TcpBinding {
    options: TcpOptions,
    listener: TcpListener,
    local_addr: SocketAddr,
    poll: Poll,
    waker: Waker,
}

impl TcpBinding {
    /// The address peers must dial (the real port when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Starts the I/O thread with `peers` as the peer list (replacing the
    /// options' list) and blocks until a link to every peer is up, or fails
    /// with [`TcpError::ConnectTimeout`] after `connect_timeout`.
    pub fn connect(self, peers: Vec<(MemberId, SocketAddr)>) -> Result<TcpFabric, TcpError> {
        let TcpBinding { mut options, listener, local_addr, poll, waker } = self;
        options.peers = peers;
        options.validate()?;
        options.peers.sort_unstable_by_key(|p| p.0);
        let ring_capacity = options.send_buffer_bytes + ACK_RESERVE;
        let links = options.peers.iter().map(|&(id, addr)| Link::new(id, addr, ring_capacity)).collect();
        let shared = Arc::new(Shared {
            member: options.member,
            links,
            shutdown: AtomicBool::new(false),
            waker,
            installed: (Mutex::new(()), Condvar::new()),
        });
        let region = Region::new_heap(options.region_len);
        let doorbell = Doorbell::new_local();
        let incarnation = new_incarnation();
        let hello = Hello {
            version: PROTOCOL_VERSION,
            member: options.member,
            region_len: options.region_len as u64,
            cluster_hash: frame::cluster_hash(&options.cluster),
            incarnation,
            nonce: [0; frame::NONCE_LEN], // each handshake gets a fresh one
        };
        if options.secret.is_none() {
            tracing::warn!(
                member = options.member,
                "tcp fabric without a cluster secret: anyone who reaches {local_addr} can write to this member's region"
            );
        }
        let config = IoConfig {
            hello,
            region: region.clone(),
            doorbell: doorbell.clone(),
            max_frame_bytes: options.max_frame_bytes,
            connect_timeout: options.connect_timeout,
            reconnect_interval: options.reconnect_interval,
            key: options.handshake_key(),
            handshake_timeout: options.handshake_timeout,
            max_handshakes_per_source: options.max_handshakes_per_source,
            tls: options.tls.clone(),
        };
        let io = IoThread::new(poll, listener, shared.clone(), config);
        let handle = std::thread::Builder::new()
            .name(format!("ordo-tcp-{}", options.member))
            .spawn(move || io.run())?;
        let fabric = TcpFabric {
            peer_ids: options.peers.iter().map(|p| p.0).collect(),
            options,
            region,
            doorbell,
            shared,
            io_thread: Some(handle),
            local_addr,
            incarnation,
        };
        fabric.wait_until_all_up()?;
        Ok(fabric)
    }
}

/// A member's endpoint on the tcp fabric.
///
/// Guarantees (beyond the [`Fabric`] contract): posts never block on the
/// network and never allocate (the frame is copied into a preallocated
/// per-peer ring, then written to the socket if it takes it); memory per peer
/// is bounded by `send_buffer_bytes` plus one receive buffer of
/// `max_frame_bytes`; dropping it stops its I/O thread and closes every
/// connection, which peers see as [`FailureCause::ConnectionLost`].
pub struct TcpFabric {
    options: TcpOptions,
    peer_ids: Vec<MemberId>,
    region: Region,
    doorbell: Doorbell,
    shared: Arc<Shared>,
    io_thread: Option<JoinHandle<()>>,
    local_addr: SocketAddr,
    incarnation: u64,
}

impl std::fmt::Debug for TcpFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpFabric")
            .field("member", &self.options.member)
            .field("local_addr", &self.local_addr)
            .field("peers", &self.peer_ids)
            .field("incarnation", &self.incarnation)
            .finish()
    }
}

impl TcpFabric {
    /// Binds `options.listen` and allocates nothing else yet; call
    /// [`TcpBinding::connect`] once the peers' addresses are known.
    pub fn bind(options: TcpOptions) -> Result<TcpBinding, TcpError> {
        options.validate()?;
        let listener = TcpListener::bind(options.listen)
            .map_err(|source| TcpError::Bind { addr: options.listen, source })?;
        let local_addr = listener.local_addr()?;
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        Ok(TcpBinding { options, listener, local_addr, poll, waker })
    }

    /// Binds, starts the I/O thread and waits until every link in
    /// `options.peers` is up (see [`TcpBinding::connect`]).
    pub fn connect(options: TcpOptions) -> Result<TcpFabric, TcpError> {
        let peers = options.peers.clone();
        TcpFabric::bind(options)?.connect(peers)
    }

    /// The address this member listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This endpoint's incarnation, sent in its HELLO (new for every endpoint).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The options this endpoint runs with.
    pub fn options(&self) -> &TcpOptions {
        &self.options
    }

    fn index_of(&self, peer: MemberId) -> Option<usize> {
        self.peer_ids.binary_search(&peer).ok()
    }

    fn wait_until_all_up(&self) -> Result<(), TcpError> {
        let timeout = self.options.connect_timeout;
        let deadline = Instant::now() + timeout;
        let (lock, condvar) = &self.shared.installed;
        let mut guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let mut missing = Vec::new();
            for link in &self.shared.links {
                let mut state = link.lock();
                if state.status == Status::Suspected && state.conn.is_some() {
                    // The first connection failed and a new one stands by
                    // before anyone could use the link: take it, and drop
                    // the suspicion no one could have acted on.
                    debug_assert!(state.pending.is_empty());
                    state.status = Status::Up;
                    state.events.clear();
                }
                if state.status != Status::Up {
                    missing.push(link.id);
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline && self.options.suspect_missing_peers {
                for link in &self.shared.links {
                    let mut state = link.lock();
                    if missing.contains(&link.id) {
                        tracing::warn!(
                            member = self.options.member,
                            peer = link.id,
                            "peer missing at start; suspected"
                        );
                        state.status = Status::Suspected;
                        state.events.push_back(ordo_fabric::FabricEvent::Suspected {
                            peer: link.id,
                            cause: ordo_fabric::FailureCause::TimedOut,
                        });
                    }
                }
                return Ok(());
            }
            if now >= deadline {
                return Err(TcpError::ConnectTimeout { member: self.options.member, missing, timeout });
            }
            // Bounded wait: a notification can race with the check above.
            let wait = (deadline - now).min(Duration::from_millis(50));
            guard = condvar.wait_timeout(guard, wait).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl TcpFabric {
    /// Queues one frame per range (the last one signaled with `signal`),
    /// then flushes once. Stops at the first range that cannot be queued.
    fn post_batch(
        &mut self,
        peer: MemberId,
        ranges: &[(usize, usize)],
        signal: Option<WriteTag>,
    ) -> Result<(), PartialPost> {
        let partial = |posted, error| Err(PartialPost { posted, error });
        let Some(index) = self.index_of(peer) else { return partial(0, PostError::UnknownPeer(peer)) };
        let mut state = self.shared.links[index].lock();
        if state.status != Status::Up {
            return partial(0, PostError::PeerSuspected(peer));
        }
        debug_assert!(state.conn.is_some(), "an up link has a connection");
        let mut result = Ok(());
        for (posted, &(offset, len)) in ranges.iter().enumerate() {
            let signal = if posted + 1 == ranges.len() { signal } else { None };
            if let Err(error) = self.queue_frame(&mut state, peer, offset, len, signal) {
                result = partial(posted, error);
                break;
            }
        }
        let posted = result.as_ref().map_or_else(|p: &PartialPost| p.posted, |_| ranges.len());
        if posted > 0
            && let Err(e) = state.flush()
        {
            tracing::info!(member = self.options.member, peer, error = %e, "send to peer failed");
            state.fail(peer, FailureCause::ConnectionLost, Instant::now());
            drop(state);
            self.shared.wake_io();
        }
        result
    }

    /// Appends one write's frame to the link's send buffer.
    fn queue_frame(
        &self,
        state: &mut LinkState,
        peer: MemberId,
        offset: usize,
        len: usize,
        signal: Option<WriteTag>,
    ) -> Result<(), PostError> {
        check_range(offset, len, self.region.len())?;
        if len > self.options.max_frame_bytes {
            return Err(PostError::TooLarge { len, max: self.options.max_frame_bytes });
        }
        if signal.is_some() && state.pending.len() + state.events.len() >= self.options.max_signaled_in_flight
        {
            return Err(PostError::Backpressure(peer));
        }
        let frame_len = HEADER_LEN + len;
        let fits = |queued: usize| queued + frame_len <= self.options.send_buffer_bytes;
        if !fits(state.out.len()) {
            // The I/O thread flushes on writability; try once here too.
            let flushed = state.flush();
            if flushed.is_err() || !fits(state.out.len()) {
                // A broken connection is left for the I/O thread to report.
                return Err(PostError::Backpressure(peer));
            }
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let header = FrameHeader::write(offset as u64, len as u32, seq, signal.is_some());
        state.out.push(&header.encode());
        let region = &self.region;
        state.out.push_with(len, |segment, at| read_untorn(region, offset + at, segment));
        if let Some(tag) = signal {
            let deadline = Instant::now() + self.options.write_timeout;
            state.pending.push_back(Pending { seq, tag, deadline });
        }
        Ok(())
    }
}

impl Fabric for TcpFabric {
    fn member(&self) -> MemberId {
        self.options.member
    }

    fn peers(&self) -> &[MemberId] {
        &self.peer_ids
    }

    fn region(&self) -> &Region {
        &self.region
    }

    fn post_write(&mut self, write: Write) -> Result<(), PostError> {
        self.post_batch(write.peer, std::slice::from_ref(&(write.offset, write.len)), write.signal)
            .map_err(|p| p.error)
    }

    /// Every frame of the batch into the send buffer under one lock, then
    /// one send (a syscall per batch, not per write).
    fn post_writes(&mut self, peer: MemberId, ranges: &[(usize, usize)]) -> Result<(), PartialPost> {
        self.post_batch(peer, ranges, None)
    }

    /// The I/O thread applies a frame with `copy_untorn`, ascending;
    /// x86-64 keeps stores in order.
    fn address_ordered(&self) -> bool {
        cfg!(target_arch = "x86_64")
    }

    fn poll_events(&mut self, events: &mut Vec<FabricEvent>) {
        let mut now = None;
        let mut failed_any = false;
        for link in &self.shared.links {
            let mut state = link.lock();
            state.complete_acked(link.id);
            if state.status == Status::Up
                && let Some(first) = state.pending.front()
            {
                let now = *now.get_or_insert_with(Instant::now);
                if first.deadline <= now {
                    tracing::warn!(member = self.options.member, peer = link.id, "signaled write timed out");
                    state.fail(link.id, FailureCause::TimedOut, now);
                    failed_any = true;
                }
            }
            events.extend(state.events.drain(..));
        }
        if failed_any {
            self.shared.wake_io();
        }
    }

    fn doorbell(&self) -> Option<&Doorbell> {
        Some(&self.doorbell)
    }

    fn is_suspected(&self, peer: MemberId) -> bool {
        self.index_of(peer).is_some_and(|i| self.shared.links[i].lock().status == Status::Suspected)
    }

    fn reconnect(&mut self, peer: MemberId) -> Result<u64, ReconnectError> {
        let index = self.index_of(peer).ok_or(ReconnectError::UnknownPeer(peer))?;
        let mut state = self.shared.links[index].lock();
        match state.status {
            Status::Up => Ok(state.incarnation),
            Status::Suspected if state.conn.is_some() => {
                state.status = Status::Up;
                let incarnation = state.incarnation;
                state.events.push_back(FabricEvent::Reconnected { peer, incarnation });
                tracing::info!(
                    member = self.options.member,
                    peer,
                    incarnation,
                    "tcp fabric link reconnected"
                );
                Ok(incarnation)
            }
            Status::Suspected | Status::Connecting => {
                state.dial_requested = true;
                drop(state);
                self.shared.wake_io();
                Err(ReconnectError::Unreachable(
                    peer,
                    "no connection from a live incarnation yet".to_string(),
                ))
            }
        }
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake_io();
        if let Some(handle) = self.io_thread.take()
            && handle.join().is_err()
        {
            tracing::error!(member = self.options.member, "tcp fabric I/O thread panicked");
        }
    }
}

/// A fresh incarnation number: wall-clock nanoseconds, the process id and a
/// per-process counter mixed, so two endpoints of one member (even in one
/// process) never share one.
fn new_incarnation() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mixed = nanos ^ (u64::from(std::process::id()) << 40) ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed.max(1)
}
