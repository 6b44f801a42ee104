//! State transfer in the runtime, on shm: three members in this process
//! with log garbage collection on (the default) and an application whose
//! state is a running hash and count of the delivered payloads. A follower
//! crashes; the others commit far past it, and GC drops what it lacked; it
//! restarts with empty state (a new incarnation), rejoins by a snapshot of
//! the application plus the log suffix, and then delivers new messages in
//! the same order as the others, ending with the same application state.

use ordo_acuerdo::{Header, Role};
use ordo_fabric::MemberId;
use ordo_runtime::acuerdo::{
    AcuerdoClient, AcuerdoMember, ClientEvent, MemberOptions, connect_local_group, region_len,
    runtime_config, start_member,
};
use ordo_runtime::{Backend, MemberFabric, Runner};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The application: count and running hash of delivered payloads, and the
/// headers this incarnation delivered (with their positions in the order).
#[derive(Default)]
struct App {
    count: u64,
    hash: u64,
    delivered: Vec<(u64, Header)>,
    restored: Option<Header>,
}

type Shared = Arc<Mutex<App>>;

fn mix(hash: u64, payload: &[u8]) -> u64 {
    payload.iter().fold(hash, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3))
}

fn options(app: &Shared) -> MemberOptions {
    let (a, b, c) = (app.clone(), app.clone(), app.clone());
    MemberOptions {
        on_deliver: Some(Box::new(move |h, p| {
            let mut app = a.lock().unwrap();
            let pos = app.count;
            app.count += 1;
            app.hash = mix(app.hash, p);
            app.delivered.push((pos, h));
        })),
        on_snapshot: Some(Box::new(move || {
            let app = b.lock().unwrap();
            [app.count.to_le_bytes(), app.hash.to_le_bytes()].concat()
        })),
        on_restore: Some(Box::new(move |h, state| {
            let mut app = c.lock().unwrap();
            app.count = u64::from_le_bytes(state[..8].try_into().unwrap());
            app.hash = u64::from_le_bytes(state[8..16].try_into().unwrap());
            app.restored.get_or_insert(h); // the first restore
        })),
        ..MemberOptions::default()
    }
}

struct Member {
    runner: Option<Runner<AcuerdoMember<MemberFabric>>>,
    client: AcuerdoClient,
    app: Shared,
}

fn config(ids: &[MemberId], me: MemberId, incarnation: u64) -> ordo_acuerdo::Config {
    let mut cfg = runtime_config(ids.to_vec(), me);
    assert!(cfg.log_gc, "log garbage collection is on by default");
    cfg.incarnation = incarnation;
    cfg.heartbeat_timeout_ns = 20_000_000;
    cfg
}

fn wait(what: &str, secs: u64, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Commits `count` messages through `client`, up to 16 in flight.
fn broadcast(client: &mut AcuerdoClient, first: u64, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut next, mut in_flight, mut done) = (first, 0u64, 0u64);
    while done < count {
        assert!(Instant::now() < deadline, "commits stalled at {done} of {count}");
        while in_flight < 16 && next < first + count {
            match client.submit(format!("message {next:06}").as_bytes()) {
                Ok(_) => {
                    next += 1;
                    in_flight += 1;
                }
                Err(_) => break,
            }
        }
        let mut idle = true;
        while let Some(ev) = client.poll() {
            idle = false;
            match ev {
                ClientEvent::Accepted { .. } => {}
                ClientEvent::Committed { .. } => {
                    in_flight -= 1;
                    done += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

#[test]
fn shm_a_restarted_member_rejoins_by_state_transfer() {
    let ids: Vec<MemberId> = vec![0, 1, 2];
    let cluster = format!("acuerdo-st-{}", std::process::id());
    let len = region_len(&config(&ids, 0, 1));
    let fabrics = connect_local_group(Backend::Shm, &cluster, &ids, len).expect("group connects");
    let mut members: Vec<Member> = fabrics
        .into_iter()
        .zip(&ids)
        .map(|(fabric, &id)| {
            let app = Shared::default();
            let (runner, client) = start_member(fabric, config(&ids, id, 1), options(&app)).expect("starts");
            Member { runner: Some(runner), client, app }
        })
        .collect();
    wait("a leader", 10, || {
        members.iter().filter(|m| m.client.status().role() == Role::Leader).count() == 1
            && members.iter().all(|m| m.client.status().leader().is_some())
    });
    let l = members.iter().position(|m| m.client.status().is_leader()).expect("leader");
    let v = (l + 1) % 3;
    broadcast(&mut members[l].client, 0, 200);
    wait("200 everywhere", 10, || members.iter().all(|m| m.app.lock().unwrap().count >= 200));

    // Crash the follower; commit far past it.
    drop(members[v].runner.take().expect("running").join());
    let crashed_at = members[v].app.lock().unwrap().count;
    broadcast(&mut members[l].client, 1_000, 1_500);
    let leader_status = members[l].client.status().clone();
    wait("GC past the crashed member", 10, || leader_status.log_len() < 200);

    // Restart it: a new incarnation of its shm region, empty state. (The
    // old client goes too: its doorbell maps the old region.)
    drop(members.remove(v));
    let o = ordo_fabric_shm::ShmOptions::new(&cluster, ids[v], ids.clone(), len);
    let fabric = MemberFabric::Shm(ordo_fabric_shm::ShmFabric::create(o).expect("restarts"));
    let app = Shared::default();
    let (runner, client) = start_member(fabric, config(&ids, ids[v], 2), options(&app)).expect("starts");
    members.insert(v, Member { runner: Some(runner), client, app });
    let status = members[v].client.status().clone();
    wait("the restarted member to sync", 20, || status.is_synced() && status.restores() > 0);
    let restored = members[v].app.lock().unwrap().restored.expect("restored");
    assert!(members[v].app.lock().unwrap().count > crashed_at + 1_000, "the snapshot covers what it missed");

    // New messages: same order everywhere, same application state.
    broadcast(&mut members[l].client, 10_000, 300);
    let total = members[l].app.lock().unwrap().count;
    wait("everything everywhere", 10, || members.iter().all(|m| m.app.lock().unwrap().count >= total));
    let reference: BTreeMap<u64, Header> = members[l].app.lock().unwrap().delivered.iter().copied().collect();
    let mine = members[v].app.lock().unwrap().delivered.clone();
    assert!(!mine.is_empty() && mine[0].1 > restored, "delivers after the snapshot");
    assert_eq!(mine.last(), reference.iter().next_back().map(|(p, h)| (*p, *h)).as_ref());
    for (pos, h) in &mine {
        assert_eq!(reference.get(pos), Some(h), "order differs at position {pos}");
    }
    let state = |m: &Member| {
        let a = m.app.lock().unwrap();
        (a.count, a.hash)
    };
    for m in &members {
        assert_eq!(state(m), state(&members[l]), "application states differ");
    }
    for m in &mut members {
        if let Some(r) = m.runner.take() {
            drop(r.join());
        }
    }
    let _ = ordo_fabric_shm::remove_stale_files(std::path::Path::new("/dev/shm"), &cluster);
}
