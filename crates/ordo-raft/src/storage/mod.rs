//! The durable Raft log: segmented files with checksums, group commit,
//! recovery after a crash, snapshots and log compaction, over a small
//! [`Disk`] abstraction (r3p2 Ch. 6 future work).
//!
//! The Raft core does no I/O. The server that runs it takes what the core's
//! `Ready` says to persist and calls a [`LogStore`]: [`LogStore::append`]
//! for new entries, [`LogStore::save_hard_state`] for term/vote/commit,
//! [`LogStore::install_snapshot`] for snapshots, then **one**
//! [`LogStore::sync`] for the whole batch (group commit) before any message
//! or reply that depends on the batch leaves the node.
//!
//! # Backends
//! - [`MemDisk`]: deterministic in-memory disk for the simulator and tests;
//!   it remembers what is synced and [`MemDisk::crash`] throws away what a
//!   real crash may throw away.
//! - `ordo_r2p2::disk::FsDisk`: real files in one directory (`std::fs`).
//!
//! # Durability contract (durable mode, `LogOptions::durable == true`)
//! - Nothing is durable until [`LogStore::sync`] returns `Ok`. `sync` issues
//!   one fsync per file written since the last sync (normally only the
//!   active segment) plus one directory fsync if files were created or
//!   removed, then writes the hard state if its term or vote changed.
//! - **An acknowledged write is always synced first**: the caller must not
//!   answer a vote, acknowledge an append, or reply to a client on the
//!   strength of data that has not been through `sync`.
//! - Snapshots are durable when [`LogStore::install_snapshot`] returns
//!   (temp file, fsync, atomic rename, directory fsync). Overwriting a
//!   conflicting suffix makes the truncation durable before the new entries
//!   are written, so a crash never mixes the old and the new suffix.
//! - The hard state is written (temp + fsync + rename + directory fsync) by
//!   `sync`, after the log's fsync, only when its **term or vote** changed;
//!   a change of `commit` alone is written along with the next term/vote
//!   change, snapshot or compaction. Losing `commit` is safe (see
//!   [`HardState`](crate::types::HardState)); the recovered `commit` is
//!   clamped to the recovered last index.
//!
//! # What a crash may lose
//! - Everything appended, and any hard-state change, since the last `sync`:
//!   entirely, or a torn prefix of it. Recovery keeps the longest valid
//!   prefix of the log and truncates a torn or corrupt record at the tail of
//!   the **last** segment (an unsynced write). It never loses synced data:
//!   a bad record in an earlier segment, or followed by a valid record, is
//!   the hard error [`StorageError::Corrupt`].
//! - Limitation: a bit flip in the very last record of the last segment
//!   looks exactly like a torn unsynced write and is truncated.
//!
//! # In-memory mode (`LogOptions::durable == false`)
//! No fsync is ever issued. Data reaches the OS page cache (or the
//! [`MemDisk`]) and survives a process crash on a real file system, but a
//! power failure or machine crash may lose any of it, including writes that
//! were acknowledged. Use it only for benchmarks, tests, or deployments that
//! accept that risk.
//!
//! # Testing
//! `tests/storage.rs` (round trips, overwrite, compaction, snapshots, a
//! seeded crash loop over 200 seeds, torn tails, corruption, huge length
//! claims, in-memory mode) and the cargo-fuzz project `fuzz-storage/`
//! (`cargo +nightly fuzz run recover_log`: recovery from arbitrary bytes).
//!
//! # Invariants
//! - Segment files are named `log-<first index, 20 digits>.seg`; their names
//!   strictly increase and segment `k` holds exactly the indexes
//!   `[first_k, first_{k+1})`. Every segment but the last was fsynced (and
//!   the directory too) before the next one was created, so only the last
//!   segment can have a torn tail.
//! - The log is contiguous; its terms never decrease.
//! - Entries at or below the snapshot index are logically gone; the
//!   segments that hold only such entries are removed by
//!   [`LogStore::compact`] (or by recovery).

mod codec;
mod log_store;
mod mem_disk;

use std::io;

pub use codec::{
    HARD_STATE_BYTES, MAX_INDEX, RECORD_HEADER_BYTES, RECORD_MIN_BODY_BYTES, decode_hard_state,
    decode_snapshot, encode_hard_state, encode_snapshot,
};
pub use log_store::{HARD_STATE_FILE, LogOptions, LogStats, LogStore, SNAPSHOT_FILE, segment_name};
pub use mem_disk::{MemDisk, MemDiskStats};

use crate::types::Index;

/// A minimal file-system abstraction over **one flat directory**: what the
/// durable log needs, and nothing more.
///
/// Contract every backend must keep:
/// - Names are plain file names (no `/`); a backend may reject others with
///   `ErrorKind::InvalidInput`. A missing file gives `ErrorKind::NotFound`.
/// - `append`, `truncate`, `create`, `remove` and `rename` change what later
///   reads see immediately, but are **not durable** until `sync(name)` (file
///   contents and length) or `sync_dir()` (creates, removes, renames).
/// - `rename` atomically replaces `to`; after a crash either the old or the
///   new name is visible, never a mix.
/// - A crash may lose any unsynced change: for a file, all or a prefix of the
///   bytes appended since its last `sync`; for the directory, the changes
///   since the last `sync_dir`, in order (a prefix of them survives).
///
/// Object safe: `Box<dyn Disk>` works.
pub trait Disk {
    /// The names of all files in the directory, in any order.
    fn list(&mut self) -> io::Result<Vec<String>>;
    /// Creates an empty file `name`, replacing any existing one.
    fn create(&mut self, name: &str) -> io::Result<()>;
    /// Appends `bytes` at the end of the existing file `name`.
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// The whole content of `name`.
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>>;
    /// `len` bytes of `name` from `offset` (`UnexpectedEof` if shorter).
    fn read_range(&mut self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>>;
    /// The current length of `name` in bytes.
    fn file_len(&mut self, name: &str) -> io::Result<u64>;
    /// Makes the content and length of `name` durable (fsync).
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// Cuts `name` to `len` bytes (`len` ≤ current length).
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Removes `name`.
    fn remove(&mut self, name: &str) -> io::Result<()>;
    /// Atomically renames `from` to `to`, replacing `to` if it exists.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Makes creates, removes and renames in the directory durable (fsync
    /// of the directory).
    fn sync_dir(&mut self) -> io::Result<()>;
}

impl<D: Disk + ?Sized> Disk for Box<D> {
    fn list(&mut self) -> io::Result<Vec<String>> {
        (**self).list()
    }
    fn create(&mut self, name: &str) -> io::Result<()> {
        (**self).create(name)
    }
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        (**self).append(name, bytes)
    }
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        (**self).read(name)
    }
    fn read_range(&mut self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        (**self).read_range(name, offset, len)
    }
    fn file_len(&mut self, name: &str) -> io::Result<u64> {
        (**self).file_len(name)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        (**self).sync(name)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        (**self).truncate(name, len)
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        (**self).remove(name)
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        (**self).rename(from, to)
    }
    fn sync_dir(&mut self) -> io::Result<()> {
        (**self).sync_dir()
    }
}

/// Why a storage operation failed. Environmental faults and bad data are
/// typed errors; none of the decoders panic on malformed input.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The [`Disk`] failed.
    #[error("i/o error during {op} on {file:?}: {source}")]
    Io {
        op: &'static str,
        file: String,
        #[source]
        source: io::Error,
    },
    /// Synced data is damaged (checksum, framing or content), or the files
    /// contradict each other. Recovery refuses to drop it silently.
    #[error("corrupt data in {file:?} at offset {offset}: {reason}")]
    Corrupt { file: String, offset: u64, reason: &'static str },
    /// A record header claims more bytes than `max_record_bytes`; nothing
    /// that large was allocated.
    #[error("record in {file:?} at offset {offset} claims {len} bytes (limit {max})")]
    RecordTooLarge { file: String, offset: u64, len: u64, max: u64 },
    /// An entry to append encodes to more than `max_record_bytes`.
    #[error("entry {index} encodes to {len} bytes (limit {max})")]
    EntryTooLarge { index: Index, len: u64, max: u64 },
    /// Appended entries do not follow the log (or each other).
    #[error("entries not contiguous: expected index {expected}, got {got}")]
    NotContiguous { expected: Index, got: Index },
    /// An appended entry's term is below the term of the entry before it.
    #[error("entry {index} has term {term}, below the previous entry's term {previous}")]
    TermRegression { index: Index, term: u64, previous: u64 },
    /// A read outside `[first_index, last_index]`.
    #[error("range [{lo}, {hi}) outside the log [{first}, {last}]")]
    OutOfRange { lo: Index, hi: Index, first: Index, last: Index },
    /// The options make no sense.
    #[error("invalid log options: {0}")]
    InvalidOptions(&'static str),
}

impl StorageError {
    pub(crate) fn io(op: &'static str, file: &str) -> impl FnOnce(io::Error) -> StorageError {
        let file = file.to_string();
        move |source| StorageError::Io { op, file, source }
    }
}
