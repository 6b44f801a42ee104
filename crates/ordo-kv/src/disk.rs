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
//! - `table`: the table at a header this replica applied (header word,
//!   length, CRC32, [`KvState::snapshot`]), replaced atomically. Written
//!   by a background thread from an O(1) clone of the table (persistent
//!   maps), so the agent never stalls on a large table: a 100 MB table took
//!   the agent past the heartbeat timeout and cost the group its leader
//!   (found by `ordo bench kv --ycsb`).
//! - `log/snapshot`: the LogStore's snapshot, only a compaction marker
//!   (data = a header word at or below the table's): set once the table is
//!   durable, then the segments below it are removed.
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
//! - The table covers a header this replica **applied** — committed, so
//!   never cut by a diff — and is durable before the marker moves to it;
//!   compaction removes only entries at or below the marker, so the log
//!   always holds every entry above the table (recovery uses the entries
//!   above the table's header). A leader's snapshot restored by the engine
//!   ([`Persist::restored`]) is written (after any table still being
//!   written) before the log that follows it.
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
/// The table file.
pub const TABLE_FILE: &str = "table";
const TABLE_MAGIC: &[u8; 8] = b"ORDOKVT1";
const TABLE_HEADER_BYTES: usize = 8 + 8 + 8 + 4;
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
    /// Write periodic table snapshots on a background thread (`ordo kv
    /// serve`); `false` writes them inline (the simulation, which must stay
    /// deterministic).
    pub background: bool,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            snapshot_entries: 100_000,
            segment_bytes: 64 << 20,
            max_record_bytes: 16 << 20,
            background: true,
        }
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

/// A table snapshot being written: its header, its log index, the writer.
struct InFlight {
    header: Header,
    index: Index,
    writer: std::thread::JoinHandle<Result<(), DiskError>>,
}

/// A replica's durable state over two [`Disk`]s: `meta` holds the promise
/// and the table, `log` the log store (see the module docs).
pub struct DiskStore<D: Disk + Clone + Send + 'static> {
    log: LogStore<D>,
    meta: D,
    options: DiskOptions,
    /// Headers of the stored log, from log index `first` (the marker's
    /// index + 1).
    headers: VecDeque<Header>,
    first: Index,
    /// The header the durable table covers (`Header::NONE`: none).
    base: Header,
    in_flight: Option<InFlight>,
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

fn io_err(op: &'static str, file: &str) -> impl FnOnce(io::Error) -> DiskError {
    let file = file.to_string();
    move |source| DiskError::Io { op, file, source }
}

/// Writes `table` (at `header`) to [`TABLE_FILE`] atomically and durably.
fn write_table<D: Disk>(disk: &mut D, header: Header, table: &KvState) -> Result<(), DiskError> {
    let body = table.snapshot();
    let mut out = Vec::with_capacity(TABLE_HEADER_BYTES + body.len());
    out.extend_from_slice(TABLE_MAGIC);
    out.extend_from_slice(&header.encode().to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    drop(body);
    let tmp = format!("{TABLE_FILE}.tmp");
    disk.create(&tmp).map_err(io_err("create", &tmp))?;
    disk.append(&tmp, &out).map_err(io_err("write", &tmp))?;
    disk.sync(&tmp).map_err(io_err("fsync", &tmp))?;
    disk.rename(&tmp, TABLE_FILE).map_err(io_err("rename", &tmp))?;
    disk.sync_dir().map_err(io_err("fsync the directory of", TABLE_FILE))
}

fn read_table(b: &[u8]) -> Result<(Header, KvState), DiskError> {
    let bad = |why: &str| Err(DiskError::Corrupt(format!("{TABLE_FILE}: {why}")));
    if b.len() < TABLE_HEADER_BYTES || &b[..8] != TABLE_MAGIC {
        return bad("magic mismatch");
    }
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let body = &b[TABLE_HEADER_BYTES..];
    if word(16) != body.len() as u64 {
        return bad("length mismatch");
    }
    if crc32fast::hash(body) != u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")) {
        return bad("checksum mismatch");
    }
    let mut state = KvState::new();
    if let Err(why) = state.restore(body) {
        return bad(why);
    }
    Ok((Header::decode(word(8)), state))
}

impl<D: Disk + Clone + Send + 'static> DiskStore<D> {
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
        for tmp in [format!("{PROMISE_FILE}.tmp"), format!("{TABLE_FILE}.tmp")] {
            if names.contains(&tmp) {
                meta.remove(&tmp).map_err(io_err("remove", &tmp))?;
            }
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

        // The compaction marker, then the table (at or above it).
        let mut marker = Header::NONE;
        let first = log.first_index();
        if let Some(snap) = &stored.snapshot {
            if snap.data.len() != 8 {
                return Err(DiskError::Corrupt("the log's compaction marker is not one header".into()));
            }
            marker = Header::decode(u64::from_le_bytes(snap.data[..8].try_into().expect("8 bytes")));
            if snap.meta.term != marker.epoch.encode() {
                return Err(DiskError::Corrupt("the marker's term is not its header's epoch".into()));
            }
        }
        let (base, state) = if names.iter().any(|n| n == TABLE_FILE) {
            read_table(&meta.read(TABLE_FILE).map_err(io_err("read", TABLE_FILE))?)?
        } else {
            (Header::NONE, KvState::new())
        };
        if base < marker {
            return Err(DiskError::Corrupt(format!(
                "the table ({base:?}) is below the log's compaction marker ({marker:?}): entries are missing"
            )));
        }
        let mut headers = VecDeque::with_capacity(stored.entries.len());
        let mut log_entries = Vec::with_capacity(stored.entries.len());
        let mut previous = marker;
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
            if h > base {
                log_entries.push((h, e.data[8..].to_vec()));
            }
        }
        let (e_new, vote, floor) = match promise {
            Some(p) => p,
            None if stored.snapshot.is_none() && headers.is_empty() && base == Header::NONE => {
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
            in_flight: None,
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
    /// the last header the table has applied and `table` returns (a cheap
    /// clone of) the table at it: written for a restored leader snapshot
    /// and, every `snapshot_entries`, to compact the log.
    pub fn persist(
        &mut self,
        change: &Persist<'_>,
        applied: Header,
        table: &mut dyn FnMut() -> KvState,
    ) -> Result<(), DiskError> {
        self.stats.persists += 1;
        if (change.e_new, change.vote) != self.promise {
            self.write_promise(change.e_new, change.vote, self.floor)?;
        }
        if let Some(base) = change.restored {
            // The engine's log was cleared and the table replaced by the
            // leader's snapshot at `base`: write it before anything above it.
            // A table still being written is older: let it land first.
            self.finish_snapshot(true)?;
            write_table(&mut self.meta, base, &table())?;
            self.base = base;
            self.stats.snapshots += 1;
            let index = self.log.last_index().max(self.first - 1) + 1;
            self.mark(index, base)?;
            self.headers.clear();
            self.first = index + 1;
        }
        if let Some(from) = change.log_from {
            let cut = self.headers.partition_point(|h| *h < from);
            self.log.truncate(self.first + cut as Index)?;
            self.headers.truncate(cut);
            let first_new = self.first + self.headers.len() as Index;
            let mut batch = Vec::with_capacity(change.entries.len());
            let fresh = change.entries.iter().filter(|(h, _)| *h > self.base);
            for (index, (h, payload)) in (first_new..).zip(fresh) {
                assert!(self.headers.back().is_none_or(|last| last < h), "persisted headers increase");
                let mut data = Vec::with_capacity(8 + payload.len());
                data.extend_from_slice(&h.encode().to_le_bytes());
                data.extend_from_slice(payload);
                batch.push(LogEntry {
                    term: h.epoch.encode(),
                    index,
                    kind: EntryKind::Normal,
                    data: data.into(),
                });
                self.headers.push_back(*h);
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
        self.finish_snapshot(!self.options.background)?;
        self.maybe_snapshot(applied, table)?;
        if !self.options.background {
            self.finish_snapshot(true)?;
        }
        Ok(())
    }

    /// Waits for a table being written (if any) and moves the compaction
    /// marker to it.
    pub fn flush_snapshot(&mut self) -> Result<(), DiskError> {
        self.finish_snapshot(true)
    }

    /// Adopts a finished table write (or waits for it with `wait`): the
    /// marker moves to its header and the log below it is removed.
    fn finish_snapshot(&mut self, wait: bool) -> Result<(), DiskError> {
        if !self.in_flight.as_ref().is_some_and(|f| wait || f.writer.is_finished()) {
            return Ok(());
        }
        let InFlight { header, index, writer } = self.in_flight.take().expect("checked");
        writer.join().map_err(|_| DiskError::Corrupt("the table writer panicked".into()))??;
        self.base = self.base.max(header);
        self.stats.snapshots += 1;
        // The header is committed, so still stored at `index` (a restore
        // in between waited for this write and left its own marker above).
        if index >= self.first && self.headers.get((index - self.first) as usize) == Some(&header) {
            self.mark(index, header)?;
            self.log.compact(index)?;
            self.headers.drain(..=((index - self.first) as usize));
            self.first = index + 1;
        }
        Ok(())
    }

    /// Starts writing the table at `applied` (a stored, committed header)
    /// once `snapshot_entries` stored entries lie at or below it and no
    /// other table is being written.
    fn maybe_snapshot(
        &mut self,
        applied: Header,
        table: &mut dyn FnMut() -> KvState,
    ) -> Result<(), DiskError> {
        if self.in_flight.is_some() || applied <= self.base {
            return Ok(());
        }
        let at = self.headers.partition_point(|h| *h < applied);
        if self.headers.get(at) != Some(&applied) || (at as u64 + 1) < self.options.snapshot_entries {
            return Ok(());
        }
        let index = self.first + at as Index;
        let frozen = table();
        let mut disk = self.meta.clone();
        let writer = std::thread::Builder::new()
            .name("kv-snapshot".into())
            .spawn(move || write_table(&mut disk, applied, &frozen))
            .map_err(io_err("spawn the table writer for", TABLE_FILE))?;
        self.in_flight = Some(InFlight { header: applied, index, writer });
        Ok(())
    }

    /// Moves the log's compaction marker to `header` at log `index` (the
    /// table at or above it is durable).
    fn mark(&mut self, index: Index, header: Header) -> Result<(), DiskError> {
        let meta = SnapshotMeta { index, term: header.epoch.encode(), membership: Membership::default() };
        self.log.install_snapshot(&Snapshot { meta, data: header.encode().to_le_bytes().to_vec() })?;
        Ok(())
    }

    fn write_promise(&mut self, e_new: Epoch, vote: Vote, floor: Header) -> Result<(), DiskError> {
        let tmp = format!("{PROMISE_FILE}.tmp");
        let io = io_err;
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

    /// The header the durable table covers.
    pub fn base(&self) -> Header {
        self.base
    }

    /// Entries in the stored log (above the compaction marker).
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
    /// Opens the store in the directory `dir` (created if missing, made
    /// mode 700): the promise and the table in `dir`, the log in `dir/log`.
    pub fn open_dir(dir: &std::path::Path, options: DiskOptions) -> Result<(Self, Option<Boot>), DiskError> {
        use ordo_r2p2::disk::FsDisk;
        let io = |file: &std::path::Path| {
            let file = file.display().to_string();
            move |source| DiskError::Io { op: "open", file, source }
        };
        let meta = FsDisk::open(dir).map_err(io(dir))?;
        // The table is the users' data: only this user reads it.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        }
        let log_dir = dir.join("log");
        let log = FsDisk::open(&log_dir).map_err(io(&log_dir))?;
        DiskStore::open(log, meta, options)
    }
}

impl<D: Disk + Clone + Send + 'static> Drop for DiskStore<D> {
    fn drop(&mut self) {
        // A table being written finishes (it is complete or not at all
        // either way; this keeps the files quiet once the store is gone).
        if let Some(f) = self.in_flight.take() {
            let _ = f.writer.join();
        }
    }
}
