//! The static parameters of one Raft node ([`Config`]) and their validation.
//!
//! Every limit the node enforces comes from here (STYLE: "put a limit on
//! everything"): batch sizes, in-flight appends, uncommitted entries, entry
//! size. Times are counted in logical ticks (the caller decides how long a
//! tick is; the node never reads a clock).

use crate::types::NodeId;

/// The parameters of one [`crate::Node`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node's id (non-zero).
    pub id: NodeId,
    /// The minimum election timeout in ticks. Each timeout is drawn
    /// uniformly from `[election_ticks, 2 * election_ticks)`. This is also
    /// the leader-stickiness lease and the check-quorum period.
    pub election_ticks: u64,
    /// Ticks between a leader's heartbeats; must be `< election_ticks`.
    pub heartbeat_ticks: u64,
    /// Run a pre-vote round before incrementing the term (Raft thesis §9.6).
    pub pre_vote: bool,
    /// A leader that has not heard from a quorum within `election_ticks`
    /// steps down (Raft thesis §6.2).
    pub check_quorum: bool,
    /// At most this many entries in one AppendEntries.
    pub max_entries_per_append: usize,
    /// At most this many bytes of entry data in one AppendEntries (a single
    /// entry larger than this is still sent alone).
    pub max_bytes_per_append: u64,
    /// At most this many AppendEntries carrying entries in flight to one
    /// follower in the replicate state (pipelining window).
    pub max_inflight_appends: usize,
    /// A proposal is refused with `ProposeError::Busy` while the leader has
    /// this many uncommitted entries.
    pub max_uncommitted_entries: u64,
    /// A proposal larger than this is refused with `ProposeError::TooLarge`.
    /// Must not exceed the receivers' `DecodeLimits::max_entry_bytes`.
    pub max_entry_bytes: u64,
    /// A learner may be promoted only when its match index is within this
    /// many entries of the leader's last index.
    pub learner_catchup_gap: u64,
    /// A leader whose commit index a follower's answer moved tells the
    /// followers that get no new entries with its next `ready`, in an empty
    /// AppendEntries (etcd raft's behaviour: followers apply a few µs after
    /// the leader; a commit moved otherwise, e.g. by the leader's own
    /// persistence, rides as below either way). `false`: the commit index
    /// rides on the next AppendEntries with entries or the next heartbeat,
    /// so followers apply up to `heartbeat_ticks` later, and a request at
    /// light load costs the group two replica datagrams per follower
    /// (append, answer) instead of four; safety is the same either way,
    /// since a follower's commit index is only ever a hint of the leader's.
    pub announce_commit: bool,
    /// Hand new entries to the caller in `Ready::entries` to persist.
    /// `false` for a caller that keeps no log of its own (a log only in
    /// memory, the node's): `Ready::entries` stays empty, which spares a
    /// copy of every entry (a reference count per entry, and the vector),
    /// and `Ready::appended` still names the point to `advance` to.
    pub hand_out_entries: bool,
    /// Seed of the node's internal PRNG (election timeout jitter). Give
    /// every node a different seed.
    pub seed: u64,
}

impl Config {
    /// A configuration with conservative defaults for node `id`.
    pub fn new(id: NodeId, seed: u64) -> Config {
        Config {
            id,
            election_ticks: 10,
            heartbeat_ticks: 2,
            pre_vote: true,
            check_quorum: true,
            max_entries_per_append: 256,
            max_bytes_per_append: 1 << 20,
            max_inflight_appends: 16,
            max_uncommitted_entries: 16 * 1024,
            max_entry_bytes: 1 << 20,
            learner_catchup_gap: 0,
            announce_commit: true,
            hand_out_entries: true,
            seed,
        }
    }

    /// Checks every field; a bad configuration is an operator mistake.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id == 0 {
            return Err(ConfigError::ZeroId);
        }
        if self.election_ticks < 2 {
            return Err(ConfigError::ElectionTicksTooSmall(self.election_ticks));
        }
        if self.election_ticks > u64::MAX / 2 {
            return Err(ConfigError::ElectionTicksTooLarge(self.election_ticks));
        }
        if self.heartbeat_ticks == 0 || self.heartbeat_ticks >= self.election_ticks {
            return Err(ConfigError::HeartbeatTicks {
                heartbeat: self.heartbeat_ticks,
                election: self.election_ticks,
            });
        }
        if self.max_entries_per_append == 0 {
            return Err(ConfigError::Zero("max_entries_per_append"));
        }
        if self.max_bytes_per_append == 0 {
            return Err(ConfigError::Zero("max_bytes_per_append"));
        }
        if self.max_inflight_appends == 0 {
            return Err(ConfigError::Zero("max_inflight_appends"));
        }
        if self.max_uncommitted_entries == 0 {
            return Err(ConfigError::Zero("max_uncommitted_entries"));
        }
        if self.max_entry_bytes == 0 {
            return Err(ConfigError::Zero("max_entry_bytes"));
        }
        Ok(())
    }
}

/// Why a [`Config`] was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("node id 0 is reserved")]
    ZeroId,
    #[error("election_ticks {0} is too small (at least 2)")]
    ElectionTicksTooSmall(u64),
    #[error("election_ticks {0} is too large")]
    ElectionTicksTooLarge(u64),
    #[error("heartbeat_ticks {heartbeat} must be in 1..election_ticks ({election})")]
    HeartbeatTicks { heartbeat: u64, election: u64 },
    #[error("{0} must be greater than 0")]
    Zero(&'static str),
}
