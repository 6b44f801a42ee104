//! vsync for real: three members on the shm fabric, predicate agents under a
//! runner, application threads sending through their handles; every member
//! must deliver the same sequence (spindle §II-A), with Spindle on and off,
//! inline or through the worker hand-off.

use ordo_fabric::MemberId;
use ordo_runtime::{
    Backend, Delivery, IdleStrategy, MemberFabric, Runner, RunnerOptions, SubgroupHandle, ThreadingMode,
    VsyncMember, connect_local_group,
};
use ordo_vsync::{DeliveryMode, GroupConfig, SubgroupConfig, Switches};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Log = Arc<Mutex<Vec<(MemberId, u64)>>>;

fn group_cfg(switches: Switches) -> GroupConfig {
    GroupConfig {
        members: vec![0, 1, 2],
        subgroups: vec![SubgroupConfig {
            name: String::new(),
            descriptor: Vec::new(),
            members: vec![0, 1, 2],
            senders: vec![0, 1, 2],
            window: 8,
            max_payload: 256,
            mode: DeliveryMode::Ordered,
        }],
        switches,
    }
}

fn region_len(switches: Switches) -> usize {
    ordo_vsync::GroupLayout::new(&group_cfg(switches)).region_len.next_multiple_of(64)
}

/// The three members' endpoints, in-process, on `backend`.
fn fabrics(backend: Backend, switches: Switches, tag: &str) -> Vec<MemberFabric> {
    let cluster = format!("vsync-rt-{}-{tag}", std::process::id());
    connect_local_group(backend, &cluster, &[0, 1, 2], region_len(switches)).expect("group connects")
}

fn run_group<F: ordo_fabric::Fabric + Send + 'static>(
    fabrics: Vec<F>,
    switches: Switches,
    worker: bool,
    per_sender: u64,
) -> Vec<Vec<(MemberId, u64)>> {
    let cfg = group_cfg(switches);
    let mut logs: Vec<Log> = Vec::new();
    let mut members = Vec::new();
    let mut handles: Vec<SubgroupHandle> = Vec::new();
    let mut workers = Vec::new();
    for f in fabrics {
        let log: Log = Arc::default();
        logs.push(log.clone());
        let record = move |sender: MemberId, payload: &[u8]| {
            let k = u64::from_le_bytes(payload[..8].try_into().unwrap());
            assert!(payload[8..].iter().all(|b| *b == (k as u8) ^ (sender as u8)), "payload intact");
            log.lock().unwrap().push((sender, k));
        };
        let delivery = if worker {
            Delivery::Worker { buffers: 4, handler: Box::new(move |m| record(m.sender, &m.payload)) }
        } else {
            Delivery::Inline(Box::new(move |batch| {
                for d in batch {
                    record(d.sender, d.payload);
                }
            }))
        };
        let (m, mut h, w) = VsyncMember::new(f, cfg.clone(), delivery).unwrap();
        handles.push(h.remove(0).expect("every member sends"));
        members.push(m);
        workers.extend(w);
    }
    let counters: Vec<_> = members.iter().map(|m| m.counters()).collect();
    // All three predicate loops in one thread (shared mode), parking on
    // their own doorbells with a short cap.
    let idle = IdleStrategy::BackoffPark {
        spins: 100,
        yields: 20,
        park_min: Duration::from_micros(20),
        park_max: Duration::from_micros(500),
    };
    let runner = Runner::start(members, &RunnerOptions::new(ThreadingMode::Shared, idle)).unwrap();
    let senders: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            std::thread::spawn(move || {
                for k in 0..per_sender {
                    let len = 8 + (k as usize % 100);
                    h.send_with(len, Duration::from_secs(20), |buf| {
                        buf[..8].copy_from_slice(&k.to_le_bytes());
                        buf[8..].fill((k as u8) ^ (i as u8));
                    })
                    .expect("sent within the timeout");
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let want = 3 * per_sender;
    let deadline = Instant::now() + Duration::from_secs(30);
    while counters.iter().any(|c| c.delivered_messages.load(std::sync::atomic::Ordering::Acquire) < want) {
        assert!(Instant::now() < deadline, "not everything delivered");
        std::thread::sleep(Duration::from_millis(2));
    }
    let joined = runner.join();
    for m in &joined.agents {
        assert_eq!(m.stats(0).messages_delivered, want);
        assert!(m.suspected().is_empty());
    }
    drop(joined);
    for w in workers {
        w.join().unwrap();
    }
    // The worker may still be copying the last messages after the counters
    // moved; it has exited now (its queue was abandoned), so logs are final.
    logs.iter().map(|l| l.lock().unwrap().clone()).collect()
}

/// Every member delivers the same sequence (total order), containing every
/// message once, each sender's in its FIFO order. (With null-sends the
/// sequence is not the plain round-robin of application indices: a late
/// sender's rounds may be nulls.)
fn check_same_total_order(logs: &[Vec<(MemberId, u64)>], per_sender: u64) {
    for (m, log) in logs.iter().enumerate() {
        assert_eq!(log.len() as u64, 3 * per_sender, "member {m} delivered {} messages", log.len());
        if let Some(i) = log.iter().zip(&logs[0]).position(|(a, b)| a != b) {
            panic!("member {m} diverges from member 0 at position {i}: {:?} vs {:?}", log[i], logs[0][i]);
        }
        for s in 0..3 {
            let mine: Vec<u64> = log.iter().filter(|d| d.0 == s).map(|d| d.1).collect();
            assert!(mine.iter().copied().eq(0..per_sender), "member {m}: sender {s} not in FIFO order");
        }
    }
}

/// Without null-sends the order is exactly round-robin by index.
fn check_round_robin(logs: &[Vec<(MemberId, u64)>], per_sender: u64) {
    check_same_total_order(logs, per_sender);
    let want: Vec<(MemberId, u64)> = (0..per_sender).flat_map(|k| (0..3).map(move |s| (s, k))).collect();
    assert!(logs[0] == want, "not round-robin");
}

#[test]
fn three_members_deliver_one_total_order_with_spindle() {
    let logs = run_group(fabrics(Backend::Shm, Switches::SPINDLE, "spindle"), Switches::SPINDLE, false, 2000);
    check_same_total_order(&logs, 2000);
}

#[test]
fn three_members_deliver_one_total_order_in_the_baseline() {
    let logs =
        run_group(fabrics(Backend::Shm, Switches::BASELINE, "baseline"), Switches::BASELINE, false, 500);
    check_round_robin(&logs, 500);
}

#[test]
fn worker_hand_off_delivers_the_same_order() {
    let logs = run_group(fabrics(Backend::Shm, Switches::SPINDLE, "worker"), Switches::SPINDLE, true, 1000);
    check_same_total_order(&logs, 1000);
}

#[test]
fn three_members_over_tcp_deliver_one_total_order() {
    let logs = run_group(fabrics(Backend::Tcp, Switches::SPINDLE, "tcp"), Switches::SPINDLE, false, 1000);
    check_same_total_order(&logs, 1000);
}

/// Three members on libfabric's `provider`, `per_sender` messages each:
/// one total order (ofi promises no address order, so the rings keep
/// their counters).
#[cfg(feature = "ofi")]
fn ofi_total_order(provider: &str, endpoint: ordo_runtime::OfiEndpoint, tag: &str, per_sender: u64) {
    use ordo_fabric::Fabric as _;
    let cluster = format!("vsync-rt-{}-{tag}", std::process::id());
    let f = ordo_runtime::wiring::connect_local_ofi_group(
        provider,
        endpoint,
        &cluster,
        &[0, 1, 2],
        region_len(Switches::SPINDLE),
    )
    .expect("group connects");
    assert!(!f[0].address_ordered(), "ofi promises no address order: stamped rings stay off");
    let logs = run_group(f, Switches::SPINDLE, false, per_sender);
    check_same_total_order(&logs, per_sender);
}

#[cfg(feature = "ofi")]
#[test]
fn three_members_over_libfabric_tcp_rxm_deliver_one_total_order() {
    ofi_total_order("tcp;ofi_rxm", ordo_runtime::OfiEndpoint::Rdm, "ofi", 1000);
}

#[cfg(feature = "ofi")]
#[test]
fn three_members_over_libfabric_shm_deliver_one_total_order() {
    ofi_total_order("shm", ordo_runtime::OfiEndpoint::Rdm, "ofi-shm", 300);
}

#[cfg(feature = "ofi")]
#[test]
fn three_members_over_libfabric_connected_endpoints_deliver_one_total_order() {
    ofi_total_order("tcp", ordo_runtime::OfiEndpoint::Msg, "ofi-msg", 1000);
}
