//! Acuerdo with one OS process per member (`ordo acuerdo-peer`), on the shm
//! and tcp fabrics: three members elect a leader, which commits a paced
//! load; the leader is killed with SIGKILL; the survivors elect a new
//! leader (which sends them its diff) and keep committing. At the end the
//! survivors' delivered sequences agree (one is a prefix of the other),
//! and everything any member had delivered before the kill — the killed
//! leader's own commits included — is still there, in the same order.
//!
//! Bounded: every wait has a deadline, and every member exits by itself
//! after `--max-seconds` (a stop file ends it sooner; `Drop` kills it).

use ordo_bench::acuerdo_peer::{DeliveredLine, PeerStatus, read_delivered, read_status};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Peers {
    children: Vec<Option<Child>>,
    dir: PathBuf,
    cluster: String,
}

impl Drop for Peers {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = ordo_fabric_shm::remove_stale_files(Path::new("/dev/shm"), &self.cluster);
        // What libfabric's shm provider left for killed members (ofi-shm).
        #[cfg(feature = "ofi")]
        ordo_fabric_ofi::remove_stale_shm_files(Path::new("/dev/shm"));
    }
}

impl Peers {
    fn out(&self, id: usize) -> PathBuf {
        self.dir.join(format!("m{id}.log"))
    }

    fn status(&self, id: usize) -> Option<PeerStatus> {
        read_status(&self.out(id))
    }

    fn delivered(&self, id: usize) -> Vec<DeliveredLine> {
        read_delivered(&self.out(id)).unwrap_or_default()
    }
}

fn spawn(backend: &str) -> Peers {
    let dir = std::env::temp_dir().join(format!("ordo-acuerdo-kill-{backend}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = format!("ak-{backend}-{}", std::process::id());
    let mut peers = Peers { children: Vec::new(), dir, cluster };
    // The tcp members authenticate every link with this secret.
    let secret = ordo_runtime::Secret::generate();
    for id in 0..3 {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ordo"));
        cmd.env(ordo_runtime::SECRET_ENV, secret.env_value().unwrap());
        cmd.args([
            "acuerdo-peer",
            "--backend",
            backend,
            "--cluster",
            &peers.cluster,
            "--id",
            &id.to_string(),
        ])
        .args(["--members", "0,1,2", "--window", "4", "--rate", "2000", "--max-seconds", "25"])
        .arg("--out")
        .arg(peers.out(id))
        .arg("--stop-file")
        .arg(peers.dir.join("stop"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(peers.dir.join(format!("m{id}.err"))).expect("stderr file"));
        peers.children.push(Some(cmd.spawn().expect("spawn ordo acuerdo-peer")));
    }
    if backend != "shm" {
        let mut addrs = Vec::new();
        for (id, c) in peers.children.iter_mut().enumerate() {
            let out = c.as_mut().unwrap().stdout.take().unwrap();
            let mut line = String::new();
            BufReader::new(out).read_line(&mut line).unwrap();
            let addr =
                line.trim().strip_prefix("LISTEN ").unwrap_or_else(|| panic!("member {id} said {line:?}"));
            addrs.push(format!("{id}={addr}"));
        }
        let list = format!("PEERS {}\n", addrs.join(","));
        for c in peers.children.iter_mut() {
            c.as_mut().unwrap().stdin.take().unwrap().write_all(list.as_bytes()).unwrap();
        }
    }
    peers
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn is_prefix(a: &[DeliveredLine], b: &[DeliveredLine]) -> bool {
    a.len() <= b.len() && a == &b[..a.len()]
}

fn kill_the_leader(backend: &str) {
    let mut peers = spawn(backend);
    // A leader, and commits everywhere.
    let mut leader = None;
    wait_until("a leader and 100 commits at every member", Duration::from_secs(15), || {
        let s: Vec<Option<PeerStatus>> = (0..3).map(|i| peers.status(i)).collect();
        leader = s.iter().flatten().find(|s| s.role == "Leader").map(|s| (s.member as usize, s.epoch));
        s.iter().all(|s| s.as_ref().is_some_and(|s| s.delivered >= 100)) && leader.is_some()
    });
    let (old, old_epoch) = leader.unwrap();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != old).collect();

    // kill -9 the leader, under load.
    let mut child = peers.children[old].take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = peers.delivered(old);
    let before: Vec<Vec<DeliveredLine>> = survivors.iter().map(|&i| peers.delivered(i)).collect();
    assert!(!killed.is_empty());

    // A new leader among the survivors, of a bigger epoch, committing.
    let newer = |lines: &[DeliveredLine]| {
        lines.iter().filter(|l| (l.header.epoch.round, l.header.epoch.leader) > old_epoch).count()
    };
    let start = Instant::now();
    loop {
        let s: Vec<PeerStatus> = survivors.iter().filter_map(|&i| peers.status(i)).collect();
        if s.len() == 2
            && s.iter().any(|s| s.role == "Leader" && s.epoch > old_epoch)
            && survivors.iter().all(|&i| newer(&peers.delivered(i)) >= 100)
        {
            break;
        }
        if start.elapsed() > Duration::from_secs(15) {
            let logs: String = (0..3)
                .map(|i| {
                    let err =
                        std::fs::read_to_string(peers.dir.join(format!("m{i}.err"))).unwrap_or_default();
                    format!("member {i}: {:?}\n{err}", peers.status(i))
                })
                .collect();
            panic!(
                "timed out waiting for a new leader and 100 commits of its epoch at the survivors:\n{logs}"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(peers.dir.join("stop"), b"").unwrap();
    for &i in &survivors {
        let mut c = peers.children[i].take().unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break st;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "survivor {i} did not stop");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "survivor {i} exited with {status}");
        assert!(peers.status(i).unwrap().exited);
    }

    let finals: Vec<Vec<DeliveredLine>> = survivors.iter().map(|&i| peers.delivered(i)).collect();
    let (short, long) =
        if finals[0].len() <= finals[1].len() { (&finals[0], &finals[1]) } else { (&finals[1], &finals[0]) };
    if !is_prefix(short, long) {
        let at = short.iter().zip(long.iter()).position(|(a, b)| a != b).unwrap_or(short.len());
        let lo = at.saturating_sub(3);
        let logs: String = (0..3)
            .map(|i| {
                format!(
                    "member {i}:\n{}",
                    std::fs::read_to_string(peers.dir.join(format!("m{i}.err"))).unwrap_or_default()
                )
            })
            .collect();
        panic!(
            "the survivors' delivered sequences diverge at {at} (lengths {} and {}, old leader {old}, epoch {old_epoch:?}):\n short {:?}\n long  {:?}\n{logs}",
            short.len(),
            long.len(),
            &short[lo..(at + 3).min(short.len())],
            &long[lo..(at + 3).min(long.len())]
        );
    }
    assert!(long.windows(2).all(|w| w[0].header < w[1].header), "delivered in header order, once each");
    for (i, b) in before.iter().enumerate() {
        assert!(is_prefix(b, short), "survivor {}'s commits before the kill are not kept", survivors[i]);
    }
    if !is_prefix(&killed, short) {
        let at = killed.iter().zip(short.iter()).position(|(a, b)| a != b).unwrap_or(short.len());
        panic!(
            "the killed leader's own commits are not all kept: killed {} entries, survivors {} / {}, first difference at {at}: killed {:?} vs survivor {:?}; survivors before the kill had {:?}",
            killed.len(),
            finals[0].len(),
            finals[1].len(),
            killed.get(at.saturating_sub(1)..(at + 2).min(killed.len())),
            short.get(at.saturating_sub(1)..(at + 2).min(short.len())),
            before.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    let new_epoch_entries = newer(short);
    assert!(new_epoch_entries >= 100, "only {new_epoch_entries} commits of the new epoch");
}

#[test]
fn shm_kill_9_the_leader_under_load() {
    kill_the_leader("shm");
}

#[test]
fn tcp_kill_9_the_leader_under_load() {
    kill_the_leader("tcp");
}

/// Reliable datagrams on `tcp;ofi_rxm`: in about 1 of 40 runs (run with
/// the other ofi kill tests, two cores loaded) one survivor's delivered
/// sequence skipped some 35 entries at the first wrap of the leader's ring
/// (entry 16 → 46..51) while the other delivered them, with no failure
/// reported by the fabric. Not seen in hundreds of runs on connected tcp
/// endpoints or shm. Kept as the reproduction: `cargo test --release
/// --features ofi --test acuerdo_kill -- --ignored --include-ignored ofi`,
/// in a loop.
#[cfg(feature = "ofi")]
#[test]
#[ignore = "tcp;ofi_rxm: a follower skips ring entries in about 1 of 40 runs (open)"]
fn ofi_rxm_kill_9_the_leader_under_load() {
    kill_the_leader("ofi-rxm");
}

#[cfg(feature = "ofi")]
#[test]
fn ofi_shm_kill_9_the_leader_under_load() {
    kill_the_leader("ofi-shm");
}

#[cfg(feature = "ofi")]
#[test]
fn ofi_connected_endpoints_kill_9_the_leader_under_load() {
    kill_the_leader("ofi-tcp-msg");
}
