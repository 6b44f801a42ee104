//! `kv.durability = "disk"`: a replica's durable state — what the acuerdo
//! engine's durable mode hands over once per poll ([`Persist`]) written and
//! fsynced before that poll's pushes leave the member, and read back when
//! the replica starts ([`Recovered`] plus the table).
//!
//! # Files (in `kv.data_dir`)
//! - `promise`: E_new, this member's vote and its Accepted floor (a diff's
//!   count-0 header when that lies above the last entry), checksummed,
//!   replaced atomically (temp file, fsync, rename, directory fsync).
//! - `log/`: the checksummed segment log of [`ordo_raft::storage`]
//!   ([`LogStore`]: group commit, torn-tail recovery, compaction). The
//!   acuerdo entry at position `k` is log index `k` with term = its epoch's
//!   word and data = its header word ‖ its payload.
//! - `log/snapshot`: the table at a header this replica applied (the
//!   LogStore's snapshot; data = header word ‖ [`KvState::snapshot`]).
//!
//! # Invariants
//! - **Promise before log**: a changed promise is durable before the poll's
//!   log changes are written, so every stored entry's epoch is at most the
//!   stored E_new even after a crash between the two (what
//!   [`ordo_acuerdo::Engine::recover`] demands).
//! - **Accepted after log**: Accepted claims the log up to it is held, so a
//!   raised floor is written only after the log's sync; an election counts
//!   it, so a member that accepted a new leader's diff (and nothing after
//!   it) must not come back claiming less (found by the kv simulation: a
//!   restarted member voted for a candidate lacking a committed write).
//! - **Nothing acknowledged is lost**: [`DiskStore::persist`] returns only
//!   after one `sync` of the log (group commit: one fsync per poll, however
//!   many entries); the engine publishes its Accept, vote or E_new only
//!   after it returns.
//! - `headers` mirrors the stored log: `headers[i]` is the header at log
//!   index `first + i`; strictly increasing, every one above `base`.
//! - A snapshot covers a header this replica **applied** — committed, so
//!   never cut by a diff — and compaction removes only entries at or below
//!   it. A leader's snapshot restored by the engine ([`Persist::restored`])
//!   is written before the log that follows it.
//! - What is read back is checked (checksums, header order, term = epoch);
//!   damage is an error, never a silently shorter history.

use crate::state::KvState;
use ordo_acuerdo::{Epoch, Header, Persist, Recovered, Vote};
use ordo_raft::storage::{Disk, LogOptions, LogStore, StorageError};
use ordo_raft::{Entry as LogEntry, EntryKind, Index, Membership, Snapshot, SnapshotMeta};
use std::collections::VecDeque;
use std::io;

/// The promise file.
pub const PROMISE_FILE: &str = "promise";
const PROMISE_MAGIC: &[u8; 8] = b"ORDOKVP2";
const PROMISE_BYTES: usize = 8 + 8 + 24 + 8 + 4;

/// Why the durable state could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The log store failed (I/O, or damaged synced data).
    #[error(transparent)]
    Log(#[from] StorageError),
    /// The promise file could not be read or written.
    #[error("{op} {file}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        file: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// What is on disk is damaged or contradicts itself.
    #[error("corrupt durable state: {0}")]
    Corrupt(String),
}

/// How a [`DiskStore`] behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskOptions {
    /// Snapshot the table (and compact the log below it) once this many
    /// entries were applied since the last snapshot.
    pub snapshot_entries: u64,
    /// Segment size of the log.
    pub segment_bytes: u64,
    /// The largest log record (an entry plus 8 bytes of header).
    pub max_record_bytes: u32,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions { snapshot_entries: 100_000, segment_bytes: 64 << 20, max_record_bytes: 16 << 20 }
    }
}

/// What a replica finds on its disk at start.
#[derive(Debug)]
pub struct Boot {
    /// The engine's durable state (its promise, base and log).
    pub recovered: Recovered,
    /// The table at `recovered.base`.
    pub state: KvState,
}

/// Counters since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// `persist` calls that wrote something.
    pub persists: u64,
    /// Promises written.
    pub promises: u64,
    /// Entries appended.
    pub entries: u64,
    /// Snapshots written (periodic and restored).
    pub snapshots: u64,
}

/// A replica's durable state over two [`Disk`]s: `meta` holds the promise,
/// `log` the log store (see the module docs).
pub struct DiskStore<D: Disk> {
    log: LogStore<D>,
    meta: D,
    options: DiskOptions,
    /// Headers of the stored log, from log index `first`.
    headers: VecDeque<Header>,
    first: Index,
    /// The header the stored snapshot covers (`Header::NONE`: none).
    base: Header,
    promise: (Epoch, Vote),
    /// The Accepted floor written in the promise file.
    floor: Header,
    stats: DiskStats,
}

fn encode_promise(e_new: Epoch, vote: Vote, floor: Header) -> Vec<u8> {
    let mut out = Vec::with_capacity(PROMISE_BYTES);
    out.extend_from_slice(PROMISE_MAGIC);
    out.extend_from_slice(&e_new.encode().to_le_bytes());
    for w in vote.encode() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&floor.encode().to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode_promise(b: &[u8]) -> Result<(Epoch, Vote, Header), DiskError> {
    let bad = |why: &str| Err(DiskError::Corrupt(format!("{PROMISE_FILE}: {why}")));
    if b.len() != PROMISE_BYTES {
        return bad("wrong length");
    }
    if &b[..8] != PROMISE_MAGIC {
        return bad("magic mismatch");
    }
    let body = PROMISE_BYTES - 4;
    if crc32fast::hash(&b[..body]) != u32::from_le_bytes(b[body..].try_into().expect("4 bytes")) {
        return bad("checksum mismatch");
    }
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let e_new = Header::decode(word(8)).epoch;
    let Some(vote) = Vote::decode([word(16), word(24), word(32)]) else {
        return bad("vote check word mismatch");
    };
    Ok((e_new, vote, Header::decode(word(40))))
}

impl<D: Disk> DiskStore<D> {
    /// Opens the store, recovering what is there: `None` for a replica that
    /// never wrote anything (it starts fresh), otherwise what it must
    /// restart from. Damaged or contradictory data is an error.
    pub fn open(log_disk: D, mut meta: D, options: DiskOptions) -> Result<(Self, Option<Boot>), DiskError> {
        if options.snapshot_entries == 0 {
            return Err(DiskError::Corrupt("snapshot_entries must be at least 1".into()));
        }
        let log_options = LogOptions {
            segment_bytes: options.segment_bytes,
            max_record_bytes: options.max_record_bytes,
            durable: true,
        };
        let (log, stored) = LogStore::open(log_disk, log_options)?;
        let names = meta.list().map_err(|source| DiskError::Io { op: "list", file: ".".into(), source })?;
        let tmp = format!("{PROMISE_FILE}.tmp");
        if names.contains(&tmp) {
            meta.remove(&tmp).map_err(|source| DiskError::Io { op: "remove", file: tmp.clone(), source })?;
        }
        let promise = if names.iter().any(|n| n == PROMISE_FILE) {
            let b = meta.read(PROMISE_FILE).map_err(|source| DiskError::Io {
                op: "read",
                file: PROMISE_FILE.into(),
                source,
            })?;
            Some(decode_promise(&b)?)
        } else {
            None
        };

        let mut state = KvState::new();
        let mut base = Header::NONE;
        let first = log.first_index();
        if let Some(snap) = &stored.snapshot {
            let data = &snap.data;
            if data.len() < 8 {
                return Err(DiskError::Corrupt("the snapshot has no header".into()));
            }
            base = Header::decode(u64::from_le_bytes(data[..8].try_into().expect("8 bytes")));
            if snap.meta.term != base.epoch.encode() {
                return Err(DiskError::Corrupt("the snapshot's term is not its header's epoch".into()));
            }
            state
                .restore(&data[8..])
                .map_err(|why| DiskError::Corrupt(format!("the snapshot's table: {why}")))?;
        }
        let mut headers = VecDeque::with_capacity(stored.entries.len());
        let mut log_entries = Vec::with_capacity(stored.entries.len());
        let mut previous = base;
        for e in stored.entries {
            if e.data.len() < 8 {
                return Err(DiskError::Corrupt(format!("log entry {} has no header", e.index)));
            }
            let h = Header::decode(u64::from_le_bytes(e.data[..8].try_into().expect("8 bytes")));
            if h <= previous || e.term != h.epoch.encode() {
                return Err(DiskError::Corrupt(format!(
                    "log entry {} ({h:?}, term {}) does not follow {previous:?}",
                    e.index, e.term
                )));
            }
            previous = h;
            headers.push_back(h);
            log_entries.push((h, e.data[8..].to_vec()));
        }
        let (e_new, vote, floor) = match promise {
            Some(p) => p,
            None if stored.snapshot.is_none() && log_entries.is_empty() => {
                (Epoch::NONE, Vote::NONE, Header::NONE)
            }
            None => return Err(DiskError::Corrupt("a log without its promise file".into())),
        };
        let store = DiskStore {
            log,
            meta,
            options,
            headers,
            first,
            base,
            promise: (e_new, vote),
            floor,
            stats: DiskStats::default(),
        };
        if promise.is_none() {
            return Ok((store, None));
        }
        if previous.epoch > e_new || vote.e_new > e_new || floor.epoch > e_new {
            return Err(DiskError::Corrupt(format!(
                "the promise (E_new {e_new:?}) is below the stored log ({previous:?}) or the vote"
            )));
        }
        let recovered = Recovered { e_new, vote, base, log: log_entries, accepted: floor };
        Ok((store, Some(Boot { recovered, state })))
    }

    /// Writes one poll's changes, durably, before returning. `applied` is
    /// the last header the table has applied and `snapshot` serializes the
    /// table: used for a restored leader snapshot and, every
    /// `snapshot_entries`, to compact the log.
    pub fn persist(
        &mut self,
        change: &Persist<'_>,
        applied: Header,
        snapshot: &mut dyn FnMut() -> Vec<u8>,
    ) -> Result<(), DiskError> {
        self.stats.persists += 1;
        if (change.e_new, change.vote) != self.promise {
            self.write_promise(change.e_new, change.vote, self.floor)?;
        }
        if let Some(base) = change.restored {
            // The engine's log was cleared and the table replaced by the
            // leader's snapshot at `base`: write it before anything above it.
            let index = self.log.last_index().max(self.first - 1) + 1;
            self.install(index, base, snapshot())?;
            self.headers.clear();
            self.first = index + 1;
        }
        if let Some(from) = change.log_from {
            let cut = self.headers.partition_point(|h| *h < from);
            self.log.truncate(self.first + cut as Index)?;
            self.headers.truncate(cut);
            let mut next = self.first + self.headers.len() as Index;
            let mut batch = Vec::with_capacity(change.entries.len());
            for (h, payload) in change.entries.iter().filter(|(h, _)| *h > self.base) {
                assert!(self.headers.back().is_none_or(|last| last < h), "persisted headers increase");
                let mut data = Vec::with_capacity(8 + payload.len());
                data.extend_from_slice(&h.encode().to_le_bytes());
                data.extend_from_slice(payload);
                batch.push(LogEntry { term: h.epoch.encode(), index: next, kind: EntryKind::Normal, data });
                self.headers.push_back(*h);
                next += 1;
            }
            self.stats.entries += batch.len() as u64;
            self.log.append(&batch)?;
        }
        self.log.sync()?;
        // A diff's Accepted above every stored entry: after the log.
        let last = self.headers.back().copied().unwrap_or(self.base);
        if change.accepted > last && change.accepted > self.floor {
            self.write_promise(change.e_new, change.vote, change.accepted)?;
        }
        self.maybe_snapshot(applied, snapshot)
    }

    /// Snapshots the table at `applied` (a stored, committed header) once
    /// `snapshot_entries` entries lie between it and the last snapshot,
    /// then drops the log up to it.
    fn maybe_snapshot(
        &mut self,
        applied: Header,
        snapshot: &mut dyn FnMut() -> Vec<u8>,
    ) -> Result<(), DiskError> {
        if applied <= self.base {
            return Ok(());
        }
        let at = self.headers.partition_point(|h| *h < applied);
        if self.headers.get(at) != Some(&applied) || (at as u64 + 1) < self.options.snapshot_entries {
            return Ok(());
        }
        let index = self.first + at as Index;
        self.install(index, applied, snapshot())?;
        self.log.compact(index)?;
        self.headers.drain(..=at);
        self.first = index + 1;
        Ok(())
    }

    fn install(&mut self, index: Index, header: Header, table: Vec<u8>) -> Result<(), DiskError> {
        let mut data = Vec::with_capacity(8 + table.len());
        data.extend_from_slice(&header.encode().to_le_bytes());
        data.extend_from_slice(&table);
        let meta = SnapshotMeta { index, term: header.epoch.encode(), membership: Membership::default() };
        self.log.install_snapshot(&Snapshot { meta, data })?;
        self.base = header;
        self.stats.snapshots += 1;
        Ok(())
    }

    fn write_promise(&mut self, e_new: Epoch, vote: Vote, floor: Header) -> Result<(), DiskError> {
        let tmp = format!("{PROMISE_FILE}.tmp");
        let io = |op, file: &str| {
            let file = file.to_string();
            move |source| DiskError::Io { op, file, source }
        };
        self.meta.create(&tmp).map_err(io("create", &tmp))?;
        self.meta.append(&tmp, &encode_promise(e_new, vote, floor)).map_err(io("write", &tmp))?;
        self.meta.sync(&tmp).map_err(io("fsync", &tmp))?;
        self.meta.rename(&tmp, PROMISE_FILE).map_err(io("rename", &tmp))?;
        self.meta.sync_dir().map_err(io("fsync the directory of", PROMISE_FILE))?;
        self.promise = (e_new, vote);
        self.floor = floor;
        self.stats.promises += 1;
        Ok(())
    }

    /// The header the stored snapshot covers.
    pub fn base(&self) -> Header {
        self.base
    }

    /// Entries in the stored log (above the snapshot).
    pub fn stored_entries(&self) -> usize {
        self.headers.len()
    }

    /// Counters since open.
    pub fn stats(&self) -> DiskStats {
        self.stats
    }

    /// The log store's counters (fsyncs, segments).
    pub fn log_stats(&self) -> ordo_raft::storage::LogStats {
        self.log.stats()
    }
}

impl DiskStore<ordo_r2p2::disk::FsDisk> {
    /// Opens the store in the directory `dir` (created if missing): the
    /// promise in `dir`, the log and snapshot in `dir/log`.
    pub fn open_dir(dir: &std::path::Path, options: DiskOptions) -> Result<(Self, Option<Boot>), DiskError> {
        use ordo_r2p2::disk::FsDisk;
        let io = |file: &std::path::Path| {
            let file = file.display().to_string();
            move |source| DiskError::Io { op: "open", file, source }
        };
        let meta = FsDisk::open(dir).map_err(io(dir))?;
        let log_dir = dir.join("log");
        let log = FsDisk::open(&log_dir).map_err(io(&log_dir))?;
        DiskStore::open(log, meta, options)
    }
}
