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
}

#[derive(Subcommand)]
pub enum Cluster {
    /// Start N member daemons on this host (configs, secret, logs and pids
    /// under --dir) and wait until each serves its status.
    Up(UpArgs),
    /// Each member's view, state and counters (from its status endpoint).
    Status(StatusArgs),
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

/// `ordo node`.
pub fn node(args: NodeArgs) -> Result<(), String> {
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
        "ordo node: member {} of {:?} on {:?}, control {}{}",
        config.member.id,
        config.group.members,
        config.fabric.backend,
        node.control_addr(),
        server.as_ref().map(|s| format!(", status http://{}/status", s.local_addr())).unwrap_or_default()
    );
    let start = Instant::now();
    let mut shown = 0;
    loop {
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
            return Err(format!("member {}: {exit}", config.member.id));
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
    }
}

fn up(args: UpArgs) -> Result<(), String> {
    if args.members == 0 {
        return Err("a cluster needs at least one member".into());
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
    let cluster = format!("cluster-{}", std::process::id());
    let exe = std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}"))?;
    let mut pids = Vec::new();
    for id in 0..args.members {
        let c = local(&args, &cluster).member_config(&base, id);
        c.validate_node_daemon().map_err(|e| format!("member {id}: {e}"))?;
        let path = args.dir.join(format!("node-{id}.toml"));
        std::fs::write(&path, c.to_toml_string()).map_err(|e| format!("{}: {e}", path.display()))?;
        let log =
            std::fs::File::create(args.dir.join(format!("node-{id}.log"))).map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = std::process::Command::new(&exe)
            .args(["node", "--config"])
            .arg(&path)
            .env("ORDO_LOG", std::env::var("ORDO_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawning member {id}: {e}"))?;
        pids.push(child.id());
    }
    let list: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(args.dir.join("pids"), list).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let args_status = StatusArgs { dir: args.dir.clone(), json: false };
    loop {
        let all = statuses(&args.dir)?;
        if all.iter().all(|(_, s)| s.as_ref().is_ok_and(|s| s.state == "running")) {
            break;
        }
        if Instant::now() > deadline {
            status(&args_status)?;
            return Err(format!("not every member came up; see {}/node-*.log", args.dir.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "{} members up on the {:?} fabric (configs, secret, logs and pids in {})",
        args.members,
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
