//! [`FsDisk`]: the real-file backend of [`ordo_raft::storage::Disk`]: one
//! directory, `std::fs`, fsync through `File::sync_data` and a directory
//! fsync through opening the directory and `sync_all`.
//!
//! Invariants:
//! - Every name is a plain file name inside the directory (no separators,
//!   not `.` or `..`); others are refused with `InvalidInput`.
//! - Files being appended to stay open (append mode) in a handle cache, so
//!   a group of appends costs writes only; `sync` fsyncs the cached handle.
//!   `remove`, `rename` and `create` drop the handles they invalidate.
//! - Durability is the OS's: `sync` = `fdatasync(2)` (file length included),
//!   `sync_dir` = `fsync(2)` on the directory.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ordo_raft::storage::Disk;

/// A [`Disk`] over a directory of real files.
#[derive(Debug)]
pub struct FsDisk {
    dir: PathBuf,
    open: HashMap<String, File>,
}

impl Clone for FsDisk {
    /// Another handle on the same directory (its own handle cache), e.g.
    /// for a thread that writes other files there.
    fn clone(&self) -> FsDisk {
        FsDisk { dir: self.dir.clone(), open: HashMap::new() }
    }
}

impl FsDisk {
    /// Uses `dir`, creating it (and its parents) if missing.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<FsDisk> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(FsDisk { dir, open: HashMap::new() })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> io::Result<PathBuf> {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad file name {name:?}")));
        }
        Ok(self.dir.join(name))
    }

    /// The cached append handle of `name`, opened if needed (the file must
    /// exist).
    fn handle(&mut self, name: &str) -> io::Result<&mut File> {
        if !self.open.contains_key(name) {
            let file = OpenOptions::new().append(true).open(self.path(name)?)?;
            self.open.insert(name.to_string(), file);
        }
        Ok(self.open.get_mut(name).expect("just inserted"))
    }
}

impl Disk for FsDisk {
    fn list(&mut self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file()
                && let Ok(name) = entry.file_name().into_string()
            {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        let path = self.path(name)?;
        self.open.remove(name);
        File::create(&path)?;
        Ok(())
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.handle(name)?.write_all(bytes)
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        fs::read(self.path(name)?)
    }

    fn read_range(&mut self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut file = File::open(self.path(name)?)?;
        let file_len = file.metadata()?.len();
        if offset.checked_add(len as u64).is_none_or(|end| end > file_len) {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        file.seek(SeekFrom::Start(offset))?;
        let mut buf = vec![0; len];
        file.read_exact(&mut buf)?;
        Ok(buf)
    }

    fn file_len(&mut self, name: &str) -> io::Result<u64> {
        Ok(fs::metadata(self.path(name)?)?.len())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.handle(name)?.sync_data()
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        let file = self.handle(name)?;
        if len > file.metadata()?.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "truncate beyond the end"));
        }
        // Append-mode writes go to the new end afterwards.
        file.set_len(len)
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        let path = self.path(name)?;
        self.open.remove(name);
        fs::remove_file(path)
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let (from_path, to_path) = (self.path(from)?, self.path(to)?);
        self.open.remove(from);
        self.open.remove(to);
        fs::rename(from_path, to_path)
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_raft::storage::{LogOptions, LogStore, StorageError};
    use ordo_raft::{Entry, EntryKind, HardState, Membership, Snapshot, SnapshotMeta};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicU64, Ordering};
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let unique =
                format!("ordo-fsdisk-{tag}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
            let path = std::env::temp_dir().join(unique);
            let _ = fs::remove_dir_all(&path);
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn file_operations_behave_like_the_contract() {
        let tmp = TempDir::new("ops");
        let mut disk = FsDisk::open(&tmp.0).unwrap();
        disk.create("a").unwrap();
        disk.append("a", b"hello ").unwrap();
        disk.append("a", b"world").unwrap();
        disk.sync("a").unwrap();
        assert_eq!(disk.read("a").unwrap(), b"hello world");
        assert_eq!(disk.read_range("a", 6, 5).unwrap(), b"world");
        assert!(disk.read_range("a", 8, 5).is_err());
        assert_eq!(disk.file_len("a").unwrap(), 11);
        disk.truncate("a", 5).unwrap();
        disk.append("a", b"!").unwrap();
        assert_eq!(disk.read("a").unwrap(), b"hello!");
        disk.create("b").unwrap();
        disk.append("b", b"new").unwrap();
        disk.rename("b", "a").unwrap();
        disk.sync_dir().unwrap();
        assert_eq!(disk.read("a").unwrap(), b"new");
        disk.append("a", b"er").unwrap();
        assert_eq!(disk.read("a").unwrap(), b"newer");
        assert_eq!(disk.list().unwrap(), vec!["a".to_string()]);
        disk.remove("a").unwrap();
        assert_eq!(disk.read("a").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(disk.append("a", b"x").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(disk.create("../escape").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert!(disk.list().unwrap().is_empty());
    }

    #[test]
    fn log_store_survives_reopen_on_real_files() {
        let tmp = TempDir::new("log");
        let options = LogOptions { segment_bytes: 200, max_record_bytes: 1 << 16, durable: true };
        let entry =
            |index, term| Entry { term, index, kind: EntryKind::Normal, data: vec![index as u8; 20].into() };
        let (mut log, recovered) = LogStore::open(FsDisk::open(&tmp.0).unwrap(), options).unwrap();
        assert!(recovered.entries.is_empty());
        log.append(&(1..=40).map(|i| entry(i, 1)).collect::<Vec<_>>()).unwrap();
        log.append(&(30..=35).map(|i| entry(i, 2)).collect::<Vec<_>>()).unwrap();
        log.save_hard_state(&HardState { term: 2, vote: Some(1), commit: 10 });
        log.sync().unwrap();
        let snapshot = Snapshot {
            meta: SnapshotMeta { index: 20, term: 1, membership: Membership::with_voters([1, 2]) },
            data: b"app state".to_vec(),
        };
        log.install_snapshot(&snapshot).unwrap();
        assert!(log.compact(20).unwrap() > 0);
        assert!(log.stats().fsyncs > 0);
        drop(log);

        // A torn tail: half a record appended after the last sync.
        let mut disk = FsDisk::open(&tmp.0).unwrap();
        let mut segments: Vec<String> =
            disk.list().unwrap().into_iter().filter(|n| n.ends_with(".seg")).collect();
        segments.sort();
        disk.append(segments.last().unwrap(), &[9, 0, 0, 0, 1]).unwrap();

        let (mut log, recovered) = LogStore::open(disk, options).unwrap();
        assert_eq!(recovered.snapshot, Some(snapshot));
        assert_eq!(recovered.hard_state, HardState { term: 2, vote: Some(1), commit: 10 });
        let expected: Vec<Entry> =
            (21..=29).map(|i| entry(i, 1)).chain((30..=35).map(|i| entry(i, 2))).collect();
        assert_eq!(recovered.entries, expected);
        assert_eq!(log.entries(21, 36).unwrap(), expected);
        log.append(&[entry(36, 2)]).unwrap();
        log.sync().unwrap();
        drop(log);

        // Damage in a sealed segment is reported, not dropped.
        let mut disk = FsDisk::open(&tmp.0).unwrap();
        let mut segments: Vec<String> =
            disk.list().unwrap().into_iter().filter(|n| n.ends_with(".seg")).collect();
        segments.sort();
        let mut bytes = disk.read(&segments[0]).unwrap();
        bytes[10] ^= 0x40;
        disk.create(&segments[0]).unwrap();
        disk.append(&segments[0], &bytes).unwrap();
        assert!(matches!(LogStore::open(disk, options), Err(StorageError::Corrupt { .. })));
    }
}
