//! `fabric-stream`: every member streams guarded messages to every peer over
//! the simulated fabric, under delays, partitions and crash/restart.
//!
//! # Protocol (the guarded publish of `ordo_fabric::conformance`, per pair)
//! - Sender `s` owns, in every region, a block per receiver `r`: a **guard**
//!   word and a ring of [`SLOTS`] slots. It builds message `k` in slot
//!   `(k-1) % SLOTS` of its own region, posts the slot, then posts the guard
//!   `(session << 40) | k` (several messages may share one guard write).
//! - Receiver `r` loads the guard with `Acquire`, reads every message up to
//!   it, checks each slot's header (session, seq, len), records the
//!   payload's digest, and posts its **ack** word `(session << 40) | k` back
//!   into `s`'s region. `s` reuses a slot only once it is acked (window of
//!   [`SLOTS`]).
//! - A **session** starts with the guard `(session, 0)` alone; the sender
//!   sends data only after the receiver acked `(session, 0)`. So a receiver
//!   never sees a session it did not see open, and slots of the old session
//!   are never overwritten while the receiver may still read them under the
//!   old guard.
//! - Each member posts a signaled **heartbeat** to every peer periodically: a
//!   lost one breaks the link, so a crashed or restarted peer is suspected
//!   even on an idle link. A suspected link is reconnected (retried on a
//!   timer); after a reconnect the sender starts a new session and the
//!   receiver re-posts its ack.
//!
//! # Checked
//! The four checkers of [`super::stream`]: integrity, no duplication, FIFO
//! without gaps per (sender, receiver incarnation, session), and liveness
//! after the faults calm.

use super::stream::{self, StreamEvent, session_id};
use super::{Scenario, Workload};
use crate::history::fnv64;
use crate::rng::{SimRng, derive_seed, stream as streams};
use crate::sim::{Ctx, FaultPlan, RunLimits, SimProcess};
use crate::world::{FabricConfig, SimConfig};
use crate::{RunFailure, RunOptions, RunReport, SimFabric};
use ordo_fabric::{Fabric, FabricEvent, MemberId, PostError, Write, WriteTag};

/// The workload's name.
pub const NAME: &str = "fabric-stream";

/// The registry entry.
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "guarded message streams between every pair over the simulated fabric; partitions, crash/restart",
    run,
};

fn run(seed: u64, opts: &RunOptions) -> Result<RunReport, RunFailure> {
    crate::execute(NAME, seed, opts, scenario(seed, opts))
}

/// Slots per ring (the flow-control window).
pub const SLOTS: u64 = 8;
const SLOT_SIZE: usize = 256;
const HEADER: usize = 24;
const HB_BASE: usize = 0;
const ACK_BASE: usize = 64;
const MAX_MEMBERS: usize = 8;
const DATA_BASE: usize = ACK_BASE + MAX_MEMBERS * MAX_MEMBERS * 8;
const BLOCK: usize = 64 + SLOTS as usize * SLOT_SIZE;
const SEQ_BITS: u32 = 40;

const _: () = assert!(HEADER + stream::MAX_PAYLOAD <= SLOT_SIZE);
const _: () = assert!(DATA_BASE.is_multiple_of(64) && BLOCK.is_multiple_of(64));

/// Region layout for a group of `n`:
///
/// ```text
/// 0      heartbeat words, one per member (8 B each)
/// 64     ack words: ack of receiver r for sender s at 64 + (r*8 + s)*8
/// 576    blocks: block of (sender s, receiver r) at 576 + (s*n + r)*BLOCK
///          +0   guard word (session << 40 | seq)
///          +64  SLOTS slots of 256 B: session u64, seq u64, len u32, pad u32, payload
/// ```
#[derive(Clone, Copy, Debug)]
struct Layout {
    n: usize,
}

impl Layout {
    fn region_len(self) -> usize {
        DATA_BASE + self.n * self.n * BLOCK
    }
    fn heartbeat(self, member: MemberId) -> usize {
        HB_BASE + member as usize * 8
    }
    fn ack(self, receiver: MemberId, sender: MemberId) -> usize {
        ACK_BASE + (receiver as usize * MAX_MEMBERS + sender as usize) * 8
    }
    fn guard(self, sender: MemberId, receiver: MemberId) -> usize {
        DATA_BASE + (sender as usize * self.n + receiver as usize) * BLOCK
    }
    fn slot(self, sender: MemberId, receiver: MemberId, seq: u64) -> usize {
        self.guard(sender, receiver) + 64 + ((seq - 1) % SLOTS) as usize * SLOT_SIZE
    }
}

fn pack(session: u64, seq: u64) -> u64 {
    debug_assert!(session < 1 << 24 && seq < 1 << SEQ_BITS);
    (session << SEQ_BITS) | seq
}

fn unpack(word: u64) -> (u64, u64) {
    (word >> SEQ_BITS, word & ((1 << SEQ_BITS) - 1))
}

/// Parameters of one run, drawn from the seed.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Group size.
    pub members: u32,
    /// Messages per session.
    pub target: u64,
    /// Interval of the signaled heartbeat to each peer.
    pub heartbeat_ns: u64,
    /// Interval between reconnect attempts to a suspected peer.
    pub reconnect_ns: u64,
}

/// The scenario of `seed`.
pub fn scenario(seed: u64, _opts: &RunOptions) -> Scenario<StreamEvent> {
    let mut rng = SimRng::new(derive_seed(seed, streams::SCENARIO));
    let members = rng.range(2, 5) as u32;
    let params = Params {
        members,
        target: rng.range(20, 200),
        heartbeat_ns: rng.range(30_000, 150_000),
        reconnect_ns: rng.range(20_000, 200_000),
    };
    let fabric = FabricConfig {
        delay_min_ns: rng.range(200, 2_000),
        delay_max_ns: rng.range(3_000, 40_000),
        spike_ppm: rng.range(0, 5_000) as u32,
        spike_max_ns: rng.range(10_000, 300_000),
        ack_delay_min_ns: 200,
        ack_delay_max_ns: rng.range(500, 10_000),
        completion_timeout_ns: rng.range(100_000, 600_000),
        ..FabricConfig::default()
    };
    let plan = FaultPlan::draw(&mut rng, members);
    let until = plan.until_ns;
    let settle = 2
        * (params.heartbeat_ns + fabric.completion_timeout_ns + params.reconnect_ns + fabric.spike_max_ns)
        + 200_000;
    let config = SimConfig {
        members,
        region_len: Layout { n: members as usize }.region_len(),
        fabric,
        ..SimConfig::default()
    };
    Scenario {
        config,
        faults: Some(plan),
        limits: RunLimits::after_faults(until, settle),
        factory: Box::new(move |ctx| Box::new(Member::new(ctx, params))),
        checkers: stream::checkers(params.target),
    }
}

#[derive(Debug, Default)]
struct Peer {
    /// Our link to the peer is up (not suspected).
    up: bool,
    next_reconnect_ns: u64,
    heartbeat_outstanding: bool,
    next_heartbeat_ns: u64,
    // Our stream to the peer.
    session: u64,
    open: bool,
    next_seq: u64,
    acked: u64,
    complete: bool,
    // The peer's stream to us.
    in_session: u64,
    consumed: u64,
    ack_dirty: bool,
}

/// One member of the workload.
struct Member {
    me: MemberId,
    incarnation: u64,
    layout: Layout,
    params: Params,
    fabric: SimFabric,
    peers: Vec<Option<Peer>>,
    sessions: u64,
    heartbeat: u64,
    events: Vec<FabricEvent>,
    buf: Vec<u8>,
    expected: Vec<u8>,
}

impl Member {
    fn new(ctx: &mut Ctx<'_, StreamEvent>, params: Params) -> Member {
        let me = ctx.member();
        let mut m = Member {
            me,
            incarnation: ctx.incarnation(),
            layout: Layout { n: params.members as usize },
            params,
            fabric: ctx.fabric().clone(),
            peers: (0..params.members).map(|p| (p != me).then(Peer::default)).collect(),
            sessions: 0,
            heartbeat: 0,
            events: Vec::new(),
            buf: vec![0; SLOT_SIZE],
            expected: Vec::with_capacity(stream::MAX_PAYLOAD),
        };
        for p in 0..params.members {
            if p != me {
                m.peer(p).up = true;
                m.start_session(ctx, p);
            }
        }
        m
    }

    fn peer(&mut self, p: MemberId) -> &mut Peer {
        self.peers[p as usize].as_mut().expect("a peer")
    }

    /// Posts `w`; `false` if it was not posted (link down or back-pressure).
    fn post(&mut self, w: Write) -> bool {
        match self.fabric.post_write(w) {
            Ok(()) => true,
            Err(PostError::PeerSuspected(p)) => {
                self.peer(p).up = false;
                false
            }
            Err(PostError::Backpressure(_)) => false,
            Err(e) => panic!("fabric-stream posted a bad write: {e}"),
        }
    }

    fn start_session(&mut self, ctx: &mut Ctx<'_, StreamEvent>, p: MemberId) {
        self.sessions += 1;
        let session = session_id(self.incarnation, self.sessions);
        let peer = self.peer(p);
        peer.session = session;
        peer.open = false;
        peer.next_seq = 1;
        peer.acked = 0;
        peer.complete = false;
        let guard = self.layout.guard(self.me, p);
        self.fabric.region().store_release(guard, pack(session, 0));
        ctx.record(StreamEvent::SessionStarted { peer: p, session });
        self.post(Write::new(p, guard, 8));
    }

    fn on_events(&mut self, ctx: &mut Ctx<'_, StreamEvent>) -> usize {
        let mut events = std::mem::take(&mut self.events);
        self.fabric.poll_events(&mut events);
        let work = events.len();
        for e in events.drain(..) {
            match e {
                FabricEvent::Completed { peer, .. } | FabricEvent::Failed { peer, .. } => {
                    self.peer(peer).heartbeat_outstanding = false;
                }
                FabricEvent::Suspected { peer, .. } => {
                    let now = ctx.now();
                    let p = self.peer(peer);
                    p.up = false;
                    p.next_reconnect_ns = now;
                }
                FabricEvent::Reconnected { .. } => {}
            }
        }
        self.events = events;
        work
    }

    fn try_reconnect(&mut self, ctx: &mut Ctx<'_, StreamEvent>, p: MemberId) -> usize {
        let now = ctx.now();
        if now < self.peer(p).next_reconnect_ns {
            return 0;
        }
        match self.fabric.reconnect(p) {
            Ok(_) => {
                let peer = self.peer(p);
                peer.up = true;
                peer.heartbeat_outstanding = false;
                peer.next_heartbeat_ns = now;
                peer.ack_dirty = peer.in_session != 0;
                self.start_session(ctx, p);
                1
            }
            Err(_) => {
                let retry = now + self.params.reconnect_ns;
                self.peer(p).next_reconnect_ns = retry;
                0
            }
        }
    }

    fn anomaly(ctx: &mut Ctx<'_, StreamEvent>, peer: MemberId, what: String) {
        ctx.record(StreamEvent::Anomaly { peer, what });
    }

    /// Reads what `p` published to us; returns work done.
    fn receive(&mut self, ctx: &mut Ctx<'_, StreamEvent>, p: MemberId) -> usize {
        let region = self.fabric.region().clone();
        let (session, seq) = unpack(region.load_acquire(self.layout.guard(p, self.me)));
        if session == 0 {
            return 0;
        }
        let mut work = 0;
        let me = self.me;
        let (in_session, consumed) = {
            let peer = self.peer(p);
            (peer.in_session, peer.consumed)
        };
        if session != in_session {
            if session < in_session {
                Self::anomaly(
                    ctx,
                    p,
                    format!("guard session went back from {in_session:#x} to {session:#x}"),
                );
            }
            if seq != 0 {
                Self::anomaly(ctx, p, format!("session {session:#x} first seen at seq {seq}, not 0"));
            }
            let peer = self.peer(p);
            peer.in_session = session;
            peer.consumed = seq;
            peer.ack_dirty = true;
            ctx.record(StreamEvent::SessionOpened { peer: p, session });
            work += 1;
        } else if seq < consumed {
            Self::anomaly(ctx, p, format!("guard went back from {consumed} to {seq}"));
            self.peer(p).consumed = seq;
        } else if seq > consumed {
            for k in consumed + 1..=seq {
                let slot = self.layout.slot(p, me, k);
                region.read_bytes(slot, &mut self.buf[..HEADER]);
                let word = |i: usize| u64::from_le_bytes(self.buf[i..i + 8].try_into().expect("8 bytes"));
                let (h_session, h_seq) = (word(0), word(8));
                let len = u32::from_le_bytes(self.buf[16..20].try_into().expect("4 bytes")) as usize;
                if h_session != session || h_seq != k || len == 0 || len > stream::MAX_PAYLOAD {
                    Self::anomaly(
                        ctx,
                        p,
                        format!(
                            "slot of message {k} of session {session:#x} holds ({h_session:#x}, {h_seq}, len {len})"
                        ),
                    );
                    continue;
                }
                region.read_bytes(slot + HEADER, &mut self.buf[HEADER..HEADER + len]);
                let digest = fnv64(&self.buf[HEADER..HEADER + len]);
                ctx.record(StreamEvent::Delivered { peer: p, session, seq: k, len: len as u32, digest });
            }
            let peer = self.peer(p);
            peer.consumed = seq;
            peer.ack_dirty = true;
            work += 1;
        }
        if self.peer(p).ack_dirty && self.peer(p).up {
            if ordo_fault::fault!("fabric_stream.ack.defer") {
                return work + 1; // acked on a later poll
            }
            let (in_session, consumed) = {
                let peer = self.peer(p);
                (peer.in_session, peer.consumed)
            };
            let ack = self.layout.ack(me, p);
            region.store_release(ack, pack(in_session, consumed));
            if self.post(Write::new(p, ack, 8)) {
                self.peer(p).ack_dirty = false;
            }
        }
        work
    }

    /// Streams to `p` as far as the window allows; returns work done.
    fn send(&mut self, ctx: &mut Ctx<'_, StreamEvent>, p: MemberId) -> usize {
        let me = self.me;
        let region = self.fabric.region().clone();
        let (ack_session, ack_seq) = unpack(region.load_acquire(self.layout.ack(p, me)));
        let target = self.params.target;
        let peer = self.peer(p);
        if ack_session == peer.session && ack_session != 0 {
            if ack_seq >= peer.next_seq {
                let what =
                    format!("ack {ack_seq} of session {ack_session:#x} beyond sent {}", peer.next_seq - 1);
                Self::anomaly(ctx, p, what);
            }
            self.peer(p).open = true;
            let peer = self.peer(p);
            peer.acked = peer.acked.max(ack_seq);
        }
        let peer = self.peer(p);
        if !peer.open {
            return 0;
        }
        let session = peer.session;
        let mut posted = 0;
        while self.peer(p).next_seq <= target && self.peer(p).next_seq <= self.peer(p).acked + SLOTS {
            let k = self.peer(p).next_seq;
            stream::payload(me, p, session, k, &mut self.expected);
            let len = self.expected.len();
            self.buf[0..8].copy_from_slice(&session.to_le_bytes());
            self.buf[8..16].copy_from_slice(&k.to_le_bytes());
            self.buf[16..20].copy_from_slice(&(len as u32).to_le_bytes());
            self.buf[20..24].copy_from_slice(&[0; 4]);
            self.buf[HEADER..HEADER + len].copy_from_slice(&self.expected);
            let slot = self.layout.slot(me, p, k);
            region.write_bytes(slot, &self.buf[..HEADER + len]);
            if !self.post(Write::new(p, slot, HEADER + len)) {
                break;
            }
            ctx.record(StreamEvent::Sent { peer: p, session, seq: k });
            self.peer(p).next_seq = k + 1;
            posted += 1;
            if ordo_fault::fault!("fabric_stream.send.short_batch") {
                break;
            }
        }
        if posted > 0 {
            let guard = self.layout.guard(me, p);
            let last = self.peer(p).next_seq - 1;
            region.store_release(guard, pack(session, last));
            // If this post fails the link is down, and the next session
            // starts over; nothing is lost silently.
            self.post(Write::new(p, guard, 8));
        }
        let peer = self.peer(p);
        if peer.acked == target && !peer.complete {
            peer.complete = true;
            ctx.record(StreamEvent::StreamComplete { peer: p, session });
        }
        posted
    }

    fn heartbeat(&mut self, now: u64, p: MemberId) {
        let interval = self.params.heartbeat_ns;
        let peer = self.peer(p);
        if peer.heartbeat_outstanding || now < peer.next_heartbeat_ns {
            return;
        }
        peer.next_heartbeat_ns = now + interval;
        self.heartbeat += 1;
        let offset = self.layout.heartbeat(self.me);
        self.fabric.region().store_release(offset, self.heartbeat);
        if self.post(Write::signaled(p, offset, 8, WriteTag(self.heartbeat))) {
            self.peer(p).heartbeat_outstanding = true;
        }
    }
}

impl SimProcess<StreamEvent> for Member {
    fn poll(&mut self, ctx: &mut Ctx<'_, StreamEvent>) -> usize {
        let now = ctx.now();
        let mut work = self.on_events(ctx);
        let mut wake = u64::MAX;
        for p in 0..self.params.members {
            if p == self.me {
                continue;
            }
            if !self.peer(p).up {
                work += self.try_reconnect(ctx, p);
            }
            // The peer's writes to us land whatever the state of our link
            // to it; only our acks need the link.
            work += self.receive(ctx, p);
            if self.peer(p).up {
                work += self.send(ctx, p);
            }
            if self.peer(p).up {
                self.heartbeat(now, p);
            }
            let peer = self.peer(p);
            if !peer.up {
                wake = wake.min(peer.next_reconnect_ns.max(now));
            } else if !peer.heartbeat_outstanding {
                wake = wake.min(peer.next_heartbeat_ns);
            }
        }
        if wake != u64::MAX {
            ctx.wake_at(wake);
        }
        work
    }

    fn done(&self) -> bool {
        self.peers.iter().flatten().all(|p| p.up && p.open && p.acked == self.params.target && !p.ack_dirty)
    }
}
