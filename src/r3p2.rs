//! `ordo r3p2`: run R3P2 servers (R2P2 over UDP with Raft behind
//! REPLICATED_ROUTE) and talk to them.
//!
//! ```text
//! ordo r3p2 cluster --members 3 --data /tmp/r3p2          # three local replicas
//! ordo r3p2 put --servers 127.0.0.1:7400,127.0.0.1:7401,127.0.0.1:7402 k v
//! ordo r3p2 get --servers ... k
//! ordo r3p2 serve --id 0 --peers A,B,C --data DIR --secret-file S --admin-secret-file A
//! ordo r3p2 admin --admin-secret-file ordo-r3p2-data/admin.secret status
//! ```
//!
//! Secrets (SECURITY.md) are read from files named here, never taken on
//! the command line: the cluster secret seals replica traffic, the admin
//! secret admin commands, the optional client secret requests.

use clap::{Args, Subcommand};
use ordo_r2p2::{
    Client, ClientConfig, HandlerMode, KvOp, KvReply, NodeOptions, Policy, ServiceKind, start_node,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum R3p2 {
    /// Run one server (a replica when there are several peers).
    Serve(ServeArgs),
    /// Start `--members` replicas on this host as child processes and wait
    /// (Ctrl-C stops them).
    Cluster(ClusterArgs),
    /// Write a key (REPLICATED_ROUTE): prints the previous value.
    Put(PutArgs),
    /// Send an admin command to the replicas: `status`, `add-learner <id>`,
    /// `promote <id>`, `remove <id>` (Raft ids are peer indexes + 1).
    Admin(AdminArgs),
    /// Read a key through the log (REPLICATED_ROUTE: linearizable), or
    /// locally at any replica with `--stale` (LB_ROUTE).
    Get(GetArgs),
}

#[derive(Args, Clone)]
pub struct ServeArgs {
    /// This server's index in --peers.
    #[arg(long)]
    id: usize,
    /// Every replica's address, comma-separated, the same on every replica.
    #[arg(long, value_delimiter = ',', required = true)]
    peers: Vec<SocketAddr>,
    /// Directory of the durable log (omit: in memory).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Do not fsync (in-memory durability mode; a machine crash can lose
    /// acknowledged writes).
    #[arg(long)]
    no_fsync: bool,
    /// Serve without Raft (FIXED/LB_ROUTE only; the unreplicated baseline).
    #[arg(long)]
    unreplicated: bool,
    /// The application: `kv` or `spin:<micros>`.
    #[arg(long, default_value = "kv")]
    service: ServiceKind,
    /// Handler threads fed by SPSC queues; 0 runs handlers on the network
    /// thread (r3p2 §5.1).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Snapshot and compact the log every this many entries (0: never), and
    /// only once the log since the last snapshot is as large as that
    /// snapshot (sessions' answers included), so snapshots never cost more
    /// to write than the log they replace.
    #[arg(long, default_value_t = 10_000)]
    snapshot_interval: u64,
    /// Idle duty cycles the network thread and workers spin before
    /// yielding (then parking); 0 gives the core up at once. Default: 0
    /// (`SOCKET_IDLE`; also where the replicas' threads on this host, peers
    /// sharing this server's IP, outnumber its CPUs).
    #[arg(long)]
    idle_spins: Option<u32>,
    /// Idle duty cycles spent yielding after the spins, before parking.
    /// Default: 250, or 100 where the replicas' threads outnumber the CPUs.
    /// Either flag given: this host's default backoff with the values
    /// given (the other keeps its default).
    #[arg(long)]
    idle_yields: Option<u32>,
    /// Voters of a brand-new cluster: the first N peers (default: all);
    /// the others start as spares for `ordo r3p2 admin add-learner`.
    #[arg(long)]
    voters: Option<usize>,
    /// Print a status line this often (seconds; 0: never).
    #[arg(long, default_value_t = 0)]
    status_every: u64,
    /// SO_BUSY_POLL on the server socket, µs (NAPI devices; no effect on
    /// loopback; refused without CAP_NET_ADMIN past net.core.busy_read:
    /// logged, and the server runs without it).
    #[arg(long)]
    busy_poll_us: Option<u32>,
    /// Pin the network thread to this CPU (logged and ignored where refused).
    #[arg(long)]
    pin_cpu: Option<usize>,
    /// One datagram per socket system call (default: recvmmsg batches in,
    /// one sendmmsg per loop turn out).
    #[arg(long)]
    no_syscall_batching: bool,
    /// Tell followers a moved commit index at once, in an empty append
    /// (etcd's way; followers then apply µs, not up to a heartbeat, behind
    /// the leader). Default: it rides on the next append or heartbeat,
    /// half the replica datagrams per request at light load.
    #[arg(long)]
    announce_commit: bool,
    #[command(flatten)]
    secrets: ServerSecrets,
}

/// Where a server's secrets are (files: mode 600, owned by this user).
#[derive(Args, Clone)]
pub struct ServerSecrets {
    /// The cluster secret: replica-to-replica datagrams are sealed with it
    /// and only sealed ones are accepted. Required with several peers
    /// unless --insecure.
    #[arg(long, env = "ORDO_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// The admin secret: admin commands without its MAC are refused (no
    /// file: admin commands are disabled).
    #[arg(long, env = "ORDO_ADMIN_SECRET_FILE")]
    admin_secret_file: Option<PathBuf>,
    /// The client secret: requests sealed with it are checked.
    #[arg(long, env = "ORDO_CLIENT_SECRET_FILE")]
    client_secret_file: Option<PathBuf>,
    /// Refuse requests not sealed with the client secret.
    #[arg(long, requires = "client_secret_file")]
    require_client_mac: bool,
    /// Run replicas without a cluster secret (anyone who can send UDP from
    /// a replica's address can change the log): closed test networks only.
    #[arg(long)]
    insecure: bool,
}

fn read_secret(path: &Option<PathBuf>) -> Result<Option<ordo_runtime::Secret>, String> {
    path.as_ref().map(|p| ordo_runtime::Secret::from_file(p).map_err(|e| e.to_string())).transpose()
}

impl ServerSecrets {
    fn auth(&self, replicas: usize) -> Result<ordo_r2p2::AuthConfig, String> {
        let cluster = read_secret(&self.secret_file)?;
        if cluster.is_none() && replicas > 1 && !self.insecure {
            return Err("a replica needs the cluster secret: --secret-file FILE (make one with `ordo secret new FILE`), or --insecure on a closed test network".into());
        }
        Ok(ordo_r2p2::AuthConfig {
            cluster,
            admin: read_secret(&self.admin_secret_file)?,
            client: read_secret(&self.client_secret_file)?,
            require_client_mac: self.require_client_mac,
            ..Default::default()
        })
    }
}

#[derive(Args)]
pub struct ClusterArgs {
    /// Number of replicas.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// First UDP port (replica i listens on base + i, on 127.0.0.1).
    #[arg(long, default_value_t = 7400)]
    base_port: u16,
    /// Parent directory of the replicas' logs.
    #[arg(long, default_value = "ordo-r3p2-data")]
    data: PathBuf,
    /// The application: `kv` or `spin:<micros>`.
    #[arg(long, default_value = "kv")]
    service: ServiceKind,
}

#[derive(Args)]
pub struct ClientArgs {
    /// The replicas' addresses, in the servers' --peers order.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7400,127.0.0.1:7401,127.0.0.1:7402")]
    servers: Vec<SocketAddr>,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 5_000)]
    timeout_ms: u64,
    /// The client secret, if the servers check client MACs.
    #[arg(long, env = "ORDO_CLIENT_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// The admin secret (for `ordo r3p2 admin`).
    #[arg(long, env = "ORDO_ADMIN_SECRET_FILE")]
    admin_secret_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct PutArgs {
    #[command(flatten)]
    client: ClientArgs,
    key: String,
    value: String,
}

#[derive(Args)]
pub struct AdminArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The command and its argument, e.g. `add-learner 4`.
    #[arg(required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Args)]
pub struct GetArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Read the local copy of any replica (LB_ROUTE; may be stale).
    #[arg(long)]
    stale: bool,
    key: String,
}

pub fn main(cmd: R3p2) -> Result<(), String> {
    match cmd {
        R3p2::Serve(args) => serve(args),
        R3p2::Cluster(args) => cluster(args),
        R3p2::Put(args) => {
            let op = KvOp::Put { key: args.key.into_bytes(), value: args.value.into_bytes() };
            call(&args.client, Policy::ReplicatedRoute, &op)
        }
        R3p2::Admin(args) => {
            let mut client = make_client(&args.client)?;
            let answer = client
                .admin(args.command.join(" ").as_bytes())
                .map_err(|e| format!("admin failed: {e}{}", unverified_hint(&client)))?;
            println!("{}", String::from_utf8_lossy(&answer));
            Ok(())
        }
        R3p2::Get(args) => {
            let policy = if args.stale { Policy::LbRoute } else { Policy::ReplicatedRoute };
            call(&args.client, policy, &KvOp::Get { key: args.key.into_bytes() })
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let mut opts = NodeOptions::new(args.id, args.peers.clone(), args.data.clone());
    opts.durable = !args.no_fsync;
    opts.replicated = !args.unreplicated;
    opts.service = args.service;
    opts.mode =
        if args.workers == 0 { HandlerMode::NetworkThread } else { HandlerMode::Workers(args.workers) };
    opts.snapshot_interval = args.snapshot_interval;
    opts.initial_voters = args.voters;
    opts.busy_poll_us = args.busy_poll_us;
    opts.pin_cpu = args.pin_cpu;
    opts.syscall_batching = !args.no_syscall_batching;
    opts.announce_commit = args.announce_commit;
    opts.auth = args.secrets.auth(if args.unreplicated { 1 } else { args.peers.len() })?;
    // The host's choice (yield first; fewer yields where the replicas'
    // threads outnumber the CPUs); spins or yields given: that backoff
    // with them.
    opts.idle = opts.idle_for_host();
    if (args.idle_spins.is_some() || args.idle_yields.is_some())
        && let ordo_runtime::IdleStrategy::BackoffPark { spins, yields, park_min, park_max } = opts.idle
    {
        opts.idle = ordo_runtime::IdleStrategy::BackoffPark {
            spins: args.idle_spins.unwrap_or(spins),
            yields: args.idle_yields.unwrap_or(yields),
            park_min,
            park_max,
        };
    }
    tracing::info!(threads_on_host = opts.threads_on_host(), idle = ?opts.idle, "r3p2 idle strategy");
    let node = start_node(&opts).map_err(|e| format!("cannot start server {}: {e}", args.id))?;
    println!("ready {} id {} of {}", node.local_addr(), args.id, args.peers.len());
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(args.status_every.max(1)));
        if args.status_every > 0
            && let Some(s) = node.status()
        {
            println!(
                "t={:.0}s term {} leader {:?} commit {} applied {} syncs {} snapshots {} duplicates {} answers forgotten {}",
                started.elapsed().as_secs_f64(),
                s.term(),
                s.leader(),
                s.commit(),
                s.applied(),
                s.syncs(),
                s.snapshots(),
                s.duplicates(),
                s.answers_forgotten()
            );
        }
    }
}

fn cluster(args: ClusterArgs) -> Result<(), String> {
    if args.members == 0 {
        return Err("--members must be at least 1".into());
    }
    let peers: Vec<String> =
        (0..args.members).map(|i| format!("127.0.0.1:{}", args.base_port as usize + i)).collect();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // One cluster secret and one admin secret for this cluster, kept with
    // its logs (made on first start, reused after).
    std::fs::create_dir_all(&args.data).map_err(|e| format!("creating {}: {e}", args.data.display()))?;
    let cluster_secret = args.data.join("cluster.secret");
    let admin_secret = args.data.join("admin.secret");
    for path in [&cluster_secret, &admin_secret] {
        if !path.exists() {
            ordo_runtime::Secret::generate_file(path).map_err(|e| e.to_string())?;
        }
    }
    let mut children: Vec<Child> = Vec::new();
    for id in 0..args.members {
        let dir = args.data.join(id.to_string());
        let mut command = Command::new(&exe);
        // The replicas die with this process (Ctrl-C, kill).
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = command
            .args(["r3p2", "serve", "--id", &id.to_string(), "--peers", &peers.join(",")])
            .args(["--service", &service_arg(args.service), "--status-every", "5"])
            .arg("--data")
            .arg(&dir)
            .arg("--secret-file")
            .arg(&cluster_secret)
            .arg("--admin-secret-file")
            .arg(&admin_secret)
            .spawn()
            .map_err(|e| format!("cannot start replica {id}: {e}"))?;
        children.push(child);
    }
    println!("{} replicas on {} (logs under {})", args.members, peers.join(","), args.data.display());
    println!("try: ordo r3p2 put --servers {} hello world", peers.join(","));
    println!(
        "admin: ordo r3p2 admin --servers {} --admin-secret-file {} status",
        peers.join(","),
        admin_secret.display()
    );
    for mut c in children {
        let _ = c.wait();
    }
    Ok(())
}

fn service_arg(s: ServiceKind) -> String {
    match s {
        ServiceKind::Kv => "kv".into(),
        ServiceKind::Spin { micros } => format!("spin:{micros}"),
    }
}

fn make_client(args: &ClientArgs) -> Result<Client, String> {
    let mut config = ClientConfig::new(args.servers.clone());
    config.timeout = Duration::from_millis(100);
    config.retries = (args.timeout_ms / 100).max(1) as u32;
    config.secret = read_secret(&args.secret_file)?;
    config.admin_secret = read_secret(&args.admin_secret_file)?;
    Client::new(config).map_err(|e| e.to_string())
}

/// Why a request may have timed out although servers answered.
fn unverified_hint(client: &Client) -> String {
    match client.stats().unauthenticated_answers {
        0 => String::new(),
        n => format!(
            " ({n} answers were dropped because they were not sealed with this client secret: is --secret-file the servers' --client-secret-file?)"
        ),
    }
}

fn call(args: &ClientArgs, policy: Policy, op: &KvOp) -> Result<(), String> {
    let mut client = make_client(args)?;
    let answer = client
        .call(policy, &op.encode())
        .map_err(|e| format!("request failed: {e}{}", unverified_hint(&client)))?;
    match KvReply::decode(&answer).map_err(|e| format!("bad answer: {e}"))? {
        KvReply::Value(Some(v)) => println!("{}", String::from_utf8_lossy(&v)),
        KvReply::Value(None) => println!("(none)"),
        KvReply::Cas { swapped, found } => println!("swapped={swapped} found={found:?}"),
        KvReply::Error(e) => return Err(e),
    }
    Ok(())
}
