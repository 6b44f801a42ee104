//! `datagram-stream`: a reliable, in-order message stream between every
//! pair of members over the lossy simulated datagram network.
//!
//! # Protocol (per ordered pair, one socket per member)
//! - `DATA(session, seq, base, payload)`: message `seq`; `base` is the
//!   sender's oldest unacknowledged seq. The sender keeps at most
//!   [`WINDOW`] messages unacknowledged and retransmits all of them when
//!   its timer expires (exponential back-off, capped).
//! - `ACK(session, cumulative)`: the receiver delivered `1..=cumulative`.
//!   The receiver buffers out-of-order messages within the window and
//!   delivers in order, each exactly once per session.
//! - `PROBE(session, base)`: sent periodically by a sender that is done, so
//!   a restarted receiver notices it.
//! - `RESET(session)`: the receiver cannot continue `session` — it never saw
//!   it start (`base > 1` for an unknown session) or the sender believes more
//!   was delivered than this receiver incarnation has (`base > expected`).
//!   The sender then starts a new session from message 1.
//! - Session ids grow with the sender's incarnation, so a receiver ignores
//!   datagrams of sessions older than its current one (late or duplicated
//!   datagrams of a previous incarnation or session).
//!
//! # Checked
//! The four checkers of [`super::stream`]: integrity, exactly-once in-order
//! delivery per (receiver incarnation, sender, session) (no duplication +
//! FIFO without gaps), and liveness after the faults calm.

use super::stream::{self, StreamEvent, session_id};
use super::{Scenario, Workload};
use crate::history::fnv64;
use crate::net::{NetAddr, NetError, SimSocket};
use crate::rng::{SimRng, derive_seed, stream as streams};
use crate::sim::{Ctx, FaultPlan, RunLimits, SimProcess};
use crate::world::{NetConfig, SimConfig};
use crate::{RunFailure, RunOptions, RunReport};
use ordo_fabric::MemberId;
use std::collections::BTreeMap;

/// The workload's name.
pub const NAME: &str = "datagram-stream";

/// The registry entry.
pub const WORKLOAD: Workload = Workload {
    name: NAME,
    summary: "reliable in-order streams over lossy, duplicating, reordering datagrams; partitions, crash/restart",
    run,
};

fn run(seed: u64, opts: &RunOptions) -> Result<RunReport, RunFailure> {
    crate::execute(NAME, seed, opts, scenario(seed, opts))
}

/// Most unacknowledged messages per stream.
pub const WINDOW: u64 = 8;
/// The port every member's stream socket binds.
pub const PORT: u16 = 7000;

const DATA: u8 = 1;
const PROBE: u8 = 2;
const ACK: u8 = 3;
const RESET: u8 = 4;

/// A decoded datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Packet {
    Data { session: u64, seq: u64, base: u64, payload: Vec<u8> },
    Probe { session: u64, base: u64 },
    Ack { session: u64, cumulative: u64 },
    Reset { session: u64 },
}

impl Packet {
    fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Packet::Data { session, seq, base, payload } => {
                out.push(DATA);
                for v in [session, seq, base] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(&(payload.len() as u16).to_le_bytes());
                out.extend_from_slice(payload);
            }
            Packet::Probe { session, base } => {
                out.push(PROBE);
                out.extend_from_slice(&session.to_le_bytes());
                out.extend_from_slice(&base.to_le_bytes());
            }
            Packet::Ack { session, cumulative } => {
                out.push(ACK);
                out.extend_from_slice(&session.to_le_bytes());
                out.extend_from_slice(&cumulative.to_le_bytes());
            }
            Packet::Reset { session } => {
                out.push(RESET);
                out.extend_from_slice(&session.to_le_bytes());
            }
        }
    }

    /// Decodes `bytes`; `None` for anything malformed (never trusted).
    fn decode(bytes: &[u8]) -> Option<Packet> {
        let word = |i: usize| bytes.get(i..i + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        match *bytes.first()? {
            DATA => {
                let len = u16::from_le_bytes(bytes.get(25..27)?.try_into().ok()?) as usize;
                let payload = bytes.get(27..27 + len)?.to_vec();
                if bytes.len() != 27 + len {
                    return None;
                }
                Some(Packet::Data { session: word(1)?, seq: word(9)?, base: word(17)?, payload })
            }
            PROBE if bytes.len() == 17 => Some(Packet::Probe { session: word(1)?, base: word(9)? }),
            ACK if bytes.len() == 17 => Some(Packet::Ack { session: word(1)?, cumulative: word(9)? }),
            RESET if bytes.len() == 9 => Some(Packet::Reset { session: word(1)? }),
            _ => None,
        }
    }
}

/// Parameters of one run, drawn from the seed.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Group size.
    pub members: u32,
    /// Messages per session.
    pub target: u64,
    /// Initial retransmission timeout.
    pub rto_min_ns: u64,
    /// Largest retransmission timeout after back-off.
    pub rto_max_ns: u64,
    /// Interval of probes from a sender that is done.
    pub probe_ns: u64,
}

/// The scenario of `seed`.
pub fn scenario(seed: u64, _opts: &RunOptions) -> Scenario<StreamEvent> {
    let mut rng = SimRng::new(derive_seed(seed, streams::SCENARIO));
    let members = rng.range(2, 5) as u32;
    let net = NetConfig {
        delay_min_ns: rng.range(1_000, 10_000),
        delay_max_ns: rng.range(10_000, 60_000),
        spike_ppm: rng.range(0, 5_000) as u32,
        spike_max_ns: rng.range(10_000, 500_000),
        loss_ppm: rng.range(0, 100_000) as u32,
        duplicate_ppm: rng.range(0, 30_000) as u32,
        queue_capacity: rng.range(4, 128) as usize,
        ..NetConfig::default()
    };
    let rto_min = 2 * net.delay_max_ns + rng.range(10_000, 100_000);
    let params = Params {
        members,
        target: rng.range(20, 200),
        rto_min_ns: rto_min,
        rto_max_ns: rto_min * rng.range(2, 8),
        probe_ns: rng.range(50_000, 300_000),
    };
    let plan = FaultPlan::draw(&mut rng, members);
    let until = plan.until_ns;
    let settle = 2 * (params.probe_ns + 2 * net.delay_max_ns + params.rto_max_ns) + 200_000;
    let config = SimConfig { members, region_len: 64, net, ..SimConfig::default() };
    Scenario {
        config,
        faults: Some(plan),
        limits: RunLimits::after_faults(until, settle),
        factory: Box::new(move |ctx| Box::new(Member::new(ctx, params))),
        checkers: stream::checkers(params.target),
    }
}

#[derive(Debug, Default)]
struct Outgoing {
    session: u64,
    /// Oldest unacknowledged seq.
    base: u64,
    /// Next seq never sent.
    next: u64,
    rto_ns: u64,
    retransmit_at: Option<u64>,
    next_probe_ns: u64,
    complete: bool,
}

#[derive(Debug, Default)]
struct Incoming {
    session: u64,
    /// Next seq to deliver.
    expected: u64,
    buffer: BTreeMap<u64, Vec<u8>>,
}

struct Member {
    me: MemberId,
    incarnation: u64,
    params: Params,
    socket: SimSocket,
    out: Vec<Outgoing>,
    inc: Vec<Incoming>,
    sessions: u64,
    scratch: Vec<u8>,
    payload: Vec<u8>,
}

impl Member {
    fn new(ctx: &mut Ctx<'_, StreamEvent>, params: Params) -> Member {
        let socket = ctx.bind(PORT).expect("a fresh incarnation binds its port");
        let n = params.members as usize;
        let mut m = Member {
            me: ctx.member(),
            incarnation: ctx.incarnation(),
            params,
            socket,
            out: (0..n).map(|_| Outgoing::default()).collect(),
            inc: (0..n).map(|_| Incoming::default()).collect(),
            sessions: 0,
            scratch: Vec::with_capacity(64 + stream::MAX_PAYLOAD),
            payload: Vec::with_capacity(stream::MAX_PAYLOAD),
        };
        for p in m.peers() {
            m.start_session(ctx, p);
        }
        m
    }

    fn peers(&self) -> impl Iterator<Item = MemberId> + use<> {
        let me = self.me;
        (0..self.params.members).filter(move |p| *p != me)
    }

    fn start_session(&mut self, ctx: &mut Ctx<'_, StreamEvent>, p: MemberId) {
        self.sessions += 1;
        let session = session_id(self.incarnation, self.sessions);
        self.out[p as usize] = Outgoing {
            session,
            base: 1,
            next: 1,
            rto_ns: self.params.rto_min_ns,
            retransmit_at: None,
            next_probe_ns: 0,
            complete: false,
        };
        ctx.record(StreamEvent::SessionStarted { peer: p, session });
    }

    fn send(&mut self, to: MemberId, packet: &Packet) {
        packet.encode(&mut self.scratch);
        match self.socket.send(NetAddr::new(to, PORT), &self.scratch) {
            Ok(()) => {}
            // Our incarnation is gone; the process is about to be dropped.
            Err(NetError::Closed(_)) => {}
            Err(e) => panic!("datagram-stream sent a bad datagram: {e}"),
        }
    }

    fn send_data(&mut self, to: MemberId, seq: u64) {
        let o = &self.out[to as usize];
        let (session, base) = (o.session, o.base);
        stream::payload(self.me, to, session, seq, &mut self.payload);
        let packet = Packet::Data { session, seq, base, payload: std::mem::take(&mut self.payload) };
        self.send(to, &packet);
        if let Packet::Data { payload, .. } = packet {
            self.payload = payload;
        }
    }

    fn on_packet(&mut self, ctx: &mut Ctx<'_, StreamEvent>, from: NetAddr, packet: Packet) {
        let p = from.member;
        if p == self.me || p >= self.params.members || from.port != PORT {
            ctx.record(StreamEvent::Anomaly { peer: p, what: format!("datagram from unexpected {from}") });
            return;
        }
        match packet {
            Packet::Data { session, seq, base, payload } => {
                self.on_data(ctx, p, session, base, Some((seq, payload)))
            }
            Packet::Probe { session, base } => self.on_data(ctx, p, session, base, None),
            Packet::Ack { session, cumulative } => {
                let now = ctx.now();
                let o = &mut self.out[p as usize];
                if session != o.session {
                    return; // for an older session
                }
                if cumulative >= o.next {
                    let what = format!("ack {cumulative} of session {session:#x} beyond sent {}", o.next - 1);
                    ctx.record(StreamEvent::Anomaly { peer: p, what });
                    return;
                }
                if cumulative >= o.base {
                    o.base = cumulative + 1;
                    o.rto_ns = self.params.rto_min_ns;
                    o.retransmit_at = (o.base < o.next).then_some(now + o.rto_ns);
                }
            }
            Packet::Reset { session } => {
                if session == self.out[p as usize].session {
                    self.start_session(ctx, p);
                }
            }
        }
    }

    /// Receiver side of DATA (with `message`) and PROBE (without).
    fn on_data(
        &mut self,
        ctx: &mut Ctx<'_, StreamEvent>,
        p: MemberId,
        session: u64,
        base: u64,
        message: Option<(u64, Vec<u8>)>,
    ) {
        let idx = p as usize;
        if session < self.inc[idx].session {
            return; // late datagram of an older session
        }
        if session > self.inc[idx].session {
            if base != 1 {
                self.send(p, &Packet::Reset { session });
                return;
            }
            let i = &mut self.inc[idx];
            i.session = session;
            i.expected = 1;
            i.buffer.clear();
            ctx.record(StreamEvent::SessionOpened { peer: p, session });
        }
        if base > self.inc[idx].expected {
            self.send(p, &Packet::Reset { session });
            return;
        }
        let i = &mut self.inc[idx];
        if let Some((seq, payload)) = message
            && seq >= i.expected
            && seq < i.expected + WINDOW
        {
            i.buffer.entry(seq).or_insert(payload);
        }
        while let Some(payload) = i.buffer.remove(&i.expected) {
            let seq = i.expected;
            let (len, digest) = (payload.len() as u32, fnv64(&payload));
            ctx.record(StreamEvent::Delivered { peer: p, session, seq, len, digest });
            i.expected += 1;
        }
        let cumulative = i.expected - 1;
        if ordo_fault::fault!("datagram_stream.ack.skip") {
            return; // the sender retransmits
        }
        self.send(p, &Packet::Ack { session, cumulative });
    }

    /// Sender side for `p`: fill the window, retransmit, probe. Returns the
    /// time it next needs a poll.
    fn drive(&mut self, ctx: &mut Ctx<'_, StreamEvent>, p: MemberId) -> (usize, u64) {
        let now = ctx.now();
        let target = self.params.target;
        let mut work = 0;
        loop {
            let o = &self.out[p as usize];
            if o.next > target || o.next >= o.base + WINDOW {
                break;
            }
            let (session, seq) = (o.session, o.next);
            self.send_data(p, seq);
            ctx.record(StreamEvent::Sent { peer: p, session, seq });
            let o = &mut self.out[p as usize];
            o.next += 1;
            o.retransmit_at.get_or_insert(now + o.rto_ns);
            work += 1;
        }
        let o = &self.out[p as usize];
        if o.base < o.next && o.retransmit_at.is_some_and(|t| t <= now) {
            let (base, next) = (o.base, o.next);
            for seq in base..next {
                self.send_data(p, seq);
            }
            let o = &mut self.out[p as usize];
            o.rto_ns = (o.rto_ns * 2).min(self.params.rto_max_ns);
            o.retransmit_at = Some(now + o.rto_ns);
            work += 1;
        }
        let o = &mut self.out[p as usize];
        if o.base > target {
            if !o.complete {
                o.complete = true;
                let session = o.session;
                ctx.record(StreamEvent::StreamComplete { peer: p, session });
            }
            if now >= o.next_probe_ns {
                let o = &mut self.out[p as usize];
                o.next_probe_ns = now + self.params.probe_ns;
                let (session, base) = (o.session, o.base);
                self.send(p, &Packet::Probe { session, base });
            }
        }
        let o = &self.out[p as usize];
        let wake = if o.base > target { o.next_probe_ns } else { o.retransmit_at.unwrap_or(u64::MAX) };
        (work, wake)
    }
}

impl SimProcess<StreamEvent> for Member {
    fn poll(&mut self, ctx: &mut Ctx<'_, StreamEvent>) -> usize {
        let mut work = 0;
        while let Some((from, bytes)) = self.socket.recv() {
            work += 1;
            match Packet::decode(&bytes) {
                Some(packet) => self.on_packet(ctx, from, packet),
                None => {
                    let what = format!("malformed datagram of {} bytes from {from}", bytes.len());
                    ctx.record(StreamEvent::Anomaly { peer: from.member, what });
                }
            }
        }
        let mut wake = u64::MAX;
        for p in self.peers() {
            let (w, t) = self.drive(ctx, p);
            work += w;
            wake = wake.min(t);
        }
        if wake != u64::MAX {
            ctx.wake_at(wake);
        }
        work
    }

    fn done(&self) -> bool {
        self.peers().all(|p| self.out[p as usize].base > self.params.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip_and_garbage_is_refused() {
        let packets = [
            Packet::Data { session: 0x1001, seq: 7, base: 3, payload: vec![1, 2, 3] },
            Packet::Probe { session: 5, base: 9 },
            Packet::Ack { session: 5, cumulative: 4 },
            Packet::Reset { session: 8 },
        ];
        let mut buf = Vec::new();
        for p in packets {
            p.encode(&mut buf);
            assert_eq!(Packet::decode(&buf), Some(p.clone()));
            assert_eq!(Packet::decode(&buf[..buf.len() - 1]), None, "{p:?} truncated");
        }
        assert_eq!(Packet::decode(&[]), None);
        assert_eq!(Packet::decode(&[9, 0, 0]), None);
    }
}
