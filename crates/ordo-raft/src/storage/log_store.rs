//! [`LogStore`]: the durable Raft log over a [`Disk`]. See the module docs
//! of [`crate::storage`] for the durability contract.
//!
//! # Files in the directory
//! - `log-<first index, 20 digits>.seg`: segments of entry records
//!   (format in `codec`), rolled when a segment reaches
//!   [`LogOptions::segment_bytes`].
//! - [`HARD_STATE_FILE`]: the last hard state written (term, vote, commit).
//! - [`SNAPSHOT_FILE`]: the current snapshot (meta, membership, data).
//! - `*.tmp`: a file being written before its atomic rename; removed by
//!   recovery.

use std::collections::BTreeSet;

use super::codec::{
    MAX_INDEX, RECORD_MIN_BODY_BYTES, RecordRead, decode_hard_state, decode_snapshot, encode_hard_state,
    encode_record, encode_snapshot, read_record, record_body_len, valid_record_after,
};
use super::{Disk, StorageError};
use crate::types::{Entry, HardState, Index, Recovered, Snapshot, SnapshotMeta, Term};

/// The file holding the hard state.
pub const HARD_STATE_FILE: &str = "hardstate";
/// The file holding the current snapshot.
pub const SNAPSHOT_FILE: &str = "snapshot";
const TMP_SUFFIX: &str = ".tmp";

/// The name of the segment whose first entry is `first`.
pub fn segment_name(first: Index) -> String {
    format!("log-{first:020}.seg")
}

fn parse_segment_name(name: &str) -> Option<Index> {
    let digits = name.strip_prefix("log-")?.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&first| first > 0 && first <= MAX_INDEX)
}

/// How a [`LogStore`] behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// A segment is closed (fsynced) and a new one started once it holds at
    /// least this many bytes. At least 1.
    pub segment_bytes: u64,
    /// The largest record body accepted on append and believed on recovery;
    /// bounds every allocation made from a length read from disk. At least
    /// [`RECORD_MIN_BODY_BYTES`](super::RECORD_MIN_BODY_BYTES).
    pub max_record_bytes: u32,
    /// `true`: fsync as the module docs say. `false` (in-memory mode): no
    /// fsync at all; a power failure or machine crash may lose anything,
    /// even acknowledged writes.
    pub durable: bool,
}

impl Default for LogOptions {
    fn default() -> LogOptions {
        LogOptions { segment_bytes: 64 << 20, max_record_bytes: 16 << 20, durable: true }
    }
}

/// Counters of a [`LogStore`] since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Entries written by `append` (not counting ones skipped as present).
    pub entries_appended: u64,
    /// Record bytes written by `append`.
    pub bytes_appended: u64,
    /// `sync` calls.
    pub syncs: u64,
    /// File and directory fsyncs issued (0 in in-memory mode).
    pub fsyncs: u64,
    /// Segments created.
    pub segments_created: u64,
    /// Segments removed (overwrite, snapshot, compaction, recovery).
    pub segments_removed: u64,
    /// Conflicting suffixes removed by `append`.
    pub truncations: u64,
    /// Hard states written.
    pub hard_states_written: u64,
    /// Bytes of torn tail cut by recovery.
    pub torn_bytes_recovered: u64,
}

#[derive(Clone, Debug)]
struct Segment {
    first: Index,
    name: String,
    /// `offsets[k]` is where the record of index `first + k` starts.
    offsets: Vec<u64>,
    /// `terms[k]` is the term of index `first + k`.
    terms: Vec<Term>,
    /// Bytes in the file.
    len: u64,
}

impl Segment {
    fn new(first: Index) -> Segment {
        Segment { first, name: segment_name(first), offsets: Vec::new(), terms: Vec::new(), len: 0 }
    }

    /// The index after the last entry.
    fn end(&self) -> Index {
        self.first + self.offsets.len() as u64
    }
}

/// The durable Raft log: entries in checksummed segment files, the hard
/// state, and the current snapshot.
///
/// Use: [`LogStore::open`] (recovers), then per batch of the core's output
/// `append`, `save_hard_state`, `install_snapshot`, and finally **one**
/// [`LogStore::sync`] before acknowledging anything that depends on it.
///
/// Logical view: the log holds `(first_index() ..= last_index())`;
/// `first_index() == snapshot index + 1` (1 without a snapshot) and
/// `last_index() == first_index() - 1` when empty.
#[derive(Debug)]
pub struct LogStore<D: Disk> {
    disk: D,
    options: LogOptions,
    segments: Vec<Segment>,
    snapshot: Option<SnapshotMeta>,
    hard_state: HardState,
    durable_hard_state: HardState,
    last_index: Index,
    last_term: Term,
    dirty: BTreeSet<String>,
    dir_dirty: bool,
    stats: LogStats,
}

impl<D: Disk> LogStore<D> {
    /// Opens the log in `disk`, recovering what a crash left: removes
    /// temporary files, reads the hard state and snapshot, scans every
    /// segment, cuts a torn tail off the last segment, drops segments the
    /// snapshot covers, and drops the log if it contradicts the snapshot.
    /// In durable mode the recovered state is fsynced before returning.
    ///
    /// Errors: [`StorageError::Corrupt`] or [`StorageError::RecordTooLarge`]
    /// for damaged synced data, [`StorageError::Io`] for disk failures,
    /// [`StorageError::InvalidOptions`].
    pub fn open(disk: D, options: LogOptions) -> Result<(LogStore<D>, Recovered), StorageError> {
        if options.segment_bytes == 0 {
            return Err(StorageError::InvalidOptions("segment_bytes must be at least 1"));
        }
        if (options.max_record_bytes as usize) < RECORD_MIN_BODY_BYTES {
            return Err(StorageError::InvalidOptions("max_record_bytes below the minimum record"));
        }
        let mut store = LogStore {
            disk,
            options,
            segments: Vec::new(),
            snapshot: None,
            hard_state: HardState::default(),
            durable_hard_state: HardState::default(),
            last_index: 0,
            last_term: 0,
            dirty: BTreeSet::new(),
            dir_dirty: false,
            stats: LogStats::default(),
        };
        let recovered = store.recover()?;
        Ok((store, recovered))
    }

    fn recover(&mut self) -> Result<Recovered, StorageError> {
        let names = self.disk.list().map_err(StorageError::io("list", ""))?;
        let mut segment_names: Vec<(Index, String)> = Vec::new();
        let (mut has_hard_state, mut has_snapshot) = (false, false);
        for name in names {
            if name.ends_with(TMP_SUFFIX) {
                self.disk.remove(&name).map_err(StorageError::io("remove", &name))?;
                self.dir_dirty = true;
            } else if name == HARD_STATE_FILE {
                has_hard_state = true;
            } else if name == SNAPSHOT_FILE {
                has_snapshot = true;
            } else if let Some(first) = parse_segment_name(&name) {
                segment_names.push((first, name));
            }
        }
        segment_names.sort();

        if has_hard_state {
            let bytes = self.disk.read(HARD_STATE_FILE).map_err(StorageError::io("read", HARD_STATE_FILE))?;
            self.hard_state = decode_hard_state(&bytes, HARD_STATE_FILE)?;
            self.durable_hard_state = self.hard_state;
        }
        let snapshot = if has_snapshot {
            let bytes = self.disk.read(SNAPSHOT_FILE).map_err(StorageError::io("read", SNAPSHOT_FILE))?;
            Some(decode_snapshot(&bytes, SNAPSHOT_FILE)?)
        } else {
            None
        };
        let (snap_index, snap_term) = snapshot.as_ref().map_or((0, 0), |s| (s.meta.index, s.meta.term));
        self.snapshot = snapshot.as_ref().map(|s| s.meta.clone());

        // Segments whose successor starts at or below snap_index + 1 hold
        // only compacted entries: leftovers of an interrupted compaction.
        let covered = segment_names.windows(2).take_while(|w| w[1].0 <= snap_index + 1).count();
        for (_, name) in segment_names.drain(..covered) {
            self.remove_file(&name)?;
        }

        let mut entries: Vec<Entry> = Vec::new();
        let count = segment_names.len();
        for (k, (first, name)) in segment_names.into_iter().enumerate() {
            let is_last = k + 1 == count;
            let segment = self.scan_segment(first, name, is_last, &mut entries)?;
            if let Some(previous) = self.segments.last()
                && previous.end() != segment.first
            {
                return Err(StorageError::Corrupt {
                    file: segment.name,
                    offset: 0,
                    reason: "segment does not follow its predecessor",
                });
            }
            if segment.offsets.is_empty() {
                if !is_last {
                    return Err(StorageError::Corrupt {
                        file: segment.name,
                        offset: 0,
                        reason: "sealed segment holds no record",
                    });
                }
                // Created but never (durably) written: nothing to keep.
                self.remove_file(&segment.name)?;
            } else {
                self.segments.push(segment);
            }
        }

        // Consistency with the snapshot.
        if let (Some(first_seg), Some(last_seg)) = (self.segments.first(), self.segments.last()) {
            let (log_first, log_last) = (first_seg.first, last_seg.end() - 1);
            if snapshot.is_none() && log_first != 1 {
                return Err(StorageError::Corrupt {
                    file: first_seg.name.clone(),
                    offset: 0,
                    reason: "log does not start at index 1 and there is no snapshot",
                });
            }
            if log_first > snap_index + 1 {
                return Err(StorageError::Corrupt {
                    file: first_seg.name.clone(),
                    offset: 0,
                    reason: "log starts after the snapshot: entries are missing",
                });
            }
            if log_first == snap_index + 1 && first_seg.terms[0] < snap_term {
                return Err(StorageError::Corrupt {
                    file: first_seg.name.clone(),
                    offset: 0,
                    reason: "entry after the snapshot has a lower term than the snapshot",
                });
            }
            let contradicts = log_last < snap_index
                || (log_first <= snap_index && self.physical_term(snap_index) != Some(snap_term));
            if contradicts {
                // The snapshot replaced this log (install_snapshot was
                // removing it when the crash came).
                self.remove_all_segments()?;
                entries.clear();
            }
        }

        self.last_index = self.segments.last().map_or(snap_index, |s| s.end() - 1).max(snap_index);
        self.last_term = self.physical_term(self.last_index).unwrap_or(snap_term);
        self.hard_state.commit = self.hard_state.commit.min(self.last_index);

        // Make what was recovered durable before anyone builds on it (a
        // process crash leaves unsynced data in the page cache).
        if let Some(name) = self.segments.last().map(|s| s.name.clone()) {
            self.dirty.insert(name);
            self.dir_dirty = true;
        }
        self.flush_dirty()?;

        entries.retain(|e| e.index > snap_index);
        Ok(Recovered { hard_state: self.hard_state, snapshot, entries })
    }

    /// Reads one segment, pushing its entries to `entries` and cutting a
    /// torn tail if it is the last segment.
    fn scan_segment(
        &mut self,
        first: Index,
        name: String,
        is_last: bool,
        entries: &mut Vec<Entry>,
    ) -> Result<Segment, StorageError> {
        let buf = self.disk.read(&name).map_err(StorageError::io("read", &name))?;
        let max = self.options.max_record_bytes as usize;
        let mut segment = Segment::new(first);
        segment.name = name;
        let mut offset = 0usize;
        while offset < buf.len() {
            let corrupt =
                |reason| StorageError::Corrupt { file: segment.name.clone(), offset: offset as u64, reason };
            match read_record(&buf, offset, max) {
                RecordRead::Entry { entry, next } => {
                    if entry.index != segment.end() {
                        return Err(corrupt("entry index out of sequence"));
                    }
                    if entries.last().is_some_and(|last| last.term > entry.term) {
                        return Err(corrupt("entry term decreases"));
                    }
                    segment.offsets.push(offset as u64);
                    segment.terms.push(entry.term);
                    entries.push(entry);
                    offset = next;
                }
                RecordRead::TooLarge { len } => {
                    return Err(StorageError::RecordTooLarge {
                        file: segment.name.clone(),
                        offset: offset as u64,
                        len,
                        max: max as u64,
                    });
                }
                RecordRead::Incomplete if !is_last => {
                    return Err(corrupt("sealed segment ends inside a record"));
                }
                RecordRead::Bad { reason } if !is_last || valid_record_after(&buf, offset, max) => {
                    return Err(corrupt(reason));
                }
                RecordRead::Incomplete | RecordRead::Bad { .. } => {
                    // A torn unsynced write at the tail of the log.
                    self.disk
                        .truncate(&segment.name, offset as u64)
                        .map_err(StorageError::io("truncate", &segment.name))?;
                    self.dirty.insert(segment.name.clone());
                    self.stats.torn_bytes_recovered += (buf.len() - offset) as u64;
                    break;
                }
            }
        }
        segment.len = offset as u64;
        Ok(segment)
    }

    /// Appends `entries` (contiguous, increasing indexes) to the log.
    ///
    /// - Entries at or below the snapshot index are skipped (covered).
    /// - Leading entries already in the log with the same term are skipped
    ///   (Log Matching: same index and term means the same entry).
    /// - At the first entry whose term differs from the log's, the log's
    ///   suffix from that index is removed first (Raft's overwrite); the
    ///   removal is made durable before the new entries are written.
    /// - Otherwise the first new entry must be `last_index() + 1`.
    ///
    /// Nothing is durable until [`LogStore::sync`]. Validation
    /// ([`StorageError::NotContiguous`], [`StorageError::EntryTooLarge`],
    /// [`StorageError::TermRegression`]) happens before anything is written.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), StorageError> {
        for pair in entries.windows(2) {
            if pair[1].index != pair[0].index + 1 {
                return Err(StorageError::NotContiguous { expected: pair[0].index + 1, got: pair[1].index });
            }
        }
        let snap_index = self.snapshot_index();
        let mut skip = 0;
        while skip < entries.len()
            && (entries[skip].index <= snap_index
                || (entries[skip].index <= self.last_index
                    && self.physical_term(entries[skip].index) == Some(entries[skip].term)))
        {
            skip += 1;
        }
        let entries = &entries[skip..];
        let Some(head) = entries.first() else { return Ok(()) };
        if head.index > self.last_index + 1 {
            return Err(StorageError::NotContiguous { expected: self.last_index + 1, got: head.index });
        }
        let max = self.options.max_record_bytes as usize;
        let mut previous_term = if head.index == self.last_index + 1 {
            self.last_term
        } else {
            self.term(head.index - 1).unwrap_or(0)
        };
        for entry in entries {
            let len = record_body_len(entry);
            if len > max {
                return Err(StorageError::EntryTooLarge {
                    index: entry.index,
                    len: len as u64,
                    max: max as u64,
                });
            }
            if entry.term < previous_term {
                return Err(StorageError::TermRegression {
                    index: entry.index,
                    term: entry.term,
                    previous: previous_term,
                });
            }
            previous_term = entry.term;
        }

        if head.index <= self.last_index {
            self.truncate_from(head.index)?;
        }

        let mut buf = Vec::new();
        for entry in entries {
            let rolls = match self.segments.last() {
                None => true,
                Some(s) => !s.offsets.is_empty() && s.len + buf.len() as u64 >= self.options.segment_bytes,
            };
            if rolls {
                self.write_buffered(&mut buf)?;
                self.roll(entry.index)?;
            }
            let segment = self.segments.last_mut().expect("a segment after roll");
            segment.offsets.push(segment.len + buf.len() as u64);
            segment.terms.push(entry.term);
            encode_record(entry, &mut buf);
            self.stats.entries_appended += 1;
        }
        self.write_buffered(&mut buf)?;
        let last = entries.last().expect("non-empty");
        self.last_index = last.index;
        self.last_term = last.term;
        Ok(())
    }

    fn write_buffered(&mut self, buf: &mut Vec<u8>) -> Result<(), StorageError> {
        if buf.is_empty() {
            return Ok(());
        }
        let segment = self.segments.last_mut().expect("buffered records have a segment");
        self.disk.append(&segment.name, buf).map_err(StorageError::io("append", &segment.name))?;
        segment.len += buf.len() as u64;
        self.stats.bytes_appended += buf.len() as u64;
        if !self.dirty.contains(&segment.name) {
            self.dirty.insert(segment.name.clone());
        }
        buf.clear();
        Ok(())
    }

    /// Seals the current segment (durable: fsync it and the directory, so
    /// that only the last segment can ever be torn) and starts one at `first`.
    fn roll(&mut self, first: Index) -> Result<(), StorageError> {
        self.flush_dirty()?;
        let segment = Segment::new(first);
        self.disk.create(&segment.name).map_err(StorageError::io("create", &segment.name))?;
        self.dir_dirty = true;
        self.stats.segments_created += 1;
        self.segments.push(segment);
        Ok(())
    }

    /// Removes every entry at or after `index` (`snapshot index < index <=
    /// last_index`), durably in durable mode: later segments first (newest
    /// first, then a directory fsync), then the cut of the segment holding
    /// `index` (then its fsync). A crash in between leaves a prefix.
    fn truncate_from(&mut self, index: Index) -> Result<(), StorageError> {
        debug_assert!(index > self.snapshot_index() && index <= self.last_index);
        let mut removed = false;
        while self.segments.last().is_some_and(|s| s.first >= index) {
            let segment = self.segments.pop().expect("checked");
            self.remove_file(&segment.name)?;
            removed = true;
        }
        if removed {
            self.fsync_dir()?;
        }
        if let Some(segment) = self.segments.last_mut()
            && segment.end() > index
        {
            let keep = (index - segment.first) as usize;
            let offset = segment.offsets[keep];
            self.disk.truncate(&segment.name, offset).map_err(StorageError::io("truncate", &segment.name))?;
            segment.offsets.truncate(keep);
            segment.terms.truncate(keep);
            segment.len = offset;
            let name = segment.name.clone();
            self.fsync_file(&name)?;
        }
        self.last_index = index - 1;
        self.last_term = self.term(index - 1).expect("the entry before a truncation is known");
        self.stats.truncations += 1;
        Ok(())
    }

    /// Removes every entry at or after `from`, durably in durable mode
    /// (later segments first, then a directory fsync, then the cut of the
    /// segment holding `from` and its fsync): for logs whose owner decides
    /// what is overwritten (an acuerdo diff's truncation), where `append`
    /// cannot tell from the term alone. `from > last_index` removes nothing.
    ///
    /// Errors: [`StorageError::OutOfRange`] if `from` is at or below the
    /// snapshot index (compacted entries cannot be cut).
    pub fn truncate(&mut self, from: Index) -> Result<(), StorageError> {
        if from <= self.snapshot_index() {
            return Err(StorageError::OutOfRange {
                lo: from,
                hi: self.last_index + 1,
                first: self.first_index(),
                last: self.last_index,
            });
        }
        if from > self.last_index {
            return Ok(());
        }
        self.truncate_from(from)
    }

    /// Records the hard state to persist. It is written by the next
    /// [`LogStore::sync`] if its term or vote changed; a change of `commit`
    /// alone is written with the next term/vote change, snapshot or
    /// compaction (losing it is safe).
    pub fn save_hard_state(&mut self, hard_state: &HardState) {
        self.hard_state = *hard_state;
    }

    /// Group commit: makes everything appended since the last sync durable
    /// with one fsync per written file (normally one) plus one directory
    /// fsync if files were created, then writes the hard state if its term
    /// or vote changed (temp + fsync + rename + directory fsync). After `Ok`,
    /// the caller may acknowledge the batch. In in-memory mode no fsync is
    /// issued (files are still written).
    pub fn sync(&mut self) -> Result<(), StorageError> {
        self.stats.syncs += 1;
        self.flush_dirty()?;
        let durable = self.durable_hard_state;
        if self.hard_state.term != durable.term || self.hard_state.vote != durable.vote {
            self.write_hard_state()?;
        }
        Ok(())
    }

    /// Makes `snapshot` the current one, durably before returning (temp
    /// file, fsync, rename, directory fsync). If the log holds the
    /// snapshot's last entry with the same term, the entries after it are
    /// kept; otherwise the whole log is discarded (Raft Fig. 13) and the
    /// next append must be at `snapshot.meta.index + 1`. A snapshot not newer
    /// than the current one is ignored. Segments the snapshot covers stay
    /// on disk until [`LogStore::compact`].
    pub fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StorageError> {
        let meta = &snapshot.meta;
        if meta.index <= self.snapshot_index() {
            return Ok(());
        }
        self.write_atomically(SNAPSHOT_FILE, &encode_snapshot(snapshot))?;
        let keeps_log = meta.index <= self.last_index && self.physical_term(meta.index) == Some(meta.term);
        self.snapshot = Some(meta.clone());
        if !keeps_log {
            self.remove_all_segments()?;
            self.last_index = meta.index;
            self.last_term = meta.term;
        }
        if self.hard_state != self.durable_hard_state {
            self.write_hard_state()?;
        }
        Ok(())
    }

    /// Removes the segments that hold only entries at or below
    /// `min(upto, snapshot index)` (never the last segment), oldest first,
    /// then fsyncs the directory. Returns how many were removed.
    pub fn compact(&mut self, upto: Index) -> Result<usize, StorageError> {
        let limit = upto.min(self.snapshot_index());
        let count = self.segments.windows(2).take_while(|w| w[1].first <= limit + 1).count();
        let removed: Vec<Segment> = self.segments.drain(..count).collect();
        for segment in &removed {
            self.remove_file(&segment.name)?;
        }
        if count > 0 {
            self.fsync_dir()?;
        }
        if self.hard_state != self.durable_hard_state {
            self.write_hard_state()?;
        }
        Ok(count)
    }

    /// The first index the log can return (snapshot index + 1).
    pub fn first_index(&self) -> Index {
        self.snapshot_index() + 1
    }

    /// The last index in the log, or the snapshot index if the log is empty.
    pub fn last_index(&self) -> Index {
        self.last_index
    }

    /// The term of `last_index()`.
    pub fn last_term(&self) -> Term {
        self.last_term
    }

    /// The term at `index`: 0 for index 0, the snapshot's term at its index,
    /// `None` if compacted away or beyond the log.
    pub fn term(&self, index: Index) -> Option<Term> {
        if index == 0 {
            return Some(0);
        }
        match &self.snapshot {
            Some(meta) if index == meta.index => Some(meta.term),
            Some(meta) if index < meta.index => None,
            _ if index > self.last_index => None,
            _ => self.physical_term(index),
        }
    }

    /// The entries `lo..hi` (read from disk). Errors with
    /// [`StorageError::OutOfRange`] outside `first_index() ..= last_index()`.
    pub fn entries(&mut self, lo: Index, hi: Index) -> Result<Vec<Entry>, StorageError> {
        let (first, last) = (self.first_index(), self.last_index);
        if lo > hi || lo < first || hi > last + 1 {
            return Err(StorageError::OutOfRange { lo, hi, first, last });
        }
        let max = self.options.max_record_bytes as usize;
        let mut out = Vec::with_capacity((hi - lo) as usize);
        for segment in &self.segments {
            let (from, to) = (lo.max(segment.first), hi.min(segment.end()));
            if from >= to {
                continue;
            }
            let start = segment.offsets[(from - segment.first) as usize];
            let end = segment.offsets.get((to - segment.first) as usize).copied().unwrap_or(segment.len);
            let buf = self
                .disk
                .read_range(&segment.name, start, (end - start) as usize)
                .map_err(StorageError::io("read", &segment.name))?;
            let mut offset = 0;
            for index in from..to {
                match read_record(&buf, offset, max) {
                    RecordRead::Entry { entry, next } if entry.index == index => {
                        out.push(entry);
                        offset = next;
                    }
                    _ => {
                        return Err(StorageError::Corrupt {
                            file: segment.name.clone(),
                            offset: start + offset as u64,
                            reason: "record changed on disk since it was written",
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// The current snapshot's meta, if any.
    pub fn snapshot_meta(&self) -> Option<&SnapshotMeta> {
        self.snapshot.as_ref()
    }

    /// Reads the current snapshot from disk.
    pub fn read_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        if self.snapshot.is_none() {
            return Ok(None);
        }
        let bytes = self.disk.read(SNAPSHOT_FILE).map_err(StorageError::io("read", SNAPSHOT_FILE))?;
        decode_snapshot(&bytes, SNAPSHOT_FILE).map(Some)
    }

    /// The hard state last given to `save_hard_state` (or recovered).
    pub fn hard_state(&self) -> HardState {
        self.hard_state
    }

    /// Counters since open.
    pub fn stats(&self) -> LogStats {
        self.stats
    }

    /// The options the log was opened with.
    pub fn options(&self) -> LogOptions {
        self.options
    }

    /// The number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The disk (for its counters).
    pub fn disk(&self) -> &D {
        &self.disk
    }

    /// Closes the store, giving back the disk. Unsynced data is not synced.
    pub fn into_disk(self) -> D {
        self.disk
    }

    fn snapshot_index(&self) -> Index {
        self.snapshot.as_ref().map_or(0, |meta| meta.index)
    }

    /// The term of `index` from the segments (including entries the
    /// snapshot covers but compaction has not removed).
    fn physical_term(&self, index: Index) -> Option<Term> {
        let at = self.segments.partition_point(|s| s.first <= index).checked_sub(1)?;
        let segment = &self.segments[at];
        segment.terms.get((index - segment.first) as usize).copied()
    }

    fn write_hard_state(&mut self) -> Result<(), StorageError> {
        let hard_state = self.hard_state;
        self.write_atomically(HARD_STATE_FILE, &encode_hard_state(&hard_state))?;
        self.durable_hard_state = hard_state;
        self.stats.hard_states_written += 1;
        Ok(())
    }

    /// Writes `name` as a whole: temp file, fsync, rename, directory fsync.
    fn write_atomically(&mut self, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
        let tmp = format!("{name}{TMP_SUFFIX}");
        self.disk.create(&tmp).map_err(StorageError::io("create", &tmp))?;
        self.disk.append(&tmp, bytes).map_err(StorageError::io("append", &tmp))?;
        self.fsync_file(&tmp)?;
        self.disk.rename(&tmp, name).map_err(StorageError::io("rename", &tmp))?;
        self.dir_dirty = true;
        self.fsync_dir()
    }

    /// Removes every segment, newest first (a crash leaves a prefix of the
    /// log), then fsyncs the directory.
    fn remove_all_segments(&mut self) -> Result<(), StorageError> {
        while let Some(segment) = self.segments.pop() {
            self.remove_file(&segment.name)?;
        }
        self.fsync_dir()
    }

    fn remove_file(&mut self, name: &str) -> Result<(), StorageError> {
        self.disk.remove(name).map_err(StorageError::io("remove", name))?;
        self.dirty.remove(name);
        self.dir_dirty = true;
        self.stats.segments_removed += u64::from(parse_segment_name(name).is_some());
        Ok(())
    }

    /// fsyncs every file written since its last fsync, then the directory
    /// if it changed.
    fn flush_dirty(&mut self) -> Result<(), StorageError> {
        for name in std::mem::take(&mut self.dirty) {
            self.fsync_file(&name)?;
        }
        if self.dir_dirty { self.fsync_dir() } else { Ok(()) }
    }

    fn fsync_file(&mut self, name: &str) -> Result<(), StorageError> {
        self.dirty.remove(name);
        if self.options.durable {
            self.disk.sync(name).map_err(StorageError::io("sync", name))?;
            self.stats.fsyncs += 1;
        }
        Ok(())
    }

    fn fsync_dir(&mut self) -> Result<(), StorageError> {
        self.dir_dirty = false;
        if self.options.durable {
            self.disk.sync_dir().map_err(StorageError::io("sync_dir", ""))?;
            self.stats.fsyncs += 1;
        }
        Ok(())
    }
}
