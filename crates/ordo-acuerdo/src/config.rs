//! Configuration and the region layout (identical on every member).
//!
//! ```text
//! region offset 0      +-------------------------------------------------------------+
//!   SST, one row per   | heartbeat | accept | commit | e_new | vote[3] | status |      |
//!   member (ordo-sst,  | diff_request | ring_session[n] | ring_ack[n] | pad to 64    |
//!   raw u64 words)     +-------------------------------------------------------------+
//! sst_len              | ring (sender 0 -> receiver 0) (unused diagonal)             |
//!   rings (ordo-ring)  | ring (sender 0 -> receiver 1) ...                           |
//!   n x n, row-major   | ring (sender i -> receiver j) at rings_base + (i*n+j)*len    |
//! region_len           +-------------------------------------------------------------+
//! ```
//! Every column is one `u64` word (headers as in [`crate::header`]), so a
//! reader never sees a torn value; the vote's three words carry a check word.
//! Columns are monotonic *per incarnation of the row's owner* (see the crate
//! docs) and are read and written as raw words: [`ordo_sst::Sst`]'s counter
//! encoding (`value + 1`) and its monotonicity assert do not fit the Vote's
//! `acpt` word, which is not monotonic on its own (only the pair is).

use crate::header::MAX_MEMBER_ID;
use ordo_fabric::MemberId;
use ordo_ring::RingLayout;
use ordo_sst::{ColumnRange, CounterArrayCol, CounterCol, LayoutBuilder, SstLayout};

/// Bytes of the engine's header at the start of every ring payload.
pub const WIRE_HEADER_LEN: usize = 32;
/// Largest group.
pub const MAX_MEMBERS: usize = 15;

/// Errors in a [`Config`] (operator mistakes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The member list is not usable.
    #[error("bad member list: {0}")]
    Members(String),
    /// A size or timing parameter is out of range.
    #[error("bad parameter: {0}")]
    Parameter(String),
    /// The region is too small for the layout.
    #[error("region of {have} bytes is smaller than the {need} bytes the layout needs")]
    RegionTooSmall {
        /// Bytes the region has.
        have: usize,
        /// Bytes the layout needs.
        need: usize,
    },
}

/// The most messages one epoch may hold: a header's 32-bit count, less one
/// (the commit step names the header after the last one delivered).
pub const MAX_EPOCH_MESSAGES: u32 = u32::MAX - 1;

/// Everything an [`crate::Engine`] is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Every member (n = 2f+1), any order, ids ≤ 255.
    pub members: Vec<MemberId>,
    /// This member.
    pub me: MemberId,
    /// This member's incarnation: 1 at the group's first start; a larger
    /// value means the member restarted with empty state and must catch up
    /// before it votes (see the crate docs, "Restarts").
    pub incarnation: u64,
    /// Slots of each ring (one ring per ordered pair of members).
    pub window: usize,
    /// Largest client payload in bytes.
    pub max_payload: usize,
    /// Most messages the leader keeps broadcast but not committed; beyond it
    /// [`crate::Engine::broadcast`] reports back-pressure.
    pub max_outstanding: u32,
    /// How often every member bumps and pushes its heartbeat (and its whole
    /// SST row).
    pub heartbeat_interval_ns: u64,
    /// A member whose heartbeat has not changed for this long is suspected
    /// (followers then start an election, §3.3).
    pub heartbeat_timeout_ns: u64,
    /// An election whose best vote has not changed for this long (plus a
    /// per-member stagger) is retried with a bigger epoch.
    pub election_timeout_ns: u64,
    /// Commit pushes are periodic (Fig. 6): a member pushes its changed
    /// Commit column at most this often (unless its row goes out anyway),
    /// which keeps them off the critical path; followers deliver up to this
    /// much later than the leader. 0: push at every commit.
    pub commit_push_interval_ns: u64,
    /// Log garbage collection (on by default): drop the log entries
    /// committed at every member that is not suspected (header ≤ the
    /// smallest of their Commit columns), so memory stays bounded under
    /// endless load, even while a member is down. A member that then needs
    /// dropped entries (it restarted with empty state, or it was suspected
    /// while the others moved on) is caught up by **state transfer**: the
    /// leader sends a snapshot of the application
    /// ([`crate::DeliverySink::snapshot`]) and the log after it. Off: the
    /// log is kept whole and every catch-up replays it. See the crate docs,
    /// "Log garbage collection and state transfer".
    pub log_gc: bool,
    /// Durable mode: before a poll's commit step (so before any of its
    /// pushes leave the member), the engine hands the application every
    /// log change and promise of the poll ([`crate::DeliverySink::persist`]),
    /// which must be durable when it returns; Accept, votes and E_new are
    /// therefore never published ahead of the disk, and a member restarted
    /// from its durable state ([`crate::Engine::recover`]) is as if it had
    /// been slow, not forgetful. Off (default): state is in memory only, as
    /// in the paper.
    pub durable: bool,
    /// Stamped rings (on by default): where the fabric is address-ordered
    /// ([`ordo_fabric::Fabric::address_ordered`]; the driver turns this off
    /// where it is not), a ring batch is one write — each slot's trailer
    /// stamp is its guard — instead of data plus a counter write (see
    /// `ordo_ring`, "Stamped rings"). Every member must agree (a group on
    /// one backend and one architecture does): each row announces its mode,
    /// and a member does not read the ring of a peer that disagrees
    /// ([`crate::engine::Note::RingModeDiffers`], logged as an error by the
    /// runtime).
    pub ring_stamps: bool,
    /// Most messages the leader broadcasts in one epoch (a header's count
    /// is 32 bits), at most [`MAX_EPOCH_MESSAGES`]. At this many, once
    /// every one is committed, the leader renews its epoch: it steps down
    /// and wins the election of a bigger one at once (it is the most up to
    /// date), and [`crate::Engine::broadcast`] reports back-pressure
    /// meanwhile. Default [`MAX_EPOCH_MESSAGES`] (at 1.5 M messages a
    /// second, one renewal every ~48 minutes). Each renewal spends one of
    /// the 2^24 election rounds: small values are for tests.
    pub epoch_messages: u32,
}

impl Config {
    /// A configuration with defaults for everything but the group.
    pub fn new(members: Vec<MemberId>, me: MemberId) -> Config {
        Config {
            members,
            me,
            incarnation: 1,
            window: 16,
            max_payload: 256,
            max_outstanding: 64,
            heartbeat_interval_ns: 50_000,
            heartbeat_timeout_ns: 1_000_000,
            election_timeout_ns: 1_500_000,
            commit_push_interval_ns: 10_000,
            log_gc: true,
            durable: false,
            ring_stamps: true,
            epoch_messages: MAX_EPOCH_MESSAGES,
        }
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut sorted = self.members.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.members.len() {
            return Err(ConfigError::Members(format!("duplicates in {:?}", self.members)));
        }
        if sorted.len() < 3 || sorted.len().is_multiple_of(2) || sorted.len() > MAX_MEMBERS {
            return Err(ConfigError::Members(format!(
                "need 2f+1 members (3..={MAX_MEMBERS}, odd), got {}",
                sorted.len()
            )));
        }
        if sorted.last().is_some_and(|m| *m > MAX_MEMBER_ID) {
            return Err(ConfigError::Members(format!("member ids must be ≤ {MAX_MEMBER_ID}")));
        }
        if !sorted.contains(&self.me) {
            return Err(ConfigError::Members(format!("member {} is not in {:?}", self.me, self.members)));
        }
        if self.incarnation == 0 || self.incarnation >= 1 << 15 {
            return Err(ConfigError::Parameter("incarnation must be in 1..2^15".into()));
        }
        if self.window == 0 || self.window > 1 << 16 {
            return Err(ConfigError::Parameter("window must be in 1..=65536".into()));
        }
        if self.max_payload == 0 || self.max_payload > 1 << 20 {
            return Err(ConfigError::Parameter("max_payload must be in 1..=1 MiB".into()));
        }
        if self.max_outstanding == 0 {
            return Err(ConfigError::Parameter("max_outstanding must be ≥ 1".into()));
        }
        if self.epoch_messages == 0 || self.epoch_messages > MAX_EPOCH_MESSAGES {
            return Err(ConfigError::Parameter(format!(
                "epoch_messages must be in 1..={MAX_EPOCH_MESSAGES}"
            )));
        }
        if self.heartbeat_interval_ns == 0
            || self.heartbeat_timeout_ns <= 2 * self.heartbeat_interval_ns
            || self.election_timeout_ns == 0
        {
            return Err(ConfigError::Parameter(
                "need heartbeat_interval > 0, heartbeat_timeout > 2 × interval, election_timeout > 0".into(),
            ));
        }
        Ok(())
    }

    /// The members, sorted (row `i` of the SST is member `i` of this list).
    pub fn sorted_members(&self) -> Vec<MemberId> {
        let mut m = self.members.clone();
        m.sort_unstable();
        m
    }

    /// f, the number of failures tolerated.
    pub fn f(&self) -> usize {
        self.members.len() / 2
    }

    /// A quorum: f+1.
    pub fn quorum(&self) -> usize {
        self.f() + 1
    }
}

/// The SST columns (offsets within a row).
#[derive(Clone, Copy, Debug)]
pub struct Columns {
    /// Bumped every heartbeat interval.
    pub heartbeat: CounterCol,
    /// Last accepted header (Accept_SST).
    pub accept: CounterCol,
    /// Last committed header (Commit_SST).
    pub commit: CounterCol,
    /// E_new, the epoch this member has promised to join.
    pub e_new: CounterCol,
    /// The vote: `[e_new, acpt, check]` (Vote_SST).
    pub vote: CounterArrayCol,
    /// Bit 0: synced (holds a leader's log; not a restarted member still
    /// catching up); bit 1: leads; bit 2: its rings are stamped; bit 3:
    /// bit 2 is meaningful (the row was written).
    pub status: CounterCol,
    /// `incarnation << 32 | n`: the n-th request of this incarnation for a
    /// full diff from the leader (0: none).
    pub diff_request: CounterCol,
    /// Per receiver (by row): the session of this member's ring to it.
    pub ring_session: CounterArrayCol,
    /// Per sender (by row): `session << 32 | consumed` of its ring to this
    /// member (the slot reuse rule).
    pub ring_ack: CounterArrayCol,
    /// A leader's read barrier: bumped (and the row pushed) once per batch
    /// of [`crate::Engine::read_index`] requests.
    pub read_seq: CounterCol,
    /// A follower's echo of its leader's `read_seq`, written only while it
    /// follows that leader's epoch and promised no bigger one (the read
    /// index's confirmation round, see the crate docs).
    pub read_ack: CounterCol,
}

/// The region layout of a group.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The SST row layout.
    pub sst: SstLayout,
    /// The columns.
    pub columns: Columns,
    /// Bytes of a row that hold columns (pushed as one write).
    pub row_used: usize,
    /// The Accept, ring_ack and read_ack columns (adjacent): what a push
    /// that only acknowledges carries.
    pub ack_push: ColumnRange,
    /// From the first column through Commit (the acks, heartbeat and
    /// Commit; one cache line for up to 3 members): what a periodic Commit
    /// push carries, which leaves the receiver's cached copy of the rest of
    /// the row (votes, status, ring sessions) valid.
    pub head_push: ColumnRange,
    /// Bytes of the SST.
    pub sst_len: usize,
    /// Geometry of every ring.
    pub ring: RingLayout,
    /// Offset of the first ring.
    pub rings_base: usize,
    /// Bytes every member's region needs.
    pub region_len: usize,
    /// Members in the group.
    pub n: usize,
}

impl Layout {
    /// The layout for `cfg` (which must be valid).
    pub fn new(cfg: &Config) -> Layout {
        let n = cfg.members.len();
        let mut b = LayoutBuilder::new();
        // Accept, ring_ack and read_ack first and adjacent: a follower's
        // per-message acknowledgement (and its read-barrier echo) pushes
        // only them (`ack_push`, one cache line for up to 6 members), which
        // leaves the receiver's cached copy of the rest of the row valid.
        let accept = b.counter("accept");
        let ring_ack = b.counters("ring_ack", n);
        let read_ack = b.counter("read_ack");
        let columns = Columns {
            heartbeat: b.counter("heartbeat"),
            accept,
            commit: b.counter("commit"),
            e_new: b.counter("e_new"),
            vote: b.counters("vote", 3),
            status: b.counter("status"),
            diff_request: b.counter("diff_request"),
            ring_session: b.counters("ring_session", n),
            ring_ack,
            read_seq: b.counter("read_seq"),
            read_ack,
        };
        let acks = ColumnRange::from(read_ack);
        let first = ColumnRange::from(accept);
        let ack_push = ColumnRange { offset: first.offset, len: acks.offset + acks.len - first.offset };
        let commit = ColumnRange::from(columns.commit);
        let head_push = ColumnRange { offset: first.offset, len: commit.offset + commit.len - first.offset };
        assert!(
            commit.offset > acks.offset && head_push.len > ack_push.len,
            "Commit follows the ack columns, so the head push covers both"
        );
        let last = ColumnRange::from(columns.read_seq);
        let row_used = last.offset + last.len;
        let sst = b.build();
        let sst_len = sst.table_len(n);
        let ring =
            RingLayout::new(cfg.window, cfg.max_payload + WIRE_HEADER_LEN).with_stamps(cfg.ring_stamps);
        let rings_base = sst_len.next_multiple_of(64);
        let region_len = rings_base + ring.set_len(n * n);
        Layout { sst, columns, row_used, ack_push, head_push, sst_len, ring, rings_base, region_len, n }
    }

    /// Offset of the ring from the member of row `sender` to the member of
    /// row `receiver`.
    pub fn ring_offset(&self, sender: usize, receiver: usize) -> usize {
        self.ring.ring_offset(self.rings_base, sender * self.n + receiver)
    }

    /// Region offset of word `i` of column `col` in row `row`.
    pub fn word(&self, row: usize, col: impl Into<ColumnRange>, i: usize) -> usize {
        let c = col.into();
        debug_assert!(8 * i < c.len);
        row * self.sst.row_stride() + c.offset + 8 * i
    }
}
