//! `ordo bench fabric`: what each backend delivers beside what the machine
//! can do, measured in the same run.
//!
//! For each backend a peer process is spawned as member 1 (pinned to a
//! different core than the coordinator where there are two cores to pin) and
//! the coordinator measures, per size:
//! - **one-way write-to-visible latency**: ping-pong of `size`-byte writes
//!   (payload write + guard write; for 8 B the guard word is the payload),
//!   half the round trip, p50 and p99 over all samples after a warm-up;
//! - **streaming bandwidth**: `size`-byte writes into a ring of slots at the
//!   peer; the writer fills every free slot, then publishes the batch with
//!   one guard write; the peer checks the newest message under each guard
//!   it sees (first and last word) and acknowledges (flow control). Timed
//!   over a fixed duration after a calibration run; measured twice: the
//!   peer checking only the newest message of each batch (a one-sided
//!   write stream, the way an RDMA write benchmark counts), and the peer
//!   reading every byte of every message (**read all**, what an application
//!   gets, and what is compared with the copy ring).
//!
//! Physical limits measured alongside:
//! - the **cross-process copy ring** ([`crate::limits::copy_ring`]) of the
//!   same geometry: a writer process copies each message into a shared
//!   ring, a reader process on the other core reads every byte — the limit
//!   of streaming between two cores, which the "vs copy ring" column uses
//!   (measured [`COPY_RING_SAMPLES`] times per size before the backends,
//!   whose spinning peers would take its core: median [min–max]);
//! - **memcpy** of `size` bytes into a ring of the same geometry (same
//!   footprint) in one thread: a hot single-core copy, no cache line
//!   migrating — not a bound on a cross-core transfer, shown for scale;
//! - **cache-line ping-pong** between two processes through a shared file
//!   mapping: the floor of any cross-core notification.

use crate::machine::MachineInfo;
use crate::peer::{PeerChild, spawn_peer};
use crate::protocol::*;
use hdrhistogram::Histogram;
use ordo_fabric::Fabric;
use ordo_fabric_shm::{ShmFabric, ShmOptions};
use serde::Serialize;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Backends `ordo bench fabric` can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The shared-memory fabric (`ordo-fabric-shm`).
    Shm,
    /// The tcp fabric (`ordo-fabric-tcp`), over loopback, with a generated
    /// cluster secret (every connection's handshake proves it).
    Tcp,
    /// The same without a secret: the cost of authentication, side by side.
    TcpNoSecret,
    /// The tcp fabric over mutual TLS (rustls), with the secret.
    TcpTls,
    /// The libfabric backend on provider `tcp;ofi_rxm` (loopback).
    OfiTcp,
    /// The libfabric backend on provider `shm`.
    OfiShm,
    /// The libfabric backend on provider `verbs;ofi_rxm` (InfiniBand,
    /// RoCE; needs the hardware).
    OfiVerbs,
    /// The libfabric backend on connected endpoints of provider `tcp`.
    OfiTcpMsg,
    /// The libfabric backend on connected endpoints of provider `verbs`
    /// (RDMA reliable connections; needs the hardware).
    OfiVerbsMsg,
}

impl Backend {
    /// The backend's name: `shm` or `tcp`, as on the command line and in the
    /// report.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Shm => "shm",
            Backend::Tcp => "tcp",
            Backend::TcpNoSecret => "tcp-nosecret",
            Backend::TcpTls => "tcp-tls",
            Backend::OfiTcp => "ofi-tcp",
            Backend::OfiShm => "ofi-shm",
            Backend::OfiVerbs => "ofi-verbs",
            Backend::OfiTcpMsg => "ofi-tcp-msg",
            Backend::OfiVerbsMsg => "ofi-verbs-msg",
        }
    }

    /// The libfabric provider and endpoint type of an ofi backend.
    pub fn ofi_provider(&self) -> Option<(&'static str, ordo_runtime::OfiEndpoint)> {
        use ordo_runtime::OfiEndpoint::{Msg, Rdm};
        match self {
            Backend::OfiTcp => Some(("tcp;ofi_rxm", Rdm)),
            Backend::OfiShm => Some(("shm", Rdm)),
            Backend::OfiVerbs => Some(("verbs;ofi_rxm", Rdm)),
            Backend::OfiTcpMsg => Some(("tcp", Msg)),
            Backend::OfiVerbsMsg => Some(("verbs", Msg)),
            _ => None,
        }
    }
}

/// Options of one benchmark run.
#[derive(Clone, Debug)]
pub struct FabricBenchOptions {
    /// The `ordo` executable to spawn peers with.
    pub exe: PathBuf,
    /// Backends to measure, in this order.
    pub backends: Vec<Backend>,
    /// Reduced run (under a minute).
    pub quick: bool,
}

/// One result row (a backend at a size, or a physical limit).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// `shm`, `tcp`, or a limit: `memcpy`, `cacheline-pingpong`.
    pub backend: String,
    /// Message size in bytes (8 for the cache-line ping-pong).
    pub size_bytes: usize,
    /// Median one-way latency in ns (half the round trip, after warm-up);
    /// `None` where latency is not measured (memcpy).
    pub latency_ns_p50: Option<f64>,
    /// 99th-percentile one-way latency in ns, as [`Row::latency_ns_p50`].
    pub latency_ns_p99: Option<f64>,
    /// Streaming (or memcpy) bandwidth in bytes per second, the peer
    /// checking the newest message of each batch (a one-sided write
    /// stream, as an RDMA write benchmark measures it); `None` where
    /// bandwidth is not measured (8 B, cache-line ping-pong).
    pub bandwidth_bytes_per_s: Option<f64>,
    /// Streaming bandwidth with the peer reading every byte of every
    /// message (what an application consuming the stream gets).
    pub read_bandwidth_bytes_per_s: Option<f64>,
    /// memcpy bandwidth at the same size and footprint, same run.
    pub memcpy_bytes_per_s: Option<f64>,
    /// bandwidth / memcpy.
    pub bandwidth_vs_memcpy: Option<f64>,
    /// The cross-process copy ring at the same size and geometry, same run
    /// (median of its samples).
    pub copy_ring_bytes_per_s: Option<f64>,
    /// Copy-ring rows: the samples' spread.
    pub copy_ring_spread: Option<crate::noise::Spread>,
    /// read bandwidth / copy ring: the fraction of the cross-core limit.
    pub bandwidth_vs_copy_ring: Option<f64>,
    /// Round trips the latency percentiles are taken over (0 where none).
    pub latency_samples: u64,
    /// Messages in the measured streaming run (0 where none).
    pub messages_streamed: u64,
}

/// The whole report (`--json` prints it).
#[derive(Clone, Debug, Serialize)]
pub struct FabricReport {
    /// Always `"fabric"`: names the benchmark in the JSON output.
    pub benchmark: &'static str,
    /// The machine the run was on.
    pub machine: MachineInfo,
    /// Whether this was the reduced run ([`FabricBenchOptions::quick`]).
    pub quick: bool,
    /// Whether coordinator and peer were pinned to different cores (done
    /// only where there are at least two).
    pub pinned: bool,
    /// The physical limits' rows, then one row per backend and size.
    pub rows: Vec<Row>,
    /// With shm measured: 10 KiB streaming with the peer reading every
    /// byte against the cross-process copy ring, interleaved (a fresh shm
    /// peer per sample; [`crate::noise`]).
    pub shm_vs_copy_ring: Option<crate::noise::Comparison>,
}

/// Samples of the copy ring per size.
pub const COPY_RING_SAMPLES: usize = 3;

/// Sizes measured (latency at all; bandwidth above 8 B).
pub const SIZES: [usize; 5] = [8, 1024, 4096, 10 * 1024, 64 * 1024];

/// Slots of the streaming ring for a size (same geometry for memcpy).
pub fn slots_for(size: usize) -> usize {
    (256 * 1024 / size).clamp(4, 64).min(STREAM_BYTES / size)
}

struct Plan {
    pings: u64,
    stream_time: Duration,
}

/// Runs the benchmark; `progress` receives a line per finished step.
pub fn run(opts: &FabricBenchOptions, mut progress: impl FnMut(&str)) -> Result<FabricReport, String> {
    let plan = if opts.quick {
        Plan { pings: 3000, stream_time: Duration::from_millis(250) }
    } else {
        Plan { pings: 30_000, stream_time: Duration::from_secs(1) }
    };
    let machine = MachineInfo::current();
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let pinned = cores.len() >= 2;
    if pinned {
        core_affinity::set_for_current(cores[0]);
    }
    let mut rows = Vec::new();
    let mut memcpy = std::collections::BTreeMap::new();
    for &size in &SIZES[1..] {
        let bw = memcpy_bandwidth(size, slots_for(size), plan.stream_time);
        memcpy.insert(size, bw);
        rows.push(Row {
            backend: "memcpy".into(),
            size_bytes: size,
            latency_ns_p50: None,
            latency_ns_p99: None,
            bandwidth_bytes_per_s: Some(bw),
            read_bandwidth_bytes_per_s: None,
            memcpy_bytes_per_s: Some(bw),
            bandwidth_vs_memcpy: Some(1.0),
            copy_ring_bytes_per_s: None,
            copy_ring_spread: None,
            bandwidth_vs_copy_ring: None,
            latency_samples: 0,
            messages_streamed: 0,
        });
        progress(&format!("memcpy {size} B: {:.2} GB/s", bw / 1e9));
    }
    let mut copy_ring = std::collections::BTreeMap::new();
    for &size in &SIZES[1..] {
        let samples = (0..COPY_RING_SAMPLES)
            .map(|_| crate::limits::copy_ring(&opts.exe, size, slots_for(size), plan.stream_time, pinned))
            .collect::<Result<Vec<f64>, String>>()?;
        let spread = crate::noise::Spread::of(&samples).ok_or("copy ring: no sample")?;
        copy_ring.insert(size, spread.median);
        rows.push(Row {
            backend: "copy-ring".into(),
            size_bytes: size,
            latency_ns_p50: None,
            latency_ns_p99: None,
            bandwidth_bytes_per_s: Some(spread.median),
            read_bandwidth_bytes_per_s: Some(spread.median),
            memcpy_bytes_per_s: memcpy.get(&size).copied(),
            bandwidth_vs_memcpy: memcpy.get(&size).map(|m| spread.median / m),
            copy_ring_bytes_per_s: Some(spread.median),
            copy_ring_spread: Some(spread),
            bandwidth_vs_copy_ring: Some(1.0),
            latency_samples: 0,
            messages_streamed: 0,
        });
        progress(&format!(
            "copy ring {size} B (cross-process): {}",
            spread.show(|v| format!("{:.2}", v / 1e9))
        ));
    }
    let (p50, p99, n) = cacheline_pingpong(&opts.exe, plan.pings * 3, pinned)?;
    rows.push(Row {
        backend: "cacheline-pingpong".into(),
        size_bytes: 8,
        latency_ns_p50: Some(p50),
        latency_ns_p99: Some(p99),
        bandwidth_bytes_per_s: None,
        read_bandwidth_bytes_per_s: None,
        memcpy_bytes_per_s: None,
        bandwidth_vs_memcpy: None,
        copy_ring_bytes_per_s: None,
        copy_ring_spread: None,
        bandwidth_vs_copy_ring: None,
        latency_samples: n,
        messages_streamed: 0,
    });
    progress(&format!("cache-line ping-pong: p50 {p50:.0} ns one-way"));
    for &backend in &opts.backends {
        let spin = backend == Backend::Shm;
        let cluster = format!("bench-{}-{}", std::process::id(), backend.name());
        let result = match backend {
            Backend::Shm => {
                let (f, child) = shm_peer(opts, &cluster, pinned)?;
                (
                    f.and_then(|f| {
                        measure_backend(f, backend, &plan, spin, (&memcpy, &copy_ring), &mut progress)
                    }),
                    child,
                )
            }
            Backend::Tcp | Backend::TcpNoSecret | Backend::TcpTls => {
                let secret = (backend != Backend::TcpNoSecret).then(ordo_runtime::Secret::generate);
                let pki = std::env::temp_dir().join(format!("{cluster}-pki"));
                let tls = if backend == Backend::TcpTls {
                    write_test_pki(&pki, 2)?;
                    Some(test_pki_settings(&pki, 0)?)
                } else {
                    None
                };
                let binding = tcp_bind(0, &cluster, secret.clone(), tls.clone())?;
                let addr = Some(binding.local_addr());
                let tls_dir = tls.is_some().then_some(pki.as_path());
                let credentials = crate::peer::PeerCredentials { secret: secret.as_ref(), tls_dir };
                let child = spawn_peer(&opts.exe, backend, &cluster, spin, pinned, addr, credentials)?;
                let addr = child.listen.ok_or("tcp peer did not report its address")?;
                let f = binding.connect(vec![(1, addr)]).map_err(|e| e.to_string());
                (
                    f.and_then(|f| {
                        measure_backend(f, backend, &plan, spin, (&memcpy, &copy_ring), &mut progress)
                    }),
                    child,
                )
            }
            Backend::OfiTcp
            | Backend::OfiShm
            | Backend::OfiVerbs
            | Backend::OfiTcpMsg
            | Backend::OfiVerbsMsg => {
                ofi_point(opts, backend, &cluster, pinned, &plan, (&memcpy, &copy_ring), &mut progress)?
            }
        };
        let (result, child) = result;
        let status = child.wait(Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("{cluster}-pki")));
        let mut backend_rows = result?;
        status.map_err(|e| format!("{} peer: {e}", backend.name()))?;
        rows.append(&mut backend_rows);
    }
    let shm_vs_copy_ring = if opts.backends.contains(&Backend::Shm) {
        Some(shm_vs_copy_ring(opts, &plan, pinned, &mut progress)?)
    } else {
        None
    };
    Ok(FabricReport { benchmark: "fabric", machine, quick: opts.quick, pinned, rows, shm_vs_copy_ring })
}

/// Spawns the shm peer (spinning; on core 1 where `pinned`) and opens
/// member 0's endpoint of `cluster`; the child is returned either way, to
/// be waited for.
fn shm_peer(
    opts: &FabricBenchOptions,
    cluster: &str,
    pinned: bool,
) -> Result<(Result<ShmFabric, String>, PeerChild), String> {
    let child = spawn_peer(&opts.exe, Backend::Shm, cluster, true, pinned, None, Default::default())?;
    let f = ShmFabric::create(ShmOptions::new(cluster, 0, vec![0, 1], REGION_LEN)).map_err(|e| e.to_string());
    Ok((f, child))
}

/// shm streaming at 10 KiB, the peer reading every byte, against the copy
/// ring of the same geometry: interleaved, 3 rounds (the spinning shm peer
/// lives only for its own sample, so the copy ring has the core).
fn shm_vs_copy_ring(
    opts: &FabricBenchOptions,
    plan: &Plan,
    pinned: bool,
    progress: &mut impl FnMut(&str),
) -> Result<crate::noise::Comparison, String> {
    use crate::noise::{Comparison, Probe, Retry, interleave};
    let size = 10 * 1024;
    let mut seq = 0;
    let rounds = interleave(
        3,
        Retry::default(),
        || {
            let probe = Probe::start();
            let bw = crate::limits::copy_ring(&opts.exe, size, slots_for(size), plan.stream_time, pinned)?;
            Ok((bw, probe.stop()))
        },
        || {
            seq += 1;
            let cluster = format!("bench-{}-shm-vs-ring-{seq}", std::process::id());
            let child =
                spawn_peer(&opts.exe, Backend::Shm, &cluster, true, pinned, None, Default::default())?;
            let result = ShmFabric::create(ShmOptions::new(cluster.clone(), 0, vec![0, 1], REGION_LEN))
                .map_err(|e| e.to_string())
                .and_then(|mut f| {
                    let waiter =
                        Waiter { park: None, spins_before_park: 2000, deadline: Duration::from_secs(30) };
                    let mut c = Coordinator { cmd: 0, ping: 0, stream: 0 };
                    let probe = Probe::start();
                    let (bw, _) =
                        c.stream(&mut f, &waiter, size, slots_for(size), plan.stream_time, Op::SinkRead)?;
                    let load = probe.stop();
                    c.exit(&mut f, &waiter)?;
                    Ok((bw, load))
                });
            let status = child.wait(Duration::from_secs(10));
            let sample = result?;
            status.map_err(|e| format!("shm peer: {e}"))?;
            Ok(sample)
        },
    )?;
    let c = Comparison::of(
        "10 KiB streaming, the peer reading every byte: shm / the cross-process copy ring",
        "GB/s",
        ("copy ring", "shm"),
        &rounds,
        |bw| Some(bw / 1e9),
    );
    progress(&c.line(|v| format!("{v:.2}")));
    Ok(c)
}

fn measure_backend<F: Fabric>(
    mut f: F,
    backend: Backend,
    plan: &Plan,
    spin: bool,
    (memcpy, copy_ring): (&std::collections::BTreeMap<usize, f64>, &std::collections::BTreeMap<usize, f64>),
    progress: &mut impl FnMut(&str),
) -> Result<Vec<Row>, String> {
    let waiter = Waiter {
        park: if spin { None } else { f.doorbell().cloned() },
        spins_before_park: 2000,
        deadline: Duration::from_secs(30),
    };
    let mut c = Coordinator { cmd: 0, ping: 0, stream: 0 };
    let mut rows = Vec::new();
    for &size in &SIZES {
        let pings = if backend == Backend::Shm { plan.pings } else { plan.pings / 3 };
        let hist = c.pingpong(&mut f, &waiter, size, pings)?;
        let (p50, p99) =
            (hist.value_at_quantile(0.5) as f64 / 2.0, hist.value_at_quantile(0.99) as f64 / 2.0);
        let (bw, read, streamed) = if size > 8 {
            let (bw, n) =
                c.stream(&mut f, &waiter, size, slots_for(size), plan.stream_time, Op::SinkSampled)?;
            let (read, _) =
                c.stream(&mut f, &waiter, size, slots_for(size), plan.stream_time, Op::SinkRead)?;
            (Some(bw), Some(read), n)
        } else {
            (None, None, 0)
        };
        let mc = memcpy.get(&size).copied();
        let cr = copy_ring.get(&size).copied();
        progress(&format!(
            "{} {size} B: one-way p50 {p50:.0} ns p99 {p99:.0} ns{}",
            backend.name(),
            bw.zip(read)
                .map(|(b, r)| format!(", stream {:.2} GB/s, read every byte {:.2} GB/s", b / 1e9, r / 1e9))
                .unwrap_or_default()
        ));
        rows.push(Row {
            backend: backend.name().into(),
            size_bytes: size,
            latency_ns_p50: Some(p50),
            latency_ns_p99: Some(p99),
            bandwidth_bytes_per_s: bw,
            read_bandwidth_bytes_per_s: read,
            memcpy_bytes_per_s: mc,
            bandwidth_vs_memcpy: bw.zip(mc).map(|(b, m)| b / m),
            copy_ring_bytes_per_s: cr,
            copy_ring_spread: None,
            bandwidth_vs_copy_ring: read.zip(cr).map(|(b, c)| b / c),
            latency_samples: hist.len(),
            messages_streamed: streamed,
        });
    }
    c.exit(&mut f, &waiter)?;
    Ok(rows)
}

/// Exercises a connected peer in `Serve` role across processes: ping-pongs
/// at 8 B and 4 KiB (each pong's payload checked under its guard) and
/// streams 1 KiB and 10 KiB messages (each message's first and last words
/// checked by the peer under the guard), then tells it to exit. Any
/// violation is an `Err`. Used by the multi-process tests.
pub fn exercise<F: Fabric>(f: &mut F, spin: bool) -> Result<(), String> {
    let waiter = Waiter {
        park: if spin { None } else { f.doorbell().cloned() },
        spins_before_park: 200,
        deadline: Duration::from_secs(30),
    };
    let mut c = Coordinator { cmd: 0, ping: 0, stream: 0 };
    for size in [8, 4096] {
        c.pingpong(f, &waiter, size, 200)?;
    }
    for size in [1024, 10 * 1024] {
        c.stream_n(f, &waiter, size, slots_for(size).min(8), 3000, Op::Sink)?;
    }
    c.exit(f, &waiter)
}

struct Coordinator {
    cmd: u64,
    ping: u64,
    stream: u64,
}

impl Coordinator {
    fn command<F: Fabric>(
        &mut self,
        f: &mut F,
        op: Op,
        size: usize,
        count: u64,
        slots: usize,
    ) -> Result<u64, String> {
        self.cmd += 1;
        let r = f.region();
        r.store_release(CMD_OP, op as u64);
        r.store_release(CMD_SIZE, size as u64);
        r.store_release(CMD_COUNT, count);
        r.store_release(CMD_SLOTS, slots as u64);
        post(f, 1, CMD_OP, 32)?;
        f.region().store_release(CMD_SEQ, self.cmd);
        post(f, 1, CMD_SEQ, 8)?;
        Ok(self.cmd)
    }

    /// Tells the peer to exit and waits until it acknowledged.
    fn exit<F: Fabric>(&mut self, f: &mut F, w: &Waiter) -> Result<(), String> {
        self.command(f, Op::Exit, 8, 0, 0)?;
        self.wait_done(f, w)
    }

    fn wait_done<F: Fabric>(&self, f: &mut F, w: &Waiter) -> Result<(), String> {
        let cmd = self.cmd;
        w.until(f, |f| f.region().load_acquire(DONE) >= cmd)
    }

    fn pingpong<F: Fabric>(
        &mut self,
        f: &mut F,
        w: &Waiter,
        size: usize,
        count: u64,
    ) -> Result<Histogram<u64>, String> {
        let warmup = count / 10;
        self.command(f, Op::PingPong, size, count + warmup, 0)?;
        let mut hist = Histogram::<u64>::new(3).expect("histogram");
        for i in 0..count + warmup {
            self.ping += 1;
            let ping = self.ping;
            let start = Instant::now();
            if size > 8 {
                f.region().store_release(PING_DATA, ping);
                post(f, 1, PING_DATA, size)?;
            }
            f.region().store_release(PING, ping);
            post(f, 1, PING, 8)?;
            w.until(f, |f| f.region().load_acquire(PONG) >= ping)?;
            if size > 8 && f.region().load_acquire(PONG_DATA) != ping {
                return Err(format!("pong {ping}: payload not visible under its guard"));
            }
            if i >= warmup {
                hist.record(start.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
            }
        }
        self.wait_done(f, w)?;
        Ok(hist)
    }

    /// Streams for about `time`; returns (bytes/s, messages).
    fn stream<F: Fabric>(
        &mut self,
        f: &mut F,
        w: &Waiter,
        size: usize,
        slots: usize,
        time: Duration,
        op: Op,
    ) -> Result<(f64, u64), String> {
        // Calibrate the count on a short run, then measure.
        let calibration = 200u64;
        let start = Instant::now();
        self.stream_n(f, w, size, slots, calibration, op)?;
        let per_msg = start.elapsed().as_secs_f64() / calibration as f64;
        let count = ((time.as_secs_f64() / per_msg) as u64).clamp(1000, 50_000_000);
        let start = Instant::now();
        self.stream_n(f, w, size, slots, count, op)?;
        let elapsed = start.elapsed().as_secs_f64();
        Ok(((count as f64 * size as f64) / elapsed, count))
    }

    /// Streams `count` messages: every free slot is written (one write
    /// each), then one guard write publishes the batch — the way a sender
    /// streams over a one-sided fabric (spindle §III-A send batching).
    fn stream_n<F: Fabric>(
        &mut self,
        f: &mut F,
        w: &Waiter,
        size: usize,
        slots: usize,
        count: u64,
        op: Op,
    ) -> Result<(), String> {
        self.command(f, op, size, count, slots)?;
        let end = self.stream + count;
        while self.stream < end {
            let next = self.stream + 1;
            w.until(f, |f| next - f.region().load_acquire(ACK) <= slots as u64)?;
            let free_upto = (f.region().load_acquire(ACK) + slots as u64).min(end);
            for m in next..=free_upto {
                let slot = STREAM + (m as usize % slots) * size;
                f.region().store_release(slot, m);
                f.region().store_release(slot + size - 8, !m);
                post(f, 1, slot, size)?;
            }
            f.region().store_release(STREAM_SEQ, free_upto);
            post(f, 1, STREAM_SEQ, 8)?;
            self.stream = free_upto;
        }
        w.until(f, |f| f.region().load_acquire(ACK) >= end)?;
        self.wait_done(f, w)
    }
}

/// memcpy of `size`-byte blocks into a ring of `slots` blocks, for `time`.
pub fn memcpy_bandwidth(size: usize, slots: usize, time: Duration) -> f64 {
    let src = vec![0x5Au8; size];
    let mut dst = vec![0u8; size * slots];
    let start = Instant::now();
    let mut copies = 0u64;
    while start.elapsed() < time {
        for _ in 0..64 {
            let slot = (copies as usize % slots) * size;
            // SAFETY: both ranges in bounds, distinct allocations.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().add(slot), size);
            }
            std::hint::black_box(&mut dst);
            copies += 1;
        }
    }
    (copies as f64 * size as f64) / start.elapsed().as_secs_f64()
}

/// Cross-process cache-line ping-pong through a shared mapping: returns
/// one-way (p50, p99, samples) in ns.
pub fn cacheline_pingpong(
    exe: &std::path::Path,
    rounds: u64,
    pinned: bool,
) -> Result<(f64, f64, u64), String> {
    let path = std::env::temp_dir().join(format!("ordo-cacheline-{}", std::process::id()));
    let shm = PathBuf::from("/dev/shm").join(path.file_name().expect("name"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&shm)
        .map_err(|e| e.to_string())?;
    file.set_len(4096).map_err(|e| e.to_string())?;
    let map = memmap2::MmapOptions::new().map_raw(&file).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["fabric-peer", "--role", "cacheline", "--path"])
        .arg(&shm)
        .args(["--count", &rounds.to_string()]);
    if pinned {
        cmd.args(["--core", "1"]);
    }
    let child = PeerChild { child: cmd.spawn().map_err(|e| e.to_string())?, listen: None };
    // SAFETY: the mapping is 4096 bytes; both words are 8-aligned.
    let (ping, pong) = unsafe {
        (
            &*(map.as_mut_ptr() as *const std::sync::atomic::AtomicU64),
            &*(map.as_mut_ptr().add(64) as *const std::sync::atomic::AtomicU64),
        )
    };
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let deadline = Instant::now() + Duration::from_secs(60);
    use std::sync::atomic::Ordering::{Acquire, Release};
    for i in 1..=rounds {
        let start = Instant::now();
        ping.store(i, Release);
        let mut spins = 0u32;
        while pong.load(Acquire) < i {
            spins += 1;
            if spins.is_multiple_of(4096) && Instant::now() > deadline {
                return Err("cache-line peer stopped answering".into());
            }
            std::hint::spin_loop();
        }
        if i > rounds / 10 {
            hist.record(start.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
        }
    }
    let r = child.wait(Duration::from_secs(10));
    let _ = std::fs::remove_file(&shm);
    r?;
    Ok((hist.value_at_quantile(0.5) as f64 / 2.0, hist.value_at_quantile(0.99) as f64 / 2.0, hist.len()))
}

/// The peer side of the cross-process cache-line ping-pong.
pub fn cacheline_peer(path: &std::path::Path, rounds: u64) -> Result<(), String> {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| e.to_string())?;
    let map = memmap2::MmapOptions::new().map_raw(&file).map_err(|e| e.to_string())?;
    // SAFETY: as in cacheline_pingpong.
    let (ping, pong) = unsafe {
        (
            &*(map.as_mut_ptr() as *const std::sync::atomic::AtomicU64),
            &*(map.as_mut_ptr().add(64) as *const std::sync::atomic::AtomicU64),
        )
    };
    use std::sync::atomic::Ordering::{Acquire, Release};
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 1..=rounds {
        let mut spins = 0u32;
        while ping.load(Acquire) < i {
            spins += 1;
            if spins.is_multiple_of(4096) && Instant::now() > deadline {
                return Err("coordinator stopped pinging".into());
            }
            std::hint::spin_loop();
        }
        pong.store(i, Release);
    }
    Ok(())
}

/// Binds member `me` of a two-member tcp benchmark group on loopback.
pub fn tcp_bind(
    me: u32,
    cluster: &str,
    secret: Option<ordo_runtime::Secret>,
    tls: Option<ordo_fabric_tcp::TlsSettings>,
) -> Result<ordo_fabric_tcp::TcpBinding, String> {
    let mut o = ordo_fabric_tcp::TcpOptions::new(me, "127.0.0.1:0".parse().expect("addr"), REGION_LEN);
    o.cluster = cluster.to_string();
    o.secret = secret;
    o.tls = tls;
    o.max_frame_bytes = MAX_SIZE;
    o.send_buffer_bytes = 4 << 20;
    ordo_fabric_tcp::TcpFabric::bind(o).map_err(|e| e.to_string())
}

/// The rows of an ofi backend, or why it cannot run: a coordinator
/// endpoint (member 0) and a peer process (member 1) on `backend`'s
/// provider, on loopback contact ports, with a generated secret.
fn ofi_point(
    opts: &FabricBenchOptions,
    backend: Backend,
    cluster: &str,
    pinned: bool,
    plan: &Plan,
    limits: (&std::collections::BTreeMap<usize, f64>, &std::collections::BTreeMap<usize, f64>),
    progress: &mut impl FnMut(&str),
) -> Result<(Result<Vec<Row>, String>, crate::peer::PeerChild), String> {
    #[cfg(feature = "ofi")]
    {
        let (provider, endpoint) = backend.ofi_provider().expect("an ofi backend");
        let secret = ordo_runtime::Secret::generate();
        let binding = ofi_bind(0, provider, endpoint, cluster, secret.clone())?;
        let addr = Some(binding.contact_addr());
        let credentials = crate::peer::PeerCredentials { secret: Some(&secret), tls_dir: None };
        let child = spawn_peer(&opts.exe, backend, cluster, false, pinned, addr, credentials)?;
        let addr = child.listen.ok_or("ofi peer did not report its contact address")?;
        let f = binding.connect(vec![(1, addr)]).map_err(|e| e.to_string());
        Ok((f.and_then(|f| measure_backend(f, backend, plan, false, limits, progress)), child))
    }
    #[cfg(not(feature = "ofi"))]
    {
        let _ = (opts, cluster, pinned, plan, limits, progress);
        Err(format!("backend {}: this ordo was built without the `ofi` feature", backend.name()))
    }
}

/// Binds an ofi endpoint for a benchmark member on a loopback contact port.
#[cfg(feature = "ofi")]
pub fn ofi_bind(
    me: u32,
    provider: &str,
    endpoint: ordo_runtime::OfiEndpoint,
    cluster: &str,
    secret: ordo_runtime::Secret,
) -> Result<ordo_fabric_ofi::OfiBinding, String> {
    let mut o =
        ordo_fabric_ofi::OfiOptions::new(me, provider, "127.0.0.1:0".parse().expect("addr"), REGION_LEN);
    o.endpoint = ordo_runtime::wiring::ofi_endpoint(endpoint);
    o.cluster = cluster.to_string();
    o.secret = Some(secret);
    ordo_fabric_ofi::OfiFabric::bind(o).map_err(|e| e.to_string())
}

/// Writes a throwaway CA (`ca.pem`) and a certificate for 127.0.0.1 per
/// member (`m<i>.pem`, `m<i>.key`) to `dir`, for TLS benchmark links.
pub fn write_test_pki(dir: &std::path::Path, members: usize) -> Result<(), String> {
    let e = |e: rcgen::Error| e.to_string();
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).map_err(e)?;
    let write = |name: String, text: String| std::fs::write(dir.join(name), text).map_err(|e| e.to_string());
    write("ca.pem".into(), ca.pem())?;
    for m in 0..members {
        let key = rcgen::KeyPair::generate().map_err(e)?;
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .map_err(e)?
            .signed_by(&key, &ca, &ca_key)
            .map_err(e)?;
        write(format!("m{m}.pem"), cert.pem())?;
        write(format!("m{m}.key"), key.serialize_pem())?;
    }
    Ok(())
}

/// Member `m`'s TLS settings from [`write_test_pki`]'s files.
pub fn test_pki_settings(dir: &std::path::Path, m: usize) -> Result<ordo_fabric_tcp::TlsSettings, String> {
    ordo_fabric_tcp::TlsSettings::from_pem_files(
        &dir.join(format!("m{m}.pem")),
        &dir.join(format!("m{m}.key")),
        &dir.join("ca.pem"),
    )
    .map_err(|e| e.to_string())
}

/// Prints a report as a table.
pub fn print_table(report: &FabricReport) {
    println!("ordo bench fabric — {}", report.machine.summary());
    println!(
        "{:<20} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>11} {:>9}",
        "backend",
        "size",
        "one-way p50",
        "one-way p99",
        "stream",
        "read all",
        "copy ring",
        "vs ring",
        "memcpy",
        "vs memcpy"
    );
    let ns = |v: Option<f64>| v.map(|v| format!("{v:.0} ns")).unwrap_or_else(|| "-".into());
    let gbs = |v: Option<f64>| v.map(|v| format!("{:.2} GB/s", v / 1e9)).unwrap_or_else(|| "-".into());
    let pct = |v: Option<f64>| v.map(|v| format!("{:.0} %", v * 100.0)).unwrap_or_else(|| "-".into());
    for r in &report.rows {
        println!(
            "{:<20} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>11} {:>9}",
            r.backend,
            r.size_bytes,
            ns(r.latency_ns_p50),
            ns(r.latency_ns_p99),
            gbs(r.bandwidth_bytes_per_s),
            gbs(r.read_bandwidth_bytes_per_s),
            gbs(r.copy_ring_bytes_per_s),
            pct(r.bandwidth_vs_copy_ring),
            gbs(r.memcpy_bytes_per_s),
            pct(r.bandwidth_vs_memcpy),
        );
    }
    println!(
        "stream: the peer checks the newest message of each batch (a one-sided write stream); read all: the peer \
         reads every byte, as an application does — compared with the copy ring (vs ring)"
    );
    println!(
        "copy ring: two processes on two cores, the writer copies each message into a shared ring, the reader \
         reads every byte — the cross-core streaming limit (median of {COPY_RING_SAMPLES}); memcpy: one hot \
         core, no cache line migrating, for scale only"
    );
    for r in report.rows.iter().filter(|r| r.backend == "copy-ring") {
        if let Some(s) = r.copy_ring_spread {
            println!("  copy ring {} B: {} GB/s", r.size_bytes, s.show(|v| format!("{:.2}", v / 1e9)));
        }
    }
    if let Some(c) = &report.shm_vs_copy_ring {
        println!("interleaved, {} rounds, median [min–max]:", c.rounds);
        println!("  {}", c.line(|v| format!("{v:.2} GB/s")));
    }
}

impl crate::experiment::Experiment for FabricBenchOptions {
    type Report = FabricReport;

    fn name(&self) -> &'static str {
        "fabric"
    }

    fn measure(&self, progress: &mut dyn FnMut(&str)) -> Result<FabricReport, String> {
        run(self, progress)
    }

    fn print_table(&self, report: &FabricReport) {
        print_table(report)
    }
}
