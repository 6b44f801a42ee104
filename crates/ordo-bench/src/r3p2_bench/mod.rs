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
//! Every point that would end the climb, and every bisection point over
//! the bound it refines, is measured once more before it counts
//! ([`measure_retried`]; its rows carry their `attempt`): one stall of
//! the machine neither ends a curve's climb or the peak-loss search's
//! doubling ([`PeakSearch`]) nor narrows a bisection below the boundary.
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
use ordo_r2p2::{Client, Policy};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Arguments of `ordo bench r3p2`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Reduced run (under two minutes).
    #[arg(long)]
    pub quick: bool,
    /// Servers' idle spins and yields before parking (`ordo r3p2 serve
    /// --idle-spins/--idle-yields`), e.g. `0,0`. Default: each server's
    /// own choice (0,250, or 0,100 where the replicas' threads outnumber
    /// the cores).
    #[arg(long)]
    pub server_idle: Option<String>,
    /// Pin each server's network thread and the client to a CPU of its own
    /// also in the parked configurations, where the machine has a core per
    /// thread (busy mode always pins there).
    #[arg(long)]
    pub pin: bool,
    /// The `peakloss` and `lightp99` figures' modes: `parked`, `busy`
    /// (default: both).
    #[arg(long, alias = "peakloss-modes", value_delimiter = ',', default_value = "parked,busy")]
    pub modes: Vec<String>,
    /// Print the report (machine, rows, summary) as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Experiments: fig5.1, fig5.2, auth, busy (default: all four); `fsync`
    /// alone runs only the durable series (with `--fsync`). `auth` runs 3
    /// replicas with and without the cluster secret, in lockstep;
    /// `syscalls` (only when named) the unreplicated server and 3 replicas
    /// with batched socket system calls and with one datagram per call;
    /// `peakloss` (only when named) the 3-replica peak over the
    /// unreplicated server's, each searched on a fresh cluster,
    /// interleaved, parked and busy-polling; `lightp99` (only when named)
    /// replication's light-load p99 and p50 overhead, each side's point on
    /// a fresh cluster, interleaved, parked and busy-polling; `calls` (only
    /// when named) blocking `Client::call` latency at light load, the
    /// client's idle strategy spinning first against yielding first; `leadercost` (only when
    /// named) the network thread's work per request, leader of 3 against
    /// the unreplicated server, on one thread in memory.
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
    /// What a generator thread does when idle: spin, yield, park (block on
    /// the socket until an answer or 200 µs before the next request, then
    /// spin) or sleep:<us> (sleep at most that long at a time).
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
    /// Replica traffic sealed with a cluster secret (replicated only; the
    /// default, as in production). False: `--insecure`, the "auth" figure's
    /// baseline.
    pub auth: bool,
    /// Busy-poll mode: no thread parks. Where the servers' threads and the
    /// client's fit this host's cores they spin on their sockets
    /// (`--idle-spins` at its maximum, the client spinning); where they
    /// outnumber the cores (3 replicas on 2 cores) they yield instead
    /// (`--idle-spins 0 --idle-yields 1000000`, the client yielding), so
    /// the thread a request waits on gets a core without a futex wake-up
    /// (10 spins first: 36 µs light-load p50 for three replicas on two
    /// cores, none: 30 µs).
    /// The "busy" figure measures it beside the parked default.
    pub busy: bool,
    /// Batched socket system calls (`recvmmsg`/`sendmmsg`, the default);
    /// off (`--no-syscall-batching`): the "syscalls" figure's baseline.
    pub syscall_batching: bool,
}

impl Config {
    fn new(replicated: bool, members: usize, handler_us: u64, workers: bool, fsync: bool) -> Config {
        Config {
            policy: if replicated { "REPLICATED_ROUTE" } else { "FIXED_ROUTE" }.into(),
            members,
            handler_us,
            mode: if workers { "workers" } else { "network" }.into(),
            fsync,
            auth: replicated,
            busy: false,
            syscall_batching: true,
        }
    }

    fn replicated(&self) -> bool {
        self.policy == "REPLICATED_ROUTE"
    }

    /// Busy mode spins (rather than yields): every server thread and the
    /// client thread have a core of their own.
    pub(super) fn busy_spins(&self) -> bool {
        let per_server = 1 + usize::from(self.mode == "workers");
        // The servers' threads plus the client's, against the cores.
        self.members * per_server < ordo_runtime::online_cpus()
    }

    /// Short series name, e.g. `repl3-workers` or `unrepl-network`.
    pub fn label(&self) -> String {
        let base = if self.replicated() { format!("repl{}", self.members) } else { "unrepl".to_string() };
        let noauth = if self.replicated() && !self.auth { "-noauth" } else { "" };
        format!(
            "{base}-{}{}{noauth}{}{}",
            self.mode,
            if self.fsync { "-fsync" } else { "" },
            if self.busy { "-busy" } else { "" },
            if self.syscall_batching { "" } else { "-nobatch" }
        )
    }
}

/// One measured point.
#[derive(Clone, Debug, Default, Serialize)]
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
    /// 1, or 2 for a point measured again because its first attempt was
    /// over the bound or ended the climb ([`measure_retried`]); a plot
    /// draws a rate's last attempt.
    pub attempt: u32,
    /// CPU used by all server processes during the point (warm-up, window
    /// and drain), % of one CPU.
    pub server_cpu_percent: f64,
    /// CPU used by the busiest server process during the point (all its
    /// threads), % of one CPU — the leader, in a replicated group. With
    /// handlers on the network thread and servers that park when idle,
    /// near 100 % says that thread is the bound; busy-polling servers
    /// read ~100 % at any load.
    pub busiest_server_cpu_percent: f64,
    /// The part of the busiest server's CPU spent in the kernel (its
    /// system time), % of one CPU: where the leader is the bound, this
    /// splits its work between the system calls (UDP sends and receives)
    /// and ordo's own (user time).
    pub busiest_server_system_percent: f64,
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
    /// What the servers' threads do when idle ([`load::server_idle`]).
    pub server_idle: String,
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

/// Authenticated vs unauthenticated replica traffic (3 replicas, same run,
/// measured in lockstep).
#[derive(Clone, Debug, Serialize)]
pub struct AuthCost {
    /// Handler, µs.
    pub handler_us: u64,
    /// Peak throughput with the cluster secret.
    pub auth_peak_rps: Option<f64>,
    /// Peak throughput without.
    pub noauth_peak_rps: Option<f64>,
    /// 1 − auth/noauth, %.
    pub peak_loss_percent: Option<f64>,
    /// Highest sustained rate with / without.
    pub auth_max_sustained_rps: Option<f64>,
    /// Highest sustained rate without.
    pub noauth_max_sustained_rps: Option<f64>,
    /// p50 at the lowest offered rate with / without, ns.
    pub auth_light_p50_ns: Option<u64>,
    /// p50 at the lowest offered rate without, ns.
    pub noauth_light_p50_ns: Option<u64>,
    /// p99 at the lowest offered rate with, ns.
    pub auth_light_p99_ns: Option<u64>,
    /// p99 at the lowest offered rate without, ns.
    pub noauth_light_p99_ns: Option<u64>,
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
    /// The "auth" figure: what authenticating replica traffic costs.
    pub auth_cost: Vec<AuthCost>,
    /// The "peakloss" figure: 3-replica peak over the unreplicated
    /// server's, interleaved, parked and busy-polling.
    pub peak_loss: Vec<crate::noise::Comparison>,
    /// The "lightp99" figure: the light-load p99 and p50 of the 3-replica
    /// group and of the unreplicated server, interleaved on fresh clusters;
    /// each comparison's `difference` is replication's overhead, µs.
    pub light_overhead: Vec<crate::noise::Comparison>,
    /// The "calls" figure: blocking `Client::call` latency at light load,
    /// the client yielding first (its default) against spinning first.
    pub calls: Vec<crate::noise::Comparison>,
    /// The "leadercost" figure: the network thread's work per request, the
    /// leader of 3 against the unreplicated server, in memory
    /// ([`leader`]), per requests-per-turn batch.
    pub leader_cost: Vec<crate::noise::Comparison>,
    /// The limit light-load latency is read against: a busy-polled UDP
    /// round trip on loopback with plain sockets, measured at the start of
    /// this run ([`crate::limits::udp_round_trip`]): (p50, p99) ns, back
    /// to back.
    pub udp_round_trip_ns: Option<(f64, f64)>,
    /// The same round trip with the pings spaced as the light-load point's
    /// requests (Poisson at `light_rps`), where the busy figure runs:
    /// (p50, p99) ns. On some machines a round trip after a gap costs
    /// several times one right after another.
    pub udp_round_trip_light_ns: Option<(f64, f64)>,
    /// The light-load point's offered rate, requests/s.
    pub light_rps: f64,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Where the files went.
    pub out_dir: String,
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
    let (user, system) = cpu_split(pid);
    user + system
}

/// utime and stime of a process, seconds (0 when unreadable).
fn cpu_split(pid: u32) -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return (0.0, 0.0) };
    // Fields after the command (which may contain spaces) end with ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return (0.0, 0.0) };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ')'.
    (ticks(11) as f64 / hz, ticks(12) as f64 / hz)
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

/// Whether a grid point ends the climb of the offered rate: it does not
/// keep up, or its p99 passed 50 ms (far past any bound a figure uses).
fn ends_the_climb(r: &Row) -> bool {
    !r.keeps_up || r.latency_ns_p99 > 50_000_000
}

/// Warm-up before a `lightp99` point, at least.
const LIGHT_WARMUP: Duration = Duration::from_millis(500);

/// Requests the busy figure's light-load point measures (its p99 is read
/// as replication's overhead).
const LIGHT_SAMPLES: usize = 3000;

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
            match Cluster::start(config, &format!("{tag}-{attempt}"), sweep.args.clients.max(1)) {
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
        if config.busy {
            timing.idle = if config.busy_spins() { ClientIdle::Spin } else { ClientIdle::Yield };
        }
        timing.pin = pinned(config);
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

    /// Measures one point (its `attempt`-th time) and records it.
    fn measure(
        &mut self,
        figure: &str,
        offered: f64,
        refined: bool,
        attempt: u32,
        progress: &mut impl FnMut(&str),
    ) -> Row {
        self.seed += 101;
        let pids: Vec<u32> = self.cluster.children.iter().map(|(c, _)| c.id()).collect();
        let server_cpu = || pids.iter().map(|p| cpu_split(*p)).collect::<Vec<(f64, f64)>>();
        let (server0, client0, wall0) = (server_cpu(), cpu_seconds(std::process::id()), Instant::now());
        let drops0 = udp_rcvbuf_errors();
        // The busy figure's light-load point is what replication's p99
        // overhead is read at: long enough for LIGHT_SAMPLES requests, so
        // its p99 is not the second-worst of ~200.
        let mut sweep = Sweep { ..self.sweep };
        if (figure == "busy" || figure == "lightp99") && !refined && offered <= self.sweep.start_rps {
            let needed = Duration::from_secs_f64(LIGHT_SAMPLES as f64 / offered.max(1.0));
            sweep.timing.window = sweep.timing.window.max(needed);
        }
        let (tally, secs) = point(&mut self.clients, self.policy, offered, &sweep, self.seed);
        let wall = wall0.elapsed().as_secs_f64();
        let mut row = row_of(figure, self.config, offered, &tally, secs, refined);
        row.attempt = attempt;
        // (user + system, system) per server, % of one CPU.
        let split: Vec<(f64, f64)> = server_cpu()
            .iter()
            .zip(&server0)
            .map(|(b, a)| ((b.0 + b.1 - a.0 - a.1) / wall * 100.0, (b.1 - a.1) / wall * 100.0))
            .collect();
        let used: Vec<f64> = split.iter().map(|s| s.0).collect();
        row.server_cpu_percent = used.iter().sum();
        let busiest = split.iter().copied().fold((0.0, 0.0), |m, s| if s.0 > m.0 { s } else { m });
        (row.busiest_server_cpu_percent, row.busiest_server_system_percent) = busiest;
        row.client_cpu_percent = (cpu_seconds(std::process::id()) - client0) / wall * 100.0;
        row.udp_rcvbuf_drops = udp_rcvbuf_errors().saturating_sub(drops0);
        progress(&format!(
            "  {:<22} {:>3} µs offered {:>8.0} achieved {:>8.0} /s  p50 {:>8.1} p99 {:>9.1} µs  errors {:>5}  cpu srv {:.0} % ({} %, busiest's kernel {:.0} %) cli {:.0} %  udp drops {}  load {:.1}{}{}{}",
            row.series,
            row.handler_us,
            offered,
            row.achieved_rps,
            row.latency_ns_p50 as f64 / 1e3,
            row.latency_ns_p99 as f64 / 1e3,
            row.errors,
            row.server_cpu_percent,
            used.iter().map(|u| format!("{u:.0}")).collect::<Vec<_>>().join("/"),
            row.busiest_server_system_percent,
            row.client_cpu_percent,
            row.udp_rcvbuf_drops,
            row.loadavg_1m,
            if row.keeps_up { "" } else { "  (saturated)" },
            if refined { "  [refine]" } else { "" },
            if attempt > 1 { "  [again]" } else { "" },
        ));
        self.rows.push(row.clone());
        row
    }

    /// A grid point of a curve, measured again if it ends the climb; a
    /// second attempt that ends it too ends this configuration's climb.
    fn climb(&mut self, figure: &str, offered: f64, progress: &mut impl FnMut(&str)) {
        let last = measure_retried(RETRY_PAUSE, ends_the_climb, |attempt| {
            self.measure(figure, offered, false, attempt, progress)
        });
        if ends_the_climb(&last) {
            self.done = true;
        }
    }

    /// Up to `steps` bisection points (geometric midpoints) between the
    /// highest offered rate whose p99 is within `bound_us` and the next
    /// measured rate above it that is not; a point over the bound is
    /// measured again before it counts.
    fn refine(&mut self, figure: &str, bound_us: u64, steps: u32, progress: &mut impl FnMut(&str)) {
        for _ in 0..steps {
            let Some(offered) = next_bisection(&self.rows, bound_us) else { break };
            // Let a saturated server's queues empty before the next point.
            std::thread::sleep(RETRY_PAUSE);
            measure_retried(
                RETRY_PAUSE,
                |r| !ok_under(r, bound_us),
                |attempt| self.measure(figure, offered, true, attempt, progress),
            );
        }
    }
}

/// The pause before a bisection point or a point's second attempt: a
/// saturated server's queues empty first.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A point measured (`measure(1)`) and, when `over` its first attempt,
/// once more after `pause` (`measure(2)`); returns the last attempt. A
/// point spoiled by one stall of the machine (a replica descheduled, a
/// page-fault storm) passes the second time, while a rate past the
/// boundary fails both times. The caller records every attempt.
fn measure_retried(pause: Duration, over: impl Fn(&Row) -> bool, mut measure: impl FnMut(u32) -> Row) -> Row {
    let first = measure(1);
    if !over(&first) {
        return first;
    }
    std::thread::sleep(pause);
    measure(2)
}

/// The next bisection point of `rows` (a geometric midpoint): between the
/// highest offered rate whose p99 is within `bound_us` and the lowest
/// measured rate above it that is not; none when either is missing or
/// they are within 4 %.
fn next_bisection(rows: &[Row], bound_us: u64) -> Option<f64> {
    let lo = rows.iter().filter(|r| ok_under(r, bound_us)).map(|r| r.offered_rps).fold(0.0, f64::max);
    let hi = rows
        .iter()
        .filter(|r| r.offered_rps > lo && !ok_under(r, bound_us))
        .map(|r| r.offered_rps)
        .fold(f64::INFINITY, f64::min);
    (lo > 0.0 && hi.is_finite() && hi / lo >= 1.04).then(|| (lo * hi).sqrt())
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
            live.climb(figure, offered, progress);
        }
        offered *= sweep.step;
    }
    // Refine each configuration's two boundaries: p99 ≤ SLO and p99 ≤ the
    // peak bound.
    for live in &mut lives {
        for bound in [sweep.args.slo_us, sweep.args.peak_p99_us] {
            live.refine(figure, bound, sweep.refine, progress);
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

/// The peak of one configuration, found on a fresh cluster by a
/// [`PeakSearch`] with `refine` (at least 3) bisection steps. Returns
/// the highest achieved rate under the bound, and the load of the client
/// and every server process over the whole search, with what the rest of
/// the machine took ([`crate::noise::MachineProbe`]: where the replicas
/// outnumber the cores they wait on each other by design, so only other
/// load makes a search contended).
fn peak_of(
    config: &Config,
    sweep: &Sweep<'_>,
    tag: &str,
    progress: &mut impl FnMut(&str),
) -> Result<(Option<f64>, crate::noise::Load), String> {
    let bound = sweep.args.peak_p99_us;
    let mut live = Live::start(config, sweep, tag, progress)?;
    let pids: Vec<u32> = live.cluster.children.iter().map(|(c, _)| c.id()).collect();
    let probe = crate::noise::MachineProbe::start(&pids);
    let search = PeakSearch {
        start_rps: sweep.start_rps.max(1000.0),
        max_rps: sweep.args.max_rps,
        steps: sweep.refine.max(3),
        bound_us: bound,
        pause: RETRY_PAUSE,
    };
    let rows =
        search.run(|offered, refined, attempt| live.measure("peakloss", offered, refined, attempt, progress));
    let load = probe.stop();
    Ok((search.peak(&rows), load))
}

/// The peak search of [`peak_of`]: the offered rate doubles from
/// `start_rps` until a point does not keep up (or its p99 passes 50 ms);
/// then `steps` bisections (geometric midpoints) between the highest rate
/// whose p99 is within `bound_us` and the lowest rate above it that is
/// not. A point over the bound is measured once more before it counts
/// (after `pause`, as every bisection point): one stall of the machine
/// (a replica descheduled, a page fault storm) neither ends the doubling
/// nor narrows the bisection below the peak, while a rate past the peak
/// fails both times. Both sides of a compared pair search alike.
#[derive(Clone, Copy, Debug)]
struct PeakSearch {
    start_rps: f64,
    max_rps: f64,
    steps: u32,
    bound_us: u64,
    pause: Duration,
}

impl PeakSearch {
    /// Runs the search with `measure(offered rate, bisection point?,
    /// attempt)`; returns every row measured, in order.
    fn run(&self, mut measure: impl FnMut(f64, bool, u32) -> Row) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        // One point, measured again when over the bound; returns whether
        // the doubling must stop there.
        let mut point = |rows: &mut Vec<Row>, offered: f64, refined: bool| -> bool {
            // Let a saturated server's queues empty first.
            if refined {
                std::thread::sleep(self.pause);
            }
            let last = measure_retried(
                self.pause,
                |r| !ok_under(r, self.bound_us),
                |attempt| {
                    let row = measure(offered, refined, attempt);
                    rows.push(row.clone());
                    row
                },
            );
            !ok_under(&last, self.bound_us) && ends_the_climb(&last)
        };
        let mut offered = self.start_rps;
        loop {
            if point(&mut rows, offered, false) || offered * 2.0 > self.max_rps {
                break;
            }
            offered *= 2.0;
        }
        for _ in 0..self.steps {
            let Some(offered) = next_bisection(&rows, self.bound_us) else { break };
            point(&mut rows, offered, true);
        }
        rows
    }

    /// The highest achieved rate of a point within the bound.
    fn peak(&self, rows: &[Row]) -> Option<f64> {
        rows.iter()
            .filter(|r| ok_under(r, self.bound_us))
            .map(|r| r.achieved_rps)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    }
}

/// The pair replication's cost is read on (`peakloss`, `lightp99`): the
/// unreplicated server and 3 replicas, 1 µs handlers on the network
/// thread, `busy`-polling or parked; and the mode in words.
fn replication_pair(busy: bool) -> (Config, Config, &'static str) {
    let unrepl = Config { busy, ..Config::new(false, 1, 1, false, false) };
    let repl = Config { busy, ..Config::new(true, 3, 1, false, false) };
    (unrepl, repl, if busy { "busy-polling" } else { "parked when idle" })
}

/// How a pair's sample on a fresh cluster is retried while contended.
const PAIR_RETRY: crate::noise::Retry =
    crate::noise::Retry { attempts: 2, pause: Duration::from_millis(500) };

/// Names for a pair's fresh clusters (their processes' tags):
/// `{prefix}{busy}{side}-{n}`, `n` counting up.
fn cluster_tags(prefix: &'static str, busy: bool) -> impl Fn(&str) -> String {
    let n = std::cell::Cell::new(0u32);
    move |side| {
        n.set(n.get() + 1);
        format!("{prefix}{}{side}-{}", u8::from(busy), n.get())
    }
}

/// Replication's peak loss measured as issue 12 asks of a compared pair:
/// the unreplicated server's peak and the 3-replica group's, each on a
/// fresh cluster, interleaved (`rounds` rounds, at least 3), a search
/// during which other processes took the CPU retried and, if still
/// contended, left out; the ratio (3 replicas / unreplicated) as median [min–max] of
/// the rounds. Handlers (1 µs) on the network thread; `busy`: servers and
/// client busy-polling.
fn peak_loss(
    sweep: &Sweep<'_>,
    busy: bool,
    rounds: usize,
    progress: &mut impl FnMut(&str),
) -> Result<crate::noise::Comparison, String> {
    use crate::noise::{Comparison, interleave};
    let (unrepl, repl, mode) = replication_pair(busy);
    progress(&format!("peakloss ({mode}): unreplicated and 3 replicas interleaved, {rounds} rounds"));
    let tag = cluster_tags("pl", busy);
    // Both closures need the progress sink; they run one at a time.
    let progress = std::cell::RefCell::new(progress);
    let rounds = interleave(
        rounds,
        PAIR_RETRY,
        || peak_of(&unrepl, sweep, &tag("u"), &mut *progress.borrow_mut()),
        || peak_of(&repl, sweep, &tag("r"), &mut *progress.borrow_mut()),
    )?;
    let c = Comparison::of(
        &format!(
            "peak (p99 ≤ {} µs), 1 µs handler on the network thread, {mode}: 3 replicas / unreplicated",
            sweep.args.peak_p99_us
        ),
        "requests/s",
        ("unreplicated", "3 replicas"),
        &rounds,
        |v| *v,
    );
    (progress.into_inner())(&c.line(|v| format!("{:.1}k/s", v / 1e3)));
    Ok(c)
}

/// One light-load point of one configuration on a fresh cluster: a
/// warm-up, then [`LIGHT_SAMPLES`] requests at the grid's first rate, with
/// what the rest of the machine took over that time
/// ([`crate::noise::MachineProbe`]: a busy-polling group waits on its own
/// threads by design, so only other load makes the point contended).
fn light_of(
    config: &Config,
    sweep: &Sweep<'_>,
    tag: &str,
    progress: &mut impl FnMut(&str),
) -> Result<(Row, crate::noise::Load), String> {
    // A fresh cluster's first few hundred ms are slower (its log and
    // sessions grow, pages fault in): a p99 is read after at least
    // LIGHT_WARMUP (busy, two runs each: replicated p99 253 µs median
    // after `--quick`'s 100 ms, 217-218 µs after 500 ms).
    let mut sweep = Sweep { ..*sweep };
    sweep.timing.warmup = sweep.timing.warmup.max(LIGHT_WARMUP);
    let sweep = &sweep;
    let mut live = Live::start(config, sweep, tag, progress)?;
    let pids: Vec<u32> = live.cluster.children.iter().map(|(c, _)| c.id()).collect();
    let probe = crate::noise::MachineProbe::start(&pids);
    let row = live.measure("lightp99", sweep.start_rps, false, 1, progress);
    let load = probe.stop();
    progress(&format!(
        "    other load over the point: {:.3} cores{}",
        load.foreign_cores.unwrap_or(0.0),
        if load.contended() { " (contended)" } else { "" }
    ));
    Ok((row, load))
}

/// Replication's light-load latency overhead measured as issue 12 asks of
/// a compared pair: the unreplicated server's light-load point and the
/// 3-replica group's, each on a fresh cluster, interleaved (`rounds`
/// rounds, at least 3), a point during which other processes took the CPU
/// retried and, if still contended, left out. Returns the p99 and the p50
/// comparisons; their `difference` (3 replicas − unreplicated per clean
/// round, median [min–max]) is the overhead. A point that does not keep
/// up has no value (it enters no figure). Handlers (1 µs) on the network
/// thread; `busy`: servers and client busy-polling.
fn light_overhead(
    sweep: &Sweep<'_>,
    busy: bool,
    rounds: usize,
    rows: &mut Vec<Row>,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<crate::noise::Comparison>, String> {
    use crate::noise::{Comparison, interleave};
    let (unrepl, repl, mode) = replication_pair(busy);
    progress(&format!(
        "lightp99 ({mode}): unreplicated and 3 replicas at {:.0} requests/s, {LIGHT_SAMPLES} requests each, interleaved, {rounds} rounds",
        sweep.start_rps
    ));
    let tag = cluster_tags("lp", busy);
    let progress = std::cell::RefCell::new(progress);
    // Every point measured, retries included, goes to the report's rows.
    let measured = std::cell::RefCell::new(rows);
    let light = |config: &Config, side: &str| {
        let (row, load) = light_of(config, sweep, &tag(side), &mut *progress.borrow_mut())?;
        measured.borrow_mut().push(row.clone());
        Ok((row, load))
    };
    let rounds = interleave(rounds, PAIR_RETRY, || light(&unrepl, "u"), || light(&repl, "r"))?;
    let mut out = Vec::new();
    for (name, pick) in
        [("p99", (|r: &Row| r.latency_ns_p99) as fn(&Row) -> u64), ("p50", |r: &Row| r.latency_ns_p50)]
    {
        let c = Comparison::of(
            &format!(
                "light-load {name} at {:.0}/s, 1 µs handler on the network thread, {mode}: 3 replicas / unreplicated",
                sweep.start_rps
            ),
            "µs",
            ("unreplicated", "3 replicas"),
            &rounds,
            |r: &Row| r.keeps_up.then(|| pick(r) as f64 / 1e3),
        );
        (progress.borrow_mut())(&c.line_with_difference("overhead", |v| format!("{v:.1} µs")));
        out.push(c);
    }
    Ok(out)
}

/// Calls one sample of the `calls` figure makes.
const CALLS: usize = 1000;

/// One sample of the `calls` figure: [`CALLS`] blocking `Client::call`s
/// from a fresh client whose idle strategy is `idle`, a Poisson-spaced
/// sleep (at `rate`/s) before each, against `servers`; each call's latency
/// from its send to its result, ns (p50, p99), with what the rest of the
/// machine took meanwhile ([`crate::noise::MachineProbe`]).
fn call_sample(
    servers: &[std::net::SocketAddr],
    pids: &[u32],
    policy: Policy,
    idle: ordo_runtime::IdleStrategy,
    rate: f64,
    seed: u64,
) -> Result<((f64, f64), crate::noise::Load), String> {
    let mut config = ordo_r2p2::ClientConfig::new(servers.to_vec());
    config.client_id = Some(0xCA11_0000_0000 + seed);
    config.idle = idle;
    let mut client = Client::new(config).map_err(|e| format!("client: {e}"))?;
    wait_ready(std::slice::from_mut(&mut client), policy)?;
    let probe = crate::noise::MachineProbe::start(pids);
    let mut latency = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut rng = Rng::new(seed);
    for i in 0..CALLS as u64 {
        std::thread::sleep(Duration::from_nanos(rng.poisson_gap_ns(rate) as u64));
        let sent = Instant::now();
        client.call(policy, &i.to_le_bytes()).map_err(|e| format!("call {i}: {e}"))?;
        let _ = latency.record(sent.elapsed().as_nanos() as u64);
    }
    let q = |p: f64| latency.value_at_quantile(p) as f64;
    Ok(((q(0.5), q(0.99)), probe.stop()))
}

/// The `calls` figure: what a program calling the servers with the
/// blocking `Client::call`, one call at a time, sees at light load, with
/// the client's idle strategy the agents' default (spin 200 turns, yield
/// 50, park) and `ordo_r2p2::SOCKET_IDLE` (yield 250, park: the client's
/// default), interleaved on one cluster per configuration (the
/// unreplicated server; 3 replicas), `rounds` rounds. The servers idle as
/// `ordo r3p2 serve` chooses (or `--server-idle`).
fn call_latency(
    sweep: &Sweep<'_>,
    rounds: usize,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<crate::noise::Comparison>, String> {
    use crate::noise::{Comparison, interleave};
    let rate = sweep.start_rps;
    let mut out = Vec::new();
    for config in [Config::new(false, 1, 1, false, false), Config::new(true, 3, 1, false, false)] {
        let name = config.label();
        progress(&format!(
            "calls: {name}, {CALLS} blocking calls at {rate:.0}/s, the client spinning first / yielding first, {rounds} rounds"
        ));
        let live = Live::start(&config, sweep, &format!("calls-{name}"), progress)?;
        let pids: Vec<u32> = live.cluster.children.iter().map(|(c, _)| c.id()).collect();
        let servers = live.cluster.servers.clone();
        let seed = std::cell::Cell::new(0u64);
        let sample = |idle| {
            seed.set(seed.get() + 1);
            call_sample(&servers, &pids, live.policy, idle, rate, seed.get())
        };
        let samples = interleave(
            rounds,
            PAIR_RETRY,
            || sample(ordo_runtime::IdleStrategy::DEFAULT),
            || sample(ordo_r2p2::SOCKET_IDLE),
        )?;
        for (q, pick) in [("p50", (|v: &(f64, f64)| v.0) as fn(&(f64, f64)) -> f64), ("p99", |v| v.1)] {
            let c = Comparison::of(
                &format!("Client::call {q} at {rate:.0}/s, {name}: yielding first / spinning first"),
                "µs",
                ("spin 200, yield 50, park", "yield 250, park"),
                &samples,
                |v| Some(pick(v) / 1e3),
            );
            progress(&format!("  {}", c.line(|v| format!("{v:.1} µs"))));
            out.push(c);
        }
    }
    Ok(out)
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
        server_idle: load::server_idle(config),
    }
}

fn find<'a>(summaries: &'a [ConfigSummary], figure: &str, c: &Config) -> Option<&'a ConfigSummary> {
    summaries.iter().find(|s| s.figure == figure && s.config == *c)
}

fn replication_cost(
    rows: &[Row],
    summaries: &[ConfigSummary],
    (figure, busy): (&str, bool),
    handler_us: u64,
    workers: bool,
) -> ReplicationCost {
    let unrepl = Config { busy, ..Config::new(false, 1, handler_us, workers, false) };
    let repl = Config { busy, ..Config::new(true, 3, handler_us, workers, false) };
    let peak = |c: &Config| find(summaries, figure, c).and_then(|s| s.peak_rps);
    let (u_peak, r_peak) = (peak(&unrepl), peak(&repl));
    let sustained = |c: &Config| find(summaries, figure, c).and_then(|s| s.max_sustained_rps);
    let (u_max, r_max) = (sustained(&unrepl), sustained(&repl));
    let grid = |c: &Config| -> Vec<&Row> {
        rows.iter()
            .filter(|r| {
                r.figure == figure && !r.refined && r.series == c.label() && r.handler_us == handler_us
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
        mode: if busy { format!("{}-busy", unrepl.mode) } else { unrepl.mode.clone() },
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

/// The servers' `--idle-spins` and `--idle-yields` for this run (unset:
/// the servers choose).
static SERVER_IDLE: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// `--pin`: parked configurations pinned too.
static PIN_PARKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether `config`'s server threads and client are pinned, each to a CPU
/// of its own: where the machine has a core per thread, in busy mode, and
/// with `--pin` also when parked.
pub(super) fn pinned(config: &Config) -> bool {
    config.busy_spins() && (config.busy || PIN_PARKED.get().copied().unwrap_or(false))
}

/// Runs the selected experiments; writes CSV, JSON and PNG files.
pub fn run(args: &BenchArgs, mut progress: impl FnMut(&str)) -> Result<Report, String> {
    if let Some(idle) = &args.server_idle {
        let parsed = idle.split_once(',').and_then(|(s, y)| Some((s.parse().ok()?, y.parse().ok()?)));
        let spins_yields = parsed.ok_or_else(|| format!("--server-idle `{idle}`: expected SPINS,YIELDS"))?;
        let _ = SERVER_IDLE.set(spins_yields);
    }
    let _ = PIN_PARKED.set(args.pin);
    // `--modes`, checked before anything is measured: busy (true) or parked.
    let busy_modes: Vec<bool> = args
        .modes
        .iter()
        .map(|m| match m.as_str() {
            "parked" => Ok(false),
            "busy" => Ok(true),
            other => Err(format!("--modes: `{other}` is neither parked nor busy")),
        })
        .collect::<Result<_, _>>()?;
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
    let udp_round_trip_ns = crate::limits::udp_round_trip(20_000, 64, crate::limits::Spacing::BackToBack)
        .ok()
        .map(|(p50, p99, _)| (p50, p99));
    if let Some((p50, p99)) = udp_round_trip_ns {
        progress(&format!(
            "busy-polled UDP round trip (plain sockets, loopback): p50 {:.1} µs, p99 {:.1} µs",
            p50 / 1e3,
            p99 / 1e3
        ));
    }
    let q = args.quick;
    let sweep = Sweep {
        args,
        timing: Timing {
            warmup: Duration::from_millis(args.warmup_ms.unwrap_or(if q { 100 } else { 400 })),
            window: Duration::from_millis(args.point_ms.unwrap_or(if q { 400 } else { 1500 })),
            timeout: Duration::from_millis(args.timeout_ms.max(1)),
            idle: args.client_idle.parse()?,
            pin: false,
        },
        arrivals,
        start_rps: args.start_rps.unwrap_or(if q { 500.0 } else { 250.0 }),
        step: args.step.unwrap_or(if q { 2.0 } else { 1.41 }).max(1.05),
        refine: args.refine.unwrap_or(if q { 1 } else { 3 }),
    };
    // The busy figure reads its light-load p50 against the round trip at
    // the light load's own spacing too (1,000 pings: 2 s at 500/s); the
    // lightp99 figure its p99s (as many pings as its points' requests).
    let lightp99 = args.figures.iter().any(|x| x == "lightp99");
    let udp_round_trip_light_ns = if want("busy") || lightp99 {
        let pings = if lightp99 { LIGHT_SAMPLES as u64 } else { 1_000 };
        crate::limits::udp_round_trip(pings, 64, crate::limits::Spacing::Poisson(sweep.start_rps))
            .ok()
            .map(|(p50, p99, _)| (p50, p99))
    } else {
        None
    };
    if let Some((p50, p99)) = udp_round_trip_light_ns {
        progress(&format!(
            "the same round trip, pings spaced as the light load ({:.0}/s, Poisson): p50 {:.1} µs, p99 {:.1} µs",
            sweep.start_rps,
            p50 / 1e3,
            p99 / 1e3
        ));
    }
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
    if want("busy") {
        // The unreplicated server and the 3-replica group with handlers on
        // their network threads, parked when idle (the default; the pair in
        // lockstep), and each in the busy mode on its own: a busy cluster
        // burns its cores even while idle, which would load whatever else
        // is measured beside it.
        let unrepl = Config::new(false, 1, 1, false, false);
        let repl = Config::new(true, 3, 1, false, false);
        groups.push(("busy".into(), vec![unrepl.clone(), repl.clone()]));
        groups.push(("busy".into(), vec![Config { busy: true, ..unrepl }]));
        groups.push(("busy".into(), vec![Config { busy: true, ..repl }]));
    }
    if args.figures.iter().any(|x| x == "syscalls") {
        // Batched socket system calls vs one datagram per call, in lockstep
        // pairs (parked servers, handlers on the network thread).
        for replicated in [false, true] {
            let with = Config::new(replicated, if replicated { 3 } else { 1 }, 1, false, false);
            let without = Config { syscall_batching: false, ..with.clone() };
            groups.push(("syscalls".into(), vec![with, without]));
        }
    }
    if want("auth") {
        let with = Config::new(true, 3, 1, true, false);
        let without = Config { auth: false, ..with.clone() };
        groups.push(("auth".into(), vec![with, without]));
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
                replication.push(replication_cost(&rows, &summaries, ("fig5.1", false), handler_us, workers));
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
    if want("busy") {
        for busy in [false, true] {
            replication.push(replication_cost(&rows, &summaries, ("busy", busy), 1, false));
        }
    }
    let mut auth_cost = Vec::new();
    for with in summaries.iter().filter(|s| s.figure == "auth" && s.config.auth) {
        let without = summaries
            .iter()
            .find(|s| s.figure == "auth" && !s.config.auth && s.config.handler_us == with.config.handler_us);
        let get = |f: fn(&ConfigSummary) -> Option<f64>| (f(with), without.and_then(f));
        let (a, n) = get(|s| s.peak_rps);
        let (am, nm) = get(|s| s.max_sustained_rps);
        auth_cost.push(AuthCost {
            handler_us: with.config.handler_us,
            auth_peak_rps: a,
            noauth_peak_rps: n,
            peak_loss_percent: a.zip(n).map(|(a, n)| 100.0 * (1.0 - a / n)),
            auth_max_sustained_rps: am,
            noauth_max_sustained_rps: nm,
            auth_light_p50_ns: with.light_latency_ns_p50,
            noauth_light_p50_ns: without.and_then(|s| s.light_latency_ns_p50),
            auth_light_p99_ns: with.light_latency_ns_p99,
            noauth_light_p99_ns: without.and_then(|s| s.light_latency_ns_p99),
        });
    }
    let rounds = if q { 3 } else { 5 };
    let mut peak_losses = Vec::new();
    if args.figures.iter().any(|x| x == "peakloss") {
        for &busy in &busy_modes {
            peak_losses.push(peak_loss(&sweep, busy, rounds, &mut progress)?);
        }
    }
    let mut light_overheads = Vec::new();
    if lightp99 {
        for &busy in &busy_modes {
            light_overheads.extend(light_overhead(&sweep, busy, rounds, &mut rows, &mut progress)?);
        }
    }
    let calls = if args.figures.iter().any(|x| x == "calls") {
        call_latency(&sweep, rounds, &mut progress)?
    } else {
        Vec::new()
    };
    let leader_cost = if args.figures.iter().any(|x| x == "leadercost") {
        leader::leader_cost(q, &mut progress)?
    } else {
        Vec::new()
    };
    let report = Report {
        auth_cost,
        peak_loss: peak_losses,
        light_overhead: light_overheads,
        calls,
        leader_cost,
        udp_round_trip_ns,
        udp_round_trip_light_ns,
        light_rps: sweep.start_rps,
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
    Ok(report)
}

pub mod leader;
mod load;
mod output;
pub(crate) use load::Rng;
use load::*;
pub use output::print_table;

impl crate::experiment::Experiment for BenchArgs {
    type Report = Report;

    fn name(&self) -> &'static str {
        "r3p2"
    }

    fn measure(&self, progress: &mut dyn FnMut(&str)) -> Result<Report, String> {
        run(self, progress)
    }

    fn out_dir(&self) -> Option<&Path> {
        Some(&self.out)
    }

    fn write_files(&self, report: &Report, dir: &Path) -> Result<(), String> {
        output::write_files(report, dir)
    }

    fn print_table(&self, report: &Report) {
        print_table(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A point of a server that keeps up to `capacity` requests/s, except
    /// where `stalled` says a stall of the machine spoiled it.
    fn point(capacity: f64, offered: f64, stalled: bool) -> Row {
        let keeps_up = offered <= capacity && !stalled;
        Row {
            offered_rps: offered,
            achieved_rps: offered.min(capacity),
            keeps_up,
            latency_ns_p99: if keeps_up { 200_000 } else { 80_000_000 },
            ..Row::default()
        }
    }

    fn search() -> PeakSearch {
        PeakSearch {
            start_rps: 1_000.0,
            max_rps: 10_000_000.0,
            steps: 5,
            bound_us: 10_000,
            pause: Duration::ZERO,
        }
    }

    #[test]
    fn the_search_finds_the_peak_within_its_last_bisection_step() {
        let s = search();
        let rows = s.run(|offered, _, _| point(150_000.0, offered, false));
        let peak = s.peak(&rows).expect("a point within the bound");
        // Doubling: 128k keeps up, 256k does not; five bisections narrow
        // 128k-256k to within (256/128)^(1/32) of the capacity.
        assert!(peak <= 150_000.0 && peak > 150_000.0 / 2f64.powf(1.0 / 32.0), "peak {peak}");
        // A failing rate is measured twice; a passing one once.
        let at_256k = rows.iter().filter(|r| r.offered_rps == 256_000.0).count();
        assert_eq!(at_256k, 2, "{rows:?}");
        assert_eq!(rows.iter().filter(|r| r.offered_rps == 128_000.0).count(), 1);
    }

    /// One stall on the doubling grid (which would have ended the search
    /// at 16k) and one at a bisection point below the capacity (which
    /// would have taken the bisection's upper end below the peak) leave
    /// the peak where it is.
    #[test]
    fn a_single_stall_neither_ends_the_search_nor_narrows_it_below_the_peak() {
        let s = search();
        let clean = s.peak(&s.run(|offered, _, _| point(150_000.0, offered, false))).expect("peak");
        let (mut grid_stall, mut bisection_stall) = (None, None);
        let rows = s.run(|offered, refined, _| {
            let stalled = if !refined && offered == 16_000.0 && grid_stall.is_none() {
                grid_stall = Some(offered);
                true
            } else if refined && offered < 150_000.0 && bisection_stall.is_none() {
                bisection_stall = Some(offered);
                true
            } else {
                false
            };
            point(150_000.0, offered, stalled)
        });
        let (grid, bisection) =
            (grid_stall.expect("stalled on the grid"), bisection_stall.expect("in the bisection"));
        for stalled in [grid, bisection] {
            let tries: Vec<bool> =
                rows.iter().filter(|r| r.offered_rps == stalled).map(|r| r.keeps_up).collect();
            assert_eq!(tries, [false, true], "{stalled}/s: a stall, then the point measured again");
        }
        assert_eq!(s.peak(&rows), Some(clean), "{rows:?}");
    }

    /// The retry rule shared by the curves and the peak search: a point
    /// within its bound is measured once; one over it once more, and the
    /// second attempt is what counts, pass or fail.
    #[test]
    fn a_point_over_its_bound_is_measured_once_more_and_its_last_attempt_counts() {
        let over = |r: &Row| !ok_under(r, 10_000);
        let run = |offered: f64, stall_first: bool| {
            let mut attempts = Vec::new();
            let last = measure_retried(Duration::ZERO, over, |attempt| {
                attempts.push(attempt);
                point(150_000.0, offered, stall_first && attempt == 1)
            });
            (attempts, last.keeps_up)
        };
        assert_eq!(run(100_000.0, false), (vec![1], true), "within the bound: once");
        assert_eq!(run(100_000.0, true), (vec![1, 2], true), "a stall: measured again, and the point passes");
        assert_eq!(run(200_000.0, false), (vec![1, 2], false), "past the capacity: fails twice");
    }

    /// A curve draws a rate measured twice at its last attempt, and every
    /// other point as measured.
    #[test]
    fn a_curve_draws_the_last_attempt_of_a_rate_measured_twice() {
        let at =
            |offered: f64, attempt: u32, keeps_up: bool| Row { attempt, ..point(1e9, offered, !keeps_up) };
        let rows = [at(100e3, 1, true), at(200e3, 1, false), at(200e3, 2, true), at(400e3, 1, false)];
        let refs: Vec<&Row> = rows.iter().collect();
        let drawn: Vec<(f64, u32)> =
            output::last_attempts(&refs).map(|r| (r.offered_rps, r.attempt)).collect();
        assert_eq!(drawn, [(100e3, 1), (200e3, 2), (400e3, 1)]);
    }
}
