//! `ordo bench kv`: ordo-kv (3 replicas, acuerdo, in memory, started with
//! `ordo cluster up --kv`) beside a single unreplicated `redis-server` (the
//! speed a Redis user knows), both driven by Debian's `redis-benchmark`
//! (SET and GET, without and with `-P 16` pipelining) in one run.
//!
//! # Method
//! - Every compared pair is measured interleaved (redis, ordo, redis, ordo
//!   ...), `reps` times each, reported as median with min-max; ratios are
//!   computed from the medians of this run only.
//! - ordo-kv is measured at its leader (a client of a follower adds a hop
//!   to the leader); the resident memory of every server is read from
//!   `/proc` after the load.
//! - `--ycsb` runs the YCSB driver ([`crate::ycsb`]) instead: ordo-kv in
//!   memory and in disk mode (`ordo-kv-disk`: each replica fsyncs its log
//!   before its Accept), a single redis-server, and (built with `--features
//!   peers`) etcd and ZooKeeper, one system at a time, every durable system
//!   with its data under `--data-root` (the same medium for all).

use crate::experiment::Experiment;
use crate::machine::MachineInfo;
use crate::ycsb;
use clap::Args;
use ordo_kv::Reply;
use ordo_kv::client::Client;
use serde::Serialize;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `ordo bench kv` arguments.
#[derive(Args, Clone, Debug)]
pub struct KvArgs {
    /// Reduced run (fewer requests per measurement).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Interleaved repetitions of every measurement.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// redis-benchmark clients (`-c`).
    #[arg(long, default_value_t = 50)]
    pub clients: u32,
    /// Directory for report.json.
    #[arg(long, default_value = "bench-results/kv")]
    pub out: PathBuf,
    /// Run the YCSB driver (workloads below) instead of redis-benchmark,
    /// against ordo-kv, redis-server and (built with `--features peers`)
    /// etcd and ZooKeeper, 3 members each.
    #[arg(long)]
    pub ycsb: bool,
    /// YCSB records (default 100000; 10000 with --quick).
    #[arg(long)]
    pub records: Option<u64>,
    /// YCSB operations per workload (default 100000; 10000 with --quick).
    #[arg(long)]
    pub operations: Option<u64>,
    /// YCSB client threads.
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    /// YCSB workloads.
    #[arg(long, value_delimiter = ',', default_value = "load,a,b,c,d,f")]
    pub workloads: Vec<String>,
    /// Systems for YCSB: `ordo-kv` (memory durability), `ordo-kv-disk`
    /// (`kv.durability = "disk"`: fsync before Accept), `ordo-kv-raft` (the
    /// Raft engine, R3P2, log fsynced), `ordo-kv-vsync` (the vsync engine,
    /// memory), `redis`, `etcd`, `zookeeper`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ordo-kv,ordo-kv-disk,ordo-kv-raft,ordo-kv-vsync,redis,etcd,zookeeper"
    )]
    pub systems: Vec<String>,
    /// Where every durable system keeps its data (etcd, ZooKeeper,
    /// ordo-kv-disk), all on the same medium: tmpfs by default (an fsync
    /// costs nothing there: the best case for all three); a directory on a
    /// real disk measures their fsyncs too.
    #[arg(long, default_value = "/dev/shm")]
    pub data_root: PathBuf,
    /// Group sizes for YCSB (acuerdo Fig. 9): every workload runs at the
    /// first; YCSB-load runs at each (ordo-kv, etcd, ZooKeeper).
    #[arg(long, value_delimiter = ',', default_value = "3")]
    pub replicas: Vec<u16>,
}

/// One redis-benchmark measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// `redis-server` or `ordo-kv`.
    pub system: String,
    /// SET or GET.
    pub test: String,
    /// Pipeline depth (`-P`).
    pub pipeline: u32,
    /// Requests per second.
    pub rps: f64,
    /// Latency p50, ms.
    pub p50_ms: f64,
    /// Latency p99, ms.
    pub p99_ms: f64,
}

/// Medians of one (system, test, pipeline).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// System.
    pub system: String,
    /// Test.
    pub test: String,
    /// Pipeline depth.
    pub pipeline: u32,
    /// Median rps and its min, max.
    pub rps: [f64; 3],
    /// Median p50 latency (ms).
    pub p50_ms: f64,
    /// Median p99 latency (ms).
    pub p99_ms: f64,
    /// ordo-kv rps / redis-server rps (medians), on ordo-kv rows.
    pub vs_redis: Option<f64>,
}

/// One YCSB measurement.
#[derive(Clone, Debug, Serialize)]
pub struct YcsbRow {
    /// The system.
    pub system: String,
    /// Replicas (members) of the system (1 for redis-server).
    pub replicas: u16,
    /// The workload.
    pub workload: String,
    /// What it measured.
    pub outcome: crate::ycsb::Outcome,
    /// ordo-kv ops/s divided by this system's (on other systems' rows).
    pub ordo_vs_this: Option<f64>,
    /// ordo-kv-disk ops/s divided by this system's (on etcd, ZooKeeper and
    /// redis-server rows).
    pub ordo_disk_vs_this: Option<f64>,
}

/// The whole result.
#[derive(Clone, Debug, Serialize)]
pub struct KvReport {
    /// YCSB rows (with --ycsb).
    pub ycsb: Vec<YcsbRow>,
    /// Systems asked for but not run, and why.
    pub skipped: Vec<String>,
    /// Where it ran.
    pub machine: MachineInfo,
    /// Load average (1 min) before the run.
    pub loadavg_before: f64,
    /// Requests per measurement.
    pub requests: u64,
    /// Every sample, in measurement order.
    pub samples: Vec<Sample>,
    /// Medians.
    pub rows: Vec<Row>,
    /// Resident memory after the load, KiB: redis-server, then each
    /// ordo-kv replica.
    pub rss_kib: Vec<(String, u64)>,
}

/// The benchmark.
pub struct KvBench {
    args: KvArgs,
    exe: PathBuf,
}

impl KvBench {
    /// The benchmark with `args`, starting replicas with `exe` (the `ordo`
    /// binary).
    pub fn new(args: KvArgs, exe: PathBuf) -> KvBench {
        KvBench { args, exe }
    }
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn need(tool: &str) -> Result<(), String> {
    let ok = Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if ok {
        return Ok(());
    }
    let package = match tool {
        "redis-server" => "redis-server",
        "redis-benchmark" | "redis-cli" => "redis-tools",
        "etcd" => "etcd-server",
        "java" => "zookeeper (it brings a Java runtime)",
        other => other,
    };
    Err(format!(
        "{tool} not found: install it with `apt-get install {package}`, or every peer at once with scripts/install-bench-peers.sh"
    ))
}

fn wait_ping(port: u16, password: Option<&[u8]>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = format!("127.0.0.1:{port}").parse().expect("address");
    loop {
        if let Ok(mut c) = Client::connect(addr, password, Duration::from_secs(1))
            && c.call(&[b"PING"]).is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("nothing answers PING on port {port}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs redis-benchmark and parses its CSV.
fn redis_benchmark(
    port: u16,
    password: Option<&str>,
    n: u64,
    clients: u32,
    pipeline: u32,
) -> Result<Vec<(String, f64, f64, f64)>, String> {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-p", &port.to_string(), "-t", "set,get", "-n", &n.to_string(), "-c", &clients.to_string()]);
    cmd.args(["-P", &pipeline.to_string(), "--csv"]);
    if let Some(p) = password {
        cmd.args(["-a", p]);
    }
    let out = cmd.stderr(Stdio::null()).output().map_err(|e| format!("redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<_> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<String> = l.split(',').map(|x| x.trim_matches('"').to_string()).collect();
            Some((
                f.first()?.clone(),
                f.get(1)?.parse().ok()?,
                f.get(4)?.parse().ok()?,
                f.get(6)?.parse().ok()?,
            ))
        })
        .collect();
    if rows.len() != 2 {
        return Err(format!("redis-benchmark on port {port} printed: {text}"));
    }
    Ok(rows)
}

/// The redis-server and the main ordo-kv cluster of a run, stopped on drop.
struct Guard {
    redis: Option<Child>,
    _ordo: OrdoCluster,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut r) = self.redis.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `ordo cluster up --kv -n N` under `dir` (ports from `base`): the
/// leader's RESP port and the client password.
fn start_ordo(
    exe: &std::path::Path,
    dir: &std::path::Path,
    base: u16,
    n: u16,
    extra: &[&str],
) -> Result<(u16, String), String> {
    let up = Command::new(exe)
        .args(["cluster", "up", "--kv", "-n", &n.to_string(), "--base-port", &base.to_string(), "--dir"])
        .arg(dir)
        .args(extra)
        .env("ORDO_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?;
    if !up.status.success() {
        return Err(format!("ordo cluster up --kv: {}", String::from_utf8_lossy(&up.stderr)));
    }
    let password = std::fs::read_to_string(dir.join("client.secret")).map_err(|e| e.to_string())?;
    let password = password.trim().to_string();
    // The leader: the replica whose INFO says master.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = (0..n).map(|i| base + 300 + i).find(|p| {
            let addr = format!("127.0.0.1:{p}").parse().expect("address");
            Client::connect(addr, Some(password.as_bytes()), Duration::from_secs(1))
                .and_then(|mut c| c.call(&[b"INFO"]))
                .is_ok_and(
                    |r| matches!(r, Reply::Bulk(b) if String::from_utf8_lossy(&b).contains("role:master")),
                )
        });
        if let Some(p) = found {
            return Ok((p, password));
        }
        if Instant::now() > deadline {
            return Err("no ordo-kv leader".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An ordo-kv cluster started with `ordo cluster up --kv`, taken down on
/// drop.
struct OrdoCluster {
    exe: PathBuf,
    dir: PathBuf,
}

impl Drop for OrdoCluster {
    fn drop(&mut self) {
        let _ = Command::new(&self.exe).args(["cluster", "down", "--dir"]).arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn workload(name: &str) -> Option<ycsb::Workload> {
    Some(match name.to_ascii_lowercase().as_str() {
        "load" => ycsb::Workload::Load,
        "a" => ycsb::Workload::A,
        "b" => ycsb::Workload::B,
        "c" => ycsb::Workload::C,
        "d" => ycsb::Workload::D,
        "f" => ycsb::Workload::F,
        _ => return None,
    })
}

/// Polls `up` every 200 ms until it holds, for at most `limit`.
#[cfg(feature = "peers")]
fn wait_until(what: &str, limit: Duration, mut up: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !up() {
        if Instant::now() > deadline {
            return Err(format!("{what} did not come up within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// An etcd or ZooKeeper cluster on loopback, data on tmpfs.
#[cfg(feature = "peers")]
struct Peers {
    children: Vec<Child>,
    dir: PathBuf,
}

#[cfg(feature = "peers")]
impl Drop for Peers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(feature = "peers")]
impl Peers {
    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// etcd, `n` members (client ports base.., peer ports base+10..).
    fn etcd(base: u16, n: u16, root: &std::path::Path) -> Result<Peers, String> {
        need("etcd")?;
        let dir = root.join(format!("ordo-bench-etcd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cluster: Vec<String> =
            (0..n).map(|i| format!("e{i}=http://127.0.0.1:{}", base + 10 + i)).collect();
        let mut children = Vec::new();
        for i in 0..n {
            let client = format!("http://127.0.0.1:{}", base + i);
            let peer = format!("http://127.0.0.1:{}", base + 10 + i);
            children.push(
                Command::new("etcd")
                    .args(["--name", &format!("e{i}"), "--data-dir"])
                    .arg(dir.join(format!("e{i}")))
                    .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &cluster.join(","), "--initial-cluster-state", "new"])
                    .args(["--initial-cluster-token", "ordo-bench", "--log-level", "error"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("etcd: {e}"))?,
            );
        }
        Ok(Peers { children, dir })
    }

    /// ZooKeeper, `n` nodes (client ports base.., quorum and election
    /// ports base+10.., base+20..), Debian's package.
    fn zookeeper(base: u16, n: u16, root: &std::path::Path) -> Result<Peers, String> {
        need("java")?;
        let jar = "/usr/share/java/zookeeper.jar";
        if !std::path::Path::new(jar).exists() {
            return Err(format!(
                "{jar} not found: install it with `apt-get install zookeeper`, or every peer at once with scripts/install-bench-peers.sh"
            ));
        }
        let dir = root.join(format!("ordo-bench-zk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut children = Vec::new();
        for i in 0..n {
            let d = dir.join(format!("zk{i}"));
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            std::fs::write(d.join("myid"), format!("{}\n", i + 1)).map_err(|e| e.to_string())?;
            let servers: String = (0..n)
                .map(|j| format!("server.{}=127.0.0.1:{}:{}\n", j + 1, base + 10 + j, base + 20 + j))
                .collect();
            let cfg = format!(
                "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={}\nadmin.enableServer=false\nmaxClientCnxns=0\n{servers}",
                d.display(),
                base + i
            );
            let cfg_path = d.join("zoo.cfg");
            std::fs::write(&cfg_path, cfg).map_err(|e| e.to_string())?;
            children.push(
                Command::new("java")
                    .args(["-cp", &format!("/etc/zookeeper/conf:{jar}"), "-Xmx1g"])
                    .arg(format!("-Dzookeeper.log.dir={}", d.display()))
                    .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
                    .arg(&cfg_path)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("zookeeper: {e}"))?,
            );
        }
        Ok(Peers { children, dir })
    }
}

impl KvBench {
    #[allow(clippy::too_many_arguments)]
    fn ycsb(
        &self,
        progress: &mut dyn FnMut(&str),
        ordo_port: u16,
        redis_port: u16,
        password: &str,
        _dir: &std::path::Path,
        rows: &mut Vec<YcsbRow>,
        skipped: &mut Vec<String>,
        rss: &mut Vec<(String, u64)>,
    ) -> Result<(), String> {
        let records = self.args.records.unwrap_or(if self.args.quick { 10_000 } else { 100_000 });
        let operations = self.args.operations.unwrap_or(if self.args.quick { 10_000 } else { 100_000 });
        let threads = self.args.threads;
        let workloads: Vec<ycsb::Workload> = self
            .args
            .workloads
            .iter()
            .map(|w| workload(w).ok_or_else(|| format!("unknown YCSB workload {w} (load, a, b, c, d, f)")))
            .collect::<Result<_, _>>()?;
        let want = |s: &str| self.args.systems.iter().any(|x| x == s);
        let mut measure =
            |system: &str,
             replicas: u16,
             workloads: &[ycsb::Workload],
             rows: &mut Vec<YcsbRow>,
             f: &dyn Fn(ycsb::Workload) -> Result<ycsb::Outcome, String>| {
                for &w in workloads {
                    progress(&format!(
                        "YCSB {}: {system} x{replicas} ({records} records, {threads} threads)",
                        w.name()
                    ));
                    let outcome = f(w)?;
                    if outcome.errors > 0 {
                        progress(&format!("  {} errors, e.g. {:?}", outcome.errors, outcome.first_error));
                    }
                    rows.push(YcsbRow {
                        system: system.into(),
                        replicas,
                        workload: w.name().into(),
                        outcome,
                        ordo_vs_this: None,
                        ordo_disk_vs_this: None,
                    });
                }
                Ok::<(), String>(())
            };
        let local = |p: u16| -> std::net::SocketAddr { format!("127.0.0.1:{p}").parse().expect("address") };
        let mut sizes: Vec<u16> = Vec::new();
        for &n in &self.args.replicas {
            if n == 0 || n > 9 {
                return Err(format!("--replicas {n}: between 1 and 9"));
            }
            if !sizes.contains(&n) {
                sizes.push(n);
            }
        }
        if sizes.is_empty() {
            sizes.push(3);
        }
        for (k, &n) in sizes.iter().enumerate() {
            // Every workload at the first size; YCSB-load at the others
            // (acuerdo Fig. 9).
            let wl: Vec<ycsb::Workload> = if k == 0 {
                workloads.clone()
            } else {
                workloads.iter().copied().filter(|w| *w == ycsb::Workload::Load).collect()
            };
            if wl.is_empty() {
                continue;
            }
            if want("ordo-kv") {
                let mut _extra = None;
                let (port, pw) = if n == 3 {
                    (ordo_port, password.to_string())
                } else {
                    let base = ordo_runtime::node::free_base_port(u32::from(n)).ok_or("no free ports")?;
                    let dir = std::env::temp_dir().join(format!("ordo-bench-kv-{}-{n}", std::process::id()));
                    let _ = std::fs::remove_dir_all(&dir);
                    _extra = Some(OrdoCluster { exe: self.exe.clone(), dir: dir.clone() });
                    start_ordo(&self.exe, &dir, base, n, &[])?
                };
                let pw = pw.into_bytes();
                measure("ordo-kv", n, &wl, rows, &|w| {
                    ycsb::run(w, records, operations, threads, |_| {
                        ycsb::Resp::connect(local(port), Some(&pw))
                    })
                })?;
            }
            // The same cluster in disk mode, over the Raft engine (its log
            // fsynced) and over vsync, data directories under --data-root
            // (with etcd's and ZooKeeper's).
            for (system, extra) in [
                ("ordo-kv-disk", &["--durability", "disk"][..]),
                ("ordo-kv-raft", &["--engine", "raft", "--durability", "disk"][..]),
                ("ordo-kv-vsync", &["--engine", "vsync"][..]),
            ] {
                if !want(system) {
                    continue;
                }
                let base = ordo_runtime::node::free_base_port(u32::from(n)).ok_or("no free ports")?;
                let dir = self.args.data_root.join(format!("ordo-bench-{system}-{}-{n}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                let _cluster = OrdoCluster { exe: self.exe.clone(), dir: dir.clone() };
                let (port, pw) = start_ordo(&self.exe, &dir, base, n, extra)?;
                let pw = pw.into_bytes();
                measure(system, n, &wl, rows, &|w| {
                    ycsb::run(w, records, operations, threads, |_| {
                        ycsb::Resp::connect(local(port), Some(&pw))
                    })
                })?;
            }
            if want("redis") && k == 0 {
                measure("redis-server", 1, &wl, rows, &|w| {
                    ycsb::run(w, records, operations, threads, |_| {
                        ycsb::Resp::connect(local(redis_port), None)
                    })
                })?;
            }
            #[cfg(feature = "peers")]
            {
                let base = ordo_runtime::node::free_base_port(3).ok_or("no free ports")? + 500;
                if want("etcd") {
                    let peers = Peers::etcd(base, n, &self.args.data_root)?;
                    let endpoints: Vec<String> =
                        (0..n).map(|i| format!("http://127.0.0.1:{}", base + i)).collect();
                    wait_until("etcd", Duration::from_secs(30), || {
                        ycsb::Etcd::connect(&endpoints)
                            .and_then(|mut e| ycsb::Store::read(&mut e, "probe"))
                            .is_ok()
                    })?;
                    measure("etcd", n, &wl, rows, &|w| {
                        ycsb::run(w, records, operations, threads, |_| ycsb::Etcd::connect(&endpoints))
                    })?;
                    for (i, pid) in peers.pids().into_iter().enumerate() {
                        rss.push((format!("etcd x{n} member {i}"), rss_kib(pid)));
                    }
                }
                if want("zookeeper") {
                    let peers = Peers::zookeeper(base + 100, n, &self.args.data_root)?;
                    let cluster: String =
                        (0..n).map(|i| format!("127.0.0.1:{}", base + 100 + i)).collect::<Vec<_>>().join(",");
                    wait_until("ZooKeeper", Duration::from_secs(60), || ycsb::Zk::connect(&cluster).is_ok())?;
                    measure("zookeeper", n, &wl, rows, &|w| {
                        ycsb::run(w, records, operations, threads, |_| ycsb::Zk::connect(&cluster))
                    })?;
                    for (i, pid) in peers.pids().into_iter().enumerate() {
                        rss.push((format!("zookeeper x{n} node {i}"), rss_kib(pid)));
                    }
                }
            }
        }
        #[cfg(not(feature = "peers"))]
        let _ = &rss;
        #[cfg(not(feature = "peers"))]
        for s in ["etcd", "zookeeper"] {
            if want(s) {
                skipped
                    .push(format!("{s}: this ordo was built without `--features peers` (its client crate)"));
            }
        }
        let _ = &skipped;
        // Ratios: ordo-kv over each other system, per workload, at the
        // same group size (redis-server: ordo-kv at the first size).
        let of = |system: &str| -> Vec<(String, u16, f64)> {
            rows.iter()
                .filter(|r| r.system == system)
                .map(|r| (r.workload.clone(), r.replicas, r.outcome.ops_per_s()))
                .collect()
        };
        let (ordo, ordo_disk) = (of("ordo-kv"), of("ordo-kv-disk"));
        let ratio = |of: &[(String, u16, f64)], r: &YcsbRow| {
            let n = if r.replicas == 1 { sizes[0] } else { r.replicas };
            of.iter()
                .find(|(w, m, _)| *w == r.workload && *m == n)
                .map(|(_, _, o)| o / r.outcome.ops_per_s().max(1e-9))
        };
        for r in rows.iter_mut().filter(|r| !r.system.starts_with("ordo-kv")) {
            r.ordo_vs_this = ratio(&ordo, r);
            r.ordo_disk_vs_this = ratio(&ordo_disk, r);
        }
        Ok(())
    }
}

impl Experiment for KvBench {
    type Report = KvReport;

    fn name(&self) -> &'static str {
        "kv"
    }

    fn out_dir(&self) -> Option<&std::path::Path> {
        Some(&self.args.out)
    }

    fn write_files(&self, r: &KvReport, dir: &std::path::Path) -> Result<(), String> {
        if r.ycsb.is_empty() {
            return Ok(());
        }
        let mut csv = String::from("system,replicas,workload,ops_per_s,p50_us,p99_us,errors\n");
        for row in &r.ycsb {
            csv.push_str(&format!(
                "{},{},{},{:.1},{},{},{}\n",
                row.system,
                row.replicas,
                row.workload,
                row.outcome.ops_per_s(),
                row.outcome.p50_us,
                row.outcome.p99_us,
                row.outcome.errors
            ));
        }
        crate::experiment::write(&dir.join("ycsb.csv"), &csv)?;
        // acuerdo Fig. 9: YCSB-load throughput by group size, log scale.
        let series: Vec<crate::plot::Series> =
            ["ordo-kv", "ordo-kv-disk", "ordo-kv-raft", "ordo-kv-vsync", "etcd", "zookeeper"]
                .iter()
                .map(|sys| crate::plot::Series {
                    label: (*sys).to_string(),
                    points: r
                        .ycsb
                        .iter()
                        .filter(|row| row.system == *sys && row.workload == "load")
                        .map(|row| (f64::from(row.replicas), row.outcome.ops_per_s()))
                        .collect(),
                    ..crate::plot::Series::default()
                })
                .filter(|s| !s.points.is_empty())
                .collect();
        let panel = crate::plot::Panel {
            title: "YCSB-load throughput by group size (acuerdo Fig. 9)".into(),
            x_label: "replicas".into(),
            y_label: "ops/s (log)".into(),
            log_y: true,
            series,
        };
        crate::plot::write_png(&dir.join("fig9.png"), "ordo bench kv --ycsb", &[panel], 1)
    }

    fn measure(&self, progress: &mut dyn FnMut(&str)) -> Result<KvReport, String> {
        need("redis-server")?;
        need("redis-benchmark")?;
        let loadavg_before = loadavg();
        let base = ordo_runtime::node::free_base_port(3).ok_or("no free ports")?;
        let redis_port = base + 400;
        let dir = std::env::temp_dir().join(format!("ordo-bench-kv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut guard = Guard { redis: None, _ordo: OrdoCluster { exe: self.exe.clone(), dir: dir.clone() } };
        progress("starting redis-server (no persistence) and 3 ordo-kv replicas (shm fabric)");
        guard.redis = Some(
            Command::new("redis-server")
                .args([
                    "--port",
                    &redis_port.to_string(),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--bind",
                    "127.0.0.1",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("redis-server: {e}"))?,
        );
        let (leader_port, password) = start_ordo(&self.exe, &dir, base, 3, &[])?;
        wait_ping(redis_port, None)?;
        let n: u64 = if self.args.quick { 20_000 } else { 100_000 };
        let mut samples = Vec::new();
        let (mut ycsb_rows, mut skipped) = (Vec::new(), Vec::new());
        if self.args.ycsb {
            let mut rss = Vec::new();
            self.ycsb(
                progress,
                leader_port,
                redis_port,
                &password,
                &dir,
                &mut ycsb_rows,
                &mut skipped,
                &mut rss,
            )?;
            let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
            for (i, pid) in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()).enumerate() {
                rss.push((format!("ordo-kv replica {i}"), rss_kib(pid)));
            }
            if let Some(r) = &guard.redis {
                rss.push(("redis-server".to_string(), rss_kib(r.id())));
            }
            drop(guard);
            return Ok(KvReport {
                ycsb: ycsb_rows,
                skipped,
                machine: MachineInfo::current(),
                loadavg_before,
                requests: 0,
                samples,
                rows: Vec::new(),
                rss_kib: rss,
            });
        }
        for rep in 0..self.args.reps.max(1) {
            for pipeline in [1u32, 16] {
                let n = if pipeline == 1 { n / 2 } else { n * 2 };
                for (system, port, pw) in
                    [("redis-server", redis_port, None), ("ordo-kv", leader_port, Some(password.as_str()))]
                {
                    progress(&format!("rep {}: {system} -P {pipeline} ({n} requests per test)", rep + 1));
                    for (test, rps, p50, p99) in redis_benchmark(port, pw, n, self.args.clients, pipeline)? {
                        samples.push(Sample {
                            system: system.into(),
                            test,
                            pipeline,
                            rps,
                            p50_ms: p50,
                            p99_ms: p99,
                        });
                    }
                }
            }
        }
        let mut rss = Vec::new();
        if let Some(r) = &guard.redis {
            rss.push(("redis-server".to_string(), rss_kib(r.id())));
        }
        let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
        for (i, pid) in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()).enumerate() {
            rss.push((format!("ordo-kv replica {i}"), rss_kib(pid)));
        }
        let mut rows: Vec<Row> = Vec::new();
        for system in ["redis-server", "ordo-kv"] {
            for pipeline in [1u32, 16] {
                for test in ["SET", "GET"] {
                    let of: Vec<&Sample> = samples
                        .iter()
                        .filter(|s| s.system == system && s.pipeline == pipeline && s.test == test)
                        .collect();
                    if of.is_empty() {
                        continue;
                    }
                    let rps: Vec<f64> = of.iter().map(|s| s.rps).collect();
                    let (lo, hi) = (
                        rps.iter().copied().fold(f64::MAX, f64::min),
                        rps.iter().copied().fold(0.0, f64::max),
                    );
                    let med = median(rps);
                    let vs_redis = (system == "ordo-kv")
                        .then(|| {
                            rows.iter()
                                .find(|r| {
                                    r.system == "redis-server" && r.pipeline == pipeline && r.test == test
                                })
                                .map(|r| med / r.rps[0])
                        })
                        .flatten();
                    rows.push(Row {
                        system: system.into(),
                        test: test.into(),
                        pipeline,
                        rps: [med, lo, hi],
                        p50_ms: median(of.iter().map(|s| s.p50_ms).collect()),
                        p99_ms: median(of.iter().map(|s| s.p99_ms).collect()),
                        vs_redis,
                    });
                }
            }
        }
        drop(guard);
        Ok(KvReport {
            ycsb: ycsb_rows,
            skipped,
            machine: MachineInfo::current(),
            loadavg_before,
            requests: n,
            samples,
            rows,
            rss_kib: rss,
        })
    }

    fn print_table(&self, r: &KvReport) {
        if self.args.ycsb {
            println!(
                "ordo bench kv --ycsb: one YCSB driver (zipfian 0.99, 1,000-byte records, {} threads) against ordo-kv (acuerdo, shm; memory, and disk = fsync before Accept), a single redis-server, etcd and ZooKeeper; durable data under {}; n: replicas",
                self.args.threads,
                self.args.data_root.display()
            );
            println!("machine: {}; load average before: {:.2}", r.machine.summary(), r.loadavg_before);
            println!(
                "{:<13} {:>3} {:>5} {:>10} {:>9} {:>9} {:>8} {:>10} {:>10}",
                "system", "n", "wl", "ops/s", "p50 us", "p99 us", "errors", "ordo-kv x", "kv-disk x"
            );
            for row in &r.ycsb {
                println!(
                    "{:<13} {:>3} {:>5} {:>10.0} {:>9.0} {:>9.0} {:>8} {:>10} {:>10}",
                    row.system,
                    row.replicas,
                    row.workload,
                    row.outcome.ops_per_s(),
                    row.outcome.p50_us,
                    row.outcome.p99_us,
                    row.outcome.errors,
                    row.ordo_vs_this.map_or(String::new(), |v| format!("{v:.1}x")),
                    row.ordo_disk_vs_this.map_or(String::new(), |v| format!("{v:.1}x"))
                );
            }
            for s in &r.skipped {
                println!("not run: {s}");
            }
            for (who, kib) in &r.rss_kib {
                println!("resident memory at the end: {who}: {:.1} MiB", *kib as f64 / 1024.0);
            }
            return;
        }
        println!(
            "ordo bench kv: redis-benchmark (-c {}) against a single redis-server and ordo-kv (3 replicas, acuerdo, shm, memory), interleaved, {} reps",
            self.args.clients, self.args.reps
        );
        println!("machine: {}; load average before: {:.2}", r.machine.summary(), r.loadavg_before);
        println!(
            "{:<14} {:>4} {:>3} {:>12} {:>22} {:>9} {:>9} {:>9}",
            "system", "test", "-P", "ops/s", "[min - max]", "p50 ms", "p99 ms", "vs redis"
        );
        for row in &r.rows {
            println!(
                "{:<14} {:>4} {:>3} {:>12.0} {:>22} {:>9.3} {:>9.3} {:>9}",
                row.system,
                row.test,
                row.pipeline,
                row.rps[0],
                format!("[{:.0} - {:.0}]", row.rps[1], row.rps[2]),
                row.p50_ms,
                row.p99_ms,
                row.vs_redis.map_or(String::new(), |v| format!("{v:.2}x"))
            );
        }
        for (who, kib) in &r.rss_kib {
            println!("resident memory after the load: {who}: {:.1} MiB", *kib as f64 / 1024.0);
        }
    }
}
