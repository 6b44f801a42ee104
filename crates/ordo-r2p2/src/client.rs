//! The R2P2 client: blocking [`Client::call`] and open-loop
//! [`Client::send`] / [`Client::poll_responses`] / [`Client::try_recv`].
//!
//! # Invariants
//! - A request id is assigned once per [`Client::send`]; every retry and
//!   every redirect of that request reuses it (and the client id), so the
//!   servers' replication hook can recognise duplicates.
//! - Within one client id, request ids only rise (by one per request), as
//!   the replicas' sessions require. After `u32::MAX`, or when the replicas
//!   answer a request of the current session with
//!   [`ErrorCode::SessionExpired`] (that request then fails with it), the
//!   client takes a new client id — a new session, beginning at 1 — and
//!   never sends an id of an old session again except as a retry or
//!   redirect of a request still outstanding; answers for those (sealed to
//!   the old id) are still taken.
//! - Each request completes exactly once: with the first RESPONSE or ERROR
//!   for its id, or with [`CallError::Timeout`] after `retries + 1` attempts,
//!   or [`CallError::RedirectLoop`] after `max_redirects` redirects. Later
//!   datagrams for it are ignored (`stale_responses`).
//! - Semantics are at-least-once for FIXED/LB (a retry may run the handler
//!   again) and whatever the replication hook provides for REPLICATED.
//! - At most `max_in_flight` requests are outstanding; `send` refuses more.
//! - With `report_answered` (the default), every REPLICATED_ROUTE datagram
//!   carries the answered span: the oldest of the client's replicated
//!   requests still outstanding (or the request itself when none is) — every
//!   lower one has completed, with an answer or given up, and none is sent
//!   again — so the replicas forget those answers.
//! - Routing: FIXED_ROUTE → `servers[fixed_server]` (retries go to the same
//!   server); LB_ROUTE → round robin over `servers`, a retry goes to the next
//!   one; REPLICATED_ROUTE → the believed leader, learnt from REDIRECTs and
//!   from the leader hint on any response; a timeout moves the belief to the
//!   next server. `servers` must list the replicas in replica-index order
//!   (the order of the servers' `ServerConfig::peers`) so hints mean the
//!   same thing on both sides.

use crate::header::{self, ErrorCode, Header, MAX_DATAGRAM, MessageType, Policy};
use crate::reassembly::{self, Message, Reassembler, ReassemblyConfig, TooLarge};
use crate::server::{send_datagram, set_socket_buffers};
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token};
use ordo_agent::{IdleAction, IdleStrategy, Idler};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use thiserror::Error;

/// A client-assigned request number (header `request_id`).
pub type RequestId = u32;

/// Client configuration.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Servers, in replica-index order for REPLICATED_ROUTE.
    pub servers: Vec<SocketAddr>,
    /// Local address to bind.
    pub bind: SocketAddr,
    /// The client id; `None` draws a random one. A fixed id must not be
    /// taken by a new client while the replicas remember the old one's
    /// session unless that client starts where the old one stopped
    /// (`first_request_id`: the old one's [`Client::next_request_id`]):
    /// request ids the session has seen are ignored, or answered with the
    /// old answers.
    pub client_id: Option<u64>,
    /// The id of the first request (0 reads as 1). Ids rise by one per
    /// request; after `u32::MAX` the client takes a new client id (a new
    /// session at the replicas) and starts again at 1.
    pub first_request_id: RequestId,
    /// Time to wait for an answer before retrying.
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub retries: u32,
    /// Redirects followed per request.
    pub max_redirects: u32,
    /// Server index for FIXED_ROUTE.
    pub fixed_server: usize,
    /// Payload bytes per datagram.
    pub mtu_payload: usize,
    /// Bounds for incoming responses.
    pub reassembly: ReassemblyConfig,
    /// Most outstanding requests.
    pub max_in_flight: usize,
    /// How [`Client::call`] / [`Client::wait`] idle (parking = blocking
    /// poll); default [`SOCKET_IDLE`](crate::SOCKET_IDLE).
    pub idle: IdleStrategy,
    /// SO_RCVBUF / SO_SNDBUF to ask for; `None` keeps the OS default.
    pub socket_buffer_bytes: Option<usize>,
    /// The client secret: requests are sealed with its MAC, and answers are
    /// accepted only if sealed with it (servers holding the same client
    /// secret seal every answer; [`crate::auth`]).
    pub secret: Option<ordo_auth::Secret>,
    /// The admin secret: [`Client::admin`] commands are sealed with it
    /// (servers refuse admin commands without it).
    pub admin_secret: Option<ordo_auth::Secret>,
    /// Tell the replicas, in each REPLICATED_ROUTE request, below which id
    /// every request of this client has completed (the header's answered
    /// span), so they keep only the answers of requests still outstanding
    /// rather than each client's last `session_window`. Servers older than
    /// the span refuse such requests: turn it off to talk to them.
    pub report_answered: bool,
}

impl ClientConfig {
    /// Defaults for these servers: 100 ms timeout, 3 retries, 1400-byte
    /// datagrams, 4096 in flight.
    pub fn new(servers: Vec<SocketAddr>) -> Self {
        ClientConfig {
            servers,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            client_id: None,
            first_request_id: 1,
            timeout: Duration::from_millis(100),
            retries: 3,
            max_redirects: 8,
            fixed_server: 0,
            mtu_payload: 1400,
            reassembly: ReassemblyConfig::default(),
            max_in_flight: 4096,
            idle: crate::server::SOCKET_IDLE,
            socket_buffer_bytes: Some(4 << 20),
            secret: None,
            admin_secret: None,
            report_answered: true,
        }
    }
}

/// Why a request failed.
#[derive(Debug, Error)]
pub enum CallError {
    /// No answer after this many attempts.
    #[error("no response after {attempts} attempts")]
    Timeout {
        /// Attempts made.
        attempts: u32,
    },
    /// The server answered with ERROR.
    #[error("request refused ({code:?}): {reason}")]
    Refused {
        /// The server's code.
        code: ErrorCode,
        /// The server's explanation.
        reason: String,
    },
    /// Redirected more than `max_redirects` times.
    #[error("redirected {0} times without reaching the leader")]
    RedirectLoop(u32),
    /// The request does not fit in `max_packets` datagrams.
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
    /// `max_in_flight` requests are outstanding.
    #[error("too many requests in flight")]
    TooManyInFlight,
    /// The configuration lists no servers (or `fixed_server` is out of range).
    #[error("no server to send to")]
    NoServers,
    /// A socket error.
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
}

/// Client counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests sent (first attempts).
    pub requests: u64,
    /// Retransmissions after a timeout.
    pub retries: u64,
    /// REDIRECTs followed.
    pub redirects: u64,
    /// Requests completed with a RESPONSE.
    pub responses: u64,
    /// Answers for requests no longer outstanding (duplicates, late answers).
    pub stale_responses: u64,
    /// Datagrams rejected by header validation.
    pub bad_datagrams: u64,
    /// Times the client took a new client id: its request ids wrapped, or
    /// the replicas said its session expired.
    pub new_sessions: u64,
    /// Answers dropped because they were not sealed with the client secret,
    /// came from no listed server, or were replayed.
    pub unauthenticated_answers: u64,
}

struct Pending {
    /// The client id it was first sent under (its session).
    client_id: u64,
    message_type: MessageType,
    policy: Policy,
    payload: Vec<u8>,
    target: usize,
    attempts: u32,
    redirects: u32,
    deadline: Instant,
}

/// A UDP R2P2 client (not thread-safe; one per thread).
pub struct Client {
    config: ClientConfig,
    /// The session new requests go out in.
    client_id: u64,
    /// Earlier sessions with requests that may still be in flight (pruned
    /// at each new session to those with a request pending).
    earlier_client_ids: Vec<u64>,
    socket: UdpSocket,
    poll: Poll,
    events: Events,
    reassembler: Reassembler,
    pending: HashMap<RequestId, Pending>,
    /// The current session's REPLICATED_ROUTE requests in the order sent
    /// (with `report_answered`): the first still pending is the oldest
    /// outstanding.
    /// Completed ones leave from the front when met; at most
    /// `4 × max_in_flight` are kept.
    replicated_sent: VecDeque<RequestId>,
    completed: VecDeque<(RequestId, Result<Vec<u8>, CallError>)>,
    next_request_id: RequestId,
    leader: usize,
    next_lb: usize,
    earliest_deadline: Option<Instant>,
    scratch: Vec<u8>,
    recv_buf: Vec<u8>,
    started: Instant,
    stats: ClientStats,
    request_sealer: Option<ordo_auth::Sealer>,
    admin_sealer: Option<ordo_auth::Sealer>,
    /// With a client secret: one replay window per server.
    answer_opener: Option<ordo_auth::Opener>,
}

const SOCKET: Token = Token(0);

impl Client {
    /// Binds a socket for talking to `config.servers`.
    pub fn new(config: ClientConfig) -> io::Result<Client> {
        if config.mtu_payload == 0 || config.max_in_flight == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "mtu_payload and max_in_flight must be positive",
            ));
        }
        let mut socket = UdpSocket::bind(config.bind)?;
        if let Some(bytes) = config.socket_buffer_bytes {
            set_socket_buffers(&socket, bytes)?;
        }
        let poll = Poll::new()?;
        poll.registry().register(&mut socket, SOCKET, Interest::READABLE)?;
        let client_id = config.client_id.unwrap_or_else(|| RandomState::new().hash_one(std::process::id()));
        Ok(Client {
            reassembler: Reassembler::new(config.reassembly),
            client_id,
            earlier_client_ids: Vec::new(),
            socket,
            poll,
            events: Events::with_capacity(4),
            pending: HashMap::new(),
            replicated_sent: VecDeque::new(),
            completed: VecDeque::new(),
            next_request_id: config.first_request_id.max(1),
            leader: 0,
            next_lb: 0,
            earliest_deadline: None,
            scratch: Vec::with_capacity(MAX_DATAGRAM),
            request_sealer: config
                .secret
                .as_ref()
                .map(|s| ordo_auth::Sealer::new(s.derive(crate::auth::CLIENT_LABEL))),
            admin_sealer: config
                .admin_secret
                .as_ref()
                .map(|s| ordo_auth::Sealer::new(s.derive(crate::auth::ADMIN_LABEL))),
            answer_opener: config.secret.as_ref().map(|s| {
                ordo_auth::Opener::for_peers(s.derive(crate::auth::ANSWER_LABEL), config.servers.len(), 0)
            }),
            recv_buf: vec![0u8; MAX_DATAGRAM + 1],
            started: Instant::now(),
            stats: ClientStats::default(),
            config,
        })
    }

    /// This client's id: the session its next request goes out in.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// The id the next request gets (in [`Client::client_id`]'s session).
    /// A process that reuses a fixed client id starts its next client
    /// here (`ClientConfig::first_request_id`).
    pub fn next_request_id(&self) -> RequestId {
        self.next_request_id
    }

    /// The local socket address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The server index believed to lead (REPLICATED_ROUTE target).
    pub fn leader(&self) -> usize {
        self.leader
    }

    /// The servers (redirects may have added addresses).
    pub fn servers(&self) -> &[SocketAddr] {
        &self.config.servers
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Requests sent and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Sends a request and returns at once; its result comes out of
    /// [`Client::try_recv`] after [`Client::poll_responses`] / [`Client::wait`].
    pub fn send(&mut self, policy: Policy, payload: &[u8]) -> Result<RequestId, CallError> {
        self.send_typed(MessageType::Request, policy, payload)
    }

    /// Sends a control command to the replication hook (e.g. `status`,
    /// `add-learner 4`, `promote 4`, `remove 1` for Raft) and waits for its
    /// answer; routed to the leader like a REPLICATED_ROUTE request.
    pub fn admin(&mut self, command: &[u8]) -> Result<Vec<u8>, CallError> {
        let id = self.send_typed(MessageType::Admin, Policy::ReplicatedRoute, command)?;
        self.wait_for(id)
    }

    fn send_typed(
        &mut self,
        message_type: MessageType,
        policy: Policy,
        payload: &[u8],
    ) -> Result<RequestId, CallError> {
        if self.pending.len() >= self.config.max_in_flight {
            return Err(CallError::TooManyInFlight);
        }
        let n = self.config.servers.len();
        if n == 0 || (policy == Policy::FixedRoute && self.config.fixed_server >= n) {
            return Err(CallError::NoServers);
        }
        let packets = reassembly::packet_count_for(payload.len(), self.mtu_payload(message_type));
        if packets > self.config.reassembly.max_packets as usize {
            return Err(TooLarge {
                len: payload.len(),
                packets,
                max: self.config.reassembly.max_packets as usize,
            }
            .into());
        }
        let target = match policy {
            Policy::FixedRoute => self.config.fixed_server,
            Policy::LbRoute => {
                let t = self.next_lb % n;
                self.next_lb = (t + 1) % n;
                t
            }
            Policy::ReplicatedRoute => self.leader % n,
        };
        let id = self.next_request_id;
        if self.pending.contains_key(&id) {
            // The previous session's request of this id is still in
            // flight, 2^32 requests later.
            return Err(CallError::TooManyInFlight);
        }
        let client_id = self.client_id;
        self.next_request_id = id.wrapping_add(1);
        let deadline = Instant::now() + self.config.timeout;
        let pending = Pending {
            client_id,
            message_type,
            policy,
            payload: payload.to_vec(),
            target,
            attempts: 1,
            redirects: 0,
            deadline,
        };
        let sent = self.transmit(id, &pending);
        if sent.is_ok() {
            if policy == Policy::ReplicatedRoute
                && message_type == MessageType::Request
                && self.config.report_answered
            {
                if self.replicated_sent.len() >= 4 * self.config.max_in_flight {
                    let pending = &self.pending;
                    self.replicated_sent.retain(|id| pending.contains_key(id));
                }
                self.replicated_sent.push_back(id);
            }
            self.pending.insert(id, pending);
            self.earliest_deadline = Some(self.earliest_deadline.map_or(deadline, |d| d.min(deadline)));
            self.stats.requests += 1;
        }
        if id == RequestId::MAX {
            // The session's last id (consumed even if unsent): a new one,
            // once this request is pending under the old.
            self.renew_session();
        }
        sent?;
        Ok(id)
    }

    /// Reads every datagram available now and handles timeouts (retrying or
    /// failing requests); returns how many requests completed.
    pub fn poll_responses(&mut self) -> usize {
        let before = self.completed.len();
        let now_ns = self.started.elapsed().as_nanos() as u64;
        loop {
            let (len, from) = match self.socket.recv_from(&mut self.recv_buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => continue, // ICMP errors from earlier sends; retries cover them.
            };
            let datagram = &self.recv_buf[..len];
            let message = match header::decode(datagram, self.config.reassembly.max_packets) {
                Ok((header, payload)) => {
                    let ours = self.is_ours(header.client_id);
                    if let Some(opener) = self.answer_opener.as_mut() {
                        // Only answers sealed by a listed server for one of
                        // this client's sessions (checked first: another
                        // client's answer, replayed here, must not move the
                        // replay window).
                        let server = self.config.servers.iter().position(|s| *s == from);
                        let sealed = header.flags & crate::header::FLAG_AUTH != 0;
                        let context = crate::auth::destination_context(header.client_id);
                        let verified = ours
                            && sealed
                            && server.is_some_and(|i| {
                                opener.open(i as u64, datagram, crate::auth::unix_now_ns(), &context).is_ok()
                            });
                        if !verified {
                            self.stats.unauthenticated_answers += 1;
                            continue;
                        }
                    }
                    self.reassembler.on_packet(from, &header, payload, now_ns)
                }
                Err(_) => {
                    self.stats.bad_datagrams += 1;
                    None
                }
            };
            if let Some(message) = message {
                self.on_message(message);
            }
        }
        if self.reassembler.partial_count() > 0 {
            self.reassembler.expire(now_ns);
        }
        self.check_timeouts(Instant::now());
        self.completed.len() - before
    }

    /// Takes one completed request, if any.
    pub fn try_recv(&mut self) -> Option<(RequestId, Result<Vec<u8>, CallError>)> {
        self.completed.pop_front()
    }

    /// Polls until at least one result is ready for [`Client::try_recv`] or
    /// `max_wait` passes (spinning, yielding, then parking in a blocking poll
    /// per `idle`). Returns how many results are ready.
    pub fn wait(&mut self, max_wait: Duration) -> usize {
        let until = Instant::now() + max_wait;
        let mut idler = Idler::new(self.config.idle);
        loop {
            self.poll_responses();
            if !self.completed.is_empty() {
                return self.completed.len();
            }
            let now = Instant::now();
            if now >= until {
                return 0;
            }
            match idler.idle(0) {
                Some(IdleAction::Park(timeout)) => {
                    let mut timeout = timeout.min(until - now);
                    if let Some(deadline) = self.earliest_deadline {
                        timeout = timeout.min(deadline.saturating_duration_since(now));
                    }
                    let _ = self.poll.poll(&mut self.events, Some(timeout.max(IdleStrategy::MIN_PARK)));
                }
                Some(action) => action.spin_or_yield(),
                None => {}
            }
        }
    }

    /// Waits at most `max_wait` for an answer datagram (or an error) on the
    /// socket, to the microsecond (`ppoll`, where [`Client::wait`] parks
    /// in epoll, whose timeouts are whole milliseconds), then reads what
    /// came ([`Client::poll_responses`]); returns the results now ready to
    /// take with [`Client::try_recv`]. The wait also ends at the earliest
    /// retransmission or timeout deadline of a request in flight, and early
    /// on a signal. A load generator waits like this for an answer until
    /// its next request is due.
    pub fn wait_precise(&mut self, max_wait: Duration) -> usize {
        use std::os::fd::AsRawFd;
        self.poll_responses();
        let mut wait = max_wait;
        if let Some(deadline) = self.earliest_deadline {
            wait = wait.min(deadline.saturating_duration_since(Instant::now()));
        }
        if self.completed.is_empty() && !wait.is_zero() {
            let mut fd = libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let timeout = libc::timespec {
                tv_sec: wait.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            };
            // SAFETY: one valid pollfd, a valid timespec (tv_sec ≥ 0,
            // tv_nsec < 1e9), no signal mask. It returns at the socket's
            // readiness, the timeout or a signal (EINTR); each ends the
            // wait, and what came is read below.
            unsafe { libc::ppoll(&mut fd, 1, &timeout, std::ptr::null()) };
            self.poll_responses();
        }
        self.completed.len()
    }

    /// Sends a request and blocks until its result (other requests' results
    /// stay queued for [`Client::try_recv`]).
    pub fn call(&mut self, policy: Policy, payload: &[u8]) -> Result<Vec<u8>, CallError> {
        let id = self.send(policy, payload)?;
        self.wait_for(id)
    }

    fn wait_for(&mut self, id: RequestId) -> Result<Vec<u8>, CallError> {
        loop {
            if let Some(position) = self.completed.iter().position(|(done, _)| *done == id) {
                let (_, result) = self.completed.remove(position).expect("position is valid");
                return result;
            }
            // The deadline logic in poll_responses bounds this loop.
            self.wait(self.config.timeout);
        }
    }

    fn on_message(&mut self, message: Message) {
        let id = message.request_id;
        let answers = matches!(
            message.message_type,
            MessageType::Response | MessageType::Error | MessageType::Redirect
        );
        // One lookup: an answer takes its request out of `pending` (a
        // redirect puts it back once resent).
        let mut pending = match self.pending.remove(&id) {
            Some(p) if answers && p.client_id == message.client_id => p,
            other => {
                // Not an answer, or for no request of that session.
                if let Some(p) = other {
                    self.pending.insert(id, p);
                }
                self.stats.stale_responses += 1;
                return;
            }
        };
        match message.message_type {
            MessageType::Response | MessageType::Error => {
                if let Some(leader) = message.leader_hint
                    && (leader as usize) < self.config.servers.len()
                {
                    self.leader = leader as usize;
                }
                let result = if message.message_type == MessageType::Response {
                    self.stats.responses += 1;
                    Ok(message.payload)
                } else {
                    let code =
                        message.payload.first().map_or(ErrorCode::Unknown, |b| ErrorCode::from_byte(*b));
                    let reason =
                        String::from_utf8_lossy(message.payload.get(1..).unwrap_or(&[])).into_owned();
                    if code == ErrorCode::SessionExpired && message.client_id == self.client_id {
                        // The replicas no longer hold this session's
                        // requests (someone sending as this client said
                        // they were answered, or too many were in flight):
                        // the next ones go in a new session.
                        self.renew_session();
                    }
                    Err(CallError::Refused { code, reason })
                };
                self.completed.push_back((id, result));
            }
            MessageType::Redirect => {
                let by_address =
                    std::str::from_utf8(&message.payload).ok().and_then(|s| s.parse::<SocketAddr>().ok());
                let leader = match by_address {
                    Some(addr) => Some(match self.config.servers.iter().position(|s| *s == addr) {
                        Some(i) => i,
                        None => {
                            self.config.servers.push(addr);
                            self.config.servers.len() - 1
                        }
                    }),
                    None => message.leader_hint.map(usize::from).filter(|l| *l < self.config.servers.len()),
                };
                pending.redirects += 1;
                self.stats.redirects += 1;
                if pending.redirects > self.config.max_redirects {
                    self.completed.push_back((id, Err(CallError::RedirectLoop(pending.redirects))));
                    return;
                }
                if let Some(leader) = leader {
                    self.leader = leader;
                    pending.target = leader;
                }
                pending.deadline = Instant::now() + self.config.timeout;
                self.earliest_deadline =
                    Some(self.earliest_deadline.map_or(pending.deadline, |d| d.min(pending.deadline)));
                match self.transmit(id, &pending) {
                    Ok(()) => {
                        self.pending.insert(id, pending);
                    }
                    Err(e) => self.completed.push_back((id, Err(e))),
                }
            }
            MessageType::Request | MessageType::Raft | MessageType::Admin => {
                unreachable!("only answers reach here")
            }
        }
    }

    fn check_timeouts(&mut self, now: Instant) {
        match self.earliest_deadline {
            Some(deadline) if now >= deadline => {}
            _ => return,
        }
        let n = self.config.servers.len();
        let expired: Vec<RequestId> =
            self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(id, _)| *id).collect();
        for id in expired {
            let mut pending = self.pending.remove(&id).expect("listed above");
            if pending.attempts > self.config.retries {
                self.completed.push_back((id, Err(CallError::Timeout { attempts: pending.attempts })));
                continue;
            }
            pending.attempts += 1;
            self.stats.retries += 1;
            match pending.policy {
                Policy::FixedRoute => {}
                Policy::LbRoute => pending.target = (pending.target + 1) % n,
                Policy::ReplicatedRoute => {
                    // No answer from the believed leader: try the next one.
                    if self.leader == pending.target {
                        self.leader = (pending.target + 1) % n;
                    }
                    pending.target = self.leader;
                }
            }
            pending.deadline = now + self.config.timeout;
            match self.transmit(id, &pending) {
                Ok(()) => {
                    self.pending.insert(id, pending);
                }
                Err(e) => self.completed.push_back((id, Err(e))),
            }
        }
        self.earliest_deadline = self.pending.values().map(|p| p.deadline).min();
    }

    /// Payload bytes per datagram for `message_type`: sealed datagrams carry
    /// the authentication trailer within the same datagram size.
    fn mtu_payload(&self, message_type: MessageType) -> usize {
        let sealed = match message_type {
            MessageType::Admin => self.admin_sealer.is_some(),
            MessageType::Request => self.request_sealer.is_some(),
            _ => false,
        };
        if sealed {
            self.config.mtu_payload.saturating_sub(ordo_auth::TRAILER_LEN).max(1)
        } else {
            self.config.mtu_payload
        }
    }

    fn is_ours(&self, client_id: u64) -> bool {
        client_id == self.client_id || self.earlier_client_ids.contains(&client_id)
    }

    /// A new client id (a new session at the replicas, whose requests begin
    /// at 1): the request ids wrapped, or the session expired. The old
    /// session's requests still outstanding keep its id; they say nothing
    /// of answered spans from now on (the span is the new session's).
    fn renew_session(&mut self) {
        let old = self.client_id;
        let mut fresh = old;
        while self.is_ours(fresh) {
            fresh = RandomState::new().hash_one((old, self.stats.requests, std::process::id()));
        }
        let pending = &self.pending;
        self.earlier_client_ids.push(old);
        self.earlier_client_ids.retain(|id| pending.values().any(|p| p.client_id == *id));
        self.client_id = fresh;
        self.next_request_id = 1;
        self.replicated_sent.clear();
        self.stats.new_sessions += 1;
    }

    /// The oldest REPLICATED_ROUTE request still outstanding, counting `id`
    /// (being sent: new, or out of `pending` for a retry or a redirect).
    fn oldest_outstanding(&mut self, id: RequestId) -> RequestId {
        while let Some(&front) = self.replicated_sent.front() {
            if front == id || self.pending.contains_key(&front) {
                return front;
            }
            self.replicated_sent.pop_front();
        }
        id
    }

    fn transmit(&mut self, id: RequestId, pending: &Pending) -> Result<(), CallError> {
        let report = self.config.report_answered
            && pending.message_type == MessageType::Request
            && pending.policy == Policy::ReplicatedRoute
            && pending.client_id == self.client_id;
        let oldest = if report { Some(self.oldest_outstanding(id)) } else { None };
        let mtu = self.mtu_payload(pending.message_type);
        let target = pending.target as u64;
        let to = self.config.servers[pending.target];
        let mut sealer = match pending.message_type {
            MessageType::Admin => self.admin_sealer.as_mut(),
            MessageType::Request => self.request_sealer.as_mut(),
            _ => None,
        };
        let mut header = Header {
            message_type: pending.message_type,
            policy: pending.policy,
            flags: if sealer.is_some() { crate::header::FLAG_AUTH } else { 0 },
            packet_id: 0,
            packet_count: 1,
            client_id: pending.client_id,
            request_id: id,
            leader_hint: 0,
            payload_len: 0,
        };
        if let Some(oldest) = oldest {
            header.set_answered_below(oldest);
        }
        let socket = &self.socket;
        let mut error = None;
        reassembly::split(
            &header,
            &pending.payload,
            mtu,
            self.config.reassembly.max_packets,
            &mut self.scratch,
            |datagram| {
                if let Some(sealer) = sealer.as_mut() {
                    // Bound to the server it goes to (its id: its index in `servers`).
                    sealer.seal(
                        datagram,
                        crate::auth::unix_now_ns(),
                        &crate::auth::destination_context(target),
                    );
                }
                if error.is_none()
                    && let Err(e) = send_datagram(socket, datagram, to)
                {
                    error = Some(e);
                }
            },
        )?;
        match error {
            // A full socket buffer loses the datagram like the network would;
            // the retry timer covers it.
            Some(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}
