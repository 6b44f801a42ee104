//! `ordo bench r3p2`: the r3p2 thesis' Ch. 5 experiments with real
//! processes on loopback UDP.
//!
//! - **Fig. 5.1** — p99 latency vs achieved throughput under an open-loop
//!   client: the unreplicated baseline (one `ordo r3p2 serve --unreplicated`
//!   process, FIXED_ROUTE) vs a replicated group of 3 (`REPLICATED_ROUTE`,
//!   Raft inside the transport), for 1 µs and 10 µs synthetic handlers
//!   (`--service spin:<us>`), handlers on a worker thread (`--workers 1`)
//!   vs on the network thread (`--workers 0`).
//! - **Fig. 5.2** — the replicated group with 1, 3 and 5 members (handler
//!   `--fig52-handler-us`, workers mode).
//!
//! # How a curve is measured
//! Every configuration gets fresh server processes (`ordo r3p2 serve` from
//! this very binary, on free loopback ports, the log in memory unless
//! `--fsync`); a blocking call through the client must succeed (a leader is
//! elected) before anything is measured. The load generator runs in this
//! process: `--clients` threads, each with its own [`Client`] (its own
//! client id), send at `offered / clients` requests per second with Poisson
//! (or fixed-interval) arrivals. Latency is measured from each request's
//! *intended* send time, so a generator that falls behind does not hide
//! queueing (no coordinated omission). A point is a warm-up, a measurement
//! window and a drain (the load continues while the window's requests are
//! answered or time out); a timed-out request is recorded at its (lower
//! bound) latency and counted as an error. A generator thread with nothing
//! due yields the CPU (`--client-idle yield`; `sleep:<us>` and `spin` are
//! the alternatives): it stays runnable, so it reads answers at once, but a
//! woken server thread preempts it. The offered load grows
//! geometrically until a point does not keep up; then the boundaries below
//! are refined by bisection (geometric midpoints) on the same processes.
//! Fig. 5.1 runs the unreplicated and the replicated configuration of each
//! handler time and mode side by side and measures them in turn at each
//! offered rate, so the two see the same background load of a shared
//! machine; every point also records the servers' and the client's CPU
//! use, the kernel's UDP receive-buffer drops and the load average.
//!
//! # Definitions (the summary figures)
//! - A point **keeps up** when its achieved rate (answers received in the
//!   window / window) is ≥ 95 % of its arrival rate (requests intended in
//!   the window / window) and ≤ 0.1 % of its requests failed.
//! - **Peak throughput**: the highest achieved rate among points that keep
//!   up with p99 ≤ `--peak-p99-us` (default 10 ms: on a shared 2-vCPU VM
//!   the p99 of a point well below saturation is already several ms,
//!   while a point past it queues for the whole window, 100+ ms).
//! - **Max sustained throughput**: the same with no bound on p99 (the
//!   replicated group can keep up with rates far beyond the point where its
//!   p99 leaves the 10 ms bound).
//! - **Throughput at the SLO**: the same with p99 ≤ `--slo-us` (default
//!   200 µs; further SLOs with `--extra-slo-us` are read off the measured
//!   points without refinement).
//! - **p99 overhead at equal load**: replicated p99 − unreplicated p99 at
//!   the same offered rate of the common geometric grid (light load: the
//!   lowest grid rate; moderate load: the highest grid rate both keep up at
//!   that is ≤ half the replicated peak).
//!
//! # Invariants
//! - Every figure comes from this invocation; server processes are killed
//!   when their configuration is done (and die with this process:
//!   `PR_SET_PDEATHSIG`).
//! - Nothing is pinned; the machine's CPU count is recorded, since the
//!   client and every server thread share it.

use crate::machine::MachineInfo;
use crate::plot::{Panel, Series, write_png};
use clap::Parser;
use hdrhistogram::Histogram;
use ordo_r2p2::{CallError, Client, ClientConfig, Policy};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `ordo bench r3p2`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "ordo bench r3p2",
    about = "r3p2 thesis Figs. 5.1-5.2: p99 latency vs throughput over loopback UDP"
)]
pub struct BenchArgs {
    /// Reduced run (under two minutes).
    #[arg(long)]
    pub quick: bool,
    /// Servers' idle spins and yields before parking (`ordo r3p2 serve
    /// --idle-spins/--idle-yields`), e.g. `0,0` when threads outnumber cores.
    #[arg(long, default_value = "200,50")]
    pub server_idle: String,
    /// Print the report (machine, rows, summary) as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Experiments: fig5.1, fig5.2 (default: both); `fsync` alone runs only
    /// the durable series (with `--fsync`).
    #[arg(long, value_delimiter = ',')]
    pub figures: Vec<String>,
    /// Also run the replicated group with a durable, fsynced log (an extra
    /// series in Fig. 5.1; the thesis' log was in memory).
    #[arg(long)]
    pub fsync: bool,
    /// The p99 SLO for "throughput at the SLO", µs.
    #[arg(long, default_value_t = 200)]
    pub slo_us: u64,
    /// Further SLOs reported from the measured points, µs.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    pub extra_slo_us: Vec<u64>,
    /// The p99 bound of "peak throughput", µs (a point past saturation
    /// queues for the whole window and its p99 grows far beyond this).
    #[arg(long, default_value_t = 10_000)]
    pub peak_p99_us: u64,
    /// Handler time of Fig. 5.2, µs.
    #[arg(long, default_value_t = 1)]
    pub fig52_handler_us: u64,
    /// Load-generator threads (one client each).
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Arrivals: poisson or fixed.
    #[arg(long, default_value = "poisson")]
    pub arrivals: String,
    /// First offered rate, requests/s (default 500 with --quick, 250 otherwise).
    #[arg(long)]
    pub start_rps: Option<f64>,
    /// Growth factor of the offered rate (default 2 with --quick, 1.41 otherwise).
    #[arg(long)]
    pub step: Option<f64>,
    /// Highest offered rate tried, requests/s.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub max_rps: f64,
    /// Measurement window per point, ms (default 400 with --quick, 1500 otherwise).
    #[arg(long)]
    pub point_ms: Option<u64>,
    /// Warm-up per point, ms (default 100 with --quick, 400 otherwise).
    #[arg(long)]
    pub warmup_ms: Option<u64>,
    /// Bisection steps per boundary (default 1 with --quick, 3 otherwise).
    #[arg(long)]
    pub refine: Option<u32>,
    /// What a generator thread does when idle: spin, yield or sleep:<us>
    /// (sleep at most that long at a time).
    #[arg(long, default_value = "yield")]
    pub client_idle: String,
    /// Client timeout (a request unanswered this long is an error), ms.
    #[arg(long, default_value_t = 200)]
    pub timeout_ms: u64,
    /// Directory for CSV, JSON and PNG files.
    #[arg(long, default_value = "bench-results/r3p2")]
    pub out: PathBuf,
}

/// One server configuration (one curve).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Config {
    /// `FIXED_ROUTE` (unreplicated baseline) or `REPLICATED_ROUTE`.
    pub policy: String,
    /// Server processes.
    pub members: usize,
    /// Synthetic handler time, µs.
    pub handler_us: u64,
    /// `workers` (1 worker thread) or `network` (handlers on the network thread).
    pub mode: String,
    /// fsync before acknowledging (replicated only).
    pub fsync: bool,
}

impl Config {
    fn new(replicated: bool, members: usize, handler_us: u64, workers: bool, fsync: bool) -> Config {
        Config {
            policy: if replicated { "REPLICATED_ROUTE" } else { "FIXED_ROUTE" }.into(),
            members,
            handler_us,
            mode: if workers { "workers" } else { "network" }.into(),
            fsync,
        }
    }

    fn replicated(&self) -> bool {
        self.policy == "REPLICATED_ROUTE"
    }

    /// Short series name, e.g. `repl3-workers` or `unrepl-network`.
    pub fn label(&self) -> String {
        let base = if self.replicated() { format!("repl{}", self.members) } else { "unrepl".to_string() };
        format!("{base}-{}{}", self.mode, if self.fsync { "-fsync" } else { "" })
    }
}

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// `fig5.1` or `fig5.2`.
    pub figure: String,
    /// Series name ([`Config::label`]).
    pub series: String,
    /// `FIXED_ROUTE` or `REPLICATED_ROUTE`.
    pub policy: String,
    /// Server processes.
    pub members: usize,
    /// Handler time, µs.
    pub handler_us: u64,
    /// `workers` or `network`.
    pub mode: String,
    /// Durable (fsynced) log.
    pub fsync: bool,
    /// Nominal offered rate, requests/s.
    pub offered_rps: f64,
    /// Requests intended in the window / window.
    pub arrival_rps: f64,
    /// Requests actually sent in the window / window (below arrival_rps
    /// when the generator fell behind).
    pub sent_rps: f64,
    /// Successful answers received in the window / window.
    pub achieved_rps: f64,
    /// Requests intended in the window.
    pub requests: u64,
    /// Of those, failed (timeout, refused, not sent).
    pub errors: u64,
    /// Latency from the intended send time, ns.
    pub latency_ns_p50: u64,
    /// p90, ns.
    pub latency_ns_p90: u64,
    /// p99, ns.
    pub latency_ns_p99: u64,
    /// p99.9, ns.
    pub latency_ns_p999: u64,
    /// Whether the point keeps up (see the module docs).
    pub keeps_up: bool,
    /// Measured during a bisection (not on the geometric grid).
    pub refined: bool,
    /// CPU used by all server processes during the point (warm-up, window
    /// and drain), % of one CPU.
    pub server_cpu_percent: f64,
    /// CPU used by this process (the load generator) during the point, %
    /// of one CPU.
    pub client_cpu_percent: f64,
    /// UDP datagrams the kernel dropped during the point (receive buffer
    /// full, machine-wide `RcvbufErrors` of /proc/net/snmp).
    pub udp_rcvbuf_drops: u64,
    /// The machine's 1-minute load average after the point (other work on
    /// this shared machine shows here).
    pub loadavg_1m: f64,
}

/// Summary figures of one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigSummary {
    /// Figure.
    pub figure: String,
    /// Series name.
    pub series: String,
    /// The configuration.
    pub config: Config,
    /// Peak throughput (see the module docs), requests/s.
    pub peak_rps: Option<f64>,
    /// Highest achieved rate of a point that keeps up, whatever its p99.
    pub max_sustained_rps: Option<f64>,
    /// Throughput at each SLO: (SLO µs, requests/s).
    pub at_slo_rps: Vec<(u64, Option<f64>)>,
    /// p50 and p99 at the lowest offered rate, ns.
    pub light_latency_ns_p50: Option<u64>,
    /// p99 at the lowest offered rate, ns.
    pub light_latency_ns_p99: Option<u64>,
}

/// Replicated (3) vs unreplicated, one handler time and mode.
#[derive(Clone, Debug, Serialize)]
pub struct ReplicationCost {
    /// Handler, µs.
    pub handler_us: u64,
    /// `workers` or `network`.
    pub mode: String,
    /// Peak throughput, unreplicated.
    pub unreplicated_peak_rps: Option<f64>,
    /// Peak throughput, replicated (3).
    pub replicated_peak_rps: Option<f64>,
    /// 1 − replicated/unreplicated, %.
    pub peak_loss_percent: Option<f64>,
    /// Highest sustained rate (any p99), unreplicated.
    pub unreplicated_max_sustained_rps: Option<f64>,
    /// Highest sustained rate (any p99), replicated (3).
    pub replicated_max_sustained_rps: Option<f64>,
    /// 1 − replicated/unreplicated of those, %.
    pub max_sustained_loss_percent: Option<f64>,
    /// The light-load offered rate compared.
    pub light_offered_rps: Option<f64>,
    /// Replicated − unreplicated p99 there, µs.
    pub light_p99_overhead_us: Option<f64>,
    /// The moderate-load offered rate compared.
    pub moderate_offered_rps: Option<f64>,
    /// Replicated − unreplicated p99 there, µs.
    pub moderate_p99_overhead_us: Option<f64>,
    /// Replicated − unreplicated p50 there, µs.
    pub moderate_p50_overhead_us: Option<f64>,
}

/// Workers vs network thread, one handler time and policy.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerGain {
    /// Handler, µs.
    pub handler_us: u64,
    /// Policy.
    pub policy: String,
    /// SLO, µs.
    pub slo_us: u64,
    /// Throughput at the SLO with a worker thread.
    pub workers_rps: Option<f64>,
    /// Throughput at the SLO with handlers on the network thread.
    pub network_rps: Option<f64>,
    /// workers / network.
    pub ratio: Option<f64>,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: MachineInfo,
    /// Whether `--quick`.
    pub quick: bool,
    /// Arrival process.
    pub arrivals: String,
    /// What a generator thread does when idle (`--client-idle`).
    pub client_idle: String,
    /// Load-generator threads.
    pub clients: usize,
    /// Measurement window per point, ms.
    pub point_ms: u64,
    /// The SLO, µs.
    pub slo_us: u64,
    /// The p99 bound of peak throughput, µs.
    pub peak_p99_us: u64,
    /// Every point.
    pub rows: Vec<Row>,
    /// Per configuration.
    pub configs: Vec<ConfigSummary>,
    /// Fig. 5.1: replication's cost.
    pub replication_cost: Vec<ReplicationCost>,
    /// Fig. 5.1: worker threads' gain at each SLO.
    pub worker_gain: Vec<WorkerGain>,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Where the files went.
    pub out_dir: String,
}

/// Entry point of `ordo bench r3p2` (`args` without program/subcommand).
pub fn main(args: &[String]) -> Result<(), String> {
    let Some(args) = crate::parse_bench_args::<BenchArgs>("ordo bench r3p2", args)? else { return Ok(()) };
    let report = run(&args, |line| eprintln!("{line}"))?;
    crate::print_report(&report, args.json, print_table)
}

// ---------------------------------------------------------------------------
// Server processes

/// The server processes of one configuration; killed on drop.
struct Cluster {
    children: Vec<(Child, ChildStdout)>,
    servers: Vec<SocketAddr>,
    data: Option<PathBuf>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(d) = &self.data {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn free_ports(n: usize) -> Result<Vec<SocketAddr>, String> {
    let sockets: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot find a free UDP port: {e}"))?;
    sockets.iter().map(|s| s.local_addr().map_err(|e| e.to_string())).collect()
}

impl Cluster {
    fn start(config: &Config, tag: &str) -> Result<Cluster, String> {
        // This very binary: /proc/self/exe still names it when a rebuild
        // replaces the file on disk during a long run.
        let exe = match Path::new("/proc/self/exe") {
            p if p.exists() => p.to_path_buf(),
            _ => std::env::current_exe().map_err(|e| format!("cannot find the ordo binary: {e}"))?,
        };
        let servers = free_ports(config.members)?;
        let idle = SERVER_IDLE.get().cloned().unwrap_or_else(|| ("200".into(), "50".into()));
        let peers: Vec<String> = servers.iter().map(|s| s.to_string()).collect();
        let data = config
            .fsync
            .then(|| std::env::temp_dir().join(format!("ordo-bench-r3p2-{}-{tag}", std::process::id())));
        let mut cluster = Cluster { children: Vec::new(), servers: servers.clone(), data: data.clone() };
        for id in 0..config.members {
            let mut command = Command::new(&exe);
            // SAFETY: prctl is async-signal-safe; nothing else runs between
            // fork and exec.
            unsafe {
                use std::os::unix::process::CommandExt;
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            command
                .args(["r3p2", "serve", "--id", &id.to_string(), "--peers", &peers.join(",")])
                .args(["--service", &format!("spin:{}", config.handler_us)])
                .args(["--workers", if config.mode == "workers" { "1" } else { "0" }])
                .args(["--idle-spins", &idle.0, "--idle-yields", &idle.1])
                .env("ORDO_LOG", "error")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            if !config.replicated() {
                command.arg("--unreplicated");
            }
            match &data {
                Some(d) => {
                    command.arg("--data").arg(d.join(id.to_string()));
                }
                None => {
                    command.arg("--no-fsync");
                }
            }
            let mut child = command.spawn().map_err(|e| format!("cannot start server {id}: {e}"))?;
            let mut stdout = child.stdout.take().expect("piped");
            let mut line = String::new();
            {
                let mut reader = BufReader::new(&mut stdout);
                let _ = reader.read_line(&mut line);
            }
            cluster.children.push((child, stdout));
            if !line.starts_with("ready") {
                return Err(format!("server {id} did not start (said {line:?})"));
            }
        }
        Ok(cluster)
    }
}

// ---------------------------------------------------------------------------
// The open-loop generator

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrivals {
    Poisson,
    Fixed,
}

/// What a generator thread does when nothing is due and no answer is
/// waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientIdle {
    /// Spin (one core per generator thread).
    Spin,
    /// `sched_yield` (stays runnable).
    Yield,
    /// Sleep until the next send, at most this long at a time (answers
    /// are read up to this late), with a 1 µs timer slack; gaps over 2 ms
    /// park in the client's poll (which an answer wakes).
    Sleep(Duration),
}

impl std::str::FromStr for ClientIdle {
    type Err = String;

    fn from_str(s: &str) -> Result<ClientIdle, String> {
        match s {
            "spin" => Ok(ClientIdle::Spin),
            "yield" => Ok(ClientIdle::Yield),
            _ => s
                .strip_prefix("sleep:")
                .and_then(|us| us.parse::<u64>().ok())
                .map(|us| ClientIdle::Sleep(Duration::from_micros(us.max(1))))
                .ok_or_else(|| format!("--client-idle: `{s}` is not spin, yield or sleep:<us>")),
        }
    }
}

fn idle_until(client: &mut Client, idle: ClientIdle, now_ns: u64, next_ns: u64) {
    match idle {
        ClientIdle::Spin => std::hint::spin_loop(),
        ClientIdle::Yield => std::thread::yield_now(),
        ClientIdle::Sleep(max) => {
            let gap = Duration::from_nanos(next_ns.saturating_sub(now_ns));
            if gap > Duration::from_millis(2) {
                // epoll rounds its timeout up to whole ms: stay 1 ms short.
                client.wait(gap - Duration::from_millis(1));
            } else {
                std::thread::sleep(gap.min(max));
            }
        }
    }
}

/// Timing of one point.
#[derive(Clone, Copy, Debug)]
struct Timing {
    warmup: Duration,
    window: Duration,
    timeout: Duration,
    idle: ClientIdle,
}

/// splitmix64: the arrival process' randomness (no I/O, seeded per thread).
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // (0, 1]: never ln(0).
        ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// What one generator thread measured.
struct Tally {
    latency: Histogram<u64>,
    requests: u64,
    errors: u64,
    sent: u64,
    achieved: u64,
}

/// Runs one generator thread for one point: warm-up, window, drain (load
/// continues), then waits (without sending) for everything in flight.
fn generate(
    client: &mut Client,
    policy: Policy,
    rate: f64,
    arrivals: Arrivals,
    timing: Timing,
    seed: u64,
) -> Tally {
    if matches!(timing.idle, ClientIdle::Sleep(_)) {
        // SAFETY: prctl with PR_SET_TIMERSLACK only sets this thread's timer
        // slack (default 50 µs) so short sleeps end on time.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64) };
    }
    let mut rng = Rng(seed);
    let mut gap_ns = || match arrivals {
        Arrivals::Fixed => 1e9 / rate,
        Arrivals::Poisson => -rng.next_f64().ln() * 1e9 / rate,
    };
    let base = Instant::now();
    let ns = || base.elapsed().as_nanos() as u64;
    let window_start = timing.warmup.as_nanos() as u64;
    let window_end = window_start + timing.window.as_nanos() as u64;
    // The drain ends when every window request is answered, or after the
    // timeout (plus slack) at the latest.
    let drain_limit = window_end + timing.timeout.as_nanos() as u64 + 50_000_000;
    let mut tally = Tally {
        latency: Histogram::new(3).expect("histogram"),
        requests: 0,
        errors: 0,
        sent: 0,
        achieved: 0,
    };
    let mut intended: HashMap<u32, u64> = HashMap::with_capacity(1 << 16);
    let mut window_open = 0u64; // window requests not yet completed
    let mut next = gap_ns() * 0.5;
    let payload = seed.to_le_bytes();
    let in_window = |t: u64| t >= window_start && t < window_end;
    loop {
        let now = ns();
        if now >= window_end && (window_open == 0 || now >= drain_limit) {
            break;
        }
        let mut work = 0;
        // Send everything due (bounded per turn so answers are read too).
        while (next as u64) <= now && work < 64 {
            let t = next as u64;
            next += gap_ns();
            work += 1;
            if in_window(t) {
                tally.requests += 1;
            }
            match client.send(policy, &payload) {
                Ok(id) => {
                    intended.insert(id, t);
                    if in_window(t) {
                        tally.sent += 1;
                        window_open += 1;
                    }
                }
                Err(_) => {
                    if in_window(t) {
                        tally.errors += 1;
                    }
                }
            }
        }
        client.poll_responses();
        while let Some((id, result)) = client.try_recv() {
            work += 1;
            let done = ns();
            let ok = result.is_ok();
            if ok && in_window(done) {
                tally.achieved += 1;
            }
            let Some(t) = intended.remove(&id) else { continue };
            if in_window(t) {
                window_open -= 1;
                let _ = tally.latency.record(done.saturating_sub(t).max(1));
                if !ok {
                    tally.errors += 1;
                }
            }
        }
        if work == 0 {
            idle_until(client, timing.idle, now, next as u64);
        }
    }
    // Window requests still open at the drain limit count as failed, at
    // their latency so far.
    let end = ns();
    for t in intended.values().copied().filter(|t| in_window(*t)) {
        tally.errors += 1;
        let _ = tally.latency.record(end.saturating_sub(t).max(1));
    }
    // Quiesce: no new load; let what is in flight finish (or time out).
    let quiet_limit = Instant::now() + timing.timeout + Duration::from_millis(50);
    while client.in_flight() > 0 && Instant::now() < quiet_limit {
        client.wait(Duration::from_millis(5));
        while client.try_recv().is_some() {}
    }
    tally
}

fn new_client(servers: &[SocketAddr], id: u64, timeout: Duration) -> Result<Client, String> {
    let mut c = ClientConfig::new(servers.to_vec());
    c.client_id = Some(id);
    c.timeout = timeout;
    c.retries = 0;
    c.max_in_flight = 1 << 16;
    Client::new(c).map_err(|e| format!("client: {e}"))
}

/// Blocks until a request goes through (a leader is elected and known to
/// every client).
fn wait_ready(clients: &mut [Client], policy: Policy) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    for c in clients {
        loop {
            match c.call(policy, b"warm-up!") {
                Ok(_) => break,
                Err(
                    e @ (CallError::Timeout { .. } | CallError::Refused { .. } | CallError::RedirectLoop(_)),
                ) if Instant::now() < deadline => {
                    tracing::debug!("waiting for the servers: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(format!("the servers do not answer: {e}")),
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Sweep<'a> {
    args: &'a BenchArgs,
    timing: Timing,
    arrivals: Arrivals,
    start_rps: f64,
    step: f64,
    refine: u32,
}

fn point(clients: &mut [Client], policy: Policy, offered: f64, sweep: &Sweep<'_>, seed: u64) -> (Tally, f64) {
    let k = clients.len();
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                let (timing, arrivals) = (sweep.timing, sweep.arrivals);
                s.spawn(move || generate(c, policy, offered / k as f64, arrivals, timing, seed + i as u64))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("generator thread")).collect()
    });
    let mut total = Tally {
        latency: Histogram::new(3).expect("histogram"),
        requests: 0,
        errors: 0,
        sent: 0,
        achieved: 0,
    };
    for t in tallies {
        let _ = total.latency.add(&t.latency);
        total.requests += t.requests;
        total.errors += t.errors;
        total.sent += t.sent;
        total.achieved += t.achieved;
    }
    (total, sweep.timing.window.as_secs_f64())
}

fn row_of(figure: &str, config: &Config, offered: f64, tally: &Tally, secs: f64, refined: bool) -> Row {
    let h = &tally.latency;
    let q = |p: f64| if h.is_empty() { 0 } else { h.value_at_quantile(p) };
    let arrival_rps = tally.requests as f64 / secs;
    let achieved_rps = tally.achieved as f64 / secs;
    let keeps_up = achieved_rps >= 0.95 * arrival_rps && tally.errors * 1000 <= tally.requests;
    Row {
        figure: figure.into(),
        series: config.label(),
        policy: config.policy.clone(),
        members: config.members,
        handler_us: config.handler_us,
        mode: config.mode.clone(),
        fsync: config.fsync,
        offered_rps: offered,
        arrival_rps,
        sent_rps: tally.sent as f64 / secs,
        achieved_rps,
        requests: tally.requests,
        errors: tally.errors,
        latency_ns_p50: q(0.5),
        latency_ns_p90: q(0.9),
        latency_ns_p99: q(0.99),
        latency_ns_p999: q(0.999),
        keeps_up,
        refined,
        server_cpu_percent: 0.0,
        client_cpu_percent: 0.0,
        udp_rcvbuf_drops: 0,
        loadavg_1m: loadavg_1m(),
    }
}

/// The machine's UDP `RcvbufErrors` counter (0 when unreadable).
fn udp_rcvbuf_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of a process, seconds (0 when unreadable).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command (which may contain spaces) end with ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ')'.
    (ticks(11) + ticks(12)) as f64 / hz
}

fn loadavg_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

fn ok_under(r: &Row, p99_bound_us: u64) -> bool {
    r.keeps_up && r.latency_ns_p99 <= p99_bound_us * 1000
}

/// One configuration being measured: its processes, clients and points.
struct Live<'a> {
    config: &'a Config,
    cluster: Cluster,
    clients: Vec<Client>,
    policy: Policy,
    sweep: Sweep<'a>,
    rows: Vec<Row>,
    seed: u64,
    done: bool,
}

impl<'a> Live<'a> {
    fn start(
        config: &'a Config,
        sweep: &Sweep<'a>,
        tag: &str,
        progress: &mut impl FnMut(&str),
    ) -> Result<Live<'a>, String> {
        // A free port found by binding port 0 can be taken before the
        // server binds it: try again on fresh ports.
        let mut attempt = 0;
        let cluster = loop {
            match Cluster::start(config, &format!("{tag}-{attempt}")) {
                Ok(c) => break c,
                Err(e) if attempt < 2 => {
                    progress(&format!("  retrying on other ports: {e}"));
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        let policy = if config.replicated() { Policy::ReplicatedRoute } else { Policy::FixedRoute };
        // An fsync on this machine's disk can take longer than the timeout
        // meant for the in-memory log; a durable curve gets ten times as long.
        let mut timing = sweep.timing;
        if config.fsync {
            timing.timeout *= 10;
        }
        let sweep = Sweep { timing, ..*sweep };
        let mut clients: Vec<Client> = (0..sweep.args.clients.max(1))
            .map(|i| {
                let id = 0xB3_0000_0000
                    + ((std::process::id() as u64) << 12)
                    + ((tag.len() as u64) << 8)
                    + i as u64;
                new_client(&cluster.servers, id ^ config.label().len() as u64, timing.timeout)
            })
            .collect::<Result<_, _>>()?;
        wait_ready(&mut clients, policy)?;
        Ok(Live { config, cluster, clients, policy, sweep, rows: Vec::new(), seed: 1, done: false })
    }

    /// Measures one point and records it.
    fn measure(&mut self, figure: &str, offered: f64, refined: bool, progress: &mut impl FnMut(&str)) {
        self.seed += 101;
        let pids: Vec<u32> = self.cluster.children.iter().map(|(c, _)| c.id()).collect();
        let server_cpu = || pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
        let (server0, client0, wall0) = (server_cpu(), cpu_seconds(std::process::id()), Instant::now());
        let drops0 = udp_rcvbuf_errors();
        let (tally, secs) = point(&mut self.clients, self.policy, offered, &self.sweep, self.seed);
        let wall = wall0.elapsed().as_secs_f64();
        let mut row = row_of(figure, self.config, offered, &tally, secs, refined);
        row.server_cpu_percent = (server_cpu() - server0) / wall * 100.0;
        row.client_cpu_percent = (cpu_seconds(std::process::id()) - client0) / wall * 100.0;
        row.udp_rcvbuf_drops = udp_rcvbuf_errors().saturating_sub(drops0);
        progress(&format!(
            "  {:<22} {:>3} µs offered {:>8.0} achieved {:>8.0} /s  p50 {:>8.1} p99 {:>9.1} µs  errors {:>5}  cpu srv {:.0} % cli {:.0} %  udp drops {}  load {:.1}{}{}",
            row.series,
            row.handler_us,
            offered,
            row.achieved_rps,
            row.latency_ns_p50 as f64 / 1e3,
            row.latency_ns_p99 as f64 / 1e3,
            row.errors,
            row.server_cpu_percent,
            row.client_cpu_percent,
            row.udp_rcvbuf_drops,
            row.loadavg_1m,
            if row.keeps_up { "" } else { "  (saturated)" },
            if refined { "  [refine]" } else { "" },
        ));
        if !refined && (!row.keeps_up || row.latency_ns_p99 > 50_000_000) {
            self.done = true;
        }
        self.rows.push(row);
    }
}

/// Measures a group of configurations' curves in lockstep: every one's
/// processes run for the whole group, and at each offered rate of the grid
/// each configuration still keeping up is measured in turn, so the
/// configurations compared at equal load see the same background load of
/// this shared machine (an idle group member parks and costs little).
fn curves(
    figure: &str,
    configs: &[Config],
    sweep: &Sweep<'_>,
    tag: &str,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<Row>, String> {
    let mut lives = Vec::new();
    for (i, config) in configs.iter().enumerate() {
        lives.push(Live::start(config, sweep, &format!("{tag}-{i}"), progress)?);
    }
    // The geometric grid, each configuration up to its first point that
    // does not keep up.
    let mut offered = sweep.start_rps;
    while offered <= sweep.args.max_rps && lives.iter().any(|l| !l.done) {
        for live in lives.iter_mut().filter(|l| !l.done) {
            live.measure(figure, offered, false, progress);
        }
        offered *= sweep.step;
    }
    // Refine each configuration's two boundaries: p99 ≤ SLO and p99 ≤ the
    // peak bound.
    for live in &mut lives {
        for bound in [sweep.args.slo_us, sweep.args.peak_p99_us] {
            for _ in 0..sweep.refine {
                let rows = &live.rows;
                let lo =
                    rows.iter().filter(|r| ok_under(r, bound)).map(|r| r.offered_rps).fold(0.0, f64::max);
                let hi = rows
                    .iter()
                    .filter(|r| r.offered_rps > lo && !ok_under(r, bound))
                    .map(|r| r.offered_rps)
                    .fold(f64::INFINITY, f64::min);
                if lo <= 0.0 || !hi.is_finite() || hi / lo < 1.04 {
                    break;
                }
                // Let a saturated server's queues empty before the next point.
                std::thread::sleep(Duration::from_millis(100));
                live.measure(figure, (lo * hi).sqrt(), true, progress);
            }
        }
    }
    let mut rows = Vec::new();
    for live in lives {
        let mut mine = live.rows;
        mine.sort_by(|a, b| a.offered_rps.total_cmp(&b.offered_rps));
        rows.extend(mine);
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------
// Summaries

fn summarize(figure: &str, config: &Config, rows: &[Row], args: &BenchArgs) -> ConfigSummary {
    let mine: Vec<&Row> = rows
        .iter()
        .filter(|r| r.figure == figure && r.series == config.label() && r.handler_us == config.handler_us)
        .collect();
    let best = |bound: u64| {
        mine.iter()
            .filter(|r| ok_under(r, bound))
            .map(|r| r.achieved_rps)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    let slos = std::iter::once(args.slo_us).chain(args.extra_slo_us.iter().copied());
    let light = mine.first();
    ConfigSummary {
        figure: figure.into(),
        series: config.label(),
        config: config.clone(),
        peak_rps: best(args.peak_p99_us),
        max_sustained_rps: best(u64::MAX / 1000),
        at_slo_rps: slos.map(|s| (s, best(s))).collect(),
        light_latency_ns_p50: light.map(|r| r.latency_ns_p50),
        light_latency_ns_p99: light.map(|r| r.latency_ns_p99),
    }
}

fn find<'a>(summaries: &'a [ConfigSummary], figure: &str, c: &Config) -> Option<&'a ConfigSummary> {
    summaries.iter().find(|s| s.figure == figure && s.config == *c)
}

fn replication_cost(
    rows: &[Row],
    summaries: &[ConfigSummary],
    handler_us: u64,
    workers: bool,
) -> ReplicationCost {
    let unrepl = Config::new(false, 1, handler_us, workers, false);
    let repl = Config::new(true, 3, handler_us, workers, false);
    let peak = |c: &Config| find(summaries, "fig5.1", c).and_then(|s| s.peak_rps);
    let (u_peak, r_peak) = (peak(&unrepl), peak(&repl));
    let sustained = |c: &Config| find(summaries, "fig5.1", c).and_then(|s| s.max_sustained_rps);
    let (u_max, r_max) = (sustained(&unrepl), sustained(&repl));
    let grid = |c: &Config| -> Vec<&Row> {
        rows.iter()
            .filter(|r| {
                r.figure == "fig5.1" && !r.refined && r.series == c.label() && r.handler_us == handler_us
            })
            .collect()
    };
    let (u_rows, r_rows) = (grid(&unrepl), grid(&repl));
    // Offered rates on both grids where both keep up (the grids are the
    // same geometric sequence, so offered rates compare exactly).
    let common: Vec<(&Row, &Row)> = r_rows
        .iter()
        .filter(|r| r.keeps_up)
        .filter_map(|r| {
            u_rows
                .iter()
                .find(|u| u.keeps_up && (u.offered_rps - r.offered_rps).abs() < 1e-6)
                .map(|u| (*u, *r))
        })
        .collect();
    let light = common.first().copied();
    let moderate = r_peak.and_then(|p| common.iter().rev().find(|(_, r)| r.offered_rps <= p * 0.5).copied());
    let diff =
        |p: Option<(&Row, &Row)>, f: fn(&Row) -> u64| p.map(|(u, r)| (f(r) as f64 - f(u) as f64) / 1e3);
    ReplicationCost {
        handler_us,
        mode: unrepl.mode.clone(),
        unreplicated_peak_rps: u_peak,
        replicated_peak_rps: r_peak,
        peak_loss_percent: u_peak.zip(r_peak).map(|(u, r)| (1.0 - r / u) * 100.0),
        unreplicated_max_sustained_rps: u_max,
        replicated_max_sustained_rps: r_max,
        max_sustained_loss_percent: u_max.zip(r_max).map(|(u, r)| (1.0 - r / u) * 100.0),
        light_offered_rps: light.map(|(u, _)| u.offered_rps),
        light_p99_overhead_us: diff(light, |r| r.latency_ns_p99),
        moderate_offered_rps: moderate.map(|(u, _)| u.offered_rps),
        moderate_p99_overhead_us: diff(moderate, |r| r.latency_ns_p99),
        moderate_p50_overhead_us: diff(moderate, |r| r.latency_ns_p50),
    }
}

fn worker_gain(
    summaries: &[ConfigSummary],
    handler_us: u64,
    replicated: bool,
    slo_index: usize,
) -> WorkerGain {
    let members = if replicated { 3 } else { 1 };
    let w = Config::new(replicated, members, handler_us, true, false);
    let n = Config::new(replicated, members, handler_us, false, false);
    let at = |c: &Config| find(summaries, "fig5.1", c).and_then(|s| s.at_slo_rps.get(slo_index).copied());
    let slo_us = at(&w).or(at(&n)).map_or(0, |(s, _)| s);
    let (workers_rps, network_rps) = (at(&w).and_then(|x| x.1), at(&n).and_then(|x| x.1));
    WorkerGain {
        handler_us,
        policy: w.policy.clone(),
        slo_us,
        workers_rps,
        network_rps,
        ratio: workers_rps.zip(network_rps).map(|(a, b)| a / b),
    }
}

// ---------------------------------------------------------------------------
// Running and output

/// The servers' `--idle-spins` and `--idle-yields` for this run.
static SERVER_IDLE: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();

/// Runs the selected experiments; writes CSV, JSON and PNG files.
pub fn run(args: &BenchArgs, mut progress: impl FnMut(&str)) -> Result<Report, String> {
    let (spins, yields) = args
        .server_idle
        .split_once(',')
        .filter(|(s, y)| s.parse::<u32>().is_ok() && y.parse::<u32>().is_ok())
        .ok_or_else(|| format!("--server-idle `{}`: expected SPINS,YIELDS", args.server_idle))?;
    let _ = SERVER_IDLE.set((spins.to_string(), yields.to_string()));
    let started = Instant::now();
    let want = |f: &str| args.figures.is_empty() || args.figures.iter().any(|x| x == f);
    let arrivals = match args.arrivals.as_str() {
        "poisson" => Arrivals::Poisson,
        "fixed" => Arrivals::Fixed,
        other => return Err(format!("--arrivals: `{other}` is neither poisson nor fixed")),
    };
    if args.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    let machine = MachineInfo::current();
    progress(&format!("ordo bench r3p2 — {}", machine.summary()));
    let q = args.quick;
    let sweep = Sweep {
        args,
        timing: Timing {
            warmup: Duration::from_millis(args.warmup_ms.unwrap_or(if q { 100 } else { 400 })),
            window: Duration::from_millis(args.point_ms.unwrap_or(if q { 400 } else { 1500 })),
            timeout: Duration::from_millis(args.timeout_ms.max(1)),
            idle: args.client_idle.parse()?,
        },
        arrivals,
        start_rps: args.start_rps.unwrap_or(if q { 500.0 } else { 250.0 }),
        step: args.step.unwrap_or(if q { 2.0 } else { 1.41 }).max(1.05),
        refine: args.refine.unwrap_or(if q { 1 } else { 3 }),
    };
    progress(&format!(
        "{} client thread(s), {} arrivals, {} ms windows after {} ms warm-up; nothing pinned; {} CPUs shared by the client and every server thread",
        args.clients,
        args.arrivals,
        sweep.timing.window.as_millis(),
        sweep.timing.warmup.as_millis(),
        machine.cpus
    ));
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    // Groups measured in lockstep (see `curves`): Fig. 5.1 pairs the
    // unreplicated baseline with the replicated group at each handler time
    // and mode, so that they are compared under the same background load.
    let mut groups: Vec<(String, Vec<Config>)> = Vec::new();
    if want("fig5.1") {
        for handler_us in [1u64, 10] {
            for workers in [true, false] {
                let pair = vec![
                    Config::new(false, 1, handler_us, workers, false),
                    Config::new(true, 3, handler_us, workers, false),
                ];
                groups.push(("fig5.1".into(), pair));
            }
        }
    }
    if args.fsync && (want("fig5.1") || want("fsync")) {
        for handler_us in [1u64, 10] {
            groups.push(("fig5.1".into(), vec![Config::new(true, 3, handler_us, true, true)]));
        }
    }
    if want("fig5.2") {
        for members in [1usize, 3, 5] {
            let config = Config::new(true, members, args.fig52_handler_us, true, false);
            groups.push(("fig5.2".into(), vec![config]));
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for (i, (figure, group)) in groups.iter().enumerate() {
        // Fig. 5.2's 3-member curve is Fig. 5.1's when that one ran.
        if let [config] = &group[..]
            && figure == "fig5.2"
        {
            let same: Vec<Row> = rows
                .iter()
                .filter(|r| {
                    r.figure == "fig5.1" && r.series == config.label() && r.handler_us == config.handler_us
                })
                .cloned()
                .collect();
            if !same.is_empty() {
                progress(&format!(
                    "{figure}: {} {} µs (the fig5.1 curve)",
                    config.label(),
                    config.handler_us
                ));
                rows.extend(same.into_iter().map(|r| Row { figure: figure.clone(), ..r }));
                continue;
            }
        }
        let names: Vec<String> = group.iter().map(|c| format!("{} {} µs", c.label(), c.handler_us)).collect();
        progress(&format!("{figure}: {}", names.join(" + ")));
        rows.extend(curves(figure, group, &sweep, &i.to_string(), &mut progress)?);
    }
    let configs: Vec<(String, Config)> =
        groups.iter().flat_map(|(f, g)| g.iter().map(move |c| (f.clone(), c.clone()))).collect();
    let summaries: Vec<ConfigSummary> = configs.iter().map(|(f, c)| summarize(f, c, &rows, args)).collect();
    let mut replication = Vec::new();
    let mut gains = Vec::new();
    if want("fig5.1") {
        for handler_us in [1u64, 10] {
            for workers in [true, false] {
                replication.push(replication_cost(&rows, &summaries, handler_us, workers));
            }
        }
        for slo_index in 0..=args.extra_slo_us.len() {
            for handler_us in [1u64, 10] {
                for replicated in [false, true] {
                    gains.push(worker_gain(&summaries, handler_us, replicated, slo_index));
                }
            }
        }
    }
    let report = Report {
        machine,
        quick: args.quick,
        arrivals: args.arrivals.clone(),
        client_idle: args.client_idle.clone(),
        clients: args.clients,
        point_ms: sweep.timing.window.as_millis() as u64,
        slo_us: args.slo_us,
        peak_p99_us: args.peak_p99_us,
        rows,
        configs: summaries,
        replication_cost: replication,
        worker_gain: gains,
        wall_s: started.elapsed().as_secs_f64(),
        out_dir: args.out.display().to_string(),
    };
    write_files(&report, &args.out)?;
    Ok(report)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or(String::new(), |v| format!("{v:.decimals$}"))
}

fn write_files(report: &Report, out: &Path) -> Result<(), String> {
    let mut csv = String::from(
        "figure,series,policy,members,handler_us,mode,fsync,offered_rps,arrival_rps,sent_rps,achieved_rps,requests,errors,latency_ns_p50,latency_ns_p90,latency_ns_p99,latency_ns_p999,keeps_up,refined,server_cpu_percent,client_cpu_percent,udp_rcvbuf_drops,loadavg_1m\n",
    );
    for r in &report.rows {
        csv += &format!(
            "{},{},{},{},{},{},{},{:.0},{:.0},{:.0},{:.0},{},{},{},{},{},{},{},{},{:.0},{:.0},{},{:.2}\n",
            r.figure,
            r.series,
            r.policy,
            r.members,
            r.handler_us,
            r.mode,
            r.fsync,
            r.offered_rps,
            r.arrival_rps,
            r.sent_rps,
            r.achieved_rps,
            r.requests,
            r.errors,
            r.latency_ns_p50,
            r.latency_ns_p90,
            r.latency_ns_p99,
            r.latency_ns_p999,
            r.keeps_up,
            r.refined,
            r.server_cpu_percent,
            r.client_cpu_percent,
            r.udp_rcvbuf_drops,
            r.loadavg_1m
        );
    }
    write(&out.join("r3p2.csv"), &csv)?;
    let mut s = String::from(
        "figure,series,policy,members,handler_us,mode,fsync,peak_rps,max_sustained_rps,slo_us,at_slo_rps,light_latency_ns_p50,light_latency_ns_p99\n",
    );
    for c in &report.configs {
        for (slo, at) in &c.at_slo_rps {
            s += &format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                c.figure,
                c.series,
                c.config.policy,
                c.config.members,
                c.config.handler_us,
                c.config.mode,
                c.config.fsync,
                opt(c.peak_rps, 0),
                opt(c.max_sustained_rps, 0),
                slo,
                opt(*at, 0),
                c.light_latency_ns_p50.map_or(String::new(), |v| v.to_string()),
                c.light_latency_ns_p99.map_or(String::new(), |v| v.to_string()),
            );
        }
    }
    write(&out.join("summary.csv"), &s)?;
    write(&out.join("r3p2.json"), &serde_json::to_string_pretty(report).map_err(|e| e.to_string())?)?;
    let series_of = |figure: &str, pick: &dyn Fn(&Row) -> bool| {
        let mut labels: Vec<(String, u64)> = Vec::new();
        for r in report.rows.iter().filter(|r| r.figure == figure && pick(r)) {
            if !labels.contains(&(r.series.clone(), r.handler_us)) {
                labels.push((r.series.clone(), r.handler_us));
            }
        }
        labels
            .into_iter()
            .map(|(label, handler)| {
                let points = report
                    .rows
                    .iter()
                    .filter(|r| r.figure == figure && r.series == label && r.handler_us == handler)
                    .map(|r| (r.achieved_rps / 1e3, r.latency_ns_p99 as f64 / 1e3))
                    .collect();
                let color = if label.starts_with("unrepl") {
                    0
                } else if label.contains("fsync") {
                    2
                } else if label.starts_with("repl1") {
                    3
                } else if label.starts_with("repl5") {
                    4
                } else {
                    1
                };
                Series { dashed: label.contains("network"), color: Some(color), label, points }
            })
            .collect::<Vec<_>>()
    };
    if report.rows.iter().any(|r| r.figure == "fig5.1") {
        let panels: Vec<Panel> = [1u64, 10]
            .iter()
            .map(|&h| Panel {
                title: format!("{h} µs handler"),
                x_label: "achieved throughput (k requests/s)".into(),
                y_label: "p99 latency (µs)".into(),
                log_y: true,
                series: series_of("fig5.1", &|r: &Row| r.handler_us == h),
            })
            .collect();
        write_png(
            &out.join("fig5_1.png"),
            "r3p2 Fig. 5.1: unreplicated vs replicated (3), worker vs network thread (dashed)",
            &panels,
            2,
        )?;
    }
    if report.rows.iter().any(|r| r.figure == "fig5.2") {
        let h = report.rows.iter().find(|r| r.figure == "fig5.2").map_or(0, |r| r.handler_us);
        let panels = vec![Panel {
            title: format!("replicated, {h} µs handler, worker thread"),
            x_label: "achieved throughput (k requests/s)".into(),
            y_label: "p99 latency (µs)".into(),
            log_y: true,
            series: series_of("fig5.2", &|_| true),
        }];
        write_png(&out.join("fig5_2.png"), "r3p2 Fig. 5.2: 1, 3, 5 members", &panels, 1)?;
    }
    Ok(())
}

/// Prints the report as tables.
pub fn print_table(report: &Report) {
    println!("ordo bench r3p2 — {}", report.machine.summary());
    println!(
        "{:<7} {:<22} {:>4} {:>10} {:>10} {:>10} {:>9} {:>10} {:>7} {:>5} {:>8} {:>8} {:>8} {:>5}",
        "figure",
        "series",
        "µs",
        "offered/s",
        "sent/s",
        "achieved/s",
        "p50 µs",
        "p99 µs",
        "errors",
        "ok",
        "srv cpu%",
        "cli cpu%",
        "udp drop",
        "load"
    );
    for r in &report.rows {
        println!(
            "{:<7} {:<22} {:>4} {:>10.0} {:>10.0} {:>10.0} {:>9.1} {:>10.1} {:>7} {:>5} {:>8.0} {:>8.0} {:>8} {:>5.1}",
            r.figure,
            r.series,
            r.handler_us,
            r.offered_rps,
            r.sent_rps,
            r.achieved_rps,
            r.latency_ns_p50 as f64 / 1e3,
            r.latency_ns_p99 as f64 / 1e3,
            r.errors,
            if r.keeps_up { "yes" } else { "no" },
            r.server_cpu_percent,
            r.client_cpu_percent,
            r.udp_rcvbuf_drops,
            r.loadavg_1m
        );
    }
    let k = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}k", v / 1e3));
    println!(
        "\nPer configuration (peak: highest achieved rate that keeps up with p99 ≤ {} µs; at SLO: p99 ≤ SLO)",
        report.peak_p99_us
    );
    for c in &report.configs {
        let slos: Vec<String> = c.at_slo_rps.iter().map(|(s, v)| format!("@{s}µs {}", k(*v))).collect();
        println!(
            "  {:<7} {:<22} {:>3} µs  peak {:>8}  max sustained {:>8}  {}  light-load p99 {} µs",
            c.figure,
            c.series,
            c.config.handler_us,
            k(c.peak_rps),
            k(c.max_sustained_rps),
            slos.join("  "),
            c.light_latency_ns_p99.map_or("-".into(), |v| format!("{:.1}", v as f64 / 1e3))
        );
    }
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.1}"));
    if !report.replication_cost.is_empty() {
        println!(
            "\nReplicated (3) vs unreplicated (thesis, DPDK: ~13 % peak loss, +10-13 µs p99 at equal load)"
        );
        for c in &report.replication_cost {
            println!(
                "  {:>2} µs {:<8} peak {} -> {} ({} loss); max sustained {} -> {} ({} loss); p99 overhead {} µs at {} offered/s, {} µs at {} offered/s (p50 {} µs)",
                c.handler_us,
                c.mode,
                k(c.unreplicated_peak_rps),
                k(c.replicated_peak_rps),
                c.peak_loss_percent.map_or("-".into(), |v| format!("{v:.1} %")),
                k(c.unreplicated_max_sustained_rps),
                k(c.replicated_max_sustained_rps),
                c.max_sustained_loss_percent.map_or("-".into(), |v| format!("{v:.1} %")),
                us(c.light_p99_overhead_us),
                opt(c.light_offered_rps, 0),
                us(c.moderate_p99_overhead_us),
                opt(c.moderate_offered_rps, 0),
                us(c.moderate_p50_overhead_us),
            );
        }
    }
    if !report.worker_gain.is_empty() {
        println!("\nWorker thread vs network thread, throughput at a p99 SLO (thesis: 2x at 200 µs)");
        for g in &report.worker_gain {
            println!(
                "  SLO {:>5} µs {:>2} µs {:<16} workers {:>8} network {:>8} ratio {}",
                g.slo_us,
                g.handler_us,
                g.policy,
                k(g.workers_rps),
                k(g.network_rps),
                g.ratio.map_or("-".into(), |v| format!("{v:.2}x"))
            );
        }
    }
    println!("\nwall time {:.0} s; files: {}", report.wall_s, report.out_dir);
}
