//! A `disk` replica's data directory with arbitrary contents: the input is
//! split into a promise file, a table file and a log segment, and opening
//! the store never panics — it recovers, starts fresh, or refuses with a
//! `DiskError`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_kv::disk::{DiskOptions, DiskStore, PROMISE_FILE, TABLE_FILE};
use ordo_raft::storage::{MemDisk, segment_name};

fuzz_target!(|data: &[u8]| {
    let (meta, log) = (MemDisk::new(), MemDisk::new());
    let a = data.len() / 3;
    let b = 2 * data.len() / 3;
    if data.first().is_some_and(|x| x & 1 == 1) {
        meta.put_file(PROMISE_FILE, &data[..a]);
    }
    if data.first().is_some_and(|x| x & 2 == 2) {
        meta.put_file(TABLE_FILE, &data[a..b]);
    }
    log.put_file(&segment_name(1), &data[b..]);
    let options = DiskOptions { background: false, ..DiskOptions::default() };
    let _ = DiskStore::open(log, meta, options);
});
