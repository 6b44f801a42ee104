//! Recovery of the durable log from arbitrary bytes: it must return `Ok`
//! or a typed `StorageError`, never panic, never allocate from a length
//! it read; and what it recovers must be reopened identically.
//!
//! Input: byte 0 picks which files the rest becomes (a lone segment; a
//! segment plus a hard-state file; a segment plus a snapshot file; two
//! segments), split at byte 1.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ordo_raft::storage::{HARD_STATE_FILE, LogOptions, LogStore, MemDisk, SNAPSHOT_FILE, segment_name};
use ordo_raft::{Entry, EntryKind};

fuzz_target!(|data: &[u8]| {
    let (mode, split, rest) = match data {
        [mode, split, rest @ ..] => (*mode, *split as usize, rest),
        _ => return,
    };
    let split = split.min(rest.len());
    let (head, tail) = rest.split_at(split);
    let disk = MemDisk::new();
    match mode % 4 {
        0 => disk.put_file(&segment_name(1), rest),
        1 => {
            disk.put_file(HARD_STATE_FILE, head);
            disk.put_file(&segment_name(1), tail);
        }
        2 => {
            disk.put_file(SNAPSHOT_FILE, head);
            disk.put_file(&segment_name(1 + u64::from(mode >> 2)), tail);
        }
        _ => {
            disk.put_file(&segment_name(1), head);
            disk.put_file(&segment_name(1 + u64::from(mode >> 2)), tail);
        }
    }
    let options = LogOptions { segment_bytes: 256, max_record_bytes: 4096, durable: true };
    let Ok((mut log, recovered)) = LogStore::open(disk.clone(), options) else { return };

    // The recovered log is contiguous and matches the store's view.
    let first = log.first_index();
    for (k, entry) in recovered.entries.iter().enumerate() {
        assert_eq!(entry.index, first + k as u64);
    }
    assert_eq!(log.last_index(), first - 1 + recovered.entries.len() as u64);
    assert_eq!(log.entries(first, log.last_index() + 1).unwrap(), recovered.entries);

    // It keeps working, and a reopen sees the same state plus the append.
    let next =
        Entry { term: log.last_term(), index: log.last_index() + 1, kind: EntryKind::Noop, data: vec![] };
    log.append(std::slice::from_ref(&next)).unwrap();
    log.sync().unwrap();
    drop(log);
    let (_, again) = LogStore::open(disk, options).expect("reopen after a clean recovery");
    assert_eq!(again.entries[..recovered.entries.len()], recovered.entries[..]);
    assert_eq!(again.entries.last(), Some(&next));
    assert_eq!(again.snapshot, recovered.snapshot);
});
