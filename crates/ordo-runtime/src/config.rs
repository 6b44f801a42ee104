//! The configuration: a TOML file (like Derecho's `derecho.cfg`) with
//! overrides from the environment and the command line.
//!
//! # Loading ([`OrdoConfig::load`])
//! 1. The file (if any) is parsed and checked against the schema: a syntax
//!    error, a value of the wrong type or an unknown key is reported with the
//!    file name and the parser's line and column. Every key has a default,
//!    so the file may be empty or absent.
//! 2. Overrides are applied, as dotted keys, to the parsed TOML before it is
//!    deserialized: first environment variables `ORDO__<SECTION>__<KEY>`
//!    (the prefix `ORDO__` is removed, `__` separates levels, names are
//!    lower-cased: `ORDO__FABRIC__BACKEND=tcp` sets `fabric.backend`), then
//!    CLI `--set key=value` pairs in order. So precedence is
//!    **file < environment < CLI**, and a later CLI pair beats an earlier one.
//!    A value is read as a TOML literal when it is one (`42`, `true`,
//!    `[1, 2, 3]`, `"quoted"`, `{ id = 1, addr = "h:1" }`), else as a string
//!    (`tcp`, `127.0.0.1:7000`); quote it to force a string.
//! 3. [`OrdoConfig::validate`] checks what types cannot: membership, sizes,
//!    ranges, the selected backend's section.
//!
//! Operator mistakes are [`ConfigError`]s with a message naming the key;
//! nothing here panics on input.

use ordo_agent::IdleStrategy;
use ordo_agent::{CorePinning, RunnerOptions, ThreadingMode};
use ordo_fabric::MemberId;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Prefix of environment variables that override config keys.
pub const ENV_PREFIX: &str = "ORDO__";

/// Separator of levels in an environment variable name.
pub const ENV_SEPARATOR: &str = "__";

/// A member's whole configuration. See the crate docs for an example file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrdoConfig {
    /// `[member]`: who this process is.
    pub member: MemberConfig,
    /// `[group]`: the top-level group.
    pub group: GroupConfig,
    /// `[fabric]`: the one-sided write fabric.
    pub fabric: FabricConfig,
    /// `[runtime]`: threads and idling.
    pub runtime: RuntimeConfig,
    /// `[vsync]`: the atomic multicast engine's subgroups and switches.
    pub vsync: VsyncConfig,
    /// `[security]`: where the cluster secret comes from (SECURITY.md).
    pub security: SecurityConfig,
    /// `[node]`: the member daemon (`ordo node`): control plane, views,
    /// status endpoint, load.
    pub node: NodeConfig,
    /// `[kv]`: the key-value service (`ordo kv serve`): its RESP address,
    /// every replica's, reads, bounds.
    pub kv: KvConfig,
    /// `[dds]`: `ordo-dds` publish/subscribe — its topics, their QoS levels,
    /// publishers and subscribers (one vsync subgroup per topic).
    pub dds: DdsConfig,
}

/// `[dds]`: the topics of an `ordo-dds` domain. Each topic is one vsync
/// subgroup (spindle §IV-F) of its publishers (the senders) and
/// subscribers; the DDS builds `vsync.subgroups` from this list, so the two
/// are never set together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DdsConfig {
    /// `data_dir`: where `logged-storage` topics keep their logs, one
    /// directory per member and topic (default `ordo-dds`, relative to the
    /// working directory).
    pub data_dir: PathBuf,
    /// `fsync`: logged samples are fsynced before they count as stable
    /// (default true; false keeps them in the page cache only — benchmarks).
    pub fsync: bool,
    /// `relay`: `[{ id, addr }]`, the address each member's relay for
    /// external clients listens on (empty: no relay).
    pub relay: Vec<TcpPeer>,
    /// `max_relay_queue`: samples a relay holds for one external
    /// subscriber before it drops that subscriber (default 4096).
    pub max_relay_queue: usize,
    /// `[[dds.topics]]`.
    pub topics: Vec<TopicConfig>,
}

impl Default for DdsConfig {
    fn default() -> Self {
        DdsConfig {
            data_dir: PathBuf::from("ordo-dds"),
            fsync: true,
            relay: Vec::new(),
            max_relay_queue: 4096,
            topics: Vec::new(),
        }
    }
}

impl DdsConfig {
    /// The relay address of `member`, if it has one.
    pub fn relay_addr(&self, member: MemberId) -> Option<&str> {
        self.relay.iter().find(|p| p.id == member).map(|p| p.addr.as_str())
    }
}

/// The four QoS levels of spindle §IV-F (`dds.topics[].qos`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QosLevel {
    /// Delivered on receipt, then discarded (DDS BEST_EFFORT-like order:
    /// per publisher only; VOLATILE durability).
    Unordered,
    /// Total order and failure atomicity, discarded after delivery
    /// (RELIABLE, VOLATILE durability, plus total order).
    #[default]
    AtomicMulticast,
    /// As atomic multicast, and kept in every member's memory up to
    /// `history` samples; late joiners catch up (TRANSIENT durability).
    VolatileStorage,
    /// As volatile storage, and appended to a checksummed log on disk before
    /// a sample counts as stable; replayed after a restart (PERSISTENT).
    LoggedStorage,
}

impl QosLevel {
    /// All four, in the paper's order.
    pub const ALL: [QosLevel; 4] =
        [QosLevel::Unordered, QosLevel::AtomicMulticast, QosLevel::VolatileStorage, QosLevel::LoggedStorage];

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            QosLevel::Unordered => "unordered",
            QosLevel::AtomicMulticast => "atomic-multicast",
            QosLevel::VolatileStorage => "volatile-storage",
            QosLevel::LoggedStorage => "logged-storage",
        }
    }

    /// Whether members keep samples (volatile and logged storage).
    pub fn stores(self) -> bool {
        matches!(self, QosLevel::VolatileStorage | QosLevel::LoggedStorage)
    }

    /// Whether delivery is totally ordered (all but unordered).
    pub fn ordered(self) -> bool {
        self != QosLevel::Unordered
    }
}

impl std::str::FromStr for QosLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        QosLevel::ALL.into_iter().find(|q| q.name() == s).ok_or_else(|| {
            format!("unknown QoS level {s:?} (unordered, atomic-multicast, volatile-storage, logged-storage)")
        })
    }
}

fn default_max_sample() -> usize {
    10 * 1024
}
fn default_window() -> usize {
    100
}
fn default_history() -> usize {
    1000
}

/// `[[dds.topics]]`: one topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    /// `name`: 1..=255 bytes, unique in the domain.
    pub name: String,
    /// `qos`: `unordered`, `atomic-multicast` (default), `volatile-storage`
    /// or `logged-storage`.
    #[serde(default)]
    pub qos: QosLevel,
    /// `publishers`: members that may write (the subgroup's senders, in
    /// this rank order); at least one.
    pub publishers: Vec<MemberId>,
    /// `subscribers`: members that read (and, for the storage levels, keep
    /// the history).
    #[serde(default)]
    pub subscribers: Vec<MemberId>,
    /// `max_sample`: the largest serialized sample, key included, in bytes
    /// (default 10240).
    #[serde(default = "default_max_sample")]
    pub max_sample: usize,
    /// `window`: ring slots per publisher (default 100).
    #[serde(default = "default_window")]
    pub window: usize,
    /// `history`: samples every member keeps (storage levels; default 1000).
    #[serde(default = "default_history")]
    pub history: usize,
    /// `type_name`: the sample type participants must declare the topic
    /// with (empty, the default: any).
    #[serde(default)]
    pub type_name: String,
}

impl TopicConfig {
    /// Publishers and subscribers, each once, in `group` order.
    pub fn members(&self, group: &[MemberId]) -> Vec<MemberId> {
        group
            .iter()
            .copied()
            .filter(|m| self.publishers.contains(m) || self.subscribers.contains(m))
            .collect()
    }

    /// Checks what the topic itself must satisfy (name, sizes, history);
    /// members are checked against the group by `validate_dds`.
    pub fn check(&self) -> Result<(), String> {
        let t = self;
        if t.name.is_empty() || t.name.len() > 255 || t.name.chars().any(char::is_control) {
            return Err(format!("topic name {:?}: 1..=255 bytes, no control characters", t.name));
        }
        if t.max_sample == 0 || t.max_sample > 64 << 20 {
            return Err(format!("topic {:?}: max_sample {} is not in 1..=64 MiB", t.name, t.max_sample));
        }
        if t.window == 0 || t.window > 1 << 16 {
            return Err(format!("topic {:?}: window {} is not in 1..=65536", t.name, t.window));
        }
        if t.qos.stores() && t.history == 0 {
            return Err(format!("topic {:?}: history is 0 for a storage QoS", t.name));
        }
        if t.type_name.len() > 255 {
            return Err(format!("topic {:?}: type_name is longer than 255 bytes", t.name));
        }
        Ok(())
    }
}

/// `[kv]`: `ordo kv serve`, the replicated hash table (acuerdo §4.3)
/// spoken as Redis (RESP2/RESP3) on every replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvConfig {
    /// `listen`: `host:port` this replica's RESP server binds (default
    /// `127.0.0.1:6379`).
    pub listen: String,
    /// `replicas`: `[{ id, addr }]`, every replica's RESP address (this one
    /// included): a follower forwards writes and linearizable reads to the
    /// leader's, or names it in a `MOVED` redirect.
    pub replicas: Vec<TcpPeer>,
    /// `redirect`: a follower answers writes with `-MOVED 0 host:port`
    /// (the leader's address) instead of forwarding them (default false).
    pub redirect: bool,
    /// `reads`: `"linearizable"` (default: the leader answers after a
    /// read-index round confirms it still leads; followers forward reads)
    /// or `"local"` (every replica answers from its own copy: fast and
    /// possibly stale; for tests of the checker and for users who accept
    /// stale reads). A `READONLY` connection reads locally either way.
    pub reads: KvReads,
    /// `max_clients`: connections served at once (default 1024); more are
    /// closed at accept.
    pub max_clients: usize,
    /// `max_key_bytes`: longest key (default 16384).
    pub max_key_bytes: usize,
    /// `max_value_bytes`: longest value (default 7168); a log entry must
    /// fit the group's ring slots (`max_entry_bytes`).
    pub max_value_bytes: usize,
    /// `max_entry_bytes`: the largest log entry (the acuerdo group's
    /// `max_payload`, default 8192): a write whose entry is larger is
    /// refused with an error.
    pub max_entry_bytes: usize,
    /// `max_args`: most arguments in one command (default 1024).
    pub max_args: usize,
    /// `max_request_bytes`: largest request, and most unparsed bytes a
    /// connection may hold (default 1 MiB); beyond it the connection gets
    /// an error and is closed.
    pub max_request_bytes: usize,
    /// `max_pending`: requests one connection may have in flight
    /// (pipelined, unanswered) before the server stops reading from it
    /// (default 1024).
    pub max_pending: usize,
    /// `window`: slots of each acuerdo ring (default 64).
    pub window: usize,
    /// `max_outstanding`: log entries the leader keeps proposed but not
    /// committed (default 256).
    pub max_outstanding: u32,
    /// `spins`, `yields`: idle duty cycles the replica's agent spins, then
    /// yields, before it parks on its doorbell (default 20 and 5: replicas
    /// that outnumber the cores must not hold a core another replica needs
    /// for the same round; raise them on dedicated cores for latency).
    pub spins: u32,
    /// See `spins`.
    pub yields: u32,
    /// `durability`: `"memory"` (default; the paper: a write is committed
    /// once a quorum holds it in memory, so losing a quorum at once loses
    /// it) or `"disk"`: a replica pushes its Accept only after the entry is
    /// in its log on disk (group-committed, one fsync per agent poll), so a
    /// full-cluster restart recovers every acknowledged write.
    pub durability: KvDurability,
    /// `data_dir`: where a `disk` replica keeps its log, snapshot and
    /// promise (required with `durability = "disk"` and with `engine =
    /// "raft"`, whose log lives there in both modes — a Raft replica that
    /// forgot its vote could vote twice; refused otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
    /// `snapshot_entries`: a `disk` replica snapshots its table and drops
    /// the log below it after this many applied entries (default 100000;
    /// with `engine = "raft"`, also only once the log since the last
    /// snapshot is as large as that snapshot).
    pub snapshot_entries: u64,
    /// `engine`: `"acuerdo"` (default: the group's members on the fabric,
    /// acuerdo §4.3), `"raft"` (R3P2: Raft behind R2P2's
    /// `REPLICATED_ROUTE` over UDP on `kv.raft`; the same state machine;
    /// reads go through the log; needs the cluster secret
    /// (`security.secret_file`): it seals the replicas' datagrams) or
    /// `"vsync"` (one ordered subgroup of every replica, as `ordo node`
    /// runs it: `[node]` control addresses, view changes, joins; every
    /// replica takes writes; `memory` durability only).
    pub engine: KvEngine,
    /// `raft`: `[{ id, addr }]`, every replica's R3P2 UDP address (with
    /// `engine = "raft"`).
    pub raft: Vec<TcpPeer>,
    /// `failure_timeout_ms`: an acuerdo replica whose heartbeat has not
    /// moved for this long is suspected and a new leader elected; with
    /// `engine = "raft"`, Raft's minimum election timeout (each drawn from
    /// `[t, 2t)`). 0
    /// (default): 30 ms in `memory` mode, 1000 ms in `disk` mode — an
    /// fsync behind a busy disk can take far longer than 30 ms, and a
    /// replica waiting on one must not be voted out (etcd's election
    /// timeout is 1 s for the same reason).
    pub failure_timeout_ms: u64,
}

/// `kv.engine`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvEngine {
    /// Acuerdo over the fabric.
    #[default]
    Acuerdo,
    /// Raft inside R2P2 (R3P2) over UDP.
    Raft,
    /// Virtual synchrony: one ordered subgroup of every replica (`[node]`
    /// control plane, view changes, joins), no leader.
    Vsync,
}

/// `kv.durability`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvDurability {
    /// Committed = a quorum holds it in memory (acuerdo §4.3).
    #[default]
    Memory,
    /// Committed = a quorum holds it in its log on disk (fsynced).
    Disk,
}

/// `kv.reads`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvReads {
    /// Reads at the leader after a read-index confirmation round.
    #[default]
    Linearizable,
    /// Every replica reads its own copy (possibly stale).
    Local,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            listen: "127.0.0.1:6379".into(),
            replicas: Vec::new(),
            redirect: false,
            reads: KvReads::Linearizable,
            max_clients: 1024,
            max_key_bytes: 16 << 10,
            max_value_bytes: 7 << 10,
            max_entry_bytes: 8 << 10,
            max_args: 1024,
            max_request_bytes: 1 << 20,
            max_pending: 1024,
            window: 64,
            max_outstanding: 256,
            spins: 20,
            yields: 5,
            durability: KvDurability::Memory,
            data_dir: None,
            snapshot_entries: 100_000,
            engine: KvEngine::Acuerdo,
            raft: Vec::new(),
            failure_timeout_ms: 0,
        }
    }
}

impl KvConfig {
    /// The failure (acuerdo) or election (raft) timeout in ms
    /// (`failure_timeout_ms`, or its automatic value for the durability
    /// mode).
    pub fn failure_timeout_ms(&self) -> u64 {
        match (self.failure_timeout_ms, self.durability) {
            (0, KvDurability::Memory) => 30,
            (0, KvDurability::Disk) => 1000,
            (t, _) => t,
        }
    }

    /// The RESP address of replica `id`.
    pub fn replica_addr(&self, id: MemberId) -> Option<&str> {
        self.replicas.iter().find(|p| p.id == id).map(|p| p.addr.as_str())
    }
}

/// `[node]`: what `ordo node` needs beyond the group: every member's
/// control-plane address (view changes travel there, sealed with the
/// cluster secret), the view change's timing, the status endpoint, and an
/// optional load generator and delivery log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// `control`: `[{ id, addr }]`, one per group member (this one
    /// included): where its control plane listens (TCP).
    pub control: Vec<TcpPeer>,
    /// `status`: `host:port` of this member's HTTP endpoint (`/metrics` in
    /// Prometheus text, `/status` in JSON); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// `tick_ms`: the view change's clock (default 20): heartbeats every 2
    /// ticks, retransmissions every tick.
    pub tick_ms: u64,
    /// `patience`: ticks without an answer before the member waited on is
    /// suspected (default 4); a member silent for twice that is suspected
    /// too (missed heartbeats).
    pub patience: u32,
    /// `send_rate`: messages per second this member sends in every
    /// subgroup it sends in (default 0: none). A load generator for demos,
    /// tests and `ordo bench failover`.
    pub send_rate: u64,
    /// `message_bytes`: size of those messages (default 1024; at least 8,
    /// at most the subgroup's `max_payload`).
    pub message_bytes: usize,
    /// `delivery_log`: append one line per delivered message to this file
    /// (`view subgroup sender index bytes digest`); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_log: Option<PathBuf>,
    /// `join`: start by joining a running group (a new member, or a
    /// restarted one: a new incarnation) instead of forming view 0 with
    /// every member; it receives its subgroups' state before it delivers
    /// (default false). vsync only: an acuerdo member rejoins by itself.
    pub join: bool,
    /// `engine`: `"vsync"` (default: the `[vsync]` group with views) or
    /// `"acuerdo"` (quorum atomic broadcast over `group.members`: the
    /// leader orders everything; a restarted member catches up).
    pub engine: NodeEngine,
    /// `incarnation`: this start's incarnation; 0 (default): automatic
    /// (vsync: 0 for an original member, the clock for a joiner; acuerdo:
    /// 1). An acuerdo member that restarts needs a larger one than before,
    /// below 2^15 (`ordo cluster restart` counts them).
    pub incarnation: u64,
}

/// `node.engine`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeEngine {
    /// Derecho's atomic multicast with views (`ordo_vsync`).
    #[default]
    Vsync,
    /// Acuerdo (`ordo_acuerdo`).
    Acuerdo,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            control: Vec::new(),
            status: None,
            tick_ms: 20,
            patience: 4,
            send_rate: 0,
            message_bytes: 1024,
            delivery_log: None,
            join: false,
            engine: NodeEngine::Vsync,
            incarnation: 0,
        }
    }
}

impl NodeConfig {
    /// The control address of `member`.
    pub fn control_addr(&self, member: MemberId) -> Option<&str> {
        self.control.iter().find(|p| p.id == member).map(|p| p.addr.as_str())
    }
}

/// `[security]`: the cluster secret every member holds. It is read from a
/// file or an environment variable named here, never from the command line,
/// and never logged. The tcp backend needs it (each connection proves it
/// both ways before a frame is applied); the shm backend is protected by
/// file ownership and modes instead (SECURITY.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// `secret_file`: a file holding the secret (mode 0600, owned by this
    /// user, not a link). `ordo secret new FILE` makes one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// `secret_env`: the name of an environment variable holding it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// `allow_unauthenticated`: run the tcp backend without a secret
    /// (anyone who reaches a member's port can write to its region). For
    /// closed test networks only; default false.
    pub allow_unauthenticated: bool,
    /// `client_secret_file`: the clients' secret (the password of `AUTH`
    /// on `ordo kv serve`); same file rules as `secret_file`. Absent (and
    /// no `client_secret_env`): clients need no password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret_file: Option<PathBuf>,
    /// `client_secret_env`: an environment variable holding it instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret_env: Option<String>,
}

impl SecurityConfig {
    /// Reads the clients' secret (`Ok(None)` when none is configured).
    pub fn load_client_secret(&self) -> Result<Option<ordo_auth::Secret>, ordo_auth::SecretError> {
        let source = match (&self.client_secret_file, &self.client_secret_env) {
            (Some(path), _) => Some(ordo_auth::SecretSource::File(path.clone())),
            (None, Some(var)) => Some(ordo_auth::SecretSource::Env(var.clone())),
            (None, None) => None,
        };
        source.map(|s| ordo_auth::Secret::load(&s)).transpose()
    }

    /// Where the secret is read from, if configured.
    pub fn source(&self) -> Option<ordo_auth::SecretSource> {
        match (&self.secret_file, &self.secret_env) {
            (Some(path), _) => Some(ordo_auth::SecretSource::File(path.clone())),
            (None, Some(var)) => Some(ordo_auth::SecretSource::Env(var.clone())),
            (None, None) => None,
        }
    }

    /// Reads the secret (`Ok(None)` when none is configured).
    pub fn load_secret(&self) -> Result<Option<ordo_auth::Secret>, ordo_auth::SecretError> {
        self.source().map(|s| ordo_auth::Secret::load(&s)).transpose()
    }
}

/// `[vsync]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VsyncConfig {
    /// `subgroups`: `[{ members, senders, window, max_payload, mode }]`.
    /// Empty (default): one subgroup of every member, every member a
    /// sender, with `window` and `max_payload` below.
    pub subgroups: Vec<ordo_vsync::SubgroupConfig>,
    /// `window`: slots per sender in the default subgroup (default 100, the
    /// paper's choice for 10 KiB messages, spindle §IV-A2).
    pub window: usize,
    /// `max_payload`: largest message of the default subgroup (default 10240).
    pub max_payload: usize,
    /// `[vsync.switches]`: the Spindle optimizations (all on by default).
    pub switches: ordo_vsync::Switches,
}

impl Default for VsyncConfig {
    fn default() -> Self {
        VsyncConfig {
            subgroups: Vec::new(),
            window: 100,
            max_payload: 10 * 1024,
            switches: Default::default(),
        }
    }
}

/// `[member]`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemberConfig {
    /// `id`: this member's id (default 0). Must be in `group.members`.
    pub id: MemberId,
}

/// `[group]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupConfig {
    /// `members`: every member's id, this one included (default `[0]`).
    pub members: Vec<MemberId>,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig { members: vec![0] }
    }
}

/// `fabric.backend`
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// Shared memory on one host (`ordo-fabric-shm`).
    #[default]
    Shm,
    /// TCP streams, across hosts (`ordo-fabric-tcp`).
    Tcp,
    /// libfabric RMA (`ordo-fabric-ofi`): `verbs;ofi_rxm` for InfiniBand
    /// and RoCE, `tcp;ofi_rxm`, `shm`. Needs a build with the `ofi`
    /// feature; its set-up path uses the `fabric.tcp` addresses.
    Ofi,
}

/// `[fabric]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FabricConfig {
    /// `backend`: `"shm"` (default), `"tcp"` or `"ofi"`.
    pub backend: Backend,
    /// `region_bytes`: length of every member's region; a positive multiple
    /// of 64 (default 1 MiB).
    pub region_bytes: usize,
    /// `write_timeout_ms`: a signaled write not completed in this time
    /// raises a suspicion of its peer (default 1000).
    pub write_timeout_ms: u64,
    /// `[fabric.shm]`
    pub shm: ShmConfig,
    /// `[fabric.tcp]`
    pub tcp: TcpConfig,
    /// `[fabric.ofi]`
    pub ofi: OfiConfig,
}

/// `[fabric.ofi]` (`fabric.backend = "ofi"`). Members exchange their
/// libfabric addresses and memory keys over an authenticated set-up path
/// on the addresses of `[fabric.tcp]` (`listen`, `peers`), which must be
/// given as for the tcp backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OfiConfig {
    /// `provider`: the libfabric provider, as `fi_info -p` names it
    /// (default `"tcp"`; `"verbs"` on InfiniBand or RoCE; with `endpoint =
    /// "rdm"`: `"verbs;ofi_rxm"`, `"tcp;ofi_rxm"`, `"shm"`).
    pub provider: String,
    /// `endpoint`: `"msg"` (connected endpoints, RDMA's reliable
    /// connections; the default) or `"rdm"` (reliable datagrams). The
    /// default is connected: on `tcp;ofi_rxm` an Acuerdo follower was seen
    /// to skip ring entries in about 1 of 40 kill tests (see README).
    pub endpoint: OfiEndpoint,
}

/// `fabric.ofi.endpoint`
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OfiEndpoint {
    /// Reliable datagrams (`FI_EP_RDM`).
    Rdm,
    /// Connected endpoints (`FI_EP_MSG`).
    #[default]
    Msg,
}

impl Default for OfiConfig {
    fn default() -> Self {
        OfiConfig { provider: "tcp".to_owned(), endpoint: OfiEndpoint::Msg }
    }
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            backend: Backend::Shm,
            region_bytes: 1 << 20,
            write_timeout_ms: 1000,
            shm: ShmConfig::default(),
            tcp: TcpConfig::default(),
            ofi: OfiConfig::default(),
        }
    }
}

impl FabricConfig {
    /// `write_timeout_ms` as a duration.
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }
}

/// `[fabric.shm]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShmConfig {
    /// `dir`: directory of the region files, a tmpfs (default `/dev/shm`).
    pub dir: PathBuf,
    /// `cluster`: name shared by one group's members; separates groups on a
    /// host (default `"ordo"`). Letters, digits, `-`, `_`, `.` only.
    pub cluster: String,
    /// `liveness_check_us`: least time between two liveness checks of one
    /// peer's process (default 1000).
    pub liveness_check_us: u64,
    /// `open_timeout_ms`: how long start-up waits for every peer's region
    /// file (default 10000).
    pub open_timeout_ms: u64,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            dir: PathBuf::from("/dev/shm"),
            cluster: "ordo".to_owned(),
            liveness_check_us: 1000,
            open_timeout_ms: 10_000,
        }
    }
}

impl ShmConfig {
    /// `liveness_check_us` as a duration.
    pub fn liveness_check_interval(&self) -> Duration {
        Duration::from_micros(self.liveness_check_us)
    }

    /// `open_timeout_ms` as a duration.
    pub fn open_timeout(&self) -> Duration {
        Duration::from_millis(self.open_timeout_ms)
    }
}

/// `[fabric.tcp]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpConfig {
    /// `listen`: `host:port` this member accepts peers on. If absent, the
    /// address of this member's own entry in `peers` (so one file listing
    /// every member can serve the whole group). No default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `peers`: `[{ id, addr }]`, one per other group member (an entry for
    /// this member itself is allowed and only used as the listen default).
    pub peers: Vec<TcpPeer>,
    /// `max_frame_bytes`: largest frame accepted or sent (default 1 MiB).
    pub max_frame_bytes: usize,
    /// `send_buffer_bytes`: bytes queued per peer before posting reports
    /// back-pressure (default 4 MiB); at least `max_frame_bytes`.
    pub send_buffer_bytes: usize,
    /// `connect_timeout_ms`: how long start-up waits for links to every peer
    /// (default 10000).
    pub connect_timeout_ms: u64,
    /// `reconnect_interval_ms`: time between reconnection attempts
    /// (default 100).
    pub reconnect_interval_ms: u64,
    /// `handshake_timeout_ms`: a connection that has not proved the
    /// cluster secret within this time is closed (default 1000).
    pub handshake_timeout_ms: u64,
    /// `max_handshakes_per_source`: handshakes in progress from one source
    /// address; beyond it the oldest is closed (default 8).
    pub max_handshakes_per_source: usize,
    /// `[fabric.tcp.tls]`: TLS for every link (absent: plain TCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
}

/// `[fabric.tcp.tls]`: mutual TLS with certificates from one CA. Each
/// member's certificate names its IP address (a SAN); see SECURITY.md.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// `cert`: this member's certificate chain (PEM).
    pub cert: PathBuf,
    /// `key`: its private key (PEM, PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// `ca`: the CA certificate(s) every member's certificate chains to (PEM).
    pub ca: PathBuf,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            listen: None,
            peers: Vec::new(),
            max_frame_bytes: 1 << 20,
            send_buffer_bytes: 4 << 20,
            connect_timeout_ms: 10_000,
            reconnect_interval_ms: 100,
            handshake_timeout_ms: 1000,
            max_handshakes_per_source: 8,
            tls: None,
        }
    }
}

impl TcpConfig {
    /// The address `member` listens on: `listen`, else its entry in `peers`.
    pub fn listen_addr(&self, member: MemberId) -> Option<&str> {
        self.listen.as_deref().or_else(|| self.peer_addr(member))
    }

    /// The address of `member` in `peers`.
    pub fn peer_addr(&self, member: MemberId) -> Option<&str> {
        self.peers.iter().find(|p| p.id == member).map(|p| p.addr.as_str())
    }

    /// `connect_timeout_ms` as a duration.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// `reconnect_interval_ms` as a duration.
    pub fn reconnect_interval(&self) -> Duration {
        Duration::from_millis(self.reconnect_interval_ms)
    }

    /// `handshake_timeout_ms` as a duration.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }
}

/// One entry of `fabric.tcp.peers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpPeer {
    /// The peer's member id.
    pub id: MemberId,
    /// Its `host:port`.
    pub addr: String,
}

/// `[runtime]`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// `threading`: `"dedicated"` (default) or `"shared"`.
    pub threading: ThreadingMode,
    /// `pin_cores`: pin runner threads to cores, round-robin (default false).
    pub pin_cores: bool,
    /// `[runtime.idle]`
    pub idle: IdleConfig,
}

/// `runtime.idle.strategy`
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdleStrategyKind {
    /// [`IdleStrategy::BusySpin`]
    BusySpin,
    /// [`IdleStrategy::SpinThenYield`]
    SpinThenYield,
    /// [`IdleStrategy::BackoffPark`]
    BackoffPark,
    /// [`IdleStrategy::HAND_OFF`] (its fixed spins, yields and parks; the
    /// numbers of this section are ignored): for hosts whose polling
    /// threads outnumber their cores.
    HandOff,
    /// `hand-off` when this host's online CPUs are fewer than the group's
    /// members (every member on this host, as `ordo cluster up` and
    /// `ordo demo` run them), else `backoff-park` with this section's
    /// numbers (default).
    #[default]
    Auto,
}

/// `[runtime.idle]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdleConfig {
    /// `strategy`: `"busy-spin"`, `"spin-then-yield"`, `"backoff-park"`,
    /// `"hand-off"` or `"auto"` (default).
    pub strategy: IdleStrategyKind,
    /// `spins`: idle duty cycles spent spinning (default 200).
    pub spins: u32,
    /// `yields`: idle duty cycles spent yielding after that (backoff-park
    /// only; default 50).
    pub yields: u32,
    /// `park_min_us`: first park timeout, > 0 (default 20).
    pub park_min_us: u64,
    /// `park_max_us`: longest park timeout, ≥ `park_min_us` (default 1000).
    /// Bounds how late a parked member notices work nobody rang for.
    pub park_max_us: u64,
}

impl Default for IdleConfig {
    fn default() -> Self {
        let IdleStrategy::BackoffPark { spins, yields, park_min, park_max } = IdleStrategy::DEFAULT else {
            unreachable!("the default idle strategy is backoff-park")
        };
        IdleConfig {
            strategy: IdleStrategyKind::Auto,
            spins,
            yields,
            park_min_us: park_min.as_micros() as u64,
            park_max_us: park_max.as_micros() as u64,
        }
    }
}

impl IdleConfig {
    /// The runtime strategy this section describes (`auto` decided for
    /// `members_on_host` polling members).
    pub fn strategy_for(&self, members_on_host: usize) -> IdleStrategy {
        let backoff = IdleStrategy::BackoffPark {
            spins: self.spins,
            yields: self.yields,
            park_min: Duration::from_micros(self.park_min_us),
            park_max: Duration::from_micros(self.park_max_us),
        };
        match self.strategy {
            IdleStrategyKind::Auto => IdleStrategy::for_threads_on_host(members_on_host, backoff),
            IdleStrategyKind::HandOff => IdleStrategy::HAND_OFF,
            IdleStrategyKind::BusySpin => IdleStrategy::BusySpin,
            IdleStrategyKind::SpinThenYield => IdleStrategy::SpinThenYield { spins: self.spins },
            IdleStrategyKind::BackoffPark => backoff,
        }
    }

    /// The runtime strategy this section describes (`auto`: as for a
    /// one-member group, which never outnumbers the CPUs: `backoff-park`).
    pub fn strategy(&self) -> IdleStrategy {
        self.strategy_for(1)
    }
}

/// Where an override came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OverrideOrigin {
    /// The environment variable of this name.
    Env(String),
    /// A CLI `--set` pair.
    Cli,
}

impl fmt::Display for OverrideOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverrideOrigin::Env(var) => write!(f, "environment variable {var}"),
            OverrideOrigin::Cli => f.write_str("--set"),
        }
    }
}

/// Why a configuration could not be loaded. Every message names the file
/// or the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has a value of the wrong type, or an
    /// unknown key. `line` and `column` are 1-based.
    #[error("{}: {message}", location(path, *line, *column))]
    Parse {
        /// The file.
        path: PathBuf,
        /// Line of the error, when the parser knows it.
        line: Option<usize>,
        /// Column of the error, when the parser knows it.
        column: Option<usize>,
        /// The parser's message.
        message: String,
    },
    /// An override is malformed, or gives a key a bad value or an unknown key.
    #[error("invalid override `{text}` from {origin}: {reason}")]
    Override {
        /// Where it came from.
        origin: OverrideOrigin,
        /// The override as given (`key=value`).
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// The configuration is well-formed but inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(#[from] ValidationError),
}

fn location(path: &Path, line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("{}:{l}:{c}", path.display()),
        _ => path.display().to_string(),
    }
}

/// A well-formed but inconsistent configuration; [`key`](Self::key) names
/// the key at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The `[node]` section is wrong.
    #[error("`node`: {reason}")]
    NodeControl {
        /// What is wrong.
        reason: String,
    },
    /// The `[kv]` section is wrong.
    #[error("`kv`: {reason}")]
    Kv {
        /// What is wrong.
        reason: String,
    },
    /// The `[dds]` section is wrong.
    #[error("`dds`: {reason}")]
    Dds {
        /// What is wrong.
        reason: String,
    },
    /// `group.members` is empty.
    #[error("`group.members` is empty; a group needs at least one member")]
    EmptyGroup,
    /// The `[vsync]` section does not describe a valid group.
    #[error("`vsync`: {reason}")]
    Vsync {
        /// What is wrong.
        reason: String,
    },
    /// `group.members` repeats an id.
    #[error("`group.members` lists member {id} more than once")]
    DuplicateMember {
        /// The repeated member id.
        id: MemberId,
    },
    /// `member.id` is not a member of the group.
    #[error("`member.id` = {id} is not in `group.members` = {members:?}")]
    MemberNotInGroup {
        /// The value of `member.id`.
        id: MemberId,
        /// The value of `group.members`.
        members: Vec<MemberId>,
    },
    /// `fabric.region_bytes` is 0 or not a multiple of 64.
    #[error("`fabric.region_bytes` = {value} must be a positive multiple of 64")]
    RegionBytes {
        /// The value of `fabric.region_bytes`, in bytes.
        value: usize,
    },
    /// A key that must be positive is 0.
    #[error("`{key}` must be greater than 0")]
    Zero {
        /// The dotted key that is 0.
        key: &'static str,
    },
    /// `runtime.idle.park_min_us` > `runtime.idle.park_max_us`.
    #[error(
        "`runtime.idle.park_min_us` = {park_min_us} is greater than `runtime.idle.park_max_us` = {park_max_us}"
    )]
    ParkRange {
        /// The value of `runtime.idle.park_min_us`, in microseconds.
        park_min_us: u64,
        /// The value of `runtime.idle.park_max_us`, in microseconds.
        park_max_us: u64,
    },
    /// `fabric.shm.dir` is empty.
    #[error("`fabric.shm.dir` is empty")]
    ShmDir,
    /// `fabric.shm.cluster` is empty or has characters unfit for a file name.
    #[error(
        "`fabric.shm.cluster` = {value:?} must be non-empty and use only letters, digits, '-', '_' and '.'"
    )]
    ShmCluster {
        /// The value of `fabric.shm.cluster`.
        value: String,
    },
    /// The tcp backend has no listen address.
    #[error("the tcp backend needs `fabric.tcp.listen` (or an entry for member {id} in `fabric.tcp.peers`)")]
    TcpListenMissing {
        /// This member's id (`member.id`).
        id: MemberId,
    },
    /// An address is not `host:port`.
    #[error("`{key}` = {value:?} is not a host:port address: {reason}")]
    BadAddress {
        /// The dotted key holding the address.
        key: String,
        /// The address as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A group member (other than this one) has no entry in `fabric.tcp.peers`.
    #[error("`fabric.tcp.peers` has no entry for group member {id}")]
    TcpPeerMissing {
        /// The group member without an entry.
        id: MemberId,
    },
    /// `fabric.tcp.peers` names a member not in the group.
    #[error("`fabric.tcp.peers` lists member {id}, which is not in `group.members`")]
    TcpPeerNotInGroup {
        /// The member id listed in `fabric.tcp.peers` but not in the group.
        id: MemberId,
    },
    /// `fabric.tcp.peers` names a member twice.
    #[error("`fabric.tcp.peers` lists member {id} more than once")]
    TcpPeerDuplicate {
        /// The member id listed more than once.
        id: MemberId,
    },
    /// A frame could never fit in the send buffer.
    #[error(
        "`fabric.tcp.max_frame_bytes` = {max_frame_bytes} is greater than `fabric.tcp.send_buffer_bytes` = {send_buffer_bytes}"
    )]
    FrameExceedsSendBuffer {
        /// The value of `fabric.tcp.max_frame_bytes`, in bytes.
        max_frame_bytes: usize,
        /// The value of `fabric.tcp.send_buffer_bytes`, in bytes.
        send_buffer_bytes: usize,
    },
    /// `fabric.backend = "ofi"` in a build without the `ofi` feature, or
    /// without a provider.
    #[error("fabric.backend = \"ofi\": {reason}")]
    Ofi {
        /// What is wrong.
        reason: String,
    },
    /// The tcp backend has no secret and unauthenticated links were not allowed.
    #[error(
        "the tcp and ofi backends need the cluster secret: set `security.secret_file` (make one with `ordo secret new FILE`) or `security.secret_env`, or `security.allow_unauthenticated = true` on a closed test network"
    )]
    SecretMissing,
    /// Both a secret file and a secret variable are named.
    #[error("`security.secret_file` and `security.secret_env` are both set; name one")]
    SecretTwice,
}

impl ValidationError {
    /// The dotted key at fault.
    pub fn key(&self) -> String {
        match self {
            ValidationError::EmptyGroup | ValidationError::DuplicateMember { .. } => "group.members".into(),
            ValidationError::MemberNotInGroup { .. } => "member.id".into(),
            ValidationError::RegionBytes { .. } => "fabric.region_bytes".into(),
            ValidationError::Zero { key } => (*key).into(),
            ValidationError::ParkRange { .. } => "runtime.idle.park_min_us".into(),
            ValidationError::ShmDir => "fabric.shm.dir".into(),
            ValidationError::ShmCluster { .. } => "fabric.shm.cluster".into(),
            ValidationError::TcpListenMissing { .. } => "fabric.tcp.listen".into(),
            ValidationError::BadAddress { key, .. } => key.clone(),
            ValidationError::TcpPeerMissing { .. }
            | ValidationError::TcpPeerNotInGroup { .. }
            | ValidationError::TcpPeerDuplicate { .. } => "fabric.tcp.peers".into(),
            ValidationError::FrameExceedsSendBuffer { .. } => "fabric.tcp.max_frame_bytes".into(),
            ValidationError::Vsync { .. } => "vsync".into(),
            ValidationError::SecretMissing => "security.secret_file".into(),
            ValidationError::Ofi { .. } => "fabric.ofi.provider".into(),
            ValidationError::SecretTwice => "security.secret_env".into(),
            ValidationError::NodeControl { .. } => "node".into(),
            ValidationError::Kv { .. } => "kv".into(),
            ValidationError::Dds { .. } => "dds".into(),
        }
    }
}

/// One parsed override: `key` (dotted) = `value`.
struct Override {
    origin: OverrideOrigin,
    text: String,
    path: Vec<String>,
    value: toml::Value,
}

impl Override {
    fn error(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::Override { origin: self.origin.clone(), text: self.text.clone(), reason: reason.into() }
    }
}

fn parse_override(
    origin: OverrideOrigin,
    text: String,
    key: &str,
    raw: &str,
) -> Result<Override, ConfigError> {
    let bad = |reason: &str| ConfigError::Override {
        origin: origin.clone(),
        text: text.clone(),
        reason: reason.to_owned(),
    };
    let path: Vec<String> = key.split('.').map(str::to_owned).collect();
    let valid_segment =
        |s: &String| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !path.iter().all(valid_segment) {
        return Err(bad("the key must be dotted names of letters, digits, '_' and '-'"));
    }
    let value = parse_literal(raw);
    Ok(Override { origin, text, path, value })
}

/// A TOML literal if `raw` is one, else the string itself.
fn parse_literal(raw: &str) -> toml::Value {
    raw.trim().parse::<toml::Value>().unwrap_or_else(|_| toml::Value::String(raw.to_owned()))
}

/// `ORDO__FABRIC__BACKEND` → `fabric.backend`; `None` for other variables.
fn env_key(var: &str) -> Option<String> {
    let rest = var.strip_prefix(ENV_PREFIX)?;
    Some(rest.split(ENV_SEPARATOR).map(str::to_ascii_lowercase).collect::<Vec<_>>().join("."))
}

fn collect_overrides(
    env: impl IntoIterator<Item = (String, String)>,
    cli_sets: &[String],
) -> Result<Vec<Override>, ConfigError> {
    let mut env: Vec<(String, String)> =
        env.into_iter().filter(|(var, _)| var.starts_with(ENV_PREFIX)).collect();
    // Deterministic order whatever order the environment comes in.
    env.sort();
    let mut overrides = Vec::with_capacity(env.len() + cli_sets.len());
    for (var, value) in env {
        let key = env_key(&var).expect("filtered on the prefix");
        let text = format!("{key}={value}");
        overrides.push(parse_override(OverrideOrigin::Env(var), text, &key, &value)?);
    }
    for set in cli_sets {
        let Some((key, value)) = set.split_once('=') else {
            return Err(ConfigError::Override {
                origin: OverrideOrigin::Cli,
                text: set.clone(),
                reason: "expected key=value".to_owned(),
            });
        };
        overrides.push(parse_override(OverrideOrigin::Cli, set.clone(), key.trim(), value)?);
    }
    Ok(overrides)
}

/// Sets `over.path` in `table`, creating tables on the way.
fn apply_override(table: &mut toml::Table, over: &Override) -> Result<(), ConfigError> {
    let (leaf, parents) = over.path.split_last().expect("a key has at least one segment");
    let mut current = table;
    for (depth, segment) in parents.iter().enumerate() {
        let entry = current.entry(segment.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(t) => t,
            _ => {
                let prefix = over.path[..=depth].join(".");
                return Err(over.error(format!("`{prefix}` is a value, not a section")));
            }
        };
    }
    current.insert(leaf.clone(), over.value.clone());
    Ok(())
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn parse_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let (line, column) = match error.span() {
        Some(span) => {
            let (l, c) = line_column(text, span.start);
            (Some(l), Some(c))
        }
        None => (None, None),
    };
    ConfigError::Parse { path: path.to_owned(), line, column, message: error.message().trim().to_owned() }
}

impl OrdoConfig {
    /// Loads the configuration: the file at `path` (all defaults if `None`),
    /// then overrides from `env` (pass `std::env::vars()`; only `ORDO__*`
    /// variables are read), then `cli_sets` (`key=value`), then
    /// [`validate`](Self::validate). See the module docs.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        cli_sets: &[String],
    ) -> Result<OrdoConfig, ConfigError> {
        let (text, path) = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|source| ConfigError::Read { path: p.to_owned(), source })?;
                (text, p.to_owned())
            }
            None => (String::new(), PathBuf::from("<no config file>")),
        };
        Self::load_str(&text, &path, env, cli_sets)
    }

    /// Like [`load`](Self::load) with the file's contents given; `origin`
    /// names them in errors.
    pub fn load_str(
        text: &str,
        origin: &Path,
        env: impl IntoIterator<Item = (String, String)>,
        cli_sets: &[String],
    ) -> Result<OrdoConfig, ConfigError> {
        // The file alone, against the schema: errors carry line and column.
        let from_file: OrdoConfig = toml::from_str(text).map_err(|e| parse_error(origin, text, &e))?;
        let overrides = collect_overrides(env, cli_sets)?;
        let config = if overrides.is_empty() {
            from_file
        } else {
            let table: toml::Table = text.parse().map_err(|e| parse_error(origin, text, &e))?;
            let mut merged = table.clone();
            for over in &overrides {
                apply_override(&mut merged, over)?;
            }
            match toml::Value::Table(merged).try_into::<OrdoConfig>() {
                Ok(config) => config,
                Err(error) => return Err(blame_override(&table, &overrides, &error)),
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// The configuration as a TOML document (every key, defaults included);
    /// loading it gives back an equal configuration.
    pub fn to_toml_string(&self) -> String {
        toml::to_string_pretty(self).expect("an OrdoConfig always serializes to TOML")
    }

    /// The vsync group this configuration describes (`[vsync]` over
    /// `group.members`), validated.
    pub fn vsync_group(&self) -> Result<ordo_vsync::GroupConfig, ValidationError> {
        let v = &self.vsync;
        let subgroups = if v.subgroups.is_empty() {
            vec![ordo_vsync::SubgroupConfig {
                name: String::new(),
                descriptor: Vec::new(),
                members: self.group.members.clone(),
                senders: self.group.members.clone(),
                window: v.window,
                max_payload: v.max_payload,
                mode: ordo_vsync::DeliveryMode::Ordered,
            }]
        } else {
            v.subgroups.clone()
        };
        let g =
            ordo_vsync::GroupConfig { members: self.group.members.clone(), subgroups, switches: v.switches };
        g.validate().map_err(|e| ValidationError::Vsync { reason: e.to_string() })?;
        Ok(g)
    }

    /// Checks what the types cannot. Only the section of the selected
    /// backend is checked beyond its types.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let members = &self.group.members;
        if members.is_empty() {
            return Err(ValidationError::EmptyGroup);
        }
        let mut seen = HashSet::new();
        for &id in members {
            if !seen.insert(id) {
                return Err(ValidationError::DuplicateMember { id });
            }
        }
        if !members.contains(&self.member.id) {
            return Err(ValidationError::MemberNotInGroup { id: self.member.id, members: members.clone() });
        }

        let fabric = &self.fabric;
        if fabric.region_bytes == 0 || !fabric.region_bytes.is_multiple_of(64) {
            return Err(ValidationError::RegionBytes { value: fabric.region_bytes });
        }
        positive(fabric.write_timeout_ms, "fabric.write_timeout_ms")?;
        match fabric.backend {
            Backend::Shm => self.validate_shm()?,
            Backend::Tcp => self.validate_tcp()?,
            Backend::Ofi => {
                if !cfg!(feature = "ofi") {
                    return Err(ValidationError::Ofi {
                        reason: "this build has no libfabric backend (build with `--features ofi`, which needs libfabric-dev)"
                            .into(),
                    });
                }
                if fabric.ofi.provider.trim().is_empty() {
                    return Err(ValidationError::Ofi { reason: "`fabric.ofi.provider` is empty".into() });
                }
                self.validate_tcp()?
            }
        }
        let security = &self.security;
        if security.secret_file.is_some() && security.secret_env.is_some() {
            return Err(ValidationError::SecretTwice);
        }
        if matches!(fabric.backend, Backend::Tcp | Backend::Ofi)
            && security.source().is_none()
            && !security.allow_unauthenticated
        {
            return Err(ValidationError::SecretMissing);
        }

        self.validate_node()?;
        let idle = &self.runtime.idle;
        positive(idle.park_min_us, "runtime.idle.park_min_us")?;
        positive(idle.park_max_us, "runtime.idle.park_max_us")?;
        if idle.park_min_us > idle.park_max_us {
            return Err(ValidationError::ParkRange {
                park_min_us: idle.park_min_us,
                park_max_us: idle.park_max_us,
            });
        }
        Ok(())
    }

    fn validate_node(&self) -> Result<(), ValidationError> {
        let node = &self.node;
        let mut seen = HashSet::new();
        for (i, peer) in node.control.iter().enumerate() {
            if !seen.insert(peer.id) {
                return Err(ValidationError::NodeControl {
                    reason: format!("member {} listed twice", peer.id),
                });
            }
            if !self.group.members.contains(&peer.id) {
                return Err(ValidationError::NodeControl {
                    reason: format!("member {} is not in group.members", peer.id),
                });
            }
            check_address(&format!("node.control[{i}].addr"), &peer.addr)?;
        }
        if let Some(status) = &node.status {
            check_address("node.status", status)?;
        }
        positive(node.tick_ms, "node.tick_ms")?;
        positive(u64::from(node.patience), "node.patience")?;
        if node.message_bytes < 8 {
            return Err(ValidationError::NodeControl {
                reason: format!("node.message_bytes {} is below 8", node.message_bytes),
            });
        }
        Ok(())
    }

    /// Checks what `ordo kv serve` needs beyond [`validate`](Self::validate).
    pub fn validate_kv(&self) -> Result<(), ValidationError> {
        self.validate()?;
        let kv = &self.kv;
        let bad = |reason: String| Err(ValidationError::Kv { reason });
        check_address("kv.listen", &kv.listen)?;
        if self.group.members.iter().any(|m| *m > 255) {
            return bad("acuerdo member ids are below 256".into());
        }
        for &id in &self.group.members {
            match kv.replica_addr(id) {
                None if self.group.members.len() > 1 => {
                    return bad(format!("kv.replicas has no address for member {id}"));
                }
                Some(a) => check_address("kv.replicas", a)?,
                None => {}
            }
        }
        if let Some(p) = kv.replicas.iter().find(|p| !self.group.members.contains(&p.id)) {
            return bad(format!("kv.replicas names {}, which is not in group.members", p.id));
        }
        for (key, v, lo) in [
            ("kv.max_clients", kv.max_clients, 1),
            ("kv.max_key_bytes", kv.max_key_bytes, 1),
            ("kv.max_args", kv.max_args, 3),
            ("kv.max_pending", kv.max_pending, 1),
            ("kv.window", kv.window, 2),
            ("kv.max_entry_bytes", kv.max_entry_bytes, 256),
        ] {
            if v < lo {
                return bad(format!("{key} is {v}; it must be at least {lo}"));
            }
        }
        // A SET's entry carries the key, the value and 64 bytes more; one
        // whose key and value together do not fit is refused when sent.
        if kv.max_value_bytes + 64 > kv.max_entry_bytes {
            return bad(format!(
                "kv.max_value_bytes {} does not fit kv.max_entry_bytes {} (an entry carries the key, the value and 64 bytes more)",
                kv.max_value_bytes, kv.max_entry_bytes
            ));
        }
        if kv.max_request_bytes < kv.max_value_bytes + kv.max_key_bytes + 64 {
            return bad(format!(
                "kv.max_request_bytes {} is below one SET of the largest key and value",
                kv.max_request_bytes
            ));
        }
        if kv.max_outstanding == 0 {
            return bad("kv.max_outstanding is 0".into());
        }
        match (kv.durability, &kv.data_dir) {
            (KvDurability::Disk, None) => {
                return bad("kv.durability is \"disk\" but kv.data_dir is not set".into());
            }
            (KvDurability::Disk, Some(d)) if d.trim().is_empty() => return bad("kv.data_dir is empty".into()),
            (KvDurability::Memory, Some(d)) if kv.engine != KvEngine::Raft => {
                return bad(format!(
                    "kv.data_dir is {d:?} but kv.durability is \"memory\" (nothing would be written there); set durability = \"disk\""
                ));
            }
            _ => {}
        }
        if kv.snapshot_entries == 0 {
            return bad("kv.snapshot_entries is 0".into());
        }
        if kv.failure_timeout_ms > 0 && kv.failure_timeout_ms < 3 {
            return bad(format!(
                "kv.failure_timeout_ms is {}; it must be 0 (automatic) or at least 3",
                kv.failure_timeout_ms
            ));
        }
        if kv.engine == KvEngine::Vsync {
            if kv.durability == KvDurability::Disk {
                return bad("kv.engine \"vsync\" keeps the table in memory: durability = \"disk\" is for acuerdo and raft".into());
            }
            // As `ordo node` runs it: a control address per member.
            let mut daemon = self.clone();
            daemon.node.engine = NodeEngine::Vsync;
            daemon.node.send_rate = 0;
            daemon.validate_node_daemon()?;
        }
        if kv.engine == KvEngine::Raft {
            if kv.data_dir.is_none() {
                return bad("kv.engine \"raft\" keeps its log (and its vote) in kv.data_dir: set it (with durability = \"memory\" it is written but not fsynced)".into());
            }
            for &id in &self.group.members {
                match kv.raft.iter().find(|p| p.id == id) {
                    None => {
                        return bad(format!(
                            "kv.engine is \"raft\" but kv.raft has no address for member {id}"
                        ));
                    }
                    Some(p) => check_address("kv.raft", &p.addr)?,
                }
            }
            if let Some(p) = kv.raft.iter().find(|p| !self.group.members.contains(&p.id)) {
                return bad(format!("kv.raft names {}, which is not in group.members", p.id));
            }
            let sec = &self.security;
            if sec.secret_file.is_none() && sec.secret_env.is_none() && !sec.allow_unauthenticated {
                return bad("kv.engine \"raft\" needs the cluster secret (security.secret_file): it seals the replicas' datagrams".into());
            }
        }
        let sec = &self.security;
        if sec.client_secret_file.is_some() && sec.client_secret_env.is_some() {
            return bad("set security.client_secret_file or security.client_secret_env, not both".into());
        }
        Ok(())
    }

    /// Checks what an `ordo-dds` participant needs beyond
    /// [`validate`](Self::validate): at least one topic, unique names of
    /// 1..=255 bytes, publishers (at least one) and subscribers in the
    /// group, sizes above zero and below the region, a control address for
    /// every member, relay addresses of group members, and no hand-made
    /// `vsync.subgroups` (the topics are the layout).
    pub fn validate_dds(&self) -> Result<(), ValidationError> {
        self.validate()?;
        let dds = &self.dds;
        let bad = |reason: String| Err(ValidationError::Dds { reason });
        if !self.vsync.subgroups.is_empty() {
            return bad("`vsync.subgroups` is set: with `[dds]` the topics are the subgroups".into());
        }
        if let Some(&id) = self.group.members.iter().find(|&&id| self.node.control_addr(id).is_none()) {
            return bad(format!("member {id} has no node.control address"));
        }
        let mut names = HashSet::new();
        for t in &dds.topics {
            t.check().map_err(|reason| ValidationError::Dds { reason })?;
            if !names.insert(t.name.as_str()) {
                return bad(format!("topic {:?} is declared twice", t.name));
            }
            if t.publishers.is_empty() {
                return bad(format!("topic {:?} has no publishers", t.name));
            }
            for m in t.publishers.iter().chain(&t.subscribers) {
                if !self.group.members.contains(m) {
                    return bad(format!("topic {:?}: member {m} is not in group.members", t.name));
                }
            }
            let mut seen = HashSet::new();
            if let Some(m) = t.publishers.iter().find(|m| !seen.insert(**m)) {
                return bad(format!("topic {:?}: publisher {m} listed twice", t.name));
            }
        }
        for (i, r) in dds.relay.iter().enumerate() {
            if !self.group.members.contains(&r.id) {
                return bad(format!("dds.relay[{i}]: member {} is not in group.members", r.id));
            }
            check_address(&format!("dds.relay[{i}].addr"), &r.addr)?;
        }
        if dds.max_relay_queue == 0 {
            return bad("max_relay_queue is 0".into());
        }
        if !dds.relay.is_empty()
            && self.security.client_secret_file.is_none()
            && self.security.client_secret_env.is_none()
        {
            return bad("`dds.relay` serves external clients only with `security.client_secret_file` (or `client_secret_env`)".into());
        }
        if !dds.relay.is_empty()
            && let Some(t) = dds.topics.iter().find(|t| t.qos.stores() && t.history > dds.max_relay_queue)
        {
            return bad(format!(
                "topic {:?}: history {} exceeds max_relay_queue {} (a relay sends a new subscriber the history at once)",
                t.name, t.history, dds.max_relay_queue
            ));
        }
        Ok(())
    }

    /// Checks what `ordo node` needs beyond [`validate`](Self::validate): a
    /// control address for every member, and messages that fit every
    /// subgroup this member sends in when it generates load.
    pub fn validate_node_daemon(&self) -> Result<(), ValidationError> {
        self.validate()?;
        if self.node.engine == NodeEngine::Acuerdo {
            if self.node.message_bytes < 16 {
                return Err(ValidationError::NodeControl {
                    reason: format!("node.message_bytes {} is below 16 (acuerdo)", self.node.message_bytes),
                });
            }
            if self.group.members.iter().any(|m| *m > 255) {
                return Err(ValidationError::NodeControl {
                    reason: "acuerdo member ids are below 256".into(),
                });
            }
            return Ok(());
        }
        if let Some(&id) = self.group.members.iter().find(|&&id| self.node.control_addr(id).is_none()) {
            return Err(ValidationError::NodeControl {
                reason: format!("member {id} has no node.control address"),
            });
        }
        let group = self.vsync_group()?;
        if self.node.send_rate > 0 {
            for (g, s) in group.subgroups.iter().enumerate() {
                if s.senders.contains(&self.member.id) && s.max_payload < self.node.message_bytes {
                    return Err(ValidationError::NodeControl {
                        reason: format!(
                            "node.message_bytes {} exceeds subgroup {g}'s max_payload {}",
                            self.node.message_bytes, s.max_payload
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn validate_shm(&self) -> Result<(), ValidationError> {
        let shm = &self.fabric.shm;
        if shm.dir.as_os_str().is_empty() {
            return Err(ValidationError::ShmDir);
        }
        let cluster_ok = !shm.cluster.is_empty()
            && shm.cluster.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !cluster_ok {
            return Err(ValidationError::ShmCluster { value: shm.cluster.clone() });
        }
        positive(shm.liveness_check_us, "fabric.shm.liveness_check_us")?;
        positive(shm.open_timeout_ms, "fabric.shm.open_timeout_ms")?;
        Ok(())
    }

    fn validate_tcp(&self) -> Result<(), ValidationError> {
        let tcp = &self.fabric.tcp;
        let me = self.member.id;
        if let Some(listen) = &tcp.listen {
            check_address("fabric.tcp.listen", listen)?;
        }
        let mut seen = HashSet::new();
        for (i, peer) in tcp.peers.iter().enumerate() {
            if !seen.insert(peer.id) {
                return Err(ValidationError::TcpPeerDuplicate { id: peer.id });
            }
            if !self.group.members.contains(&peer.id) {
                return Err(ValidationError::TcpPeerNotInGroup { id: peer.id });
            }
            check_address(&format!("fabric.tcp.peers[{i}].addr"), &peer.addr)?;
        }
        if tcp.listen_addr(me).is_none() {
            return Err(ValidationError::TcpListenMissing { id: me });
        }
        if let Some(&id) = self.group.members.iter().find(|&&id| id != me && !seen.contains(&id)) {
            return Err(ValidationError::TcpPeerMissing { id });
        }
        positive(tcp.max_frame_bytes as u64, "fabric.tcp.max_frame_bytes")?;
        positive(tcp.handshake_timeout_ms, "fabric.tcp.handshake_timeout_ms")?;
        positive(tcp.max_handshakes_per_source as u64, "fabric.tcp.max_handshakes_per_source")?;
        positive(tcp.send_buffer_bytes as u64, "fabric.tcp.send_buffer_bytes")?;
        if tcp.max_frame_bytes > tcp.send_buffer_bytes {
            return Err(ValidationError::FrameExceedsSendBuffer {
                max_frame_bytes: tcp.max_frame_bytes,
                send_buffer_bytes: tcp.send_buffer_bytes,
            });
        }
        positive(tcp.connect_timeout_ms, "fabric.tcp.connect_timeout_ms")?;
        positive(tcp.reconnect_interval_ms, "fabric.tcp.reconnect_interval_ms")?;
        Ok(())
    }

    /// `runtime.idle` as the runtime's strategy (`auto` decided by the
    /// group's size against this host's CPUs).
    pub fn idle_strategy(&self) -> IdleStrategy {
        self.runtime.idle.strategy_for(self.group.members.len())
    }

    /// `runtime.threading`.
    pub fn threading(&self) -> ThreadingMode {
        self.runtime.threading
    }

    /// `runtime.pin_cores` as a pinning policy.
    pub fn core_pinning(&self) -> CorePinning {
        if self.runtime.pin_cores { CorePinning::RoundRobin } else { CorePinning::None }
    }

    /// The [`RunnerOptions`] the `[runtime]` section describes.
    pub fn runner_options(&self) -> RunnerOptions {
        RunnerOptions::new(self.threading(), self.idle_strategy()).with_pinning(self.core_pinning())
    }

    /// Every member but this one, in increasing id order.
    pub fn peers(&self) -> Vec<MemberId> {
        let mut peers: Vec<MemberId> =
            self.group.members.iter().copied().filter(|&id| id != self.member.id).collect();
        peers.sort_unstable();
        peers
    }
}

fn positive(value: u64, key: &'static str) -> Result<(), ValidationError> {
    if value == 0 { Err(ValidationError::Zero { key }) } else { Ok(()) }
}

/// Checks `host:port` (a bracketed IPv6 host allowed); no name lookup.
fn check_address(key: &str, value: &str) -> Result<(), ValidationError> {
    let bad = |reason| ValidationError::BadAddress { key: key.to_owned(), value: value.to_owned(), reason };
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(bad("missing `:port`"));
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad("an IPv6 host must be in brackets"));
    }
    match port.parse::<u16>() {
        Ok(0) => Err(bad("port 0")),
        Ok(_) => Ok(()),
        Err(_) => Err(bad("the port is not a number in 1..=65535")),
    }
}

/// Finds the override to blame for a schema error after merging: the first
/// in-effect override (not replaced by a later one of the same key) that
/// breaks the file's table on its own; reports that override's own error.
fn blame_override(file: &toml::Table, overrides: &[Override], error: &toml::de::Error) -> ConfigError {
    let one_line = |e: &toml::de::Error| e.to_string().trim().replace('\n', "; ");
    for (i, over) in overrides.iter().enumerate() {
        if overrides[i + 1..].iter().any(|later| later.path == over.path) {
            continue;
        }
        let mut alone = file.clone();
        if let Err(e) = apply_override(&mut alone, over) {
            return e;
        }
        if let Err(own) = toml::Value::Table(alone).try_into::<OrdoConfig>() {
            return over.error(one_line(&own));
        }
    }
    // Only the combination fails (not expected with this schema).
    ConfigError::Override {
        origin: OverrideOrigin::Cli,
        text: overrides.iter().map(|o| o.text.as_str()).collect::<Vec<_>>().join(" "),
        reason: one_line(error),
    }
}
