//! One point of the Spindle benchmark: the group of `members` engines on
//! runner threads over shm in this process, the application's send loop,
//! delivery handlers, and the OS probes (process CPU time, run-queue wait)
//! that tell whether the point was measured on a quiet machine.

#![allow(unused_imports)]

use super::*;
use crate::demo::monotonic_ns;
use crate::machine::MachineInfo;
use hdrhistogram::Histogram;
use ordo_fabric::MemberId;
use ordo_fabric_shm::{ShmFabric, ShmOptions};
use ordo_runtime::wiring::MemberFabric;
use ordo_runtime::{
    Agent, Delivery, IdleStrategy, Runner, RunnerOptions, SubgroupHandle, ThreadingMode, VsyncMember,
};
use ordo_vsync::{
    BatchHistogram, DeliveryMode, GroupConfig, SendError, SubgroupConfig, SubgroupStats, Switches,
};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// One point.

/// Delivery-side state of one member.
pub(super) struct Live {
    start_ns: Arc<AtomicU64>,
    end_ns: Arc<AtomicU64>,
    bytes: AtomicU64,
    messages: AtomicU64,
    latency: Mutex<Histogram<u64>>,
}

/// A member's duty cycle: send into every free slot of its active
/// subgroups (held back when delayed), then run the vsync predicates.
pub struct SpindleAgent {
    member: VsyncMember<MemberFabric>,
    handles: Vec<SubgroupHandle>,
    size: usize,
    delay: Delay,
    last_send_ns: u64,
    /// The external buffer a memcpy sender copies from.
    source: Option<Vec<u8>>,
    sending: Arc<AtomicBool>,
    /// The measurement window's start (u64::MAX before it opens).
    window_start_ns: Arc<AtomicU64>,
    /// Engine stats of the active subgroups when this agent saw the window
    /// open, and when it stopped sending (the window's batch statistics are
    /// the difference: warm-up and drain left out).
    stats_at_start: Option<Vec<SubgroupStats>>,
    stats_at_stop: Option<Vec<SubgroupStats>>,
    active: usize,
    declared: bool,
    quiet: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
}

impl SpindleAgent {
    fn snapshot(&self) -> Vec<SubgroupStats> {
        (0..self.active).map(|g| self.member.stats(g).clone()).collect()
    }

    fn build(&self, buf: &mut [u8], stamp: u64) {
        if let Some(src) = &self.source {
            buf.copy_from_slice(&src[..buf.len()]);
        }
        if buf.len() >= 8 {
            buf[..8].copy_from_slice(&stamp.to_le_bytes());
        } else {
            buf[0] = stamp as u8;
        }
    }

    fn send_one(&self, h: &SubgroupHandle, stamp: u64) -> bool {
        match h.try_send_with(self.size, |buf| self.build(buf, stamp)) {
            Ok(()) => true,
            Err(SendError::WouldBlock) | Err(SendError::Wedged) => false,
            Err(e) => panic!("spindle bench send: {e}"),
        }
    }

    fn send(&mut self) -> usize {
        let mut sent = 0u64;
        match self.delay {
            Delay::Forever => {}
            Delay::None => {
                let stamp = monotonic_ns();
                for h in &self.handles {
                    while self.send_one(h, stamp) {
                        sent += 1;
                    }
                }
            }
            Delay::Every(d) => {
                let now = monotonic_ns();
                if now >= self.last_send_ns + d.as_nanos() as u64 {
                    for h in &self.handles {
                        if self.send_one(h, now) {
                            sent += 1;
                            self.last_send_ns = now;
                        }
                    }
                }
            }
        }
        if sent > 0 {
            self.sent.fetch_add(sent, Ordering::Relaxed);
        }
        sent as usize
    }
}

impl Agent for SpindleAgent {
    fn name(&self) -> &str {
        "spindle-member"
    }

    fn do_work(&mut self, now_ns: u64) -> usize {
        let mut work = 0;
        if !self.declared {
            if self.stats_at_start.is_none() && self.window_start_ns.load(Ordering::Relaxed) != u64::MAX {
                self.stats_at_start = Some(self.snapshot());
            }
            if self.sending.load(Ordering::Acquire) {
                work += self.send();
            } else {
                self.stats_at_stop = Some(self.snapshot());
                // Done: the rest of the run is silent (spindle §III-B
                // declared inactivity), so the others' last rounds deliver.
                for h in &self.handles {
                    h.declare_inactive(FINAL_DECLARATION);
                }
                self.declared = true;
                self.quiet.store(true, Ordering::Release);
                work += 1;
            }
        }
        work + self.member.do_work(now_ns)
    }

    fn doorbell(&self) -> Option<ordo_fabric::Doorbell> {
        self.member.doorbell()
    }
}

/// Runs one point to completion (see the module docs).
pub fn run_point(p: &Point, plan: Plan, cluster: &str) -> Result<Measurement, String> {
    assert!(p.members >= 2 && p.senders >= 1 && p.senders <= p.members && p.active <= p.subgroups);
    assert!(p.threads >= 1, "a point runs on at least one runner thread");
    let (threads, placement) = (p.threads, p.placement);
    let ids: Vec<MemberId> = (0..p.members).collect();
    let senders: Vec<MemberId> = (0..p.senders).collect();
    let group = GroupConfig {
        members: ids.clone(),
        subgroups: (0..p.subgroups)
            .map(|_| SubgroupConfig {
                name: String::new(),
                descriptor: Vec::new(),
                members: ids.clone(),
                senders: senders.clone(),
                window: p.window,
                max_payload: p.size,
                mode: DeliveryMode::Ordered,
            })
            .collect(),
        switches: p.switches,
    };
    group.validate().map_err(|e| e.to_string())?;
    let region_len = ordo_vsync::GroupLayout::new(&group).region_len.next_multiple_of(64);
    // Every member's endpoint, created concurrently (each waits for the
    // others' files). Members of runner thread r park on member r's bell.
    let fabrics: Vec<MemberFabric> = match p.fabric {
        super::PointFabric::Shm => std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .map(|&m| {
                    let ids = ids.clone();
                    s.spawn(move || {
                        let mut o = ShmOptions::new(cluster, m, ids, region_len);
                        o.doorbell_owner = Some(placement.thread_of(m, threads) as MemberId);
                        // Liveness is not what is measured: check peers every
                        // 100 ms, not every 1 ms (a flock syscall per peer).
                        o.liveness_check_interval = Duration::from_millis(100);
                        ShmFabric::create(o).map(MemberFabric::Shm).map_err(|e| format!("member {m}: {e}"))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("fabric thread")).collect::<Result<Vec<_>, _>>()
        })?,
        #[cfg(feature = "ofi")]
        super::PointFabric::Ofi(provider, endpoint) => {
            ordo_runtime::wiring::connect_local_ofi_group(provider, endpoint, cluster, &ids, region_len)
                .map_err(|e| format!("ofi {provider}: {e}"))?
        }
        #[cfg(not(feature = "ofi"))]
        super::PointFabric::Ofi(provider, _) => {
            return Err(format!("ofi {provider}: this ordo was built without the `ofi` feature"));
        }
    };
    let start_ns = Arc::new(AtomicU64::new(u64::MAX));
    let end_ns = Arc::new(AtomicU64::new(u64::MAX));
    let sending = Arc::new(AtomicBool::new(true));
    let mut lives = Vec::new();
    let mut counters = Vec::new();
    let mut quiets = Vec::new();
    let mut sents = Vec::new();
    let mut agents: Vec<Vec<SpindleAgent>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, fabric) in fabrics.into_iter().enumerate() {
        let live = Arc::new(Live {
            start_ns: start_ns.clone(),
            end_ns: end_ns.clone(),
            bytes: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            latency: Mutex::new(Histogram::new(3).expect("histogram")),
        });
        let own = p.latency_at_sender.then_some(i as MemberId);
        let delivery = delivery(live.clone(), p.size, p.memcpy, own);
        let (member, handles, _) =
            VsyncMember::new(fabric, group.clone(), delivery).map_err(|e| e.to_string())?;
        counters.push(member.counters());
        let handles: Vec<SubgroupHandle> = handles.into_iter().take(p.active as usize).flatten().collect();
        let is_sender = (i as u32) < p.senders;
        let delayed = is_sender && i as u32 >= p.senders - p.delayed;
        let quiet = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        agents[p.placement.thread_of(i as u32, threads)].push(SpindleAgent {
            member,
            handles,
            size: p.size,
            delay: if delayed { p.delay } else { Delay::None },
            last_send_ns: 0,
            source: p.memcpy.then(|| vec![0x5A; p.size]),
            sending: sending.clone(),
            window_start_ns: start_ns.clone(),
            stats_at_start: None,
            stats_at_stop: None,
            active: p.active as usize,
            declared: false,
            quiet: quiet.clone(),
            sent: sent.clone(),
        });
        lives.push(live);
        quiets.push(quiet);
        sents.push(sent);
    }
    let idle = IdleStrategy::BackoffPark {
        spins: 2_000,
        yields: 200,
        park_min: Duration::from_micros(20),
        park_max: Duration::from_micros(500),
    };
    let options = RunnerOptions::new(ThreadingMode::Shared, idle);
    let runners = agents
        .into_iter()
        .map(|a| Runner::start(a, &options).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::sleep(plan.warmup);
    let probe = crate::noise::Probe::start();
    let t0 = monotonic_ns();
    start_ns.store(t0, Ordering::Release);
    std::thread::sleep(plan.duration);
    let t1 = monotonic_ns();
    end_ns.store(t1, Ordering::Release);
    let crate::noise::Load { cpu_cores, runqueue_wait_cores, .. } = probe.stop();
    let window_s = (t1 - t0) as f64 / 1e9;
    sending.store(false, Ordering::Release);
    // Drain: every member delivers every message sent.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let drained = loop {
        let all_quiet = quiets.iter().all(|q| q.load(Ordering::Acquire));
        let total: u64 = sents.iter().map(|s| s.load(Ordering::Relaxed)).sum();
        let delivered: Vec<u64> =
            counters.iter().map(|c| c.delivered_messages.load(Ordering::Relaxed)).collect();
        if all_quiet && delivered.iter().all(|d| *d == total) {
            break Ok(total);
        }
        if Instant::now() > deadline {
            break Err(format!(
                "did not drain within {DRAIN_TIMEOUT:?}: {total} messages sent, delivered per member {delivered:?}, \
                 quiet {:?}",
                quiets.iter().map(|q| q.load(Ordering::Relaxed)).collect::<Vec<_>>()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    // Every runner is joined before any error is returned.
    let joined: Vec<_> = runners.into_iter().map(|r| r.try_join().map_err(|e| e.to_string())).collect();
    let joined = joined.into_iter().collect::<Result<Vec<_>, _>>()?;
    let messages_sent = drained?;
    let mut m = Measurement {
        window_s,
        messages_sent,
        cpu_cores,
        runqueue_wait_cores,
        attempts: 1,
        ..Default::default()
    };
    let n = f64::from(p.members);
    for live in &lives {
        m.throughput_bytes_per_s += live.bytes.load(Ordering::Relaxed) as f64 / window_s / n;
        m.messages_per_s += live.messages.load(Ordering::Relaxed) as f64 / window_s / n;
    }
    if p.size >= 8 {
        let mut all = Histogram::<u64>::new(3).expect("histogram");
        for live in &lives {
            all.add(&*live.latency.lock().expect("latency")).map_err(|e| e.to_string())?;
        }
        if !all.is_empty() {
            m.latency_ns_p50 = Some(all.value_at_quantile(0.5));
            m.latency_ns_p99 = Some(all.value_at_quantile(0.99));
        }
    }
    for agent in joined.iter().flat_map(|j| j.agents.iter()) {
        let (Some(start), Some(stop)) = (&agent.stats_at_start, &agent.stats_at_stop) else {
            return Err(format!("member {} took no stats snapshot", agent.member.engine().member()));
        };
        for (a, b) in start.iter().zip(stop) {
            m.send_batches.merge(&histogram_diff(&b.send_batches, &a.send_batches));
            m.receive_batches.merge(&histogram_diff(&b.receive_batches, &a.receive_batches));
            m.delivery_batches.merge(&histogram_diff(&b.delivery_batches, &a.delivery_batches));
            m.nulls_sent += b.nulls_sent - a.nulls_sent;
        }
    }
    // Agents (and with them the fabrics and their region files) drop here.
    Ok(m)
}

/// `later − earlier` of one histogram's counts (`max` is the later one's:
/// a maximum cannot be subtracted).
pub(super) fn histogram_diff(later: &BatchHistogram, earlier: &BatchHistogram) -> BatchHistogram {
    let mut d = later.clone();
    for (x, y) in d.buckets.iter_mut().zip(earlier.buckets.iter()) {
        *x -= y;
    }
    d.batches -= earlier.batches;
    d.items -= earlier.items;
    d
}

/// The delivery handler of one member: counts bytes and messages, and
/// records send-to-delivery latency — of every message, or, with `own`
/// set, only of the messages that member sent.
pub(super) fn delivery(live: Arc<Live>, size: usize, memcpy: bool, own: Option<MemberId>) -> Delivery {
    let mut copy = vec![0u8; if memcpy { size } else { 0 }];
    Delivery::Inline(Box::new(move |batch| {
        let now = monotonic_ns();
        if memcpy {
            for d in batch {
                copy[..d.payload.len()].copy_from_slice(d.payload);
                std::hint::black_box(&mut copy);
            }
        }
        if now < live.start_ns.load(Ordering::Relaxed) || now > live.end_ns.load(Ordering::Relaxed) {
            return;
        }
        let mut bytes = 0u64;
        if size >= 8 {
            let mut h = live.latency.lock().unwrap_or_else(|p| p.into_inner());
            for d in batch {
                if own.is_none_or(|me| d.sender == me) {
                    let sent = u64::from_le_bytes(d.payload[..8].try_into().expect("8-byte stamp"));
                    let _ = h.record(now.saturating_sub(sent).max(1));
                }
                bytes += d.payload.len() as u64;
            }
        } else {
            bytes = batch.iter().map(|d| d.payload.len() as u64).sum();
        }
        live.bytes.fetch_add(bytes, Ordering::Relaxed);
        live.messages.fetch_add(batch.len() as u64, Ordering::Relaxed);
    }))
}
