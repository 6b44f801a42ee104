//! An external client (spindle §II-A): a process that is not a member
//! publishes and subscribes through a member's relay ([`crate::relay`]),
//! authenticated with the cluster's client secret, and moves to another
//! relay when its relay dies.
//!
//! # Invariants
//! - One connection at a time; a background thread reads it and, when it
//!   breaks (or the relay drops this client), connects to the next relay of
//!   the list (backing off up to 500 ms), proves the secret again and
//!   re-declares every writer and subscription. A subscription to an
//!   ordered topic resumes after the last position it received, so a
//!   stored topic's history fills the gap (as far as the history reaches)
//!   and nothing is delivered twice.
//! - A sample is *stable* once an [`ExternalWriter::flush`] after it
//!   returned `Ok`: delivered at the relay's member, so at every member of
//!   the topic. A flush returns an error when something written since the
//!   previous successful one may be lost (a refused sample, or a
//!   connection that changed in between).
//! - What a subscription holds is bounded (`max_samples`; beyond it new
//!   samples are counted as rejected), so a slow application never makes
//!   the client grow.
//!
//! # Limits
//! - Positions resume within one lineage of a topic. After a whole-topic
//!   restart (every member of the topic failed, and positions start again
//!   from the first) a subscription's resume point belongs to the old
//!   lineage and hides the new one's first samples: subscribe again.
//! - A relay whose member does not publish a topic refuses the writer's
//!   re-declaration after a move; its samples are then refused, and every
//!   flush says so.

use crate::wire::{ErrorCode, Frame, HANDSHAKE_LABEL, read_frame, write_frame};
use ordo_auth::Key;
use ordo_auth::handshake::{self, Role};
use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What an external client can run into.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No relay answered or proved the secret.
    #[error("no relay reachable: {0}")]
    Unreachable(String),
    /// The relay refused the request.
    #[error("the relay refused: {code:?}: {message}")]
    Refused {
        /// Why.
        code: ErrorCode,
        /// For a person.
        message: String,
    },
    /// The connection broke before the answer (the client reconnects; try
    /// again).
    #[error("disconnected from the relay")]
    Disconnected,
    /// The sample is over the topic's bound.
    #[error("sample of {0} bytes over the topic's {1}")]
    TooLarge(usize, usize),
}

/// A sample received through a relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalSample {
    /// The publishing member.
    pub source: u32,
    /// Writer sequence.
    pub sequence: u64,
    /// Position in the topic's order.
    pub position: u64,
    /// View it was delivered in.
    pub view: u64,
    /// Writer clock (Unix ns).
    pub source_timestamp_ns: u64,
    /// Instance key.
    pub key: Vec<u8>,
    /// Serialized sample.
    pub data: Vec<u8>,
}

struct SubQueue {
    samples: Mutex<(VecDeque<ExternalSample>, u64)>,
    cv: Condvar,
    max: usize,
}

struct Sub {
    topic: String,
    type_name: String,
    ordered: bool,
    /// Last position received (resume point).
    last: u64,
    id: Option<u16>,
    /// The request whose answer carries its topic id.
    req: u32,
    queue: Arc<SubQueue>,
}

struct Declared {
    topic: String,
    type_name: String,
}

struct Inner {
    relays: Vec<String>,
    key: Key,
    conn: Mutex<Option<TcpStream>>,
    current: AtomicU32,
    subs: Mutex<Vec<Sub>>,
    writers: Mutex<Vec<Declared>>,
    pending: Mutex<HashMap<u32, mpsc::Sender<Frame>>>,
    next_req: AtomicU32,
    stop: AtomicBool,
    reconnects: AtomicU64,
    /// Connections made so far (a flush vouches only for writes made on
    /// the connection it travels on).
    generation: AtomicU64,
    relay_member: AtomicU32,
    max_frame: usize,
}

/// An external participant of a domain.
pub struct ExternalParticipant {
    inner: Arc<Inner>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// How long a request waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

fn connect_one(addr: &str, key: &Key) -> Result<(TcpStream, u32), String> {
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let mut s =
        TcpStream::connect_timeout(&sa, Duration::from_secs(2)).map_err(|e| format!("{addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let hello = Frame::Hello { nonce: handshake::nonce() };
    write_frame(&mut s, &hello).map_err(|e| format!("{addr}: {e}"))?;
    let Ok(Ok(Frame::Welcome { member, nonce, proof })) = read_frame(&mut s, 128) else {
        return Err(format!("{addr}: no ordo-dds relay (or it refused this client)"));
    };
    let h_d = hello.to_bytes();
    let h_a = Frame::Welcome { member, nonce, proof: [0; 32] }.to_bytes();
    if !handshake::verify(key, Role::Acceptor, &h_d, &h_a, &proof) {
        return Err(format!("{addr}: the relay does not know the client secret"));
    }
    let p = handshake::proof(key, Role::Dialer, &h_d, &h_a);
    write_frame(&mut s, &Frame::Proof { proof: p }).map_err(|e| format!("{addr}: {e}"))?;
    let _ = s.set_read_timeout(None);
    Ok((s, member))
}

impl Inner {
    /// Connects to the first relay (from the current one on) that proves
    /// the secret; re-declares writers and subscriptions.
    fn connect(self: &Arc<Inner>) -> Result<TcpStream, String> {
        let n = self.relays.len();
        let mut why = Vec::new();
        for k in 0..n {
            let i = (self.current.load(Ordering::Acquire) as usize + k) % n;
            match connect_one(&self.relays[i], &self.key) {
                Ok((s, member)) => {
                    self.current.store(i as u32, Ordering::Release);
                    self.relay_member.store(member, Ordering::Release);
                    let mut w = s.try_clone().map_err(|e| e.to_string())?;
                    for d in lock(&self.writers).iter() {
                        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
                        let f = Frame::Writer { req, topic: d.topic.clone(), type_name: d.type_name.clone() };
                        write_frame(&mut w, &f).map_err(|e| e.to_string())?;
                    }
                    for sub in lock(&self.subs).iter_mut() {
                        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
                        sub.req = req;
                        let after = if sub.ordered { sub.last } else { u64::MAX };
                        let f = Frame::Subscribe {
                            req,
                            after,
                            topic: sub.topic.clone(),
                            type_name: sub.type_name.clone(),
                        };
                        write_frame(&mut w, &f).map_err(|e| e.to_string())?;
                    }
                    *lock(&self.conn) = Some(w);
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    return Ok(s);
                }
                Err(e) => why.push(e),
            }
        }
        Err(why.join("; "))
    }

    fn send(&self, f: &Frame) -> Result<(), ClientError> {
        let mut c = lock(&self.conn);
        let Some(s) = c.as_mut() else { return Err(ClientError::Disconnected) };
        write_frame(s, f).map_err(|_| {
            let _ = s.shutdown(Shutdown::Both);
            ClientError::Disconnected
        })
    }

    fn request(&self, make: impl FnOnce(u32) -> Frame) -> Result<Frame, ClientError> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        lock(&self.pending).insert(req, tx);
        let r = self
            .send(&make(req))
            .and_then(|()| rx.recv_timeout(REQUEST_TIMEOUT).map_err(|_| ClientError::Disconnected));
        lock(&self.pending).remove(&req);
        match r? {
            Frame::Error { code, message, .. } => Err(ClientError::Refused { code, message }),
            f => Ok(f),
        }
    }

    /// Reads the connection; on a break, reconnects (until stopped).
    fn read_loop(self: Arc<Inner>, mut s: TcpStream) {
        let mut backoff = Duration::from_millis(10);
        loop {
            match read_frame(&mut s, self.max_frame) {
                Ok(Ok(f)) => self.dispatch(f),
                Ok(Err(e)) => tracing::warn!(error = %e, "relay sent a frame that does not decode"),
                Err(_) => {
                    *lock(&self.conn) = None;
                    // Requests in flight get no answer from this relay.
                    lock(&self.pending).clear();
                    loop {
                        if self.stop.load(Ordering::Acquire) {
                            return;
                        }
                        // The next relay first.
                        let n = self.relays.len() as u32;
                        let _ = self
                            .current
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| Some((c + 1) % n));
                        match self.connect() {
                            Ok(next) => {
                                // Dropped while connecting: nobody else
                                // will close this connection.
                                if self.stop.load(Ordering::Acquire) {
                                    let _ = next.shutdown(Shutdown::Both);
                                    *lock(&self.conn) = None;
                                    return;
                                }
                                self.reconnects.fetch_add(1, Ordering::Relaxed);
                                s = next;
                                backoff = Duration::from_millis(10);
                                break;
                            }
                            Err(why) => {
                                tracing::debug!(%why, "no relay yet");
                                std::thread::sleep(backoff);
                                backoff = (backoff * 2).min(Duration::from_millis(500));
                            }
                        }
                    }
                }
            }
        }
    }

    fn dispatch(&self, f: Frame) {
        let req = match &f {
            Frame::Ok { req, .. } | Frame::Error { req, .. } => *req,
            _ => 0,
        };
        if req != 0 {
            // A subscription learns its topic id from its answer, before
            // any of its samples (the relay sends the answer first).
            if let Frame::Ok { topic, .. } = &f {
                for sub in lock(&self.subs).iter_mut().filter(|s| s.req == req) {
                    sub.id = Some(*topic);
                }
            }
            if let Frame::Error { code, message, .. } = &f
                && !lock(&self.pending).contains_key(&req)
            {
                tracing::warn!(?code, %message, "the relay refused a re-declaration");
            }
            if let Some(tx) = lock(&self.pending).remove(&req) {
                let _ = tx.send(f);
            }
            return;
        }
        match f {
            Frame::Sample { topic, source, seq, position, view, source_ns, key, data } => {
                let mut subs = lock(&self.subs);
                for sub in subs.iter_mut().filter(|s| s.id == Some(topic)) {
                    if sub.ordered {
                        if position <= sub.last {
                            continue;
                        }
                        sub.last = position;
                    }
                    let mut q = lock(&sub.queue.samples);
                    if q.0.len() >= sub.queue.max {
                        q.1 += 1;
                        continue;
                    }
                    q.0.push_back(ExternalSample {
                        source,
                        sequence: seq,
                        position,
                        view,
                        source_timestamp_ns: source_ns,
                        key: key.clone(),
                        data: data.clone(),
                    });
                    sub.queue.cv.notify_all();
                }
            }
            Frame::Error { code, message, .. } => {
                tracing::warn!(?code, %message, "the relay reported an error");
            }
            Frame::Dropped { reason } => {
                tracing::warn!(%reason, "the relay dropped this client; reconnecting");
                if let Some(s) = lock(&self.conn).as_ref() {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
            _ => {}
        }
    }
}

impl ExternalParticipant {
    /// Connects to the first of `relays` (`host:port`) that proves the
    /// client secret, and keeps a connection to one of them from then on.
    pub fn connect(
        relays: &[String],
        secret: &ordo_auth::Secret,
    ) -> Result<ExternalParticipant, ClientError> {
        if relays.is_empty() {
            return Err(ClientError::Unreachable("no relay address".into()));
        }
        let inner = Arc::new(Inner {
            relays: relays.to_vec(),
            key: secret.derive(HANDSHAKE_LABEL),
            conn: Mutex::new(None),
            current: AtomicU32::new(0),
            subs: Mutex::new(Vec::new()),
            writers: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            next_req: AtomicU32::new(1),
            stop: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            relay_member: AtomicU32::new(u32::MAX),
            max_frame: 64 << 20,
        });
        let s = inner.connect().map_err(ClientError::Unreachable)?;
        let i = inner.clone();
        let reader = std::thread::Builder::new()
            .name("ordo-dds-external".into())
            .spawn(move || i.read_loop(s))
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        Ok(ExternalParticipant { inner, reader: Some(reader) })
    }

    /// The member whose relay serves this client now.
    pub fn relay_member(&self) -> u32 {
        self.inner.relay_member.load(Ordering::Acquire)
    }

    /// Times it moved to another relay.
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` for a connection (after a relay died).
    pub fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while lock(&self.inner.conn).is_none() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Subscribes to `topic` (of `type_name`, empty: any); the subscription
    /// holds at most `max_samples`.
    pub fn subscribe(
        &self,
        topic: &str,
        type_name: &str,
        max_samples: usize,
    ) -> Result<ExternalSubscription, ClientError> {
        let queue = Arc::new(SubQueue {
            samples: Mutex::new((VecDeque::new(), 0)),
            cv: Condvar::new(),
            max: max_samples.max(1),
        });
        let req = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        lock(&self.inner.pending).insert(req, tx);
        // Registered and sent under one lock: a reconnect either re-sends
        // it (it is registered) or happens after it was sent — never both.
        let sent = {
            let mut subs = lock(&self.inner.subs);
            subs.push(Sub {
                topic: topic.into(),
                type_name: type_name.into(),
                ordered: true,
                last: 0,
                id: None,
                req,
                queue: queue.clone(),
            });
            self.inner.send(&Frame::Subscribe {
                req,
                after: 0,
                topic: topic.into(),
                type_name: type_name.into(),
            })
        };
        let answer =
            sent.and_then(|()| rx.recv_timeout(REQUEST_TIMEOUT).map_err(|_| ClientError::Disconnected));
        lock(&self.inner.pending).remove(&req);
        let fail = |e| {
            lock(&self.inner.subs).retain(|s| !Arc::ptr_eq(&s.queue, &queue));
            Err(e)
        };
        match answer {
            Ok(Frame::Ok { qos, .. }) => {
                if qos == 0 {
                    // Unordered: positions are the relay's receipt order.
                    for s in lock(&self.inner.subs).iter_mut().filter(|s| Arc::ptr_eq(&s.queue, &queue)) {
                        s.ordered = false;
                    }
                }
                Ok(ExternalSubscription { queue })
            }
            Ok(Frame::Error { code, message, .. }) => fail(ClientError::Refused { code, message }),
            Ok(_) => fail(ClientError::Disconnected),
            Err(e) => fail(e),
        }
    }

    /// A writer of `topic` through the relay (its member must publish it).
    pub fn writer(&self, topic: &str, type_name: &str) -> Result<ExternalWriter, ClientError> {
        // Declared first: a reconnect during the request re-declares it.
        lock(&self.inner.writers).push(Declared { topic: topic.into(), type_name: type_name.into() });
        let generation = self.inner.generation.load(Ordering::Acquire);
        let f =
            self.inner.request(|req| Frame::Writer { req, topic: topic.into(), type_name: type_name.into() });
        let Ok(Frame::Ok { topic: id, max_sample, .. }) = f else {
            let mut w = lock(&self.inner.writers);
            if let Some(i) = w.iter().rposition(|d| d.topic == topic) {
                w.remove(i);
            }
            return Err(f.err().unwrap_or(ClientError::Disconnected));
        };
        Ok(ExternalWriter {
            inner: self.inner.clone(),
            topic: id,
            max_sample: max_sample as usize,
            flushed_on: AtomicU64::new(generation),
        })
    }
}

impl Drop for ExternalParticipant {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(s) = lock(&self.inner.conn).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

/// Samples of one topic, received through a relay.
pub struct ExternalSubscription {
    queue: Arc<SubQueue>,
}

impl ExternalSubscription {
    /// Removes and returns up to `max` samples.
    pub fn take(&self, max: usize) -> Vec<ExternalSample> {
        let mut q = lock(&self.queue.samples);
        let n = max.min(q.0.len());
        q.0.drain(..n).collect()
    }

    /// Waits up to `timeout` for a sample; whether one is held.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.queue.samples);
        while q.0.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self.queue.cv.wait_timeout(q, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// Samples not kept because the subscription held `max_samples`.
    pub fn rejected(&self) -> u64 {
        lock(&self.queue.samples).1
    }
}

/// Publishes samples of one topic through a relay.
pub struct ExternalWriter {
    inner: Arc<Inner>,
    topic: u16,
    max_sample: usize,
    /// The connection of the last flush that succeeded (or of creation).
    flushed_on: AtomicU64,
}

impl ExternalWriter {
    /// Sends one sample (not yet stable: see [`flush`](Self::flush)).
    pub fn write(&self, key: &[u8], data: &[u8]) -> Result<(), ClientError> {
        if key.len() + data.len() > self.max_sample || key.len() > crate::sample::MAX_KEY {
            return Err(ClientError::TooLarge(key.len() + data.len(), self.max_sample));
        }
        self.inner.send(&Frame::Publish { topic: self.topic, key: key.to_vec(), data: data.to_vec() })
    }

    /// Returns `Ok` once everything written since the last successful
    /// flush is delivered (stable at every member of the topic). An error
    /// means some of it may be lost: the relay refused a sample, or the
    /// connection changed since (writes made through a relay that died are
    /// in doubt); the next flush vouches for what is written after it.
    pub fn flush(&self) -> Result<(), ClientError> {
        let g = self.inner.generation.load(Ordering::Acquire);
        let r = self.inner.request(|req| Frame::Flush { req }).map(|_| ());
        let same = self.inner.generation.load(Ordering::Acquire) == g;
        let before = self.flushed_on.swap(g, Ordering::AcqRel);
        match r {
            Ok(()) if same && before == g => Ok(()),
            Ok(()) => Err(ClientError::Disconnected),
            Err(e) => Err(e),
        }
    }
}
