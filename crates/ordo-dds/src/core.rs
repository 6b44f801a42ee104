//! The sans-I/O heart of a participant: per topic, what it delivered, the
//! history it keeps, its log, and the reader queues samples go to. The
//! member's delivery upcall, state transfer and the simulator's `dds`
//! workload all drive this same [`DomainCore`].
//!
//! # Invariants
//! - **Positions**: an ordered topic's samples are numbered 1, 2, … in the
//!   subgroup's total order; `delivered` counts every delivered message
//!   (one that does not decode too — every member skips it alike), so all
//!   members give a sample the same position, and a joiner continues from
//!   the snapshot's count. Unordered topics number samples in receipt order
//!   at this member only.
//! - **History** (storage levels): the last `history` samples by position,
//!   contiguous; it is the state a joiner restores (late-joiner catch-up).
//! - **Logged before seen**: a logged topic's samples are appended to its
//!   log and synced — one sync per topic per delivered batch — before any
//!   reader gets them; a sample whose log write failed is never handed to
//!   a reader (the topic reports the error), so a sample a reader took
//!   survives a crash of this member.
//! - **The log is append-only, in segments.** Its entries are samples
//!   (with their position) and *segment markers*. A segment starts when the
//!   topic's state starts here: a fresh start ([`TopicCore::start_fresh`]),
//!   a joiner's restore (the marker, then the restored history), or a
//!   **whole-topic restart** — a restore with no holder left, every member
//!   of the topic having failed — which starts a new lineage at position 1.
//!   Opening a log replays its last segment; earlier segments stay on disk
//!   (nothing logged is ever overwritten).
//! - **Readers** get each sample at most once: ordered readers only
//!   (epoch, position) pairs above the last they got, where the epoch
//!   counts this member's segments (history at creation, a restored history
//!   after a join, then live samples); what a reader holds is bounded by
//!   its QoS (`KeepLast(n)` per instance, `KeepAll` up to `max_samples`,
//!   then rejected and counted).
//! - Bad input (an undecodable sample, a snapshot that does not decode, a
//!   log record that does not decode) is counted or an error and changes
//!   no state.

use crate::sample::Envelope;
use ordo_fabric::MemberId;
use ordo_raft::storage::{Disk, LogOptions, LogStore, StorageError};
use ordo_raft::{Entry, EntryKind};
use ordo_runtime::{QosLevel, TopicConfig};
use ordo_vsync::{Delivered, DeliveryMode, SubgroupConfig};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// One delivered sample, as members keep and readers get it (the payload
/// is shared: one copy out of the ring per member).
#[derive(Clone, Debug)]
pub struct StoredSample {
    /// Position in the topic's total order (ordered topics), or receipt
    /// count at this member (unordered).
    pub position: u64,
    /// The view it was delivered in.
    pub view: u64,
    /// The publishing member.
    pub sender: MemberId,
    /// Its decoded envelope.
    pub envelope: Envelope,
    /// The whole payload (envelope and data).
    pub bytes: Arc<[u8]>,
}

impl StoredSample {
    fn new(position: u64, view: u64, sender: MemberId, bytes: &[u8]) -> Result<StoredSample, &'static str> {
        let envelope = Envelope::decode(bytes)?;
        Ok(StoredSample { position, view, sender, envelope, bytes: Arc::from(bytes) })
    }

    /// The instance key.
    pub fn key(&self) -> &[u8] {
        self.envelope.key(&self.bytes)
    }

    /// The serialized sample.
    pub fn data(&self) -> &[u8] {
        self.envelope.data(&self.bytes)
    }

    fn log_record(&self) -> Vec<u8> {
        let mut r = Vec::with_capacity(21 + self.bytes.len());
        r.push(RECORD_SAMPLE);
        r.extend_from_slice(&self.position.to_le_bytes());
        r.extend_from_slice(&self.view.to_le_bytes());
        r.extend_from_slice(&self.sender.to_le_bytes());
        r.extend_from_slice(&self.bytes);
        r
    }
}

/// A log record: a sample, or the start of a segment.
const RECORD_SAMPLE: u8 = 1;
const RECORD_SEGMENT: u8 = 2;

/// Decodes a log record: `None` for a segment marker.
fn decode_log_record(r: &[u8]) -> Result<Option<StoredSample>, &'static str> {
    match r.first() {
        Some(&RECORD_SEGMENT) if r.len() == 1 => Ok(None),
        Some(&RECORD_SAMPLE) if r.len() >= 21 => {
            let position = u64::from_le_bytes(r[1..9].try_into().expect("8 bytes"));
            let view = u64::from_le_bytes(r[9..17].try_into().expect("8 bytes"));
            let sender = u32::from_le_bytes(r[17..21].try_into().expect("4 bytes"));
            StoredSample::new(position, view, sender, &r[21..]).map(Some)
        }
        _ => Err("log record is neither a sample nor a segment marker"),
    }
}

impl StoredSample {}

/// What a reader knows of a sample besides its data (DDS `SampleInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleInfo {
    /// The publishing member.
    pub source: MemberId,
    /// The writer's sequence number.
    pub sequence: u64,
    /// Position in the topic's total order (ordered topics; receipt order
    /// at this member for `unordered`).
    pub position: u64,
    /// The view it was delivered in.
    pub view: u64,
    /// The writer's clock when written (Unix ns).
    pub source_timestamp_ns: u64,
    /// The instance key (empty: keyless).
    pub key: Vec<u8>,
    /// Whether an earlier `read` returned it (DDS `READ` sample state).
    pub was_read: bool,
}

impl SampleInfo {
    /// The info of a stored sample.
    pub fn of(s: &StoredSample, was_read: bool) -> SampleInfo {
        SampleInfo::parts(s.position, s.view, s.sender, &s.envelope, &s.bytes, was_read)
    }

    fn parts(
        position: u64,
        view: u64,
        sender: MemberId,
        e: &Envelope,
        payload: &[u8],
        was_read: bool,
    ) -> SampleInfo {
        SampleInfo {
            source: sender,
            sequence: e.seq,
            position,
            view,
            source_timestamp_ns: e.source_ns,
            key: e.key(payload).to_vec(),
            was_read,
        }
    }
}

/// An in-place subscriber: called on the member's thread with each
/// sample's bytes where they lie (the ring slot; after the log's sync for
/// logged topics) — no copy, no queue, no thread hop (Derecho's delivery
/// upcall; DDS `on_data_available` taking at once). Must not block and
/// must not call into its participant.
pub type InPlaceFn = Box<dyn FnMut(&SampleInfo, &[u8]) + Send>;

/// A reader's history QoS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum History {
    /// The last `n` samples per instance (DDS `KEEP_LAST`; `n ≥ 1`).
    KeepLast(usize),
    /// Every sample up to [`ReaderQos::max_samples`], then new ones are
    /// rejected and counted (DDS `KEEP_ALL` with `RESOURCE_LIMITS`; the
    /// group never waits for a slow reader).
    KeepAll,
}

/// A reader's QoS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReaderQos {
    /// `KeepLast(n)` or `KeepAll`.
    pub history: History,
    /// Most samples held at once (all instances).
    pub max_samples: usize,
}

impl Default for ReaderQos {
    /// DDS's default: `KEEP_LAST(1)`.
    fn default() -> Self {
        ReaderQos { history: History::KeepLast(1), max_samples: 65_536 }
    }
}

impl ReaderQos {
    /// `KEEP_ALL` up to `max_samples`.
    pub fn keep_all(max_samples: usize) -> ReaderQos {
        ReaderQos { history: History::KeepAll, max_samples: max_samples.max(1) }
    }

    /// `KEEP_LAST(n)` per instance.
    pub fn keep_last(n: usize) -> ReaderQos {
        ReaderQos { history: History::KeepLast(n.max(1)), ..ReaderQos::default() }
    }
}

/// A reader's counters (DDS's sample-lost / sample-rejected statuses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderStatus {
    /// Samples queued for this reader.
    pub received: u64,
    /// Samples pushed out by newer ones of their instance (`KeepLast`).
    pub replaced: u64,
    /// Samples not queued because the reader held `max_samples` (`KeepAll`).
    pub rejected: u64,
}

/// Wakes a [`crate::WaitSet`].
#[derive(Default)]
pub(crate) struct Signal {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Signal {
    pub(crate) fn ring(&self) {
        *lock(&self.generation) += 1;
        self.cv.notify_all();
    }

    pub(crate) fn generation(&self) -> u64 {
        *lock(&self.generation)
    }

    /// Waits until the generation passes `seen` or `timeout` elapses.
    pub(crate) fn wait_past(&self, seen: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.generation);
        while *g == seen {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            g = self.cv.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct ReaderState {
    queue: VecDeque<(StoredSample, bool)>,
    per_key: HashMap<Vec<u8>, usize>,
    /// The last (epoch, position) queued (ordered topics).
    last: (u64, u64),
    status: ReaderStatus,
}

/// An application's listener: called on the member's thread after samples
/// were queued for the reader; must not block.
pub type Listener = Box<dyn FnMut() + Send>;

/// The queue of one data reader: filled by the member's thread, emptied by
/// the application.
pub struct ReaderQueue {
    qos: ReaderQos,
    ordered: bool,
    state: Mutex<ReaderState>,
    signal: Signal,
    listener: Mutex<Option<Listener>>,
    waitsets: Mutex<Vec<Weak<Signal>>>,
}

impl ReaderQueue {
    fn new(qos: ReaderQos, ordered: bool, after: (u64, u64)) -> ReaderQueue {
        ReaderQueue {
            qos,
            ordered,
            state: Mutex::new(ReaderState {
                queue: VecDeque::new(),
                per_key: HashMap::new(),
                last: after,
                status: ReaderStatus::default(),
            }),
            signal: Signal::default(),
            listener: Mutex::new(None),
            waitsets: Mutex::new(Vec::new()),
        }
    }

    /// Queues what is new to this reader; rings its signal and waitsets and
    /// calls its listener when anything was queued.
    fn push_all(&self, epoch: u64, samples: &[StoredSample]) {
        let mut queued = false;
        {
            let mut st = lock(&self.state);
            for s in samples {
                if self.ordered {
                    if (epoch, s.position) <= st.last {
                        continue;
                    }
                    st.last = (epoch, s.position);
                }
                queued |= self.push_one(&mut st, s);
            }
        }
        if queued {
            self.signal.ring();
            lock(&self.waitsets).retain(|w| w.upgrade().map(|s| s.ring()).is_some());
            if let Some(f) = lock(&self.listener).as_mut() {
                f();
            }
        }
    }

    fn push_one(&self, st: &mut ReaderState, s: &StoredSample) -> bool {
        match self.qos.history {
            History::KeepAll => {
                if st.queue.len() >= self.qos.max_samples {
                    st.status.rejected += 1;
                    return false;
                }
            }
            History::KeepLast(n) => {
                let held = st.per_key.get(s.key()).copied().unwrap_or(0);
                if held >= n {
                    let oldest =
                        st.queue.iter().position(|(q, _)| q.key() == s.key()).expect("a held sample");
                    st.queue.remove(oldest);
                    *st.per_key.get_mut(s.key()).expect("held") -= 1;
                    st.status.replaced += 1;
                } else if st.queue.len() >= self.qos.max_samples {
                    st.status.rejected += 1;
                    return false;
                }
                *st.per_key.entry(s.key().to_vec()).or_default() += 1;
            }
        }
        st.queue.push_back((s.clone(), false));
        st.status.received += 1;
        true
    }

    /// Removes and returns up to `max` samples, oldest first.
    pub fn take(&self, max: usize) -> Vec<StoredSample> {
        let mut st = lock(&self.state);
        let n = max.min(st.queue.len());
        let out: Vec<StoredSample> = st.queue.drain(..n).map(|(s, _)| s).collect();
        if matches!(self.qos.history, History::KeepLast(_)) {
            for s in &out {
                if let Some(c) = st.per_key.get_mut(s.key()) {
                    *c -= 1;
                    if *c == 0 {
                        st.per_key.remove(s.key());
                    }
                }
            }
        }
        out
    }

    /// Returns up to `max` samples without removing them, each with whether
    /// an earlier `read` returned it (DDS sample state), and marks them read.
    pub fn read(&self, max: usize) -> Vec<(StoredSample, bool)> {
        let mut st = lock(&self.state);
        st.queue
            .iter_mut()
            .take(max)
            .map(|(s, read)| {
                let was = *read;
                *read = true;
                (s.clone(), was)
            })
            .collect()
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        lock(&self.state).queue.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its counters.
    pub fn status(&self) -> ReaderStatus {
        lock(&self.state).status
    }

    /// Waits up to `timeout` for a sample; whether one is held.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.signal.generation();
            if !self.is_empty() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.signal.wait_past(seen, left);
        }
    }

    pub(crate) fn set_listener(&self, f: Option<Listener>) {
        *lock(&self.listener) = f;
    }

    pub(crate) fn attach(&self, s: &Arc<Signal>) {
        lock(&self.waitsets).push(Arc::downgrade(s));
    }
}

/// A topic's counters at this member.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopicStats {
    /// Messages delivered (= the last position, ordered topics).
    pub delivered: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Delivered messages that were no sample (skipped).
    pub undecodable: u64,
    /// Samples appended to the log.
    pub logged: u64,
    /// Log syncs.
    pub syncs: u64,
    /// Samples held in the history.
    pub history: u64,
    /// Delivered samples this member published.
    pub own: u64,
    /// The writer sequence of the last of them.
    pub own_seq: u64,
}

/// One topic at one member.
pub struct TopicCore<D: Disk> {
    config: TopicConfig,
    /// This member's segments of the topic so far (readers' epoch).
    epoch: u64,
    delivered: u64,
    history: VecDeque<StoredSample>,
    log: Option<LogStore<D>>,
    fault: Option<String>,
    readers: Vec<Weak<ReaderQueue>>,
    in_place: Vec<InPlace>,
    next_in_place: u64,
    stats: TopicStats,
}

/// An in-place subscriber and the last (epoch, position) it got.
struct InPlace {
    id: u64,
    last: (u64, u64),
    f: InPlaceFn,
}

/// Calls every in-place subscriber that has not had this sample (ordered
/// topics: (epoch, position) above its last).
fn call_in_place(subs: &mut [InPlace], ordered: bool, epoch: u64, info: &SampleInfo, data: &[u8]) {
    for s in subs {
        if ordered {
            if (epoch, info.position) <= s.last {
                continue;
            }
            s.last = (epoch, info.position);
        }
        (s.f)(info, data);
    }
}

/// The state a snapshot carries is bounded by this many bytes per sample
/// on top of the topic's `max_sample`.
/// (A log record adds 21 bytes and the log's own framing; the envelope up
/// to `HEADER + MAX_KEY`.)
const SNAPSHOT_SAMPLE_OVERHEAD: usize = 512 + crate::sample::HEADER + crate::sample::MAX_KEY;

impl<D: Disk> TopicCore<D> {
    /// A topic without a log.
    pub fn new(config: TopicConfig) -> TopicCore<D> {
        TopicCore {
            config,
            epoch: 0,
            delivered: 0,
            history: VecDeque::new(),
            log: None,
            fault: None,
            readers: Vec::new(),
            in_place: Vec::new(),
            next_in_place: 0,
            stats: TopicStats::default(),
        }
    }

    /// A `logged-storage` topic over `disk`: opens (recovers) its log and
    /// replays its tail into the history.
    pub fn with_log(config: TopicConfig, disk: D, durable: bool) -> Result<TopicCore<D>, StorageError> {
        let (log, recovered) = LogStore::open(disk, log_options(&config, durable))?;
        let mut t = TopicCore::new(config);
        // Replay the last segment: its samples, the last `history` kept.
        let (_, mut segment) = segments(&recovered.entries)?;
        t.delivered = segment.last().map_or(0, |s| s.position);
        let keep = segment.len().saturating_sub(t.config.history);
        t.history = segment.drain(keep..).collect();
        t.log = Some(log);
        t.stats.delivered = t.delivered;
        t.stats.history = t.history.len() as u64;
        Ok(t)
    }

    /// Its configuration.
    pub fn config(&self) -> &TopicConfig {
        &self.config
    }

    /// Its QoS level.
    pub fn qos(&self) -> QosLevel {
        self.config.qos
    }

    /// Messages delivered (the last position, ordered topics).
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The history held (storage levels), oldest first.
    pub fn history(&self) -> impl Iterator<Item = &StoredSample> {
        self.history.iter()
    }

    /// Why the topic stopped at this member, if it did (its log failed, or
    /// the group's state did not restore): it shows readers nothing more.
    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }

    /// Its counters.
    pub fn stats(&self) -> TopicStats {
        self.stats
    }

    /// The log (logged topics).
    pub fn log(&self) -> Option<&LogStore<D>> {
        self.log.as_ref()
    }

    /// A new reader: a stored topic's reader starts with the history
    /// (TRANSIENT durability), any other with the next sample delivered.
    pub fn add_reader(&mut self, qos: ReaderQos) -> Arc<ReaderQueue> {
        let ordered = self.config.qos.ordered();
        let qos = match qos.history {
            History::KeepLast(n) => {
                ReaderQos { history: History::KeepLast(n.max(1)), max_samples: qos.max_samples.max(1) }
            }
            History::KeepAll => ReaderQos { max_samples: qos.max_samples.max(1), ..qos },
        };
        let r = Arc::new(ReaderQueue::new(qos, ordered, (0, 0)));
        if self.config.qos.stores() && self.fault.is_none() {
            let h: Vec<StoredSample> = self.history.iter().cloned().collect();
            r.push_all(self.epoch, &h);
        }
        if ordered {
            let mut st = lock(&r.state);
            st.last = st.last.max((self.epoch, self.delivered));
        }
        self.readers.retain(|w| w.strong_count() > 0);
        self.readers.push(Arc::downgrade(&r));
        r
    }

    /// Adds an in-place subscriber: on a stored topic it is called with
    /// the history first (TRANSIENT durability, like a new reader), then
    /// with every sample delivered from now on (and a joiner's restored
    /// history); its id for [`remove_in_place`](Self::remove_in_place).
    pub fn add_in_place(&mut self, f: InPlaceFn) -> u64 {
        self.add_in_place_after(f, 0)
    }

    /// As [`add_in_place`](Self::add_in_place), but only the history above
    /// position `after` (an external subscriber resuming at a relay).
    pub fn add_in_place_after(&mut self, f: InPlaceFn, after: u64) -> u64 {
        self.next_in_place += 1;
        let id = self.next_in_place;
        let ordered = self.config.qos.ordered();
        let mut sub = [InPlace { id, last: (self.epoch, after), f }];
        if self.config.qos.stores() && self.fault.is_none() {
            for s in &self.history {
                call_in_place(&mut sub, ordered, self.epoch, &SampleInfo::of(s, false), s.data());
            }
        }
        let [mut sub] = sub;
        if ordered {
            sub.last = sub.last.max((self.epoch, self.delivered));
        }
        self.in_place.push(sub);
        id
    }

    /// Removes an in-place subscriber.
    pub fn remove_in_place(&mut self, id: u64) {
        self.in_place.retain(|s| s.id != id);
    }

    /// Queues `samples` for the readers and, on a logged topic (whose
    /// in-place subscribers wait for the sync) or for a restored history,
    /// calls the in-place subscribers too.
    fn release(&mut self, samples: &[StoredSample], in_place: bool) {
        self.hand_out(samples);
        if in_place {
            let ordered = self.config.qos.ordered();
            for s in samples {
                call_in_place(&mut self.in_place, ordered, self.epoch, &SampleInfo::of(s, false), s.data());
            }
        }
    }

    fn hand_out(&mut self, samples: &[StoredSample]) {
        if samples.is_empty() {
            return;
        }
        let epoch = self.epoch;
        self.readers.retain(|w| match w.upgrade() {
            Some(r) => {
                r.push_all(epoch, samples);
                true
            }
            None => false,
        });
    }

    /// Takes one delivered message: its sample, or `None` (skipped).
    /// Takes one delivered message: in-place subscribers of an unlogged
    /// topic see it now, in the slot; it is copied out only when something
    /// keeps it (history, log, queued readers).
    fn accept(&mut self, view: u64, d: &Delivered<'_>, own: bool) -> Option<StoredSample> {
        self.delivered += 1;
        self.stats.delivered = self.delivered;
        self.stats.bytes += d.payload.len() as u64;
        if own {
            self.stats.own += 1;
        }
        let envelope = match Envelope::decode(d.payload).and_then(|e| {
            // A sample over the topic's bound (a peer that ignores it) is
            // refused alike everywhere: it could not be logged.
            let data = d.payload.len() - e.data_at as usize;
            if usize::from(e.key_len) + data > self.config.max_sample {
                Err("sample over the topic's max_sample")
            } else {
                Ok(e)
            }
        }) {
            Ok(e) => {
                if own {
                    self.stats.own_seq = e.seq;
                }
                e
            }
            Err(why) => {
                self.stats.undecodable += 1;
                tracing::warn!(topic = %self.config.name, sender = d.sender, %why, "a delivered message is no sample; skipped");
                return None;
            }
        };
        if self.fault.is_some() {
            // The topic stopped here: nothing more is kept or shown.
            return None;
        }
        let logged = self.log.is_some();
        if !logged && !self.in_place.is_empty() {
            let info = SampleInfo::parts(self.delivered, view, d.sender, &envelope, d.payload, false);
            let ordered = self.config.qos.ordered();
            call_in_place(&mut self.in_place, ordered, self.epoch, &info, envelope.data(d.payload));
        }
        if !(self.config.qos.stores() || logged || self.readers.iter().any(|w| w.strong_count() > 0)) {
            return None;
        }
        let s = StoredSample {
            position: self.delivered,
            view,
            sender: d.sender,
            envelope,
            bytes: Arc::from(d.payload),
        };
        if self.config.qos.stores() {
            self.history.push_back(s.clone());
            while self.history.len() > self.config.history {
                self.history.pop_front();
            }
            self.stats.history = self.history.len() as u64;
        }
        Some(s)
    }

    /// Appends `samples` and syncs; false (and the error kept) if the log
    /// failed now or before.
    fn log_batch(&mut self, samples: &[StoredSample]) -> bool {
        let Some(log) = self.log.as_mut() else { return true };
        if self.fault.is_some() {
            return false;
        }
        let next = log.last_index() + 1;
        let entries: Vec<Entry> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| Entry {
                term: 1,
                index: next + i as u64,
                kind: EntryKind::Normal,
                data: s.log_record().into(),
            })
            .collect();
        let r = log.append(&entries).and_then(|()| log.sync());
        match r {
            Ok(()) => {
                self.stats.logged += entries.len() as u64;
                self.stats.syncs += 1;
                true
            }
            Err(e) => {
                tracing::error!(topic = %self.config.name, error = %e, "the topic's log failed: its samples are no longer handed to readers");
                self.fault = Some(e.to_string());
                // What the failed batch put in the history was not logged:
                // no later reader may get it.
                let first = samples.first().map_or(u64::MAX, |s| s.position);
                while self.history.back().is_some_and(|s| s.position >= first) {
                    self.history.pop_back();
                }
                self.stats.history = self.history.len() as u64;
                false
            }
        }
    }

    /// The state a joiner restores: the delivered count and the history.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.delivered.to_le_bytes());
        out.extend_from_slice(&(self.history.len() as u32).to_le_bytes());
        for s in &self.history {
            out.extend_from_slice(&s.position.to_le_bytes());
            out.extend_from_slice(&s.view.to_le_bytes());
            out.extend_from_slice(&s.sender.to_le_bytes());
            out.extend_from_slice(&(s.bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(&s.bytes);
        }
        out
    }

    fn decode_snapshot(&self, b: &[u8]) -> Result<(u64, VecDeque<StoredSample>), &'static str> {
        let mut at = 0;
        let mut take = |n: usize| -> Result<&[u8], &'static str> {
            let s = b.get(at..at + n).ok_or("snapshot cut short")?;
            at += n;
            Ok(s)
        };
        let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes"));
        let delivered = u64_(take(8)?);
        let n = u32_(take(4)?) as usize;
        if n > self.config.history || (n > 0 && !self.config.qos.stores()) {
            return Err("snapshot holds more samples than the topic keeps");
        }
        let mut history = VecDeque::with_capacity(n);
        let mut prev: Option<u64> = None;
        for _ in 0..n {
            let position = u64_(take(8)?);
            let view = u64_(take(8)?);
            let sender = u32_(take(4)?);
            let len = u32_(take(4)?) as usize;
            if len > self.config.max_sample + SNAPSHOT_SAMPLE_OVERHEAD {
                return Err("snapshot sample longer than the topic allows");
            }
            // Increasing, within the count (a message that was no sample
            // holds a position and leaves a gap in the history).
            if prev.is_some_and(|p| position <= p) || position > delivered || position == 0 {
                return Err("snapshot positions do not increase up to its count");
            }
            prev = Some(position);
            history.push_back(StoredSample::new(position, view, sender, take(len)?)?);
        }
        if at != b.len() {
            return Err("bytes after the snapshot");
        }
        Ok((delivered, history))
    }

    /// Starts a new segment holding `history` at `delivered`: a marker
    /// and the samples appended to the log and synced, then the state
    /// replaced; readers start a new epoch and get what the history holds.
    fn start_segment(&mut self, delivered: u64, history: VecDeque<StoredSample>) -> Result<(), String> {
        if let Some(log) = self.log.as_mut() {
            let next = log.last_index() + 1;
            let mut entries = vec![Entry {
                term: 1,
                index: next,
                kind: EntryKind::Normal,
                data: vec![RECORD_SEGMENT].into(),
            }];
            entries.extend(history.iter().enumerate().map(|(i, s)| Entry {
                term: 1,
                index: next + 1 + i as u64,
                kind: EntryKind::Normal,
                data: s.log_record().into(),
            }));
            if let Err(e) = log.append(&entries).and_then(|()| log.sync()) {
                self.fault = Some(e.to_string());
                return Err(format!("the log could not start a segment: {e}"));
            }
        }
        // Readers go on by position when the new segment continues the
        // lineage they saw (its first sample is one they had, or lies past
        // everything here); otherwise (a restart, another lineage) they
        // start a new epoch.
        let continues = delivered > 0
            && history.front().is_some_and(|f| {
                f.position > self.delivered
                    || self.history.iter().any(|s| s.position == f.position && s.bytes == f.bytes)
            });
        if !continues {
            self.epoch += 1;
        }
        self.delivered = delivered;
        self.history = history;
        self.stats.delivered = delivered;
        self.stats.history = self.history.len() as u64;
        let h: Vec<StoredSample> = self.history.iter().cloned().collect();
        self.release(&h, true);
        Ok(())
    }

    /// The topic starts here with the group (an original member of a new
    /// group): a new lineage at position 1; what the log replayed stays in
    /// its earlier segment.
    pub fn start_fresh(&mut self) -> Result<(), String> {
        self.start_segment(0, VecDeque::new())
    }

    /// Replaces the state with a snapshot (a joiner, before it delivers):
    /// the log gets a new segment with the restored history, and readers
    /// get what is new to them. An empty snapshot means no member held the
    /// topic (every one failed): a whole-topic restart, a new lineage at
    /// position 1 — every member of the topic in this view restarts alike.
    pub fn restore(&mut self, b: &[u8]) -> Result<(), String> {
        if b.is_empty() {
            return self.start_fresh();
        }
        match self.decode_snapshot(b) {
            Ok((delivered, history)) => self.start_segment(delivered, history),
            Err(why) => {
                // Without the group's state this member's positions would
                // not be the group's: the topic stops here, and says why.
                self.fault = Some(format!("the group's state did not restore: {why}"));
                Err(why.to_owned())
            }
        }
    }
}

fn log_options(config: &TopicConfig, durable: bool) -> LogOptions {
    LogOptions {
        segment_bytes: 64 << 20,
        max_record_bytes: (config.max_sample + SNAPSHOT_SAMPLE_OVERHEAD) as u32,
        durable,
    }
}

/// The segments of a log's entries: how many, and the last one's samples.
fn segments(entries: &[Entry]) -> Result<(u64, Vec<StoredSample>), StorageError> {
    let (mut count, mut segment) = (0, Vec::new());
    for e in entries {
        match decode_log_record(&e.data) {
            Ok(Some(s)) => segment.push(s),
            Ok(None) => {
                count += 1;
                segment.clear();
            }
            Err(reason) => return Err(StorageError::Corrupt { file: "log".into(), offset: e.index, reason }),
        }
    }
    Ok((count, segment))
}

/// What [`read_log`] finds.
pub struct LogReport {
    /// Records in the log.
    pub records: u64,
    /// Segment markers.
    pub segments: u64,
    /// The last segment's samples.
    pub samples: Vec<StoredSample>,
}

/// Reads a topic's log without changing it (`ordo dds log`): a log that
/// needs recovery — a torn tail, a temporary file — is an error (stop its
/// member, whose next start recovers it).
pub fn read_log<D: Disk>(disk: D, config: &TopicConfig) -> Result<LogReport, StorageError> {
    let (log, recovered) = LogStore::open(ReadOnly(disk), log_options(config, false))?;
    let (segments, samples) = segments(&recovered.entries)?;
    Ok(LogReport { records: log.last_index(), segments, samples })
}

/// A disk that refuses every change.
struct ReadOnly<D>(D);

fn read_only() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        "read only: the log needs recovery by its member",
    )
}

impl<D: Disk> Disk for ReadOnly<D> {
    fn list(&mut self) -> std::io::Result<Vec<String>> {
        self.0.list()
    }
    fn create(&mut self, _: &str) -> std::io::Result<()> {
        Err(read_only())
    }
    fn append(&mut self, _: &str, _: &[u8]) -> std::io::Result<()> {
        Err(read_only())
    }
    fn read(&mut self, name: &str) -> std::io::Result<Vec<u8>> {
        self.0.read(name)
    }
    fn read_range(&mut self, name: &str, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.0.read_range(name, offset, len)
    }
    fn file_len(&mut self, name: &str) -> std::io::Result<u64> {
        self.0.file_len(name)
    }
    fn sync(&mut self, _: &str) -> std::io::Result<()> {
        Ok(())
    }
    fn truncate(&mut self, _: &str, _: u64) -> std::io::Result<()> {
        Err(read_only())
    }
    fn remove(&mut self, _: &str) -> std::io::Result<()> {
        Err(read_only())
    }
    fn rename(&mut self, _: &str, _: &str) -> std::io::Result<()> {
        Err(read_only())
    }
    fn sync_dir(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a topic's subgroup carries besides its name and shape (the
/// subgroup's `descriptor`): what every member must agree on to share it.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicSpec {
    qos: QosLevel,
    max_sample: usize,
    history: usize,
    type_name: String,
}

/// The vsync subgroup of topic `t` (members, senders as given): named
/// after it, its shape and descriptor from its QoS, sizes and type. Two
/// participants that declare one topic alike produce equal subgroups.
pub fn topic_subgroup(t: &TopicConfig, members: Vec<MemberId>) -> SubgroupConfig {
    let spec = TopicSpec {
        qos: t.qos,
        max_sample: t.max_sample,
        history: if t.qos.stores() { t.history } else { 0 },
        type_name: t.type_name.clone(),
    };
    SubgroupConfig {
        members,
        senders: t.publishers.clone(),
        window: t.window,
        max_payload: crate::participant::slot_payload(t.max_sample),
        mode: if t.qos.ordered() { DeliveryMode::Ordered } else { DeliveryMode::Unordered },
        name: t.name.clone(),
        descriptor: serde_json::to_vec(&spec).expect("a topic spec serializes"),
    }
}

/// The topic a subgroup of the catalogue is (None: it is not one — an
/// anonymous or foreign subgroup): publishers are its senders,
/// subscribers its other members.
pub fn subgroup_topic(s: &SubgroupConfig) -> Option<TopicConfig> {
    let spec: TopicSpec = serde_json::from_slice(&s.descriptor).ok()?;
    let t = TopicConfig {
        name: s.name.clone(),
        qos: spec.qos,
        publishers: s.senders.clone(),
        subscribers: s.members.iter().copied().filter(|m| !s.senders.contains(m)).collect(),
        max_sample: spec.max_sample,
        window: s.window,
        history: spec.history,
        type_name: spec.type_name,
    };
    // The shape must be the one the spec implies (a peer cannot make a
    // topic's slots smaller than its samples).
    spec_matches(&t, s).then_some(t)
}

fn spec_matches(t: &TopicConfig, s: &SubgroupConfig) -> bool {
    s.max_payload == crate::participant::slot_payload(t.max_sample)
        && s.mode == if t.qos.ordered() { DeliveryMode::Ordered } else { DeliveryMode::Unordered }
        && !s.name.is_empty()
        && (t.history > 0 || !t.qos.stores())
}

/// Every topic of the domain at one member, indexed like the vsync
/// subgroups they are.
pub struct DomainCore<D: Disk> {
    me: MemberId,
    topics: Vec<TopicCore<D>>,
    stray: u64,
}

impl<D: Disk> DomainCore<D> {
    /// Member `me`'s, over topics built by the caller (with or without
    /// logs).
    pub fn new(me: MemberId, topics: Vec<TopicCore<D>>) -> DomainCore<D> {
        DomainCore { me, topics, stray: 0 }
    }

    /// Topic `g`.
    pub fn topic(&self, g: usize) -> &TopicCore<D> {
        &self.topics[g]
    }

    /// Topic `g`, to add readers.
    pub fn topic_mut(&mut self, g: usize) -> &mut TopicCore<D> {
        &mut self.topics[g]
    }

    /// The topics.
    pub fn topics(&self) -> &[TopicCore<D>] {
        &self.topics
    }

    /// Messages of a subgroup that is no topic (never, unless a peer lies).
    pub fn stray(&self) -> u64 {
        self.stray
    }

    /// One delivered batch (the member's upcall): positions, histories,
    /// then per topic one log append and sync, then the readers.
    pub fn deliver(&mut self, view: u64, batch: &[Delivered<'_>]) {
        let mut out: Vec<Vec<StoredSample>> = Vec::new();
        for d in batch {
            let Some(t) = self.topics.get_mut(d.subgroup) else {
                self.stray += 1;
                continue;
            };
            if let Some(s) = t.accept(view, d, d.sender == self.me) {
                if out.len() <= d.subgroup {
                    out.resize_with(d.subgroup + 1, Vec::new);
                }
                out[d.subgroup].push(s);
            }
        }
        for (g, samples) in out.iter().enumerate() {
            if samples.is_empty() {
                continue;
            }
            let t = &mut self.topics[g];
            if t.log_batch(samples) {
                let logged = t.log.is_some();
                t.release(samples, logged);
            }
        }
    }

    /// Every topic starts with a new group (an original member, not a
    /// joiner): see [`TopicCore::start_fresh`].
    pub fn start_fresh(&mut self) -> Result<(), String> {
        self.topics.iter_mut().try_for_each(TopicCore::start_fresh)
    }

    /// Topic `g`'s state for a joiner.
    pub fn snapshot(&self, g: usize) -> Vec<u8> {
        self.topics.get(g).map(TopicCore::snapshot).unwrap_or_default()
    }

    /// The domain's catalogue (every subgroup, configured and declared, in
    /// order), before anything of a view that has it is restored or
    /// delivered: a topic per new subgroup, built by `make` (which opens
    /// the log of a logged topic this member is in); members and
    /// publishers of the others updated; a logged topic this member has
    /// just joined gets its log (`make` again: it held nothing before).
    /// A subgroup that is no topic becomes a topic that says so (`fault`)
    /// and never delivers. Returns how many topics were added.
    pub fn catalogue(
        &mut self,
        subgroups: &[SubgroupConfig],
        mut make: impl FnMut(&TopicConfig) -> Result<TopicCore<D>, String>,
    ) -> usize {
        let before = self.topics.len();
        // A topic whose log did not open stops at this member, saying why.
        let mut make = |cfg: &TopicConfig| {
            make(cfg).unwrap_or_else(|why| {
                let mut t = TopicCore::new(cfg.clone());
                t.fault = Some(why);
                t
            })
        };
        for (g, s) in subgroups.iter().enumerate() {
            let member = s.members.contains(&self.me);
            let Some(cfg) = subgroup_topic(s) else {
                if g >= self.topics.len() {
                    let mut t = TopicCore::new(TopicConfig {
                        name: s.name.clone(),
                        qos: QosLevel::Unordered,
                        publishers: s.senders.clone(),
                        subscribers: Vec::new(),
                        max_sample: 0,
                        window: s.window,
                        history: 1,
                        type_name: String::new(),
                    });
                    t.fault = Some(format!("subgroup {g} ({:?}) is not a topic", s.name));
                    self.topics.push(t);
                }
                continue;
            };
            if g >= self.topics.len() {
                self.topics.push(make(&cfg));
                continue;
            }
            let t = &mut self.topics[g];
            let was = t.config.publishers.contains(&self.me) || t.config.subscribers.contains(&self.me);
            if member && !was && cfg.qos == QosLevel::LoggedStorage && t.log.is_none() && t.delivered == 0 {
                let readers = std::mem::take(&mut t.readers);
                *t = make(&cfg);
                t.readers = readers;
            } else {
                t.config.publishers = cfg.publishers;
                t.config.subscribers = cfg.subscribers;
            }
        }
        self.topics.len() - before
    }

    /// The index of the topic called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.topics.iter().position(|t| t.config.name == name)
    }

    /// A joiner's restore of topic `g`.
    pub fn restore(&mut self, g: usize, state: &[u8]) -> Result<(), String> {
        match self.topics.get_mut(g) {
            Some(t) => t.restore(state),
            None => Err(format!("no topic {g}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{data_offset, encoded_len, write_header};
    use ordo_raft::storage::MemDisk;

    fn topic(qos: QosLevel, history: usize) -> TopicConfig {
        TopicConfig {
            name: "t".into(),
            qos,
            publishers: vec![0],
            subscribers: vec![1],
            max_sample: 64,
            window: 8,
            history,
            type_name: String::new(),
        }
    }

    fn sample(seq: u64, key: &[u8], data: &[u8]) -> Vec<u8> {
        let mut b = vec![0; encoded_len(key.len(), data.len())];
        write_header(&mut b, seq, 0, key);
        b[data_offset(key.len())..].copy_from_slice(data);
        b
    }

    fn deliver<D: Disk>(core: &mut DomainCore<D>, view: u64, msgs: &[(MemberId, Vec<u8>)]) {
        let batch: Vec<Delivered<'_>> = msgs
            .iter()
            .map(|(s, p)| Delivered { subgroup: 0, sender: *s, seq: 0, round: 0, payload: p })
            .collect();
        core.deliver(view, &batch);
    }

    #[test]
    fn keep_last_is_per_instance_and_keep_all_rejects_beyond_its_bound() {
        let mut core =
            DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::AtomicMulticast, 1))]);
        let last2 = core.topic_mut(0).add_reader(ReaderQos::keep_last(2));
        let all3 = core.topic_mut(0).add_reader(ReaderQos::keep_all(3));
        let msgs: Vec<_> =
            (1..=5u64).map(|i| (0, sample(i, if i % 2 == 0 { b"b" } else { b"a" }, b"x"))).collect();
        deliver(&mut core, 0, &msgs);
        let got: Vec<u64> = last2.take(10).iter().map(|s| s.envelope.seq).collect();
        assert_eq!(got, vec![2, 3, 4, 5], "a: 3 and 5 (1 replaced), b: 2 and 4");
        assert_eq!(last2.status().replaced, 1);
        let got: Vec<u64> = all3.take(10).iter().map(|s| s.envelope.seq).collect();
        assert_eq!(got, vec![1, 2, 3]);
        assert_eq!(all3.status().rejected, 2);
    }

    #[test]
    fn read_marks_and_take_removes() {
        let mut core =
            DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::AtomicMulticast, 1))]);
        let r = core.topic_mut(0).add_reader(ReaderQos::keep_all(10));
        deliver(&mut core, 0, &[(0, sample(1, b"", b"a")), (0, sample(2, b"", b"b"))]);
        assert!(r.wait(Duration::ZERO));
        assert_eq!(r.read(10).iter().map(|(_, was)| *was).collect::<Vec<_>>(), vec![false, false]);
        assert_eq!(r.read(10).iter().map(|(_, was)| *was).collect::<Vec<_>>(), vec![true, true]);
        assert_eq!(r.take(1)[0].data(), b"a");
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn garbage_is_skipped_but_counted_in_positions() {
        let mut core =
            DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 10))]);
        let r = core.topic_mut(0).add_reader(ReaderQos::keep_all(10));
        deliver(&mut core, 0, &[(0, vec![1, 2, 3]), (0, sample(1, b"", b"ok"))]);
        let got = r.take(10);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].position, 2);
        assert_eq!(core.topic(0).stats().undecodable, 1);
    }

    #[test]
    fn a_late_reader_and_a_joiner_get_the_history_once() {
        let mut a = DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 3))]);
        let msgs: Vec<_> = (1..=5u64).map(|i| (0, sample(i, b"", &[i as u8]))).collect();
        deliver(&mut a, 0, &msgs);
        let late = a.topic_mut(0).add_reader(ReaderQos::keep_all(10));
        assert_eq!(late.take(10).iter().map(|s| s.position).collect::<Vec<_>>(), vec![3, 4, 5]);
        // A joiner with a reader created before its state arrived.
        let mut b = DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 3))]);
        let early = b.topic_mut(0).add_reader(ReaderQos::keep_all(10));
        b.restore(0, &a.snapshot(0)).unwrap();
        assert_eq!(b.snapshot(0), a.snapshot(0));
        deliver(&mut b, 1, &[(0, sample(6, b"", &[6]))]);
        assert_eq!(early.take(10).iter().map(|s| s.position).collect::<Vec<_>>(), vec![3, 4, 5, 6]);
        // A snapshot cut anywhere is refused and changes nothing.
        let snap = a.snapshot(0);
        let mut c = DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 3))]);
        // (Empty is no holder: a restart, tested below.)
        for cut in 1..snap.len() {
            assert!(c.restore(0, &snap[..cut]).is_err(), "cut {cut}");
        }
        assert_eq!(c.topic(0).delivered(), 0);
        // More samples than the topic keeps: refused.
        let mut small =
            DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 2))]);
        assert!(small.restore(0, &snap).is_err());
    }

    #[test]
    fn logged_samples_are_synced_before_a_reader_sees_them_and_survive_a_crash() {
        let disk = MemDisk::new();
        let mut core = DomainCore::new(
            1,
            vec![TopicCore::with_log(topic(QosLevel::LoggedStorage, 4), disk.clone(), true).unwrap()],
        );
        let r = core.topic_mut(0).add_reader(ReaderQos::keep_all(100));
        let msgs: Vec<_> = (1..=6u64).map(|i| (0, sample(i, b"", &[i as u8]))).collect();
        deliver(&mut core, 0, &msgs[..3]);
        deliver(&mut core, 0, &msgs[3..]);
        assert_eq!(core.topic(0).stats().syncs, 2, "one sync per batch");
        let seen = r.take(100).len();
        assert_eq!(seen, 6);
        disk.crash(7);
        let again =
            TopicCore::<MemDisk>::with_log(topic(QosLevel::LoggedStorage, 4), disk.clone(), true).unwrap();
        assert_eq!(again.delivered(), 6, "every sample a reader saw was synced");
        assert_eq!(again.history().map(|s| s.position).collect::<Vec<_>>(), vec![3, 4, 5, 6]);
        assert_eq!(again.history().last().unwrap().data(), &[6]);
    }

    #[test]
    fn in_place_subscribers_see_the_slot_and_logged_ones_only_after_the_sync() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let mut core =
            DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::AtomicMulticast, 1))]);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let id = core.topic_mut(0).add_in_place(Box::new(move |info, data| {
            s2.lock().unwrap().push((info.sequence, info.position, data.to_vec()))
        }));
        deliver(&mut core, 3, &[(0, sample(5, b"k", b"abc")), (0, vec![0; 3])]);
        assert_eq!(*seen.lock().unwrap(), vec![(5, 1, b"abc".to_vec())], "garbage is not shown");
        core.topic_mut(0).remove_in_place(id);
        deliver(&mut core, 3, &[(0, sample(6, b"", b"x"))]);
        assert_eq!(seen.lock().unwrap().len(), 1, "removed");

        let disk = MemDisk::new();
        let mut logged = DomainCore::new(
            1,
            vec![TopicCore::with_log(topic(QosLevel::LoggedStorage, 4), disk.clone(), true).unwrap()],
        );
        let synced_before = Arc::new(AtomicU64::new(u64::MAX));
        let (d2, sb) = (disk.clone(), synced_before.clone());
        let base = disk.stats().fsyncs();
        logged.topic_mut(0).add_in_place(Box::new(move |_, _| {
            sb.store(d2.stats().fsyncs() - base, Ordering::SeqCst);
        }));
        deliver(&mut logged, 0, &[(0, sample(1, b"", b"a"))]);
        assert!(
            synced_before.load(Ordering::SeqCst) >= 1,
            "the log was synced before the subscriber saw the sample"
        );
    }

    #[test]
    fn a_joiner_log_gets_a_segment_with_the_restored_history() {
        let mut a = DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::LoggedStorage, 3))]);
        let msgs: Vec<_> = (1..=7u64).map(|i| (0, sample(i, b"", &[i as u8]))).collect();
        deliver(&mut a, 0, &msgs);
        let disk = MemDisk::new();
        let mut j = TopicCore::with_log(topic(QosLevel::LoggedStorage, 3), disk.clone(), true).unwrap();
        j.restore(&a.snapshot(0)).unwrap();
        assert_eq!(j.log().unwrap().last_index(), 4, "a marker and three samples");
        drop(j);
        let back = TopicCore::<MemDisk>::with_log(topic(QosLevel::LoggedStorage, 3), disk, true).unwrap();
        assert_eq!(back.delivered(), 7);
        assert_eq!(back.history().map(|s| s.position).collect::<Vec<_>>(), vec![5, 6, 7]);
    }

    #[test]
    fn a_message_that_is_no_sample_leaves_a_gap_a_joiner_restores() {
        let mut a = DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 10))]);
        deliver(&mut a, 0, &[(0, sample(1, b"", b"a")), (0, vec![7; 30]), (0, sample(2, b"", b"b"))]);
        // Over the topic's bound (max_sample 64): refused alike.
        deliver(&mut a, 0, &[(0, sample(3, b"", &[1; 65]))]);
        assert_eq!(a.topic(0).stats().undecodable, 2);
        let mut j = DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 10))]);
        j.restore(0, &a.snapshot(0)).unwrap();
        assert_eq!(j.topic(0).delivered(), 4);
        assert_eq!(j.topic(0).history().map(|s| s.position).collect::<Vec<_>>(), vec![1, 3]);
        deliver(&mut a, 1, &[(0, sample(4, b"", b"c"))]);
        deliver(&mut j, 1, &[(0, sample(4, b"", b"c"))]);
        assert_eq!(j.snapshot(0), a.snapshot(0), "the joiner's positions are the group's");
        // A snapshot that does not decode stops the topic here, saying why.
        let mut k = DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::VolatileStorage, 10))]);
        let r = k.topic_mut(0).add_reader(ReaderQos::keep_all(10));
        assert!(k.restore(0, &[1, 2, 3]).is_err());
        assert!(k.topic(0).fault().is_some());
        deliver(&mut k, 1, &[(0, sample(5, b"", b"d"))]);
        assert!(r.is_empty());
    }

    /// A disk whose appends fail once `fail` is set.
    #[derive(Clone, Default)]
    struct Flaky {
        disk: MemDisk,
        fail: std::rc::Rc<std::cell::Cell<bool>>,
    }

    impl Disk for Flaky {
        fn list(&mut self) -> std::io::Result<Vec<String>> {
            self.disk.list()
        }
        fn create(&mut self, n: &str) -> std::io::Result<()> {
            self.disk.create(n)
        }
        fn append(&mut self, n: &str, b: &[u8]) -> std::io::Result<()> {
            if self.fail.get() {
                return Err(std::io::Error::other("disk full"));
            }
            self.disk.append(n, b)
        }
        fn read(&mut self, n: &str) -> std::io::Result<Vec<u8>> {
            self.disk.read(n)
        }
        fn read_range(&mut self, n: &str, o: u64, l: usize) -> std::io::Result<Vec<u8>> {
            self.disk.read_range(n, o, l)
        }
        fn file_len(&mut self, n: &str) -> std::io::Result<u64> {
            self.disk.file_len(n)
        }
        fn sync(&mut self, n: &str) -> std::io::Result<()> {
            self.disk.sync(n)
        }
        fn truncate(&mut self, n: &str, l: u64) -> std::io::Result<()> {
            self.disk.truncate(n, l)
        }
        fn remove(&mut self, n: &str) -> std::io::Result<()> {
            self.disk.remove(n)
        }
        fn rename(&mut self, a: &str, b: &str) -> std::io::Result<()> {
            self.disk.rename(a, b)
        }
        fn sync_dir(&mut self) -> std::io::Result<()> {
            self.disk.sync_dir()
        }
    }

    #[test]
    fn a_sample_the_log_did_not_take_is_never_shown() {
        let flaky = Flaky::default();
        let mut m = DomainCore::new(
            1,
            vec![TopicCore::with_log(topic(QosLevel::LoggedStorage, 10), flaky.clone(), true).unwrap()],
        );
        let r = m.topic_mut(0).add_reader(ReaderQos::keep_all(100));
        deliver(&mut m, 0, &[(0, sample(1, b"", b"a"))]);
        flaky.fail.set(true);
        deliver(&mut m, 0, &[(0, sample(2, b"", b"b")), (0, sample(3, b"", b"c"))]);
        deliver(&mut m, 0, &[(0, sample(4, b"", b"d"))]);
        assert_eq!(r.take(10).iter().map(|s| s.position).collect::<Vec<_>>(), vec![1]);
        assert!(m.topic(0).fault().is_some());
        // Neither a new reader nor a joiner's snapshot gets the unlogged.
        let late = m.topic_mut(0).add_reader(ReaderQos::keep_all(100));
        assert!(late.is_empty());
        assert_eq!(m.topic(0).history().map(|s| s.position).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn a_restored_history_continues_the_replayed_lineage_without_duplicates() {
        let group = |n: u64, tag: u8| {
            let mut a =
                DomainCore::<MemDisk>::new(1, vec![TopicCore::new(topic(QosLevel::LoggedStorage, 10))]);
            deliver(&mut a, 0, &(1..=n).map(|i| (0, sample(i, b"", &[i as u8, tag]))).collect::<Vec<_>>());
            a
        };
        for (tag, want) in [(0u8, vec![6, 7, 8]), (1, vec![1, 2, 3, 4, 5, 6, 7, 8])] {
            // A member logged 1..=5, restarts and replays them.
            let disk = MemDisk::new();
            let mut m = DomainCore::new(
                1,
                vec![TopicCore::with_log(topic(QosLevel::LoggedStorage, 10), disk.clone(), true).unwrap()],
            );
            deliver(&mut m, 0, &(1..=5u64).map(|i| (0, sample(i, b"", &[i as u8, 0]))).collect::<Vec<_>>());
            drop(m);
            let mut j = DomainCore::new(
                1,
                vec![TopicCore::with_log(topic(QosLevel::LoggedStorage, 10), disk, true).unwrap()],
            );
            let r = j.topic_mut(0).add_reader(ReaderQos::keep_all(100));
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s2 = seen.clone();
            j.topic_mut(0).add_in_place(Box::new(move |i, _| s2.lock().unwrap().push(i.position)));
            assert_eq!(r.take(100).len(), 5, "the replayed history");
            seen.lock().unwrap().clear();
            // The group's history: the same lineage (tag 0) or another one.
            j.restore(0, &group(8, tag).snapshot(0)).unwrap();
            let got: Vec<u64> = r.take(100).iter().map(|s| s.position).collect();
            assert_eq!(got, want, "lineage {tag}: the reader");
            assert_eq!(*seen.lock().unwrap(), want, "lineage {tag}: in place");
        }
    }

    #[test]
    fn a_whole_topic_restart_starts_a_new_lineage_and_keeps_the_old_log() {
        let disk = MemDisk::new();
        let mut m = DomainCore::new(
            1,
            vec![TopicCore::with_log(topic(QosLevel::LoggedStorage, 10), disk.clone(), true).unwrap()],
        );
        m.start_fresh().unwrap();
        let r = m.topic_mut(0).add_reader(ReaderQos::keep_all(100));
        deliver(&mut m, 0, &(1..=4u64).map(|i| (0, sample(i, b"", &[i as u8]))).collect::<Vec<_>>());
        assert_eq!(r.take(100).len(), 4);
        // Every member of the topic failed: no holder, an empty state.
        m.restore(0, &[]).unwrap();
        assert_eq!((m.topic(0).delivered(), m.topic(0).history().count()), (0, 0));
        deliver(&mut m, 5, &[(0, sample(1, b"", b"new"))]);
        let got = r.take(100);
        assert_eq!(got.len(), 1, "a reader gets position 1 of the new lineage");
        assert_eq!((got[0].position, got[0].data()), (1, &b"new"[..]));
        // The old lineage stays on disk; a restart replays the new one.
        let log = m.topic(0).log().unwrap();
        assert_eq!(log.last_index(), 1 + 4 + 1 + 1);
        disk.crash(3);
        let back = TopicCore::<MemDisk>::with_log(topic(QosLevel::LoggedStorage, 10), disk, true).unwrap();
        assert_eq!(back.delivered(), 1);
        assert_eq!(back.history().next().unwrap().data(), b"new");
    }
}
