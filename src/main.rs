//! `ordo`: the command-line front end.
//!
//! - `ordo demo` — the main job: a 3-member vsync group of processes on the
//!   shm fabric streaming 10 KiB messages, with what each member delivered.
//! - `ordo bench fabric` — fabric latency and bandwidth beside the machine's
//!   physical limits (see `ordo_bench::fabric`).
//! - `ordo bench spindle` — the Spindle paper's experiments, baseline vs
//!   optimized (see `ordo_bench::spindle`).
//! - `ordo bench acuerdo` — the Acuerdo paper's experiments.
//! - `ordo bench r3p2` — the r3p2 thesis' Figs. 5.1-5.2 over loopback UDP.
//! - `ordo config` — print the effective configuration (file < env < CLI).
//! - `ordo member` — bring up this member's fabric from the configuration
//!   and run its SST heartbeat agent, reporting peers' liveness.
//! - `ordo sim` — replay a simulated run by seed, or check a batch of seeds.
//! - `ordo fabric-peer` — the remote member that benchmarks and the
//!   multi-process tests spawn (hidden from help).

mod dds;
mod kv;
mod node;
mod r3p2;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "ordo", version, about = "Ordered replication at memory speed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: a 3-member atomic multicast group of processes on this
    /// host, every member streaming messages; prints what each delivered.
    Demo(DemoArgs),
    /// One member of `ordo demo` (spawned by it).
    #[command(hide = true)]
    DemoMember(DemoMemberArgs),
    /// Run a benchmark and report its figures.
    #[command(subcommand)]
    Bench(Bench),
    /// Print the effective configuration after environment and --set overrides.
    Config(ConfigArgs),
    /// Join the group named by the configuration and report peers' heartbeats.
    Member(MemberArgs),
    /// One vsync member daemon from a configuration file (`[node]`:
    /// control-plane addresses, status endpoint, load): it survives
    /// failures by view changes (virtual synchrony).
    Node(node::NodeArgs),
    /// The replicated key-value store, spoken as Redis: `ordo kv serve
    /// --config FILE` runs one replica.
    #[command(subcommand)]
    Kv(kv::Kv),
    /// Publish/subscribe (ordo-dds, spindle §IV-F): `ordo dds pub --topic T`
    /// and `ordo dds sub --topic T`, one participant each, with the topics,
    /// QoS levels and members of the config's `[dds]`.
    #[command(subcommand)]
    Dds(dds::Dds),
    /// A local cluster of `ordo node` daemons (or `--kv` replicas): up,
    /// status, kill, restart, down.
    #[command(subcommand)]
    Cluster(node::Cluster),
    /// Cluster secrets: `ordo secret new FILE` writes a fresh random one
    /// (mode 600) for `security.secret_file` or `--secret-file`.
    #[command(subcommand)]
    Secret(SecretCmd),
    /// R3P2: R2P2 servers over UDP with Raft behind REPLICATED_ROUTE
    /// (serve, cluster, put, get).
    #[command(subcommand)]
    R3p2(r3p2::R3p2),
    /// Run the deterministic simulator: replay one seed, or check many.
    #[cfg(feature = "sim")]
    Sim(SimArgs),
    /// The remote member of a benchmark or a multi-process test.
    #[command(hide = true)]
    FabricPeer(PeerArgs),
    /// One Acuerdo member process (for the kill -9 tests).
    #[command(hide = true, disable_help_flag = true)]
    AcuerdoPeer {
        /// The peer's own flags (see `ordo_bench::acuerdo_peer`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum SecretCmd {
    /// Write a fresh random secret (64 hex characters) to a new file, mode
    /// 600; an existing file is never overwritten.
    New {
        /// The file to create.
        file: PathBuf,
    },
}

#[derive(Args, Clone)]
struct DemoArgs {
    /// Seconds of sending.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 10 * 1024)]
    size: usize,
    /// Members (processes).
    #[arg(long, default_value_t = 3)]
    members: u32,
    /// Slots per sender.
    #[arg(long, default_value_t = 100)]
    window: usize,
    /// Turn every Spindle optimization off (the paper's baseline).
    #[arg(long)]
    baseline: bool,
    /// Zero-copy: members read each sender's ring in the sender's own shm
    /// mapping; nothing but SST columns is written to peers
    /// (`vsync.switches.zero_copy`).
    #[arg(long)]
    zero_copy: bool,
    /// The fabric. `tcp` (and `ofi`: libfabric `tcp;ofi_rxm`, a build with
    /// `--features ofi`) runs the group as `ordo node` daemons (one
    /// process per member, authenticated links), like `--kill`.
    #[arg(long, value_enum, default_value = "shm")]
    fabric: node::FabricArg,
    /// SIGKILL the view leader halfway: the survivors change the view and
    /// go on, and the demo checks that they delivered the same messages.
    /// Runs the group as `ordo node` daemons, each sending --rate
    /// messages/s.
    #[arg(long)]
    kill: bool,
    /// Messages per second each daemon sends (with --kill or --fabric tcp).
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
}

#[derive(Args)]
struct DemoMemberArgs {
    #[command(flatten)]
    demo: DemoArgs,
    /// This member's id.
    #[arg(long)]
    id: u32,
    /// shm cluster name.
    #[arg(long)]
    cluster: String,
}

#[derive(Args)]
pub struct ConfigArgs {
    /// TOML configuration file (every key has a default).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Override a key, e.g. --set fabric.backend=tcp (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

#[derive(Args)]
struct MemberArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Heartbeat interval in milliseconds.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    for_s: Option<u64>,
}

#[cfg(feature = "sim")]
#[derive(Args)]
struct SimArgs {
    /// Workload to run (omit to list them).
    #[arg(long)]
    workload: Option<String>,
    /// Replay exactly this seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many fresh seeds (from --base-seed, default: the clock).
    #[arg(long)]
    seeds: Option<u64>,
    /// First seed of a --seeds batch.
    #[arg(long)]
    base_seed: Option<u64>,
    /// Turn the nemesis (partitions, crashes, restarts) off.
    #[arg(long)]
    no_faults: bool,
    /// Probability, in parts per million, that a reached fault point fires.
    #[arg(long, default_value_t = 20_000)]
    fault_point_ppm: u32,
    /// Probability, in parts per million, that a fabric write lands in two
    /// steps (lower part first: a reader sees it half-applied); default:
    /// the workload's own setting (whole writes).
    #[arg(long)]
    split_land_ppm: Option<u32>,
    /// Print the report of a single seed as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Bench {
    /// One-way latency and streaming bandwidth of each fabric backend, beside
    /// memcpy and a cross-process cache-line ping-pong measured in the same run.
    Fabric(FabricArgs),
    /// The Spindle paper's experiments (spindle §IV, Figs. 3-17) on the vsync
    /// engine: baseline and optimized side by side; CSV and PNG files under
    /// --out.
    Spindle(SpindleArgs),
    /// The Acuerdo paper's experiments (acuerdo §4: Fig. 8 latency vs
    /// throughput against vsync, Table 1 election duration).
    Acuerdo(ordo_bench::acuerdo_bench::BenchArgs),
    /// The r3p2 thesis' experiments (Figs. 5.1-5.2: p99 latency vs
    /// throughput over loopback UDP, replicated vs unreplicated, worker vs
    /// network thread, 1/3/5 members).
    R3p2(ordo_bench::r3p2_bench::BenchArgs),
    /// SIGKILL one `ordo node` of a vsync group, many times: kill → new
    /// view p50/p99 per group size and fabric, and a survivor's delivered
    /// throughput across a kill (CSV and PNG under --out).
    Failover(ordo_bench::failover::FailoverArgs),
    /// ordo-kv (3 replicas) beside a single redis-server, both driven by
    /// redis-benchmark (SET, GET, with and without -P 16), interleaved.
    Kv(ordo_bench::kv_bench::KvArgs),
    /// spindle Fig. 18: ordo-dds, one publisher to 1..N subscribers, every
    /// QoS level with Spindle on and off, beside Cyclone DDS's `ddsperf`.
    Dds(ordo_bench::dds_bench::DdsArgs),
}

#[derive(Args)]
struct SpindleArgs {
    /// Reduced run (under two minutes; groups of up to 4 members).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Figures to run, e.g. fig3,fig5 (default: all; `summary`: only the headline comparisons).
    #[arg(long, value_delimiter = ',')]
    figures: Vec<String>,
    /// Largest group (default: 4 with --quick, 8 otherwise).
    #[arg(long)]
    max_members: Option<u32>,
    /// Directory for the CSV files and PNG plots.
    #[arg(long, default_value = "bench-results/spindle")]
    out: PathBuf,
}

#[derive(Args)]
struct FabricArgs {
    /// Reduced run (under a minute).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Backends to measure (`tcp-nosecret`: tcp without the cluster
    /// secret, to show what authentication costs; `tcp-tls`: tcp over
    /// mutual TLS; `ofi`: libfabric on `tcp;ofi_rxm`, connected `tcp` and
    /// `shm`, or one of `ofi-tcp`, `ofi-tcp-msg`, `ofi-shm`, `ofi-verbs`,
    /// `ofi-verbs-msg`; needs a build with `--features ofi`).
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
    backend: Vec<BackendArg>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum BackendArg {
    Shm,
    Tcp,
    TcpNosecret,
    TcpTls,
    /// libfabric on `tcp;ofi_rxm` and on `shm` (bench fabric: both rows).
    Ofi,
    /// libfabric on `tcp;ofi_rxm`.
    OfiTcp,
    /// libfabric on `shm`.
    OfiShm,
    /// libfabric on `verbs;ofi_rxm` (InfiniBand, RoCE).
    OfiVerbs,
    /// libfabric connected endpoints on `tcp`.
    OfiTcpMsg,
    /// libfabric connected endpoints on `verbs` (RDMA reliable connections).
    OfiVerbsMsg,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum RoleArg {
    Serve,
    Idle,
    Cacheline,
    /// The reader of the cross-process copy ring (`bench fabric`'s limit).
    Copyring,
}

#[derive(Args)]
struct PeerArgs {
    #[arg(long, default_value = "shm")]
    backend: BackendArg,
    #[arg(long, default_value = "ordo")]
    cluster: String,
    #[arg(long)]
    role: RoleArg,
    /// Member 0's tcp listen address (tcp backend).
    #[arg(long)]
    tcp_peer: Option<std::net::SocketAddr>,
    /// TLS links: the directory of the benchmark's throwaway certificates.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Pin to this core.
    #[arg(long)]
    core: Option<usize>,
    /// Busy-spin while waiting (else spin, then park on the doorbell).
    #[arg(long)]
    spin: bool,
    /// Exit after this many seconds without a command.
    #[arg(long, default_value_t = 60)]
    idle_exit_s: u64,
    /// Shared file for the cache-line and copy-ring roles.
    #[arg(long)]
    path: Option<PathBuf>,
    /// Rounds for the cache-line role.
    #[arg(long, default_value_t = 0)]
    count: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's members exit one after another at the end, and each one
    // still running rightly suspects those gone: not worth a warning there.
    let default_filter = match cli.command {
        Command::Demo(_) | Command::DemoMember(_) => "error",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ORDO_LOG").unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Bench(Bench::Fabric(args)) => bench_fabric(args),
        Command::Bench(Bench::Spindle(args)) => bench_spindle(args),
        Command::Demo(args) if args.kill || args.fabric != node::FabricArg::Shm => {
            node::demo_views(&node::DemoViews {
                members: args.members,
                fabric: args.fabric,
                seconds: args.seconds,
                size: args.size,
                rate: args.rate,
                window: args.window,
                kill: args.kill,
            })
        }
        Command::Demo(args) => demo(args),
        Command::DemoMember(args) => demo_member(args),
        Command::Config(args) => load_config(&args).map(|c| print!("{}", c.to_toml_string())),
        Command::Member(args) => member(args),
        Command::Node(args) => node::node(args),
        Command::Cluster(cmd) => node::cluster(cmd),
        Command::Kv(cmd) => kv::main(cmd),
        Command::Dds(cmd) => dds::main(cmd),
        Command::Secret(SecretCmd::New { file }) => new_secret(&file),
        #[cfg(feature = "sim")]
        Command::Sim(args) => sim(args),
        Command::R3p2(cmd) => r3p2::main(cmd),
        Command::FabricPeer(args) => fabric_peer(args),
        Command::AcuerdoPeer { args } => ordo_bench::acuerdo_peer_main(&args),
        Command::Bench(Bench::Acuerdo(args)) => ordo_bench::experiment::run(&args, args.json),
        Command::Bench(Bench::R3p2(args)) => ordo_bench::experiment::run(&args, args.json),
        Command::Bench(Bench::Failover(args)) => {
            let json = args.json;
            std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}")).and_then(
                |exe| ordo_bench::experiment::run(&ordo_bench::failover::Failover::new(args, exe), json),
            )
        }
        Command::Bench(Bench::Dds(args)) => {
            let json = args.json;
            std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}")).and_then(
                |exe| ordo_bench::experiment::run(&ordo_bench::dds_bench::DdsBench::new(args, exe), json),
            )
        }
        Command::Bench(Bench::Kv(args)) => {
            let json = args.json;
            std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}")).and_then(
                |exe| ordo_bench::experiment::run(&ordo_bench::kv_bench::KvBench::new(args, exe), json),
            )
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ordo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bench_fabric(args: FabricArgs) -> Result<(), String> {
    use ordo_bench::fabric::{Backend, FabricBenchOptions};
    let exe = std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}"))?;
    let backends = args
        .backend
        .iter()
        .flat_map(|b| match b {
            BackendArg::Shm => vec![Backend::Shm],
            BackendArg::Tcp => vec![Backend::Tcp],
            BackendArg::TcpNosecret => vec![Backend::TcpNoSecret],
            BackendArg::TcpTls => vec![Backend::TcpTls],
            BackendArg::Ofi => vec![Backend::OfiTcp, Backend::OfiTcpMsg, Backend::OfiShm],
            BackendArg::OfiTcp => vec![Backend::OfiTcp],
            BackendArg::OfiShm => vec![Backend::OfiShm],
            BackendArg::OfiVerbs => vec![Backend::OfiVerbs],
            BackendArg::OfiTcpMsg => vec![Backend::OfiTcpMsg],
            BackendArg::OfiVerbsMsg => vec![Backend::OfiVerbsMsg],
        })
        .collect();
    let opts = FabricBenchOptions { exe, backends, quick: args.quick };
    ordo_bench::experiment::run(&opts, args.json)
}

fn bench_spindle(args: SpindleArgs) -> Result<(), String> {
    let opts = ordo_bench::spindle::SpindleOptions {
        quick: args.quick,
        figures: args.figures,
        max_members: args.max_members,
        out_dir: args.out,
    };
    ordo_bench::experiment::run(&opts, args.json)
}

fn fabric_peer(args: PeerArgs) -> Result<(), String> {
    use ordo_bench::peer::{self, PeerBackend, PeerOptions, Role};
    if args.role == RoleArg::Cacheline {
        if let Some(core) = args.core {
            core_pin(core);
        }
        let path = args.path.ok_or("--path is required for the cacheline role")?;
        return ordo_bench::fabric::cacheline_peer(&path, args.count);
    }
    if args.role == RoleArg::Copyring {
        if let Some(core) = args.core {
            core_pin(core);
        }
        let path = args.path.ok_or("--path is required for the copyring role")?;
        return ordo_bench::limits::copy_ring_peer(&path);
    }
    let backend = match args.backend {
        BackendArg::Shm => PeerBackend::Shm { cluster: args.cluster },
        BackendArg::Tcp | BackendArg::TcpNosecret | BackendArg::TcpTls => PeerBackend::Tcp {
            cluster: args.cluster,
            coordinator: args.tcp_peer.ok_or("--tcp-peer is required for the tcp backend")?,
            tls_dir: args.tls_dir,
        },
        BackendArg::Ofi
        | BackendArg::OfiTcp
        | BackendArg::OfiShm
        | BackendArg::OfiVerbs
        | BackendArg::OfiTcpMsg
        | BackendArg::OfiVerbsMsg => PeerBackend::Ofi {
            provider: match args.backend {
                BackendArg::OfiShm => "shm",
                BackendArg::OfiVerbs => "verbs;ofi_rxm",
                BackendArg::OfiTcpMsg => "tcp",
                BackendArg::OfiVerbsMsg => "verbs",
                _ => "tcp;ofi_rxm",
            }
            .into(),
            endpoint: match args.backend {
                BackendArg::OfiTcpMsg | BackendArg::OfiVerbsMsg => ordo_runtime::OfiEndpoint::Msg,
                _ => ordo_runtime::OfiEndpoint::Rdm,
            },
            cluster: args.cluster,
            coordinator: args.tcp_peer.ok_or("--tcp-peer is required for the ofi backends")?,
        },
    };
    peer::run(PeerOptions {
        backend,
        role: if args.role == RoleArg::Idle { Role::Idle } else { Role::Serve },
        core: args.core,
        spin: args.spin,
        idle_exit: Duration::from_secs(args.idle_exit_s),
    })
}

fn core_pin(core: usize) {
    ordo_bench::peer::pin(core);
}

fn load_config(args: &ConfigArgs) -> Result<ordo_runtime::OrdoConfig, String> {
    ordo_runtime::OrdoConfig::load(args.config.as_deref(), std::env::vars(), &args.sets)
        .map_err(|e| e.to_string())
}

fn new_secret(file: &std::path::Path) -> Result<(), String> {
    ordo_runtime::Secret::generate_file(file).map_err(|e| e.to_string())?;
    println!("wrote a new secret to {} (mode 600); give the same file to every member", file.display());
    Ok(())
}

fn member(args: MemberArgs) -> Result<(), String> {
    use ordo_runtime::{HeartbeatAgent, Runner, connect_fabric};
    let config = load_config(&args.config)?;
    eprintln!(
        "member {} of {:?}: connecting over {:?}...",
        config.member.id, config.group.members, config.fabric.backend
    );
    let fabric = connect_fabric(&config).map_err(|e| e.to_string())?;
    let agent = HeartbeatAgent::new(fabric, &config.group.members, args.heartbeat_ms.max(1) * 1_000_000)
        .map_err(|e| e.to_string())?;
    let runner = Runner::start(vec![agent], &config.runner_options()).map_err(|e| e.to_string())?;
    let start = std::time::Instant::now();
    let limit = args.for_s.map(Duration::from_secs);
    loop {
        std::thread::sleep(Duration::from_secs(1).min(limit.unwrap_or(Duration::MAX)));
        if limit.is_some_and(|l| start.elapsed() >= l) || runner.is_finished() {
            break;
        }
        eprintln!("  up {:>4} s", start.elapsed().as_secs());
    }
    let joined = runner.join();
    let agent = &joined.agents[0];
    println!("{:<8} {:>10} {:>10}", "member", "heartbeat", "state");
    for (m, beat, suspected) in agent.heartbeats() {
        println!("{m:<8} {beat:>10} {:>10}", if suspected { "suspected" } else { "alive" });
    }
    for (t, e) in &agent.log {
        println!("  at {:.3} s: {e:?}", *t as f64 / 1e9);
    }
    Ok(())
}

/// `ordo sim`: every workload goes through `ordo_simulation`'s one
/// registry (the same entries the tests run).
#[cfg(feature = "sim")]
fn sim(args: SimArgs) -> Result<(), String> {
    let Some(name) = args.workload else {
        println!("workloads:");
        for w in ordo_simulation::REGISTRY {
            println!("  {:<18} {}", w.name, w.summary);
        }
        return Ok(());
    };
    let workload = ordo_simulation::lookup(&name)?;
    let opts = ordo_sim::RunOptions {
        faults: !args.no_faults,
        fault_point_ppm: args.fault_point_ppm,
        split_land_ppm: args.split_land_ppm,
        ..ordo_sim::RunOptions::default()
    };
    if let Some(seed) = args.seed {
        let report = (workload.run)(seed, &opts)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
        } else {
            println!("{}", report.summary);
        }
        return Ok(());
    }
    let batch = ordo_sim::SeedBatch {
        count: args.seeds.unwrap_or(100),
        base: args.base_seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        }),
    };
    let start = std::time::Instant::now();
    let failures = ordo_simulation::run_batch(workload, &batch, 2, &opts);
    println!(
        "{name}: {} runs from base seed {}, {} passed, {} failed, in {:.1?}",
        batch.count,
        batch.base,
        batch.count - failures.len() as u64,
        failures.len(),
        start.elapsed()
    );
    for f in failures.iter().take(10) {
        println!("  {f}");
    }
    if failures.is_empty() { Ok(()) } else { Err(format!("{} seeds failed", failures.len())) }
}

fn demo_options(args: &DemoArgs, cluster: String) -> ordo_bench::demo::DemoOptions {
    ordo_bench::demo::DemoOptions {
        members: args.members,
        size: args.size.max(8),
        duration: Duration::from_secs(args.seconds.max(1)),
        cluster,
        window: args.window,
        switches: ordo_vsync::Switches {
            zero_copy: args.zero_copy,
            ..if args.baseline { ordo_vsync::Switches::BASELINE } else { ordo_vsync::Switches::SPINDLE }
        },
    }
}

fn demo_member(args: DemoMemberArgs) -> Result<(), String> {
    let opts = demo_options(&args.demo, args.cluster);
    let report = ordo_bench::demo::run_member(&opts, args.id, |_, _| {})?;
    println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    Ok(())
}

fn demo(args: DemoArgs) -> Result<(), String> {
    use ordo_bench::demo::MemberReport;
    use std::io::BufRead;
    if args.members < 2 {
        return Err("a demo group needs at least 2 members".into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}"))?;
    let cluster = format!("demo-{}", std::process::id());
    let opts = demo_options(&args, cluster.clone());
    eprintln!(
        "ordo demo: {} member processes on the shm fabric, every member sending {} B messages for {} s ({})",
        args.members,
        opts.size,
        args.seconds,
        match (args.baseline, args.zero_copy) {
            (true, false) => "baseline: Spindle off",
            (true, true) => "baseline: Spindle off, zero-copy",
            (false, false) => "Spindle optimizations on",
            (false, true) => "Spindle optimizations on, zero-copy",
        }
    );
    // The cross-core limit of this size, measured now (two processes, one
    // copying into a shared ring, the other reading every byte).
    let limit = ordo_bench::limits::copy_ring_pinned(
        &exe,
        opts.size.next_multiple_of(8).max(8),
        16,
        Duration::from_millis(300),
    )?;
    let mut children = Vec::new();
    for id in 1..args.members {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["demo-member", "--id", &id.to_string(), "--cluster", &cluster])
            .args(["--seconds", &args.seconds.to_string(), "--size", &opts.size.to_string()])
            .args(["--members", &args.members.to_string(), "--window", &args.window.to_string()]);
        if args.baseline {
            cmd.arg("--baseline");
        }
        if args.zero_copy {
            cmd.arg("--zero-copy");
        }
        cmd.stdout(std::process::Stdio::piped());
        children.push(cmd.spawn().map_err(|e| format!("spawning member {id}: {e}"))?);
    }
    let bar = indicatif::ProgressBar::new(args.seconds * 10);
    bar.set_style(
        indicatif::ProgressStyle::with_template("  [{bar:40}] {elapsed_precise} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let mine = ordo_bench::demo::run_member(&opts, 0, |bytes, secs| {
        bar.set_position((secs * 10.0) as u64);
        bar.set_message(format!(
            "member 0 delivered {:.2} GB ({:.2} GB/s)",
            bytes as f64 / 1e9,
            bytes as f64 / 1e9 / secs
        ));
    });
    bar.finish_and_clear();
    let mut reports = vec![mine?];
    for (i, mut child) in children.into_iter().enumerate() {
        let out = child.stdout.take().ok_or("piped")?;
        let line = std::io::BufReader::new(out).lines().next().transpose().map_err(|e| e.to_string())?;
        let status = child.wait().map_err(|e| e.to_string())?;
        let line = line.ok_or_else(|| format!("member {} reported nothing ({status})", i + 1))?;
        reports
            .push(serde_json::from_str::<MemberReport>(&line).map_err(|e| format!("member {}: {e}", i + 1))?);
    }
    println!(
        "{:<7} {:>10} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9} {:>8} {:>10}",
        "member",
        "GB/s",
        "msgs/s",
        "p50 latency",
        "p99 latency",
        "send b.",
        "recv b.",
        "deliv b.",
        "nulls",
        "vs ring"
    );
    for r in &reports {
        println!(
            "{:<7} {:>10.3} {:>12.0} {:>9.1} us {:>9.1} us {:>9.2} {:>9.2} {:>9.2} {:>8} {:>9.1}%",
            r.member,
            r.bytes_per_s() / 1e9,
            r.messages_per_s(),
            r.latency_ns_p50 as f64 / 1e3,
            r.latency_ns_p99 as f64 / 1e3,
            r.send_batch_mean,
            r.receive_batch_mean,
            r.delivery_batch_mean,
            r.nulls_sent,
            100.0 * r.bytes_per_s() / limit
        );
    }
    let sent: u64 = reports.iter().map(|r| r.sent_messages).sum();
    let all_equal = reports.iter().all(|r| r.delivered_total == sent);
    // The same group in one process on two runner threads (the spindle
    // benchmark's setup), measured now: what the processes lose to each
    // other's scheduling.
    let point = ordo_bench::spindle::Point {
        window: opts.window,
        ..ordo_bench::spindle::Point::simple(
            args.members,
            ordo_bench::spindle::Pattern::All,
            opts.size,
            opts.switches,
        )
    };
    let plan =
        ordo_bench::spindle::Plan { warmup: Duration::from_millis(200), duration: Duration::from_secs(1) };
    let shared = ordo_bench::spindle::run_point(&point, plan, &format!("{cluster}-inproc"))?;
    let mean = reports.iter().map(|r| r.bytes_per_s()).sum::<f64>() / reports.len() as f64;
    println!(
        "vs ring: of the cross-process copy ring of {} B messages measured in this run ({:.2} GB/s: one process \
         copies into a shared ring, another reads every byte)",
        opts.size,
        limit / 1e9
    );
    println!(
        "the same group in one process on two runner threads, measured now: {:.3} GB/s per member; the {} \
         processes reach {:.0} % of it (core share in process {:.2})",
        shared.throughput_bytes_per_s / 1e9,
        args.members,
        100.0 * mean / shared.throughput_bytes_per_s.max(1.0),
        shared.load().core_share()
    );
    let zero_copy = reports.iter().filter(|r| r.zero_copy).count();
    println!(
        "rings read in place (zero-copy) at {zero_copy} of {} members; copied to every receiver at the others",
        reports.len()
    );
    println!(
        "messages sent {}, delivered at every member: {}",
        sent,
        if all_equal {
            "all".to_string()
        } else {
            format!("{:?}", reports.iter().map(|r| r.delivered_total).collect::<Vec<_>>())
        }
    );
    if !all_equal {
        return Err("not every member delivered every message".into());
    }
    Ok(())
}
