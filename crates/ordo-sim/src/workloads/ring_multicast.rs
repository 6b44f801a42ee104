//! `ring-multicast`: every member multicasts through its slot ring (the SMC
//! of spindle §II-C) to every other member, with receive counts in the SST
//! as the slot-reuse rule — the substrate of vsync, run on the simulated
//! fabric under per-pair delays, delay spikes and `fault!` points (the ring
//! pushing half of a ready batch).
//!
//! # Protocol
//! - Region: an SST (one row per member, column `received[n]`: how many
//!   messages this member consumed from each sender), then one ring per
//!   sender ([`ordo_ring::RingLayout::ring_offset`]).
//! - A member builds message `k` in place in its ring (payload a pure
//!   function of sender and `k`; the message flags carry the session),
//!   commits it, and its send path pushes every
//!   ready contiguous slot in one write (two on wrap) and then the ring
//!   counter, to every peer — or one message per push when the seed turns
//!   send batching off.
//! - A receiver scans each sender's ring, consumes every new message in one
//!   scan, then sets and pushes its `received` counters.
//! - Reuse rule: a sender reuses message `k`'s slot once every receiver's
//!   `received[sender] > k` (vsync's rule is "delivered everywhere"; here
//!   receipt is delivery).
//!
//! # Checked
//! The [`super::stream`] checkers: integrity (every byte of every payload),
//! no duplication, FIFO without gaps per sender, and liveness (every member
//! receives all `T` messages of every sender). No crashes or partitions:
//! that is the view-change issue's job; this workload pins the failure-free
//! data path of rings and SST.

use super::stream::{self, StreamEvent, session_id};
use super::{Scenario, Workload};
use crate::history::fnv64;
use crate::rng::{SimRng, derive_seed, stream as streams};
use crate::sim::{Ctx, RunLimits, SimProcess};
use crate::world::{FabricConfig, SimConfig};
use crate::{RunFailure, RunOptions, RunReport, SimFabric};
use ordo_fabric::{Fabric, MemberId};
use ordo_ring::{MessageMeta, RingLayout, RingReceiver, SendPath, SlotProducer};
use ordo_sst::{CounterArrayCol, LayoutBuilder, Sst};

/// The workload's name.
pub const NAME: &str = "ring-multicast";

/// The registry entry.
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "SMC-style multicast through slot rings with SST receive counts as the reuse rule; delays, fault points",
    run,
};

fn run(seed: u64, opts: &RunOptions) -> Result<RunReport, RunFailure> {
    crate::execute(NAME, seed, opts, scenario(seed, opts))
}

/// Digest of message `seq` of `session` from `from` (the same for every
/// receiver: it is a multicast).
fn expected_digest(from: MemberId, _to: MemberId, session: u64, seq: u64) -> u64 {
    stream::payload_digest(from, 0, session, seq)
}

/// Parameters of one run, drawn from the seed.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Group size.
    pub members: u32,
    /// Messages each member multicasts.
    pub target: u64,
    /// Ring window (slots per sender).
    pub window: usize,
    /// Most messages a member commits per poll (varies batch sizes).
    pub burst: u64,
    /// Send batching on (push every ready slot) or off (one per push).
    pub batching: bool,
}

/// The scenario of `seed`.
pub fn scenario(seed: u64, _opts: &RunOptions) -> Scenario<StreamEvent> {
    let mut rng = SimRng::new(derive_seed(seed, streams::SCENARIO));
    let params = Params {
        members: rng.range(2, 5) as u32,
        target: rng.range(20, 300),
        window: rng.range(1, 12) as usize,
        burst: rng.range(1, 8),
        batching: rng.chance(800_000),
    };
    let fabric = FabricConfig {
        delay_min_ns: rng.range(200, 2_000),
        delay_max_ns: rng.range(3_000, 40_000),
        spike_ppm: rng.range(0, 20_000) as u32,
        spike_max_ns: rng.range(10_000, 300_000),
        ..FabricConfig::default()
    };
    let layout = Layout::new(params);
    let config =
        SimConfig { members: params.members, region_len: layout.region_len, fabric, ..SimConfig::default() };
    Scenario {
        config,
        faults: None,
        limits: RunLimits { max_time_ns: 2_000_000_000, max_steps: 3_000_000, quiesce_after_ns: None },
        factory: Box::new(move |ctx| Box::new(Member::new(ctx, params))),
        checkers: vec![
            Box::new(stream::Integrity { expected: expected_digest }),
            Box::new(stream::NoDuplication),
            Box::new(stream::FifoNoGaps),
            Box::new(stream::Liveness { target: params.target }),
        ],
    }
}

#[derive(Clone, Debug)]
struct Layout {
    sst: ordo_sst::SstLayout,
    received: CounterArrayCol,
    ring: RingLayout,
    rings_base: usize,
    region_len: usize,
}

impl Layout {
    fn new(p: Params) -> Layout {
        let mut b = LayoutBuilder::new();
        let received = b.counters("received", p.members as usize);
        let sst = b.build();
        let rings_base = sst.table_len(p.members as usize);
        let ring = RingLayout::new(p.window, stream::MAX_PAYLOAD);
        let region_len = rings_base + ring.set_len(p.members as usize);
        Layout { sst, received, ring, rings_base, region_len }
    }
}

struct Member {
    me: MemberId,
    n: u32,
    session: u64,
    params: Params,
    layout: Layout,
    fabric: SimFabric,
    sst: Sst,
    producer: SlotProducer,
    send: SendPath,
    receivers: Vec<Option<RingReceiver>>,
    peers: Vec<MemberId>,
    built: u64,
    metas: Vec<MessageMeta>,
    payload: Vec<u8>,
}

impl Member {
    fn new(ctx: &mut Ctx<'_, StreamEvent>, params: Params) -> Member {
        let me = ctx.member();
        let layout = Layout::new(params);
        let fabric = ctx.fabric().clone();
        let region = fabric.region().clone();
        let members: Vec<MemberId> = (0..params.members).collect();
        let sst = Sst::new(region.clone(), 0, layout.sst.clone(), &members, me).expect("layout fits");
        let (producer, send) = ordo_ring::sender(
            region.clone(),
            layout.ring.ring_offset(layout.rings_base, me as usize),
            layout.ring,
        );
        let receivers = members
            .iter()
            .map(|&s| {
                (s != me).then(|| {
                    RingReceiver::new(
                        region.clone(),
                        layout.ring.ring_offset(layout.rings_base, s as usize),
                        layout.ring,
                    )
                })
            })
            .collect();
        let session = session_id(ctx.incarnation(), 1);
        for p in members.iter().filter(|p| **p != me) {
            ctx.record(StreamEvent::SessionStarted { peer: *p, session });
        }
        Member {
            me,
            n: params.members,
            session,
            params,
            layout,
            fabric,
            sst,
            producer,
            send,
            receivers,
            peers: members.into_iter().filter(|p| *p != me).collect(),
            built: 0,
            metas: Vec::new(),
            payload: Vec::new(),
        }
    }

    fn anomaly(ctx: &mut Ctx<'_, StreamEvent>, peer: MemberId, what: String) {
        ctx.record(StreamEvent::Anomaly { peer, what });
    }

    /// Application side: build up to `burst` messages in place.
    fn build(&mut self, ctx: &mut Ctx<'_, StreamEvent>) -> usize {
        let mut work = 0;
        while self.built < self.params.target && work < self.params.burst as usize {
            let Some(mut slot) = self.producer.try_acquire() else { break };
            let seq = self.built + 1;
            assert_eq!(slot.index(), self.built, "ring indices follow the build order");
            stream::payload(self.me, 0, self.session, seq, &mut self.payload);
            slot.payload()[..self.payload.len()].copy_from_slice(&self.payload);
            // The flags carry the session (24 bits), so receivers need no
            // side channel to know which session a message belongs to.
            slot.commit(self.payload.len(), self.session as u32);
            for &p in &self.peers {
                ctx.record(StreamEvent::Sent { peer: p, session: self.session, seq });
            }
            self.built += 1;
            work += 1;
        }
        work
    }

    /// The send predicate: push the ready batch to every peer.
    fn push(&mut self, ctx: &mut Ctx<'_, StreamEvent>) -> usize {
        let limit = if self.params.batching { u64::MAX } else { 1 };
        let Some(plan) = self.send.plan(limit) else { return 0 };
        if let Err(e) = SendPath::post(&plan, &mut self.fabric, &self.peers) {
            Self::anomaly(ctx, self.me, format!("posting a ring batch failed: {e}"));
        }
        1
    }

    /// The receive predicate: consume every new message of every sender in
    /// one scan each, then push the receive counts once.
    fn receive(&mut self, ctx: &mut Ctx<'_, StreamEvent>) -> usize {
        let mut consumed_any = false;
        for s in 0..self.n {
            let Some(rx) = self.receivers[s as usize].as_mut() else { continue };
            self.metas.clear();
            match rx.scan(u64::MAX, &mut self.metas) {
                Ok(0) => continue,
                Ok(n) => {
                    for m in &self.metas {
                        let bytes = rx.payload(m);
                        ctx.record(StreamEvent::Delivered {
                            peer: s,
                            session: u64::from(m.flags),
                            seq: m.index + 1,
                            len: bytes.len() as u32,
                            digest: fnv64(bytes),
                        });
                    }
                    rx.consume(n);
                    self.sst.set_counter_at(self.layout.received, s as usize, rx.consumed() as i64);
                    consumed_any = true;
                }
                Err(e) => Self::anomaly(ctx, s, format!("ring of m{s}: {e}")),
            }
        }
        if consumed_any {
            let range = self.layout.received.range(0, self.n as usize);
            if let Err(e) = self.sst.push(&mut self.fabric, range, None) {
                Self::anomaly(ctx, self.me, format!("pushing receive counts failed: {e}"));
            }
            return 1;
        }
        0
    }

    /// The reuse rule: every receiver has consumed it.
    fn reclaim(&mut self) -> usize {
        let mut min = self.send.published();
        for &p in &self.peers {
            let row = self.sst.row_of(p).expect("member row");
            let got = self.sst.counter_at(row, self.layout.received, self.me as usize).max(0) as u64;
            min = min.min(got);
        }
        if min > self.send.reclaimable() {
            self.send.set_reclaimable(min);
            return 1;
        }
        0
    }
}

impl SimProcess<StreamEvent> for Member {
    fn poll(&mut self, ctx: &mut Ctx<'_, StreamEvent>) -> usize {
        let mut events = Vec::new();
        self.fabric.poll_events(&mut events);
        self.build(ctx) + self.push(ctx) + self.receive(ctx) + self.reclaim()
    }

    fn done(&self) -> bool {
        self.built == self.params.target
            && self.send.reclaimable() == self.params.target
            && self.receivers.iter().flatten().all(|r| r.consumed() == self.params.target)
    }
}
