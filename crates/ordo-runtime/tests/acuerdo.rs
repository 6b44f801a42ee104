//! The Acuerdo agent for real: three members in this process, each on its
//! own runner thread, over the shm and tcp fabrics. They elect a leader and
//! commit the same messages in the same order everywhere; when the leader's
//! agent and fabric are dropped (a crash), the survivors elect a new leader,
//! which keeps committing, and no committed message is lost.

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

type Log = Arc<Mutex<Vec<(Header, Vec<u8>)>>>;

struct Member {
    id: MemberId,
    runner: Option<Runner<AcuerdoMember<MemberFabric>>>,
    client: AcuerdoClient,
    log: Log,
}

type Connect = fn(&str, &[MemberId], usize) -> Vec<ordo_runtime::MemberFabric>;

fn start_group(backend: Backend, tag: &str) -> Vec<Member> {
    start_group_with(
        tag,
        match backend {
            Backend::Shm => {
                |c, ids, len| connect_local_group(Backend::Shm, c, ids, len).expect("group connects")
            }
            Backend::Tcp => {
                |c, ids, len| connect_local_group(Backend::Tcp, c, ids, len).expect("group connects")
            }
            Backend::Ofi => {
                |c, ids, len| connect_local_group(Backend::Ofi, c, ids, len).expect("group connects")
            }
        },
    )
}

fn start_group_with(tag: &str, connect: Connect) -> Vec<Member> {
    start_group_tuned(tag, connect, |_| {})
}

fn start_group_tuned(tag: &str, connect: Connect, tune: fn(&mut ordo_acuerdo::Config)) -> Vec<Member> {
    let ids: Vec<MemberId> = vec![0, 1, 2];
    let cfg0 = runtime_config(ids.clone(), 0);
    let cluster = format!("acuerdo-rt-{tag}-{}", std::process::id());
    let fabrics = connect(&cluster, &ids, region_len(&cfg0));
    fabrics
        .into_iter()
        .zip(&ids)
        .map(|(fabric, &id)| {
            let log: Log = Arc::default();
            let l2 = log.clone();
            let options = MemberOptions {
                on_deliver: Some(Box::new(move |h, p| l2.lock().unwrap().push((h, p.to_vec())))),
                ..MemberOptions::default()
            };
            let mut cfg = runtime_config(ids.clone(), id);
            tune(&mut cfg);
            let (runner, client) = start_member(fabric, cfg, options).expect("starts");
            Member { id, runner: Some(runner), client, log }
        })
        .collect()
}

/// Waits until one live member leads and every other live member follows it.
fn wait_for_leader(members: &[Member], deadline: Duration) -> usize {
    let start = Instant::now();
    loop {
        let live: Vec<&Member> = members.iter().filter(|m| m.runner.is_some()).collect();
        let leaders: Vec<usize> = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.runner.is_some() && m.client.status().role() == Role::Leader)
            .map(|(i, _)| i)
            .collect();
        if let [l] = leaders[..] {
            let id = members[l].id;
            if live.iter().all(|m| m.client.status().leader() == Some(id)) {
                return l;
            }
        }
        assert!(start.elapsed() < deadline, "no leader within {deadline:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Broadcasts `count` messages through `client` with up to `window` in
/// flight; returns the committed headers and payloads, in order.
fn broadcast(client: &mut AcuerdoClient, first: u64, count: u64, window: u64) -> Vec<(Header, Vec<u8>)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut payloads: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut committed = Vec::new();
    let (mut next, mut in_flight) = (first, 0u64);
    while (committed.len() as u64) < count {
        assert!(Instant::now() < deadline, "commits stalled at {} of {count}", committed.len());
        while in_flight < window && next < first + count {
            let payload = format!("message {next:06}").into_bytes();
            match client.submit(&payload) {
                Ok(t) => {
                    payloads.insert(t, payload);
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
                ClientEvent::Committed { ticket, header } => {
                    in_flight -= 1;
                    committed.push((header, payloads.remove(&ticket).expect("a ticket of ours")));
                }
                ClientEvent::Rejected { error, .. } => panic!("the leader refused a message: {error}"),
                ClientEvent::Lost { header, .. } | ClientEvent::Unknown { header, .. } => {
                    panic!("{header:?} lost without a failure")
                }
                ClientEvent::ReadReady { .. } | ClientEvent::ReadFailed { .. } => {
                    panic!("no read was asked for")
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    committed
}

/// Waits until every live member delivered at least `n` messages.
fn wait_delivered(members: &[Member], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for m in members.iter().filter(|m| m.runner.is_some()) {
        while m.log.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "member {} delivered too little", m.id);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn crash_and_continue(backend: Backend, tag: &str) {
    crash_and_continue_with(start_group(backend, tag));
}

fn crash_and_continue_with(mut members: Vec<Member>) {
    let l = wait_for_leader(&members, Duration::from_secs(10));
    // Followers are refused with a redirect to the leader.
    let f = (l + 1) % 3;
    let redirect = members[f].client.broadcast_and_wait(b"to a follower", Duration::from_secs(5));
    assert_eq!(
        redirect,
        Err(ordo_runtime::acuerdo::ClientError::Broadcast(ordo_acuerdo::BroadcastError::NotLeader {
            leader: Some(members[l].id)
        }))
    );
    let before = broadcast(&mut members[l].client, 0, 300, 16);
    assert!(before.windows(2).all(|w| w[0].0 < w[1].0), "commit notifications in header order");
    wait_delivered(&members, before.len());
    {
        let reference = members[l].log.lock().unwrap().clone();
        assert_eq!(reference, before, "the leader delivers exactly what it committed, in order");
        for m in &members {
            assert_eq!(*m.log.lock().unwrap(), reference, "member {} delivered another order", m.id);
        }
    }

    // Crash the leader: stop its thread and drop its agent and fabric.
    let old = members[l].id;
    let joined = members[l].runner.take().expect("running").join();
    drop(joined);
    let l2 = wait_for_leader(&members, Duration::from_secs(10));
    assert_ne!(members[l2].id, old, "a survivor leads");
    let after = broadcast(&mut members[l2].client, 1000, 200, 16);
    assert!(after[0].0.epoch > before[0].0.epoch, "the new leader's messages are of a bigger epoch");
    let total = before.len() + after.len();
    wait_delivered(&members, total);
    let survivors: Vec<&Member> = members.iter().filter(|m| m.runner.is_some()).collect();
    let reference = survivors[0].log.lock().unwrap().clone();
    for m in &survivors {
        assert_eq!(*m.log.lock().unwrap(), reference, "survivor {} delivered another order", m.id);
    }
    assert_eq!(&reference[..before.len()], &before[..], "every message committed before the crash is kept");
    assert_eq!(&reference[reference.len() - after.len()..], &after[..]);
    assert!(reference.windows(2).all(|w| w[0].0 < w[1].0), "delivered in header order");
    for mut m in members {
        if let Some(r) = m.runner.take() {
            drop(r.join());
        }
    }
}

#[test]
fn shm_three_members_commit_in_order_and_survive_a_leader_crash() {
    crash_and_continue(Backend::Shm, "shm");
}

#[test]
fn tcp_three_members_commit_in_order_and_survive_a_leader_crash() {
    crash_and_continue(Backend::Tcp, "tcp");
}

#[cfg(feature = "ofi")]
#[test]
fn ofi_three_members_commit_in_order_and_survive_a_leader_crash() {
    crash_and_continue(Backend::Ofi, "ofi");
}

#[cfg(feature = "ofi")]
#[test]
fn ofi_connected_endpoints_three_members_commit_in_order_and_survive_a_leader_crash() {
    crash_and_continue_with(start_group_with("ofi-msg", |c, ids, len| {
        ordo_runtime::wiring::connect_local_ofi_group("tcp", ordo_runtime::OfiEndpoint::Msg, c, ids, len)
            .expect("group connects")
    }));
}

/// Acuerdo on libfabric's shm provider (in one process): commits in order
/// at every member. (Killing a member of an in-process shm group would pull
/// shared mappings from under the others; `tests/acuerdo_kill.rs` kills a
/// member process on ofi shm instead.)
#[cfg(feature = "ofi")]
#[test]
fn ofi_shm_three_members_commit_in_order() {
    // Every write on ofi shm waits for the previous one's delivery through
    // the peer's progress agent; with other tests on two cores a 30 ms
    // heartbeat timeout can expire, so this group tolerates a second.
    let mut members = start_group_tuned(
        "ofi-shm",
        |c, ids, len| {
            ordo_runtime::wiring::connect_local_ofi_group("shm", ordo_runtime::OfiEndpoint::Rdm, c, ids, len)
                .expect("group connects")
        },
        |c| {
            c.heartbeat_timeout_ns = 1_000_000_000;
            c.election_timeout_ns = 1_200_000_000;
        },
    );
    let l = wait_for_leader(&members, Duration::from_secs(10));
    let committed = broadcast(&mut members[l].client, 0, 300, 16);
    assert!(committed.windows(2).all(|w| w[0].0 < w[1].0), "commit notifications in header order");
    wait_delivered(&members, committed.len());
    for m in &members {
        assert_eq!(*m.log.lock().unwrap(), committed, "member {} delivered another order", m.id);
    }
    // Stop every member before any endpoint closes: in one process the shm
    // provider shares its mappings of peers between endpoints, so a member
    // still writing to a closed one would touch unmapped memory.
    let stopped: Vec<_> = members.iter_mut().filter_map(|m| m.runner.take()).map(|r| r.join()).collect();
    drop(stopped);
}
