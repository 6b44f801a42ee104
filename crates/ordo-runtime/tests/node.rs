//! A vsync group embedded in an application through [`Node`]: three
//! members in one process (shm fabric, control plane on loopback), the
//! application's delivery and view upcalls, and [`ViewSender`] handles that
//! follow the views. Member 2 leaves gracefully while everyone sends; the
//! others get the new view through the upcall, every message of members 0
//! and 1 is delivered exactly once at both (sends refused as `Wedged`
//! during the change are retried by the application, the view change
//! resends what its trim cut), in the same order, and what member 2
//! delivered of view 0 is a prefix of theirs.

use ordo_fabric::MemberId;
use ordo_runtime::{Node, NodeApp, NodeExit, OrdoConfig, Secret};
use ordo_vsync::{MembershipEvent, SendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Log = Arc<Mutex<Vec<(u64, MemberId, u64)>>>;

fn free_port() -> u16 {
    ordo_runtime::unused_local_port().expect("a free port")
}

fn config(id: u32, cluster: &str, control: &[u16], secret: &std::path::Path) -> OrdoConfig {
    let text = format!(
        r#"
[member]
id = {id}
[group]
members = [0, 1, 2]
[fabric.shm]
cluster = "{cluster}"
[security]
secret_file = "{}"
[vsync]
window = 16
max_payload = 64
[node]
control = [{{ id = 0, addr = "127.0.0.1:{}" }}, {{ id = 1, addr = "127.0.0.1:{}" }}, {{ id = 2, addr = "127.0.0.1:{}" }}]
tick_ms = 10
"#,
        secret.display(),
        control[0],
        control[1],
        control[2]
    );
    OrdoConfig::load_str(
        &text,
        std::path::Path::new("test.toml"),
        std::iter::empty::<(String, String)>(),
        &[],
    )
    .unwrap()
}

/// Sends `count` messages (index in the first 8 bytes) from `node`,
/// retrying while the window is full or a view change is under way.
fn send(node: &Node, from: u64, count: u64) {
    let s = node.sender(0).expect("subgroup 0");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut k = from;
    while k < from + count {
        match s.try_send_with(8, |b| b.copy_from_slice(&k.to_le_bytes())) {
            Ok(()) => k += 1,
            Err(SendError::WouldBlock | SendError::Wedged) => {
                assert!(Instant::now() < deadline, "sends stuck");
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn an_embedded_group_changes_views_under_the_application() {
    let dir = std::env::temp_dir().join(format!("ordo-node-embed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.secret");
    Secret::generate_file(&secret).unwrap();
    let cluster = format!("embed-{}", std::process::id());
    let control = [free_port(), free_port(), free_port()];
    let logs: Vec<Log> = (0..3).map(|_| Log::default()).collect();
    let views: Vec<Arc<Mutex<Vec<MembershipEvent>>>> = (0..3).map(|_| Arc::default()).collect();
    let nodes: Vec<Node> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3u32)
            .map(|id| {
                let c = config(id, &cluster, &control, &secret);
                let (log, view) = (logs[id as usize].clone(), views[id as usize].clone());
                s.spawn(move || {
                    let app = NodeApp {
                        on_deliver: Some(Box::new(move |v, batch| {
                            let mut l = log.lock().unwrap();
                            for d in batch {
                                l.push((v, d.sender, u64::from_le_bytes(d.payload[..8].try_into().unwrap())));
                            }
                        })),
                        on_view: Some(Box::new(move |e| view.lock().unwrap().push(e.clone()))),
                        ..NodeApp::default()
                    };
                    Node::start_with(&c, app).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Everyone sends; member 2 leaves half way through members 0 and 1's
    // sends.
    std::thread::scope(|s| {
        s.spawn(|| send(&nodes[0], 0, 400));
        s.spawn(|| send(&nodes[1], 0, 400));
        s.spawn(|| {
            send(&nodes[2], 0, 50);
            std::thread::sleep(Duration::from_millis(20));
            nodes[2].leave();
        });
    });
    assert_eq!(nodes[2].wait(Duration::from_secs(10)), Some(NodeExit::Removed { next: 1 }));
    // And on, in the new view.
    std::thread::scope(|s| {
        s.spawn(|| send(&nodes[0], 400, 100));
        s.spawn(|| send(&nodes[1], 400, 100));
    });
    // Both survivors delivered every message of 0 and 1.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let done = [0, 1].iter().all(|&m| {
            let l = logs[m].lock().unwrap();
            [0, 1].iter().all(|&s| l.iter().filter(|x| x.1 == s).count() == 500)
        });
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "survivors did not deliver everything");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (a, b) = (logs[0].lock().unwrap().clone(), logs[1].lock().unwrap().clone());
    assert_eq!(a, b, "the survivors delivered the same messages in the same order, in the same views");
    for s in [0u32, 1] {
        let idx: Vec<u64> = a.iter().filter(|x| x.1 == s).map(|x| x.2).collect();
        assert_eq!(idx, (0..500).collect::<Vec<_>>(), "member {s}'s messages once each, in order");
    }
    assert!(a.iter().any(|x| x.0 == 1), "deliveries continued in view 1");
    let left: Vec<_> = logs[2].lock().unwrap().iter().filter(|x| x.0 == 0).cloned().collect();
    let survivors_v0: Vec<_> = a.iter().filter(|x| x.0 == 0).cloned().collect();
    assert!(
        left.len() <= survivors_v0.len() && left[..] == survivors_v0[..left.len()],
        "the leaver's view 0 is a prefix"
    );
    for m in [0, 1] {
        let v = views[m].lock().unwrap();
        assert!(
            v.iter().any(|e| matches!(e, MembershipEvent::Installed { view, left, .. } if view.id == 1 && view.members == vec![0, 1] && *left == vec![2])),
            "member {m}'s view upcall saw view 1 without member 2: {v:?}"
        );
    }
    assert!(views[2].lock().unwrap().iter().any(|e| matches!(e, MembershipEvent::Removed { .. })));
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}
