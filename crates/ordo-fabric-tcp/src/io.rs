//! The I/O thread: accepts and dials connections, runs handshakes, applies
//! incoming frames to the region, records ACKs and flushes outbound rings
//! when sockets become writable.
//!
//! # Invariants
//! - One thread, one `mio::Poll`; it owns the listener, every handshake in
//!   progress and the read side of every connection (each peer's receive
//!   buffer, allocated once at start-up with room for exactly one maximal
//!   frame).
//! - Frames of a connection are applied strictly in arrival order, each only
//!   after its header was validated and its whole payload has arrived; a
//!   Release fence follows each applied frame, and the doorbell rings after
//!   each batch. A bad frame closes the connection before anything of it is
//!   applied.
//! - An ACK is queued only after the WRITEs it covers are applied, so a
//!   `Completed` event means the data is visible at the peer.
//! - Tokens are never reused, so an event for a socket that was closed
//!   meanwhile finds no owner and is ignored.

use crate::frame::{
    self, DataFrame, FrameError, FrameHeader, HEADER_LEN, HELLO_FRAME_LEN, Hello, PROOF_FRAME_LEN,
};
use crate::link::{Shared, Status};
use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use ordo_auth::Key;
use ordo_auth::handshake::{self as auth, Role as AuthRole};
use ordo_fabric::{Doorbell, FailureCause, MemberId, Region, copy_untorn};
use std::collections::HashMap;
use std::io::{self, Read as _, Write as _};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

pub(crate) const LISTENER: Token = Token(0);
pub(crate) const WAKER: Token = Token(1);
const FIRST_TOKEN: usize = 2;
/// At most this many accepted connections may be in their handshake at
/// once; a new one beyond it replaces one of them (`make_room_for`).
const MAX_HANDSHAKES: usize = 64;
/// Sources whose first refusal was logged are remembered up to this many.
const MAX_LOGGED_SOURCES: usize = 1024;
/// The handshake's bytes from the peer: its HELLO, then its PROOF.
const PEER_HANDSHAKE_LEN: usize = HELLO_FRAME_LEN + PROOF_FRAME_LEN;
/// Reads from one connection per turn before the others get theirs: a peer
/// that sends without pause cannot starve the rest (the connection is
/// revisited after the next, non-blocking, poll).
const READS_PER_TURN: usize = 16;

/// What the I/O thread needs to know besides the shared state.
pub(crate) struct IoConfig {
    pub(crate) hello: Hello,
    pub(crate) region: Region,
    pub(crate) doorbell: Doorbell,
    pub(crate) max_frame_bytes: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_interval: Duration,
    /// The handshake key (derived from the cluster secret).
    pub(crate) key: Key,
    /// Longest a handshake may take once the connection is up.
    pub(crate) handshake_timeout: Duration,
    /// Most handshakes in progress from one source address.
    pub(crate) max_handshakes_per_source: usize,
    /// TLS for every connection, if configured.
    pub(crate) tls: Option<crate::tls::TlsSettings>,
}

/// Which side of a handshake we are.
#[derive(Clone, Copy, Debug)]
enum Role {
    /// We dialed peer index `usize` and wait for the connect, then its HELLO.
    Dial(usize),
    /// We accepted; we wait for the dialer's HELLO, then answer.
    Accept,
}

struct Handshake {
    stream: TcpStream,
    role: Role,
    remote: Option<SocketAddr>,
    /// Our HELLO, with this connection's fresh nonce.
    ours: [u8; HELLO_FRAME_LEN],
    /// The peer's HELLO and then its PROOF as they arrive (exactly these
    /// two frames are read, no more).
    buf: [u8; PEER_HANDSHAKE_LEN],
    filled: usize,
    /// The peer's HELLO, once in and acceptable.
    theirs: Option<Hello>,
    hello_sent: bool,
    deadline: Instant,
    /// The TLS session, when links use TLS: every handshake byte goes
    /// through it, and it becomes the link's.
    tls: Option<Box<rustls::Connection>>,
}

impl Handshake {
    /// Reads handshake bytes (through TLS when on).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.tls.as_mut() {
            Some(tls) => crate::tls::read(tls, &self.stream, buf),
            None => (&self.stream).read(buf),
        }
    }

    /// Sends a whole handshake message (through TLS when on).
    fn send(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        match self.tls.as_mut() {
            Some(tls) => {
                // Small: rustls buffers it whole (also before its own
                // handshake is done) and sends it when it can.
                tls.writer().write_all(bytes).map_err(HandshakeError::Io)?;
                crate::tls::push(tls, &self.stream).map_err(HandshakeError::Io)
            }
            None => send_all(&self.stream, bytes),
        }
    }
}

/// The read side of an established connection.
struct Conn {
    token: Token,
    generation: u64,
    stream: Arc<TcpStream>,
    /// Unprocessed bytes are `rbuf[start..filled]`.
    start: usize,
    filled: usize,
    /// Sequence number of the last WRITE applied.
    applied_seq: u64,
}

struct PeerIo {
    id: MemberId,
    addr: SocketAddr,
    /// Whether we dial this peer (its id is higher than ours).
    we_dial: bool,
    dial_at: Option<Instant>,
    dialing: Option<Token>,
    conn: Option<Conn>,
    /// The connection used up its read budget and may have more to read.
    read_again: bool,
    /// Receive buffer: one header plus one maximal payload.
    rbuf: Box<[u8]>,
}

pub(crate) struct IoThread {
    poll: Poll,
    listener: TcpListener,
    shared: Arc<Shared>,
    config: IoConfig,
    peers: Vec<PeerIo>,
    handshakes: HashMap<Token, Handshake>,
    conn_tokens: HashMap<Token, usize>,
    next_token: usize,
    next_generation: u64,
    /// xorshift state for choosing which handshake to close under a flood.
    rng: u64,
    /// Sources whose first refused handshake was logged.
    logged_sources: std::collections::HashSet<IpAddr>,
}

/// Why a connection ended.
enum Closed {
    Lost(io::Error),
    Eof,
    BadFrame(FrameError),
}

impl IoThread {
    pub(crate) fn new(poll: Poll, listener: TcpListener, shared: Arc<Shared>, config: IoConfig) -> IoThread {
        let member = shared.member;
        let now = Instant::now();
        let peers = shared
            .links
            .iter()
            .map(|link| PeerIo {
                id: link.id,
                addr: link.addr,
                we_dial: member < link.id,
                dial_at: (member < link.id).then_some(now),
                dialing: None,
                conn: None,
                read_again: false,
                rbuf: vec![0u8; HEADER_LEN + config.max_frame_bytes].into_boxed_slice(),
            })
            .collect();
        IoThread {
            poll,
            listener,
            shared,
            config,
            peers,
            handshakes: HashMap::new(),
            conn_tokens: HashMap::new(),
            next_token: FIRST_TOKEN,
            next_generation: 1,
            rng: u64::from_le_bytes(auth::nonce()[..8].try_into().expect("8 bytes")) | 1,
            logged_sources: std::collections::HashSet::new(),
        }
    }

    /// The thread's body: runs until the fabric is dropped.
    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let member = self.shared.member;
        if let Err(e) = self.poll.registry().register(&mut self.listener, LISTENER, Interest::READABLE) {
            tracing::error!(member, error = %e, "tcp fabric cannot poll its listener; no peer can connect");
        }
        while !self.shared.shutdown.load(Ordering::Acquire) {
            self.start_due_dials();
            let timeout = if self.peers.iter().any(|p| p.read_again) {
                Some(Duration::ZERO)
            } else {
                self.next_timer().map(|at| at.saturating_duration_since(Instant::now()))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(member, error = %e, "tcp fabric poll failed; I/O thread stops");
                break;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.on_acceptable(),
                    WAKER => self.on_wake(),
                    token => self.on_socket_event(token, event),
                }
            }
            for index in 0..self.peers.len() {
                if std::mem::take(&mut self.peers[index].read_again) {
                    self.on_conn_ready(index);
                }
            }
            self.expire_handshakes();
        }
        self.close_all();
    }

    fn token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    /// The earliest dial or handshake deadline, if any.
    fn next_timer(&self) -> Option<Instant> {
        let dials =
            self.peers.iter().filter(|p| p.dialing.is_none() && p.conn.is_none()).filter_map(|p| p.dial_at);
        let handshakes = self.handshakes.values().map(|h| h.deadline);
        dials.chain(handshakes).min()
    }

    fn start_due_dials(&mut self) {
        let now = Instant::now();
        for index in 0..self.peers.len() {
            let peer = &self.peers[index];
            let due = peer.dial_at.is_some_and(|at| at <= now);
            if !peer.we_dial || !due || peer.dialing.is_some() || peer.conn.is_some() {
                continue;
            }
            let addr = peer.addr;
            self.peers[index].dial_at = None;
            match TcpStream::connect(addr) {
                Ok(mut stream) => {
                    let token = self.token();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if let Err(e) = self.poll.registry().register(&mut stream, token, interest) {
                        tracing::warn!(member = self.shared.member, peer = self.peers[index].id, error = %e, "cannot poll a dialed stream");
                        self.schedule_dial(index, now);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let deadline = now + self.config.connect_timeout;
                    match self.new_handshake(stream, Role::Dial(index), addr, deadline) {
                        Ok(hs) => {
                            self.peers[index].dialing = Some(token);
                            self.handshakes.insert(token, hs);
                        }
                        Err(e) => {
                            tracing::warn!(member = self.shared.member, error = %e, "cannot start a TLS session");
                            self.schedule_dial(index, now);
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(member = self.shared.member, peer = self.peers[index].id, error = %e, "dial failed");
                    self.schedule_dial(index, now);
                }
            }
        }
    }

    fn schedule_dial(&mut self, index: usize, now: Instant) {
        let peer = &mut self.peers[index];
        if peer.we_dial {
            peer.dial_at = Some(now + self.config.reconnect_interval);
        }
    }

    fn on_acceptable(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, remote)) => {
                    self.make_room_for(remote);
                    let token = self.token();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if let Err(e) = self.poll.registry().register(&mut stream, token, interest) {
                        tracing::warn!(member = self.shared.member, %remote, error = %e, "cannot poll an accepted stream");
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let deadline = Instant::now() + self.config.handshake_timeout;
                    match self.new_handshake(stream, Role::Accept, remote, deadline) {
                        Ok(hs) => {
                            self.handshakes.insert(token, hs);
                        }
                        Err(e) => {
                            tracing::warn!(member = self.shared.member, error = %e, "cannot start a TLS session")
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // E.g. EMFILE or a connection reset before accept: keep serving.
                    tracing::warn!(member = self.shared.member, error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    fn new_handshake(
        &mut self,
        stream: TcpStream,
        role: Role,
        remote: SocketAddr,
        deadline: Instant,
    ) -> io::Result<Handshake> {
        let hello = Hello { nonce: auth::nonce(), ..self.config.hello };
        let tls = match (&self.config.tls, role) {
            (None, _) => None,
            (Some(t), Role::Dial(_)) => Some(Box::new(t.dial(remote)?)),
            (Some(t), Role::Accept) => Some(Box::new(t.accept()?)),
        };
        Ok(Handshake {
            stream,
            role,
            remote: Some(remote),
            ours: hello.encode(),
            buf: [0; PEER_HANDSHAKE_LEN],
            filled: 0,
            theirs: None,
            hello_sent: false,
            deadline,
            tls,
        })
    }

    /// Before accepting a handshake from `remote`: one source holds at most
    /// `max_handshakes_per_source` and all together at most
    /// [`MAX_HANDSHAKES`]; beyond either, one accepted handshake (of that
    /// source, or of all) is closed: one from an address that is no
    /// member's if there is one, preferably one that has not sent its
    /// HELLO yet, chosen at random among those. A flood therefore cannot
    /// keep a member out: from other addresses it never displaces a
    /// member's handshake, and from a member's own address (one host) it
    /// must hit the member's handshake by chance within the few round trips
    /// that handshake takes, while the member redials every
    /// `reconnect_interval`.
    fn make_room_for(&mut self, remote: SocketAddr) {
        let accepted = |hs: &Handshake| matches!(hs.role, Role::Accept);
        let from_source = |hs: &Handshake| hs.remote.is_some_and(|r| r.ip() == remote.ip());
        let per_source = self.handshakes.values().filter(|h| accepted(h) && from_source(h)).count();
        let victim = if per_source >= self.config.max_handshakes_per_source {
            self.pick_victim(|h| from_source(h))
        } else if self.handshakes.values().filter(|h| accepted(h)).count() >= MAX_HANDSHAKES {
            self.pick_victim(|_| true)
        } else {
            None
        };
        if let Some(token) = victim
            && let Some(hs) = self.handshakes.remove(&token)
        {
            self.note_refusal(&hs, "too many handshakes in progress from this source or in all; closing one");
            self.end_handshake(hs);
        }
    }

    /// An accepted handshake passing `filter` to close (see `make_room_for`).
    fn pick_victim(&mut self, filter: impl Fn(&Handshake) -> bool) -> Option<Token> {
        let member_ips: Vec<IpAddr> = self.peers.iter().map(|p| p.addr.ip()).collect();
        let stranger = |h: &Handshake| h.remote.is_none_or(|r| !member_ips.contains(&r.ip()));
        let silent = |h: &Handshake| h.theirs.is_none();
        let candidates: Vec<(Token, bool, bool)> = self
            .handshakes
            .iter()
            .filter(|(_, h)| matches!(h.role, Role::Accept) && filter(h))
            .map(|(t, h)| (*t, stranger(h), silent(h)))
            .collect();
        // The best class present: strangers before members' addresses,
        // silent before those that sent a HELLO.
        let rank = |&(_, stranger, silent): &(Token, bool, bool)| (!stranger, !silent);
        let best = candidates.iter().map(rank).min()?;
        let class: Vec<Token> = candidates.iter().filter(|c| rank(c) == best).map(|c| c.0).collect();
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        Some(class[(self.rng % class.len() as u64) as usize])
    }

    /// Logs a refused connection: the first from each source address at
    /// `error` (with the address), later ones at `debug`, so a flood cannot
    /// flood the log.
    fn note_refusal(&mut self, hs: &Handshake, reason: &str) {
        let member = self.shared.member;
        let remote = hs.remote;
        let first = remote.is_some_and(|r| {
            self.logged_sources.len() < MAX_LOGGED_SOURCES && self.logged_sources.insert(r.ip())
        });
        if first {
            tracing::error!(member, ?remote, claimed = ?claimed_member(hs), reason, "refusing tcp fabric connection (further refusals from this address are logged at debug level)");
        } else {
            tracing::debug!(member, ?remote, claimed = ?claimed_member(hs), reason, "refusing tcp fabric connection");
        }
    }

    /// The waker rang: a dial was requested, or the caller failed a link
    /// (closing its connection) and our read side must go too.
    fn on_wake(&mut self) {
        let now = Instant::now();
        for index in 0..self.peers.len() {
            let (requested, stale) = {
                let mut state = self.shared.links[index].lock();
                let requested = std::mem::take(&mut state.dial_requested);
                let stale = self.peers[index].conn.as_ref().is_some_and(|c| !state.is_current(c.generation));
                (requested, stale)
            };
            if stale {
                self.drop_conn_io(index, now);
            }
            let peer = &mut self.peers[index];
            if requested && peer.we_dial && peer.dialing.is_none() && peer.conn.is_none() {
                peer.dial_at = Some(now);
            }
        }
    }

    fn on_socket_event(&mut self, token: Token, event: &Event) {
        if self.handshakes.contains_key(&token) {
            self.drive_handshake(token, event);
        } else if let Some(&index) = self.conn_tokens.get(&token) {
            self.on_conn_ready(index);
        }
        // Otherwise the socket was closed already: a stale event.
    }

    fn drive_handshake(&mut self, token: Token, event: &Event) {
        let member = self.shared.member;
        let Some(mut hs) = self.handshakes.remove(&token) else { return };
        match self.advance_handshake(&mut hs, event) {
            Ok(None) => {
                self.handshakes.insert(token, hs);
            }
            Ok(Some(hello)) => self.promote(token, hs, hello),
            Err(reason) => {
                match &reason {
                    HandshakeError::Refused(e) => self.note_refusal(&hs, &e.to_string()),
                    HandshakeError::Io(e) => {
                        tracing::debug!(member, remote = ?hs.remote, error = %e, "handshake failed")
                    }
                }
                self.end_handshake(hs);
            }
        }
    }

    /// Progresses a handshake (see the crate docs): `Ok(Some(hello))` once
    /// the peer's HELLO and PROOF are in and valid, and our own are sent.
    fn advance_handshake(
        &mut self,
        hs: &mut Handshake,
        event: &Event,
    ) -> Result<Option<Hello>, HandshakeError> {
        if let Role::Dial(_) = hs.role
            && !hs.hello_sent
        {
            if let Some(e) = hs.stream.take_error().map_err(HandshakeError::Io)? {
                return Err(HandshakeError::Io(e));
            }
            match hs.stream.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotConnected && !event.is_error() => return Ok(None),
                Err(e) => return Err(HandshakeError::Io(e)),
            }
            let ours = hs.ours;
            hs.send(&ours)?;
            hs.hello_sent = true;
            // From now on the connection is up: the handshake's own bound.
            hs.deadline = hs.deadline.min(Instant::now() + self.config.handshake_timeout);
        }
        if let Some(tls) = hs.tls.as_mut() {
            // Ciphertext the socket did not take before (writable again).
            crate::tls::push(tls, &hs.stream).map_err(HandshakeError::Io)?;
        }
        // Read exactly the peer's HELLO and PROOF: what follows them stays
        // in the socket (or the TLS session) for the connection's receive path.
        loop {
            let want = if hs.theirs.is_none() { HELLO_FRAME_LEN } else { PEER_HANDSHAKE_LEN };
            if hs.filled == want && hs.theirs.is_some() {
                break;
            }
            let mut chunk = [0u8; PEER_HANDSHAKE_LEN];
            let room = want - hs.filled;
            let n = match hs.read(&mut chunk[..room]) {
                Ok(0) => return Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(HandshakeError::Io(e)),
            };
            hs.buf[hs.filled..hs.filled + n].copy_from_slice(&chunk[..n]);
            hs.filled += n;
            if hs.filled >= HEADER_LEN && hs.filled - n < HEADER_LEN {
                // Refuse a wrong first frame before waiting for more of it.
                let header = FrameHeader::decode(hs.buf[..HEADER_LEN].try_into().expect("header"));
                if header.kind != frame::FrameKind::Hello as u8 {
                    return Err(HandshakeError::Refused(FrameError::ExpectedHello { kind: header.kind }));
                }
            }
            if hs.filled == HELLO_FRAME_LEN && hs.theirs.is_none() {
                hs.theirs = Some(self.check_hello(hs)?);
                if let Role::Accept = hs.role {
                    // Our HELLO and our proof over both hellos, in one write.
                    let tag = auth::proof(
                        &self.config.key,
                        AuthRole::Acceptor,
                        &hs.buf[..HELLO_FRAME_LEN],
                        &hs.ours,
                    );
                    let mut answer = [0u8; HELLO_FRAME_LEN + PROOF_FRAME_LEN];
                    answer[..HELLO_FRAME_LEN].copy_from_slice(&hs.ours);
                    answer[HELLO_FRAME_LEN..].copy_from_slice(&frame::encode_proof(&tag));
                    hs.send(&answer)?;
                    hs.hello_sent = true;
                }
            }
        }
        let hello = hs.theirs.expect("read above");
        let proof = frame::decode_proof(hs.buf[HELLO_FRAME_LEN..].try_into().expect("proof bytes"))
            .map_err(HandshakeError::Refused)?;
        let (dialer_hello, acceptor_hello, their_role) = match hs.role {
            Role::Dial(_) => (&hs.ours[..], &hs.buf[..HELLO_FRAME_LEN], AuthRole::Acceptor),
            Role::Accept => (&hs.buf[..HELLO_FRAME_LEN], &hs.ours[..], AuthRole::Dialer),
        };
        if !auth::verify(&self.config.key, their_role, dialer_hello, acceptor_hello, proof) {
            return Err(HandshakeError::Refused(FrameError::BadProof));
        }
        if let Role::Dial(_) = hs.role {
            let tag = auth::proof(&self.config.key, AuthRole::Dialer, dialer_hello, acceptor_hello);
            hs.send(&frame::encode_proof(&tag))?;
        }
        Ok(Some(hello))
    }

    /// The peer's HELLO (in `hs.buf`) is well formed, of our cluster, and
    /// from a member this side of the connection accepts.
    fn check_hello(&self, hs: &Handshake) -> Result<Hello, HandshakeError> {
        let hello = Hello::decode(hs.buf[..HELLO_FRAME_LEN].try_into().expect("hello bytes"))
            .map_err(HandshakeError::Refused)?;
        hello.check_matches(&self.config.hello).map_err(HandshakeError::Refused)?;
        let me = self.shared.member;
        let acceptable = match hs.role {
            Role::Dial(index) => hello.member == self.peers[index].id,
            Role::Accept => hello.member < me && self.peers.iter().any(|p| p.id == hello.member),
        };
        if !acceptable {
            return Err(HandshakeError::Refused(FrameError::UnexpectedMember(hello.member)));
        }
        Ok(hello)
    }

    fn end_handshake(&mut self, hs: Handshake) {
        let _ = hs.stream.shutdown(Shutdown::Both);
        if let Role::Dial(index) = hs.role {
            self.peers[index].dialing = None;
            self.schedule_dial(index, Instant::now());
        }
        // Dropping the stream closes it, which also removes it from the poll.
    }

    fn expire_handshakes(&mut self) {
        let now = Instant::now();
        let expired: Vec<Token> =
            self.handshakes.iter().filter(|(_, hs)| hs.deadline <= now).map(|(t, _)| *t).collect();
        for token in expired {
            if let Some(hs) = self.handshakes.remove(&token) {
                tracing::warn!(member = self.shared.member, remote = ?hs.remote, "handshake timed out");
                self.end_handshake(hs);
            }
        }
    }

    /// The handshake is done: the stream becomes peer `hello.member`'s connection.
    fn promote(&mut self, token: Token, mut hs: Handshake, hello: Hello) {
        let now = Instant::now();
        let index = self.peers.iter().position(|p| p.id == hello.member).expect("checked in the handshake");
        if let Role::Dial(i) = hs.role {
            debug_assert_eq!(i, index);
            self.peers[index].dialing = None;
        }
        // Our read side of an older connection goes (the link drops its write side).
        self.drop_conn_io(index, now);
        let generation = self.next_generation;
        self.next_generation += 1;
        let tls = hs.tls.take();
        let stream = Arc::new(hs.stream);
        let status = self.shared.links[index].lock().install(
            hello.member,
            stream.clone(),
            tls,
            generation,
            hello.incarnation,
        );
        tracing::info!(
            member = self.shared.member,
            peer = hello.member,
            incarnation = hello.incarnation,
            standby = (status == Status::Suspected),
            "tcp fabric link connected"
        );
        self.peers[index].conn =
            Some(Conn { token, generation, stream, start: 0, filled: 0, applied_seq: 0 });
        self.conn_tokens.insert(token, index);
        {
            let (lock, condvar) = &self.shared.installed;
            let _guard = lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            condvar.notify_all();
        }
        // Edge-triggered: bytes that came with or after the HELLO raise no
        // new event, so look at the socket now.
        self.on_conn_ready(index);
    }

    /// A connection's socket is ready: read and apply, then flush.
    fn on_conn_ready(&mut self, index: usize) {
        let now = Instant::now();
        match self.receive(index) {
            Ok(budget_used) => self.peers[index].read_again = budget_used,
            Err(closed) => {
                let peer = self.peers[index].id;
                let cause = match closed {
                    Closed::BadFrame(reason) => {
                        tracing::error!(member = self.shared.member, peer, %reason, "bad frame from peer; closing its connection");
                        FailureCause::BadFrame
                    }
                    Closed::Eof => {
                        tracing::info!(member = self.shared.member, peer, "peer closed its connection");
                        FailureCause::ConnectionLost
                    }
                    Closed::Lost(e) => {
                        tracing::info!(member = self.shared.member, peer, error = %e, "connection to peer lost");
                        FailureCause::ConnectionLost
                    }
                };
                self.fail_conn(index, cause, now);
                return;
            }
        }
        let Some(generation) = self.peers[index].conn.as_ref().map(|c| c.generation) else { return };
        let flushed = {
            let mut state = self.shared.links[index].lock();
            if state.is_current(generation) { state.flush() } else { Ok(()) }
        };
        if let Err(e) = flushed {
            tracing::info!(member = self.shared.member, peer = self.peers[index].id, error = %e, "send to peer failed");
            self.fail_conn(index, FailureCause::ConnectionLost, now);
        }
    }

    /// Fails the link (if this connection is still its current one) and
    /// drops our read side.
    fn fail_conn(&mut self, index: usize, cause: FailureCause, now: Instant) {
        if let Some(conn) = &self.peers[index].conn {
            let mut state = self.shared.links[index].lock();
            if state.is_current(conn.generation) {
                state.fail(self.peers[index].id, cause, now);
            }
        }
        self.drop_conn_io(index, now);
        // Suspicion and failed writes are events a parked poller must see.
        self.config.doorbell.ring();
    }

    fn drop_conn_io(&mut self, index: usize, now: Instant) {
        if let Some(conn) = self.peers[index].conn.take() {
            self.conn_tokens.remove(&conn.token);
            let _ = conn.stream.shutdown(Shutdown::Both);
            self.schedule_dial(index, now);
        }
    }

    /// Reads until the socket would block (`Ok(false)`) or the turn's read
    /// budget is used (`Ok(true)`), applying every complete frame and
    /// acknowledging signaled ones after each read.
    fn receive(&mut self, index: usize) -> Result<bool, Closed> {
        let peer = &mut self.peers[index];
        let Some(conn) = peer.conn.as_mut() else { return Ok(false) };
        let region = &self.config.region;
        let link = &self.shared.links[index];
        for _ in 0..READS_PER_TURN {
            if conn.filled == peer.rbuf.len() {
                // Full, so the frame at `start` is incomplete and `start > 0`
                // (the buffer holds one maximal frame): move it to the front.
                debug_assert!(conn.start > 0);
                peer.rbuf.copy_within(conn.start..conn.filled, 0);
                conn.filled -= conn.start;
                conn.start = 0;
            }
            let read = if self.config.tls.is_some() {
                let mut state = link.lock();
                if !state.is_current(conn.generation) {
                    return Ok(false); // replaced or failed meanwhile
                }
                let tls = state.tls.as_mut().expect("a TLS link has a session");
                crate::tls::read(tls, &conn.stream, &mut peer.rbuf[conn.filled..])
            } else {
                (&*conn.stream).read(&mut peer.rbuf[conn.filled..])
            };
            let n = match read {
                Ok(0) => return Err(Closed::Eof),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Closed::Lost(e)),
            };
            conn.filled += n;
            let mut applied = false;
            let mut ack_needed = false;
            let mut result = Ok(());
            while conn.filled - conn.start >= HEADER_LEN {
                let at = conn.start;
                let header = FrameHeader::decode(peer.rbuf[at..at + HEADER_LEN].try_into().expect("header"));
                let frame = match frame::check_data_header(
                    &header,
                    self.config.max_frame_bytes,
                    region.len(),
                    conn.applied_seq + 1,
                ) {
                    Ok(frame) => frame,
                    Err(e) => {
                        result = Err(Closed::BadFrame(e));
                        break;
                    }
                };
                match frame {
                    DataFrame::Write { offset, len, seq, signaled } => {
                        if conn.filled - at < HEADER_LEN + len {
                            if at + HEADER_LEN + len > peer.rbuf.len() {
                                peer.rbuf.copy_within(at..conn.filled, 0);
                                conn.filled -= at;
                                conn.start = 0;
                            }
                            break;
                        }
                        // SAFETY: `offset + len <= region.len()` was checked by
                        // check_data_header; the source is our own buffer.
                        unsafe {
                            copy_untorn(
                                region.as_ptr().add(offset),
                                peer.rbuf.as_ptr().add(at + HEADER_LEN),
                                len,
                            )
                        };
                        // Every store of this frame happens-before any store
                        // of a later frame, e.g. the guard that publishes it.
                        fence(Ordering::Release);
                        conn.applied_seq = seq;
                        conn.start = at + HEADER_LEN + len;
                        applied = true;
                        ack_needed |= signaled;
                    }
                    DataFrame::Ack { seq } => {
                        let mut state = link.lock();
                        if state.is_current(conn.generation) {
                            let posted = state.next_seq - 1;
                            if seq < state.acked || seq > posted {
                                result = Err(Closed::BadFrame(FrameError::BadAck {
                                    got: seq,
                                    acked: state.acked,
                                    posted,
                                }));
                                break;
                            }
                            state.acked = seq;
                            // A completion is news for a parked poller too.
                            applied = true;
                        }
                        conn.start = at + HEADER_LEN;
                    }
                }
            }
            if conn.start == conn.filled {
                conn.start = 0;
                conn.filled = 0;
            }
            if applied {
                self.config.doorbell.ring();
            }
            if ack_needed {
                let mut state = link.lock();
                if state.is_current(conn.generation) {
                    state.queue_ack(conn.applied_seq);
                    state.flush().map_err(Closed::Lost)?;
                }
            }
            result?;
        }
        Ok(true)
    }

    fn close_all(&mut self) {
        for link in &self.shared.links {
            link.lock().drop_conn();
        }
        for peer in &mut self.peers {
            if let Some(conn) = peer.conn.take() {
                let _ = conn.stream.shutdown(Shutdown::Both);
            }
        }
        for (_, hs) in self.handshakes.drain() {
            let _ = hs.stream.shutdown(Shutdown::Both);
        }
    }
}

enum HandshakeError {
    /// The peer is not one we talk to (wrong cluster, region, version, id).
    Refused(FrameError),
    /// The connection failed.
    Io(io::Error),
}

fn send_all(stream: &TcpStream, bytes: &[u8]) -> Result<(), HandshakeError> {
    // A fresh connection's send buffer is (nearly) empty, so a handshake
    // frame goes in one write; anything less means the connection is not
    // usable.
    match (&*stream).write(bytes) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(HandshakeError::Io(io::Error::other(format!("short handshake write of {n} bytes")))),
        Err(e) => Err(HandshakeError::Io(e)),
    }
}

/// The member id a (possibly partial or invalid) HELLO claims, for logs.
fn claimed_member(hs: &Handshake) -> Option<MemberId> {
    (hs.filled >= HEADER_LEN + 12)
        .then(|| u32::from_le_bytes(hs.buf[HEADER_LEN + 8..HEADER_LEN + 12].try_into().expect("4 bytes")))
}
