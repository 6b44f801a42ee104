//! R3P2 with one OS process per replica (`ordo r3p2 serve`, durable logs
//! with fsync): clients write under load, the leader is killed with
//! SIGKILL, the clients fail over to the new leader by themselves, the
//! killed replica restarts from its directory and catches up. Checked: no
//! acknowledged write is lost (each is read back through the log), and
//! every replica — the restarted one included — converges to the same
//! values (read locally at each replica with FIXED_ROUTE). Replica traffic
//! is authenticated with a cluster secret file throughout.
//!
//! Bounded: every wait has a deadline; `Drop` kills the processes.

use ordo_r2p2::{Client, ClientConfig, KvOp, KvReply, Policy};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Replicas {
    children: Vec<Option<Child>>,
    dir: PathBuf,
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The cluster secret, made once per test directory.
fn secret_file(dir: &Path) -> PathBuf {
    let path = dir.join("cluster.secret");
    if !path.exists() {
        ordo_runtime::Secret::generate_file(&path).unwrap();
    }
    path
}

fn spawn_replica(peers: &[SocketAddr], id: usize, dir: &Path) -> Child {
    let list: Vec<String> = peers.iter().map(|p| p.to_string()).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["r3p2", "serve", "--id", &id.to_string(), "--peers", &list.join(",")])
        .args(["--snapshot-interval", "500"])
        .arg("--data")
        .arg(dir.join(id.to_string()))
        .arg("--secret-file")
        .arg(secret_file(dir))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ordo r3p2 serve");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("ready"), "replica {id} did not start: {line:?}");
    child
}

fn client(peers: &[SocketAddr], fixed: usize) -> Client {
    let mut config = ClientConfig::new(peers.to_vec());
    config.timeout = Duration::from_millis(40);
    config.retries = 100;
    config.fixed_server = fixed;
    Client::new(config).unwrap()
}

fn value_of(answer: &[u8]) -> Option<Vec<u8>> {
    match KvReply::decode(answer).expect("a KV answer") {
        KvReply::Value(v) => v,
        other => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn leader_killed_under_load_loses_no_acknowledged_write() {
    let sockets: Vec<_> = (0..3).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    drop(sockets);
    let dir = std::env::temp_dir().join(format!("ordo-r3p2-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut replicas = Replicas { children: Vec::new(), dir: dir.clone() };
    for id in 0..3 {
        let child = spawn_replica(&peers, id, &dir);
        replicas.children.push(Some(child));
    }

    // Two writers, each with its own client id; every acknowledged key is
    // remembered with its value.
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (acked, stop, peers) = (acked.clone(), stop.clone(), peers.clone());
            std::thread::spawn(move || {
                let mut c = client(&peers, 0);
                let mut failures = 0;
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let (key, value) = (format!("w{w}-{i}"), format!("v{i}"));
                    let op = KvOp::Put { key: key.clone().into_bytes(), value: value.clone().into_bytes() };
                    match c.call(Policy::ReplicatedRoute, &op.encode()) {
                        Ok(_) => acked.lock().unwrap().push((key, value)),
                        Err(_) => failures += 1, // not acknowledged: may or may not be applied
                    }
                }
                (failures, c.leader())
            })
        })
        .collect();

    let wait_acked = |n: usize, what: &str| {
        let start = Instant::now();
        while acked.lock().unwrap().len() < n {
            assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_acked(400, "writes before the kill");

    // Find the leader and kill it with SIGKILL, mid-load.
    let mut probe = client(&peers, 0);
    probe.call(Policy::ReplicatedRoute, &KvOp::Get { key: b"probe".to_vec() }.encode()).unwrap();
    let leader = probe.leader();
    let before_kill = acked.lock().unwrap().len();
    let mut victim = replicas.children[leader].take().unwrap();
    victim.kill().unwrap();
    victim.wait().unwrap();

    wait_acked(before_kill + 400, "writes after the kill (failover)");
    // The killed replica restarts from its log and snapshot.
    replicas.children[leader] = Some(spawn_replica(&peers, leader, &dir));
    wait_acked(before_kill + 800, "writes after the restart");
    stop.store(true, Ordering::Relaxed);
    let mut leaders = Vec::new();
    for w in writers {
        let (_failures, l) = w.join().unwrap();
        leaders.push(l);
    }
    assert!(leaders.iter().all(|l| *l != leader), "the writers moved to a new leader: {leaders:?}");

    // No acknowledged write is lost: read each back through the log.
    let acked = acked.lock().unwrap().clone();
    let mut reader = client(&peers, 0);
    for (key, value) in &acked {
        let answer =
            reader.call(Policy::ReplicatedRoute, &KvOp::Get { key: key.clone().into_bytes() }.encode());
        assert_eq!(value_of(&answer.unwrap()), Some(value.clone().into_bytes()), "acknowledged {key} lost");
    }

    // Every replica converges to the same values, the restarted one too.
    for id in 0..3 {
        let mut local = client(&peers, id);
        let start = Instant::now();
        let mut missing = acked.len();
        while missing > 0 {
            assert!(start.elapsed() < Duration::from_secs(20), "replica {id} still misses {missing} keys");
            missing = 0;
            for (key, value) in acked.iter().step_by(13) {
                let op = KvOp::Get { key: key.clone().into_bytes() };
                let got = value_of(&local.call(Policy::FixedRoute, &op.encode()).unwrap());
                if got != Some(value.clone().into_bytes()) {
                    missing += 1;
                }
            }
        }
    }
    drop(replicas);
}
