//! The durable log (`ordo_raft::storage`) over `MemDisk`: round trips,
//! overwrite, segments and compaction, snapshots, hard state, crashes that
//! lose unsynced data (seeded), torn tails, corruption, bad lengths, and
//! the in-memory mode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use ordo_raft::storage::{Disk, LogOptions, LogStore, MemDisk, StorageError, segment_name};
use ordo_raft::{Entry, EntryKind, HardState, Index, Membership, Recovered, Snapshot, SnapshotMeta, Term};

/// Records the largest single allocation, to show that a huge length claim
/// is never allocated.
struct CountingAlloc;

static LARGEST_ALLOC: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn entry(index: Index, term: Term) -> Entry {
    let data = format!("cmd-{index}-{term}").into_bytes();
    Entry { term, index, kind: EntryKind::Normal, data: data.into() }
}

fn entries(range: std::ops::RangeInclusive<Index>, term: Term) -> Vec<Entry> {
    range.map(|i| entry(i, term)).collect()
}

fn options(segment_bytes: u64) -> LogOptions {
    LogOptions { segment_bytes, max_record_bytes: 1 << 20, durable: true }
}

fn open(disk: &MemDisk, opts: LogOptions) -> (LogStore<MemDisk>, Recovered) {
    LogStore::open(disk.clone(), opts).expect("open")
}

fn snapshot(index: Index, term: Term) -> Snapshot {
    Snapshot {
        meta: SnapshotMeta { index, term, membership: Membership::with_voters([1, 2, 3]) },
        data: format!("state@{index}").into_bytes(),
    }
}

#[test]
fn append_sync_reopen_round_trips() {
    let disk = MemDisk::new();
    let (mut log, recovered) = open(&disk, options(1 << 20));
    assert_eq!(recovered, Recovered::default());
    let mut written = entries(1..=10, 1);
    written[3].kind = EntryKind::Noop;
    written[4].kind = EntryKind::Membership;
    log.append(&written).unwrap();
    let hs = HardState { term: 1, vote: Some(2), commit: 4 };
    log.save_hard_state(&hs);
    log.sync().unwrap();
    assert_eq!(log.entries(1, 11).unwrap(), written);
    assert_eq!(log.entries(4, 6).unwrap(), written[3..5]);
    assert_eq!((log.first_index(), log.last_index(), log.term(7)), (1, 10, Some(1)));
    drop(log);

    let (log, recovered) = open(&disk, options(1 << 20));
    assert_eq!(recovered.entries, written);
    assert_eq!(recovered.hard_state, hs);
    assert_eq!(recovered.snapshot, None);
    assert_eq!((log.last_index(), log.last_term()), (10, 1));
}

#[test]
fn overwrite_replaces_the_conflicting_suffix_only() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(1 << 20));
    log.append(&entries(1..=10, 1)).unwrap();
    log.sync().unwrap();
    // Re-appending entries already present (same term) changes nothing.
    log.append(&entries(3..=5, 1)).unwrap();
    assert_eq!((log.last_index(), log.stats().truncations), (10, 0));
    // A conflict at 6 removes 6..=10 before writing the new entries.
    log.append(&[entry(5, 1), entry(6, 2), entry(7, 2)]).unwrap();
    assert_eq!((log.last_index(), log.last_term(), log.stats().truncations), (7, 2, 1));
    assert!(matches!(log.append(&[entry(9, 2)]), Err(StorageError::NotContiguous { expected: 8, got: 9 })));
    assert!(matches!(log.append(&[entry(8, 2), entry(10, 2)]), Err(StorageError::NotContiguous { .. })));
    assert!(matches!(log.append(&[entry(8, 1)]), Err(StorageError::TermRegression { .. })));
    log.sync().unwrap();
    let mut expected = entries(1..=5, 1);
    expected.extend(entries(6..=7, 2));
    assert_eq!(log.entries(1, 8).unwrap(), expected);
    drop(log);
    let (_, recovered) = open(&disk, options(1 << 20));
    assert_eq!(recovered.entries, expected);
}

#[test]
fn explicit_truncation_cuts_a_same_term_suffix_durably() {
    // `append` keeps a same-term entry; `truncate` cuts it anyway (an
    // owner that decides what is overwritten, like an acuerdo diff).
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(64));
    log.append(&entries(1..=20, 1)).unwrap();
    log.sync().unwrap();
    log.truncate(25).unwrap();
    assert_eq!(log.last_index(), 20, "beyond the end: nothing removed");
    log.truncate(8).unwrap();
    assert_eq!((log.last_index(), log.last_term()), (7, 1));
    log.append(&entries(8..=9, 1)).unwrap();
    log.sync().unwrap();
    drop(log);
    disk.crash(7);
    let (mut log, recovered) = open(&disk, options(64));
    assert_eq!(recovered.entries, entries(1..=9, 1));
    log.install_snapshot(&Snapshot {
        meta: SnapshotMeta { index: 4, term: 1, membership: Membership::default() },
        data: vec![1],
    })
    .unwrap();
    assert!(matches!(log.truncate(4), Err(StorageError::OutOfRange { .. })));
    assert_eq!(log.last_index(), 9, "a refused truncation changes nothing");
}

#[test]
fn overwrite_across_segments_removes_later_segments() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(64));
    log.append(&entries(1..=30, 1)).unwrap();
    log.sync().unwrap();
    let before = log.segment_count();
    assert!(before > 5, "{before} segments");
    log.append(&entries(4..=6, 2)).unwrap();
    log.sync().unwrap();
    assert!(log.segment_count() < before);
    let mut expected = entries(1..=3, 1);
    expected.extend(entries(4..=6, 2));
    assert_eq!(log.entries(1, 7).unwrap(), expected);
    drop(log);
    let (_, recovered) = open(&disk, options(64));
    assert_eq!(recovered.entries, expected);
}

#[test]
fn segments_roll_and_compaction_removes_covered_ones() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(256));
    log.append(&entries(1..=100, 3)).unwrap();
    log.sync().unwrap();
    let segments = log.segment_count();
    assert!(segments >= 5, "{segments} segments");
    assert_eq!(log.compact(100).unwrap(), 0, "nothing is covered without a snapshot");

    log.install_snapshot(&snapshot(60, 3)).unwrap();
    assert_eq!((log.first_index(), log.last_index(), log.term(60), log.term(59)), (61, 100, Some(3), None));
    assert!(matches!(log.entries(50, 70), Err(StorageError::OutOfRange { .. })));
    let removed = log.compact(60).unwrap();
    assert!(removed > 0);
    assert_eq!(log.segment_count(), segments - removed);
    let mut names = disk.clone().list().unwrap();
    names.sort();
    let first_segment = names.iter().find(|n| n.starts_with("log-")).unwrap().clone();
    assert!(first_segment.as_str() <= segment_name(61).as_str(), "{first_segment}");
    assert!(!names.contains(&segment_name(1)));
    assert_eq!(log.entries(61, 101).unwrap(), entries(61..=100, 3));
    drop(log);

    let (log, recovered) = open(&disk, options(256));
    assert_eq!(recovered.snapshot, Some(snapshot(60, 3)));
    assert_eq!(recovered.entries, entries(61..=100, 3));
    assert_eq!((log.first_index(), log.last_index()), (61, 100));
}

#[test]
fn snapshot_that_contradicts_the_log_replaces_it() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(128));
    log.append(&entries(1..=20, 1)).unwrap();
    log.sync().unwrap();
    // The leader's snapshot has another term at 15: the log is discarded.
    log.install_snapshot(&snapshot(15, 2)).unwrap();
    assert_eq!((log.first_index(), log.last_index(), log.last_term(), log.segment_count()), (16, 15, 2, 0));
    assert!(matches!(log.append(&[entry(17, 2)]), Err(StorageError::NotContiguous { expected: 16, .. })));
    log.append(&entries(16..=18, 2)).unwrap();
    log.sync().unwrap();
    // An older snapshot is ignored.
    log.install_snapshot(&snapshot(10, 1)).unwrap();
    assert_eq!(log.read_snapshot().unwrap(), Some(snapshot(15, 2)));
    drop(log);
    let (log, recovered) = open(&disk, options(128));
    assert_eq!(recovered.snapshot, Some(snapshot(15, 2)));
    assert_eq!(recovered.entries, entries(16..=18, 2));
    assert_eq!(log.first_index(), 16);

    // A snapshot beyond the log also replaces it.
    drop(log);
    let (mut log, _) = open(&disk, options(128));
    log.install_snapshot(&snapshot(40, 5)).unwrap();
    assert_eq!((log.last_index(), log.last_term()), (40, 5));
    drop(log);
    let (_, recovered) = open(&disk, options(128));
    assert_eq!(recovered.entries, vec![]);
    assert_eq!(recovered.snapshot.unwrap().meta.index, 40);
}

#[test]
fn hard_state_persists_and_commit_is_lazy() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(1 << 20));
    log.append(&entries(1..=5, 7)).unwrap();
    log.save_hard_state(&HardState { term: 7, vote: Some(3), commit: 2 });
    log.sync().unwrap();
    assert_eq!(log.stats().hard_states_written, 1);
    // Commit alone changes: no hard-state write (and no extra fsync).
    let fsyncs = disk.stats().fsyncs();
    log.save_hard_state(&HardState { term: 7, vote: Some(3), commit: 5 });
    log.sync().unwrap();
    assert_eq!(log.stats().hard_states_written, 1);
    assert_eq!(disk.stats().fsyncs(), fsyncs, "nothing to sync");
    drop(log);
    let (mut log, recovered) = open(&disk, options(1 << 20));
    assert_eq!(recovered.hard_state, HardState { term: 7, vote: Some(3), commit: 2 });
    // Commit beyond the durable log is clamped on recovery.
    log.save_hard_state(&HardState { term: 8, vote: None, commit: 99 });
    log.sync().unwrap();
    drop(log);
    let (_, recovered) = open(&disk, options(1 << 20));
    assert_eq!(recovered.hard_state, HardState { term: 8, vote: None, commit: 5 });
}

#[test]
fn group_commit_is_one_fsync_per_batch() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(1 << 20));
    log.append(&entries(1..=1, 1)).unwrap();
    log.sync().unwrap();
    let before = disk.stats();
    for i in 2..=101 {
        log.append(&[entry(i, 1)]).unwrap();
    }
    log.sync().unwrap();
    let after = disk.stats();
    assert_eq!((after.file_syncs - before.file_syncs, after.dir_syncs - before.dir_syncs), (1, 0));
    assert!(after.bytes_written - before.bytes_written >= 100 * 26);
    assert_eq!(log.stats().entries_appended, 101);
}

#[test]
fn in_memory_mode_never_fsyncs() {
    let disk = MemDisk::new();
    let opts = LogOptions { durable: false, ..options(128) };
    let (mut log, _) = open(&disk, opts);
    log.append(&entries(1..=50, 1)).unwrap();
    log.save_hard_state(&HardState { term: 1, vote: Some(1), commit: 3 });
    log.sync().unwrap();
    log.append(&entries(40..=45, 2)).unwrap();
    log.install_snapshot(&snapshot(30, 1)).unwrap();
    log.compact(30).unwrap();
    log.sync().unwrap();
    assert_eq!(log.stats().fsyncs, 0);
    drop(log);
    let (log, recovered) = open(&disk, opts);
    assert_eq!(recovered.entries.len(), 15);
    assert_eq!(log.last_index(), 45);
    assert_eq!(disk.stats().fsyncs(), 0);
}

fn only_segment(disk: &MemDisk) -> String {
    let names: Vec<String> =
        disk.clone().list().unwrap().into_iter().filter(|n| n.starts_with("log-")).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

#[test]
fn torn_tail_is_cut_and_appends_continue() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(1 << 20));
    log.append(&entries(1..=5, 1)).unwrap();
    log.sync().unwrap();
    log.append(&entries(6..=6, 1)).unwrap();
    drop(log);
    let name = only_segment(&disk);
    let len = disk.clone().file_len(&name).unwrap();
    disk.clone().truncate(&name, len - 3).unwrap();

    let (mut log, recovered) = open(&disk, options(1 << 20));
    assert_eq!(recovered.entries, entries(1..=5, 1));
    assert!(log.stats().torn_bytes_recovered > 0);
    log.append(&entries(6..=7, 1)).unwrap();
    log.sync().unwrap();
    drop(log);

    // A zero-filled tail (allocated, never written blocks) is torn too.
    disk.clone().append(&name, &[0; 100]).unwrap();
    let (_, recovered) = open(&disk, options(1 << 20));
    assert_eq!(recovered.entries, entries(1..=7, 1));
}

#[test]
fn damage_before_the_tail_is_a_hard_error() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(1 << 20));
    log.append(&entries(1..=10, 1)).unwrap();
    log.sync().unwrap();
    drop(log);
    let name = only_segment(&disk);
    disk.corrupt(&name, 60, 3).unwrap(); // inside record 2 (33-byte records)
    match LogStore::open(disk.clone(), options(1 << 20)) {
        Err(StorageError::Corrupt { file, offset, .. }) => {
            assert_eq!((file.as_str(), offset), (name.as_str(), 33))
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|(_, r)| r)),
    }

    // In a sealed (non-last) segment even the last record is synced data.
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(100));
    log.append(&entries(1..=20, 1)).unwrap();
    log.sync().unwrap();
    drop(log);
    let first = segment_name(1);
    let len = disk.clone().file_len(&first).unwrap();
    disk.corrupt(&first, len - 1, 0).unwrap();
    assert!(matches!(LogStore::open(disk.clone(), options(100)), Err(StorageError::Corrupt { .. })));
}

#[test]
fn huge_length_claim_is_rejected_without_allocating() {
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, options(1 << 20));
    log.append(&entries(1..=3, 1)).unwrap();
    log.sync().unwrap();
    drop(log);
    let name = only_segment(&disk);
    let mut bytes = disk.contents(&name).unwrap();
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0xAB; 64]);
    disk.put_file(&name, &bytes);
    let before = LARGEST_ALLOC.load(Ordering::Relaxed);
    let result = LogStore::open(disk.clone(), options(1 << 20));
    assert!(
        matches!(result, Err(StorageError::RecordTooLarge { len: 0xFFFF_FFFF, .. })),
        "{:?}",
        result.err()
    );
    let largest = LARGEST_ALLOC.load(Ordering::Relaxed);
    assert!(largest < 256 << 20, "allocated {largest} bytes (before: {before})");

    // Appending an entry beyond the limit is refused too.
    let disk = MemDisk::new();
    let (mut log, _) = open(&disk, LogOptions { max_record_bytes: 64, ..options(1 << 20) });
    let big = Entry { term: 1, index: 1, kind: EntryKind::Normal, data: vec![0; 100].into() };
    assert!(matches!(log.append(&[big]), Err(StorageError::EntryTooLarge { index: 1, .. })));
    assert!(matches!(
        LogStore::open(MemDisk::new(), LogOptions { segment_bytes: 0, ..options(1) }),
        Err(StorageError::InvalidOptions(_))
    ));
}

/// A tiny deterministic generator for the crash test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the model knows: the log now, and what must survive a crash.
#[derive(Default)]
struct Model {
    /// Entries after the snapshot, as the store holds them now.
    log: Vec<Entry>,
    snapshot: Option<Snapshot>,
    /// How many of `log` must survive a crash (synced, not since removed).
    durable_len: usize,
    /// Term and vote last synced.
    durable_hard_state: (Term, Option<u64>),
    term: Term,
}

impl Model {
    fn snap_index(&self) -> Index {
        self.snapshot.as_ref().map_or(0, |s| s.meta.index)
    }
    fn last_index(&self) -> Index {
        self.snap_index() + self.log.len() as u64
    }
    fn term_at(&self, index: Index) -> Term {
        match index.checked_sub(self.snap_index() + 1) {
            Some(k) => self.log[k as usize].term,
            None => self.snapshot.as_ref().map_or(0, |s| s.meta.term),
        }
    }
}

/// One round of random operations, a crash, and the checks after
/// recovery. Returns (unsynced entries lost, unsynced entries kept).
fn crash_round(rng: &mut Rng, disk: &MemDisk, model: &mut Model, opts: LogOptions) -> (bool, bool) {
    let (mut log, _) = open(disk, opts);
    let mut written = 0;
    for _ in 0..rng.below(40) {
        match rng.below(100) {
            0..=44 => {
                let first = model.last_index() + 1;
                let batch: Vec<Entry> = (first..first + 1 + rng.below(4))
                    .map(|i| {
                        let data = vec![i as u8; rng.below(40) as usize];
                        Entry { term: model.term, index: i, kind: EntryKind::Normal, data: data.into() }
                    })
                    .collect();
                log.append(&batch).unwrap();
                model.log.extend(batch);
            }
            45..=54 if !model.log.is_empty() => {
                // Overwrite from a random index with a newer term.
                model.term += 1;
                let keep = rng.below(model.log.len() as u64) as usize;
                let first = model.snap_index() + 1 + keep as u64;
                let batch: Vec<Entry> =
                    (first..first + 1 + rng.below(3)).map(|i| entry(i, model.term)).collect();
                log.append(&batch).unwrap();
                model.log.truncate(keep);
                model.durable_len = model.durable_len.min(keep);
                model.log.extend(batch);
            }
            55..=79 => {
                log.sync().unwrap();
                model.durable_len = model.log.len();
                let hs = log.hard_state();
                model.durable_hard_state = (hs.term, hs.vote);
            }
            80..=86 => {
                model.term += 1;
                let vote = (rng.below(2) == 0).then(|| 1 + rng.below(3));
                log.save_hard_state(&HardState { term: model.term, vote, commit: 0 });
            }
            87..=94 if !model.log.is_empty() => {
                // Snapshot of a prefix of the log: the suffix stays.
                let k = 1 + rng.below(model.log.len() as u64) as usize;
                let index = model.snap_index() + k as u64;
                log.install_snapshot(&snapshot(index, model.term_at(index))).unwrap();
                model.snapshot = Some(snapshot(index, model.term_at(index)));
                model.log.drain(..k);
                model.durable_len = model.durable_len.saturating_sub(k);
            }
            95..=96 => {
                // A leader's snapshot beyond the log: the log is replaced.
                let index = model.last_index() + 1 + rng.below(3);
                log.install_snapshot(&snapshot(index, model.term)).unwrap();
                model.snapshot = Some(snapshot(index, model.term));
                model.log.clear();
                model.durable_len = 0;
            }
            _ => {
                log.compact(model.snap_index()).unwrap();
            }
        }
        if log.stats().hard_states_written > written {
            // install_snapshot and compact also write a changed hard state.
            let hs = log.hard_state();
            model.durable_hard_state = (hs.term, hs.vote);
        }
        written = log.stats().hard_states_written;
        assert_eq!(log.last_index(), model.last_index());
    }
    drop(log);
    disk.crash(rng.next());

    let (log, recovered) = open(disk, opts);
    assert_eq!(recovered.snapshot, model.snapshot, "installed snapshots are durable");
    let r = &recovered.entries;
    assert!(r.len() >= model.durable_len, "lost synced entries: {} < {}", r.len(), model.durable_len);
    assert!(r.len() <= model.log.len(), "entries from nowhere");
    assert_eq!(r[..], model.log[..r.len()], "the recovered log is a prefix of the log at the crash");
    let hs = recovered.hard_state;
    assert_eq!((hs.term, hs.vote), model.durable_hard_state);
    assert_eq!(log.last_index(), model.snap_index() + r.len() as u64);
    let outcome = (r.len() < model.log.len(), r.len() > model.durable_len);
    model.log.truncate(r.len());
    model.durable_len = r.len();
    outcome
}

#[test]
fn crashes_lose_only_unsynced_data_over_many_seeds() {
    let (mut lost_some, mut kept_some) = (0, 0);
    for seed in 0..200u64 {
        let mut rng = Rng(seed);
        let disk = MemDisk::new();
        let opts = options(64 + rng.below(300));
        let mut model = Model { term: 1, ..Model::default() };
        for _ in 0..4 {
            let (lost, kept) = crash_round(&mut rng, &disk, &mut model, opts);
            lost_some += usize::from(lost);
            kept_some += usize::from(kept);
        }
    }
    assert!(lost_some > 50 && kept_some > 50, "crashes exercised: lost {lost_some}, kept {kept_some}");
}

/// What the fuzz target (`fuzz-storage/recover_log`) does, on a budget:
/// damaged logs (bit flips, cuts, junk, swapped lengths) recover to `Ok`
/// with a contiguous log, or to a typed error; never a panic.
#[test]
fn damaged_logs_recover_or_fail_with_a_typed_error() {
    let opts = LogOptions { segment_bytes: 200, max_record_bytes: 4096, durable: true };
    let pristine = MemDisk::new();
    let (mut log, _) = open(&pristine, opts);
    log.append(&entries(1..=12, 1)).unwrap();
    log.save_hard_state(&HardState { term: 1, vote: Some(1), commit: 3 });
    log.sync().unwrap();
    log.install_snapshot(&snapshot(4, 1)).unwrap();
    drop(log);
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for name in pristine.clone().list().unwrap() {
        let bytes = pristine.contents(&name).unwrap();
        files.push((name, bytes));
    }
    let (mut ok, mut failed) = (0, 0);
    let mut rng = Rng(7);
    for _ in 0..3000 {
        let disk = MemDisk::new();
        let victim = rng.below(files.len() as u64) as usize;
        for (k, (name, bytes)) in files.iter().enumerate() {
            let mut bytes = bytes.clone();
            if k == victim {
                match rng.below(4) {
                    0 if !bytes.is_empty() => {
                        let at = rng.below(bytes.len() as u64) as usize;
                        bytes[at] ^= 1 << rng.below(8);
                    }
                    1 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
                    2 => bytes.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
                    _ if bytes.len() >= 4 => {
                        let at = rng.below(bytes.len() as u64 - 3) as usize;
                        bytes[at..at + 4].copy_from_slice(&(rng.next() as u32).to_le_bytes());
                    }
                    _ => {}
                }
            }
            disk.put_file(name, &bytes);
        }
        match LogStore::open(disk, opts) {
            Ok((mut log, recovered)) => {
                ok += 1;
                let first = log.first_index();
                for (k, e) in recovered.entries.iter().enumerate() {
                    assert_eq!(e.index, first + k as u64);
                }
                assert_eq!(log.entries(first, log.last_index() + 1).unwrap(), recovered.entries);
            }
            Err(StorageError::Corrupt { .. } | StorageError::RecordTooLarge { .. }) => failed += 1,
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    assert!(ok > 100 && failed > 100, "ok {ok}, failed {failed}");
}
