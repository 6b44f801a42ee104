//! `ordo bench failover`: how long a vsync group of `ordo node` daemons
//! takes from a SIGKILL of one member to the survivors' new view, over many
//! kills, per group size and fabric; and the delivered throughput of a
//! survivor across one kill.
//!
//! For each point (fabric × members) and each kill: a fresh local cluster
//! (one daemon process per member, every member sending at `--rate`), a
//! wait until every member delivers, a SIGKILL of member `k mod n` (so the
//! view leader, member 0, is among the victims), then the survivors'
//! status until all run the new view. The daemons stamp the wall clock at
//! their wedge and at the install; the benchmark stamps it at the kill, so
//! the three intervals — kill → first wedge (detection), wedge → last
//! install (the protocol), kill → last install (what a user sees) — come
//! from one clock.
//!
//! What detects the death is stated per fabric: shm checks each peer's
//! process every `fabric.shm.liveness_check_us` (1 ms) on every poll; tcp
//! sees the connection reset at once; missed heartbeats (2 × `node.patience`
//! ticks, 80 ms here) catch what neither does.

use crate::experiment::{Csv, Experiment, write};
use crate::machine::MachineInfo;
use crate::plot::{Panel, Series, write_png};
use ordo_runtime::node::{
    LocalCluster, NodeStatus, fetch_status, free_base_port, remove_view_files, unix_ns,
};
use ordo_runtime::{Backend, OrdoConfig, Secret};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `ordo bench failover` arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct FailoverArgs {
    /// Reduced run: 5 kills per point.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Kills per point (default 20; 5 with --quick).
    #[arg(long)]
    pub kills: Option<usize>,
    /// Group sizes.
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    pub members: Vec<u32>,
    /// Fabrics (shm, tcp).
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp")]
    pub backend: Vec<String>,
    /// Messages per second each member sends.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Directory for the CSV files and the PNG plot.
    #[arg(long, default_value = "bench-results/failover")]
    pub out: PathBuf,
}

/// One kill.
#[derive(Clone, Debug, Serialize)]
pub struct Kill {
    /// The member killed.
    pub victim: u32,
    /// Kill → first survivor wedged, ms.
    pub detect_ms: f64,
    /// First wedge → last survivor installed, ms.
    pub protocol_ms: f64,
    /// Kill → last survivor installed the new view, ms.
    pub total_ms: f64,
}

/// One point: a fabric and a group size.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// shm or tcp.
    pub backend: String,
    /// Members before the kill.
    pub members: u32,
    /// Every kill.
    pub kills: Vec<Kill>,
    /// kill → new view: p50, p99, min, max (ms).
    pub total_ms: [f64; 4],
    /// kill → wedge, p50 and p99 (ms).
    pub detect_ms: [f64; 2],
    /// wedge → installed, p50 and p99 (ms).
    pub protocol_ms: [f64; 2],
    /// Kills whose view change did not finish within 10 s.
    pub failed: usize,
}

/// A survivor's delivered throughput around a kill.
#[derive(Clone, Debug, Serialize)]
pub struct Dip {
    /// shm or tcp.
    pub backend: String,
    /// Members before the kill.
    pub members: u32,
    /// (ms since the kill, messages/s delivered at the survivor).
    pub samples: Vec<(f64, f64)>,
}

/// The whole result.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverReport {
    /// Where it ran.
    pub machine: MachineInfo,
    /// Per point.
    pub points: Vec<Point>,
    /// One dip per point (its first kill).
    pub dips: Vec<Dip>,
    /// Heartbeat tick (ms) the daemons ran with.
    pub tick_ms: u64,
}

/// The benchmark.
pub struct Failover {
    args: FailoverArgs,
    exe: PathBuf,
}

impl Failover {
    /// The benchmark with `args`, spawning daemons with `exe` (the `ordo`
    /// binary).
    pub fn new(args: FailoverArgs, exe: PathBuf) -> Failover {
        Failover { args, exe }
    }
}

const TICK_MS: u64 = 10;

/// A kill's result (None: no new view within 10 s) and, when asked, the
/// survivor's throughput samples around it.
type KillOutcome = (Option<Kill>, Option<Vec<(f64, f64)>>);

struct Running {
    children: Vec<Option<Child>>,
    local: LocalCluster,
    status: Vec<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_view_files(Path::new("/dev/shm"), &self.local.cluster);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

impl Failover {
    fn start(&self, backend: Backend, n: u32, dir: &Path, k: usize) -> Result<Running, String> {
        let local = LocalCluster {
            members: n,
            backend,
            dir: dir.to_path_buf(),
            base_port: free_base_port(n).ok_or("no free ports for a cluster")?,
            cluster: format!("failover-{}-{k}", std::process::id()),
            rate: self.args.rate,
            message_bytes: self.args.size,
            delivery_log: false,
        };
        let mut base = OrdoConfig::default();
        base.node.tick_ms = TICK_MS;
        let mut children = Vec::new();
        let mut status = Vec::new();
        let mut running = Running { children: Vec::new(), local: local.clone(), status: Vec::new() };
        for id in 0..n {
            let c = local.member_config(&base, id);
            c.validate_node_daemon().map_err(|e| e.to_string())?;
            let path = dir.join(format!("node-{id}.toml"));
            write(&path, &c.to_toml_string())?;
            status.push(c.node.status.clone().expect("a status address"));
            let log = std::fs::File::create(dir.join(format!("node-{id}.log"))).map_err(|e| e.to_string())?;
            let child = Command::new(&self.exe)
                .args(["node", "--config"])
                .arg(&path)
                .env("ORDO_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| format!("spawning a daemon: {e}"))?;
            children.push(Some(child));
        }
        running.children = children;
        running.status = status;
        // Every member runs and delivers.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let all: Vec<Option<NodeStatus>> = running.status.iter().map(|a| fetch_status(a).ok()).collect();
            let delivering = all.iter().all(|s| {
                s.as_ref().is_some_and(|s| {
                    s.state == "running"
                        && s.subgroups.iter().map(|g| g.delivered_messages).sum::<u64>() > 100
                })
            });
            if delivering {
                return Ok(running);
            }
            if Instant::now() > deadline {
                return Err(format!("the cluster did not come up; see {}/node-*.log", dir.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One kill; with `dip`, samples survivor throughput around it.
    fn kill_once(
        &self,
        backend: Backend,
        n: u32,
        k: usize,
        dir: &Path,
        dip: bool,
    ) -> Result<KillOutcome, String> {
        let mut running = self.start(backend, n, dir, k)?;
        let victim = (k as u32) % n;
        let survivor = (victim + 1) % n;
        let delivered = |s: &NodeStatus| s.subgroups.iter().map(|g| g.delivered_messages).sum::<u64>();
        // (when the survivor took its status (Unix ns), messages it had
        // delivered by then)
        let mut readings: Vec<(u64, u64)> = Vec::new();
        let survivor_addr = running.status[survivor as usize].clone();
        let read = |readings: &mut Vec<(u64, u64)>| {
            if let Ok(s) = fetch_status(&survivor_addr)
                && readings.last().is_none_or(|r| r.0 < s.taken_at_unix_ns)
            {
                readings.push((s.taken_at_unix_ns, delivered(&s)));
            }
        };
        let sample_every = Duration::from_millis(TICK_MS);
        if dip {
            let until = Instant::now() + Duration::from_millis(300);
            while Instant::now() < until {
                read(&mut readings);
                std::thread::sleep(sample_every);
            }
        }
        let kill_wall = unix_ns();
        let kill_at = Instant::now();
        if let Some(c) = running.children[victim as usize].as_mut() {
            c.kill().map_err(|e| format!("killing member {victim}: {e}"))?;
            let _ = c.wait();
        }
        running.children[victim as usize] = None;
        let survivors: Vec<u32> = (0..n).filter(|m| *m != victim).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut result = None;
        loop {
            let st: Vec<Option<NodeStatus>> =
                survivors.iter().map(|&m| fetch_status(&running.status[m as usize]).ok()).collect();
            let done = st.iter().all(|s| {
                s.as_ref()
                    .is_some_and(|s| s.state == "running" && s.view >= 1 && !s.members.contains(&victim))
            });
            if done {
                let st: Vec<NodeStatus> = st.into_iter().flatten().collect();
                let wedge =
                    st.iter().map(|s| s.wedged_at_unix_ns).filter(|t| *t > 0).min().unwrap_or(kill_wall);
                let install = st.iter().map(|s| s.installed_at_unix_ns).max().unwrap_or(kill_wall);
                let ms = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e6;
                result = Some(Kill {
                    victim,
                    detect_ms: ms(kill_wall, wedge),
                    protocol_ms: ms(wedge, install),
                    total_ms: ms(kill_wall, install),
                });
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            if dip {
                read(&mut readings);
                std::thread::sleep(sample_every);
            } else {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        if dip {
            let until = kill_at + Duration::from_millis(700);
            while Instant::now() < until {
                read(&mut readings);
                std::thread::sleep(sample_every);
            }
        }
        drop(running);
        // Rates between consecutive statuses (each stamped by the survivor
        // when it took it), placed at their midpoints relative to the kill.
        let ms = |t: u64| (t as f64 - kill_wall as f64) / 1e6;
        let samples: Vec<(f64, f64)> = readings
            .windows(2)
            .filter(|w| w[1].0 > w[0].0 && w[1].1 >= w[0].1)
            .map(|w| {
                let dt = (w[1].0 - w[0].0) as f64 / 1e9;
                ((ms(w[0].0) + ms(w[1].0)) / 2.0, (w[1].1 - w[0].1) as f64 / dt)
            })
            .collect();
        Ok((result, dip.then_some(samples)))
    }
}

impl Experiment for Failover {
    type Report = FailoverReport;

    fn name(&self) -> &'static str {
        "failover"
    }

    fn measure(&self, progress: &mut dyn FnMut(&str)) -> Result<FailoverReport, String> {
        let kills = self.args.kills.unwrap_or(if self.args.quick { 5 } else { 20 }).max(1);
        let scratch = std::env::temp_dir().join(format!("ordo-bench-failover-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
        Secret::generate_file(&scratch.join("cluster.secret")).map_err(|e| e.to_string())?;
        let mut points = Vec::new();
        let mut dips = Vec::new();
        for b in &self.args.backend {
            let backend = match b.as_str() {
                "shm" => Backend::Shm,
                "tcp" => Backend::Tcp,
                other => return Err(format!("unknown backend {other} (shm or tcp)")),
            };
            for &n in &self.args.members {
                if n < 3 {
                    return Err(format!(
                        "{n} members: a group must keep a majority after one death (3 or more)"
                    ));
                }
                let mut samples = Vec::new();
                let mut failed = 0;
                for k in 0..kills {
                    let (kill, dip) = self.kill_once(backend, n, k, &scratch, k == 0)?;
                    if let Some(d) = dip {
                        dips.push(Dip { backend: b.clone(), members: n, samples: d });
                    }
                    match kill {
                        Some(kill) => {
                            progress(&format!(
                                "{b} {n} members, kill {}/{kills} (member {}): new view {:.1} ms after the kill \
                                 (detected {:.1} ms, protocol {:.1} ms)",
                                k + 1,
                                kill.victim,
                                kill.total_ms,
                                kill.detect_ms,
                                kill.protocol_ms
                            ));
                            samples.push(kill);
                        }
                        None => {
                            failed += 1;
                            progress(&format!(
                                "{b} {n} members, kill {}/{kills}: no new view within 10 s",
                                k + 1
                            ));
                        }
                    }
                }
                let sorted = |f: &dyn Fn(&Kill) -> f64| {
                    let mut v: Vec<f64> = samples.iter().map(f).collect();
                    v.sort_by(f64::total_cmp);
                    v
                };
                let total = sorted(&|k| k.total_ms);
                let detect = sorted(&|k| k.detect_ms);
                let protocol = sorted(&|k| k.protocol_ms);
                points.push(Point {
                    backend: b.clone(),
                    members: n,
                    total_ms: [
                        percentile(&total, 0.5),
                        percentile(&total, 0.99),
                        total.first().copied().unwrap_or(f64::NAN),
                        total.last().copied().unwrap_or(f64::NAN),
                    ],
                    detect_ms: [percentile(&detect, 0.5), percentile(&detect, 0.99)],
                    protocol_ms: [percentile(&protocol, 0.5), percentile(&protocol, 0.99)],
                    kills: samples,
                    failed,
                });
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(FailoverReport { machine: MachineInfo::current(), points, dips, tick_ms: TICK_MS })
    }

    fn out_dir(&self) -> Option<&Path> {
        Some(&self.args.out)
    }

    fn write_files(&self, report: &FailoverReport, dir: &Path) -> Result<(), String> {
        let mut csv = Csv::new(&["backend", "members", "victim", "detect_ms", "protocol_ms", "total_ms"]);
        for p in &report.points {
            for k in &p.kills {
                csv.row([
                    p.backend.clone(),
                    p.members.to_string(),
                    k.victim.to_string(),
                    format!("{:.3}", k.detect_ms),
                    format!("{:.3}", k.protocol_ms),
                    format!("{:.3}", k.total_ms),
                ]);
            }
        }
        write(&dir.join("kills.csv"), csv.text())?;
        let mut csv = Csv::new(&["backend", "members", "ms_since_kill", "delivered_per_s"]);
        for d in &report.dips {
            for (t, r) in &d.samples {
                csv.row([d.backend.clone(), d.members.to_string(), format!("{t:.1}"), format!("{r:.0}")]);
            }
        }
        write(&dir.join("throughput.csv"), csv.text())?;
        let panels: Vec<Panel> = report
            .dips
            .iter()
            .map(|d| Panel {
                title: format!("{} members, {}: a survivor's delivered messages/s", d.members, d.backend),
                x_label: "ms since the kill".into(),
                y_label: "messages/s".into(),
                log_y: false,
                series: vec![Series {
                    label: "delivered".into(),
                    points: d.samples.clone(),
                    ..Series::default()
                }],
            })
            .collect();
        if !panels.is_empty() {
            write_png(&dir.join("throughput.png"), "Delivered throughput across a SIGKILL", &panels, 2)?;
        }
        Ok(())
    }

    fn print_table(&self, report: &FailoverReport) {
        println!("machine: {}", report.machine.summary());
        println!(
            "detection: shm checks each peer's process every 1 ms; tcp sees the reset connection; heartbeats \
             (tick {} ms) catch the rest",
            report.tick_ms
        );
        println!(
            "{:<6} {:>7} {:>6} {:>10} {:>10} {:>9} {:>9} {:>11} {:>11} {:>12} {:>7}",
            "fabric",
            "members",
            "kills",
            "p50 ms",
            "p99 ms",
            "min ms",
            "max ms",
            "detect p50",
            "detect p99",
            "protocol p50",
            "failed"
        );
        for p in &report.points {
            println!(
                "{:<6} {:>7} {:>6} {:>10.2} {:>10.2} {:>9.2} {:>9.2} {:>11.2} {:>11.2} {:>12.2} {:>7}",
                p.backend,
                p.members,
                p.kills.len(),
                p.total_ms[0],
                p.total_ms[1],
                p.total_ms[2],
                p.total_ms[3],
                p.detect_ms[0],
                p.detect_ms[1],
                p.protocol_ms[0],
                p.failed
            );
        }
        for d in &report.dips {
            let before: Vec<f64> = d.samples.iter().filter(|s| s.0 < 0.0).map(|s| s.1).collect();
            let after: Vec<f64> = d.samples.iter().filter(|s| s.0 > 200.0).map(|s| s.1).collect();
            let low = d
                .samples
                .iter()
                .filter(|s| s.0 >= 0.0 && s.0 <= 200.0)
                .map(|s| s.1)
                .fold(f64::INFINITY, f64::min);
            let mean =
                |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
            println!(
                "throughput at a survivor ({} members, {}): {:.0} msgs/s before, lowest {:.0} within 200 ms of the \
                 kill, {:.0} after",
                d.members,
                d.backend,
                mean(&before),
                low,
                mean(&after)
            );
        }
    }

    fn verdict(&self, report: &FailoverReport) -> Result<(), String> {
        let failed: usize = report.points.iter().map(|p| p.failed).sum();
        if failed > 0 { Err(format!("{failed} kills had no new view within 10 s")) } else { Ok(()) }
    }
}
