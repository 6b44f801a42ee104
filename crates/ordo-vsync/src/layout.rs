//! Where everything lives in a member's region. Identical on every member.
//!
//! ```text
//! region offset 0          +----------------------------------------------------+
//!   SST, one row per       | wedged flag | pad to 64                            |
//!   top-level member       | subgroup 0: received_num | delivered_num |         |
//!   (ordo-sst)             |             received_from[S0] | pad to 64          |
//!                          | subgroup 1: ...                                    |
//! sst_len                  +----------------------------------------------------+
//!   rings (ordo-ring)      | subgroup 0: ring of sender rank 0, rank 1, ...     |
//!                          | subgroup 1: ...                                    |
//! region_len               +----------------------------------------------------+
//! ```
//! A subgroup's SST columns are one cache-line-aligned block, so one push
//! carries `received_num`, `delivered_num` and the per-sender receive counts
//! together (they are all monotonic; pushing more than changed is harmless).

use crate::config::GroupConfig;
use ordo_ring::RingLayout;
use ordo_sst::{ColumnRange, CounterArrayCol, CounterCol, FlagCol, LayoutBuilder, SstLayout};

/// The SST columns of one subgroup.
#[derive(Clone, Copy, Debug)]
pub struct SubgroupColumns {
    /// Highest seq such that every message up to it has been received.
    pub received_num: CounterCol,
    /// Seq of the last message delivered.
    pub delivered_num: CounterCol,
    /// Slots consumed from each sender (by rank): the unordered mode's
    /// reuse rule, and a progress view per sender.
    pub received_from: CounterArrayCol,
}

impl SubgroupColumns {
    /// The block pushed after receive or delivery.
    pub fn block(&self) -> ColumnRange {
        ColumnRange::from(self.received_num).union(self.delivered_num.into()).union(self.received_from.into())
    }
}

/// The whole region layout of a group.
#[derive(Clone, Debug)]
pub struct GroupLayout {
    /// The SST row layout.
    pub sst: SstLayout,
    /// Set when a member wedges (stops sending and delivering) for a view
    /// change.
    pub wedged: FlagCol,
    /// Columns per subgroup.
    pub subgroups: Vec<SubgroupColumns>,
    /// Ring geometry per subgroup.
    pub rings: Vec<RingLayout>,
    /// Offset of the first ring of each subgroup.
    pub ring_bases: Vec<usize>,
    /// Bytes of the SST table.
    pub sst_len: usize,
    /// Bytes every member's region must have.
    pub region_len: usize,
}

impl GroupLayout {
    /// The layout of `cfg` (which must be valid).
    pub fn new(cfg: &GroupConfig) -> GroupLayout {
        let mut b = LayoutBuilder::new();
        let wedged = b.flag("wedged");
        let mut subgroups = Vec::with_capacity(cfg.subgroups.len());
        for s in &cfg.subgroups {
            b.align_to_cache_line();
            subgroups.push(SubgroupColumns {
                received_num: b.counter("received_num"),
                delivered_num: b.counter("delivered_num"),
                received_from: b.counters("received_from", s.senders.len()),
            });
        }
        let sst = b.build();
        let sst_len = sst.table_len(cfg.members.len());
        let mut offset = sst_len;
        let mut rings = Vec::new();
        let mut ring_bases = Vec::new();
        for s in &cfg.subgroups {
            let ring = RingLayout::new(s.window, s.max_payload).with_stamps(cfg.switches.stamped_slots);
            rings.push(ring);
            ring_bases.push(offset);
            offset += ring.set_len(s.senders.len());
        }
        GroupLayout { sst, wedged, subgroups, rings, ring_bases, sst_len, region_len: offset }
    }

    /// Offset of the ring of sender `rank` in subgroup `g`.
    pub fn ring(&self, g: usize, rank: usize) -> usize {
        self.rings[g].ring_offset(self.ring_bases[g], rank)
    }
}
