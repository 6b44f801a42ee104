//! The replicated state machine layer on one node (a one-voter cluster, so
//! every proposal commits at once): outputs in order, exactly-once
//! application of retried requests, deferred group commit holding
//! everything until the sync, snapshots with the session table, and
//! recovery after a crash of the disk.

use ordo_raft::rsm::{Apply, Output, Replica, ReplicaConfig, SyncMode};
use ordo_raft::storage::{LogOptions, MemDisk};
use ordo_raft::{Config, Membership};

type R = u32; // a reply address

fn config(sync: SyncMode, snapshot_interval: u64) -> ReplicaConfig {
    let mut raft = Config::new(1, 7);
    raft.election_ticks = 10;
    raft.heartbeat_ticks = 2;
    ReplicaConfig {
        raft,
        store: LogOptions::default(),
        sync,
        snapshot_interval,
        snapshot_by_size: false,
        max_sessions: 1000,
        session_window: 64,
        initial_membership: Membership::with_voters([1]),
    }
}

/// The test's application: a running list of applied payloads.
#[derive(Default)]
struct App {
    applied: Vec<Vec<u8>>,
}

/// Drains outputs, applying commands (and answering them, as a server
/// does) and answering snapshots inline.
fn pump(r: &mut Replica<MemDisk, R>, app: &mut App) -> Vec<Output<R>> {
    let mut seen = Vec::new();
    while let Some(o) = r.next_output() {
        match &o {
            Output::Apply(Apply { index, client, request, payload, reply_to }) => {
                app.applied.push(payload.clone());
                let response = format!("ok {}", app.applied.len()).into_bytes();
                r.applied(*index, *client, *request, response.clone());
                // The caller answers an Apply that names a reply address.
                if let Some(to) = reply_to {
                    let (to, client, request) = (*to, *client, *request);
                    seen.push(Output::Reply { to, client, request, response });
                }
            }
            Output::TakeSnapshot { index } => {
                let state = app.applied.concat();
                r.snapshot_ready(*index, state).unwrap();
            }
            Output::Restore { data, .. } => {
                app.applied = data.chunks(1).map(<[u8]>::to_vec).collect();
            }
            Output::NeedSync => {}
            _ => {}
        }
        seen.push(o);
    }
    seen
}

fn become_leader(r: &mut Replica<MemDisk, R>, app: &mut App) {
    for _ in 0..100 {
        r.tick().unwrap();
        r.flush().unwrap();
        pump(r, app);
        if r.node().is_leader() {
            return;
        }
    }
    panic!("a one-voter cluster elects itself");
}

/// What `replies` shows for [`Output::Expired`].
const EXPIRED: &[u8] = b"<session expired>";

/// The answers to clients: replies, and `EXPIRED` for a request its
/// session no longer holds.
fn replies(outputs: &[Output<R>]) -> Vec<(R, u64, Vec<u8>)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Reply { to, request, response, .. } => Some((*to, *request, response.clone())),
            Output::Expired { to, request, .. } => Some((*to, *request, EXPIRED.to_vec())),
            _ => None,
        })
        .collect()
}

#[test]
fn retried_requests_apply_once_and_get_the_first_answer() {
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(MemDisk::new(), config(SyncMode::Immediate, 0)).unwrap();
    become_leader(&mut r, &mut app);
    r.request(10, 77, 1, b"a").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(replies(&out), vec![(10, 1, b"ok 1".to_vec())]);
    // The same (client, request) again, from another address: answered from
    // the session table, not applied.
    r.request(11, 77, 1, b"a").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(replies(&out), vec![(11, 1, b"ok 1".to_vec())]);
    assert_eq!(app.applied, vec![b"a".to_vec()]);
    // A newer request applies; so does a not-yet-applied older one (many
    // may be in flight); the retried one is not applied again.
    r.request(12, 77, 2, b"b").unwrap();
    r.request(12, 77, 1, b"a").unwrap();
    r.request(12, 77, 0, b"zero").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(
        replies(&out),
        vec![(12, 1, b"ok 1".to_vec()), (12, 2, b"ok 2".to_vec()), (12, 0, b"ok 3".to_vec())]
    );
    assert_eq!(app.applied, vec![b"a".to_vec(), b"b".to_vec(), b"zero".to_vec()]);
    assert_eq!(r.stats().duplicates, 2);
}

/// A client past its window: each new command's copy for the application
/// may reuse the buffer of the answer that leaves the window. Whatever the
/// sizes (commands longer and shorter than the answers, an empty one), the
/// application gets each command's bytes, in order, and each retry inside
/// the window still gets its own first answer.
#[test]
fn commands_past_a_full_window_reach_the_application_intact() {
    let mut app = App::default();
    let cfg = ReplicaConfig { session_window: 3, ..config(SyncMode::Immediate, 0) };
    let mut r: Replica<MemDisk, R> = Replica::open(MemDisk::new(), cfg).unwrap();
    become_leader(&mut r, &mut app);
    let commands: Vec<Vec<u8>> = (0..40u8).map(|i| vec![b'a' + i % 26; (i as usize * 7) % 13]).collect();
    for (i, command) in commands.iter().enumerate() {
        r.request(10, 5, i as u64 + 1, command).unwrap();
        r.flush().unwrap();
        pump(&mut r, &mut app);
    }
    assert_eq!(app.applied, commands);
    // The window holds the last three: their retries are answered from it.
    let applied = app.applied.len();
    for request in 38..=40u64 {
        r.request(11, 5, request, b"again").unwrap();
        r.flush().unwrap();
        let out = pump(&mut r, &mut app);
        assert_eq!(replies(&out), vec![(11, request, format!("ok {request}").into_bytes())]);
    }
    assert_eq!(app.applied.len(), applied, "no retry applied again");
}

#[test]
fn deferred_sync_holds_everything_until_synced_and_a_crash_before_it_loses_only_unacknowledged() {
    let disk = MemDisk::new();
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk.clone(), config(SyncMode::Deferred, 0)).unwrap();
    for _ in 0..100 {
        r.tick().unwrap();
        r.flush().unwrap();
        while r.sync_outstanding() {
            pump(&mut r, &mut app);
            r.synced().unwrap();
        }
        pump(&mut r, &mut app);
        if r.node().is_leader() {
            break;
        }
    }
    assert!(r.node().is_leader());
    // Acknowledged: request 1 goes through a full sync.
    r.request(1, 5, 1, b"x").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert!(out.contains(&Output::NeedSync));
    assert!(replies(&out).is_empty(), "nothing is answered before the sync");
    assert!(app.applied.is_empty(), "nothing is applied before the sync");
    r.synced().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(replies(&out), vec![(1, 1, b"ok 1".to_vec())]);
    // Not acknowledged: request 2 is written but the sync never happens.
    r.request(2, 5, 2, b"y").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert!(out.contains(&Output::NeedSync) && replies(&out).is_empty());
    drop(r);
    // Power cut: unsynced bytes may vanish. Whatever the crash keeps, the
    // acknowledged command is there and applied first after restart.
    disk.crash(42);
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk, config(SyncMode::Immediate, 0)).unwrap();
    become_leader(&mut r, &mut app);
    r.request(3, 6, 1, b"z").unwrap();
    r.flush().unwrap();
    pump(&mut r, &mut app);
    assert_eq!(app.applied.first(), Some(&b"x".to_vec()), "the acknowledged write survived");
    assert_eq!(app.applied.last(), Some(&b"z".to_vec()));
    assert!(app.applied.len() <= 3);
}

#[test]
fn snapshots_carry_the_sessions_and_restore_after_restart() {
    let disk = MemDisk::new();
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk.clone(), config(SyncMode::Immediate, 5)).unwrap();
    become_leader(&mut r, &mut app);
    for i in 1..=12u64 {
        r.request(1, 9, i, &[b'a' + i as u8]).unwrap();
        r.flush().unwrap();
        pump(&mut r, &mut app);
    }
    assert!(r.stats().snapshots_taken >= 2, "{:?}", r.stats());
    assert!(r.store().first_index() > 1, "the log was compacted");
    drop(r);
    let mut restored = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk, config(SyncMode::Immediate, 5)).unwrap();
    let first = pump(&mut r, &mut restored);
    assert!(matches!(first.first(), Some(Output::Restore { .. })), "{first:?}");
    become_leader(&mut r, &mut restored);
    assert_eq!(restored.applied, app.applied, "snapshot + replayed log = the state before");
    // A retry of a request covered by the snapshot is still a duplicate.
    r.request(2, 9, 12, b"again").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut restored);
    assert_eq!(replies(&out).len(), 1);
    assert_eq!(restored.applied, app.applied, "not applied twice");
}

/// A follower given a snapshot whose data is not a replica snapshot stops
/// (an error from `flush`) before persisting it, so it can reopen its disk.
#[test]
fn a_malformed_snapshot_from_a_peer_is_refused_before_it_is_persisted() {
    use ordo_raft::{Message, Snapshot, SnapshotMeta};
    let mut cfg = config(SyncMode::Immediate, 0);
    cfg.raft = Config::new(2, 7);
    cfg.initial_membership = Membership::with_voters([1, 2]);
    let disk = MemDisk::new();
    let mut r: Replica<MemDisk, R> = Replica::open(disk.clone(), cfg.clone()).unwrap();
    r.flush().unwrap();
    let snapshot = Snapshot {
        meta: SnapshotMeta { index: 10, term: 1, membership: Membership::with_voters([1, 2]) },
        data: b"not a replica snapshot".to_vec(),
    };
    r.step(Message::InstallSnapshot { term: 1, from: 1, to: 2, snapshot }).unwrap();
    assert!(r.flush().is_err(), "a malformed snapshot stops the replica");
    drop(r);
    let mut again: Replica<MemDisk, R> = Replica::open(disk, cfg).expect("the disk still opens");
    assert!(again.next_output().is_none(), "nothing to restore");
}

/// R2P2 clients keep many requests in flight (open loop): requests of one
/// client may commit out of order, and each is still applied exactly once;
/// a retry older than the whole session window is ignored, never applied
/// a second time.
#[test]
fn out_of_order_requests_of_one_client_apply_once_within_the_window() {
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(MemDisk::new(), config(SyncMode::Immediate, 0)).unwrap();
    become_leader(&mut r, &mut app);
    // Request 2 arrives (and commits) before request 1.
    r.request(1, 42, 2, b"b").unwrap();
    r.flush().unwrap();
    pump(&mut r, &mut app);
    r.request(1, 42, 1, b"a").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(replies(&out), vec![(1, 1, b"ok 2".to_vec())], "the older request still applies");
    // Retries of both are answered from the sessions, not applied.
    r.request(2, 42, 1, b"a").unwrap();
    r.request(2, 42, 2, b"b").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(replies(&out), vec![(2, 1, b"ok 2".to_vec()), (2, 2, b"ok 1".to_vec())]);
    assert_eq!(app.applied, vec![b"b".to_vec(), b"a".to_vec()]);
    // Fill the window (64) with newer requests: request 1 falls out of it.
    for id in 3..=80u64 {
        r.request(3, 42, id, &[id as u8]).unwrap();
    }
    r.flush().unwrap();
    pump(&mut r, &mut app);
    let applied = app.applied.len();
    assert_eq!(applied, 80);
    r.request(4, 42, 1, b"a").unwrap();
    r.request(4, 42, 70, &[70]).unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(
        replies(&out),
        vec![(4, 1, EXPIRED.to_vec()), (4, 70, b"ok 70".to_vec())],
        "the retry inside the window is answered, the one outside told its session expired"
    );
    assert_eq!(app.applied.len(), applied, "nothing applied twice");
    assert_eq!(r.stats().too_old, 1);
}

#[test]
fn a_volatile_replica_serves_snapshots_and_retries_and_writes_nothing_after_open() {
    let disk = MemDisk::new();
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk.clone(), config(SyncMode::Volatile, 4)).unwrap();
    let opened = disk.stats();
    become_leader(&mut r, &mut app);
    for request in 1..=10u64 {
        r.request(10, 77, request, &[request as u8]).unwrap();
        r.flush().unwrap();
        let out = pump(&mut r, &mut app);
        assert_eq!(replies(&out), vec![(10, request, format!("ok {request}").into_bytes())]);
        assert!(!out.iter().any(|o| matches!(o, Output::NeedSync)), "nothing to sync");
    }
    // A retry is still answered from the session table (which snapshots
    // carry: two were taken and the log compacted in memory).
    r.request(11, 77, 3, &[3]).unwrap();
    r.flush().unwrap();
    assert_eq!(replies(&pump(&mut r, &mut app)), vec![(11, 3, b"ok 3".to_vec())]);
    assert_eq!(app.applied.len(), 10);
    assert!(r.stats().snapshots_taken >= 2);
    assert!(r.node().first_index() > 1, "compacted in memory");
    assert_eq!(r.stats().syncs, 0);
    assert_eq!(disk.stats(), opened, "no write, sync or file operation after open");
}

#[test]
fn a_volatile_replica_refuses_a_disk_that_holds_state() {
    let disk = MemDisk::new();
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk.clone(), config(SyncMode::Immediate, 0)).unwrap();
    become_leader(&mut r, &mut app);
    drop(r);
    // Writing nothing more would leave the old vote and log behind for a
    // later open: refused.
    let err = Replica::<MemDisk, R>::open(disk, config(SyncMode::Volatile, 0)).err().expect("refused");
    assert!(matches!(err, ordo_raft::rsm::ReplicaError::VolatileOnState { term, .. } if term > 0), "{err}");
}

/// Sends one request and runs the replica until it is answered; returns
/// how many commands the application has applied.
fn one(r: &mut Replica<MemDisk, R>, app: &mut App, client: u64, request: u64) -> usize {
    r.request(10, client, request, b"x").unwrap();
    r.flush().unwrap();
    pump(r, app);
    app.applied.len()
}

#[test]
fn the_least_recently_used_session_in_log_order_is_evicted_also_after_a_restart() {
    let disk = MemDisk::new();
    let mut cfg = config(SyncMode::Immediate, 4);
    cfg.max_sessions = 3;
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk.clone(), cfg.clone()).unwrap();
    become_leader(&mut r, &mut app);
    // Clients 1, 2, 3 apply, then 1 a newer request: by their last applied
    // command the order is 2, 3, 1.
    for (client, request) in [(1, 11), (2, 21), (3, 31), (1, 12)] {
        one(&mut r, &mut app, client, request);
    }
    assert_eq!(r.stats().sessions_evicted, 0);
    // A fourth client evicts 2 (order 3, 1, 4).
    let n = one(&mut r, &mut app, 4, 41);
    assert_eq!(r.stats().sessions_evicted, 1);
    // Retries of kept sessions are answered, not applied, and do not count
    // as use.
    assert_eq!(one(&mut r, &mut app, 3, 31), n, "3's retry is a duplicate");
    assert_eq!(one(&mut r, &mut app, 1, 11), n, "1's retry is a duplicate");
    // 2's session is gone: its retry applies again (the documented cost of
    // an undersized table) and evicts the least recently used, 3 (order 1,
    // 4, 2).
    assert_eq!(one(&mut r, &mut app, 2, 21), n + 1);
    assert_eq!(r.stats().sessions_evicted, 2);
    assert_eq!(one(&mut r, &mut app, 3, 31), n + 2, "3 was evicted");
    // Order now 4, 2, 3 (1 evicted by 3's return).
    assert_eq!(r.stats().sessions_evicted, 3);
    // Restart from the disk: the order comes back from the snapshot and the
    // log after it.
    let applied = app.applied.len();
    drop(r);
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk, cfg).unwrap();
    become_leader(&mut r, &mut app);
    assert_eq!(app.applied.len(), applied, "the restart restores every applied command");
    assert_eq!(one(&mut r, &mut app, 2, 21), applied, "2 is kept");
    // A new client evicts 4, the least recently used.
    assert_eq!(one(&mut r, &mut app, 5, 51), applied + 1);
    assert_eq!(one(&mut r, &mut app, 3, 31), applied + 1, "3 is kept");
    assert_eq!(one(&mut r, &mut app, 4, 41), applied + 2, "4 was evicted");
}

/// `snapshot_by_size`: past `snapshot_interval` entries, a snapshot waits
/// until the log since the last one is as large as it was, so a table of
/// many sessions' answers is not rewritten every few entries; off, it is
/// taken every `snapshot_interval` entries.
#[test]
fn a_large_snapshot_waits_for_as_much_log_when_snapshots_go_by_size() {
    let taken = |by_size: bool| {
        let mut cfg = config(SyncMode::Immediate, 2);
        cfg.snapshot_by_size = by_size;
        let mut app = App::default();
        let mut r: Replica<MemDisk, R> = Replica::open(MemDisk::new(), cfg).unwrap();
        become_leader(&mut r, &mut app);
        // 64 clients, one request each (the answers `pump` gives are ~5 bytes):
        // a session table of ~64 × 40 bytes.
        for client in 1..=64u64 {
            one(&mut r, &mut app, client, 1);
        }
        let before = r.stats().snapshots_taken;
        // Then 200 one-byte commands of one client: ~33 bytes of log each.
        for request in 2..202u64 {
            one(&mut r, &mut app, 1, request);
        }
        r.stats().snapshots_taken - before
    };
    let every_interval = taken(false);
    let by_size = taken(true);
    assert_eq!(every_interval, 100, "one snapshot every 2 entries");
    // Each snapshot holds the 64 sessions (> 2,000 bytes): the 200 entries'
    // ~6,600 bytes of log allow a few, not one per 2 entries.
    assert!((1..=4).contains(&by_size), "{by_size} snapshots by size");
}

/// Runs one request of client 42 with its answered floor; returns the
/// replies it drew.
fn answered(
    r: &mut Replica<MemDisk, R>,
    app: &mut App,
    to: R,
    request: u64,
    floor: u64,
) -> Vec<(R, u64, Vec<u8>)> {
    r.request_answered(to, 42, request, floor, &[request as u8]).unwrap();
    r.flush().unwrap();
    replies(&pump(r, app))
}

/// A client that says which answers it has (the Raft thesis' §6.3 rule):
/// the replica forgets them and tells a late copy of such a request that
/// its session expired (not applying it),
/// still answers a retry of one not confirmed, never lowers the floor, and
/// keeps it across snapshots and a restart.
#[test]
fn answers_a_client_confirmed_are_forgotten_and_their_requests_ignored_also_after_a_restart() {
    let disk = MemDisk::new();
    let cfg = config(SyncMode::Immediate, 4);
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk.clone(), cfg.clone()).unwrap();
    become_leader(&mut r, &mut app);
    // Three requests in flight, nothing confirmed yet.
    for id in 1..=3 {
        assert_eq!(answered(&mut r, &mut app, 10, id, 1), vec![(10, id, format!("ok {id}").into_bytes())]);
    }
    // Request 4 says 1 and 2 were answered; 3 is still outstanding.
    assert_eq!(answered(&mut r, &mut app, 10, 4, 3).len(), 1);
    assert_eq!(r.stats().answers_forgotten, 2);
    // A late copy of request 2: not applied; its session no longer holds it.
    assert_eq!(answered(&mut r, &mut app, 11, 2, 1), vec![(11, 2, EXPIRED.to_vec())]);
    assert_eq!((r.stats().too_old, app.applied.len()), (1, 4));
    // A retry of request 3 gets its first answer.
    assert_eq!(answered(&mut r, &mut app, 11, 3, 3), vec![(11, 3, b"ok 3".to_vec())]);
    // A lower floor does not lower the session's; one above its request
    // says nothing (request 5's answer stays).
    assert_eq!(answered(&mut r, &mut app, 10, 5, 1).len(), 1);
    assert_eq!(answered(&mut r, &mut app, 10, 6, 100).len(), 1);
    assert_eq!(answered(&mut r, &mut app, 11, 2, 1), vec![(11, 2, EXPIRED.to_vec())]);
    assert_eq!(answered(&mut r, &mut app, 11, 5, 3), vec![(11, 5, b"ok 5".to_vec())]);
    assert_eq!((r.stats().too_old, r.stats().answers_forgotten, app.applied.len()), (2, 2, 6));
    // Snapshots were taken (every 4 entries) with the floor in them; a
    // restart restores the latest and replays the rest of the log.
    assert!(r.stats().snapshots_taken >= 1);
    drop(r);
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(disk, cfg).unwrap();
    become_leader(&mut r, &mut app);
    assert_eq!(app.applied.len(), 6, "state restored and replayed");
    assert_eq!(
        answered(&mut r, &mut app, 12, 1, 1),
        vec![(12, 1, EXPIRED.to_vec())],
        "below the floor after the restart too"
    );
    assert_eq!(answered(&mut r, &mut app, 12, 2, 1), vec![(12, 2, EXPIRED.to_vec())]);
    assert_eq!(answered(&mut r, &mut app, 12, 3, 3), vec![(12, 3, b"ok 3".to_vec())]);
    assert_eq!(answered(&mut r, &mut app, 12, 5, 3), vec![(12, 5, b"ok 5".to_vec())]);
    assert_eq!(app.applied.len(), 6, "nothing applied twice");
    // Confirming everything below 7 forgets 3 to 6.
    assert_eq!(answered(&mut r, &mut app, 12, 7, 7).len(), 1);
    assert_eq!(answered(&mut r, &mut app, 12, 5, 5), vec![(12, 5, EXPIRED.to_vec())]);
    assert_eq!(app.applied.len(), 7);
}

/// A request that was new when proposed but falls below its session's
/// floor before it applies (a later request of the client, applied first,
/// said it was answered) is not applied, and its client is told its session
/// expired; a request below the floor on arrival is told so at once, with
/// nothing proposed.
#[test]
fn a_request_below_the_floor_by_the_time_it_applies_is_not_applied_and_its_client_is_told() {
    let mut app = App::default();
    let mut r: Replica<MemDisk, R> = Replica::open(MemDisk::new(), config(SyncMode::Immediate, 0)).unwrap();
    become_leader(&mut r, &mut app);
    r.request_answered(7, 42, 6, 6, b"x").unwrap();
    r.request_answered(8, 42, 5, 0, b"y").unwrap();
    r.flush().unwrap();
    let out = pump(&mut r, &mut app);
    assert_eq!(replies(&out), vec![(7, 6, b"ok 1".to_vec()), (8, 5, EXPIRED.to_vec())]);
    assert_eq!(app.applied, vec![b"x".to_vec()], "the one below the floor is not applied");
    let proposed = r.stats().proposed;
    r.request(9, 42, 4, b"z").unwrap();
    assert_eq!(replies(&pump(&mut r, &mut app)), vec![(9, 4, EXPIRED.to_vec())], "told without a proposal");
    assert_eq!((r.stats().proposed, r.stats().too_old), (proposed, 2));
}
