//! Three `ordo-kv` replicas in one process (shm fabric, RESP on loopback),
//! driven through the RESP client: writes at followers are forwarded to
//! the leader, every replica applies them alike, reads are linearizable
//! (the leader's read barrier), pipelined replies come back in order,
//! AUTH gates everything, and malformed or oversized input gets an error,
//! closes the connection and changes nothing. A replica configured to
//! redirect answers `MOVED` with the leader's address. With `kv.engine =
//! "raft"` (R3P2) the same commands are served by the same state machine,
//! and a new leader takes over when the leader stops.

use ordo_kv::client::Client;
use ordo_kv::{KvServer, Reply};
use ordo_runtime::{OrdoConfig, Secret};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Three distinct free ports, below the ephemeral range (see
/// `ordo_runtime::unused_local_port`).
fn free_ports() -> [u16; 3] {
    [0, 1, 2].map(|_| ordo_runtime::unused_local_port().expect("a free port"))
}

struct Cluster {
    servers: Vec<KvServer>,
    password: Vec<u8>,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(name: &str, extra: &str) -> Cluster {
    let dir = std::env::temp_dir().join(format!("ordo-kv-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("client.secret");
    let password = Secret::generate_file(&secret).unwrap().env_value().unwrap().as_bytes().to_vec();
    let cluster_secret = dir.join("cluster.secret");
    Secret::generate_file(&cluster_secret).unwrap();
    let ports = free_ports();
    // Raft's UDP ports: bound and released together, so distinct.
    let udp: Vec<std::net::UdpSocket> =
        (0..3).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let raft_peers = format!(
        "raft = [{{ id = 0, addr = \"{}\" }}, {{ id = 1, addr = \"{}\" }}, {{ id = 2, addr = \"{}\" }}]",
        udp[0].local_addr().unwrap(),
        udp[1].local_addr().unwrap(),
        udp[2].local_addr().unwrap()
    );
    std::fs::write(
        dir.join("raft-peers"),
        udp.iter().map(|u| format!("{}\n", u.local_addr().unwrap())).collect::<String>(),
    )
    .unwrap();
    drop(udp);
    let cluster = format!("kvtest-{name}-{}", std::process::id());
    let configs: Vec<OrdoConfig> = (0..3)
        .map(|id| {
            let text = format!(
                r#"
[member]
id = {id}
[group]
members = [0, 1, 2]
[fabric.shm]
cluster = "{cluster}"
[security]
client_secret_file = "{}"
secret_file = "{}"
[kv]
listen = "127.0.0.1:{}"
replicas = [{{ id = 0, addr = "127.0.0.1:{}" }}, {{ id = 1, addr = "127.0.0.1:{}" }}, {{ id = 2, addr = "127.0.0.1:{}" }}]
max_value_bytes = 1000
max_entry_bytes = 2048
max_request_bytes = 65536
{}
"#,
                secret.display(),
                cluster_secret.display(),
                ports[id],
                ports[0],
                ports[1],
                ports[2],
                extra
                    .replace("DATA_DIR", &dir.join(format!("data-{id}")).display().to_string())
                    .replace("RAFT_PEERS", &raft_peers),
            );
            OrdoConfig::load_str(&text, std::path::Path::new("kv.toml"), std::iter::empty::<(String, String)>(), &[])
                .unwrap()
        })
        .collect();
    // Each start waits for the others' fabric endpoints: start them together.
    let handles: Vec<_> = configs
        .into_iter()
        .map(|c| std::thread::spawn(move || KvServer::start(&c).expect("replica starts")))
        .collect();
    let servers: Vec<KvServer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let c = Cluster { servers, password, _dir: TempDir(dir) };
    // Wait for a leader.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.leader().is_none() {
        assert!(Instant::now() < deadline, "no leader elected");
        std::thread::sleep(Duration::from_millis(10));
    }
    c
}

impl Cluster {
    fn leader(&self) -> Option<usize> {
        self.servers.iter().position(|s| s.status().state == "leader")
    }

    fn addr(&self, i: usize) -> SocketAddr {
        self.servers[i].local_addr()
    }

    fn client(&self, i: usize) -> Client {
        Client::connect(self.addr(i), Some(&self.password), Duration::from_secs(5)).unwrap()
    }
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

#[test]
fn writes_anywhere_reads_linearizable_pipelines_in_order() {
    let c = start("rw", "");
    let leader = c.leader().unwrap();
    let follower = (leader + 1) % 3;
    let mut f = c.client(follower);
    let mut l = c.client(leader);
    assert_eq!(f.call(&[b"SET", b"a", b"1"]).unwrap(), Reply::Ok, "forwarded to the leader");
    assert_eq!(l.call(&[b"GET", b"a"]).unwrap(), bulk("1"), "the leader read its own commit");
    assert_eq!(f.call(&[b"GET", b"a"]).unwrap(), bulk("1"), "a follower's read is the leader's");
    assert_eq!(f.call(&[b"INCR", b"n"]).unwrap(), Reply::Int(1));
    assert_eq!(l.call(&[b"INCRBY", b"n", b"41"]).unwrap(), Reply::Int(42));
    assert_eq!(f.call(&[b"CAS", b"a", b"1", b"2"]).unwrap(), Reply::Int(1));
    assert_eq!(f.call(&[b"CAS", b"a", b"1", b"3"]).unwrap(), Reply::Int(0));
    assert_eq!(f.call(&[b"SET", b"a", b"9", b"NX"]).unwrap(), Reply::Nil);
    assert_eq!(f.call(&[b"SET", b"t", b"v", b"PX", b"1"]).unwrap(), Reply::Ok);
    // Pipelined: 500 SETs and GETs on one follower connection, answered in
    // order (each GET sees the SET before it).
    for i in 0..500 {
        let (k, v) = (format!("p{}", i % 7), format!("{i}"));
        f.send(&[b"SET", k.as_bytes(), v.as_bytes()]);
        f.send(&[b"GET", k.as_bytes()]);
    }
    for i in 0..500 {
        assert_eq!(f.recv().unwrap(), Reply::Ok);
        assert_eq!(f.recv().unwrap(), bulk(&i.to_string()), "reply {i} in order");
    }
    // A write pipelined behind a read waits for that read (so the read
    // cannot see it), then goes on by itself: nothing more is sent.
    for (c, before, value) in [(&mut l, Reply::Nil, "a1"), (&mut f, bulk("a1"), "a2")] {
        c.send(&[b"GET", b"h"]);
        c.send(&[b"SET", b"h", value.as_bytes()]);
        c.flush().unwrap();
        assert_eq!(c.recv().unwrap(), before, "the read does not see the write after it");
        assert_eq!(c.recv().unwrap(), Reply::Ok, "the held write was served");
    }
    assert_eq!(f.call(&[b"EXISTS", b"t"]).unwrap(), Reply::Int(0), "expired after 1 ms");
    assert_eq!(l.call(&[b"DBSIZE"]).unwrap(), Reply::Int(10));
    // Every replica applied the same entries to the same table.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let states: Vec<_> = c.servers.iter().map(|s| s.state()).collect();
        if states.iter().all(|s| s.applied() == states[0].applied() && s.snapshot() == states[0].snapshot()) {
            break;
        }
        assert!(Instant::now() < deadline, "replicas diverge");
        std::thread::sleep(Duration::from_millis(10));
    }
    let counters = c.servers[leader].counters();
    assert!(counters.read_barriers.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert!(c.servers[follower].counters().forwarded.load(std::sync::atomic::Ordering::Relaxed) >= 1000);
    // A READONLY connection reads the local copy.
    let mut ro = c.client(follower);
    assert_eq!(ro.call(&[b"READONLY"]).unwrap(), Reply::Ok);
    assert_eq!(ro.call(&[b"GET", b"n"]).unwrap(), bulk("42"));
    // RESP3 after HELLO 3 (with AUTH): a map, and a nil is `_`.
    use std::io::{Read, Write};
    let mut raw = std::net::TcpStream::connect(c.addr(leader)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = b"HELLO 3 AUTH default ".to_vec();
    hello.extend_from_slice(&c.password);
    hello.extend_from_slice(b"\r\nGET nothing\r\n");
    raw.write_all(&hello).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"_\r\n") {
        let n = raw.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"%7\r\n"), "a RESP3 map: {:?}", String::from_utf8_lossy(&got));
}

#[test]
fn strangers_and_bad_frames_change_nothing() {
    let c = start("auth", "");
    let leader = c.leader().unwrap();
    let addr = c.addr(leader);
    let mut anon = Client::connect(addr, None, Duration::from_secs(5)).unwrap();
    assert_eq!(
        anon.call(&[b"SET", b"x", b"1"]).unwrap(),
        Reply::Error("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        anon.call(&[b"AUTH", b"not-the-secret"]).unwrap(),
        Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(anon.call(&[b"GET", b"x"]).unwrap(), Reply::Error("NOAUTH Authentication required.".into()));
    assert!(Client::connect(addr, Some(b"wrong"), Duration::from_secs(5)).is_err());
    let mut ok = c.client(leader);
    assert_eq!(ok.call(&[b"DBSIZE"]).unwrap(), Reply::Int(0), "nothing a stranger sent was applied");
    // A value over the bound: an error, nothing applied.
    let big = vec![b'v'; 1001];
    assert!(matches!(ok.call(&[b"SET", b"big", &big]).unwrap(), Reply::Error(e) if e.contains("too large")));
    assert!(
        matches!(ok.call(&[b"FLUSHALL"]).unwrap(), Reply::Error(e) if e.starts_with("ERR unknown command"))
    );
    // Malformed frames: an error, then the connection is closed.
    for bad in [&b"*1\r\n:5\r\n"[..], b"*99999\r\n", b"*x\r\n"] {
        let mut m = c.client(leader);
        m.send_raw(bad).unwrap();
        let first = m.recv();
        assert!(
            matches!(first, Ok(Reply::Error(ref e)) if e.contains("Protocol error")),
            "{bad:?}: {first:?}"
        );
        assert!(m.recv().is_err(), "{bad:?}: the connection is closed");
    }
    // A length that lies: the server holds no more than max_request_bytes
    // (65536 here) of it, then answers with an error and closes.
    let mut m = c.client(leader);
    let liar = b"*1\r\n$100000\r\n";
    m.send_raw(liar).unwrap();
    m.send_raw(&vec![b'x'; 65536 - liar.len()]).unwrap();
    let first = m.recv();
    assert!(matches!(first, Ok(Reply::Error(ref e)) if e.contains("larger than 65536")), "{first:?}");
    assert!(m.recv().is_err(), "the connection is closed");
    let protocol_errors =
        c.servers[leader].counters().protocol_errors.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(protocol_errors, 4);
    assert_eq!(ok.call(&[b"DBSIZE"]).unwrap(), Reply::Int(0));
    assert_eq!(ok.call(&[b"PING"]).unwrap(), Reply::Status("PONG".into()), "the server still serves");
}

#[test]
fn a_redirecting_follower_names_the_leader() {
    let c = start("moved", "redirect = true");
    let leader = c.leader().unwrap();
    let follower = (leader + 1) % 3;
    let mut f = c.client(follower);
    let want = format!("MOVED 0 {}", c.addr(leader));
    assert_eq!(f.call(&[b"SET", b"a", b"1"]).unwrap(), Reply::Error(want.clone()));
    assert_eq!(f.call(&[b"GET", b"a"]).unwrap(), Reply::Error(want));
    assert_eq!(c.client(leader).call(&[b"GET", b"a"]).unwrap(), Reply::Nil, "nothing was applied");
}

/// One client writes through the leader and, once acknowledged, reads at
/// a follower: with `kv.reads = "local"` the follower answers from its own
/// copy, which may not have applied the write yet — the checker must find
/// the stale read. With the default (linearizable) reads, the same history
/// shape always passes. Returns the checker's verdict and the operations.
fn write_then_read_elsewhere(reads: &str) -> (ordo_kv::lincheck::Verdict, usize) {
    use ordo_kv::lincheck::{Op, OpKind, check};
    let c = start(&format!("stale-{reads}"), &format!("reads = \"{reads}\""));
    let leader = c.leader().unwrap();
    let mut w = c.client(leader);
    let mut r = c.client((leader + 1) % 3);
    let t0 = Instant::now();
    let now = || t0.elapsed().as_nanos() as u64;
    let mut history = Vec::new();
    for i in 0..2000u32 {
        let v = i.to_string().into_bytes();
        let call = now();
        assert_eq!(w.call(&[b"SET", b"k", &v]).unwrap(), Reply::Ok);
        history.push(Op { key: b"k".to_vec(), call, ret: Some(now()), kind: OpKind::Write(Some(v)) });
        let call = now();
        let seen = match r.call(&[b"GET", b"k"]).unwrap() {
            Reply::Bulk(b) => Some(b),
            Reply::Nil => None,
            other => panic!("GET: {other:?}"),
        };
        history.push(Op { key: b"k".to_vec(), call, ret: Some(now()), kind: OpKind::Read(seen) });
        let verdict = check(&history, 1 << 24);
        if verdict != ordo_kv::lincheck::Verdict::Linearizable {
            return (verdict, history.len());
        }
        if reads == "linearizable" && i >= 300 {
            break;
        }
    }
    (ordo_kv::lincheck::Verdict::Linearizable, history.len())
}

#[test]
fn the_checker_catches_stale_local_reads_and_passes_linearizable_ones() {
    let (verdict, ops) = write_then_read_elsewhere("local");
    assert!(
        matches!(verdict, ordo_kv::lincheck::Verdict::Violation { .. }),
        "local reads at a follower: a stale read within {ops} operations, got {verdict:?}"
    );
    let (verdict, ops) = write_then_read_elsewhere("linearizable");
    assert_eq!(verdict, ordo_kv::lincheck::Verdict::Linearizable, "{ops} operations");
}

/// A configuration `ordo kv serve` cannot run is refused with an error
/// naming the key, before anything starts.
#[test]
fn bad_configurations_name_the_key() {
    let load = |extra: &str| {
        let text = format!(
            "[member]\nid = 0\n[group]\nmembers = [0, 1, 2]\n[kv]\nlisten = \"127.0.0.1:1\"\n{extra}\n"
        );
        OrdoConfig::load_str(
            &text,
            std::path::Path::new("kv.toml"),
            std::iter::empty::<(String, String)>(),
            &[],
        )
        .unwrap()
    };
    let two = r#"replicas = [{ id = 0, addr = "127.0.0.1:1" }, { id = 1, addr = "127.0.0.1:2" }]"#;
    let three = r#"replicas = [{ id = 0, addr = "127.0.0.1:1" }, { id = 1, addr = "127.0.0.1:2" }, { id = 2, addr = "127.0.0.1:3" }]"#;
    for (extra, says) in [
        (two.to_string(), "no address for member 2"),
        (
            format!("{three}\nmax_value_bytes = 9000"),
            "kv.max_value_bytes 9000 does not fit kv.max_entry_bytes 8192",
        ),
        (format!("{three}\nwindow = 1"), "kv.window is 1"),
        (format!("{three}\nmax_request_bytes = 100"), "kv.max_request_bytes 100"),
        (format!("{three}\ndurability = \"disk\""), "kv.data_dir is not set"),
        (format!("{three}\ndata_dir = \"/tmp/x\""), "set durability = \"disk\""),
        (format!("{three}\nlisten = \"nowhere\""), "kv.listen"),
    ] {
        let cfg = if extra.contains("listen = \"nowhere\"") {
            let mut c = load(three);
            c.kv.listen = "nowhere".into();
            c
        } else {
            load(&extra)
        };
        match KvServer::start(&cfg) {
            Err(e) => assert!(e.to_string().contains(says), "{extra}: {e}"),
            Ok(_) => panic!("{extra}: started"),
        }
    }
}

/// `disk` mode in process: writes reach each replica's data directory
/// (mode 700), snapshots bound the stored log, INFO reports it, and what a
/// replica wrote rebuilds exactly its table.
#[test]
fn disk_mode_writes_the_table_and_the_log_behind_it() {
    let c = start("disk", "durability = \"disk\"\ndata_dir = \"DATA_DIR\"\nsnapshot_entries = 40");
    let leader = c.leader().unwrap();
    let mut cl = c.client((leader + 1) % 3);
    for i in 0..300 {
        cl.send(&[b"SET", format!("k{i}").as_bytes(), format!("v{i}").as_bytes()]);
    }
    for _ in 0..300 {
        assert_eq!(cl.recv().unwrap(), Reply::Ok);
    }
    assert_eq!(cl.call(&[b"INCRBY", b"n", b"5"]).unwrap(), Reply::Int(5));
    // Persists are group commits (a pipeline of SETs is a few polls), and
    // tables are written in the background: within a bound, at least one
    // lands and the log behind it is dropped (INFO right after the writes
    // can come before the first table is on disk — seen in a CI run).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let Reply::Bulk(info) = cl.call(&[b"INFO"]).unwrap() else { panic!("INFO") };
        let info = String::from_utf8(info).unwrap();
        assert!(info.contains("ordo_durability:disk"), "{info}");
        let field = |name: &str| -> u64 {
            info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap()
        };
        assert!(field("ordo_disk_persists:") > 0, "{info}");
        if field("ordo_disk_snapshots:") >= 1 && field("ordo_disk_stored_entries:") < 301 {
            break;
        }
        assert!(Instant::now() < deadline, "no table written, or the log behind it kept: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every replica applied everything (reads at each replica's own copy).
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.servers.iter().any(|s| s.state().len(0) < 301) {
        assert!(Instant::now() < deadline, "replicas did not apply every write");
        std::thread::sleep(Duration::from_millis(10));
    }
    let tables: Vec<_> = c.servers.iter().map(|s| s.state()).collect();
    let dirs: Vec<_> = (0..3).map(|i| c._dir.0.join(format!("data-{i}"))).collect();
    let Cluster { servers, .. } = c;
    for s in servers {
        s.stop();
    }
    for (i, dir) in dirs.iter().enumerate() {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir).unwrap().permissions().mode() & 0o777, 0o700, "{}", dir.display());
        let (_, boot) =
            ordo_kv::disk::DiskStore::open_dir(dir, ordo_kv::disk::DiskOptions::default()).unwrap();
        let boot = boot.unwrap_or_else(|| panic!("replica {i} wrote its state"));
        let mut table = boot.state;
        for (_, payload) in &boot.recovered.log {
            table.apply(&ordo_kv::Entry::decode(payload).unwrap());
        }
        // The stored log may hold entries not yet known committed at the
        // stop; every key written is there either way.
        for k in 0..300 {
            assert_eq!(
                table.get(format!("k{k}").as_bytes(), 0),
                Some(format!("v{k}").as_bytes()),
                "replica {i}"
            );
        }
        assert_eq!(table.get(b"n", 0), tables[i].get(b"n", 0), "replica {i}");
    }
}

/// `kv.engine = "raft"`: the same commands over R3P2 (Raft inside R2P2);
/// followers forward, reads are linearizable (through the log), pipelines
/// keep their order, and when the leader stops another replica takes over
/// with every acknowledged write.
#[test]
fn raft_engine_serves_the_same_state_machine_and_survives_its_leader() {
    let c = start("raft", "engine = \"raft\"\nRAFT_PEERS\ndata_dir = \"DATA_DIR\"");
    let leader = c.leader().unwrap();
    let follower = (leader + 1) % 3;
    let mut f = c.client(follower);
    assert_eq!(f.call(&[b"SET", b"a", b"1"]).unwrap(), Reply::Ok);
    assert_eq!(f.call(&[b"GET", b"a"]).unwrap(), bulk("1"));
    assert_eq!(f.call(&[b"INCRBY", b"n", b"41"]).unwrap(), Reply::Int(41));
    assert_eq!(f.call(&[b"CAS", b"a", b"1", b"2"]).unwrap(), Reply::Int(1));
    let Reply::Bulk(info) = f.call(&[b"INFO"]).unwrap() else { panic!("INFO") };
    assert!(String::from_utf8_lossy(&info).contains("ordo_engine:raft"));
    // A pipeline at the leader: every reply in order, reads see the writes
    // before them.
    let mut l = c.client(leader);
    for i in 0..200 {
        l.send(&[b"SET", b"p", i.to_string().as_bytes()]);
        l.send(&[b"GET", b"p"]);
    }
    for i in 0..200 {
        assert_eq!(l.recv().unwrap(), Reply::Ok);
        assert_eq!(l.recv().unwrap(), bulk(&i.to_string()), "read {i} sees the write before it");
    }
    // Every replica applies everything (READONLY: its own copy).
    for i in 0..3 {
        let mut r = c.client(i);
        assert_eq!(r.call(&[b"READONLY"]).unwrap(), Reply::Ok);
        let deadline = Instant::now() + Duration::from_secs(5);
        while r.call(&[b"GET", b"p"]).unwrap() != bulk("199") {
            assert!(Instant::now() < deadline, "replica {i} did not apply");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // A stranger without the cluster secret sends the raft port a
    // well-formed batch (SET a evil): refused, nothing applied.
    let raft_addrs: Vec<SocketAddr> = {
        let text = std::fs::read_to_string(c._dir.0.join("raft-peers")).unwrap();
        text.lines().map(|l| l.parse().unwrap()).collect()
    };
    let entry = ordo_kv::Entry {
        origin: 9,
        nonce: 9,
        request: 0,
        now_ms: 0,
        write: ordo_kv::Write::Set {
            key: b"a".to_vec(),
            value: b"evil".to_vec(),
            when: ordo_kv::state::SetWhen::Always,
            get: false,
            ttl: ordo_kv::state::Ttl::None,
        },
    }
    .encode();
    let mut batch = 1u32.to_le_bytes().to_vec();
    batch.push(1);
    batch.extend_from_slice(&(entry.len() as u32).to_le_bytes());
    batch.extend_from_slice(&entry);
    let mut stranger = ordo_r2p2::Client::new(ordo_r2p2::ClientConfig::new(raft_addrs)).unwrap();
    assert!(
        stranger.call(ordo_r2p2::Policy::ReplicatedRoute, &batch).is_err(),
        "an unsealed request is refused"
    );
    assert_eq!(f.call(&[b"GET", b"a"]).unwrap(), bulk("2"), "nothing applied");
    // The leader stops; the others elect one and keep every write.
    let Cluster { mut servers, password, _dir } = c;
    servers.remove(leader).stop();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.local_addr()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let new_leader = loop {
        if let Some(i) = servers.iter().position(|s| s.status().state == "leader") {
            break i;
        }
        assert!(Instant::now() < deadline, "no new raft leader");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut n = Client::connect(addrs[new_leader], Some(&password), Duration::from_secs(5)).unwrap();
    assert_eq!(n.call(&[b"GET", b"a"]).unwrap(), bulk("2"));
    assert_eq!(n.call(&[b"GET", b"p"]).unwrap(), bulk("199"));
    assert_eq!(n.call(&[b"INCR", b"n"]).unwrap(), Reply::Int(42));
    let mut o = Client::connect(addrs[1 - new_leader], Some(&password), Duration::from_secs(5)).unwrap();
    assert_eq!(
        o.call(&[b"SET", b"after", b"x"]).unwrap(),
        Reply::Ok,
        "a follower forwards to the new leader"
    );
    assert_eq!(o.call(&[b"GET", b"after"]).unwrap(), bulk("x"));
}
