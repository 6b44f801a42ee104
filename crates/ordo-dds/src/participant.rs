//! The DCPS-shaped API over one `ordo node` member: [`DomainParticipant`],
//! [`Topic`], [`DataWriter`], [`DataReader`], [`WaitSet`].
//!
//! # Invariants
//! - A participant is one vsync member (its [`Node`]): the topics of
//!   `[dds]` are its subgroups, in order ([`vsync_layout`]); its delivery
//!   upcall, snapshots and restores go to one [`DomainCore`].
//! - A writer builds each sample in the ring slot (one copy for `write`,
//!   none for `loan`/`write_with`), numbers it when the slot is taken (a
//!   refused send consumes no number), and never loses a sample it
//!   reported written unless this member fails (the view change resends).
//! - A reader decodes on `take`/`read`, never on the member's thread; a
//!   sample that does not decode as `T` is counted and skipped.

use crate::core::{
    DomainCore, InPlaceFn, ReaderQos, ReaderQueue, ReaderStatus, SampleInfo, Signal, StoredSample, TopicCore,
    TopicStats, topic_subgroup,
};
use crate::sample::{self, MAX_KEY};
use crate::types::{Pod, TopicType};
use ordo_fabric::MemberId;
use ordo_r2p2::disk::FsDisk;
use ordo_runtime::{Node, NodeApp, NodeStatus, OrdoConfig, QosLevel, TopicConfig, ViewSender};
use ordo_vsync::view::Declaration;
use ordo_vsync::{GroupConfig, SendError, SubgroupConfig};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum DdsError {
    /// The configuration is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// The member did not start.
    #[error("the member did not start: {0}")]
    Start(String),
    /// A logged topic's log did not open.
    #[error("topic {topic:?}: its log did not open: {why}")]
    Log {
        /// The topic.
        topic: String,
        /// Why.
        why: String,
    },
    /// No such topic in `[dds]`.
    #[error("no topic {0:?} in the domain")]
    UnknownTopic(String),
    /// The topic's `type_name` is another type's.
    #[error("topic {topic:?} carries {expected:?}, not {got:?}")]
    TypeMismatch {
        /// The topic.
        topic: String,
        /// Its type.
        expected: String,
        /// The type asked for.
        got: String,
    },
    /// This member is not among the topic's publishers.
    #[error("member {member} is not a publisher of {topic:?}")]
    NotAPublisher {
        /// This member.
        member: MemberId,
        /// The topic.
        topic: String,
    },
    /// This member is neither publisher nor subscriber of the topic.
    #[error("member {member} is not a member of topic {topic:?}")]
    NotASubscriber {
        /// This member.
        member: MemberId,
        /// The topic.
        topic: String,
    },
    /// The sample and its key do not fit the topic's `max_sample`.
    #[error(
        "sample of {len} bytes (key {key} bytes) exceeds the topic's max_sample {max} (key at most {MAX_KEY})"
    )]
    TooLarge {
        /// Data bytes.
        len: usize,
        /// Key bytes.
        key: usize,
        /// The bound.
        max: usize,
    },
    /// The window is full or a view change is under way: try again.
    #[error("the ring is full or a view change is under way")]
    WouldBlock,
    /// The writer waited its `max_blocking_time` in vain.
    #[error("no slot within {0:?}")]
    Timeout(Duration),
    /// This member left the group or failed.
    #[error("the member is no longer in the group: {0}")]
    Stopped(String),
    /// The group did not take this member's declaration of a topic (its
    /// name is taken by another definition, the catalogue is full, or no
    /// view change took it in time).
    #[error("topic {topic:?}: {why}")]
    Declare {
        /// The topic.
        topic: String,
        /// Why.
        why: String,
    },
    /// A loan of a type whose alignment the slot does not give.
    #[error("a {0}-aligned type cannot be loaned in place (at most 8)")]
    Alignment(usize),
}

/// Bytes a slot needs around a topic's largest sample.
pub fn slot_payload(max_sample: usize) -> usize {
    sample::HEADER + MAX_KEY + max_sample
}

/// The vsync subgroups of `config`'s topics, in order: members = its
/// publishers and subscribers in group order, senders = its publishers,
/// unordered delivery for `unordered`.
pub fn vsync_layout(config: &OrdoConfig) -> Vec<SubgroupConfig> {
    config.dds.topics.iter().map(|t| topic_subgroup(t, t.members(&config.group.members))).collect()
}

/// The directory of `topic`'s log at `member`.
pub fn log_dir(config: &OrdoConfig, member: MemberId, topic: &str) -> PathBuf {
    let safe: String = if topic.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && topic != "."
        && topic != ".."
    {
        topic.to_owned()
    } else {
        topic.bytes().map(|b| format!("{b:02x}")).collect()
    };
    config.dds.data_dir.join(format!("member-{member}")).join(safe)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct WriterShared {
    sender: ViewSender,
    next_seq: Mutex<u64>,
}

impl WriterShared {
    /// Builds and sends one sample without waiting: its sequence number.
    pub(crate) fn try_write_with(
        &self,
        max_sample: usize,
        key: &[u8],
        len: usize,
        build: impl FnOnce(&mut [u8]),
    ) -> Result<u64, DdsError> {
        if key.len() > MAX_KEY || len + key.len() > max_sample {
            return Err(DdsError::TooLarge { len, key: key.len(), max: max_sample });
        }
        let total = sample::encoded_len(key.len(), len);
        let mut next = lock(&self.next_seq);
        let seq = *next;
        let now = ordo_runtime::node::unix_ns();
        let r = self.sender.try_send_with(total, |buf| {
            sample::write_header(buf, seq, now, key);
            build(&mut buf[sample::data_offset(key.len())..]);
        });
        match r {
            Ok(()) => {
                *next += 1;
                Ok(seq)
            }
            Err(SendError::WouldBlock | SendError::Wedged) => Err(DdsError::WouldBlock),
            Err(e) => Err(DdsError::Stopped(e.to_string())),
        }
    }

    /// As `try_write_with`, waiting up to `max_blocking` for a slot.
    pub(crate) fn write_with(
        &self,
        max_sample: usize,
        max_blocking: Duration,
        key: &[u8],
        len: usize,
        build: impl FnOnce(&mut [u8]),
    ) -> Result<u64, DdsError> {
        let mut build = Some(build);
        let deadline = Instant::now() + max_blocking;
        let mut pause = Duration::from_micros(1);
        loop {
            match self.try_write_with(max_sample, key, len, |b| (build.take().expect("built once"))(b)) {
                Err(DdsError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_micros(200));
                }
                Err(DdsError::WouldBlock) => return Err(DdsError::Timeout(max_blocking)),
                r => return r,
            }
        }
    }
}

/// One member of a DDS domain: an `ordo node` vsync member whose subgroups
/// are the domain's topics.
pub struct DomainParticipant {
    config: OrdoConfig,
    me: MemberId,
    core: Arc<Mutex<DomainCore<FsDisk>>>,
    /// Writers' shared state by topic index (topics declared at run time
    /// get theirs when this member first writes them).
    writers: Mutex<Vec<Option<Arc<WriterShared>>>>,
    relay: Option<crate::relay::Relay>,
    node: Option<Node>,
}

/// Topic `t` at member `me` of `config`: with its log (opened and replayed)
/// when it is a logged topic `me` is in.
fn open_topic(config: &OrdoConfig, me: MemberId, t: &TopicConfig) -> Result<TopicCore<FsDisk>, String> {
    if t.qos != QosLevel::LoggedStorage || !(t.publishers.contains(&me) || t.subscribers.contains(&me)) {
        return Ok(TopicCore::new(t.clone()));
    }
    let dir = log_dir(config, me, &t.name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let disk = FsDisk::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    TopicCore::with_log(t.clone(), disk, config.dds.fsync).map_err(|e| format!("its log did not open: {e}"))
}

impl DomainParticipant {
    /// Validates `config` (`[dds]` included), opens the logged topics' logs
    /// (replaying them), and starts the member (joining a running group when
    /// `node.join`, which restores every topic's state first).
    pub fn new(config: &OrdoConfig) -> Result<DomainParticipant, DdsError> {
        config.validate_dds().map_err(|e| DdsError::Config(e.to_string()))?;
        let me = config.member.id;
        let mut c = config.clone();
        c.node.engine = ordo_runtime::NodeEngine::Vsync;
        c.node.send_rate = 0;
        c.vsync.subgroups = vsync_layout(config);
        let mut topics = Vec::new();
        for t in &config.dds.topics {
            let topic =
                open_topic(config, me, t).map_err(|why| DdsError::Log { topic: t.name.clone(), why })?;
            topics.push(topic);
        }
        let mut core = DomainCore::new(me, topics);
        if !config.node.join {
            // An original member of a new group: every topic's lineage
            // starts here (a joiner's starts with the state it restores).
            core.start_fresh().map_err(|why| DdsError::Log { topic: "*".into(), why })?;
        }
        let core = Arc::new(Mutex::new(core));
        let (a, b, d, e) = (core.clone(), core.clone(), core.clone(), core.clone());
        let template = GroupConfig {
            members: config.group.members.clone(),
            subgroups: vsync_layout(config),
            switches: config.vsync.switches,
        };
        let cat_config = config.clone();
        let app = NodeApp {
            template: Some(template),
            catalogue: Some(Box::new(move |t: &GroupConfig| {
                let added = lock(&e).catalogue(&t.subgroups, |topic| open_topic(&cat_config, me, topic));
                if added > 0 {
                    tracing::info!(member = me, added, topics = t.subgroups.len(), "topics declared");
                }
            })),
            on_deliver: Some(Box::new(move |view, batch| lock(&a).deliver(view, batch))),
            on_view: None,
            snapshot: Some(Box::new(move |g| lock(&b).snapshot(g))),
            restore: Some(Box::new(move |g, bytes| {
                if let Err(why) = lock(&d).restore(g, bytes) {
                    tracing::error!(topic = g, %why, "the group's state of a topic does not restore; kept what was here");
                }
            })),
        };
        let node = Node::start_with(&c, app).map_err(|e| DdsError::Start(e.to_string()))?;
        let writers: Vec<Option<Arc<WriterShared>>> = (config.dds.topics.iter().enumerate())
            .map(|(g, t)| {
                let sender = node.sender(g).filter(|_| t.publishers.contains(&me))?;
                Some(Arc::new(WriterShared { sender, next_seq: Mutex::new(1) }))
            })
            .collect();
        let relay = match config.dds.relay_addr(me) {
            Some(addr) => {
                let secret = config
                    .security
                    .load_client_secret()
                    .map_err(|e| DdsError::Config(format!("the client secret: {e}")))?
                    .ok_or_else(|| DdsError::Config("dds.relay needs a client secret".into()))?;
                let shared = crate::relay::RelayShared::new(
                    config.clone(),
                    me,
                    core.clone(),
                    writers.clone(),
                    &secret,
                );
                let r = crate::relay::Relay::start(addr, shared)
                    .map_err(|e| DdsError::Start(format!("relay on {addr}: {e}")))?;
                Some(r)
            }
            None => None,
        };
        Ok(DomainParticipant {
            config: config.clone(),
            me,
            core,
            writers: Mutex::new(writers),
            relay,
            node: Some(node),
        })
    }

    /// Where this member's relay for external clients listens, if it runs
    /// one (`dds.relay`).
    pub fn relay_addr(&self) -> Option<std::net::SocketAddr> {
        self.relay.as_ref().map(crate::relay::Relay::local_addr)
    }

    /// The relay's counters: clients now, clients dropped for falling
    /// behind, connections refused.
    pub fn relay_counters(&self) -> Option<(usize, u64, u64)> {
        self.relay.as_ref().map(|r| {
            let (d, f) = r.counters();
            (r.clients(), d, f)
        })
    }

    /// This member's id.
    pub fn member(&self) -> MemberId {
        self.me
    }

    /// The configuration it runs.
    pub fn config(&self) -> &OrdoConfig {
        &self.config
    }

    /// The member's status (view, members, state).
    pub fn status(&self) -> NodeStatus {
        self.node.as_ref().map(Node::status).unwrap_or_default()
    }

    /// Waits until the member runs in a view (a joiner: with its state).
    pub fn wait_running(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.status().state == "running" {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The topic `name` as type `T` (its `type_name`, when set, must be
    /// `T`'s): one in `[dds]` or declared by any participant so far.
    pub fn topic<T: TopicType>(&self, name: &str) -> Result<Topic<T>, DdsError> {
        let spec = {
            let core = lock(&self.core);
            let g = core.find(name).ok_or_else(|| DdsError::UnknownTopic(name.to_owned()))?;
            core.topic(g).config().clone()
        };
        if spec.max_sample == 0 {
            return Err(DdsError::UnknownTopic(name.to_owned()));
        }
        Topic::checked(spec)
    }

    /// Defines topic `t.name` (DCPS `create_topic`): if the domain has it
    /// (configured or declared), `t` must define it alike — QoS level,
    /// `max_sample`, `window`, `history` (storage levels) and `type_name`;
    /// if not, it is created — through a view change, as a vsync subgroup
    /// of its publishers and subscribers — when this member first creates
    /// a writer or reader of it. `t.publishers`/`t.subscribers` are not
    /// used (members declare themselves).
    pub fn create_topic<T: TopicType>(&self, t: TopicConfig) -> Result<Topic<T>, DdsError> {
        t.check().map_err(DdsError::Config)?;
        let wanted = topic_subgroup(&t, Vec::new());
        let core = lock(&self.core);
        if let Some(g) = core.find(&t.name) {
            let have = core.topic(g).config();
            if !topic_subgroup(have, Vec::new()).same_shape(&wanted) || have.max_sample == 0 {
                return Err(DdsError::Declare {
                    topic: t.name.clone(),
                    why: format!(
                        "the domain defines it otherwise ({}, max_sample {}, window {}, history {}, type {:?})",
                        have.qos.name(),
                        have.max_sample,
                        have.window,
                        have.history,
                        have.type_name
                    ),
                });
            }
            return Topic::checked(have.clone());
        }
        drop(core);
        Topic::checked(TopicConfig { publishers: Vec::new(), subscribers: Vec::new(), ..t })
    }

    /// The index of `topic`, with this member in it (as a publisher if
    /// `publisher`): declared through a view change if it is not yet.
    fn join_topic<T>(&self, topic: &Topic<T>, publisher: bool) -> Result<usize, DdsError> {
        {
            let core = lock(&self.core);
            if let Some(g) = core.find(&topic.name) {
                let c = core.topic(g).config();
                if c.publishers.contains(&self.me) || (!publisher && c.subscribers.contains(&self.me)) {
                    return Ok(g);
                }
            }
        }
        let node = self.node.as_ref().ok_or_else(|| DdsError::Stopped("stopped".into()))?;
        let d = Declaration::of(&topic_subgroup(&topic.spec, Vec::new()), publisher);
        let timeout =
            Duration::from_millis(self.config.node.tick_ms.max(1) * 400).max(Duration::from_secs(10));
        node.declare(d, timeout).map_err(|why| DdsError::Declare { topic: topic.name.clone(), why })
    }

    /// A writer of `topic`: this member publishes it (a publisher in
    /// `[dds]`, or declared one now through a view change).
    pub fn create_writer<T: TopicType>(&self, topic: &Topic<T>) -> Result<DataWriter<T>, DdsError> {
        let g = self.join_topic(topic, true)?;
        let mut writers = lock(&self.writers);
        if writers.len() <= g {
            writers.resize(g + 1, None);
        }
        if writers[g].is_none() {
            let sender = self
                .node
                .as_ref()
                .and_then(|n| n.sender(g))
                .ok_or(DdsError::NotAPublisher { member: self.me, topic: topic.name.clone() })?;
            writers[g] = Some(Arc::new(WriterShared { sender, next_seq: Mutex::new(1) }));
        }
        let shared = writers[g].clone().expect("set above");
        Ok(DataWriter {
            shared,
            max_sample: topic.spec.max_sample,
            max_blocking: Duration::from_secs(1),
            _t: PhantomData,
        })
    }

    /// A reader of `topic` (this member publishes or subscribes it, or
    /// declares itself a subscriber now through a view change, and then
    /// receives the topic's state first). On a storage topic it starts
    /// with the history this member holds.
    pub fn create_reader<T: TopicType>(
        &self,
        topic: &Topic<T>,
        qos: ReaderQos,
    ) -> Result<DataReader<T>, DdsError> {
        let g = self.join_topic(topic, false)?;
        let queue = lock(&self.core).topic_mut(g).add_reader(qos);
        Ok(DataReader { queue, topic: topic.name.clone(), decode_errors: AtomicU64::new(0), _t: PhantomData })
    }

    /// Subscribes `f` in place: it is called on the member's thread with
    /// each sample's info and bytes where they lie in the ring slot (after
    /// the log's sync on a logged topic) — no copy, no queue, no wake-up
    /// (the paper's delivery upcall; `ddsperf`'s listener mode). `f` must
    /// not block or call into this participant. Unsubscribed when the
    /// returned handle is dropped. Declares this member a subscriber if it
    /// is not in the topic yet.
    pub fn subscribe_in_place<T>(
        &self,
        topic: &Topic<T>,
        f: impl FnMut(&SampleInfo, &[u8]) + Send + 'static,
    ) -> Result<InPlaceSubscription, DdsError> {
        let g = self.join_topic(topic, false)?;
        let f: InPlaceFn = Box::new(f);
        let id = lock(&self.core).topic_mut(g).add_in_place(f);
        Ok(InPlaceSubscription { core: self.core.clone(), topic: g, id })
    }

    /// The names of the domain's topics this member knows (configured and
    /// declared so far), in order.
    pub fn topic_names(&self) -> Vec<String> {
        lock(&self.core).topics().iter().map(|t| t.config().name.clone()).collect()
    }

    /// Counters of `topic` at this member.
    pub fn topic_stats<T>(&self, topic: &Topic<T>) -> TopicStats {
        let core = lock(&self.core);
        core.find(&topic.name).map(|g| core.topic(g).stats()).unwrap_or_default()
    }

    /// Why `topic` stopped at this member, if it did (its log failed, or
    /// the group's state did not restore).
    pub fn fault<T>(&self, topic: &Topic<T>) -> Option<String> {
        let core = lock(&self.core);
        core.find(&topic.name).and_then(|g| core.topic(g).fault().map(str::to_owned))
    }

    /// Leaves the group gracefully (the others install a view without it).
    pub fn leave(&self) {
        if let Some(n) = &self.node {
            n.leave();
        }
    }

    /// Waits up to `timeout` for the member to stop; why it did.
    pub fn wait(&self, timeout: Duration) -> Option<ordo_runtime::NodeExit> {
        self.node.as_ref().and_then(|n| n.wait(timeout))
    }

    /// Stops the member (and its relay).
    pub fn stop(mut self) {
        if let Some(mut r) = self.relay.take() {
            r.stop();
        }
        if let Some(n) = self.node.take() {
            n.stop();
        }
    }
}

/// An in-place subscription ([`DomainParticipant::subscribe_in_place`]);
/// dropping it unsubscribes.
pub struct InPlaceSubscription {
    core: Arc<Mutex<DomainCore<FsDisk>>>,
    topic: usize,
    id: u64,
}

impl Drop for InPlaceSubscription {
    fn drop(&mut self) {
        lock(&self.core).topic_mut(self.topic).remove_in_place(self.id);
    }
}

/// A topic of the domain, typed.
pub struct Topic<T> {
    name: String,
    /// Its definition (members not kept: they change with declarations).
    spec: TopicConfig,
    qos: QosLevel,
    max_sample: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T: TopicType> Topic<T> {
    /// `spec` as type `T`: its `type_name`, when set, must be `T`'s.
    fn checked(spec: TopicConfig) -> Result<Topic<T>, DdsError> {
        if !spec.type_name.is_empty() && spec.type_name != T::type_name() {
            return Err(DdsError::TypeMismatch {
                topic: spec.name.clone(),
                expected: spec.type_name.clone(),
                got: T::type_name(),
            });
        }
        let spec = TopicConfig { publishers: Vec::new(), subscribers: Vec::new(), ..spec };
        Ok(Topic {
            name: spec.name.clone(),
            qos: spec.qos,
            max_sample: spec.max_sample,
            spec,
            _t: PhantomData,
        })
    }
}

impl<T> Topic<T> {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its QoS level.
    pub fn qos(&self) -> QosLevel {
        self.qos
    }
    /// Its largest sample (data and key).
    pub fn max_sample(&self) -> usize {
        self.max_sample
    }
}

/// Writes samples of one topic.
pub struct DataWriter<T> {
    shared: Arc<WriterShared>,
    max_sample: usize,
    max_blocking: Duration,
    _t: PhantomData<fn(&T)>,
}

impl<T: TopicType> DataWriter<T> {
    /// How long `write` waits for a slot (DDS reliability
    /// `max_blocking_time`; default 1 s).
    pub fn set_max_blocking_time(&mut self, d: Duration) {
        self.max_blocking = d;
    }

    /// Publishes `sample` (serialized straight into the ring slot), waiting
    /// up to the max blocking time for a slot; its sequence number.
    pub fn write(&self, sample: &T) -> Result<u64, DdsError> {
        let key = sample.key();
        self.write_with(&key, sample.encoded_len(), |out| sample.encode(out))
    }

    /// As [`write`](Self::write), but never waits: `WouldBlock` when no slot
    /// is free now.
    pub fn try_write(&self, sample: &T) -> Result<u64, DdsError> {
        let key = sample.key();
        self.try_write_with(&key, sample.encoded_len(), |out| sample.encode(out))
    }

    /// Publishes a `len`-byte sample of instance `key` that `build`
    /// constructs in place in the ring slot (spindle §IV-F: no copy).
    pub fn write_with(&self, key: &[u8], len: usize, build: impl FnOnce(&mut [u8])) -> Result<u64, DdsError> {
        self.shared.write_with(self.max_sample, self.max_blocking, key, len, build)
    }

    /// As [`write_with`](Self::write_with), never waiting.
    pub fn try_write_with(
        &self,
        key: &[u8],
        len: usize,
        build: impl FnOnce(&mut [u8]),
    ) -> Result<u64, DdsError> {
        self.shared.try_write_with(self.max_sample, key, len, build)
    }
}

impl<P: bytemuck::Pod + Send> DataWriter<Pod<P>> {
    /// Constructs the sample in place in the ring slot and publishes it (the
    /// loan API: `build` gets the slot's bytes as a `P`, holding unspecified
    /// values — set every field). Waits like [`write`](Self::write).
    pub fn loan(&self, build: impl FnOnce(&mut P)) -> Result<u64, DdsError> {
        if std::mem::align_of::<P>() > 8 {
            return Err(DdsError::Alignment(std::mem::align_of::<P>()));
        }
        self.write_with(&[], std::mem::size_of::<P>(), |b| build(bytemuck::from_bytes_mut(b)))
    }
}

/// A sample and its info.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<T> {
    /// The data.
    pub data: T,
    /// Its info.
    pub info: SampleInfo,
}

/// Reads samples of one topic.
pub struct DataReader<T> {
    queue: Arc<ReaderQueue>,
    topic: String,
    decode_errors: AtomicU64,
    _t: PhantomData<fn() -> T>,
}

impl<T: TopicType> DataReader<T> {
    fn decode(&self, s: &StoredSample, was_read: bool) -> Option<Sample<T>> {
        match T::decode(s.data()) {
            Ok(data) => Some(Sample { data, info: SampleInfo::of(s, was_read) }),
            Err(why) => {
                self.decode_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(topic = %self.topic, %why, "a sample does not decode as this reader's type; skipped");
                None
            }
        }
    }

    /// Removes and returns up to `max` samples, oldest first.
    pub fn take(&self, max: usize) -> Vec<Sample<T>> {
        self.queue.take(max).iter().filter_map(|s| self.decode(s, false)).collect()
    }

    /// Returns up to `max` samples, leaving them (marked read).
    pub fn read(&self, max: usize) -> Vec<Sample<T>> {
        self.queue.read(max).iter().filter_map(|(s, was)| self.decode(s, *was)).collect()
    }

    /// Removes up to `max` samples and shows each one's serialized bytes
    /// without decoding or copying them.
    pub fn take_with(&self, max: usize, mut f: impl FnMut(&SampleInfo, &[u8])) -> usize {
        let got = self.queue.take(max);
        for s in &got {
            f(&SampleInfo::of(s, false), s.data());
        }
        got.len()
    }

    /// Waits up to `timeout` for a sample; whether one is held.
    pub fn wait(&self, timeout: Duration) -> bool {
        self.queue.wait(timeout)
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Its counters, and samples that did not decode.
    pub fn status(&self) -> (ReaderStatus, u64) {
        (self.queue.status(), self.decode_errors.load(Ordering::Relaxed))
    }

    /// Calls `f` on the member's thread whenever samples were queued
    /// (DDS `on_data_available`); `f` must not block. `None` removes it.
    pub fn set_listener(&self, f: Option<Box<dyn FnMut() + Send>>) {
        self.queue.set_listener(f);
    }
}

impl<P: bytemuck::Pod + Send> DataReader<Pod<P>> {
    /// Removes up to `max` samples and shows each in place (no copy).
    pub fn take_in_place(&self, max: usize, mut f: impl FnMut(&SampleInfo, &P)) -> usize {
        let got = self.queue.take(max);
        let mut n = 0;
        for s in &got {
            let d = s.data();
            if d.len() == std::mem::size_of::<P>()
                && let Ok(p) = bytemuck::try_from_bytes::<P>(d)
            {
                f(&SampleInfo::of(s, false), p);
                n += 1;
            } else if d.len() == std::mem::size_of::<P>() {
                let p: P = bytemuck::pod_read_unaligned(d);
                f(&SampleInfo::of(s, false), &p);
                n += 1;
            } else {
                self.decode_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        n
    }
}

/// Waits on several readers at once (DDS `WaitSet` with read conditions).
#[derive(Default)]
pub struct WaitSet {
    signal: Arc<Signal>,
    readers: Vec<Arc<ReaderQueue>>,
}

impl WaitSet {
    /// An empty wait set.
    pub fn new() -> WaitSet {
        WaitSet::default()
    }

    /// Adds a reader; returns its index in [`wait`](Self::wait)'s answer.
    pub fn attach<T>(&mut self, reader: &DataReader<T>) -> usize {
        reader.queue.attach(&self.signal);
        self.readers.push(reader.queue.clone());
        self.readers.len() - 1
    }

    /// Waits up to `timeout` until an attached reader holds a sample; the
    /// indices of those that do (empty on timeout).
    pub fn wait(&self, timeout: Duration) -> Vec<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.signal.generation();
            let ready: Vec<usize> =
                self.readers.iter().enumerate().filter(|(_, r)| !r.is_empty()).map(|(i, _)| i).collect();
            let left = deadline.saturating_duration_since(Instant::now());
            if !ready.is_empty() || left.is_zero() {
                return ready;
            }
            self.signal.wait_past(seen, left);
        }
    }
}
