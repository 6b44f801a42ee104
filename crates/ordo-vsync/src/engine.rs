//! The vsync engine: one per member, serving every subgroup the member
//! belongs to from one predicate loop ([`Engine::poll`]).
//!
//! # Invariants (asserted where cheap; a violation is a bug and panics)
//! - `delivered_num ≤ min over members of received_num` and both only grow.
//! - Messages are delivered in seq order, `seq = round × S + rank`, each
//!   exactly once; null rounds are skipped but occupy their seq.
//! - A sender's slot is reused only after every member's `delivered_num`
//!   covers every round in it (ordered), or every member consumed it
//!   (unordered).
//! - `delivered_num` is set (and pushed) only after the delivery upcall for
//!   those messages returned, so no slot is overwritten while an upcall reads
//!   it in place.
//! - Null-sends only answer a received message whose round is ahead of this
//!   sender's: with no application sends, no nulls (quiescence).
//! - A peer's bad ring data is recorded in [`Engine::faults`] and that
//!   sender's ring is not consumed further; it never panics the engine.
//! - **Wedged, frozen.** Once wedged the engine sends, receives and
//!   delivers nothing more: its rounds received per sender
//!   ([`Engine::received_rounds`]) and the `received_num` it pushed are
//!   frozen. The view change relies on it: a member that reported its
//!   counts to the view leader never advertises more, so no member still
//!   running delivers a message beyond the ragged trim the leader computes
//!   from those reports (see [`crate::view`]).
//! - **Ragged edge.** [`Engine::deliver_ragged`] delivers, in seq order,
//!   exactly the received messages whose round is below their sender's
//!   trim, and only on a wedged engine; [`Engine::undelivered_own`] lists
//!   the own application messages at or past the own trim (published or
//!   only committed), in send order: what the sender resends in the next
//!   view.
//! - **Zero-copy** ([`Switches::zero_copy`]): a subgroup reads its rings
//!   in place only if every other member's region is available here, and
//!   then posts no ring write at all; receivers of one subgroup read either
//!   all in place or all from their own copies, never a mix within a
//!   member. Payload slices handed to the sink point into the region the
//!   sender's ring was read in (the reuse rule above covers both).

use crate::config::{ConfigError, DeliveryMode, GroupConfig, Switches};
use crate::layout::GroupLayout;
use crate::stats::SubgroupStats;
use ordo_fabric::{MemberId, Region};
use ordo_ring::{MessageMeta, RingError, RingReceiver, SendPath, SlotGuard, SlotProducer};
use ordo_sst::Sst;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Flag of a slot that carries null rounds; the low 30 bits are the count.
pub const NULL_FLAG: u32 = 1 << 30;
/// Mask of the null count.
pub const NULL_COUNT_MASK: u32 = NULL_FLAG - 1;

/// A write the runtime must post to every peer of `subgroup` (or of the
/// top-level group when `subgroup` is `None`), in the order emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Push {
    /// Whose peers receive it.
    pub subgroup: Option<usize>,
    /// Region offset.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// What one [`Engine::poll`] asks of the runtime.
#[derive(Debug, Default)]
pub struct Effects {
    /// Writes to post, in order.
    pub pushes: Vec<Push>,
}

impl Effects {
    /// Clears for reuse (keeps the allocation).
    pub fn clear(&mut self) {
        self.pushes.clear();
    }
}

/// One delivered message. The payload is read in place from the sender's
/// ring and valid only during the upcall.
#[derive(Clone, Copy, Debug)]
pub struct Delivered<'a> {
    /// Subgroup index.
    pub subgroup: usize,
    /// The sender.
    pub sender: MemberId,
    /// Position in the subgroup's total order (ordered mode), or -1.
    pub seq: i64,
    /// The sender's round of this message.
    pub round: u64,
    /// The payload.
    pub payload: &'a [u8],
}

/// Receives delivered batches (spindle §III-D: one upcall per batch). It is
/// called on the predicate thread and must not block: hand heavy work to a
/// worker queue.
pub trait DeliverySink {
    /// Messages delivered together, in delivery order.
    fn deliver(&mut self, batch: &[Delivered<'_>]);
}

impl<F: FnMut(&[Delivered<'_>])> DeliverySink for F {
    fn deliver(&mut self, batch: &[Delivered<'_>]) {
        self(batch)
    }
}

/// Why a send did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Every slot holds a message not yet delivered everywhere; retry.
    #[error("no free slot (back-pressure)")]
    WouldBlock,
    /// The payload exceeds the subgroup's `max_payload`.
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// The subgroup's maximum.
        max: usize,
    },
    /// The member is wedged (a view change is under way).
    #[error("the group is wedged")]
    Wedged,
}

/// An application thread's handle for sending in one subgroup: acquires a
/// slot without locks and builds the message in place (spindle §III-A).
#[derive(Clone)]
pub struct Sender {
    subgroup: usize,
    producer: SlotProducer,
    max_payload: usize,
    wedged: Arc<AtomicBool>,
    declared_inactive: Arc<AtomicU64>,
}

impl Sender {
    /// The subgroup this handle sends in.
    pub fn subgroup(&self) -> usize {
        self.subgroup
    }

    /// Largest payload.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Builds a `len`-byte message in place with `build` and commits it; or
    /// `Err(WouldBlock)` at once if no slot is free.
    pub fn try_send_with(&self, len: usize, build: impl FnOnce(&mut [u8])) -> Result<(), SendError> {
        if len > self.max_payload {
            return Err(SendError::TooLarge { len, max: self.max_payload });
        }
        if self.wedged.load(Ordering::Acquire) {
            return Err(SendError::Wedged);
        }
        assert_eq!(self.max_payload, self.producer.max_payload(), "a handle's limit is its ring's slot size");
        let mut slot = self.producer.try_acquire().ok_or(SendError::WouldBlock)?;
        build(&mut slot.payload()[..len]);
        slot.commit(len, 0);
        Ok(())
    }

    /// Rings `bell` (the predicate thread's doorbell) after every commit, so
    /// a parked predicate thread sends at once.
    pub fn ring_on_commit(&self, bell: ordo_fabric::Doorbell) {
        self.producer.ring_on_commit(bell);
    }

    /// Announces that this sender will not send for `rounds` rounds
    /// (spindle §III-B, declared inactivity): the engine sends that many
    /// null rounds at once, so no one waits for this sender.
    /// Any number: a slot carries up to `NULL_COUNT_MASK - 1` of them, the
    /// rest go in the following slots.
    pub fn declare_inactive(&self, rounds: u64) {
        let _ = self
            .declared_inactive
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| Some(owed.saturating_add(rounds)));
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    round_start: u64,
    rounds: u64,
    /// (offset, len) of an application payload; None for null rounds.
    payload: Option<(usize, usize)>,
}

struct SubgroupState {
    senders: Vec<MemberId>,
    n_senders: u64,
    my_rank: Option<usize>,
    member_rows: Vec<usize>,
    ordered: bool,
    send: Option<SendPath>,
    producer: Option<SlotProducer>,
    declared_inactive: Arc<AtomicU64>,
    /// Σ (rounds − 1) over this member's null slots: rounds sent =
    /// slots reserved + extra_rounds.
    extra_rounds: i64,
    /// Total rounds this member must have sent (null-send target).
    null_target: u64,
    receivers: Vec<RingReceiver>,
    /// Rounds received from each sender.
    rounds: Vec<u64>,
    /// Received, not yet delivered entries per sender (ordered mode).
    pending: Vec<VecDeque<Entry>>,
    /// Own slots not yet reclaimable: (slot index, last seq it covers).
    /// Own published slots not yet reusable: (slot index, last seq it
    /// covers, whether it carries only null rounds).
    own_slots: VecDeque<(u64, i64, bool)>,
    own_last_seq: i64,
    /// A sender whose ring held bad data: not consumed any more.
    poisoned: Vec<bool>,
    /// Zero-copy ([`Switches::zero_copy`]): every receiver reads this
    /// subgroup's rings in their senders' own regions, so the send
    /// predicate posts nothing.
    zero_copy: bool,
    delivered_num: i64,
    stats: SubgroupStats,
}

/// A fault a peer caused (bad ring data); the engine keeps running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerFault {
    /// Subgroup.
    pub subgroup: usize,
    /// The sender whose ring was bad.
    pub sender: MemberId,
    /// What was wrong.
    pub error: RingError,
}

/// One member's vsync engine. See the module docs.
pub struct Engine {
    cfg: GroupConfig,
    layout: GroupLayout,
    me: MemberId,
    region: Region,
    sst: Sst,
    subgroups: Vec<SubgroupState>,
    /// Indices of the subgroups this member belongs to.
    mine: Vec<usize>,
    wedged: Arc<AtomicBool>,
    wedge_pushed: bool,
    metas: Vec<MessageMeta>,
    /// Reused delivery batch (no allocation per poll). Its slices point into
    /// `region` (or, zero-copy, a sender's region held by its receiver) and
    /// it is cleared before every return, so the `'static` is
    /// never observable: sinks get it for the duration of one call only.
    scratch: Vec<Delivered<'static>>,
    faults: Vec<PeerFault>,
    /// Peers of each subgroup, then of the top-level group (last).
    peer_lists: Vec<Vec<MemberId>>,
}

impl Engine {
    /// The engine of member `me` over `region` (which must be at least
    /// [`GroupLayout::region_len`] bytes), and a [`Sender`] for every
    /// subgroup `me` sends in (`None` elsewhere).
    pub fn new(
        cfg: GroupConfig,
        me: MemberId,
        region: Region,
    ) -> Result<(Engine, Vec<Option<Sender>>), ConfigError> {
        Engine::with_peer_regions(cfg, me, region, |_| None)
    }

    /// As [`new`](Self::new), with `peer_region(m)`: member `m`'s own region
    /// as this member can read it, where the fabric has it. With
    /// [`Switches::zero_copy`] on, a subgroup whose every other member's
    /// region is there runs zero-copy: its receivers read each sender's
    /// ring in that sender's region, and its senders post no ring writes.
    /// Every member decides alike when its fabric answers alike for every
    /// member (shm: all members share the host and map each other).
    pub fn with_peer_regions(
        cfg: GroupConfig,
        me: MemberId,
        region: Region,
        peer_region: impl Fn(MemberId) -> Option<Region>,
    ) -> Result<(Engine, Vec<Option<Sender>>), ConfigError> {
        cfg.validate_view()?;
        if !cfg.members.contains(&me) {
            return Err(ConfigError::Group(format!("member {me} is not in {:?}", cfg.members)));
        }
        let layout = GroupLayout::new(&cfg);
        if region.len() < layout.region_len {
            return Err(ConfigError::Group(format!(
                "region of {} bytes is smaller than the {} bytes this group needs",
                region.len(),
                layout.region_len
            )));
        }
        let sst = Sst::new(region.clone(), 0, layout.sst.clone(), &cfg.members, me)
            .map_err(|e| ConfigError::Group(e.to_string()))?;
        let wedged = Arc::new(AtomicBool::new(false));
        let mut subgroups = Vec::new();
        let mut senders = Vec::new();
        let mut mine = Vec::new();
        for (g, s) in cfg.subgroups.iter().enumerate() {
            let my_rank = s.senders.iter().position(|x| *x == me);
            let member = s.members.contains(&me);
            if member {
                mine.push(g);
            }
            let declared_inactive = Arc::new(AtomicU64::new(0));
            let (send, producer) = match my_rank {
                Some(rank) if member => {
                    let (p, sp) = ordo_ring::sender(region.clone(), layout.ring(g, rank), layout.rings[g]);
                    senders.push(Some(Sender {
                        subgroup: g,
                        producer: p.clone(),
                        max_payload: s.max_payload,
                        wedged: wedged.clone(),
                        declared_inactive: declared_inactive.clone(),
                    }));
                    (Some(sp), Some(p))
                }
                _ => {
                    senders.push(None);
                    (None, None)
                }
            };
            let mut rows: Vec<usize> = s.members.iter().map(|m| sst.row_of(*m).expect("validated")).collect();
            rows.sort_unstable();
            let n = s.senders.len();
            // Zero-copy: every other member's region, or copy mode.
            let peers: Option<Vec<(MemberId, Region)>> = if cfg.switches.zero_copy && member {
                s.members.iter().filter(|m| **m != me).map(|&m| Some((m, peer_region(m)?))).collect()
            } else {
                None
            };
            let ring_region = |sender: MemberId| -> Region {
                match &peers {
                    Some(p) if sender != me => {
                        let r = &p.iter().find(|(m, _)| *m == sender).expect("every member's region").1;
                        r.clone()
                    }
                    _ => region.clone(),
                }
            };
            if let Some(p) = &peers {
                for (m, r) in p {
                    if r.len() < layout.region_len {
                        return Err(ConfigError::Group(format!(
                            "member {m}'s region of {} bytes is smaller than the {} bytes this group needs",
                            r.len(),
                            layout.region_len
                        )));
                    }
                }
            }
            subgroups.push(SubgroupState {
                senders: s.senders.clone(),
                n_senders: n as u64,
                my_rank,
                member_rows: rows,
                ordered: s.mode == DeliveryMode::Ordered,
                send,
                producer,
                declared_inactive,
                extra_rounds: 0,
                null_target: 0,
                // A stamped ring's copy is read by its stamps; a ring read
                // in its sender's own mapping (the own ring; zero-copy) by
                // its counter, which covers only what the send predicate
                // published.
                receivers: (0..n)
                    .map(|r| {
                        let rx =
                            RingReceiver::new(ring_region(s.senders[r]), layout.ring(g, r), layout.rings[g]);
                        if Some(r) == my_rank || peers.is_some() { rx.reading_counter() } else { rx }
                    })
                    .collect(),
                rounds: vec![0; n],
                pending: (0..n).map(|_| VecDeque::with_capacity(s.window)).collect(),
                own_slots: VecDeque::with_capacity(s.window),
                own_last_seq: -1,
                poisoned: vec![false; n],
                zero_copy: peers.is_some(),
                delivered_num: -1,
                stats: SubgroupStats::default(),
            });
        }
        let engine = Engine {
            cfg,
            layout,
            me,
            region,
            sst,
            subgroups,
            mine,
            wedged,
            wedge_pushed: false,
            metas: Vec::new(),
            scratch: Vec::new(),
            faults: Vec::new(),
            peer_lists: Vec::new(),
        };
        let mut engine = engine;
        let without_me = |list: &[MemberId]| list.iter().copied().filter(|m| *m != me).collect::<Vec<_>>();
        engine.peer_lists = engine.cfg.subgroups.iter().map(|s| without_me(&s.members)).collect();
        engine.peer_lists.push(without_me(&engine.cfg.members));
        assert_eq!(senders.len(), engine.subgroups.len(), "one send handle (or None) per subgroup");
        assert_eq!(engine.peer_lists.len(), engine.subgroups.len() + 1, "peers per subgroup, then the group");
        assert!(engine.peer_lists.iter().all(|l| !l.contains(&me)), "a member is not its own peer");
        for (g, s) in engine.subgroups.iter().enumerate() {
            let n = s.senders.len();
            assert!(
                n > 0
                    && s.n_senders == n as u64
                    && s.receivers.len() == n
                    && s.rounds.len() == n
                    && s.pending.len() == n
                    && s.poisoned.len() == n,
                "per-sender state for every sender of subgroup {g}"
            );
            assert!(s.my_rank.is_none_or(|r| r < n), "own rank within the senders of subgroup {g}");
            assert_eq!(s.send.is_some(), s.my_rank.is_some(), "a send path iff a sender (senders ⊆ members)");
            assert_eq!(s.producer.is_some(), s.send.is_some(), "a producer iff a send path");
            assert!(
                !s.member_rows.is_empty() && s.member_rows.is_sorted(),
                "member rows non-empty and sorted"
            );
            assert_eq!(
                s.member_rows.binary_search(&engine.sst.my_row()).is_ok(),
                engine.mine.contains(&g),
                "own row among the member rows iff this member belongs to subgroup {g}"
            );
        }
        Ok((engine, senders))
    }

    /// The configuration.
    pub fn config(&self) -> &GroupConfig {
        &self.cfg
    }

    /// The region layout.
    pub fn layout(&self) -> &GroupLayout {
        &self.layout
    }

    /// This member.
    pub fn member(&self) -> MemberId {
        self.me
    }

    /// The peers a push of `subgroup` goes to (members other than this one;
    /// the whole top-level group for `None`), as an owned list.
    pub fn peers(&self, subgroup: Option<usize>) -> Vec<MemberId> {
        self.peers_of(subgroup).to_vec()
    }

    /// The peers a push of `subgroup` goes to, without allocating.
    pub fn peers_of(&self, subgroup: Option<usize>) -> &[MemberId] {
        assert!(subgroup.is_none_or(|g| g < self.cfg.subgroups.len()), "subgroup {subgroup:?} out of range");
        &self.peer_lists[subgroup.unwrap_or(self.cfg.subgroups.len())]
    }

    /// Whether subgroup `g` runs zero-copy here ([`Switches::zero_copy`]
    /// on and every other member's region available).
    pub fn zero_copy(&self, g: usize) -> bool {
        self.subgroups[g].zero_copy
    }

    /// Counters of subgroup `g` at this member.
    pub fn stats(&self, g: usize) -> &SubgroupStats {
        &self.subgroups[g].stats
    }

    /// Seq of the last message delivered in subgroup `g` here.
    pub fn delivered_num(&self, g: usize) -> i64 {
        self.subgroups[g].delivered_num
    }

    /// Bad data peers wrote into their rings, as seen here.
    pub fn faults(&self) -> &[PeerFault] {
        &self.faults
    }

    /// Stops sending, receiving and delivering in every subgroup and tells
    /// the group (the first step of a view change; spindle §II-A). What was
    /// received stays in the rings for [`Engine::deliver_ragged`].
    pub fn wedge(&mut self) {
        self.wedged.store(true, Ordering::Release);
    }

    /// Whether this member is wedged.
    pub fn is_wedged(&self) -> bool {
        self.wedged.load(Ordering::Acquire)
    }

    /// Whether every slot this member published in every subgroup has been
    /// reclaimed and nothing is ready to send (used to wait for the end of
    /// a run).
    pub fn is_idle(&self) -> bool {
        self.subgroups
            .iter()
            .all(|s| s.send.as_ref().is_none_or(|sp| sp.ready() == 0 && sp.reclaimable() == sp.published()))
    }

    /// Rounds received from each sender (by rank), per subgroup; empty for
    /// subgroups this member is not in. Null rounds count. Frozen once the
    /// engine is wedged: the report a member gives the view leader.
    pub fn received_rounds(&self) -> Vec<Vec<u64>> {
        self.subgroups
            .iter()
            .enumerate()
            .map(|(g, s)| if self.mine.contains(&g) { s.rounds.clone() } else { Vec::new() })
            .collect()
    }

    /// The ragged-edge cleanup of a failed view (spindle §II-A): delivers,
    /// in seq order, every message of every ordered subgroup this member is
    /// in whose round is below `trims[g][rank of its sender]` and that was
    /// not delivered yet, in one batch per subgroup. Unordered subgroups
    /// delivered on receipt and have no trim. Returns the messages
    /// delivered.
    ///
    /// Panics unless the engine is wedged, `trims` has one entry per
    /// subgroup (one count per sender for the subgroups this member is in),
    /// and this member received every round the trims cover — the view
    /// leader computes them as the minimum of the survivors' frozen reports,
    /// so a violation is a bug.
    pub fn deliver_ragged(&mut self, trims: &[Vec<u64>], sink: &mut impl DeliverySink) -> usize {
        assert!(self.is_wedged(), "the ragged edge is delivered only on a wedged engine");
        assert_eq!(trims.len(), self.subgroups.len(), "one trim per subgroup");
        let mut total = 0;
        for i in 0..self.mine.len() {
            let g = self.mine[i];
            let s = &mut self.subgroups[g];
            if !s.ordered {
                continue;
            }
            let trim = &trims[g];
            let n = s.n_senders;
            assert_eq!(trim.len(), n as usize, "subgroup {g}: one trim per sender");
            for (j, t) in trim.iter().enumerate() {
                assert!(
                    *t <= s.rounds[j],
                    "subgroup {g}: trim {t} of rank {j} beyond the {} rounds received",
                    s.rounds[j]
                );
            }
            // One past the last seq the trims cover.
            let end = trim
                .iter()
                .enumerate()
                .map(|(j, t)| if *t == 0 { 0 } else { (t - 1) * n + j as u64 + 1 })
                .max()
                .unwrap_or(0) as i64;
            let mut batch = std::mem::take(&mut self.scratch);
            debug_assert!(batch.is_empty());
            let mut seq = s.delivered_num + 1;
            let mut last = s.delivered_num;
            while seq < end {
                let j = (seq as u64 % n) as usize;
                let round = seq as u64 / n;
                if round < trim[j] {
                    let entry = *s.pending[j].front().expect("a round below the trim was received here");
                    assert!(
                        entry.round_start <= round && round < entry.round_start + entry.rounds,
                        "seq {seq}: sender rank {j} round {round} not in {entry:?}"
                    );
                    if let Some((offset, len)) = entry.payload {
                        // SAFETY: as in `deliver`: the slot is not reused
                        // (wedged: nothing is reclaimed past delivered_num
                        // everywhere), and the region outlives the call.
                        let bytes: &'static [u8] =
                            unsafe { &*(s.receivers[j].region().slice(offset, len) as *const [u8]) };
                        batch.push(Delivered {
                            subgroup: g,
                            sender: s.senders[j],
                            seq,
                            round,
                            payload: bytes,
                        });
                    }
                    if round + 1 == entry.round_start + entry.rounds {
                        s.pending[j].pop_front();
                    }
                    last = seq;
                }
                seq += 1;
            }
            if !batch.is_empty() {
                s.stats.messages_delivered += batch.len() as u64;
                s.stats.bytes_delivered += batch.iter().map(|d| d.payload.len() as u64).sum::<u64>();
                s.stats.delivery_batches.record(batch.len() as u64);
                total += batch.len();
                sink.deliver(&batch);
            }
            batch.clear();
            self.scratch = batch;
            assert!(last >= self.subgroups[g].delivered_num, "delivered_num never goes back");
            self.subgroups[g].delivered_num = last;
        }
        total
    }

    /// This member's own application messages that the ragged trim leaves
    /// undelivered, per subgroup it sends in, in send order: those at or
    /// past its round `trims[g][own rank]` that it published, then those
    /// committed but never published. (Abandoned slots and null rounds are
    /// not messages.) The sender resends them in the next view. Panics
    /// unless wedged.
    pub fn undelivered_own(&self, trims: &[Vec<u64>]) -> Vec<(usize, Vec<u8>)> {
        assert!(self.is_wedged(), "resends are collected only on a wedged engine");
        assert_eq!(trims.len(), self.subgroups.len(), "one trim per subgroup");
        let mut out = Vec::new();
        for &g in &self.mine {
            let s = &self.subgroups[g];
            let (Some(rank), Some(sp), true) = (s.my_rank, s.send.as_ref(), s.ordered) else { continue };
            let trim = trims[g][rank];
            for e in &s.pending[rank] {
                if let Some((offset, len)) = e.payload
                    && e.round_start >= trim
                {
                    // SAFETY: own slot, not reclaimed (never delivered
                    // everywhere); the engine is wedged, no producer writes
                    // a slot that is not free.
                    out.push((g, unsafe { self.region.slice(offset, len) }.to_vec()));
                }
            }
            // Published but not yet scanned by the own receiver: the own
            // ring is scanned every poll before wedging stops it, so only a
            // message published in the last poll can be here.
            let ring =
                RingReceiver::new(self.region.clone(), self.layout.ring(g, rank), self.layout.rings[g]);
            for k in s.receivers[rank].consumed()..sp.published() + sp.ready() {
                let meta = ring.meta(k).expect("own ring slots are well formed");
                if meta.flags & (NULL_FLAG | SlotGuard::ABANDONED) == 0 {
                    out.push((g, ring.payload(&meta).to_vec()));
                }
            }
        }
        out
    }

    /// One evaluation of every predicate of every subgroup: send, receive
    /// (and null-send), deliver, reclaim. Emits pushes into `effects` and
    /// calls `sink` with each delivered batch. Returns the work done.
    ///
    /// Contract: the caller posts every push of one `poll` (in order, to
    /// every peer) before calling `poll` again. A write captures its bytes
    /// when posted, and the next `poll` may advance a ring counter; a
    /// counter write held back and posted after that would carry the newer
    /// value ahead of the newer batch's data.
    pub fn poll(&mut self, effects: &mut Effects, sink: &mut impl DeliverySink) -> usize {
        let switches = self.cfg.switches;
        let wedged = self.wedged.load(Ordering::Acquire);
        let first_push = effects.pushes.len();
        let mut work = 0;
        if wedged && !self.wedge_pushed {
            self.sst.set_flag(self.layout.wedged);
            let (offset, len) = self.sst.range(self.layout.wedged);
            effects.pushes.push(Push { subgroup: None, offset, len });
            self.wedge_pushed = true;
            work += 1;
        }
        for i in 0..self.mine.len() {
            let g = self.mine[i];
            if !wedged {
                work += self.send(g, switches, effects);
            }
            if !wedged {
                work += self.receive(g, switches, effects, sink);
                work += self.send_nulls(g, switches.null_sends);
            }
            if !wedged && self.subgroups[g].ordered {
                work += self.deliver(g, switches, effects, sink);
            }
            work += self.reclaim(g);
        }
        assert!(!wedged || self.wedge_pushed, "a wedged member has pushed its wedged flag");
        debug_assert!(
            effects.pushes[first_push..].iter().all(|p| p.len > 0
                && p.offset + p.len <= self.layout.region_len
                && p.subgroup.is_none_or(|g| self.mine.contains(&g))),
            "pushes are non-empty ranges of the region, of this member's subgroups"
        );
        work
    }

    fn push_block(&mut self, g: usize, effects: &mut Effects) {
        let (offset, len) = self.sst.range(self.layout.subgroups[g].block());
        assert!(len > 0 && offset + len <= self.layout.sst_len, "a block push lies inside the SST");
        effects.pushes.push(Push { subgroup: Some(g), offset, len });
        let s = &mut self.subgroups[g];
        assert!(!s.member_rows.is_empty(), "a subgroup this member pushes in has members");
        s.stats.pushes += 1;
        s.stats.writes += (s.member_rows.len() - 1) as u64;
    }

    /// Send predicate: push every ready contiguous slot (one per push with
    /// send batching off), data then counter.
    fn send(&mut self, g: usize, switches: Switches, effects: &mut Effects) -> usize {
        assert!(!self.wedged.load(Ordering::Relaxed), "no sends once wedged");
        let peers = (self.subgroups[g].member_rows.len() - 1) as u64;
        let s = &mut self.subgroups[g];
        let Some(sp) = s.send.as_mut() else { return 0 };
        assert!(s.my_rank.is_some(), "only a sender has a send path");
        let limit = if switches.send_batching { u64::MAX } else { 1 };
        let Some(plan) = sp.plan(limit) else { return 0 };
        assert!((1..=limit).contains(&plan.messages()), "a push carries 1..=limit messages");
        assert_eq!(plan.end, sp.published(), "a plan publishes up to its end");
        assert!(
            s.producer.as_ref().is_some_and(|p| sp.published() <= p.reserved()),
            "only reserved messages are published"
        );
        let ring = self.layout.ring(g, s.my_rank.unwrap_or_default());
        let ring_end = ring + self.layout.rings[g].ring_len();
        // Zero-copy: the plan published the batch in this member's own
        // ring (its counter, Release), where every receiver reads it.
        let writes = if s.zero_copy { None } else { Some(plan.writes()) };
        for (offset, len) in writes.into_iter().flatten() {
            assert!(
                len > 0 && ring <= offset && offset + len <= ring_end,
                "a send push lies in this sender's ring"
            );
            effects.pushes.push(Push { subgroup: Some(g), offset, len });
            s.stats.pushes += 1;
            s.stats.writes += peers;
        }
        s.stats.send_batches.record(plan.messages());
        1
    }

    /// Receive predicate: every new message of every sender in one scan
    /// (one message per evaluation with receive batching off), then one
    /// push of the subgroup's counters. Unordered subgroups deliver here.
    fn receive(
        &mut self,
        g: usize,
        switches: Switches,
        effects: &mut Effects,
        sink: &mut impl DeliverySink,
    ) -> usize {
        // The fault point makes a batching receiver take one message now
        // and then, as a slow or interrupted scan would.
        let one = !switches.receive_batching || ordo_fault::fault!("vsync.receive.one_message");
        let limit = if one { 1 } else { u64::MAX };
        let cols = self.layout.subgroups[g];
        let window = self.layout.rings[g].window;
        let mut got = 0u64;
        let mut batch = std::mem::take(&mut self.scratch);
        debug_assert!(batch.is_empty());
        let s = &mut self.subgroups[g];
        let n = s.n_senders;
        assert_eq!(n as usize, s.receivers.len(), "one receiver per sender");
        debug_assert!(
            s.member_rows.binary_search(&self.sst.my_row()).is_ok(),
            "receives only in subgroups this member belongs to"
        );
        for j in 0..n as usize {
            if got >= limit {
                break;
            }
            if s.poisoned[j] {
                continue;
            }
            self.metas.clear();
            let found = match s.receivers[j].scan(limit - got, &mut self.metas) {
                Ok(found) => found,
                Err(error) => {
                    s.poisoned[j] = true;
                    self.faults.push(PeerFault { subgroup: g, sender: s.senders[j], error });
                    continue;
                }
            };
            if found == 0 {
                continue;
            }
            for meta in &self.metas {
                let (rounds, payload) = if meta.flags & NULL_FLAG != 0 {
                    (u64::from(meta.flags & NULL_COUNT_MASK), None)
                } else if meta.flags & SlotGuard::ABANDONED != 0 {
                    (1, None)
                } else {
                    (1, Some((meta.payload_offset, meta.len)))
                };
                let entry = Entry { round_start: s.rounds[j], rounds, payload };
                s.rounds[j] += rounds;
                if Some(j) == s.my_rank {
                    assert!(
                        s.own_slots.back().is_none_or(|&(i, _, _)| i + 1 == meta.index),
                        "own slots are recorded in index order"
                    );
                    if rounds > 0 {
                        let last_seq = ((entry.round_start + rounds - 1) * n + j as u64) as i64;
                        assert!(last_seq > s.own_last_seq, "own last seq only grows");
                        s.own_last_seq = last_seq;
                    }
                    s.own_slots.push_back((meta.index, s.own_last_seq, payload.is_none()));
                    assert!(s.own_slots.len() <= window, "at most a window of own slots awaits reuse");
                    match payload {
                        Some((_, len)) => {
                            s.stats.messages_sent += 1;
                            s.stats.bytes_sent += len as u64;
                        }
                        None => {
                            s.stats.null_slots += 1;
                            s.stats.nulls_sent += rounds;
                        }
                    }
                }
                if s.ordered {
                    if rounds > 0 {
                        s.pending[j].push_back(entry);
                    }
                } else if let Some((offset, len)) = payload {
                    // SAFETY: the slot is not reused before every member
                    // (this one included) consumed it: `received_from`
                    // is pushed only after this upcall returns. The region
                    // outlives the call (see `scratch`).
                    let bytes: &'static [u8] =
                        unsafe { &*(s.receivers[j].region().slice(offset, len) as *const [u8]) };
                    batch.push(Delivered {
                        subgroup: g,
                        sender: s.senders[j],
                        seq: -1,
                        round: entry.round_start,
                        payload: bytes,
                    });
                }
                // Null-send target (spindle §III-B): to precede M(j, k) in
                // the order, this sender must have sent rounds 0..k (if its
                // rank is below j) or 0..k-1 (if above). An application
                // message answers with its round; a null batch only with
                // its first round: its later rounds carry nothing to
                // deliver, and a declared inactivity of k rounds must not
                // make every other sender fill k rounds too.
                if let Some(me) = s.my_rank
                    && j != me
                    && rounds > 0
                {
                    let k =
                        if payload.is_some() { entry.round_start + rounds - 1 } else { entry.round_start };
                    let need = if me < j { k + 1 } else { k };
                    s.null_target = s.null_target.max(need);
                }
            }
            s.receivers[j].consume(found);
            self.sst.set_counter_at(cols.received_from, j, s.receivers[j].consumed() as i64);
            got += found;
        }
        assert!(got <= limit, "a receive takes at most its limit");
        if got == 0 {
            self.scratch = batch;
            return 0;
        }
        s.stats.receive_batches.record(got);
        if s.ordered {
            // received_num: one before the first seq not yet received.
            let next_missing = (0..n as usize).map(|j| s.rounds[j] * n + j as u64).min().expect("senders");
            assert!(batch.is_empty(), "ordered subgroups deliver only in the delivery predicate");
            assert!(s.delivered_num < next_missing as i64, "delivered_num ≤ received_num");
            self.sst.set_counter(cols.received_num, next_missing as i64 - 1);
        } else if !batch.is_empty() {
            let s = &mut self.subgroups[g];
            assert!(batch.len() as u64 <= got, "at most one delivery per message received");
            s.stats.messages_delivered += batch.len() as u64;
            s.stats.bytes_delivered += batch.iter().map(|d| d.payload.len() as u64).sum::<u64>();
            s.stats.delivery_batches.record(batch.len() as u64);
            sink.deliver(&batch);
        }
        batch.clear();
        self.scratch = batch;
        self.push_block(g, effects);
        1
    }

    /// Sends the null rounds the receive predicate found necessary (with
    /// null-sends on), and any declared inactivity (always: it is an explicit
    /// application request), as one slot carrying a count.
    fn send_nulls(&mut self, g: usize, null_sends: bool) -> usize {
        assert!(!self.wedged.load(Ordering::Relaxed), "no null-sends once wedged");
        let s = &mut self.subgroups[g];
        let Some(producer) = s.producer.as_ref() else { return 0 };
        assert!(s.my_rank.is_some(), "only a sender has a producer");
        if !s.ordered {
            // Unordered delivery never waits for rounds: nulls and declared
            // inactivity mean nothing there.
            s.declared_inactive.store(0, Ordering::Relaxed);
            return 0;
        }
        if s.declared_inactive.load(Ordering::Relaxed) == 0 && !null_sends {
            return 0;
        }
        let declared = s.declared_inactive.swap(0, Ordering::AcqRel);
        let sent_rounds = |s: &SubgroupState, reserved: u64| reserved as i64 + s.extra_rounds;
        let target = if null_sends { s.null_target as i64 } else { 0 };
        let behind = target - sent_rounds(s, producer.reserved());
        if behind <= 0 && declared == 0 {
            return 0;
        }
        let Some(slot) = producer.try_acquire() else {
            // No free slot: the rounds are owed; try again next time.
            s.declared_inactive.fetch_add(declared, Ordering::AcqRel);
            return 0;
        };
        // Rounds before this slot: every earlier slot is an application
        // message (1 round) or one of our null slots (extra_rounds).
        let index = slot.index();
        let before = index as i64 + s.extra_rounds;
        assert!(before >= 0, "rounds sent before a slot are never negative");
        assert!(
            declared > 0 || (null_sends && s.null_target > 0),
            "null rounds only answer a received message ahead of this sender, or a declaration"
        );
        // One slot names at most NULL_COUNT_MASK - 1 rounds: what is owed
        // beyond it goes in the next slots — declared rounds (the
        // application's input, of any size) stay declared, and a sender
        // still behind its target sends again at its next poll (another
        // sender's huge declaration can put it that far behind).
        let needed = (target - before).max(0) as u64;
        let most = u64::from(NULL_COUNT_MASK) - 1;
        let now_needed = needed.min(most);
        let now_declared = declared.min(most - now_needed);
        if declared > now_declared {
            s.declared_inactive.fetch_add(declared - now_declared, Ordering::AcqRel);
        }
        let count = now_needed + now_declared;
        assert!(count > 0 && count < u64::from(NULL_COUNT_MASK), "null count {count} fits a slot");
        slot.commit(0, NULL_FLAG | count as u32);
        s.extra_rounds += count as i64 - 1;
        assert!(
            needed > now_needed || index as i64 + 1 + s.extra_rounds >= target,
            "a null slot brings this sender up to its target, or as far as one slot can"
        );
        1
    }

    /// Delivery predicate (ordered): everything every member has received,
    /// in seq order (one seq per evaluation with delivery batching off);
    /// upcall first, then `delivered_num` is set and pushed.
    fn deliver(
        &mut self,
        g: usize,
        switches: Switches,
        effects: &mut Effects,
        sink: &mut impl DeliverySink,
    ) -> usize {
        assert!(!self.wedged.load(Ordering::Relaxed), "no deliveries once wedged");
        let cols = self.layout.subgroups[g];
        let stable = {
            let s = &self.subgroups[g];
            s.member_rows.iter().map(|r| self.sst.counter(*r, cols.received_num)).min().expect("members")
        };
        let s = &mut self.subgroups[g];
        assert!(s.ordered, "only ordered subgroups run the delivery predicate");
        if stable <= s.delivered_num {
            return 0;
        }
        let received = self.sst.counter(self.sst.my_row(), cols.received_num);
        assert!(stable <= received, "stable ≤ this member's own received_num");
        assert!(s.delivered_num <= received, "delivered_num ≤ received_num");
        let one = !switches.delivery_batching || ordo_fault::fault!("vsync.deliver.one_seq");
        let limit = if one { 1 } else { i64::MAX };
        let n = s.n_senders;
        let mut batch = std::mem::take(&mut self.scratch);
        debug_assert!(batch.is_empty());
        let mut seq = s.delivered_num + 1;
        let mut seqs = 0i64;
        while seq <= stable && seqs < limit {
            let j = (seq as u64 % n) as usize;
            let round = seq as u64 / n;
            let entry = *s.pending[j].front().expect("a stable seq was received here");
            assert!(
                entry.round_start <= round && round < entry.round_start + entry.rounds,
                "seq {seq}: sender rank {j} round {round} not in {entry:?}"
            );
            if let Some((offset, len)) = entry.payload {
                // SAFETY: the sender reuses this slot only after every
                // member's delivered_num covers it; ours is set after the
                // upcall below returns. The region outlives the call.
                let bytes: &'static [u8] =
                    unsafe { &*(s.receivers[j].region().slice(offset, len) as *const [u8]) };
                batch.push(Delivered { subgroup: g, sender: s.senders[j], seq, round, payload: bytes });
            }
            if round + 1 == entry.round_start + entry.rounds {
                s.pending[j].pop_front();
            }
            seq += 1;
            seqs += 1;
        }
        assert!((1..=limit).contains(&seqs), "a delivery covers 1..=limit seqs");
        assert!(seq - 1 <= stable, "only seqs every member received are delivered");
        assert!(batch.len() as i64 <= seqs, "at most one message per delivered seq");
        s.stats.delivery_batches.record(seqs as u64);
        if !batch.is_empty() {
            s.stats.messages_delivered += batch.len() as u64;
            s.stats.bytes_delivered += batch.iter().map(|d| d.payload.len() as u64).sum::<u64>();
            sink.deliver(&batch);
        }
        batch.clear();
        self.scratch = batch;
        let s = &mut self.subgroups[g];
        assert!(seq - 1 > s.delivered_num, "delivered_num grows");
        s.delivered_num = seq - 1;
        self.sst.set_counter(cols.delivered_num, s.delivered_num);
        self.push_block(g, effects);
        1
    }

    /// The reuse rule: slots delivered by every member (ordered) or consumed
    /// by every member (unordered) become reusable.
    fn reclaim(&mut self, g: usize) -> usize {
        let cols = self.layout.subgroups[g];
        let window = self.layout.rings[g].window;
        let s = &mut self.subgroups[g];
        let (Some(sp), Some(rank)) = (s.send.as_ref(), s.my_rank) else { return 0 };
        assert!(rank < s.receivers.len(), "own rank within the subgroup's senders");
        // Slots every member has consumed (read from the ring).
        let min_consumed = s
            .member_rows
            .iter()
            .map(|r| self.sst.counter_at(*r, cols.received_from, rank).max(0) as u64)
            .min()
            .expect("members");
        assert!(
            min_consumed <= s.receivers[rank].consumed(),
            "min consumed ≤ this member's own consumed count"
        );
        let upto = if s.ordered {
            let min_delivered = s
                .member_rows
                .iter()
                .map(|r| self.sst.counter(*r, cols.delivered_num))
                .min()
                .expect("members");
            assert!(min_delivered <= s.delivered_num, "min delivered_num ≤ this member's own delivered_num");
            let mut upto = sp.reclaimable();
            // An application slot is reusable once delivered everywhere; a
            // null slot once consumed everywhere (its rounds live on in
            // each receiver's pending entries, nobody reads the slot
            // again) — else a declared inactivity longer than anyone
            // reaches would pin its slot forever.
            while let Some(&(index, last_seq, null)) = s.own_slots.front() {
                let reusable = if null { index < min_consumed } else { last_seq <= min_delivered };
                if !reusable {
                    break;
                }
                s.own_slots.pop_front();
                upto = index + 1;
            }
            upto
        } else {
            while s.own_slots.front().is_some_and(|(i, _, _)| *i < min_consumed) {
                s.own_slots.pop_front();
            }
            min_consumed.min(sp.published())
        };
        assert!(upto <= sp.published(), "only published slots become reusable");
        assert!(s.own_slots.len() <= window, "at most a window of own slots awaits reuse");
        if upto > sp.reclaimable() {
            sp.set_reclaimable(upto);
            assert!(
                s.own_slots.front().is_none_or(|&(i, _, _)| i >= sp.reclaimable()),
                "a slot is declared reusable only once it left own_slots"
            );
            return 1;
        }
        0
    }
}
