//! `ordo node` (one vsync member daemon per process, from a configuration)
//! and `ordo cluster up|status|kill|down` (a local cluster of them).

use clap::{Args, Subcommand, ValueEnum};
use ordo_runtime::node::{LocalCluster, fetch_status};
use ordo_runtime::{Backend, Node, NodeStatus, OrdoConfig, StatusServer};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// Stop after this many seconds (default: run until killed or stopped
    /// by the group).
    #[arg(long)]
    pub for_s: Option<u64>,
    /// Join a running group (a new member, or a restarted one) instead of
    /// forming view 0: the daemon asks the configured members to let it
    /// in and receives its subgroups' state before it delivers.
    #[arg(long)]
    pub join: bool,
}

#[derive(Subcommand)]
pub enum Cluster {
    /// Start N member daemons on this host (configs, secret, logs and pids
    /// under --dir) and wait until each serves its status.
    Up(UpArgs),
    /// Each member's view, state and counters (from its status endpoint).
    Status(StatusArgs),
    /// Restart a member that died or left as a new incarnation: it joins
    /// the running group and receives its state (`ordo node --join`).
    Restart {
        /// The member id.
        member: u32,
        /// The cluster directory.
        #[arg(long, default_value = "ordo-cluster")]
        dir: PathBuf,
    },
    /// SIGKILL one member (to watch the others change the view).
    Kill {
        /// The member id.
        member: u32,
        /// The cluster directory.
        #[arg(long, default_value = "ordo-cluster")]
        dir: PathBuf,
    },
    /// Stop every member (SIGTERM, then SIGKILL after 5 s).
    Down {
        /// The cluster directory.
        #[arg(long, default_value = "ordo-cluster")]
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum FabricArg {
    Shm,
    Tcp,
    /// libfabric `tcp;ofi_rxm` (a build with `--features ofi`).
    Ofi,
}

impl std::fmt::Display for FabricArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FabricArg::Shm => "shm",
            FabricArg::Tcp => "tcp",
            FabricArg::Ofi => "ofi",
        })
    }
}

#[derive(Args)]
pub struct UpArgs {
    /// Members.
    #[arg(short = 'n', long, default_value_t = 3)]
    pub members: u32,
    /// The fabric.
    #[arg(long, value_enum, default_value = "shm")]
    pub fabric: FabricArg,
    /// A base configuration (member ids, addresses and the secret are set
    /// here).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where configs, the secret, logs and pids go.
    #[arg(long, default_value = "ordo-cluster")]
    pub dir: PathBuf,
    /// First port: member i uses base+i (tcp fabric), base+100+i (control),
    /// base+200+i (status).
    #[arg(long, default_value_t = 7400)]
    pub base_port: u16,
    /// Messages per second each member sends (0: none).
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Write each member's delivered messages to DIR/delivered-ID.log.
    #[arg(long)]
    pub delivery_log: bool,
    /// The engine: vsync (views) or acuerdo (quorum atomic broadcast);
    /// with `--kv` also raft. Default: vsync, and acuerdo with `--kv`.
    #[arg(long, value_enum)]
    pub engine: Option<EngineArg>,
    /// Start `ordo kv serve` replicas (the replicated key-value store,
    /// spoken as Redis on ports base+300+i) instead of `ordo node`
    /// daemons; clients authenticate with DIR/client.secret.
    #[arg(long)]
    pub kv: bool,
    /// With `--kv`: `memory` (committed = in a quorum's memory) or `disk`
    /// (each replica fsyncs its log in DIR/data-N before it accepts; a
    /// full-cluster `down`/`up` on the same DIR recovers every
    /// acknowledged write).
    #[arg(long, value_enum, default_value = "memory", requires = "kv")]
    pub durability: DurabilityArg,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum EngineArg {
    Vsync,
    Acuerdo,
    /// With `--kv` only: ordo-kv over R3P2 (Raft inside R2P2, UDP ports
    /// base+400+i).
    Raft,
}

/// `ordo cluster up --kv --durability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityArg {
    /// Committed = held by a quorum in memory (acuerdo §4.3).
    Memory,
    /// Committed = fsynced by a quorum.
    Disk,
}

#[derive(Args)]
pub struct StatusArgs {
    /// The cluster directory.
    #[arg(long, default_value = "ordo-cluster")]
    pub dir: PathBuf,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

static TERMINATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, std::sync::atomic::Ordering::Release);
}

/// `ordo node`. SIGTERM or SIGINT leaves the group gracefully (the others
/// install a view without this member), then exits.
pub fn node(mut args: NodeArgs) -> Result<(), String> {
    if args.join {
        args.config.sets.push("node.join=true".into());
    }
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGTERM, on_terminate as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_terminate as *const () as libc::sighandler_t);
    }
    let config = crate::load_config(&args.config)?;
    let node = Node::start(&config).map_err(|e| format!("member {}: {e}", config.member.id))?;
    let server = match &config.node.status {
        None => None,
        Some(addr) => {
            let addr = addr.parse().map_err(|e| format!("node.status {addr}: {e}"))?;
            Some(
                StatusServer::start(addr, node.status_source())
                    .map_err(|e| format!("node.status {addr}: {e}"))?,
            )
        }
    };
    println!(
        "ordo node: member {} of {:?} on {:?} ({:?}), control {}{}",
        config.member.id,
        config.group.members,
        config.fabric.backend,
        config.node.engine,
        node.control_addr().map_or("none".to_string(), |a| a.to_string()),
        server.as_ref().map(|s| format!(", status http://{}/status", s.local_addr())).unwrap_or_default()
    );
    let start = Instant::now();
    let mut shown = 0;
    let mut leaving: Option<Instant> = None;
    loop {
        if leaving.is_none() && TERMINATE.load(std::sync::atomic::Ordering::Acquire) {
            println!("leaving the group");
            node.leave();
            leaving = Some(Instant::now());
        }
        let exit = node.wait(Duration::from_millis(100));
        let st = node.status();
        if st.view != shown {
            shown = st.view;
            println!(
                "view {} installed: members {:?} ({:.1} ms after the wedge, {} ragged, {} resent)",
                st.view, st.members, st.last_view_change_ms, st.ragged_delivered, st.resent
            );
        }
        if let Some(exit) = exit {
            drop(server);
            drop(node);
            if leaving.is_some() && matches!(exit, ordo_runtime::NodeExit::Removed { .. }) {
                println!("member {}: left the group", config.member.id);
                return Ok(());
            }
            return Err(format!("member {}: {exit}", config.member.id));
        }
        // A member that cannot leave (the last one, or all leaving at once
        // as `ordo cluster down` makes them) stops after a second of trying.
        if leaving.is_some_and(|t| t.elapsed() > Duration::from_secs(1)) {
            drop(server);
            node.stop();
            return Ok(());
        }
        if args.for_s.is_some_and(|s| start.elapsed() >= Duration::from_secs(s)) {
            drop(server);
            node.stop();
            return Ok(());
        }
    }
}

fn local(args: &UpArgs, cluster: &str) -> LocalCluster {
    LocalCluster {
        members: args.members,
        backend: match args.fabric {
            FabricArg::Shm => Backend::Shm,
            FabricArg::Tcp => Backend::Tcp,
            FabricArg::Ofi => Backend::Ofi,
        },
        dir: args.dir.clone(),
        base_port: args.base_port,
        cluster: cluster.to_string(),
        rate: args.rate,
        message_bytes: args.size,
        delivery_log: args.delivery_log,
    }
}

/// `ordo cluster ...`.
pub fn cluster(cmd: Cluster) -> Result<(), String> {
    match cmd {
        Cluster::Up(args) => up(args),
        Cluster::Status(args) => status(&args),
        Cluster::Kill { member, dir } => {
            let pids = read_pids(&dir)?;
            let pid =
                pids.get(member as usize).copied().ok_or_else(|| format!("no member {member} in {dir:?}"))?;
            signal(pid, libc::SIGKILL);
            println!("member {member} (pid {pid}) killed");
            Ok(())
        }
        Cluster::Down { dir } => down(&dir),
        Cluster::Restart { member, dir } => restart(member, &dir),
    }
}

fn spawn_node(dir: &Path, id: u32, join: bool) -> Result<u32, String> {
    spawn_node_with(dir, id, join, None)
}

fn spawn_node_with(dir: &Path, id: u32, join: bool, incarnation: Option<u64>) -> Result<u32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}"))?;
    let path = dir.join(format!("node-{id}.toml"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("node-{id}.log")))
        .map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(&exe);
    let kv = dir.join("kind").exists();
    if kv {
        cmd.args(["kv", "serve", "--config"]).arg(&path);
    } else {
        cmd.args(["node", "--config"]).arg(&path);
    }
    if join && !kv {
        cmd.arg("--join");
    }
    // A restarted vsync replica joins the running group (and receives the
    // table); the other engines recover or catch up on their own.
    if join && kv {
        cmd.args(["--set", "node.join=true"]);
    }
    if let Some(i) = incarnation {
        cmd.args(["--set", &format!("node.incarnation={i}")]);
    }
    let child = cmd
        .env("ORDO_LOG", std::env::var("ORDO_LOG").unwrap_or_else(|_| "info".into()))
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("spawning member {id}: {e}"))?;
    Ok(child.id())
}

fn restart(member: u32, dir: &Path) -> Result<(), String> {
    let mut pids = read_pids(dir)?;
    let slot =
        pids.get_mut(member as usize).ok_or_else(|| format!("no member {member} in {}", dir.display()))?;
    if alive(*slot) {
        return Err(format!("member {member} (pid {slot}) is running"));
    }
    // Incarnations count up per member (acuerdo needs larger ones).
    let counter = dir.join(format!("incarnation-{member}"));
    let inc =
        std::fs::read_to_string(&counter).ok().and_then(|t| t.trim().parse::<u64>().ok()).unwrap_or(1) + 1;
    std::fs::write(&counter, inc.to_string()).map_err(|e| e.to_string())?;
    *slot = spawn_node_with(dir, member, true, Some(inc))?;
    let list: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(dir.join("pids"), list).map_err(|e| e.to_string())?;
    println!("member {member} restarted (pid {}); it joins the running group", pids[member as usize]);
    Ok(())
}

/// `up`'s members: each one's config written and its process spawned (the
/// pids file rewritten after each), then a wait until every one reports
/// itself up — or an error as soon as one exits, quoting its log.
fn start_members(
    args: &UpArgs,
    engine: EngineArg,
    base: &OrdoConfig,
    cluster: &str,
    client_secret: &Path,
    pids: &mut Vec<u32>,
) -> Result<(), String> {
    for id in 0..args.members {
        let mut c = local(args, cluster).member_config(base, id);
        if engine == EngineArg::Acuerdo || args.kv {
            c.node.engine = ordo_runtime::NodeEngine::Acuerdo;
            c.node.message_bytes = c.node.message_bytes.max(16);
        }
        if args.kv {
            let kv_port = |i: u32| format!("127.0.0.1:{}", u32::from(args.base_port) + 300 + i);
            c.kv.listen = kv_port(id);
            c.kv.replicas =
                (0..args.members).map(|i| ordo_runtime::TcpPeer { id: i, addr: kv_port(i) }).collect();
            c.security.client_secret_file = Some(client_secret.to_path_buf());
            c.node.send_rate = 0;
            if engine == EngineArg::Vsync {
                c.kv.engine = ordo_runtime::KvEngine::Vsync;
                c.node.engine = ordo_runtime::NodeEngine::Vsync;
            }
            if engine == EngineArg::Raft {
                c.kv.engine = ordo_runtime::KvEngine::Raft;
                let raft_port = |i: u32| format!("127.0.0.1:{}", u32::from(args.base_port) + 400 + i);
                c.kv.raft =
                    (0..args.members).map(|i| ordo_runtime::TcpPeer { id: i, addr: raft_port(i) }).collect();
            }
            if args.durability == DurabilityArg::Disk {
                c.kv.durability = ordo_runtime::KvDurability::Disk;
            }
            // Raft keeps its log (and vote) there in both modes.
            if args.durability == DurabilityArg::Disk || engine == EngineArg::Raft {
                let data =
                    std::path::absolute(args.dir.join(format!("data-{id}"))).map_err(|e| e.to_string())?;
                c.kv.data_dir = Some(data.display().to_string());
            }
            c.validate_kv().map_err(|e| format!("replica {id}: {e}"))?;
        } else {
            c.validate_node_daemon().map_err(|e| format!("member {id}: {e}"))?;
        }
        let path = args.dir.join(format!("node-{id}.toml"));
        std::fs::write(&path, c.to_toml_string()).map_err(|e| format!("{}: {e}", path.display()))?;
        pids.push(spawn_node(&args.dir, id, false)?);
        let list: String = pids.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(args.dir.join("pids"), list).map_err(|e| e.to_string())?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = statuses(&args.dir)?;
        let up = |s: &NodeStatus| matches!(s.state.as_str(), "running" | "leader" | "follower");
        if all.iter().all(|(_, s)| s.as_ref().is_ok_and(up)) {
            break;
        }
        // A member that exited will not come up: say why at once.
        if let Some(id) = pids.iter().position(|p| !alive(*p)) {
            let log = std::fs::read_to_string(args.dir.join(format!("node-{id}.log"))).unwrap_or_default();
            let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(its log is empty)");
            return Err(format!("member {id} exited while starting: {}", last.trim()));
        }
        if Instant::now() > deadline {
            status(&StatusArgs { dir: args.dir.clone(), json: false })?;
            return Err(format!("not every member came up; see {}/node-*.log", args.dir.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn up(args: UpArgs) -> Result<(), String> {
    if args.members == 0 {
        return Err("a cluster needs at least one member".into());
    }
    let engine = args.engine.unwrap_or(if args.kv { EngineArg::Acuerdo } else { EngineArg::Vsync });
    if engine == EngineArg::Raft && !args.kv {
        return Err("--engine raft runs ordo-kv replicas: add --kv".into());
    }
    if args.dir.join("pids").exists() {
        return Err(format!(
            "{} holds a running cluster (ordo cluster down --dir {0:?} first)",
            args.dir.display()
        ));
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let base = match &args.config {
        Some(p) => load(p)?,
        None => OrdoConfig::default(),
    };
    let secret = args.dir.join("cluster.secret");
    if !secret.exists() {
        ordo_runtime::Secret::generate_file(&secret).map_err(|e| e.to_string())?;
    }
    let client_secret = args.dir.join("client.secret");
    if args.kv && !client_secret.exists() {
        ordo_runtime::Secret::generate_file(&client_secret).map_err(|e| e.to_string())?;
    }
    // `ordo cluster restart` starts the same kind of process.
    if args.kv {
        std::fs::write(args.dir.join("kind"), "kv\n").map_err(|e| e.to_string())?;
    } else {
        let _ = std::fs::remove_file(args.dir.join("kind"));
    }
    let cluster = format!("cluster-{}", std::process::id());
    let mut pids = Vec::new();
    let args_status = StatusArgs { dir: args.dir.clone(), json: false };
    // Up all the way or not at all: on any failure the members started so
    // far (the pids file lists each as it starts) are stopped again.
    let started = start_members(&args, engine, &base, &cluster, &client_secret, &mut pids);
    if let Err(e) = started {
        if args.dir.join("pids").exists() {
            let _ = down(&args.dir);
        }
        return Err(format!(
            "{e} (the members started were stopped again; their logs stay in {})",
            args.dir.display()
        ));
    }
    if args.kv {
        println!(
            "{} ordo-kv replicas up ({}), {:?} durability (configs, secrets, logs and pids in {})",
            args.members,
            match engine {
                EngineArg::Raft => "raft: R3P2 over UDP".to_string(),
                e => format!("{e:?} on the {:?} fabric", args.fabric).to_lowercase(),
            },
            args.durability,
            args.dir.display()
        );
        let password = std::fs::read_to_string(&client_secret).map_err(|e| e.to_string())?;
        for id in 0..args.members {
            println!(
                "  redis-cli -p {} -a {} --no-auth-warning",
                u32::from(args.base_port) + 300 + id,
                password.trim()
            );
        }
        return status(&args_status);
    }
    println!(
        "{} {:?} members up on the {} fabric (configs, secret, logs and pids in {})",
        args.members,
        engine,
        args.fabric,
        args.dir.display()
    );
    status(&args_status)
}

fn load(path: &Path) -> Result<OrdoConfig, String> {
    OrdoConfig::load(Some(path), std::iter::empty::<(String, String)>(), &[]).map_err(|e| e.to_string())
}

fn read_pids(dir: &Path) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(dir.join("pids"))
        .map_err(|e| format!("{}: {e}", dir.join("pids").display()))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

fn signal(pid: u32, sig: i32) -> bool {
    // SAFETY: kill(2) with a pid this tool started; no memory is involved.
    unsafe { libc::kill(pid as i32, sig) == 0 }
}

fn alive(pid: u32) -> bool {
    // Reap it if it is our child; else ask the kernel whether it exists.
    signal(pid, 0) && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

fn down(dir: &Path) -> Result<(), String> {
    let pids = read_pids(dir)?;
    for &p in &pids {
        signal(p, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &p in pids.iter().filter(|p| alive(**p)) {
        signal(p, libc::SIGKILL);
    }
    // The region files are removed once their owners are gone.
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_file(dir.join("pids"));
    // shm region files of every view of this cluster.
    if let Ok(c) = load(&dir.join("node-0.toml")) {
        ordo_runtime::node::remove_view_files(&c.fabric.shm.dir, &c.fabric.shm.cluster);
    }
    println!("{} members stopped", pids.len());
    Ok(())
}

type Statuses = Vec<(u32, Result<NodeStatus, String>)>;

fn statuses(dir: &Path) -> Result<Statuses, String> {
    let mut out = Vec::new();
    for id in 0.. {
        let path = dir.join(format!("node-{id}.toml"));
        if !path.exists() {
            break;
        }
        let c = load(&path)?;
        let st = match &c.node.status {
            None => Err("no status endpoint".to_string()),
            Some(addr) => fetch_status(addr),
        };
        out.push((id, st));
    }
    if out.is_empty() {
        return Err(format!("no node-*.toml in {}", dir.display()));
    }
    Ok(out)
}

fn status(args: &StatusArgs) -> Result<(), String> {
    let all = statuses(&args.dir)?;
    if args.json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|(id, s)| match s {
                Ok(st) => serde_json::to_value(st).unwrap_or_default(),
                Err(e) => serde_json::json!({ "member": id, "state": "unreachable", "error": e }),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!(
        "{:<7} {:<10} {:>5} {:<16} {:>12} {:>12} {:>8} {:>12}",
        "member", "state", "view", "members", "delivered", "sent", "changes", "last change"
    );
    for (id, s) in &all {
        match s {
            Ok(st) => println!(
                "{:<7} {:<10} {:>5} {:<16} {:>12} {:>12} {:>8} {:>9.1} ms",
                id,
                st.state,
                st.view,
                format!("{:?}", st.members),
                st.subgroups.iter().map(|g| g.delivered_messages).sum::<u64>(),
                st.subgroups.iter().map(|g| g.sent_messages).sum::<u64>(),
                st.view_changes,
                st.last_view_change_ms
            ),
            Err(e) => println!("{id:<7} {:<10} ({e})", "down"),
        }
    }
    Ok(())
}

/// `ordo demo --kill` / `ordo demo --fabric tcp`.
pub struct DemoViews {
    pub members: u32,
    pub fabric: FabricArg,
    pub seconds: u64,
    pub size: usize,
    pub rate: u64,
    pub window: usize,
    pub kill: bool,
}

/// One delivery-log line: (view, subgroup, sender, index, bytes, digest).
type Delivery = (u64, u64, u64, u64, u64, String);

fn read_deliveries(path: &Path) -> Vec<Delivery> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() != 6 || f[5].len() != 16 {
                return None; // a line cut by the kill
            }
            let n = |i: usize| f[i].parse::<u64>().ok();
            Some((n(0)?, n(1)?, n(2)?, n(3)?, n(4)?, f[5].to_string()))
        })
        .collect()
}

/// The demo of what sets ordo apart: a group of daemons streaming, the
/// view leader SIGKILLed halfway, the survivors installing a new view
/// within milliseconds and going on — and the delivery logs compared.
pub fn demo_views(d: &DemoViews) -> Result<(), String> {
    if d.members < 3 && d.kill {
        return Err("--kill needs at least 3 members (a majority must survive)".into());
    }
    let dir = std::env::temp_dir().join(format!("ordo-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    ordo_runtime::Secret::generate_file(&dir.join("cluster.secret")).map_err(|e| e.to_string())?;
    let base_port = ordo_runtime::node::free_base_port(d.members).ok_or("no free ports")?;
    let local = LocalCluster {
        members: d.members,
        backend: match d.fabric {
            FabricArg::Shm => Backend::Shm,
            FabricArg::Tcp => Backend::Tcp,
            FabricArg::Ofi => Backend::Ofi,
        },
        dir: dir.clone(),
        base_port,
        cluster: format!("demo-{}", std::process::id()),
        rate: d.rate,
        message_bytes: d.size.max(8),
        delivery_log: true,
    };
    let mut base = OrdoConfig::default();
    base.vsync.window = d.window;
    let exe = std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}"))?;
    struct Kids(Vec<Option<std::process::Child>>, LocalCluster);
    impl Drop for Kids {
        fn drop(&mut self) {
            for c in self.0.iter_mut().flatten() {
                let _ = c.kill();
                let _ = c.wait();
            }
            ordo_runtime::node::remove_view_files(Path::new("/dev/shm"), &self.1.cluster);
        }
    }
    let mut kids = Kids(Vec::new(), local.clone());
    let mut status_addrs = Vec::new();
    for id in 0..d.members {
        let c = local.member_config(&base, id);
        c.validate_node_daemon().map_err(|e| format!("member {id}: {e}"))?;
        let path = dir.join(format!("node-{id}.toml"));
        std::fs::write(&path, c.to_toml_string()).map_err(|e| e.to_string())?;
        status_addrs.push(c.node.status.clone().expect("status address"));
        let log = std::fs::File::create(dir.join(format!("node-{id}.log"))).map_err(|e| e.to_string())?;
        let child = std::process::Command::new(&exe)
            .args(["node", "--config"])
            .arg(&path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning member {id}: {e}"))?;
        kids.0.push(Some(child));
    }
    println!(
        "ordo demo: {} `ordo node` daemons on the {} fabric, each sending {} B messages at {}/s for {} s{}",
        d.members,
        d.fabric,
        d.size,
        d.rate,
        d.seconds,
        if d.kill { "; the view leader (member 0) is SIGKILLed halfway" } else { "" }
    );
    let status = |m: u32| fetch_status(&status_addrs[m as usize]).ok();
    let up_deadline = Instant::now() + Duration::from_secs(20);
    while !(0..d.members).all(|m| status(m).is_some_and(|s| s.state == "running")) {
        if Instant::now() > up_deadline {
            return Err(format!("the daemons did not come up; see {}/node-*.log", dir.display()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let start = Instant::now();
    let total = Duration::from_secs(d.seconds.max(1));
    let mut killed_at: Option<(u64, Instant)> = None;
    let mut next_line = Duration::ZERO;
    while start.elapsed() < total {
        if d.kill && killed_at.is_none() && start.elapsed() >= total / 2 {
            if let Some(c) = kids.0[0].as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            kids.0[0] = None;
            killed_at = Some((ordo_runtime::node::unix_ns(), Instant::now()));
            println!("  {:>5.1} s  SIGKILL member 0 (the view leader)", start.elapsed().as_secs_f64());
        }
        if start.elapsed() >= next_line {
            next_line += Duration::from_millis(500);
            let parts: Vec<String> = (0..d.members)
                .map(|m| match status(m) {
                    Some(s) => format!(
                        "m{m}: view {} {:?} {} delivered",
                        s.view,
                        s.members,
                        s.subgroups.iter().map(|g| g.delivered_messages).sum::<u64>()
                    ),
                    None => format!("m{m}: dead"),
                })
                .collect();
            println!("  {:>5.1} s  {}", start.elapsed().as_secs_f64(), parts.join(" | "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let survivors: Vec<u32> = (0..d.members).filter(|m| !(d.kill && *m == 0)).collect();
    let finals: Vec<NodeStatus> = survivors.iter().filter_map(|&m| status(m)).collect();
    // Let every survivor flush its log (every tick), then stop them.
    std::thread::sleep(Duration::from_millis(100));
    drop(kids);
    let logs: Vec<Vec<Delivery>> =
        (0..d.members).map(|m| read_deliveries(&dir.join(format!("delivered-{m}.log")))).collect();
    let of =
        |m: u32, v: u64| -> Vec<Delivery> { logs[m as usize].iter().filter(|l| l.0 == v).cloned().collect() };
    let prefix = |a: &[Delivery], b: &[Delivery]| a.len() <= b.len() && a == &b[..a.len()];
    let mut ok = true;
    let last_view = finals.iter().map(|s| s.view).max().unwrap_or(0);
    println!();
    for v in 0..=last_view {
        let complete = v < last_view;
        let reference = of(survivors[0], v);
        for &m in &survivors[1..] {
            let seq = of(m, v);
            let same = if complete {
                seq == reference
            } else {
                prefix(&seq, &reference) || prefix(&reference, &seq)
            };
            ok &= same;
        }
        println!(
            "view {v}: survivors {:?} delivered {} messages{}, {}",
            survivors,
            reference.len(),
            if complete { "" } else { " (so far)" },
            if ok { "in the same order at every survivor" } else { "DIFFERENTLY" }
        );
        if d.kill && v == 0 {
            let dead = of(0, 0);
            let atomic = prefix(&dead, &reference);
            ok &= atomic;
            println!(
                "  the killed leader had delivered {} of them{}",
                dead.len(),
                if atomic {
                    ", all in the survivors' order (failure atomicity)"
                } else {
                    " — NOT a prefix"
                }
            );
        }
    }
    if let (Some((kill_ns, _)), Some(s)) = (killed_at, finals.first())
        && s.view >= 1
    {
        let install = finals.iter().map(|s| s.installed_at_unix_ns).min().unwrap_or(0);
        println!(
            "view 1 {:?} installed {:.1} ms after the kill ({} messages delivered in the ragged-edge cleanup, {} \
             resent by their senders)",
            s.members,
            install.saturating_sub(kill_ns) as f64 / 1e6,
            s.ragged_delivered,
            s.resent
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    if ok { Ok(()) } else { Err("the survivors' deliveries differ".into()) }
}
