//! A member's relay for external clients (spindle §II-A): processes that
//! are not members publish and subscribe over TCP ([`crate::wire`])
//! through it.
//!
//! # Invariants
//! - Nothing is read from a client but its HELLO and PROOF until the
//!   handshake with the cluster's **client secret** verified; a failed
//!   handshake closes the connection having told nothing but the relay's
//!   member id and nonce.
//! - Bounded per source: at most [`MAX_CLIENTS`] clients; a frame over the
//!   largest topic's sample (plus framing) is refused before it is read;
//!   what the relay holds for one subscriber is at most `max_relay_queue`
//!   frames — a client that falls further behind is **dropped** (told
//!   DROPPED, its connection closed), never allowed to stall the member's
//!   thread, which only ever appends to a bounded queue.
//! - A malformed frame, an unknown topic, a type mismatch, a topic this
//!   member does not publish or a sample over the topic's bound gets an
//!   ERROR and changes nothing.
//! - An external subscriber of a stored topic that gives the last position
//!   it has gets the relay's history above it, then live samples, with no
//!   gap or duplicate between the two (taken under the lock deliveries
//!   hold); a logged topic's samples are relayed only after their sync.

use crate::core::DomainCore;
use crate::participant::WriterShared;
use crate::wire::{ErrorCode, Frame, HANDSHAKE_LABEL, SAMPLE_OVERHEAD, read_frame, write_frame};
use ordo_auth::Key;
use ordo_auth::handshake::{self, Role};
use ordo_fabric::MemberId;
use ordo_r2p2::disk::FsDisk;
use ordo_runtime::{OrdoConfig, QosLevel};
use std::collections::VecDeque;
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most clients a relay serves at once.
pub const MAX_CLIENTS: usize = 64;
/// How long a client has to finish the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the relay shares with its connections.
pub(crate) struct RelayShared {
    pub(crate) config: OrdoConfig,
    pub(crate) me: MemberId,
    pub(crate) core: Arc<Mutex<DomainCore<FsDisk>>>,
    pub(crate) writers: Vec<Option<Arc<WriterShared>>>,
    pub(crate) key: Key,
    stop: AtomicBool,
    clients: AtomicUsize,
    streams: Mutex<Vec<(u64, TcpStream)>>,
    next_client: AtomicU64,
    /// Clients dropped for falling behind.
    pub(crate) dropped: AtomicU64,
    /// Connections refused (handshake failed, too many clients).
    pub(crate) refused: AtomicU64,
}

impl RelayShared {
    pub(crate) fn new(
        config: OrdoConfig,
        me: MemberId,
        core: Arc<Mutex<DomainCore<FsDisk>>>,
        writers: Vec<Option<Arc<WriterShared>>>,
        secret: &ordo_auth::Secret,
    ) -> RelayShared {
        RelayShared {
            config,
            me,
            core,
            writers,
            key: secret.derive(HANDSHAKE_LABEL),
            stop: AtomicBool::new(false),
            clients: AtomicUsize::new(0),
            streams: Mutex::new(Vec::new()),
            next_client: AtomicU64::new(1),
            dropped: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// The largest frame a client may send: a PUBLISH of the largest
    /// sample, key included.
    fn max_frame(&self) -> usize {
        self.config.dds.topics.iter().map(|t| t.max_sample).max().unwrap_or(0) + SAMPLE_OVERHEAD + 64
    }
}

/// A running relay.
pub struct Relay {
    shared: Arc<RelayShared>,
    addr: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    pub(crate) fn start(addr: &str, shared: RelayShared) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(shared);
        let sh = shared.clone();
        let thread = std::thread::Builder::new().name("ordo-dds-relay".into()).spawn(move || {
            while !sh.stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((s, _)) => {
                        if sh.clients.load(Ordering::Acquire) >= MAX_CLIENTS {
                            sh.refused.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        sh.clients.fetch_add(1, Ordering::AcqRel);
                        let sh2 = sh.clone();
                        let spawned =
                            std::thread::Builder::new().name("ordo-dds-client".into()).spawn(move || {
                                serve(s, &sh2);
                                sh2.clients.fetch_sub(1, Ordering::AcqRel);
                            });
                        if spawned.is_err() {
                            sh.clients.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "relay: accept failed");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })?;
        Ok(Relay { shared, addr, thread: Some(thread) })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Clients served now.
    pub fn clients(&self) -> usize {
        self.shared.clients.load(Ordering::Acquire)
    }

    /// Clients dropped for falling behind, and connections refused.
    pub fn counters(&self) -> (u64, u64) {
        (self.shared.dropped.load(Ordering::Relaxed), self.shared.refused.load(Ordering::Relaxed))
    }

    pub(crate) fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for (_, s) in lock(&self.shared.streams).iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Frames waiting for one client's socket.
struct Outbox {
    state: Mutex<OutState>,
    cv: Condvar,
    max: usize,
    /// The client's socket: shut down (which never blocks) when the client
    /// is dropped, so a sender blocked on a stalled client wakes up.
    stream: Option<TcpStream>,
    /// Counts the drop.
    shared: Arc<RelayShared>,
}

#[derive(Default)]
struct OutState {
    frames: VecDeque<Vec<u8>>,
    dropped: bool,
    closed: bool,
}

impl Outbox {
    /// Queues a frame; false (and the client dropped) when the client
    /// holds `max` frames already.
    fn push(&self, frame: Vec<u8>) -> bool {
        let mut st = lock(&self.state);
        if st.dropped || st.closed {
            return false;
        }
        if st.frames.len() >= self.max {
            st.dropped = true;
            st.frames.clear();
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            self.cv.notify_all();
            if let Some(s) = &self.stream {
                let _ = s.shutdown(Shutdown::Read);
            }
            return false;
        }
        st.frames.push_back(frame);
        self.cv.notify_all();
        true
    }

    /// Answers count against the same bound: a client that sends requests
    /// and never reads is dropped too.
    fn push_reply(&self, f: &Frame) {
        self.push(f.to_bytes());
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.cv.notify_all();
    }
}

/// Sends what the outbox holds, in batches, until closed; a dropped
/// client is told and disconnected.
fn send_loop(mut s: TcpStream, out: Arc<Outbox>) {
    let mut buf = Vec::new();
    loop {
        let dropped = {
            let mut st = lock(&out.state);
            while st.frames.is_empty() && !st.dropped && !st.closed {
                st = out.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.closed && st.frames.is_empty() {
                return;
            }
            buf.clear();
            for f in st.frames.drain(..) {
                buf.extend_from_slice(&f);
            }
            st.dropped
        };
        if dropped {
            // Told if its socket still takes a frame (best effort).
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            let _ =
                write_frame(&mut s, &Frame::Dropped { reason: "the subscriber fell too far behind".into() });
            let _ = s.shutdown(Shutdown::Both);
            out.close();
            return;
        }
        if s.write_all(&buf).is_err() {
            let _ = s.shutdown(Shutdown::Both);
            out.close();
            return;
        }
    }
}

/// Reads one frame of at most `max` bytes before `deadline` (a deadline
/// for the whole frame, however slowly its bytes come).
fn read_frame_by(s: &mut TcpStream, max: usize, deadline: Instant) -> Option<Frame> {
    use std::io::Read;
    let mut read = |buf: &mut [u8]| -> Option<()> {
        let mut at = 0;
        while at < buf.len() {
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            s.set_read_timeout(Some(left)).ok()?;
            match s.read(&mut buf[at..]) {
                Ok(0) => return None,
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(())
    };
    let mut len = [0u8; 4];
    read(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > max {
        return None;
    }
    let mut body = vec![0; len];
    read(&mut body)?;
    Frame::decode(&body).ok()
}

/// The handshake, acceptor side: true when the client proved the secret
/// within [`HANDSHAKE_TIMEOUT`] of connecting.
fn accept_handshake(s: &mut TcpStream, shared: &RelayShared) -> bool {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let Some(hello @ Frame::Hello { .. }) = read_frame_by(s, 64, deadline) else { return false };
    let h_d = hello.to_bytes();
    let nonce = handshake::nonce();
    let h_a = Frame::Welcome { member: shared.me, nonce, proof: [0; 32] }.to_bytes();
    let proof = handshake::proof(&shared.key, Role::Acceptor, &h_d, &h_a);
    if write_frame(s, &Frame::Welcome { member: shared.me, nonce, proof }).is_err() {
        return false;
    }
    let Some(Frame::Proof { proof }) = read_frame_by(s, 64, deadline) else { return false };
    if !handshake::verify(&shared.key, Role::Dialer, &h_d, &h_a, &proof) {
        return false;
    }
    let _ = s.set_read_timeout(None);
    true
}

/// One client: handshake, then requests until it goes (or the relay stops).
fn serve(mut s: TcpStream, shared: &Arc<RelayShared>) {
    let _ = s.set_nodelay(true);
    if !accept_handshake(&mut s, shared) {
        shared.refused.fetch_add(1, Ordering::Relaxed);
        let _ = s.shutdown(Shutdown::Both);
        return;
    }
    let id = shared.next_client.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = s.try_clone() {
        lock(&shared.streams).push((id, c));
    }
    // A stop that swept the streams before this one was registered.
    if shared.stop.load(Ordering::Acquire) {
        let _ = s.shutdown(Shutdown::Both);
        lock(&shared.streams).retain(|(i, _)| *i != id);
        return;
    }
    let out = Arc::new(Outbox {
        state: Mutex::new(OutState::default()),
        cv: Condvar::new(),
        max: shared.config.dds.max_relay_queue,
        stream: s.try_clone().ok(),
        shared: shared.clone(),
    });
    let sender = match s.try_clone() {
        Ok(w) => {
            // A client that stops reading (its window full for this long)
            // is dropped rather than held.
            let _ = w.set_write_timeout(Some(Duration::from_secs(2)));
            let o = out.clone();
            std::thread::Builder::new().name("ordo-dds-client-tx".into()).spawn(move || send_loop(w, o)).ok()
        }
        Err(_) => None,
    };
    let mut subs: Vec<(usize, u64)> = Vec::new();
    let mut writing: Vec<Option<u64>> = vec![None; shared.config.dds.topics.len()];
    let mut failed = false;
    let max = shared.max_frame();
    while !shared.stop.load(Ordering::Acquire) {
        let frame = match read_frame(&mut s, max) {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => {
                // Framing is lost with a bad length; a bad body is answered.
                out.push_reply(&Frame::Error { req: 0, code: ErrorCode::Malformed, message: e.to_string() });
                if matches!(e, crate::wire::WireError::Length(..)) {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        if let Some(reply) = request(shared, &out, frame, &mut subs, &mut writing, &mut failed) {
            out.push_reply(&reply);
        }
        if lock(&out.state).closed {
            break;
        }
    }
    {
        let mut core = lock(&shared.core);
        for (g, sub) in subs {
            core.topic_mut(g).remove_in_place(sub);
        }
    }
    out.close();
    let _ = s.shutdown(Shutdown::Both);
    if let Some(t) = sender {
        let _ = t.join();
    }
    lock(&shared.streams).retain(|(i, _)| *i != id);
}

fn qos_index(q: QosLevel) -> u8 {
    QosLevel::ALL.iter().position(|x| *x == q).unwrap_or(0) as u8
}

/// Carries out one request; its answer, if it has one.
fn request(
    shared: &Arc<RelayShared>,
    out: &Arc<Outbox>,
    frame: Frame,
    subs: &mut Vec<(usize, u64)>,
    writing: &mut [Option<u64>],
    failed: &mut bool,
) -> Option<Frame> {
    let dds = &shared.config.dds;
    let err = |req, code, message: String| Some(Frame::Error { req, code, message });
    let find = |req: u32, topic: &str, type_name: &str| -> Result<usize, Frame> {
        let Some(g) = dds.topics.iter().position(|t| t.name == topic) else {
            return Err(Frame::Error {
                req,
                code: ErrorCode::UnknownTopic,
                message: format!("no topic {topic:?}"),
            });
        };
        let t = &dds.topics[g];
        if !t.type_name.is_empty() && !type_name.is_empty() && t.type_name != type_name {
            return Err(Frame::Error {
                req,
                code: ErrorCode::TypeMismatch,
                message: format!("topic {topic:?} carries {:?}, not {type_name:?}", t.type_name),
            });
        }
        Ok(g)
    };
    match frame {
        Frame::Subscribe { req, after, topic, type_name } => {
            let g = match find(req, &topic, &type_name) {
                Ok(g) => g,
                Err(f) => return Some(f),
            };
            let t = &dds.topics[g];
            if !t.members(&shared.config.group.members).contains(&shared.me) {
                return err(
                    req,
                    ErrorCode::NotAMember,
                    format!("member {} is not in topic {topic:?}", shared.me),
                );
            }
            if subs.iter().any(|(x, _)| *x == g) {
                return err(req, ErrorCode::Malformed, format!("already subscribed to {topic:?}"));
            }
            // The answer first, then the history above `after`, then live
            // samples: registered under the lock deliveries hold.
            out.push_reply(&Frame::Ok {
                req,
                topic: g as u16,
                qos: qos_index(t.qos),
                max_sample: t.max_sample as u32,
            });
            let mut core = lock(&shared.core);
            let topic_core = core.topic_mut(g);
            let o = out.clone();
            let gi = g as u16;
            let id = topic_core.add_in_place_after(
                Box::new(move |info, data| {
                    let f = Frame::Sample {
                        topic: gi,
                        source: info.source,
                        seq: info.sequence,
                        position: info.position,
                        view: info.view,
                        source_ns: info.source_timestamp_ns,
                        key: info.key.clone(),
                        data: data.to_vec(),
                    };
                    o.push(f.to_bytes());
                }),
                after,
            );
            subs.push((g, id));
            None
        }
        Frame::Writer { req, topic, type_name } => {
            let g = match find(req, &topic, &type_name) {
                Ok(g) => g,
                Err(f) => return Some(f),
            };
            if shared.writers[g].is_none() {
                return err(
                    req,
                    ErrorCode::NotAPublisher,
                    format!("member {} does not publish {topic:?}", shared.me),
                );
            }
            writing[g].get_or_insert(0);
            let t = &dds.topics[g];
            Some(Frame::Ok { req, topic: g as u16, qos: qos_index(t.qos), max_sample: t.max_sample as u32 })
        }
        Frame::Publish { topic, key, data } => {
            let g = topic as usize;
            let (Some(Some(last)), Some(Some(w))) = (writing.get_mut(g), shared.writers.get(g)) else {
                *failed = true;
                return err(0, ErrorCode::NoWriter, format!("PUBLISH on topic {topic} without a WRITER"));
            };
            let max = dds.topics[g].max_sample;
            match w.write_with(max, Duration::from_secs(1), &key, data.len(), |b| b.copy_from_slice(&data)) {
                Ok(seq) => {
                    *last = seq;
                    None
                }
                Err(crate::DdsError::TooLarge { len, key, max }) => {
                    *failed = true;
                    err(0, ErrorCode::TooLarge, format!("sample of {len} bytes (key {key}) over {max}"))
                }
                Err(e) => {
                    *failed = true;
                    err(0, ErrorCode::Unavailable, e.to_string())
                }
            }
        }
        Frame::Flush { req } if std::mem::take(failed) => {
            err(req, ErrorCode::Unavailable, "a sample published since the last FLUSH was refused".into())
        }
        Frame::Flush { req } => {
            // Everything this client published is delivered here (so at
            // every member of the topic): its last sequence delivered.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let done = {
                    let core = lock(&shared.core);
                    writing
                        .iter()
                        .enumerate()
                        .all(|(g, w)| w.is_none_or(|s| core.topic(g).stats().own_seq >= s))
                };
                if done {
                    return Some(Frame::Ok { req, topic: 0, qos: 0, max_sample: 0 });
                }
                if Instant::now() >= deadline {
                    return err(req, ErrorCode::Unavailable, "not delivered within 10 s".into());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        _ => err(0, ErrorCode::Malformed, "not a request (SUBSCRIBE, WRITER, PUBLISH or FLUSH)".into()),
    }
}
