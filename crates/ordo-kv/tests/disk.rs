//! `kv.durability = "disk"`: the replica's durable store ([`DiskStore`])
//! keeps exactly what `persist` returned from, across crashes at every
//! point of a write (an injected I/O failure at each mutating disk call,
//! then a simulated power loss that drops unsynced data), compacts its log
//! behind table snapshots, and refuses damaged files.

use ordo_acuerdo::{Epoch, Header, Persist, Recovered, Vote};
use ordo_kv::disk::{Boot, DiskError, DiskOptions, DiskStore, PROMISE_FILE};
use ordo_kv::state::{Entry, KvState, Write};
use ordo_raft::storage::{Disk, MemDisk};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A [`MemDisk`] whose mutating calls fail once a shared budget runs out
/// (the process "dies" there: nothing after it reaches the disk).
#[derive(Clone)]
struct Failing {
    disk: MemDisk,
    budget: Arc<AtomicI64>,
}

impl Failing {
    fn spend(&self) -> io::Result<()> {
        if self.budget.fetch_sub(1, Ordering::SeqCst) <= 0 {
            return Err(io::Error::other("injected failure"));
        }
        Ok(())
    }
}

impl Disk for Failing {
    fn list(&mut self) -> io::Result<Vec<String>> {
        self.disk.list()
    }
    fn create(&mut self, name: &str) -> io::Result<()> {
        self.spend()?;
        self.disk.create(name)
    }
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.spend()?;
        self.disk.append(name, bytes)
    }
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        self.disk.read(name)
    }
    fn read_range(&mut self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.disk.read_range(name, offset, len)
    }
    fn file_len(&mut self, name: &str) -> io::Result<u64> {
        self.disk.file_len(name)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.spend()?;
        self.disk.sync(name)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.spend()?;
        self.disk.truncate(name, len)
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.spend()?;
        self.disk.remove(name)
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.spend()?;
        self.disk.rename(from, to)
    }
    fn sync_dir(&mut self) -> io::Result<()> {
        self.spend()?;
        self.disk.sync_dir()
    }
}

fn options(snapshot_entries: u64) -> DiskOptions {
    // Inline table writes: the crash points stay deterministic.
    DiskOptions { snapshot_entries, segment_bytes: 256, max_record_bytes: 1 << 16, background: false }
}

fn open(
    log: &MemDisk,
    meta: &MemDisk,
    opts: DiskOptions,
) -> Result<(DiskStore<MemDisk>, Option<Boot>), DiskError> {
    DiskStore::open(log.clone(), meta.clone(), opts)
}

fn payload(n: u64) -> Vec<u8> {
    Entry {
        origin: 0,
        nonce: 1,
        request: n,
        now_ms: 1_000 + n,
        write: Write::Append { key: format!("k{}", n % 5).into_bytes(), value: n.to_string().into_bytes() },
    }
    .encode()
}

/// What a member has promised and stored, as the engine sees it: the
/// table at `base`, and every entry above `base` (the first `committed`
/// of them are committed and applied).
#[derive(Clone, Debug)]
struct Model {
    e_new: Epoch,
    vote: Vote,
    base: Header,
    table: KvState,
    log: Vec<(Header, Vec<u8>)>,
    committed: usize,
    /// Accepted (a diff's count-0 header may lie above the last entry).
    accepted: Header,
}

impl Model {
    fn new() -> Model {
        Model {
            e_new: Epoch::NONE,
            vote: Vote::NONE,
            base: Header::NONE,
            table: KvState::new(),
            log: Vec::new(),
            committed: 0,
            accepted: Header::NONE,
        }
    }

    /// The table after the first `k` entries of the log.
    fn table_after(&self, k: usize) -> KvState {
        let mut t = self.table.clone();
        for (_, p) in &self.log[..k] {
            t.apply(&Entry::decode(p).unwrap());
        }
        t
    }

    fn applied(&self) -> Header {
        if self.committed == 0 { self.base } else { self.log[self.committed - 1].0 }
    }

    /// `boot` is a state this model may restart from: the same promise,
    /// a base at a committed header with the table there, and exactly the
    /// model's entries above it.
    fn admits(&self, boot: &Option<Boot>) -> bool {
        let Some(b) = boot else {
            return self.e_new == Epoch::NONE && self.log.is_empty() && self.base == Header::NONE;
        };
        let r = &b.recovered;
        if (r.e_new, r.vote) != (self.e_new, self.vote) || accepted_of(r) != self.accepted {
            return false;
        }
        let k = if r.base == self.base {
            0
        } else {
            match self.log[..self.committed].iter().position(|(h, _)| *h == r.base) {
                Some(i) => i + 1,
                None => return false,
            }
        };
        b.state == self.table_after(k) && r.log == self.log[k..]
    }
}

/// Accepted as the engine resumes with it.
fn accepted_of(r: &Recovered) -> Header {
    r.log.last().map_or(r.base, |(h, _)| *h).max(r.accepted)
}

/// One random poll's change, applied to the model; returns the Persist.
fn step(m: &mut Model, rng: &mut u64, next: &mut u64, leader: u32) -> (Option<Header>, Option<Header>) {
    let r = splitmix(rng);
    let mut restored = None;
    let mut from = None;
    match r % 10 {
        // A new epoch (a vote, then E_new) and a diff that cuts the
        // uncommitted suffix and adds the new leader's entries.
        0 | 1 => {
            let e = Epoch::new(m.e_new.round + 1, leader);
            m.vote = Vote { e_new: e, acpt: m.log.last().map_or(m.base, |(h, _)| *h) };
            m.e_new = e;
            let cut = m.committed + (splitmix(rng) as usize % (m.log.len() - m.committed + 1));
            let f = e.header(1);
            if cut < m.log.len() {
                from = Some(m.log[cut].0);
            }
            m.log.truncate(cut);
            // Accepted the diff: the new leader's log, and sometimes
            // nothing of its own yet (Accepted = its count-0 header).
            m.accepted = e.header(0);
            from.get_or_insert(f);
            for c in 1..=(splitmix(rng) % 4) as u32 {
                *next += 1;
                m.log.push((e.header(c), payload(*next)));
                m.accepted = e.header(c);
            }
        }
        // A leader's snapshot restored: the table replaced, the log cleared.
        2 if splitmix(rng).is_multiple_of(4) => {
            let e = Epoch::new(m.e_new.round + 1, leader);
            m.e_new = e;
            let base = e.header(7);
            let mut t = m.table_after(m.log.len());
            *next += 1;
            t.apply(&Entry::decode(&payload(*next)).unwrap());
            m.table = t;
            m.base = base;
            m.log.clear();
            m.committed = 0;
            m.accepted = base;
            restored = Some(base);
        }
        // More entries in the current epoch, and some commit.
        _ => {
            if m.e_new == Epoch::NONE {
                m.e_new = Epoch::new(1, leader);
            }
            let last = m.accepted;
            let mut c = if last.epoch == m.e_new { last.count } else { 0 };
            for _ in 0..1 + splitmix(rng) % 4 {
                c += 1;
                *next += 1;
                let h = m.e_new.header(c);
                from.get_or_insert(h);
                m.log.push((h, payload(*next)));
                m.accepted = h;
            }
        }
    }
    // Commits advance (never past the log).
    let before = m.committed;
    m.committed = (m.committed + (splitmix(rng) % 4) as usize).min(m.log.len());
    let _ = before;
    (from, restored)
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Runs one poll's persist against `store`, as the server does: the table
/// handed over is the one at the last applied header.
fn persist(
    store: &mut DiskStore<impl Disk + Clone + Send + 'static>,
    m: &Model,
    from: Option<Header>,
    restored: Option<Header>,
    applied_before: (Header, KvState),
) -> Result<(), DiskError> {
    let entries: Vec<(Header, &[u8])> = match from {
        Some(f) => m.log.iter().filter(|(h, _)| *h >= f).map(|(h, p)| (*h, p.as_slice())).collect(),
        None => Vec::new(),
    };
    let change =
        Persist { e_new: m.e_new, vote: m.vote, log_from: from, entries, restored, accepted: m.accepted };
    let (applied, table) = applied_before;
    let mut snap = || table.clone();
    store.persist(&change, applied, &mut snap)
}

#[test]
fn what_persist_returned_from_survives_a_crash_at_every_point() {
    let mut cases = 0;
    for seed in 0..400u64 {
        let (log, meta) = (MemDisk::new(), MemDisk::new());
        let budget = Arc::new(AtomicI64::new(i64::MAX));
        let failing = |d: &MemDisk| Failing { disk: d.clone(), budget: budget.clone() };
        let (mut store, boot) = DiskStore::open(failing(&log), failing(&meta), options(3)).unwrap();
        assert!(boot.is_none(), "an empty disk is a fresh start");
        let mut m = Model::new();
        let mut rng = seed;
        let mut next = 0;
        // Some polls that succeed.
        for _ in 0..(splitmix(&mut rng) % 12) {
            let applied = (m.applied(), m.table_after(m.committed));
            let (from, restored) = step(&mut m, &mut rng, &mut next, (seed % 3) as u32);
            // The table is at the header committed before this poll.
            persist(
                &mut store,
                &m,
                from,
                restored,
                if restored.is_some() { (m.applied(), m.table.clone()) } else { applied },
            )
            .unwrap();
        }
        // Then one poll that dies after `k` mutating disk calls.
        let before = m.clone();
        let applied = (m.applied(), m.table_after(m.committed));
        let (from, restored) = step(&mut m, &mut rng, &mut next, (seed % 3) as u32);
        let k = splitmix(&mut rng) % 16;
        budget.store(k as i64, Ordering::SeqCst);
        let result = persist(
            &mut store,
            &m,
            from,
            restored,
            if restored.is_some() { (m.applied(), m.table.clone()) } else { applied },
        );
        drop(store);
        log.crash(splitmix(&mut rng));
        meta.crash(splitmix(&mut rng));
        let (_, boot) = open(&log, &meta, options(3)).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
        if result.is_ok() {
            assert!(
                m.admits(&boot),
                "seed {seed}: a completed persist was lost: {:?}",
                boot.map(|b| b.recovered)
            );
        } else {
            cases += 1;
            // Died mid-write: the promise may be the new one and the log
            // the old one (promise first), or both old, or both new.
            let mut mixed = before.clone();
            (mixed.e_new, mixed.vote) = (m.e_new, m.vote);
            // Or everything new but the Accepted floor (written last).
            let mut floorless = m.clone();
            floorless.accepted =
                m.log.last().map_or(m.base, |(h, _)| *h).max(before.accepted.min(m.accepted));
            assert!(
                before.admits(&boot)
                    || m.admits(&boot)
                    || mixed.admits(&boot)
                    || floorless.admits(&boot)
                    || partial_ok(&before, &m, &boot),
                "seed {seed} (died after {k} calls): recovered a state neither before nor after: {:?}",
                boot.map(|b| b.recovered)
            );
        }
    }
    assert!(cases > 100, "only {cases} interrupted writes exercised");
}

/// A write that died while appending may leave a prefix of the new
/// entries after the truncation: still a state the engine accepts (every
/// stored entry was sent by a leader), and never a loss of what was
/// durable before (the committed prefix).
fn partial_ok(before: &Model, after: &Model, boot: &Option<Boot>) -> bool {
    let Some(b) = boot else { return false };
    let r = &b.recovered;
    let promise_ok =
        (r.e_new, r.vote) == (before.e_new, before.vote) || (r.e_new, r.vote) == (after.e_new, after.vote);
    // The stored log is the committed prefix (or more) of `before`, then a
    // prefix of what `after` wrote.
    let committed: Vec<Header> = before.log[..before.committed].iter().map(|(h, _)| *h).collect();
    let stored: Vec<Header> = r.log.iter().map(|(h, _)| *h).collect();
    let all_after: Vec<Header> = after.log.iter().map(|(h, _)| *h).collect();
    let keeps_committed = committed.iter().all(|h| *h <= r.base || stored.contains(h));
    let in_order = stored.windows(2).all(|w| w[0] < w[1]);
    let known = stored.iter().all(|h| before.log.iter().any(|(x, _)| x == h) || all_after.contains(h));
    // Accepted never claims more than what was written before it.
    let accepted = accepted_of(r);
    let accepted_ok = accepted == before.accepted
        || accepted == after.accepted
        || r.log.last().map_or(r.base, |(h, _)| *h) == accepted;
    promise_ok
        && keeps_committed
        && in_order
        && known
        && accepted_ok
        && r.log.last().is_none_or(|(h, _)| h.epoch <= r.e_new)
}

/// One poll of a leader in epoch `e` that appends its entry `c` (the table
/// handed over is the one before it), then delivers it: returns the
/// entry's header and payload.
fn append_one(store: &mut DiskStore<MemDisk>, e: Epoch, c: u32, table: &mut KvState) -> (Header, Vec<u8>) {
    let h = e.header(c);
    let p = payload(u64::from(c));
    let change = Persist {
        e_new: e,
        vote: Vote::NONE,
        log_from: Some(h),
        entries: vec![(h, &p)],
        restored: None,
        accepted: h,
    };
    let applied = if c > 1 { e.header(c - 1) } else { Header::NONE };
    let t = table.clone();
    store.persist(&change, applied, &mut || t.clone()).unwrap();
    // Delivered after the persist, as in the engine's poll.
    table.apply(&Entry::decode(&p).unwrap());
    (h, p)
}

#[test]
fn snapshots_bound_the_log_and_restore_the_table() {
    for background in [false, true] {
        snapshots_bound_the_log(background);
    }
}

fn snapshots_bound_the_log(background: bool) {
    let (log, meta) = (MemDisk::new(), MemDisk::new());
    let opts = DiskOptions { background, ..options(10) };
    let (mut store, _) = open(&log, &meta, opts).unwrap();
    let e = Epoch::new(1, 0);
    let mut table = KvState::new();
    let mut applied = Header::NONE;
    let mut all = Vec::new();
    for c in 1..=95u32 {
        let (h, p) = append_one(&mut store, e, c, &mut table);
        all.push((h, p));
        applied = h;
        // Inline: at most one snapshot's worth; in the background one
        // more may pile up while a table is written.
        let bound = if background { 21 } else { 11 };
        assert!(store.stored_entries() <= bound, "the log is bounded: {} entries", store.stored_entries());
        if background {
            // Let the writer run (it is another thread).
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
    store.flush_snapshot().unwrap();
    assert!(store.stats().snapshots >= 4, "{:?}", store.stats());
    let base = store.base();
    assert!(base > Header::NONE && base < applied);
    drop(store);
    let (_, boot) = open(&log, &meta, opts).unwrap();
    let boot = boot.unwrap();
    assert_eq!(boot.recovered.base, base);
    let k = all.iter().position(|(h, _)| *h == base).unwrap() + 1;
    assert_eq!(boot.recovered.log, all[k..].to_vec());
    let mut replay = boot.state.clone();
    for (_, p) in &boot.recovered.log {
        replay.apply(&Entry::decode(p).unwrap());
    }
    assert_eq!(replay, table, "the snapshot plus the log rebuild the table");
}

#[test]
fn a_damaged_promise_or_log_is_an_error_not_a_shorter_history() {
    let (log, meta) = (MemDisk::new(), MemDisk::new());
    let (mut store, _) = open(&log, &meta, options(1000)).unwrap();
    let e = Epoch::new(2, 1);
    let v = Vote { e_new: e, acpt: Header::NONE };
    let p = payload(1);
    let change = Persist {
        e_new: e,
        vote: v,
        log_from: Some(e.header(1)),
        entries: vec![(e.header(1), &p)],
        restored: None,
        accepted: e.header(1),
    };
    store.persist(&change, Header::NONE, &mut KvState::new).unwrap();
    drop(store);
    let (_, boot) = open(&log, &meta, options(1000)).unwrap();
    let r: Recovered = boot.unwrap().recovered;
    assert_eq!((r.e_new, r.vote, r.log.len()), (e, v, 1));

    let bytes = meta.contents(PROMISE_FILE).unwrap();
    meta.corrupt(PROMISE_FILE, 12, 3).unwrap();
    assert!(matches!(open(&log, &meta, options(1000)), Err(DiskError::Corrupt(_))));
    meta.put_file(PROMISE_FILE, &bytes);
    assert!(open(&log, &meta, options(1000)).is_ok());

    // A log whose promise file is gone is refused (its entries may be of
    // an epoch this member promised away).
    let mut m2 = meta.clone();
    m2.remove(PROMISE_FILE).unwrap();
    assert!(matches!(open(&log, &meta, options(1000)), Err(DiskError::Corrupt(_))));
}

/// What the `durable_files` fuzz target does, on seeded random inputs (the
/// fuzz target needs nightly): a data directory of garbage — a promise, a
/// table, a log segment, alone or together, random or a real file with
/// bytes flipped — opens to a recovery, a fresh start or a `DiskError`,
/// never a panic.
#[test]
fn garbage_files_are_refused_or_recovered_never_a_panic() {
    use ordo_kv::disk::TABLE_FILE;
    use ordo_raft::storage::segment_name;
    // Real files to damage.
    let (log, meta) = (MemDisk::new(), MemDisk::new());
    let (mut store, _) = open(&log, &meta, options(5)).unwrap();
    let e = Epoch::new(1, 0);
    let mut table = KvState::new();
    for c in 1..=12u32 {
        append_one(&mut store, e, c, &mut table);
    }
    drop(store);
    let real: Vec<(bool, String, Vec<u8>)> = meta
        .clone()
        .list()
        .unwrap()
        .into_iter()
        .map(|n| (true, n.clone(), meta.contents(&n).unwrap()))
        .chain(log.clone().list().unwrap().into_iter().map(|n| (false, n.clone(), log.contents(&n).unwrap())))
        .collect();
    assert!(
        real.iter().any(|(_, n, _)| n == TABLE_FILE),
        "a table was written: {:?}",
        real.iter().map(|r| &r.1).collect::<Vec<_>>()
    );
    let mut rng = 7u64;
    let mut outcomes = [0usize; 3];
    for round in 0..3000 {
        let (m, l) = (MemDisk::new(), MemDisk::new());
        if round % 2 == 0 {
            // Real files, one byte flipped somewhere.
            let victim = (splitmix(&mut rng) % real.len() as u64) as usize;
            for (k, (is_meta, name, bytes)) in real.iter().enumerate() {
                let mut b = bytes.clone();
                if k == victim && !b.is_empty() {
                    let at = (splitmix(&mut rng) % b.len() as u64) as usize;
                    b[at] ^= 1 << (splitmix(&mut rng) % 8);
                }
                if *is_meta { m.put_file(name, &b) } else { l.put_file(name, &b) }
            }
        } else {
            let mut junk =
                |n: u64| (0..splitmix(&mut rng) % n).map(|_| splitmix(&mut rng) as u8).collect::<Vec<u8>>();
            if round % 3 != 0 {
                m.put_file(PROMISE_FILE, &junk(64));
            }
            if round % 5 != 0 {
                m.put_file(TABLE_FILE, &junk(96));
            }
            l.put_file(&segment_name(1), &junk(128));
        }
        let opts = DiskOptions { background: false, ..options(5) };
        match DiskStore::open(l, m, opts) {
            Ok((_, Some(_))) => outcomes[0] += 1,
            Ok((_, None)) => outcomes[1] += 1,
            Err(_) => outcomes[2] += 1,
        }
    }
    assert!(outcomes[0] > 0 && outcomes[2] > 0, "recoveries, fresh starts, refusals: {outcomes:?}");
}
