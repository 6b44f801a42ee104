//! ordo-dds with every participant a real process (`ordo dds pub|sub`):
//! - a publisher and three subscribers, on shm and on tcp: every subscriber
//!   gets every sample once, in one total order;
//! - a subscriber killed with SIGKILL and replaced by a late joiner that
//!   catches up from the group's history (volatile storage) or from its own
//!   log and the group's (logged storage; `ordo dds log` shows its log);
//! - an external client publishing through a member's relay that is then
//!   killed with SIGKILL: it moves to another relay, and every sample it
//!   saw acknowledged as stable is in the topic once.

use ordo_dds::client::ExternalParticipant;
use ordo_runtime::Secret;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ordo"))
}

/// These tests run one at a time: each is 4-5 busy processes, and on two
/// cores several at once starve members past their failure detector.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn free_port() -> u16 {
    ordo_runtime::unused_local_port().expect("a free port")
}

struct Domain {
    dir: PathBuf,
    config: PathBuf,
    cluster: String,
    relays: Vec<String>,
    kids: Vec<Child>,
}

impl Domain {
    /// `n` members (0 publishes), `backend`, the topics given as
    /// `(name, qos, publishers)`; every member subscribes every topic.
    fn new(name: &str, n: u32, backend: &str, topics: &[(&str, &str, &str)], relays: bool) -> Domain {
        let dir = std::env::temp_dir().join(format!("ordo-dds-proc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Secret::generate_file(&dir.join("cluster.secret")).unwrap();
        Secret::generate_file(&dir.join("client.secret")).unwrap();
        let cluster = format!("ddsp-{name}-{}", std::process::id());
        let peers = |ports: &[u16]| -> String {
            ports
                .iter()
                .enumerate()
                .map(|(i, p)| format!("{{ id = {i}, addr = \"127.0.0.1:{p}\" }}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let members: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let control: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let fabric: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let relay_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let mut text = format!(
            "[group]\nmembers = [{}]\n[fabric]\nbackend = \"{backend}\"\n[fabric.shm]\ncluster = \"{cluster}\"\n[fabric.tcp]\npeers = [{}]\n[security]\nsecret_file = \"{}\"\nclient_secret_file = \"{}\"\n[node]\ncontrol = [{}]\ntick_ms = 50\n[dds]\ndata_dir = \"{}\"\n",
            members.join(", "),
            peers(&fabric),
            dir.join("cluster.secret").display(),
            dir.join("client.secret").display(),
            peers(&control),
            dir.join("data").display(),
        );
        if relays {
            text.push_str(&format!("relay = [{}]\nmax_relay_queue = 100000\n", peers(&relay_ports)));
        }
        for (t, qos, publishers) in topics {
            text.push_str(&format!(
                "[[dds.topics]]\nname = \"{t}\"\nqos = \"{qos}\"\npublishers = [{publishers}]\nsubscribers = [{}]\nmax_sample = 2048\nhistory = 100000\n",
                members.join(", ")
            ));
        }
        let config = dir.join("dds.toml");
        std::fs::write(&config, text).unwrap();
        Domain {
            dir,
            config,
            cluster,
            relays: relay_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            kids: Vec::new(),
        }
    }

    fn ordo(&self, member: u32, join: bool, args: &[&str]) -> Command {
        let mut c = Command::new(exe());
        c.args(["dds"]).args(args).arg("-c").arg(&self.config);
        c.args(["--set", &format!("member.id={member}")]);
        if join {
            c.args(["--set", "node.join=true"]);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    fn spawn(&mut self, member: u32, join: bool, args: &[&str]) -> usize {
        let child = self.ordo(member, join, args).spawn().unwrap();
        self.kids.push(child);
        self.kids.len() - 1
    }

    /// Waits for process `k` and returns its JSON summary.
    fn summary(&mut self, k: usize, limit: Duration) -> serde_json::Value {
        let child = &mut self.kids[k];
        let deadline = Instant::now() + limit;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                panic!(
                    "process {k} did not finish: {}",
                    err.lines().rev().take(20).collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (mut out, mut err) = (String::new(), String::new());
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        out.lines().rev().find_map(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| {
            panic!(
                "process {k}: no summary; stdout {out}; stderr {}",
                err.lines().rev().take(20).collect::<Vec<_>>().join("\n")
            )
        })
    }

    fn kill9(&mut self, k: usize) {
        let pid = self.kids[k].id() as i32;
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = self.kids[k].wait();
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        for k in &mut self.kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        ordo_runtime::node::remove_view_files(Path::new("/dev/shm"), &self.cluster);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn one_publisher_three_subscribers(backend: &str) {
    let _one = serial();
    let mut d = Domain::new(&format!("fan-{backend}"), 4, backend, &[("a", "atomic-multicast", "0")], false);
    let subs: Vec<usize> = (1..=3)
        .map(|m| d.spawn(m, false, &["sub", "--topic", "a", "--until-publishers-leave", "--json"]))
        .collect();
    let publisher =
        d.spawn(0, false, &["pub", "--topic", "a", "--size", "1000", "--count", "3000", "--json"]);
    let p = d.summary(publisher, Duration::from_secs(60));
    assert_eq!((p["samples"].as_u64(), p["stable"].as_u64()), (Some(3000), Some(3000)), "{p}");
    let got: Vec<serde_json::Value> =
        subs.into_iter().map(|k| d.summary(k, Duration::from_secs(60))).collect();
    for s in &got {
        assert_eq!(s["samples"], 3000, "{s}");
        assert_eq!((s["first_position"].as_u64(), s["last_position"].as_u64()), (Some(1), Some(3000)), "{s}");
        assert_eq!(s["in_order"], true, "{s}");
    }
    assert!(got.windows(2).all(|w| w[0]["order_digest"] == w[1]["order_digest"]), "one order: {got:?}");
}

#[test]
fn one_publisher_three_subscriber_processes_on_shm() {
    one_publisher_three_subscribers("shm");
}

#[test]
fn one_publisher_three_subscriber_processes_on_tcp() {
    one_publisher_three_subscribers("tcp");
}

/// Member 3's subscriber is killed mid-stream and restarted as a joiner:
/// it gets every sample from the history (which holds them all here), in
/// the order the others got them.
fn a_killed_subscriber_rejoins_and_catches_up(qos: &str) {
    let _one = serial();
    let mut d = Domain::new(&format!("late-{qos}"), 4, "shm", &[("t", qos, "0")], false);
    const N: u64 = 4000;
    let subs: Vec<usize> = (1..=2)
        .map(|m| d.spawn(m, false, &["sub", "--topic", "t", "--count", &N.to_string(), "--json"]))
        .collect();
    let victim = d.spawn(3, false, &["sub", "--topic", "t", "--json"]);
    let publisher = d.spawn(
        0,
        false,
        &["pub", "--topic", "t", "--size", "500", "--rate", "2000", "--count", &N.to_string(), "--json"],
    );
    std::thread::sleep(Duration::from_millis(700));
    d.kill9(victim);
    std::thread::sleep(Duration::from_millis(300));
    let late = d.spawn(3, true, &["sub", "--topic", "t", "--count", &N.to_string(), "--json"]);
    let p = d.summary(publisher, Duration::from_secs(60));
    assert_eq!(p["stable"], N, "{p}");
    let first = d.summary(subs[0], Duration::from_secs(60));
    let second = d.summary(subs[1], Duration::from_secs(60));
    let joined = d.summary(late, Duration::from_secs(60));
    for s in [&first, &second, &joined] {
        assert_eq!((s["samples"].as_u64(), s["in_order"].as_bool()), (Some(N), Some(true)), "{s}");
        assert_eq!(s["first_position"], 1, "the joiner caught up from position 1: {s}");
    }
    assert_eq!(first["order_digest"], joined["order_digest"], "the joiner's order is the group's");
    assert_eq!(first["order_digest"], second["order_digest"]);
    if qos == "logged-storage" {
        // The joiner's log: what its first incarnation logged, then a
        // segment with the restored history and what followed.
        let out = d.ordo(3, false, &["log", "--topic", "t"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("2 segments") && text.contains(&format!("Some(1)..={N}")), "{text}");
    }
}

#[test]
fn a_killed_subscriber_rejoins_and_catches_up_from_volatile_storage() {
    a_killed_subscriber_rejoins_and_catches_up("volatile-storage");
}

#[test]
fn a_killed_subscriber_rejoins_and_catches_up_from_its_log_and_the_group() {
    a_killed_subscriber_rejoins_and_catches_up("logged-storage");
}

#[test]
fn an_external_publisher_moves_on_when_its_relay_is_killed() {
    let _one = serial();
    let mut d = Domain::new("relay", 3, "shm", &[("l", "logged-storage", "0, 1")], true);
    // Every member is a process (with its relay); they only host here.
    let members: Vec<usize> = (0..3).map(|m| d.spawn(m, false, &["sub", "--topic", "l", "--json"])).collect();
    let secret = Secret::from_file(&d.dir.join("client.secret")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let publisher = loop {
        match ExternalParticipant::connect(&d.relays[..2], &secret) {
            Ok(c) if c.relay_member() == 0 => break c,
            _ => {
                assert!(Instant::now() < deadline, "relay 0 never came up");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let w = publisher.writer("l", "bytes").unwrap();
    // Sample i carries i; `stable` holds what a clean flush acknowledged.
    const N: u64 = 2000;
    let (mut stable, mut pending, mut seen_reconnects) = (Vec::new(), Vec::new(), 0);
    let mut i = 1;
    while i <= N {
        if i == N / 2 && seen_reconnects == 0 && publisher.reconnects() == 0 {
            d.kill9(members[0]);
        }
        match w.write(b"", &i.to_le_bytes()) {
            Ok(()) => {
                pending.push(i);
                i += 1;
            }
            Err(_) => {
                assert!(publisher.wait_connected(Duration::from_secs(30)), "no other relay");
                continue;
            }
        }
        if i % 50 == 0 || i > N {
            let before = publisher.reconnects();
            if w.flush().is_ok() && publisher.reconnects() == before && before == seen_reconnects {
                stable.append(&mut pending);
            } else {
                // Written through a relay that died: in doubt.
                pending.clear();
                seen_reconnects = publisher.reconnects();
            }
        }
    }
    assert!(publisher.reconnects() >= 1 && publisher.relay_member() == 1, "it moved to relay 1");
    assert!(stable.len() as u64 > N / 2, "{} stable", stable.len());
    // Read the topic back through member 2's relay (the history holds all).
    let reader = ExternalParticipant::connect(&d.relays[2..], &secret).unwrap();
    let s = reader.subscribe("l", "bytes", 1_000_000).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < stable.len() && Instant::now() < deadline {
        s.wait(Duration::from_millis(100));
        got.extend(s.take(usize::MAX));
    }
    std::thread::sleep(Duration::from_millis(200));
    got.extend(s.take(usize::MAX));
    let ids: Vec<u64> = got.iter().map(|x| u64::from_le_bytes(x.data[..8].try_into().unwrap())).collect();
    let unique: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "no sample twice");
    for id in &stable {
        assert!(unique.contains(id), "stable sample {id} lost");
    }
    assert!(got.windows(2).all(|w| w[0].position < w[1].position), "in the topic's order");
}
