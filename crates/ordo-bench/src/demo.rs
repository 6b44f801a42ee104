//! The main job, `ordo demo`: a vsync group of member processes on the shm
//! fabric, every member sending `size`-byte messages for a few seconds, and
//! what each member delivered.
//!
//! Each member runs one duty-cycle thread ([`DemoAgent`]): it fills every
//! free slot of its ring with a message built in place (the first 8 bytes
//! are the send time on the host's monotonic clock, shared by all
//! processes), then runs the vsync predicates. Delivery upcalls are batched
//! and record send-to-delivery latency. When the sending window closes,
//! members keep running until every message is delivered everywhere
//! (null-sends finish the last rounds), then report.
//!
//! # Invariants
//! - Throughput counts only bytes delivered inside the sending window.
//! - The run is bounded: a member that cannot finish within `duration + 30
//!   s` reports an error instead of waiting forever.

use hdrhistogram::Histogram;
use ordo_fabric::MemberId;
use ordo_runtime::{
    Agent, Delivery, IdleStrategy, OrdoConfig, Runner, RunnerOptions, SubgroupHandle, ThreadingMode,
    VsyncMember, connect_fabric,
};
use ordo_vsync::{SendError, Switches};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Nanoseconds on the host's monotonic clock (comparable across processes).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall (vDSO) writing into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Rounds a member declares silent when it stops sending.
const FINAL_DECLARATION: u64 = 1 << 16;

/// What a demo run is.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DemoOptions {
    /// Group size (ids `0..members`, all senders).
    pub members: u32,
    /// Message size in bytes (≥ 8).
    pub size: usize,
    /// Sending window.
    pub duration: Duration,
    /// shm cluster name (separates concurrent runs).
    pub cluster: String,
    /// Slots per sender.
    pub window: usize,
    /// Spindle switches.
    pub switches: Switches,
}

/// One member's results.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemberReport {
    /// The member.
    pub member: MemberId,
    /// Application messages it sent.
    pub sent_messages: u64,
    /// Messages delivered to it inside the sending window.
    pub delivered_messages: u64,
    /// Their bytes.
    pub delivered_bytes: u64,
    /// Length of the sending window, seconds.
    pub window_s: f64,
    /// Send-to-delivery latency, p50, ns (all messages delivered here).
    pub latency_ns_p50: u64,
    /// p99, ns.
    pub latency_ns_p99: u64,
    /// Mean messages per send push.
    pub send_batch_mean: f64,
    /// Mean messages per receive batch.
    pub receive_batch_mean: f64,
    /// Mean seqs per delivery batch.
    pub delivery_batch_mean: f64,
    /// Null rounds it sent while streaming (the final declared inactivity
    /// excluded).
    pub nulls_sent: u64,
    /// Messages delivered in total (window and drain).
    pub delivered_total: u64,
    /// Whether its subgroup ran zero-copy (read the others' rings in place).
    #[serde(default)]
    pub zero_copy: bool,
}

impl MemberReport {
    /// Delivered bytes per second inside the window.
    pub fn bytes_per_s(&self) -> f64 {
        self.delivered_bytes as f64 / self.window_s.max(1e-9)
    }
    /// Delivered messages per second inside the window.
    pub fn messages_per_s(&self) -> f64 {
        self.delivered_messages as f64 / self.window_s.max(1e-9)
    }
}

/// State shared between the delivery upcall and the reporting thread.
#[derive(Default)]
struct Shared {
    window_end_ns: AtomicU64,
    in_window_bytes: AtomicU64,
    latency: Mutex<Option<Histogram<u64>>>,
}

/// A member's duty cycle: send into every free slot, then run the
/// predicates.
pub struct DemoAgent {
    member: VsyncMember<ordo_runtime::MemberFabric>,
    handle: SubgroupHandle,
    size: usize,
    sending: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
}

impl Agent for DemoAgent {
    fn name(&self) -> &str {
        "demo-member"
    }

    fn do_work(&mut self, now_ns: u64) -> usize {
        let mut work = 0;
        if self.sending.load(Ordering::Acquire) {
            let stamp = monotonic_ns();
            loop {
                match self
                    .handle
                    .try_send_with(self.size, |buf| buf[..8].copy_from_slice(&stamp.to_le_bytes()))
                {
                    Ok(()) => {
                        self.sent.fetch_add(1, Ordering::Relaxed);
                        work += 1;
                    }
                    Err(SendError::WouldBlock) | Err(SendError::Wedged) => break,
                    Err(e) => panic!("demo send: {e}"),
                }
            }
        }
        work + self.member.do_work(now_ns)
    }

    fn doorbell(&self) -> Option<ordo_fabric::Doorbell> {
        self.member.doorbell()
    }
}

/// Runs member `id` of the demo group to completion. `progress` is called
/// about every 100 ms with (bytes delivered here so far, seconds elapsed).
pub fn run_member(
    opts: &DemoOptions,
    id: MemberId,
    mut progress: impl FnMut(u64, f64),
) -> Result<MemberReport, String> {
    assert!(opts.size >= 8, "messages carry an 8-byte timestamp");
    let members: Vec<String> = (0..opts.members).map(|m| m.to_string()).collect();
    let sets = vec![
        format!("member.id={id}"),
        format!("group.members=[{}]", members.join(",")),
        format!("fabric.shm.cluster=\"{}\"", opts.cluster),
        format!("vsync.window={}", opts.window),
        format!("vsync.max_payload={}", opts.size),
    ];
    let mut config = OrdoConfig::load(None, std::iter::empty(), &sets).map_err(|e| e.to_string())?;
    config.vsync.switches = opts.switches;
    let group = config.vsync_group().map_err(|e| e.to_string())?;
    config.fabric.region_bytes = ordo_vsync::GroupLayout::new(&group).region_len.next_multiple_of(64);
    let fabric = connect_fabric(&config).map_err(|e| e.to_string())?;
    let shared = Arc::new(Shared {
        window_end_ns: AtomicU64::new(u64::MAX),
        latency: Mutex::new(Some(Histogram::new(3).expect("histogram"))),
        ..Default::default()
    });
    let s2 = shared.clone();
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut batches = 0u64;
    let delivery = Delivery::Inline(Box::new(move |batch| {
        let now = monotonic_ns();
        let window_end = s2.window_end_ns.load(Ordering::Relaxed);
        let mut bytes = 0;
        for d in batch {
            let sent = u64::from_le_bytes(d.payload[..8].try_into().expect("8-byte stamp"));
            let _ = hist.record(now.saturating_sub(sent).max(1));
            bytes += d.payload.len() as u64;
        }
        if now <= window_end {
            s2.in_window_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        batches += 1;
        if batches.is_multiple_of(64)
            && let Ok(mut l) = s2.latency.try_lock()
        {
            l.replace(hist.clone());
        }
    }));
    let (member, mut handles, _) = VsyncMember::new(fabric, group, delivery).map_err(|e| e.to_string())?;
    let counters = member.counters();
    let handle = handles.remove(0).ok_or("every demo member sends")?;
    let declare = handle.clone();
    let sending = Arc::new(AtomicBool::new(true));
    let sent = Arc::new(AtomicU64::new(0));
    let agent = DemoAgent { member, handle, size: opts.size, sending: sending.clone(), sent: sent.clone() };
    // One polling thread per member process, all on this host: when they
    // outnumber the cores, hand the core off instead of spinning.
    let idle = IdleStrategy::for_threads_on_host(
        opts.members as usize,
        IdleStrategy::BackoffPark {
            spins: 2_000,
            yields: 200,
            park_min: Duration::from_micros(20),
            park_max: Duration::from_micros(500),
        },
    );
    let runner = Runner::start(vec![agent], &RunnerOptions::new(ThreadingMode::Dedicated, idle))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    while start.elapsed() < opts.duration {
        std::thread::sleep(Duration::from_millis(100).min(opts.duration.saturating_sub(start.elapsed())));
        progress(counters.delivered_bytes.load(Ordering::Relaxed), start.elapsed().as_secs_f64());
    }
    shared.window_end_ns.store(monotonic_ns(), Ordering::Relaxed);
    let window_s = start.elapsed().as_secs_f64();
    let in_window_bytes = shared.in_window_bytes.load(Ordering::Relaxed);
    sending.store(false, Ordering::Release);
    // Done sending: declare the rest of the run silent, so the others'
    // last rounds are delivered without waiting for ours (spindle §III-B,
    // declared inactivity; needed with null-sends off).
    declare.declare_inactive(FINAL_DECLARATION);
    // Drain: everything sent is delivered everywhere once deliveries stop
    // moving for a while (each member's last messages need the others').
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (u64::MAX, Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let d = counters.delivered_messages.load(Ordering::Relaxed);
        if d != last.0 {
            last = (d, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(500) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("member {id}: deliveries did not settle"));
        }
    }
    let joined = runner.join();
    let agent = &joined.agents[0];
    let stats = agent.member.stats(0).clone();
    let hist = shared.latency.lock().expect("latency").take().expect("histogram");
    let hist = if hist.is_empty() { Histogram::new(3).expect("h") } else { hist };
    Ok(MemberReport {
        member: id,
        sent_messages: sent.load(Ordering::Relaxed),
        delivered_messages: in_window_bytes / opts.size as u64,
        delivered_bytes: in_window_bytes,
        window_s,
        latency_ns_p50: hist.value_at_quantile(0.5),
        latency_ns_p99: hist.value_at_quantile(0.99),
        send_batch_mean: stats.send_batches.mean(),
        receive_batch_mean: stats.receive_batches.mean(),
        delivery_batch_mean: stats.delivery_batches.mean(),
        nulls_sent: stats.nulls_sent.saturating_sub(FINAL_DECLARATION),
        delivered_total: stats.messages_delivered,
        zero_copy: agent.member.engine().zero_copy(0),
    })
}
