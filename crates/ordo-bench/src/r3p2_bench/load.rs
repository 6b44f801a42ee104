//! The r3p2 benchmark's load: the server processes (`ordo r3p2 serve`, one
//! per replica, killed on drop) and the open-loop client that offers a rate
//! of requests (Poisson or fixed arrivals) and tallies latencies.

#![allow(unused_imports)]

use super::*;
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

// ---------------------------------------------------------------------------
// Server processes

/// The server processes of one configuration; killed on drop.
pub(super) struct Cluster {
    pub(super) children: Vec<(Child, ChildStdout)>,
    pub(super) servers: Vec<SocketAddr>,
    pub(super) data: Option<PathBuf>,
    /// The cluster secret's file, if the cluster authenticates.
    pub(super) secret: Option<PathBuf>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(s) = &self.secret {
            let _ = std::fs::remove_file(s);
        }
        if let Some(d) = &self.data {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Busy mode's yields where threads outnumber cores: enough never to park.
const YIELD_FOREVER: u32 = 1_000_000;

/// The servers' `--idle-spins` and `--idle-yields` for `config` (none: the
/// servers choose, see [`server_idle`]).
fn server_idle_flags(config: &Config) -> Option<(u32, u32)> {
    if config.busy && config.busy_spins() {
        Some((u32::MAX, 0))
    } else if config.busy {
        Some((0, YIELD_FOREVER))
    } else {
        SERVER_IDLE.get().copied()
    }
}

/// What `config`'s servers do when idle, in words (for the report): the
/// flags the bench passes, or the choice `ordo r3p2 serve` makes for
/// loopback replicas on this host (`NodeOptions::idle_for_host`).
pub(super) fn server_idle(config: &Config) -> String {
    let idle = server_idle_words(config);
    if super::pinned(config) && !config.busy { format!("{idle}; pinned") } else { idle }
}

fn server_idle_words(config: &Config) -> String {
    match server_idle_flags(config) {
        Some((u32::MAX, _)) => "spin (pinned)".into(),
        Some((s, YIELD_FOREVER)) => format!("spin {s}, then yield (never park)"),
        Some((s, y)) => format!("spin {s}, yield {y}, park"),
        None => {
            let peers: Vec<std::net::SocketAddr> =
                (0..config.members).map(|i| ([127, 0, 0, 1], 7000 + i as u16).into()).collect();
            let mut opts = ordo_r2p2::NodeOptions::new(0, peers, None);
            opts.replicated = config.replicated();
            opts.mode = if config.mode == "workers" {
                ordo_r2p2::HandlerMode::Workers(1)
            } else {
                ordo_r2p2::HandlerMode::NetworkThread
            };
            match opts.idle_for_host() {
                ordo_runtime::IdleStrategy::BackoffPark { spins, yields, .. } => {
                    format!("spin {spins}, yield {yields}, park (the servers' choice)")
                }
                other => format!("{other:?} (the servers' choice)"),
            }
        }
    }
}

/// Busy mode's `SO_BUSY_POLL` on the servers' sockets, µs.
const BUSY_POLL_US: &str = "50";

pub(super) fn free_ports(n: usize) -> Result<Vec<SocketAddr>, String> {
    let sockets: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot find a free UDP port: {e}"))?;
    sockets.iter().map(|s| s.local_addr().map_err(|e| e.to_string())).collect()
}

impl Cluster {
    /// Starts `config`'s servers; `clients` load generator threads will
    /// run beside them (busy mode pins the servers after them).
    pub(super) fn start(config: &Config, tag: &str, clients: usize) -> Result<Cluster, String> {
        // This very binary: /proc/self/exe still names it when a rebuild
        // replaces the file on disk during a long run.
        let exe = match Path::new("/proc/self/exe") {
            p if p.exists() => p.to_path_buf(),
            _ => std::env::current_exe().map_err(|e| format!("cannot find the ordo binary: {e}"))?,
        };
        let servers = free_ports(config.members)?;
        // Busy mode: SO_BUSY_POLL asked for (it acts on NAPI devices, not
        // on loopback, and is logged where refused). Pinned configurations
        // ([`super::pinned`]): each server on a CPU of its own after the
        // load generators' (`clients`).
        let busy_poll = config.busy.then_some(["--busy-poll-us", BUSY_POLL_US]);
        let first_cpu = super::pinned(config).then_some(clients);
        let idle = server_idle_flags(config).map(|(s, y)| (s.to_string(), y.to_string()));
        let peers: Vec<String> = servers.iter().map(|s| s.to_string()).collect();
        let data = config
            .fsync
            .then(|| std::env::temp_dir().join(format!("ordo-bench-r3p2-{}-{tag}", std::process::id())));
        let mut cluster =
            Cluster { children: Vec::new(), servers: servers.clone(), data: data.clone(), secret: None };
        // A fresh cluster secret per cluster (removed with it).
        let secret =
            std::env::temp_dir().join(format!("ordo-bench-r3p2-{}-{tag}.secret", std::process::id()));
        let _ = std::fs::remove_file(&secret);
        if config.replicated() && config.auth {
            ordo_runtime::Secret::generate_file(&secret).map_err(|e| e.to_string())?;
            cluster.secret = Some(secret.clone());
        }
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
                .args(idle.iter().flat_map(|(s, y)| ["--idle-spins", s, "--idle-yields", y]))
                .args(busy_poll.iter().flatten())
                .args(first_cpu.iter().flat_map(|first| ["--pin-cpu".to_string(), (first + id).to_string()]))
                .args((!config.syscall_batching).then_some("--no-syscall-batching"))
                .env("ORDO_LOG", "error")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            if !config.replicated() {
                command.arg("--unreplicated");
            } else if config.auth {
                command.arg("--secret-file").arg(&secret);
            } else {
                command.arg("--insecure");
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
pub(super) enum Arrivals {
    Poisson,
    Fixed,
}

/// What a generator thread does when nothing is due and no answer is
/// waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClientIdle {
    /// Spin (one core per generator thread).
    Spin,
    /// `sched_yield` (stays runnable).
    Yield,
    /// Block on the socket until an answer comes or [`PARK_EARLY`] before
    /// the next request is due ([`Client::wait_precise`], 1 µs timer
    /// slack), then spin until it is: the thread leaves its core while
    /// nothing happens, and its requests still leave on time.
    Park,
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
            "park" => Ok(ClientIdle::Park),
            _ => s
                .strip_prefix("sleep:")
                .and_then(|us| us.parse::<u64>().ok())
                .map(|us| ClientIdle::Sleep(Duration::from_micros(us.max(1))))
                .ok_or_else(|| format!("--client-idle: `{s}` is not spin, yield, park or sleep:<us>")),
        }
    }
}

/// How long before a request is due a parked generator thread wakes to
/// spin: more than a timed wake-up's lateness (50 µs and more on a VM).
pub(super) const PARK_EARLY: Duration = Duration::from_micros(200);

pub(super) fn idle_until(client: &mut Client, idle: ClientIdle, now_ns: u64, next_ns: u64) {
    match idle {
        ClientIdle::Spin => std::hint::spin_loop(),
        ClientIdle::Yield => std::thread::yield_now(),
        ClientIdle::Park => {
            // A timed wake-up comes late (about 50 µs on a VM, whatever
            // this thread's timer slack), an answer's wakes at once: park
            // until an answer or PARK_EARLY before the next request is
            // due, then spin, so requests leave on time.
            let gap = Duration::from_nanos(next_ns.saturating_sub(now_ns));
            match gap.checked_sub(PARK_EARLY) {
                Some(park) if !park.is_zero() => {
                    client.wait_precise(park);
                }
                _ => std::hint::spin_loop(),
            }
        }
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
pub(super) struct Timing {
    pub(super) warmup: Duration,
    pub(super) window: Duration,
    pub(super) timeout: Duration,
    pub(super) idle: ClientIdle,
    /// Pin generator thread `i` to CPU `i` (busy mode, where every thread
    /// has a core; the servers take the CPUs after the clients').
    pub(super) pin: bool,
}

/// splitmix64: the arrival process' randomness (no I/O, seeded per thread;
/// also spaces [`crate::limits::udp_round_trip`]'s pings).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The gap before the next of Poisson arrivals at `rate` per second, ns.
    pub(crate) fn poisson_gap_ns(&mut self, rate: f64) -> f64 {
        -self.next_f64().ln() * 1e9 / rate
    }

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
pub(super) struct Tally {
    pub(super) latency: Histogram<u64>,
    pub(super) requests: u64,
    pub(super) errors: u64,
    pub(super) sent: u64,
    pub(super) achieved: u64,
}

/// Runs one generator thread for one point: warm-up, window, drain (load
/// continues), then waits (without sending) for everything in flight.
pub(super) fn generate(
    client: &mut Client,
    policy: Policy,
    rate: f64,
    arrivals: Arrivals,
    timing: Timing,
    seed: u64,
) -> Tally {
    if matches!(timing.idle, ClientIdle::Sleep(_) | ClientIdle::Park) {
        // SAFETY: prctl with PR_SET_TIMERSLACK only sets this thread's timer
        // slack (default 50 µs) so short sleeps end on time.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64) };
    }
    let mut rng = Rng::new(seed);
    let mut gap_ns = || match arrivals {
        Arrivals::Fixed => 1e9 / rate,
        Arrivals::Poisson => rng.poisson_gap_ns(rate),
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

pub(super) fn new_client(servers: &[SocketAddr], id: u64, timeout: Duration) -> Result<Client, String> {
    let mut c = ClientConfig::new(servers.to_vec());
    c.client_id = Some(id);
    c.timeout = timeout;
    c.retries = 0;
    c.max_in_flight = 1 << 16;
    Client::new(c).map_err(|e| format!("client: {e}"))
}

/// Blocks until a request goes through (a leader is elected and known to
/// every client).
pub(super) fn wait_ready(clients: &mut [Client], policy: Policy) -> Result<(), String> {
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
pub(super) struct Sweep<'a> {
    pub(super) args: &'a BenchArgs,
    pub(super) timing: Timing,
    pub(super) arrivals: Arrivals,
    pub(super) start_rps: f64,
    pub(super) step: f64,
    pub(super) refine: u32,
}

pub(super) fn point(
    clients: &mut [Client],
    policy: Policy,
    offered: f64,
    sweep: &Sweep<'_>,
    seed: u64,
) -> (Tally, f64) {
    let k = clients.len();
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                let (timing, arrivals) = (sweep.timing, sweep.arrivals);
                s.spawn(move || {
                    if timing.pin
                        && let Err(e) = ordo_r2p2::pin_current_thread(i)
                    {
                        tracing::warn!(cpu = i, error = %e, "cannot pin the load generator");
                    }
                    generate(c, policy, offered / k as f64, arrivals, timing, seed + i as u64)
                })
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

pub(super) fn row_of(
    figure: &str,
    config: &Config,
    offered: f64,
    tally: &Tally,
    secs: f64,
    refined: bool,
) -> Row {
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
        attempt: 1,
        server_cpu_percent: 0.0,
        busiest_server_cpu_percent: 0.0,
        busiest_server_system_percent: 0.0,
        client_cpu_percent: 0.0,
        udp_rcvbuf_drops: 0,
        loadavg_1m: loadavg_1m(),
    }
}
