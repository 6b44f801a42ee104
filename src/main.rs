//! `ordo`: the command-line front end.
//!
//! - `ordo bench fabric` — fabric latency and bandwidth beside the machine's
//!   physical limits (see `ordo_bench::fabric`).
//! - `ordo fabric-peer` — the remote member that benchmarks and the
//!   multi-process tests spawn (hidden from help).

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
    /// Run a benchmark and report its figures.
    #[command(subcommand)]
    Bench(Bench),
    /// The remote member of a benchmark or a multi-process test.
    #[command(hide = true)]
    FabricPeer(PeerArgs),
}

#[derive(Subcommand)]
enum Bench {
    /// One-way latency and streaming bandwidth of each fabric backend, beside
    /// memcpy and a cross-process cache-line ping-pong measured in the same run.
    Fabric(FabricArgs),
}

#[derive(Args)]
struct FabricArgs {
    /// Reduced run (under a minute).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Backends to measure.
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
    backend: Vec<BackendArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Shm,
    Tcp,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum RoleArg {
    Serve,
    Idle,
    Cacheline,
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
    /// Pin to this core.
    #[arg(long)]
    core: Option<usize>,
    /// Busy-spin while waiting (else spin, then park on the doorbell).
    #[arg(long)]
    spin: bool,
    /// Exit after this many seconds without a command.
    #[arg(long, default_value_t = 60)]
    idle_exit_s: u64,
    /// Shared file for the cache-line role.
    #[arg(long)]
    path: Option<PathBuf>,
    /// Rounds for the cache-line role.
    #[arg(long, default_value_t = 0)]
    count: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ORDO_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(Bench::Fabric(args)) => bench_fabric(args),
        Command::FabricPeer(args) => fabric_peer(args),
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
    use ordo_bench::fabric::{self, Backend, FabricBenchOptions};
    let exe = std::env::current_exe().map_err(|e| format!("locating the ordo executable: {e}"))?;
    let backends = args
        .backend
        .iter()
        .map(|b| match b {
            BackendArg::Shm => Backend::Shm,
            BackendArg::Tcp => Backend::Tcp,
        })
        .collect();
    let opts = FabricBenchOptions { exe, backends, quick: args.quick };
    let json = args.json;
    let report = fabric::run(&opts, |line| {
        if !json {
            eprintln!("  {line}");
        }
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        fabric::print_table(&report);
    }
    Ok(())
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
    let backend = match args.backend {
        BackendArg::Shm => PeerBackend::Shm { cluster: args.cluster },
        BackendArg::Tcp => PeerBackend::Tcp {
            cluster: args.cluster,
            coordinator: args.tcp_peer.ok_or("--tcp-peer is required for the tcp backend")?,
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
