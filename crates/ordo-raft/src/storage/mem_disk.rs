//! [`MemDisk`]: a deterministic in-memory [`Disk`] that knows what is
//! synced, for the simulator and tests.
//!
//! # Model
//! - Files are inodes; the directory maps names to inodes. Directory
//!   changes (create, remove, rename) since the last `sync_dir` are kept in
//!   order; a crash keeps a seeded prefix of them (an ordered metadata
//!   journal, like ext4's).
//! - Each inode remembers its durable content: a prefix of its current
//!   bytes, or (after a truncation below the synced length) the old synced
//!   bytes. A crash keeps the durable content plus nothing, all, or a torn
//!   prefix of the bytes appended since the last `sync`; a truncation not
//!   yet synced may be undone.
//! - Everything is a pure function of the operations and the crash seed.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use super::Disk;

/// Counters of a [`MemDisk`] (shared by all its clones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemDiskStats {
    /// `sync(file)` calls.
    pub file_syncs: u64,
    /// `sync_dir` calls.
    pub dir_syncs: u64,
    /// Bytes passed to `append`.
    pub bytes_written: u64,
    /// Simulated crashes.
    pub crashes: u64,
}

impl MemDiskStats {
    /// File plus directory fsyncs.
    pub fn fsyncs(&self) -> u64 {
        self.file_syncs + self.dir_syncs
    }
}

#[derive(Clone, Debug, Default)]
struct Inode {
    data: Vec<u8>,
    /// `data[..durable_len]` is durable (unless `old_durable` is set).
    durable_len: usize,
    /// The smallest length since the last sync.
    low_water: usize,
    /// The synced content, kept when a truncation cut into it before a sync.
    old_durable: Option<Vec<u8>>,
}

#[derive(Clone, Debug)]
enum DirOp {
    Link { name: String, inode: u64 },
    Unlink { name: String },
}

#[derive(Debug, Default)]
struct State {
    names: BTreeMap<String, u64>,
    durable_names: BTreeMap<String, u64>,
    pending: Vec<DirOp>,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    stats: MemDiskStats,
}

impl State {
    fn inode(&mut self, name: &str) -> io::Result<&mut Inode> {
        let id = *self.names.get(name).ok_or_else(|| not_found(name))?;
        Ok(self.inodes.get_mut(&id).expect("linked inode exists"))
    }
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no file {name:?}"))
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A deterministic in-memory disk. Clones share the same files, so a test
/// can keep a handle across a simulated [`MemDisk::crash`] and reopen.
#[derive(Clone, Debug, Default)]
pub struct MemDisk {
    state: Arc<Mutex<State>>,
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The counters so far.
    pub fn stats(&self) -> MemDiskStats {
        self.lock().stats
    }

    /// Simulates a crash (power loss): every unsynced change may be lost,
    /// chosen by `seed`. For each surviving file, the bytes appended since
    /// its last sync are kept entirely, lost entirely, or cut to a torn
    /// prefix; an unsynced truncation may be undone; of the directory
    /// changes since the last `sync_dir`, a prefix survives. Afterwards
    /// everything left counts as synced.
    pub fn crash(&self, seed: u64) {
        let mut rng = seed ^ 0x5DEE_CE66_D1CE_4E5B;
        let mut st = self.lock();
        let st = &mut *st;
        st.stats.crashes += 1;
        let keep_ops = (splitmix64(&mut rng) % (st.pending.len() as u64 + 1)) as usize;
        let mut names = std::mem::take(&mut st.durable_names);
        for op in st.pending.drain(..).take(keep_ops) {
            match op {
                DirOp::Link { name, inode } => {
                    names.insert(name, inode);
                }
                DirOp::Unlink { name } => {
                    names.remove(&name);
                }
            }
        }
        let mut inodes = HashMap::new();
        for &id in names.values() {
            let Some(mut inode) = st.inodes.remove(&id) else { continue };
            let undo_truncate = splitmix64(&mut rng).is_multiple_of(2);
            match inode.old_durable.take() {
                Some(old) if undo_truncate => inode.data = old,
                _ => {
                    let base = inode.low_water;
                    let extra = inode.data.len() - base;
                    let keep = match splitmix64(&mut rng) % 3 {
                        0 => 0,
                        1 => extra,
                        _ => (splitmix64(&mut rng) % (extra as u64 + 1)) as usize,
                    };
                    inode.data.truncate(base + keep);
                }
            }
            inode.durable_len = inode.data.len();
            inode.low_water = inode.data.len();
            inodes.insert(id, inode);
        }
        st.inodes = inodes;
        st.durable_names = names.clone();
        st.names = names;
    }

    /// Flips bit `bit` (0..8) of the byte at `offset` of `name`, in its
    /// durable content too (media corruption).
    pub fn corrupt(&self, name: &str, offset: u64, bit: u8) -> io::Result<()> {
        let mut st = self.lock();
        let inode = st.inode(name)?;
        let at = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let byte = inode.data.get_mut(at).ok_or(io::ErrorKind::UnexpectedEof)?;
        *byte ^= 1 << (bit % 8);
        if let Some(old) = inode.old_durable.as_mut().and_then(|old| old.get_mut(at)) {
            *old ^= 1 << (bit % 8);
        }
        Ok(())
    }

    /// Writes `name` with `bytes` (replacing it) and makes it durable, file
    /// and directory (so every pending directory change becomes durable
    /// too), without counting fsyncs: for tests and fuzzing that plant files.
    pub fn put_file(&self, name: &str, bytes: &[u8]) {
        let mut st = self.lock();
        let id = st.next_inode;
        st.next_inode += 1;
        let len = bytes.len();
        st.inodes
            .insert(id, Inode { data: bytes.to_vec(), durable_len: len, low_water: len, old_durable: None });
        st.names.insert(name.to_string(), id);
        st.pending.push(DirOp::Link { name: name.to_string(), inode: id });
        st.durable_names = st.names.clone();
        st.pending.clear();
    }

    /// The current content of `name` (what a read would see).
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        let mut st = self.lock();
        st.inode(name).ok().map(|inode| inode.data.clone())
    }
}

impl Disk for MemDisk {
    fn list(&mut self) -> io::Result<Vec<String>> {
        Ok(self.lock().names.keys().cloned().collect())
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        let mut st = self.lock();
        let id = st.next_inode;
        st.next_inode += 1;
        st.inodes.insert(id, Inode::default());
        st.names.insert(name.to_string(), id);
        st.pending.push(DirOp::Link { name: name.to_string(), inode: id });
        Ok(())
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        st.inode(name)?.data.extend_from_slice(bytes);
        st.stats.bytes_written += bytes.len() as u64;
        Ok(())
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        Ok(self.lock().inode(name)?.data.clone())
    }

    fn read_range(&mut self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut st = self.lock();
        let data = &st.inode(name)?.data;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start.checked_add(len).ok_or(io::ErrorKind::UnexpectedEof)?;
        data.get(start..end).map(<[u8]>::to_vec).ok_or_else(|| io::ErrorKind::UnexpectedEof.into())
    }

    fn file_len(&mut self, name: &str) -> io::Result<u64> {
        Ok(self.lock().inode(name)?.data.len() as u64)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        let mut st = self.lock();
        let inode = st.inode(name)?;
        inode.durable_len = inode.data.len();
        inode.low_water = inode.data.len();
        inode.old_durable = None;
        st.stats.file_syncs += 1;
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        let mut st = self.lock();
        let inode = st.inode(name)?;
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        if len > inode.data.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "truncate beyond the end"));
        }
        if len < inode.durable_len && inode.old_durable.is_none() {
            inode.old_durable = Some(inode.data[..inode.durable_len].to_vec());
        }
        inode.data.truncate(len);
        inode.low_water = inode.low_water.min(len);
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        let mut st = self.lock();
        st.names.remove(name).ok_or_else(|| not_found(name))?;
        st.pending.push(DirOp::Unlink { name: name.to_string() });
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let mut st = self.lock();
        let id = st.names.remove(from).ok_or_else(|| not_found(from))?;
        st.names.insert(to.to_string(), id);
        // One journal entry would be more faithful; a link then an unlink in
        // order keeps the target intact at every prefix, which is what
        // atomic rename promises.
        st.pending.push(DirOp::Link { name: to.to_string(), inode: id });
        st.pending.push(DirOp::Unlink { name: from.to_string() });
        Ok(())
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        let mut st = self.lock();
        st.durable_names = st.names.clone();
        st.pending.clear();
        st.stats.dir_syncs += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_data_survives_and_unsynced_may_not() {
        let mut torn = 0;
        for seed in 0..64 {
            let mut disk = MemDisk::new();
            disk.create("a").unwrap();
            disk.append("a", b"durable").unwrap();
            disk.sync("a").unwrap();
            disk.sync_dir().unwrap();
            disk.append("a", b"-lost?").unwrap();
            disk.create("b").unwrap();
            disk.crash(seed);
            let a = disk.read("a").unwrap();
            assert!(a.starts_with(b"durable"));
            assert!(b"durable-lost?".starts_with(&a));
            torn += usize::from(a.len() > 7 && a.len() < 13);
        }
        assert!(torn > 0, "some seeds tear the tail");
    }

    #[test]
    fn unsynced_truncation_may_be_undone_and_rename_is_atomic() {
        for seed in 0..32 {
            let mut disk = MemDisk::new();
            disk.put_file("f", b"0123456789");
            disk.truncate("f", 4).unwrap();
            disk.create("t").unwrap();
            disk.append("t", b"new").unwrap();
            disk.sync("t").unwrap();
            disk.put_file("x", b"old");
            disk.rename("t", "x").unwrap();
            disk.crash(seed);
            let f = disk.read("f").unwrap();
            assert!(f == b"0123" || f == b"0123456789", "{f:?}");
            let x = disk.read("x").unwrap();
            assert!(x == b"old" || x == b"new", "{x:?}");
        }
    }
}
