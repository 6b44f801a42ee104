//! `ordo bench dds`: spindle Fig. 18 — one publisher, 1..N subscribers,
//! every QoS level, the Spindle optimizations on and off (the baseline) —
//! and, in the same run, Cyclone DDS's `ddsperf` (Debian's
//! `cyclonedds-tools`: reliable, loopback, its `KS` type at the same size,
//! one publisher to the same subscriber counts).
//!
//! # Method
//! - Every participant is its own process, as with `ddsperf`: `ordo dds
//!   sub --until-publishers-leave --json` per subscriber, then `ordo dds pub
//!   --for-s S --json` (shm fabric; logged storage fsyncs, as users get it).
//!   A subscriber's throughput is its samples over the window between its
//!   first and last sample; a point's is the mean over its subscribers,
//!   and its latency (writer's clock to `take`, under full load) the
//!   median of theirs.
//! - `ddsperf -i D -D S pub size B` and N `ddsperf -i D sub` on a domain id
//!   of their own; a subscriber's throughput is the mean of its per-second
//!   `rate` lines after the first.
//! - **Round trips** (one sample in flight, light load): `ordo dds pong`
//!   echoing each sample of a `ping` topic from its delivery upcall on a
//!   `pong` topic, `ordo dds ping` timing each round trip (atomic
//!   multicast, 2 members), beside `ddsperf pong` and `ddsperf ping size
//!   B`; p50 and p99 per point, ordo / Cyclone as the median of per-round
//!   ratios.
//! - Compared points are measured interleaved: every round runs every point
//!   once (Spindle, baseline, Cyclone side by side), at least 3 rounds;
//!   each point is reported as median [min–max] over rounds and each ratio
//!   as median [min–max] of per-round ratios.
//! - **Contention**: the CPU time the machine spent outside this benchmark
//!   and its children during a point (user and system time from
//!   `/proc/stat`, less `getrusage` of this process and its children, less
//!   kernel threads — the journal and writeback work for logged storage's
//!   own fsyncs); a point where it exceeds 0.1 core is flagged and left out
//!   of medians and ratios.

use crate::experiment::Experiment;
use crate::machine::MachineInfo;
use crate::noise::Spread;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `ordo bench dds` arguments.
#[derive(Args, Clone, Debug)]
pub struct DdsArgs {
    /// Reduced run (10 KiB only, 1.5 s per point).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Seconds of publishing per point (default 3; 1.5 with --quick).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Subscriber counts.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub subscribers: Vec<usize>,
    /// Sample sizes in bytes (default 10240,128; 10240 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// QoS levels (default all four).
    #[arg(long, value_delimiter = ',')]
    pub qos: Option<Vec<String>>,
    /// Interleaved rounds (at least 3 for ratios).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Leave Cyclone DDS out.
    #[arg(long)]
    pub no_cyclone: bool,
    /// Logged storage without fsync (page cache only).
    #[arg(long)]
    pub no_fsync: bool,
    /// Leave out the round-trip points (`ordo dds ping|pong` beside
    /// `ddsperf ping|pong`).
    #[arg(long)]
    pub no_latency: bool,
    /// Only the round-trip points.
    #[arg(long)]
    pub no_throughput: bool,
    /// Directory for report.json and dds.csv.
    #[arg(long, default_value = "bench-results/dds")]
    pub out: PathBuf,
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// `ordo` or `cyclone`.
    pub system: String,
    /// QoS level (ordo) or `reliable` (cyclone).
    pub qos: String,
    /// `spindle` or `baseline` (ordo); `-` (cyclone).
    pub switches: String,
    /// Sample bytes.
    pub size: usize,
    /// Subscribers.
    pub subscribers: usize,
    /// Round.
    pub round: usize,
    /// Samples per second per subscriber (mean over subscribers).
    pub samples_per_s: f64,
    /// Bytes per second per subscriber.
    pub bytes_per_s: f64,
    /// Median over subscribers of their p50 latency under load (µs; ordo).
    pub p50_us: Option<f64>,
    /// Median over subscribers of their p99 latency under load (µs; ordo).
    pub p99_us: Option<f64>,
    /// CPU the rest of the machine used during the point, in cores.
    pub foreign_cores: f64,
    /// Flagged: left out of medians and ratios.
    pub contended: bool,
}

/// One round-trip measurement (ping → echo, one at a time).
#[derive(Clone, Debug, Serialize)]
pub struct RttRun {
    /// `ordo` (atomic multicast) or `cyclone` (reliable).
    pub system: String,
    /// Sample bytes.
    pub size: usize,
    /// Round.
    pub round: usize,
    /// Round trip p50 (µs).
    pub p50_us: f64,
    /// Round trip p99 (µs).
    pub p99_us: f64,
    /// CPU the rest of the machine used during the point, in cores.
    pub foreign_cores: f64,
    /// Flagged: left out of medians and ratios.
    pub contended: bool,
}

/// Median [min–max] of a point over its clean rounds.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// As in [`Run`].
    pub system: String,
    /// As in [`Run`].
    pub qos: String,
    /// As in [`Run`].
    pub switches: String,
    /// As in [`Run`].
    pub size: usize,
    /// As in [`Run`].
    pub subscribers: usize,
    /// Median, min, max samples/s per subscriber (clean rounds).
    pub samples_per_s: Option<Spread>,
    /// Median bytes/s per subscriber.
    pub bytes_per_s: Option<f64>,
    /// Median p50 / p99 (µs).
    pub latency_us: Option<[f64; 2]>,
    /// Clean rounds.
    pub clean: usize,
}

/// A ratio of two points: median [min–max] of per-round ratios.
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    /// What is compared.
    pub what: String,
    /// Median, min, max (None: no round where both were clean).
    pub ratio: Option<Spread>,
}

/// The whole result.
#[derive(Clone, Debug, Serialize)]
pub struct DdsReport {
    /// The machine.
    pub machine: MachineInfo,
    /// Seconds per point.
    pub seconds: f64,
    /// Every run.
    pub runs: Vec<Run>,
    /// Per point.
    pub points: Vec<Point>,
    /// Spindle / baseline per QoS, size, subscribers; ordo atomic multicast
    /// / Cyclone per size and subscribers.
    pub ratios: Vec<Ratio>,
    /// Why Cyclone is missing, if it is.
    pub cyclone_missing: Option<String>,
    /// Round trips (one sample in flight): every run.
    pub rtt: Vec<RttRun>,
    /// Per system and size: median p50 and p99 (µs) of clean rounds.
    pub rtt_summary: Vec<(String, usize, f64, f64)>,
    /// ordo p50 / Cyclone p50 per size: median [min–max] of rounds.
    pub rtt_ratios: Vec<Ratio>,
}

/// `ordo bench dds`.
pub struct DdsBench {
    args: DdsArgs,
    exe: PathBuf,
}

impl DdsBench {
    /// The benchmark, running participants as processes of `exe` (`ordo`).
    pub fn new(args: DdsArgs, exe: PathBuf) -> DdsBench {
        DdsBench { args, exe }
    }

    fn seconds(&self) -> f64 {
        self.args.seconds.unwrap_or(if self.args.quick { 1.5 } else { 3.0 })
    }

    fn sizes(&self) -> Vec<usize> {
        self.args.sizes.clone().unwrap_or(if self.args.quick { vec![10240] } else { vec![10240, 128] })
    }
}

/// Jiffies the machine spent in user and system mode (interrupts, steal
/// and idle left out).
fn cpu_jiffies() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else { return 0 };
    line.split_whitespace().skip(1).take(3).filter_map(|x| x.parse::<u64>().ok()).sum()
}

/// Jiffies of every kernel thread (file-system journal, writeback,
/// workers): work done for the benchmark's own fsyncs and I/O, not load
/// from elsewhere.
fn kernel_thread_jiffies() -> u64 {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    let mut sum = 0;
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After the command: state ppid pgrp session tty tpgid flags(6) ... utime(11) stime(12).
        let flags: u64 = f.get(6).and_then(|x| x.parse().ok()).unwrap_or(0);
        if flags & PF_KTHREAD != 0 {
            let t = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            sum += t(11) + t(12);
        }
    }
    sum
}

/// CPU seconds of this process and its waited-for children.
fn own_cpu_s() -> f64 {
    let mut s = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage writes one rusage struct.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(who, &mut r) } == 0 {
            let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
            s += t(r.ru_utime) + t(r.ru_stime);
        }
    }
    s
}

/// Measures the foreign CPU (cores) used while `f` runs.
fn with_foreign<T>(f: impl FnOnce() -> T) -> (T, f64) {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (b0, k0) = (cpu_jiffies(), kernel_thread_jiffies());
    let c0 = own_cpu_s();
    let t0 = Instant::now();
    let out = f();
    let (b1, k1) = (cpu_jiffies(), kernel_thread_jiffies());
    let c1 = own_cpu_s();
    let secs = t0.elapsed().as_secs_f64().max(1e-3);
    let busy = b1.saturating_sub(b0).saturating_sub(k1.saturating_sub(k0)) as f64 / hz;
    let foreign = (busy - (c1 - c0)).max(0.0) / secs;
    (out, foreign)
}

/// Kills children left behind (a failed point).
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16, String> {
    ordo_runtime::unused_local_port().map_err(|e| format!("no free port: {e}"))
}

fn last_json(out: &[u8]) -> Result<serde_json::Value, String> {
    let text = String::from_utf8_lossy(out);
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .ok_or_else(|| format!("no summary line in: {}", text.chars().take(400).collect::<String>()))
}

fn median(v: &[f64]) -> Option<f64> {
    Spread::of(v).map(|s| s.median)
}

/// Median [min–max] of per-round ratios x / y, over the rounds where both
/// sides were measured and neither was contended.
fn round_ratios(rounds: usize, pair: impl Fn(usize) -> Option<((f64, bool), (f64, bool))>) -> Option<Spread> {
    let v: Vec<f64> = (0..rounds)
        .filter_map(pair)
        .filter(|((_, cx), (y, cy))| !cx && !cy && *y > 0.0)
        .map(|((x, _), (y, _))| x / y)
        .collect();
    Spread::of(&v)
}

struct OrdoPoint<'a> {
    qos: &'a str,
    spindle: bool,
    size: usize,
    subscribers: usize,
}

impl DdsBench {
    fn config(&self, p: &OrdoPoint<'_>, dir: &Path, cluster: &str) -> Result<PathBuf, String> {
        let n = p.subscribers + 1;
        let members: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let mut control = Vec::new();
        for i in 0..n {
            control.push(format!("{{ id = {i}, addr = \"127.0.0.1:{}\" }}", free_port()?));
        }
        let switches = if p.spindle {
            ""
        } else {
            "[vsync.switches]\nsend_batching = false\nreceive_batching = false\ndelivery_batching = false\nnull_sends = false\npost_after_unlock = false\nlock_free_send = false\nbatched_upcall = false\nzero_copy = false\nstamped_slots = false\n"
        };
        let text = format!(
            "[group]\nmembers = [{}]\n[fabric.shm]\ncluster = \"{cluster}\"\n[security]\nsecret_file = \"{}\"\n[node]\ncontrol = [{}]\n{switches}[dds]\ndata_dir = \"{}\"\nfsync = {}\n[[dds.topics]]\nname = \"t\"\nqos = \"{}\"\npublishers = [0]\nsubscribers = [{}]\nmax_sample = {}\nwindow = 100\nhistory = 1000\n",
            members.join(", "),
            dir.join("secret").display(),
            control.join(", "),
            dir.join("data").display(),
            !self.args.no_fsync,
            p.qos,
            members[1..].join(", "),
            p.size,
        );
        let path = dir.join(format!("{cluster}.toml"));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    fn run_ordo(&self, p: &OrdoPoint<'_>, dir: &Path, k: usize) -> Result<(f64, f64, f64, f64), String> {
        let cluster = format!("bdds-{}-{k}", std::process::id());
        let config = self.config(p, dir, &cluster)?;
        let secs = self.seconds();
        let mut kids = Kids(Vec::new());
        for i in 1..=p.subscribers {
            let c = Command::new(&self.exe)
                .args(["dds", "sub", "--topic", "t", "--until-publishers-leave", "--json", "--for-s"])
                .arg(format!("{}", secs + 60.0))
                .arg("-c")
                .arg(&config)
                .args(["--set", &format!("member.id={i}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting a subscriber: {e}"))?;
            kids.0.push(c);
        }
        let publisher = Command::new(&self.exe)
            .args(["dds", "pub", "--topic", "t", "--json", "--size", &p.size.to_string(), "--for-s"])
            .arg(format!("{secs}"))
            .arg("-c")
            .arg(&config)
            .args(["--set", "member.id=0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the publisher: {e}"))?;
        kids.0.insert(0, publisher);
        let mut outs = Vec::new();
        for c in std::mem::take(&mut kids.0) {
            let o = c.wait_with_output().map_err(|e| e.to_string())?;
            outs.push(o);
        }
        ordo_runtime::node::remove_view_files(Path::new("/dev/shm"), &cluster);
        let _ = std::fs::remove_dir_all(dir.join("data"));
        let _ = std::fs::remove_file(&config);
        let (mut rates, mut bytes, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, o) in outs.iter().enumerate() {
            let v = last_json(&o.stdout).map_err(|e| {
                format!(
                    "{} {i}: {e}; stderr: {}",
                    if i == 0 { "publisher" } else { "subscriber" },
                    String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
                )
            })?;
            if i == 0 {
                continue;
            }
            let w = v["window_secs"].as_f64().unwrap_or(0.0).max(1e-6);
            rates.push(v["samples"].as_f64().unwrap_or(0.0) / w);
            bytes.push(v["bytes"].as_f64().unwrap_or(0.0) / w);
            p50.push(v["p50_us"].as_f64().unwrap_or(0.0));
            p99.push(v["p99_us"].as_f64().unwrap_or(0.0));
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        Ok((mean(&rates), mean(&bytes), median(&p50).unwrap_or(0.0), median(&p99).unwrap_or(0.0)))
    }

    fn run_cyclone(&self, size: usize, subscribers: usize, k: usize) -> Result<(f64, f64), String> {
        let secs = self.seconds().ceil().max(2.0) as u64 + 1;
        let domain = (std::process::id() as usize * 7 + k) % 200 + 20;
        let mut kids = Kids(Vec::new());
        for _ in 0..subscribers {
            kids.0.push(
                Command::new("ddsperf")
                    .args(["-i", &domain.to_string(), "-D", &(secs + 1).to_string(), "sub"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("ddsperf: {e}"))?,
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        let publisher = Command::new("ddsperf")
            .args(["-i", &domain.to_string(), "-D", &secs.to_string(), "pub", "size", &size.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("ddsperf: {e}"))?;
        kids.0.insert(0, publisher);
        let mut rates = Vec::new();
        for (i, c) in std::mem::take(&mut kids.0).into_iter().enumerate() {
            let o = c.wait_with_output().map_err(|e| e.to_string())?;
            if i == 0 {
                continue;
            }
            // "[pid] 2.000  size 10240 total N lost 0 delta N lost 0 rate 108.33 kS/s 8874.55 Mb/s (...)"
            let per_s: Vec<f64> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.contains(" size ") && l.contains(" rate "))
                .filter_map(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    let at = w.iter().position(|x| *x == "rate")?;
                    let v: f64 = w.get(at + 1)?.parse().ok()?;
                    Some(if w.get(at + 2) == Some(&"kS/s") { v * 1e3 } else { v })
                })
                .collect();
            // Drop the first second (matching, ramp-up) and a trailing partial one.
            let steady: Vec<f64> =
                per_s.iter().skip(1).take(per_s.len().saturating_sub(2).max(1)).copied().collect();
            if steady.is_empty() {
                return Err("ddsperf sub printed no rate lines".into());
            }
            rates.push(steady.iter().sum::<f64>() / steady.len() as f64);
        }
        let r = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        Ok((r, r * size as f64))
    }
}

impl DdsBench {
    /// `ordo dds pong` as member 1, `ordo dds ping` as member 0: (p50, p99).
    fn run_ordo_rtt(&self, size: usize, dir: &Path, k: usize) -> Result<(f64, f64), String> {
        let cluster = format!("bddsrtt-{}-{k}", std::process::id());
        let control = [free_port()?, free_port()?];
        let text = format!(
            "[group]\nmembers = [0, 1]\n[fabric.shm]\ncluster = \"{cluster}\"\n[security]\nsecret_file = \"{}\"\n[node]\ncontrol = [{{ id = 0, addr = \"127.0.0.1:{}\" }}, {{ id = 1, addr = \"127.0.0.1:{}\" }}]\n[dds]\ndata_dir = \"{}\"\n[[dds.topics]]\nname = \"ping\"\npublishers = [0]\nsubscribers = [1]\nmax_sample = {size}\n[[dds.topics]]\nname = \"pong\"\npublishers = [1]\nsubscribers = [0]\nmax_sample = {size}\n",
            dir.join("secret").display(),
            control[0],
            control[1],
            dir.join("data").display(),
        );
        let config = dir.join(format!("{cluster}.toml"));
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        let count = if self.args.quick { 3000 } else { 10_000 };
        let mut kids = Kids(Vec::new());
        kids.0.push(
            Command::new(&self.exe)
                .args(["dds", "pong", "--topic", "ping", "--reply-topic", "pong", "--for-s", "120", "-c"])
                .arg(&config)
                .args(["--set", "member.id=1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("starting pong: {e}"))?,
        );
        let ping = Command::new(&self.exe)
            .args([
                "dds",
                "ping",
                "--topic",
                "ping",
                "--reply-topic",
                "pong",
                "--json",
                "--size",
                &size.to_string(),
            ])
            .args(["--count", &count.to_string(), "-c"])
            .arg(&config)
            .args(["--set", "member.id=0"])
            .output()
            .map_err(|e| format!("ping: {e}"))?;
        for c in std::mem::take(&mut kids.0) {
            let _ = c.wait_with_output();
        }
        ordo_runtime::node::remove_view_files(Path::new("/dev/shm"), &cluster);
        let _ = std::fs::remove_file(&config);
        let v = last_json(&ping.stdout).map_err(|e| {
            format!("ping: {e}; {}", String::from_utf8_lossy(&ping.stderr).lines().last().unwrap_or(""))
        })?;
        Ok((v["p50_us"].as_f64().unwrap_or(0.0), v["p99_us"].as_f64().unwrap_or(0.0)))
    }

    /// `ddsperf pong` and `ddsperf ping size S`: (p50, p99), the medians of
    /// its per-second round-trip lines after the first.
    fn run_cyclone_rtt(&self, size: usize, k: usize) -> Result<(f64, f64), String> {
        let secs: u64 = if self.args.quick { 2 } else { 4 };
        let domain = (std::process::id() as usize * 7 + k) % 200 + 20;
        let mut kids = Kids(Vec::new());
        kids.0.push(
            Command::new("ddsperf")
                .args(["-i", &domain.to_string(), "-D", &(secs + 2).to_string(), "pong"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("ddsperf: {e}"))?,
        );
        std::thread::sleep(Duration::from_millis(300));
        let o = Command::new("ddsperf")
            .args(["-i", &domain.to_string(), "-D", &secs.to_string(), "ping", "size", &size.to_string()])
            .output()
            .map_err(|e| format!("ddsperf: {e}"))?;
        drop(kids);
        // "[pid] 2.000  host:pid size 10240 mean 21.7us min 8.2us 50% 23.1us 90% 24.2us 99% 37.2us max 703us cnt N"
        let field = |l: &str, name: &str| -> Option<f64> {
            let w: Vec<&str> = l.split_whitespace().collect();
            let at = w.iter().position(|x| *x == name)?;
            w.get(at + 1)?.trim_end_matches("us").parse().ok()
        };
        let lines: Vec<(f64, f64)> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains(" mean ") && l.contains(" 50% "))
            .filter_map(|l| Some((field(l, "50%")?, field(l, "99%")?)))
            .collect();
        let steady: Vec<(f64, f64)> = lines.iter().skip(usize::from(lines.len() > 1)).copied().collect();
        if steady.is_empty() {
            return Err("ddsperf ping printed no round-trip lines".into());
        }
        Ok((
            median(&steady.iter().map(|x| x.0).collect::<Vec<_>>()).unwrap_or(0.0),
            median(&steady.iter().map(|x| x.1).collect::<Vec<_>>()).unwrap_or(0.0),
        ))
    }
}

fn show_ratio(s: Spread) -> String {
    s.show(|v| format!("{v:.2}×"))
}

/// How much foreign load flags a point.
pub const MAX_FOREIGN_CORES: f64 = 0.1;

fn key(r: &Run) -> (String, String, String, usize, usize) {
    (r.system.clone(), r.qos.clone(), r.switches.clone(), r.size, r.subscribers)
}

impl Experiment for DdsBench {
    type Report = DdsReport;

    fn name(&self) -> &'static str {
        "dds"
    }

    fn out_dir(&self) -> Option<&Path> {
        Some(&self.args.out)
    }

    fn write_files(&self, r: &DdsReport, dir: &Path) -> Result<(), String> {
        use crate::experiment::Csv;
        let mut csv = Csv::new(&[
            "system",
            "qos",
            "switches",
            "size",
            "subscribers",
            "round",
            "samples_per_s",
            "bytes_per_s",
            "p50_us",
            "p99_us",
            "foreign_cores",
            "contended",
        ]);
        for x in &r.runs {
            csv.row([
                x.system.clone(),
                x.qos.clone(),
                x.switches.clone(),
                x.size.to_string(),
                x.subscribers.to_string(),
                x.round.to_string(),
                format!("{:.1}", x.samples_per_s),
                format!("{:.1}", x.bytes_per_s),
                Csv::opt(x.p50_us.map(|v| format!("{v:.1}"))),
                Csv::opt(x.p99_us.map(|v| format!("{v:.1}"))),
                format!("{:.3}", x.foreign_cores),
                x.contended.to_string(),
            ]);
        }
        crate::experiment::write(&dir.join("dds.csv"), csv.text())?;
        let mut rtt =
            Csv::new(&["system", "size", "round", "p50_us", "p99_us", "foreign_cores", "contended"]);
        for x in &r.rtt {
            rtt.row([
                x.system.clone(),
                x.size.to_string(),
                x.round.to_string(),
                format!("{:.1}", x.p50_us),
                format!("{:.1}", x.p99_us),
                format!("{:.3}", x.foreign_cores),
                x.contended.to_string(),
            ]);
        }
        crate::experiment::write(&dir.join("rtt.csv"), rtt.text())
    }

    fn measure(&self, progress: &mut dyn FnMut(&str)) -> Result<DdsReport, String> {
        let qos: Vec<String> =
            self.args.qos.clone().unwrap_or_else(|| {
                ordo_runtime::QosLevel::ALL.iter().map(|q| q.name().to_string()).collect()
            });
        for q in &qos {
            q.parse::<ordo_runtime::QosLevel>()?;
        }
        let cyclone_missing = if self.args.no_cyclone {
            Some("--no-cyclone".to_string())
        } else if Command::new("ddsperf")
            .arg("help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            Some("ddsperf not found (apt-get install cyclonedds-tools)".to_string())
        } else {
            None
        };
        let dir = std::env::temp_dir().join(format!("ordo-bench-dds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(dir.join("secret"));
        ordo_auth::Secret::generate_file(&dir.join("secret")).map_err(|e| e.to_string())?;
        let mut runs = Vec::new();
        let mut k = 0;
        for round in 0..if self.args.no_throughput { 0 } else { self.args.rounds.max(1) } {
            for &size in &self.sizes() {
                for &subscribers in &self.args.subscribers {
                    for q in &qos {
                        for spindle in [true, false] {
                            k += 1;
                            let p = OrdoPoint { qos: q, spindle, size, subscribers };
                            let (r, foreign) = with_foreign(|| self.run_ordo(&p, &dir, k));
                            let (rate, bytes, p50, p99) = r?;
                            let sw = if spindle { "spindle" } else { "baseline" };
                            progress(&format!(
                                "round {round} ordo {q} {sw} {size} B 1→{subscribers}: {:.1} kS/s/subscriber, {:.2} GB/s, p50 {p50:.0} µs p99 {p99:.0} µs (foreign {foreign:.2} cores)",
                                rate / 1e3,
                                bytes / 1e9
                            ));
                            runs.push(Run {
                                system: "ordo".into(),
                                qos: q.clone(),
                                switches: sw.into(),
                                size,
                                subscribers,
                                round,
                                samples_per_s: rate,
                                bytes_per_s: bytes,
                                p50_us: Some(p50),
                                p99_us: Some(p99),
                                foreign_cores: foreign,
                                contended: foreign > MAX_FOREIGN_CORES,
                            });
                        }
                    }
                    if cyclone_missing.is_none() {
                        k += 1;
                        let (r, foreign) = with_foreign(|| self.run_cyclone(size, subscribers, k));
                        let (rate, bytes) = r?;
                        progress(&format!(
                            "round {round} cyclone reliable {size} B 1→{subscribers}: {:.1} kS/s/subscriber, {:.2} GB/s (foreign {foreign:.2} cores)",
                            rate / 1e3,
                            bytes / 1e9
                        ));
                        runs.push(Run {
                            system: "cyclone".into(),
                            qos: "reliable".into(),
                            switches: "-".into(),
                            size,
                            subscribers,
                            round,
                            samples_per_s: rate,
                            bytes_per_s: bytes,
                            p50_us: None,
                            p99_us: None,
                            foreign_cores: foreign,
                            contended: foreign > MAX_FOREIGN_CORES,
                        });
                    }
                }
            }
        }
        let mut rtt = Vec::new();
        if !self.args.no_latency {
            for round in 0..self.args.rounds.max(1) {
                for &size in &self.sizes() {
                    for system in ["ordo", "cyclone"] {
                        if system == "cyclone" && cyclone_missing.is_some() {
                            continue;
                        }
                        k += 1;
                        let (r, foreign) = with_foreign(|| match system {
                            "ordo" => self.run_ordo_rtt(size, &dir, k),
                            _ => self.run_cyclone_rtt(size, k),
                        });
                        // A failed round-trip point is reported and skipped.
                        let (p50, p99) = match r {
                            Ok(x) => x,
                            Err(e) => {
                                progress(&format!("round {round} {system} round trip {size} B failed: {e}"));
                                continue;
                            }
                        };
                        progress(&format!(
                            "round {round} {system} round trip {size} B: p50 {p50:.1} µs p99 {p99:.1} µs (foreign {foreign:.2} cores)"
                        ));
                        rtt.push(RttRun {
                            system: system.into(),
                            size,
                            round,
                            p50_us: p50,
                            p99_us: p99,
                            foreign_cores: foreign,
                            contended: foreign > MAX_FOREIGN_CORES,
                        });
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        let mut rtt_summary = Vec::new();
        let mut rtt_ratios = Vec::new();
        for &size in &self.sizes() {
            for sys in ["ordo", "cyclone"] {
                let clean: Vec<&RttRun> =
                    rtt.iter().filter(|r| r.system == sys && r.size == size && !r.contended).collect();
                let p50: Vec<f64> = clean.iter().map(|r| r.p50_us).collect();
                let p99: Vec<f64> = clean.iter().map(|r| r.p99_us).collect();
                if let (Some(a), Some(b)) = (median(&p50), median(&p99)) {
                    rtt_summary.push((sys.to_string(), size, a, b));
                }
            }
            let find = |sys: &str, round: usize| {
                rtt.iter()
                    .find(|r| r.system == sys && r.size == size && r.round == round)
                    .map(|r| (r.p50_us, r.contended))
            };
            let ratio = round_ratios(self.args.rounds.max(1), |round| {
                Some((find("ordo", round)?, find("cyclone", round)?))
            });
            if ratio.is_some() {
                rtt_ratios.push(Ratio { what: format!("round trip p50 {size} B: ordo / cyclone"), ratio });
            }
        }
        // Points.
        let mut keys: Vec<_> = runs.iter().map(key).collect();
        keys.dedup();
        keys.sort();
        keys.dedup();
        let points: Vec<Point> = keys
            .iter()
            .map(|k| {
                let clean: Vec<&Run> = runs.iter().filter(|r| key(r) == *k && !r.contended).collect();
                let of =
                    |f: &dyn Fn(&Run) -> Option<f64>| clean.iter().filter_map(|r| f(r)).collect::<Vec<f64>>();
                let spread = Spread::of(&of(&|r| Some(r.samples_per_s)));
                let lat = match (median(&of(&|r| r.p50_us)), median(&of(&|r| r.p99_us))) {
                    (Some(a), Some(b)) => Some([a, b]),
                    _ => None,
                };
                Point {
                    system: k.0.clone(),
                    qos: k.1.clone(),
                    switches: k.2.clone(),
                    size: k.3,
                    subscribers: k.4,
                    samples_per_s: spread,
                    bytes_per_s: median(&of(&|r| Some(r.bytes_per_s))),
                    latency_us: lat,
                    clean: clean.len(),
                }
            })
            .collect();
        // Ratios of per-round pairs.
        let ratio = |what: String, a: &dyn Fn(&Run) -> bool, b: &dyn Fn(&Run) -> bool| {
            let find = |round: usize, side: &dyn Fn(&Run) -> bool| {
                runs.iter().find(|r| r.round == round && side(r)).map(|r| (r.samples_per_s, r.contended))
            };
            Ratio {
                what,
                ratio: round_ratios(self.args.rounds.max(1), |round| {
                    Some((find(round, a)?, find(round, b)?))
                }),
            }
        };
        let mut ratios = Vec::new();
        let sizes = if runs.is_empty() { Vec::new() } else { self.sizes() };
        for &size in &sizes {
            for &subs in &self.args.subscribers {
                for q in &qos {
                    ratios.push(ratio(
                        format!("{q} {size} B 1→{subs}: spindle / baseline"),
                        &|r| {
                            r.system == "ordo"
                                && r.qos == *q
                                && r.switches == "spindle"
                                && r.size == size
                                && r.subscribers == subs
                        },
                        &|r| {
                            r.system == "ordo"
                                && r.qos == *q
                                && r.switches == "baseline"
                                && r.size == size
                                && r.subscribers == subs
                        },
                    ));
                }
                if cyclone_missing.is_none() {
                    ratios.push(ratio(
                        format!("atomic-multicast {size} B 1→{subs}: ordo (total order) / cyclone reliable"),
                        &|r| {
                            r.system == "ordo"
                                && r.qos == "atomic-multicast"
                                && r.switches == "spindle"
                                && r.size == size
                                && r.subscribers == subs
                        },
                        &|r| r.system == "cyclone" && r.size == size && r.subscribers == subs,
                    ));
                }
            }
        }
        Ok(DdsReport {
            machine: MachineInfo::current(),
            seconds: self.seconds(),
            runs,
            points,
            ratios,
            cyclone_missing,
            rtt,
            rtt_summary,
            rtt_ratios,
        })
    }

    fn print_table(&self, r: &DdsReport) {
        println!("ordo bench dds — {} ({} s per point)", r.machine.summary(), r.seconds);
        println!(
            "{:<8} {:<17} {:<9} {:>6} {:>4} {:>28} {:>9} {:>16} {:>6}",
            "system",
            "qos",
            "switches",
            "size",
            "subs",
            "kS/s per subscriber [min–max]",
            "GB/s",
            "p50/p99 µs",
            "clean"
        );
        for p in &r.points {
            println!(
                "{:<8} {:<17} {:<9} {:>6} {:>4} {:>28} {:>9} {:>16} {:>6}",
                p.system,
                p.qos,
                p.switches,
                p.size,
                p.subscribers,
                p.samples_per_s.map_or("contended".into(), |s| s.show(|v| format!("{:.1}", v / 1e3))),
                p.bytes_per_s.map_or("-".into(), |b| format!("{:.2}", b / 1e9)),
                p.latency_us.map_or("-".into(), |[a, b]| format!("{a:.0}/{b:.0}")),
                p.clean
            );
        }
        println!();
        for x in &r.ratios {
            println!("{:<75} {}", x.what, x.ratio.map_or("no clean pair".into(), show_ratio));
        }
        if !r.rtt_summary.is_empty() {
            println!();
            println!(
                "round trips, one sample in flight (ordo: atomic multicast, ping and pong topics; cyclone: ddsperf ping/pong):"
            );
            for (sys, size, p50, p99) in &r.rtt_summary {
                println!("{sys:<8} {size:>6} B  p50 {p50:>8.1} µs  p99 {p99:>8.1} µs");
            }
            for x in &r.rtt_ratios {
                println!("{:<75} {}", x.what, x.ratio.map_or("no clean pair".into(), show_ratio));
            }
        }
        if let Some(why) = &r.cyclone_missing {
            println!("Cyclone DDS left out: {why}");
        }
        let flagged =
            r.runs.iter().filter(|x| x.contended).count() + r.rtt.iter().filter(|x| x.contended).count();
        println!(
            "{flagged} of {} runs contended (foreign load above {MAX_FOREIGN_CORES} core) and left out",
            r.runs.len() + r.rtt.len()
        );
    }
}
